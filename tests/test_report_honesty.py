"""What the default run's report page said that its numbers did not support, each pinned by a test.

3: format farming flagged where the format rate was saturated (accuracy fell instead); 8: a scoring mode that cannot
score the task counted as a confirmation of the control arm's pipeline check; 9: "PPO almost doubles memory" read
"true by construction" beside a measured peak ratio far from 2; 10: memory-figure titles naming another quantity,
seeds that look like another method in the curves; 11: tuning grids of different sizes compared without a word.
Fixtures: tests/report_fixtures.py (a cpu-tiny-like suite with known numbers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from matplotlib.colors import to_hex
from report_fixtures import N, _score, method_result, write_suite

from bench.report import load_suite
from bench.results import write_json_atomic

FARMED = "the format reward is being farmed rather than answers learned"
"""The farming flag's reason (bench.telemetry.monitors.FARMED), spelled out so the tests read without it."""


def _label(suite_dir: Path, method: str) -> str:
    """The method's label as the report shows it (the report may add a note to a label, e.g. PPO's reward model)."""
    return next(r.label for r in load_suite(suite_dir).methods if r.result.get("method") == method)


def _add_seed(suite_dir: Path, method: str, seed: int, **changes: Any) -> dict[str, Any]:
    """Write ``method``'s run of ``seed`` into the suite (result keys updated from ``changes``); returns it."""
    res = method_result(method, seed=seed)
    res.update(changes)
    write_json_atomic(suite_dir / "runs" / res["run_id"] / "result.json", res)
    plan = json.loads((suite_dir / "suite.json").read_text())
    plan["runs"].append(res["run_id"])
    write_json_atomic(suite_dir / "suite.json", plan)
    return res


# --- 3: the format-farming flag --------------------------------------------------------------------------------
def _curve(format_only: tuple[float, float], format_rate: tuple[float, float], jitter: float = 0.01,
           n: int = 20) -> list[dict[str, float]]:
    """``n`` logged points moving linearly from the first to the second value of each, +-jitter per batch."""
    return [{"step": i, "format_only_rate": format_only[0] + (format_only[1] - format_only[0]) * i / (n - 1)
             + jitter * (-1) ** i,
             "format_reward": format_rate[0] + (format_rate[1] - format_rate[0]) * i / (n - 1) + jitter * (-1) ** i}
            for i in range(n)]


def test_a_format_only_rise_under_a_saturated_format_rate_reads_as_accuracy_falling() -> None:
    # PPO (reward model) on the default run: format-only 70% -> 91%, the format rate about 98% before and after,
    # the control arm flat. Before the fix this read "the format reward is being farmed".
    from bench.telemetry.monitors import eval_flags

    start = {"format_only_rate": 0.70, "format_reward": 0.98}
    lines = eval_flags({"format_only_rate": 0.91, "format_reward": 0.985}, start, dict(start), n=5000)
    assert len(lines) == 1 and FARMED not in lines[0], lines
    assert lines[0].startswith("accuracy fell while the format rate stayed put (98.0% -> 98.5%"), lines[0]
    assert "answers right in the right format went 28.0% -> 7.5%" in lines[0]


def test_format_farming_is_flagged_only_when_the_format_rate_itself_rose() -> None:
    from bench.telemetry.monitors import curve_flags, run_flags

    control = _curve((0.70, 0.70), (0.98, 0.98))
    saturated = _curve((0.70, 0.91), (0.98, 0.98))
    (line,) = curve_flags(saturated, control)
    assert line.startswith("accuracy fell while the format rate stayed put") and FARMED not in line, line
    # The format rate itself rising far beyond its noise and the control arm: farming.
    farming = _curve((0.30, 0.90), (0.35, 0.95))
    (line,) = curve_flags(farming, control)
    assert FARMED in line and "and the format rate rose 39.7% -> 90.3% (+50.5 pp" in line, line  # window means
    # A format rate that rose no more than the control's, with right answers not falling: not this method's doing.
    noisy_control = _curve((0.30, 0.60), (0.35, 0.95))
    assert curve_flags(_curve((0.30, 0.60), (0.35, 0.95)), noisy_control) == []
    # The control arm judged beside itself never flags, whichever way its format rate moved.
    assert run_flags(farming, {"format_only_rate": 0.9, "format_reward": 0.95},
                     {"format_only_rate": 0.3, "format_reward": 0.35}, farming,
                     {"format_only_rate": 0.9, "format_reward": 0.95}, 5000) == []


