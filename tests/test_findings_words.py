"""The report's words say what its numbers are: generation rates by what they divide by and against a named
reference, "the largest" differences ranked by size, headers that name what their cells hold, bold only where a
test separates a contestant, and each comparison in one Holm family named beside its table."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from report_fixtures import N, _score, _verdicts, method_result, write_suite

from bench.report import load_suite, tables
from bench.report.findings import findings
from bench.results import write_json_atomic
from bench.scoring import stats


def _edit(suite_dir: Path, run_id: str, change: Any) -> None:
    path = suite_dir / "runs" / run_id / "result.json"
    data = json.loads(path.read_text())
    change(data)
    write_json_atomic(path, data)


def _seeded_suite(root: Path, methods: tuple[str, ...], seeds: int = 3) -> Path:
    """The fixture's methods over ``seeds`` seeds, every seed with per-question files. Online methods gain 3 questions
    and 1% in step time per seed (a spread to test); DPO and the control arm score the same on every seed."""
    suite_dir = write_suite(root, methods=methods)
    plan = json.loads((suite_dir / "suite.json").read_text())
    for seed in range(1, seeds):
        for method in methods:
            res = method_result(method, seed=seed)
            after = {"grpo": 160, "grpo_engine": 156, "ppo": 60, "ppo_verifier": 158, "dpo": 110,
                     "control": 100}[method] + (0 if method in ("dpo", "control") else 3 * seed)
            res["accuracy"]["after"] = {"strict": _score(after), "flexible": _score(after + 10)}
            res["throughput"]["step_s_median"] *= 1 + 0.01 * seed
            write_json_atomic(suite_dir / "runs" / f"{method}-s{seed}" / "result.json", res)
            _verdicts(suite_dir / "runs" / f"{method}-s{seed}", after)
            plan["runs"].append(f"{method}-s{seed}")
    write_json_atomic(suite_dir / "suite.json", plan)
    return suite_dir


# --- 1. generation rates: named by their denominator, each method against a named reference -------------------
def _engine_faster_in_training_only(data: dict[str, Any]) -> None:
    """The suite engine's GRPO: 1.87x GRPO (TRL)'s completions per training second (160/s), but only 1.07x its
    completions per second of generation (400/s): its other phases are shorter, its decoding is about as fast."""
    data["throughput"].update(completions=14_960, completions_per_s=14_960 / 50.0)  # 299.2/s over 50 s of train
    data["phases"]["generation"]["time_s"] = 14_960 / 428.0  # 428/s while generating


def test_generation_rates_say_what_they_divide_by_and_compare_with_grpo_trl(tmp_path: Path) -> None:
    suite_dir = write_suite(tmp_path, methods=("grpo", "grpo_engine", "ppo_verifier", "control"))
    _edit(suite_dir, "grpo_engine-s0", _engine_faster_in_training_only)
    found = findings(load_suite(suite_dir))
    text = "\n".join(f.line() for f in found)
    assert "Generation throughput" not in text  # the old name of a per-training-second rate
    training = next(f for f in found if f.text.startswith("Completions per second of training:"))
    generating = next(f for f in found if f.text.startswith("Completions per second of the generation phase:"))
    # GRPO (TRL): 8,000 completions over 50 s of training and 20 s of generation; PPO: 6,250 over 50 s and 20 s.
    assert training.text == ("Completions per second of training: GRPO (TRL) 160.0 (the reference); "
                             "GRPO (suite engine) 299.2 (1.87×); PPO (verifier reward) 125.0 (0.78×)"), training.text
    assert generating.text == ("Completions per second of the generation phase: GRPO (TRL) 400.0 (the reference); "
                               "GRPO (suite engine) 428.0 (1.07×); PPO (verifier reward) 312.5 (0.78×)"), generating.text
    assert "train_s" in training.basis and "phases.generation.time_s" in generating.basis
    assert "Control" not in training.text + generating.text  # the lr-0 control is no contestant
    # The throughput table has both rates, each header naming its denominator.
    table = tables.detail_tables(load_suite(suite_dir))["throughput"]
    rows = {r[0]: dict(zip(table.header, r)) for r in table.rows}
    assert rows["GRPO (suite engine)"]["completions/s of training"] == "299.20"
    assert rows["GRPO (suite engine)"]["completions/s of generation phase"] == "428.00"
    assert rows["GRPO (TRL)"]["generated tokens/s of generation phase"] == "8,000.0"  # 160,000 tokens / 20 s


def test_without_grpo_trl_the_suite_engines_grpo_is_the_reference(tmp_path: Path) -> None:
    suite_dir = write_suite(tmp_path, methods=("ppo_verifier", "grpo_engine", "dpo"))
    line = next(f.text for f in findings(load_suite(suite_dir)) if f.text.startswith("Completions per second of "
                                                                                          "training"))
    assert line == ("Completions per second of training: GRPO (suite engine) 200.0 (the reference); "
                    f"PPO (verifier reward) 125.0 ({125 / 200:.2f}×)"), line  # DPO generates nothing: no ratio


def test_a_generation_phase_that_was_not_instrumented_has_no_rate(tmp_path: Path) -> None:
    from bench.report.throughput import generation_rate

    suite_dir = write_suite(tmp_path, methods=("grpo", "ppo_verifier"))
    _edit(suite_dir, "grpo-s0", lambda d: d.update(seams={"missing": [{"seam": "generate", "phase": "generation"}]}))
    suite = load_suite(suite_dir)
    grpo = next(r for r in suite.methods if r.run_id == "grpo-s0")
    assert generation_rate(grpo) is None  # not measured, not 8,000 / 20 s


# --- 2. "the largest" differences are the largest ------------------------------------------------------------
def _test(a: str, diff: float, p: float) -> dict[str, Any]:
    return {"a": a, "b": "B", "pair": (a, "B"), "seed": 0, "diff": diff, "diff_low": diff - 0.02,
            "diff_high": diff + 0.02, "test": stats.EXACT_MCNEMAR, "n": 400, "clusters": 400, "unit": "question",
            "p_value": p, "p_holm": p, "family": "between methods", "family_size": 4}


def test_the_listed_pairs_are_the_largest_differences_and_say_so(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Four significant pairs whose p-values rank them otherwise than their sizes: the smallest difference (+5 pp)
    # has the smallest p, the largest (+20 pp, many discordant questions both ways) the largest.
    fake = [_test("W", 0.05, 1e-9), _test("X", 0.10, 1e-6), _test("Y", 0.15, 1e-4), _test("Z", 0.20, 1e-2)]
    monkeypatch.setattr(tables, "paired_tests", lambda suite, mode=None: [dict(t) for t in fake])
    found = [f.text for f in findings(load_suite(write_suite(tmp_path, methods=("grpo", "ppo"))))]
    listed = [t.split(" vs ")[0] for t in found if t.endswith(", significant") and " vs B " in t]
    assert listed == ["Z", "Y", "X"], found
    summary = next(t for t in found if t.startswith("Of 4 per-seed comparisons"))
    assert "4 differ significantly (the 3 largest differences, by absolute size, above)" in summary, summary


# --- 5. headers name what their cells hold ---------------------------------------------------------------------
def test_the_headline_accuracy_header_says_mean_and_sd_when_its_cells_hold_them(tmp_path: Path) -> None:
    from bench.report.overview import headline_table

    several = headline_table(load_suite(_seeded_suite(tmp_path / "a", ("grpo", "dpo"))))
    column = next(h for h in several.header if h.startswith("accuracy"))
    assert column == "accuracy suite-strict before → after (mean ± sd over seeds)", column
    assert "± " in several.rows[0][several.header.index(column)]  # the cell it heads: mean ± sd, no interval
    one = headline_table(load_suite(write_suite(tmp_path / "b", methods=("grpo", "dpo"))))
    assert "accuracy suite-strict before → after (95% CI)" in one.header  # one seed: the cells are intervals


# --- 6. bold only what a test separates, among contestants, within comparable quantities -----------------------
def _bold(table: Any, label: str, column: str) -> bool:
    i = next(i for i, row in enumerate(table.rows) if row[0] == label)
    return (i, table.header.index(column)) in table.best


def test_bold_needs_a_test_and_never_marks_the_control_or_an_offline_step(tmp_path: Path) -> None:
    from bench.report.overview import headline_table

    suite_dir = _seeded_suite(tmp_path, ("grpo", "grpo_engine", "ppo_verifier", "dpo", "control"))
    for seed in range(3):  # the control arm fastest of all, DPO the shortest step: neither is a contestant there
        _edit(suite_dir, f"control-s{seed}", lambda d, s=seed: d["throughput"].update(
            completions_per_s=900.0 + s, tokens_per_s=18_000.0 + s, step_s_median=0.05 + 0.001 * s))
        _edit(suite_dir, f"dpo-s{seed}", lambda d, s=seed: d["throughput"].update(step_s_median=0.1 + 0.001 * s))
    table = headline_table(load_suite(suite_dir))
    accuracy = next(h for h in table.header if h.startswith("accuracy"))
    for column in ("s/step (median)", "completions/s of training", "generated tokens/s of training", "static memory per network (MiB, accounting)",
                   "peak memory (source)", accuracy):
        assert not _bold(table, "Control (lr 0)", column), column
    assert not _bold(table, "DPO (TRL, pool pairs)", "s/step (median)")  # no generation in its step: not comparable
    # Among the generating contestants the suite engine's GRPO has the shortest step on every seed (0.320-0.326 s
    # against 0.400-0.408 and 0.512-0.522): Welch's t-test separates it, so it is bold.
    assert _bold(table, "GRPO (suite engine)", "s/step (median)")
    assert _bold(table, "GRPO (suite engine)", "completions/s of training") is False  # 200/s on every seed: no spread, no test
    # GRPO (TRL) has the highest mean accuracy but its seeds differ from PPO (verifier)'s by +0.5 pp on every seed
    # (no seed spread) and by 2 questions of 400 per seed (McNemar p = 0.5): nothing separates it.
    assert not _bold(table, "GRPO (TRL)", accuracy)
    # Static memory: GRPO, GRPO (suite engine) and DPO tie at 17 MiB: a tie is not a best.
    assert not any((i, 2) in table.best for i in range(len(table.rows)))
    assert any("never the control arm" in n or "the control arm, a pipeline check, is none" in n for n in table.notes)


def test_one_seed_has_no_test_so_no_bold_rate(tmp_path: Path) -> None:
    from bench.report.overview import headline_table

    table = headline_table(load_suite(write_suite(tmp_path, methods=("grpo", "grpo_engine", "ppo"))))
    for column in ("s/step (median)", "completions/s of training", "generated tokens/s of training",
                   "peak memory (source)"):
        assert not any((i, table.header.index(column)) in table.best for i in range(len(table.rows))), column


def test_a_separated_accuracy_is_bold(tmp_path: Path) -> None:
    """GRPO (TRL) 160 and PPO (reward model) 60 of 400, one seed: McNemar (100 vs 0 discordant) separates them."""
    from bench.report.overview import headline_table

    table = headline_table(load_suite(write_suite(tmp_path, methods=("grpo", "ppo", "control"))))
    accuracy = next(h for h in table.header if h.startswith("accuracy"))
    assert _bold(table, "GRPO (TRL)", accuracy) and not _bold(table, "Control (lr 0)", accuracy)


# --- 7. one comparison, one family, named beside its table ----------------------------------------------------
def test_each_comparison_is_in_one_named_family(tmp_path: Path) -> None:
    from bench.report.seeds import seed_tests, seed_tests_table

    between = "between methods, over seeds"
    against_start = "each method against the control arm (its start), over seeds"
    suite = load_suite(_seeded_suite(tmp_path, ("grpo", "grpo_engine", "dpo", "control")))
    paired, start = tables.paired_tests(suite), tables.start_tests(suite)
    # The control arm is its start on every question: GRPO against it is GRPO against the start, so it is tested
    # once, in the start family, and its own check (after equals before) is the control table's, not a McNemar.
    assert paired and not any("Control" in t["a"] + t["b"] for t in paired)
    assert start and not any(t["method"].startswith("Control") for t in start)
    assert {t["family"] for t in paired} == {"between methods, same questions, per seed"}
    assert {t["family"] for t in start} == {"each method against its start, same questions"}
    assert {t["family_size"] for t in paired} == {t["family_size"] for t in start} == {9}  # 3 contestants, 3 seeds
    over = seed_tests(suite)
    assert {t.get("family") for t in over if "Control (lr 0)" in (t["a"], t["b"])} == {against_start}
    assert {t.get("family") for t in over if "Control (lr 0)" not in (t["a"], t["b"])} == {between}
    # Beside each table of adjusted p-values: the family's name and size.
    detail = tables.detail_tables(suite)
    paired_notes = " ".join(tables.paired_tests_table(suite).notes)
    assert 'Holm family "between methods, same questions, per seed": 9 tests' in paired_notes
    assert 'Holm family "each method against its start, same questions": 9 tests' in " ".join(
        detail["start_tests"].notes)
    seed_table = seed_tests_table(suite)
    assert "Holm family" in seed_table.header
    # GRPO - engine: +1.0 pp on every seed (undefined); GRPO - DPO, engine - DPO tested: 2 between methods; the
    # control against GRPO and the engine tested, against DPO undefined (both seed-invariant): 2 against the start.
    notes = " ".join(seed_table.notes)
    assert f'"{between}": 2 tests' in notes and f'"{against_start}": 2 tests' in notes, notes


def test_a_family_of_one_says_so(tmp_path: Path) -> None:
    suite = load_suite(write_suite(tmp_path, methods=("grpo", "ppo")))
    notes = " ".join(tables.paired_tests_table(suite).notes)
    assert '"between methods, same questions, per seed": 1 test (a family of one: its adjusted p is its p)' in notes


# --- stats: Welch's t-test and a named Holm family -------------------------------------------------------------
def test_welch_t_test_by_hand() -> None:
    # [1, 2, 3] vs [4, 5, 6]: difference -3, each variance 1, se = sqrt(1/3 + 1/3), t = -3.674; Welch df =
    # (2/3)^2 / (2 (1/3)^2 / 2) = 4. With 4 df, P(|T| >= t) = 1 - 3u/2 + u^3/2 where u = t / sqrt(t^2 + 4).
    test = stats.welch_t_test([1, 2, 3], [4, 5, 6])
    t = -3 / math.sqrt(2 / 3)
    u = abs(t) / math.sqrt(t * t + 4)
    assert test["mean_diff"] == pytest.approx(-3.0) and test["t"] == pytest.approx(t) and test["df"] == pytest.approx(4)
    assert test["p_value"] == pytest.approx(1 - 1.5 * u + 0.5 * u ** 3, abs=1e-9)
    assert stats.welch_t_test([1.0], [2.0, 3.0])["undefined"] == stats.ONE_VALUE
    none = stats.welch_t_test([0.2, 0.2], [0.3, 0.3])
    assert none["undefined"] == stats.NO_SPREAD and none["p_value"] is None


def test_holm_family_names_the_family_and_counts_only_tests_with_a_p_value() -> None:
    family = stats.holm_family([{"p_value": 0.01}, {"p_value": None}, {"p_value": 0.04}], "f")
    assert [t["p_holm"] for t in family] == [pytest.approx(0.02), None, pytest.approx(0.04)]
    assert {t["family"] for t in family} == {"f"} and {t["family_size"] for t in family} == {2}


def test_the_seed_fixture_keeps_its_numbers(tmp_path: Path) -> None:
    """Guards the numbers the tests above reason with (GRPO 160 + 3 per seed of N questions)."""
    suite = load_suite(_seeded_suite(tmp_path, ("grpo",)))
    values = sorted(r.result["accuracy"]["after"]["strict"]["correct"] for r in suite.methods)
    assert values == [160, 163, 166] and N == 400
