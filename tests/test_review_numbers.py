"""Numbers that survive a hostile reviewer, on fixture suites.

Clustered questions (the statistics treat a working asked several times as one unit, and change nothing where every
question is its own cluster), the data checks on the page, seed tests with zero spread, findings that quote means
over seeds, the tuning note against what ran, and the page's title from the model and task that ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from report_fixtures import N, _score, method_result, write_suite

from bench.report import build_report, fmt, load_suite
from bench.report.findings import findings
from bench.report.tables import paired_tests, start_tests
from bench.results import write_json_atomic
from bench.scoring import stats

WORKINGS = 40
"""The clustered fixture: 400 questions, 10 per working; a method is right on every question of its first k
workings (the start 10, GRPO 16, DPO 11), so verdicts agree within a working as they do on the real task."""
RIGHT = {"warm_start-s0": 10, "grpo-s0": 16, "dpo-s0": 11}
SYNTHETIC_CHECKS = {"working_overlap": 0, "question_overlap": 0, "step_overlap": N, "steps_all_seen": 300,
                    "questions": N, "clusters": WORKINGS, "cluster_unit": "working",
                    "held_out_by": "working: sha256(working) % 100 < 20 is test (held-out combinations of seen "
                                   "steps; one question per test working)"}


def _rewrite(suite: Path, source: str, checks: dict[str, Any] | None) -> Path:
    """Give every run of a write_suite(methods=('grpo', 'dpo')) folder a completions file of the clustered
    fixture (ids, worked answers, verdicts per mode), the task ``source`` and the data ``checks``."""
    for run_id, workings_right in RIGHT.items():
        run_dir = suite / "runs" / run_id
        rows = []
        for i in range(N):
            w = i // (N // WORKINGS)
            right = w < workings_right
            rows.append({"index": i, "id": f"q{i:04d}", "gold": str(w), "gold_answer": f"{w}+{w}={2 * w}\n#### {2 * w}",
                         "correct": {m: right for m in fmt.MODES}})
        (run_dir / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        (run_dir / "eval_after.jsonl").unlink(missing_ok=True)
        result = json.loads((run_dir / "result.json").read_text())
        result["eval_file"] = "completions.jsonl"
        result.setdefault("spec", {})["task"] = {"source": source, "synthetic": {"max_operand": 20, "max_steps": 2}}
        if checks is not None:
            result["data_checks"] = checks
        correct = workings_right * (N // WORKINGS)
        result["accuracy"] = {"n_questions": N, "after": {m: _score(correct) for m in ("suite-strict", "suite-flexible")}}
        if run_id != "warm_start-s0":
            result["accuracy"]["before"] = {m: _score(100) for m in ("suite-strict", "suite-flexible")}
        write_json_atomic(run_dir / "result.json", result)
    meta = json.loads((suite / "suite.json").read_text())
    meta["spec"]["task"] = {"source": source, "synthetic": {"max_operand": 20, "max_steps": 2}}
    write_json_atomic(suite / "suite.json", meta)
    return suite


@pytest.fixture(scope="module")
def clustered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    suite = _rewrite(write_suite(tmp_path_factory.mktemp("clustered"), methods=("grpo", "dpo")), "synthetic",
                     SYNTHETIC_CHECKS)
    build_report(suite)
    return suite


def _verdicts(suite: Path, run_id: str) -> list[bool]:
    lines = (suite / "runs" / run_id / "completions.jsonl").read_text().splitlines()
    return [json.loads(line)["correct"]["suite-strict"] for line in lines]


def test_paired_tests_treat_a_working_as_one_unit(clustered: Path) -> None:
    # GRPO is right on 5 more workings than DPO, i.e. 50 more questions. Per question that is
    # 50 discordant pairs all one way (exact McNemar p = 2^-49 ~ 1.8e-15); per working it is 5 clusters all one way:
    # X^2 = 50^2 / (5 * 10^2) = 5, p = erfc(sqrt 2.5) = 0.0253.
    suite = load_suite(clustered)
    test = next(t for t in paired_tests(suite) if {t["a"], t["b"]} == {"GRPO (TRL)", "DPO (TRL, pool pairs)"})
    assert test["test"] == stats.CLUSTERED_MCNEMAR and test["clusters"] == WORKINGS and test["n"] == N
    assert test["p_value"] == pytest.approx(0.0253, abs=1e-4)
    a, b = _verdicts(clustered, "grpo-s0"), _verdicts(clustered, "dpo-s0")
    assert stats.mcnemar_test(a, b)["p_value"] == pytest.approx(2.0 ** -49)
    per_question = stats.paired_bootstrap(a, b)
    assert (test["diff_high"] - test["diff_low"]) > 2 * (per_question["high"] - per_question["low"])
    start = next(t for t in start_tests(suite) if t["method"] == "GRPO (TRL)")
    assert start["test"] == stats.CLUSTERED_MCNEMAR and start["clusters"] == WORKINGS


def test_accuracy_intervals_are_cluster_adjusted_and_n_names_the_clusters(clustered: Path) -> None:
    suite = load_suite(clustered)
    grpo = next(r for r in suite.methods if r.run_id == "grpo-s0")
    score = fmt.score(grpo, "after", "suite-strict")
    wilson = stats.wilson_interval(160, N)
    assert score["interval"] == "cluster-adjusted Wilson" and score["clusters"] == WORKINGS
    assert score["design_effect"] > 5 and score["low"] < wilson[0] - 0.05 and score["high"] > wilson[1] + 0.05
    md = (clustered / "summary.md").read_text(encoding="utf-8")
    headline = md.split("## Headline\n", 1)[1].split("\n## ", 1)[0]
    assert "| 400 (40 workings) |" in headline
    assert "400 questions in 40 workings" in md  # the findings' basis says n and its clusters
    assert "Wilson intervals at the effective sample size of 40 workings of 400 questions" in md
    paired = md.split("## Paired tests", 1)[1].split("\n## ", 1)[0]
    assert "| 400 (40) |" in paired and "clustered McNemar (Durkalski 2003)" in paired
    assert "not adjusted for multiple comparisons" in paired


def test_one_question_per_problem_changes_nothing(tmp_path: Path) -> None:
    # Real GSM8K: one question per problem. The same verdicts under a GSM8K source are each their own cluster,
    # so every number is the per-question one (exact McNemar, Wilson, the question bootstrap).
    suite = load_suite(_rewrite(write_suite(tmp_path, methods=("grpo", "dpo")), "gsm8k", None))
    test = next(t for t in paired_tests(suite) if {t["a"], t["b"]} == {"GRPO (TRL)", "DPO (TRL, pool pairs)"})
    dirs = {r.run_id: r for r in suite.methods}
    a = _verdicts(suite.suite_dir, "grpo-s0")
    b = _verdicts(suite.suite_dir, "dpo-s0")
    xa, xb = (a, b) if test["a"] == "GRPO (TRL)" else (b, a)
    assert test["test"] == stats.EXACT_MCNEMAR and test["clusters"] == N
    assert test["p_value"] == stats.mcnemar_test(xa, xb)["p_value"]
    boot = stats.paired_bootstrap(xa, xb)
    assert (test["diff_low"], test["diff_high"]) == (boot["low"], boot["high"])
    score = fmt.score(dirs["grpo-s0"], "after", "suite-strict")
    assert (score["low"], score["high"]) == stats.wilson_interval(160, N) and score["interval"] == "Wilson"


def test_data_checks_are_on_the_page_and_word_the_held_out_claim(clustered: Path) -> None:
    # The checks every result records are shown, and the split is called held out only
    # at the levels whose overlap is 0: by whole working, not by step.
    md = (clustered / "summary.md").read_text(encoding="utf-8")
    page = (clustered / "index.html").read_text(encoding="utf-8")
    assert "## Data checks" in md and 'id="data_checks"' in page
    section = md.split("## Data checks\n", 1)[1].split("\n## ", 1)[0]
    assert "yes: held out by whole working" in section and "yes: held out by question" in section
    assert "no: not held out by step (held-out combinations of seen steps)" in section
    assert "test split: clusters (workings) | 40" in section
    assert "greedy decoding on the test split, held out by whole working (held-out combinations of seen steps)" in md
    assert "held-out split" not in md and "held-out split" not in page


def test_a_split_with_shared_questions_is_never_called_held_out(tmp_path: Path) -> None:
    checks = {"question_overlap": 400, "questions": N, "clusters": N, "cluster_unit": "question",
              "held_out_by": "none: one file for both splits"}
    suite = _rewrite(write_suite(tmp_path, methods=("grpo", "dpo")), "gsm8k", checks)
    build_report(suite)
    md = (suite / "summary.md").read_text(encoding="utf-8")
    assert "the test split, not held out (one file serves as both splits" in md
    assert "> **Warning:** The test split is not held out" in md
    assert "held out by" not in md.split("## Data checks\n", 1)[1].split("\n## ", 1)[0].replace("kept apart by", "")\
        .replace("not held out by", "")


def _seed_suite(tmp_path: Path, scores: dict[str, tuple[int, ...]]) -> Path:
    suite_dir = write_suite(tmp_path, methods=tuple(scores))
    plan = json.loads((suite_dir / "suite.json").read_text())
    for method, values in scores.items():
        for seed, value in enumerate(values):
            res = method_result(method, seed=seed)
            res["accuracy"]["after"] = {"strict": _score(value), "flexible": _score(value)}
            write_json_atomic(suite_dir / "runs" / f"{method}-s{seed}" / "result.json", res)
            if seed:
                plan["runs"].append(f"{method}-s{seed}")
    plan["spec"]["seeds"] = list(range(max(len(v) for v in scores.values())))
    write_json_atomic(suite_dir / "suite.json", plan)
    return suite_dir


def test_zero_spread_over_seeds_is_undefined_never_significant(tmp_path: Path) -> None:
    # The control (100 of 400 on every seed) against a method 2 questions above it on every seed: a paired t-test
    # that divided by the zero standard error would print "significant (p < 1e-300)".
    suite = load_suite(_seed_suite(tmp_path, {"grpo": (102, 102, 102), "control": (100, 100, 100)}))
    lines = [f.line() for f in findings(suite)]
    over = [line for line in lines if line.startswith("Over seeds")]
    assert over and all("significant" not in line.replace("not significant", "") for line in over), over
    assert any("t-test is undefined" in line and "GRPO (TRL) vs Control (lr 0) +0.50 pp on every seed" in line
               for line in over), over
    from bench.report.seeds import seed_tests_table

    row = seed_tests_table(suite).rows[0]
    assert row[-2] == "undefined (zero spread)" and row[-1] == "undefined (zero spread)"


def test_findings_quote_each_methods_mean_over_seeds_with_its_range(tmp_path: Path) -> None:
    # The best single run (GRPO seed 2, 180) is not the headline; GRPO's mean (160) is.
    suite = load_suite(_seed_suite(tmp_path, {"grpo": (140, 160, 180), "dpo": (110, 112, 114)}))
    line = next(f.text for f in findings(suite) if f.text.startswith("Accuracy after training"))
    assert line.startswith("Accuracy after training (mean over 3 seeds): GRPO (TRL) 40.0% (range 35.0–45.0%), "
                           "DPO (TRL, pool pairs) 28.0% (range 27.5–28.5%)"), line
    assert "45.0% [" not in line  # no single run's interval stands for the method
    # Only seed 0 wrote per-question files here: the count says comparisons = pairs x seeds, not "method pairs".
    comparisons = next(f.text for f in findings(suite) if f.text.startswith("Of "))
    assert comparisons.startswith("Of 1 per-seed comparison (1 method pair × 1 seed)"), comparisons
    seeds_line = [f for f in findings(suite) if "little power" in f.basis]
    assert all("with 3 seeds" in f.basis for f in seeds_line)


def test_comparisons_count_method_pairs_not_named_runs(tmp_path: Path) -> None:
    # Every seed wrote per-question files: 2 methods x 3 seeds are 3 comparisons of 1 pair. The runs' names carry
    # their seed ("GRPO (TRL) s1"), which counted 3 pairs ("45 method pair(s) x 3 seeds" on cpu-tiny's 15 pairs).
    from bench.report.tables import paired_tests_table

    suite_dir = _seed_suite(tmp_path, {"grpo": (140, 160, 180), "dpo": (110, 112, 114)})
    for method in ("grpo", "dpo"):
        verdicts = (suite_dir / "runs" / f"{method}-s0" / "eval_after.jsonl").read_bytes()
        for seed in (1, 2):
            (suite_dir / "runs" / f"{method}-s{seed}" / "eval_after.jsonl").write_bytes(verdicts)
    suite = load_suite(suite_dir)
    comparisons = next(f.text for f in findings(suite) if f.text.startswith("Of "))
    assert comparisons.startswith("Of 3 per-seed comparisons (1 method pair × 3 seeds)"), comparisons
    assert any("(1 method pair × 3 seeds, this mode)" in note for note in paired_tests_table(suite).notes)


def test_headline_and_seed_table_say_what_the_seeds_varied(tmp_path: Path) -> None:
    from bench.report.overview import headline_table
    from bench.report.seeds import across_seeds

    suite_dir = _seed_suite(tmp_path, {"grpo": (140, 160, 180), "dpo": (110, 112, 114)})
    suite = load_suite(suite_dir)
    table = headline_table(suite)
    cell = next(c for row in table.rows if row[0] == "GRPO (TRL)" for c in row if "±" in str(c))
    assert cell.endswith("(mean ± sd of 3 seeds)"), cell  # the explanation is said once, under the table
    assert any("seed spread of the method stage; warm start, pool and reward model shared" in n for n in table.notes)
    assert any("only the method stage" in n for n in across_seeds(suite).notes)
    meta = json.loads((suite_dir / "suite.json").read_text())
    meta["spec"]["seed_scope"] = "pipeline"
    write_json_atomic(suite_dir / "suite.json", meta)
    assert any("seed spread of the whole pipeline" in n for n in headline_table(load_suite(suite_dir)).notes)


def test_an_overridden_tuned_value_reads_overridden(tmp_path: Path) -> None:
    # methods.grpo.learning_rate=4e-4 on the command line; the preset's tuning block chose 1e-4.
    from bench.report.overview import tuning_note

    suite_dir = write_suite(tmp_path, methods=("grpo", "dpo"))
    for method, lr in (("grpo", 4e-4), ("dpo", 1e-5)):
        res = method_result(method)
        res["spec"]["methods"] = {method: {"learning_rate": lr}}
        res["spec"]["tuning"] = {"methods": {method: {"chosen": {f"methods.{method}.learning_rate": 1e-4 if
                                                                method == "grpo" else 1e-5},
                                                     "score": {"mean": 0.55}, "points": 3, "n_questions": 1000,
                                                     "seeds": [0, 1]}}}
        write_json_atomic(suite_dir / "runs" / f"{method}-s0" / "result.json", res)
    note = tuning_note(load_suite(suite_dir))
    grpo = note.split("GRPO (TRL): ", 1)[1].split("; DPO", 1)[0]
    assert "chosen learning_rate = 0.0001" in grpo and "overridden: ran learning_rate = 0.0004" in grpo, note
    assert "overridden" not in note.split("DPO (TRL, pool pairs): ", 1)[1]  # 1e-05 ran as chosen


def test_title_and_description_name_the_model_and_task_that_ran(tmp_path: Path) -> None:
    # The page names the model and task that ran, not the preset's description ("Qwen2.5-0.5B-Instruct on GSM8K")
    # when another model ran; under sample_pool.pairs: gold the pool stage is not called "verifier-labelled".
    from bench.report.citation import citation

    suite_dir = write_suite(tmp_path, methods=("grpo", "dpo"))
    meta = json.loads((suite_dir / "suite.json").read_text())
    meta["description"] = "Qwen2.5-0.5B-Instruct on GSM8K"
    meta["spec"].update(model={"source": "fetched", "name_or_path": "SmolLM2-135M-Instruct"},
                        task={"source": "gsm8k-bundled"}, sample_pool={"pairs": "gold"})
    write_json_atomic(suite_dir / "suite.json", meta)
    pool = json.loads((suite_dir / "runs" / "sample_pool-s0" / "result.json").read_text())
    pool["label"] = "Sample pool (verifier-labelled)"
    pool["spec"] = {"sample_pool": {"pairs": "gold"}}
    write_json_atomic(suite_dir / "runs" / "sample_pool-s0" / "result.json", pool)
    start = json.loads((suite_dir / "runs" / "warm_start-s0" / "result.json").read_text())
    start["spec"] = {"warm_start": {"enabled": False}}  # an older result: recorded under the SFT label
    write_json_atomic(suite_dir / "runs" / "warm_start-s0" / "result.json", start)
    build_report(suite_dir)
    page = (suite_dir / "index.html").read_text(encoding="utf-8")
    md = (suite_dir / "summary.md").read_text(encoding="utf-8")
    assert "<title>Benchmark report: cpu-tiny · SmolLM2-135M-Instruct on GSM8K (bundled)</title>" in page
    assert md.startswith("# Benchmark summary: cpu-tiny · SmolLM2-135M-Instruct on GSM8K (bundled)")
    assert "Qwen2.5-0.5B-Instruct" not in page and "Qwen2.5-0.5B-Instruct" not in md
    assert "Sample pool (gold-labelled)" in md and "verifier-labelled" not in md
    assert "Start model (no warm start: the loaded weights, evaluated)" in md and "Warm start (SFT" not in md
    cite = dict(citation(load_suite(suite_dir)))
    assert cite["model"] == "SmolLM2-135M-Instruct" and cite["task"] == "GSM8K (the copy bundled with the suite)"
    assert cite["parameters"] == "1,000,000 (the actor, static accounting)"  # the fixture's actor


def test_cite_this_run_says_a_synthetic_task_is_not_gsm8k(clustered: Path) -> None:
    from bench.report.citation import citation

    cite = dict(citation(load_suite(clustered)))
    assert cite["task"].startswith("synthetic GSM8K-format arithmetic") and "not GSM8K" in cite["task"]
    assert cite["model"] == "not recorded"  # the fixture's spec names no model: never a guess


@pytest.mark.parametrize("max_steps, extent", [(1, "operands up to 25, one step;"), (3, "operands up to 25, up to 3 steps;")])
def test_the_synthetic_tasks_extent_reads_as_english(tmp_path: Path, max_steps: int, extent: str) -> None:
    from bench.report.citation import task_name

    suite_dir = write_suite(tmp_path, methods=("grpo",))
    meta = json.loads((suite_dir / "suite.json").read_text())
    meta["spec"]["task"] = {"source": "synthetic", "synthetic": {"max_operand": 25, "max_steps": max_steps}}
    write_json_atomic(suite_dir / "suite.json", meta)
    assert extent in task_name(load_suite(suite_dir))  # never "up to 1 steps"


def _ppo_suite(tmp_path: Path, rm_points: list[tuple[float, float]], heldout_accuracy: float) -> Path:
    """A GRPO + PPO (reward model) folder whose PPO logged ``rm_points`` (rm_score, accuracy_reward) per step and
    whose reward model ranked ``heldout_accuracy`` of 200 held-out pairs right."""
    suite_dir = write_suite(tmp_path, methods=("grpo", "ppo"))
    path = suite_dir / "runs" / "ppo-s0" / "result.json"
    res = json.loads(path.read_text())
    res["curves"] = [{**point, "rm_score": rm, "accuracy_reward": acc}
                     for point, (rm, acc) in zip(res["curves"], rm_points)]
    write_json_atomic(path, res)
    rm_path = suite_dir / "runs" / "reward_model-s0" / "result.json"
    rm = json.loads(rm_path.read_text())
    rm["metrics"]["heldout_pair_accuracy"] = heldout_accuracy
    write_json_atomic(rm_path, rm)
    return suite_dir


def test_over_optimisation_only_beyond_the_windows_noise(tmp_path: Path) -> None:
    # A rise of the proxy with a fall of the verifier's reward is flagged only beyond the windows' noise. Windows of 4
    # logged points whose values swing by +-0.2 (rm) and +-10 pp (accuracy) around a +0.01 / -1 pp drift: no flag.
    from bench.report.dynamics import overoptimisation_table

    swing = [(1.0 + 0.0005 * i + 0.2 * (-1) ** i, 0.40 - 0.0005 * i + 0.10 * (-1) ** i) for i in range(20)]
    assert overoptimisation_table(load_suite(_ppo_suite(tmp_path / "noise", swing, 0.75))).warnings == []
    # A clear trend (rm +0.19, accuracy -9.5 pp against windows' noise of a few thousandths) with an informative
    # reward model (75% of 200 held-out pairs, interval above 50%): over-optimisation.
    trend = [(1.0 + 0.01 * i, 0.40 - 0.005 * i) for i in range(20)]
    warnings = overoptimisation_table(load_suite(_ppo_suite(tmp_path / "trend", trend, 0.75))).warnings
    assert len(warnings) == 1 and "reward over-optimisation" in warnings[0]
    # The same trend with a reward model at chance (52% of 200, interval contains 50%): not over-optimisation of a
    # learned reward, and the run's name carries the flag.
    warnings = overoptimisation_table(load_suite(_ppo_suite(tmp_path / "chance", trend, 0.52))).warnings
    assert len(warnings) == 1 and warnings[0].startswith(
        "PPO (reward model) [reward model did not learn]: its reward model did not learn (52.0% [45.1, 58.8] on 200 "
        "held-out pairs (untrained head: 50.0%))")
    assert "not over-optimisation of a learned reward" in warnings[0] and "optimised noise" not in warnings[0]


def test_a_tuned_null_reads_its_default_never_none() -> None:
    from bench.report.overview import _chosen_text

    chosen = {"methods.ppo.learning_rate": 0.0002, "methods.ppo.kl_coef": None, "reward_model.epochs": 2}
    assert _chosen_text(chosen) == "learning_rate = 0.0002, kl_coef = its default, reward_model.epochs = 2"