def test_the_final_evaluation_records_its_format_rate() -> None:
    from bench.telemetry.monitors import record_monitors

    records = [{"completion": text, "gold": "5", "tokens": 6, "hit_max": False} for text in (
        "<think>2 + 3</think> <answer>5</answer>", "<think>2 + 3</think> <answer>6</answer>", "5")]
    monitors = record_monitors(records)
    assert monitors["format_reward"] == pytest.approx(2 / 3)  # two of three in the tag format
    assert monitors["format_only_rate"] == pytest.approx(1 / 3)
    assert record_monitors([]) == {}


def test_the_report_says_accuracy_fell_for_ppo_with_a_saturated_format_rate(tmp_path: Path) -> None:
    from bench.report.dynamics import flag_lines

    suite_dir = write_suite(tmp_path, methods=("grpo", "ppo", "control"))
    for run_id, monitors in (("warm_start-s0", {"format_only_rate": 0.70, "format_reward": 0.98}),
                             ("ppo-s0", {"format_only_rate": 0.91, "format_reward": 0.985}),
                             ("control-s0", {"format_only_rate": 0.70, "format_reward": 0.98})):
        path = suite_dir / "runs" / run_id / "result.json"
        res = json.loads(path.read_text())
        res["monitors"]["eval"].update(monitors)
        write_json_atomic(path, res)
    lines = [line for line in flag_lines(load_suite(suite_dir)) if "format_only_rate" in line]
    assert len(lines) == 1 and lines[0].startswith(f"{_label(suite_dir, 'ppo')}: final evaluation: accuracy fell "
                                                   f"while the format rate stayed put"), lines
    assert "farmed rather than" not in lines[0]


# --- 8: the control arm's pipeline check -----------------------------------------------------------------------
def _verdict_file(run_dir: Path, correct: int, lmeval_strict: int = 0) -> None:
    """Per-question verdicts in all four modes: question i right when i < correct (lm-eval strict: < its count)."""
    lines = [json.dumps({"index": i, "correct": {"suite-strict": i < correct, "suite-flexible": i < correct,
                                                 "lmeval-strict": i < lmeval_strict,
                                                 "lmeval-flexible": i < correct}}) for i in range(N)]
    (run_dir / "eval_after.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_mode_that_cannot_score_the_task_is_not_a_confirmation(tmp_path: Path) -> None:
    from bench.report.tables import control_checks, control_table

    suite_dir = write_suite(tmp_path, methods=("grpo", "control"))
    for run_id in ("warm_start-s0", "control-s0"):  # lm-eval strict finds no '####': 0 of 400 before and after
        _verdict_file(suite_dir / "runs" / run_id, 100)
    table = control_table(load_suite(suite_dir))
    row = dict(zip(table.header, table.rows[0]))
    assert row["accuracy after equals before exactly"] == "yes (0 differing questions)"
    assert row["modes"] == "suite-strict, suite-flexible, lmeval-flexible", row
    assert row["not applicable (why)"] == ("lmeval-strict (0 of 400 right before and after: the mode cannot score "
                                           "this task)"), row
    (check,) = control_checks(load_suite(suite_dir))
    assert check["passed"] is True and "lmeval-strict" not in check["modes"]
    # The finding says in which modes it held, never "every scoring mode" past one that cannot score the task.
    from bench.report.findings import findings

    (text,) = [f.text for f in findings(load_suite(suite_dir)) if f.text.startswith("Control (lr 0)")]
    assert "every scoring mode" not in text and "in the 3 scoring modes that can score the task" in text, text
    assert "not applicable: lmeval-strict: 0 of 400 right before and after" in text, text
    # Where lm-eval strict does score the task, it confirms the check like any other mode.
    for run_id in ("warm_start-s0", "control-s0"):
        _verdict_file(suite_dir / "runs" / run_id, 100, lmeval_strict=40)
    (check,) = control_checks(load_suite(suite_dir))
    assert check["modes"] == ["suite-strict", "suite-flexible", "lmeval-strict", "lmeval-flexible"]
    assert check["not_applicable"] == {}


def test_no_mode_that_can_score_the_task_means_not_checked(tmp_path: Path) -> None:
    from bench.report.tables import control_table

    suite_dir = write_suite(tmp_path, methods=("grpo", "control"))
    for run_id in ("warm_start-s0", "control-s0"):
        _verdict_file(suite_dir / "runs" / run_id, 0)
    table = control_table(load_suite(suite_dir))
    assert table.rows[0][2] == "not checked (no scoring mode can score this task)" and table.warnings == []
    # From the recorded counts alone (no per-question files): the same rule.
    for run_id in ("warm_start-s0", "control-s0"):
        (suite_dir / "runs" / run_id / "eval_after.jsonl").unlink()
    path = suite_dir / "runs" / "control-s0" / "result.json"
    res = json.loads(path.read_text())
    res["accuracy"]["before"]["lmeval-strict"] = res["accuracy"]["after"]["lmeval-strict"] = _score(0)
    write_json_atomic(path, res)
    row = dict(zip(table.header, control_table(load_suite(suite_dir)).rows[0]))
    assert row["modes"] == "suite-strict, suite-flexible" and row["not applicable (why)"].startswith("lmeval-strict")


# --- 9: "PPO almost doubles memory": accounted and measured in one row -----------------------------------------
def _memory_rows(suite_dir: Path) -> list[list[str]]:
    from bench.report.claims import claims_table

    return [row for row in claims_table(load_suite(suite_dir)).rows if row[0].startswith("PPO almost doubles")]


def test_the_memory_claim_puts_accounted_and_measured_side_by_side(tmp_path: Path) -> None:
    from bench.report.claims import NOT_SUPPORTED

    suite_dir = write_suite(tmp_path, methods=("grpo_engine", "ppo"))
    rows, ppo = _memory_rows(suite_dir), _label(suite_dir, "ppo")
    assert len(rows) == 1, rows  # one claim, one row: not a constructed 'true' beside an unmeasured 'VRAM' row
    measured, verdict = rows[0][3], rows[0][4]
    # 34 / 17 MiB accounted; 740 / 720 MiB measured cpu-rss peaks (700 + 10 per network).
    assert f"accounted: {ppo} 34.00 MiB / GRPO (suite engine) 17.00 MiB = 2.00×" in measured, measured
    assert f"measured: {ppo} 740.00 MiB / GRPO (suite engine) 720.00 MiB = 1.03× (peak cpu-rss" in measured
    assert measured.replace("not VRAM", "").count("VRAM") == 0  # a CPU reading is never called VRAM
    assert verdict == NOT_SUPPORTED  # the verdict follows the measurement


def test_the_measured_ratio_uses_the_same_source_and_the_same_seeds(tmp_path: Path) -> None:
    suite_dir = write_suite(tmp_path, methods=("grpo_engine", "ppo"), source="cuda-allocated")
    ppo = method_result("ppo", seed=1, source="cuda-allocated", peak_mib=5000.0)  # no GRPO run of seed 1
    _add_seed(suite_dir, "ppo", 1, memory=ppo["memory"])
    (row,) = _memory_rows(suite_dir)
    assert "740.00 MiB / GRPO (suite engine) 720.00 MiB = 1.03× (peak cuda-allocated" in row[3], row[3]
    assert "mean over seed 0)" in row[3]  # seed 1's 5,040 MiB has no GRPO partner: left out


def test_without_a_measurement_the_memory_claim_is_true_by_construction(tmp_path: Path) -> None:
    from bench.report.claims import BY_CONSTRUCTION

    suite_dir = write_suite(tmp_path, methods=("grpo_engine", "ppo"))
    for run_id in ("grpo_engine-s0", "ppo-s0"):
        path = suite_dir / "runs" / run_id / "result.json"
        res = json.loads(path.read_text())
        res["memory"].update(peak_bytes=None, source=None)
        write_json_atomic(path, res)
    (row,) = _memory_rows(suite_dir)
    assert row[4] == BY_CONSTRUCTION and "measured: no memory reading of both methods" in row[3], row


# --- 10: figures: titles say what is plotted; one method, one colour; seeds by line style ---------------------
def test_memory_figure_titles_name_what_is_plotted_with_unit_and_source(tmp_path: Path,
                                                                        drawn: dict[str, Any]) -> None:
    from bench.report import figures

    figures.memory_figures(load_suite(write_suite(tmp_path)), tmp_path / "figures")
    fig = drawn["memory_cpu-rss.png"]
    title = fig._suptitle.get_text()
    assert "static accounting" in title and "measured peak" in title and "cpu-rss" in title, title
    static, measured = (ax.get_title() for ax in fig.axes[:2])
    assert "MiB" in static and "accounting" in static and "peak" not in static, static
    assert "MiB" in measured and "source: cpu-rss" in measured and "not VRAM" in measured, measured


def _three_seed_suite(tmp_path: Path) -> Path:
    suite_dir = write_suite(tmp_path, methods=("grpo", "grpo_engine", "ppo", "control"))
    for method in ("grpo", "grpo_engine", "ppo"):
        for seed in (1, 2):
            res = method_result(method, seed=seed)
            for point in res["curves"]:
                point["reward"] += 0.02 * seed
            _add_seed(suite_dir, method, seed, curves=res["curves"])
    return suite_dir


def test_curves_one_colour_per_method_and_seeds_by_line_style(tmp_path: Path, drawn: dict[str, Any]) -> None:
    from bench.report import figures

    suite = load_suite(_three_seed_suite(tmp_path))
    figures.curves_figure(suite, tmp_path / "figures")
    colors = figures.method_colors(suite)
    assert len(set(colors.values())) == len(colors)
    reward = next(ax for ax in drawn["curves.png"].axes if ax.get_title().startswith("mean reward"))
    assert reward.get_title() == "mean reward (reward units), logged per training step"
    kl = next(ax for ax in drawn["curves.png"].axes if ax.get_title().startswith("KL"))
    assert "(nats per token)" in kl.get_title()
    lines = [line for line in reward.get_lines()]
    for label, color in colors.items():
        if label == "Control (lr 0)":
            continue  # one seed: one solid line, checked by the colour set below
        mine = [line for line in lines if to_hex(line.get_color()) == to_hex(color)]
        # every line of the method in its one colour, none faded towards another method's tint
        assert all(line.get_alpha() in (None, 1.0) for line in mine), label
        seeds = [line for line in mine if line.get_label() == "_nolegend_"]
        assert sorted(line.get_linestyle() for line in seeds) == ["--", "-.", ":"], (label, seeds)
        assert [line.get_linestyle() for line in mine if line not in seeds] == ["-"]  # the mean, solid
    assert {to_hex(line.get_color()) for line in lines} == {to_hex(c) for c in colors.values()}
    legend = [text.get_text() for text in reward.get_legend().get_texts()]
    assert {"seed 0", "seed 1", "seed 2"} <= set(legend)


def test_aha_panels_draw_seeds_by_line_style(tmp_path: Path, drawn: dict[str, Any]) -> None:
    from bench.report import figures

    suite = load_suite(_three_seed_suite(tmp_path))
    figures.aha_figure(suite, tmp_path / "figures")
    fig = drawn["aha.png"]
    assert "(%)" in fig.axes[0].get_title() and "(tokens)" in fig.axes[0].get_title()
    grpo = to_hex(figures.method_colors(suite)["GRPO (TRL)"])
    styles = [line.get_linestyle() for line in fig.axes[0].get_lines() if to_hex(line.get_color()) == grpo]
    assert sorted(styles) == ["--", "-.", ":"], styles


def test_every_method_keeps_a_colour_of_its_own_beyond_the_palette(tmp_path: Path) -> None:
    from bench.report import figures
    from bench.report.records import Run

    runs = []
    for i in range(12):
        res = method_result("grpo", seed=0)
        res.update(run_id=f"variant{i}", label=f"GRPO variant {i}")
        runs.append(Run(f"variant{i}", res))
    colors = figures._colors_of(runs)
    assert len(set(colors.values())) == 12 and figures.CONTROL_COLOR not in colors.values()


# --- 11: tuning effort -------------------------------------------------------------------------------------------
def _tuned(suite_dir: Path, points: dict[str, int]) -> Path:
    for method, n in points.items():
        path = suite_dir / "runs" / f"{method}-s0" / "result.json"
        res = json.loads(path.read_text())
        res["spec"]["tuning"] = {"methods": {method: {"chosen": {f"methods.{method}.learning_rate": 1e-4},
                                                      "score": {"mean": 0.5}, "points": n, "n_questions": 1000,
                                                      "seeds": [0, 1]}}}
        write_json_atomic(path, res)
    return suite_dir


def test_grid_sizes_sit_beside_the_tuned_results_and_unequal_effort_is_said(tmp_path: Path) -> None:
    from bench.report.overview import headline_table

    suite_dir = _tuned(write_suite(tmp_path, methods=("grpo", "ppo", "dpo", "control")),
                       {"grpo": 3, "ppo": 7, "dpo": 12})
    table = headline_table(load_suite(suite_dir))
    rows = {row[0]: dict(zip(table.header, row)) for row in table.rows}
    column = "tuning (grid points on validation)"
    assert rows["DPO (TRL, pool pairs)"][column] == "12 points, validation 50.0%"
    assert rows["GRPO (TRL)"][column] == "3 points, validation 50.0%"
    assert rows["Control (lr 0)"][column] == "never tuned (lr 0 by design)"
    note = next(n for n in table.notes if n.startswith("Hyperparameters"))
    assert (f"Unequal tuning effort: grid points per method DPO (TRL, pool pairs) 12, {_label(suite_dir, 'ppo')} 7, "
            f"GRPO (TRL) 3.") in note and "comparison between methods is at unequal tuning effort" in note, note


def test_equal_grids_say_nothing_about_effort(tmp_path: Path) -> None:
    from bench.report.overview import headline_table

    suite_dir = _tuned(write_suite(tmp_path, methods=("grpo", "grpo_engine")), {"grpo": 3, "grpo_engine": 3})
    note = next(n for n in headline_table(load_suite(suite_dir)).notes if n.startswith("Hyperparameters"))
    assert "unequal" not in note.lower(), note
