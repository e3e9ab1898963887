"""End to end on cpu-quick: the real CLI, every stage and method in its own worker, then the report.

One suite run (about two minutes on 2 cores) is shared by the tests of this module.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from bench_cli import run_bench, run_quick_suite

REQUIRED_COLUMNS = ["method", "seed", "status", "accuracy_before", "accuracy_after", "accuracy_after_low",
                    "accuracy_after_high", "peak_memory_bytes", "memory_source", "completions_per_s",
                    "tokens_per_s", "wall_s"]
METHODS = ["grpo", "grpo_engine", "ppo", "ppo_verifier", "dpo"]
ONLINE = ["grpo", "grpo_engine", "ppo", "ppo_verifier"]


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("e2e")
    out = root / "reports" / "quick"
    proc = run_quick_suite(out, "--reports-dir", str(out.parent), cache_dir=root / "cache", timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "report:" in proc.stderr
    return out


def result(suite: Path, run_id: str) -> dict:
    return json.loads((suite / "runs" / run_id / "result.json").read_text())


def test_every_run_finished_ok(suite: Path) -> None:
    planned = json.loads((suite / "suite.json").read_text())["runs"]
    assert planned == ["warm_start", "sample_pool", "reward_model"] + [f"{m}-s0" for m in METHODS]
    for run_id in planned:
        data = result(suite, run_id)
        assert data["status"] == "ok", (run_id, data["error"])


def test_report_files_exist_and_latest_points_here(suite: Path) -> None:
    for name in ("index.html", "summary.md", "results.csv"):
        assert (suite / name).stat().st_size > 0
    pngs = list((suite / "figures").glob("*.png"))
    assert {"accuracy_suite-strict.png", "throughput.png", "phases.png"} <= {p.name for p in pngs}
    assert any(p.name.startswith("memory_") for p in pngs)
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (suite.parent / "latest").resolve() == suite.resolve()


def test_results_csv_has_the_columns_and_sane_values(suite: Path) -> None:
    with open(suite / "results.csv", newline="") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames[: len(REQUIRED_COLUMNS)] == REQUIRED_COLUMNS
        rows = list(reader)
    assert sorted(r["method"] for r in rows) == sorted(METHODS)
    for row in rows:
        assert row["status"] == "ok" and row["seed"] == "0"
        before, after = float(row["accuracy_before"]), float(row["accuracy_after"])
        low, high = float(row["accuracy_after_low"]), float(row["accuracy_after_high"])
        assert 0.0 <= before <= 1.0 and 0.0 <= low <= after <= high <= 1.0
        assert row["memory_source"] == "cpu-rss"  # no GPU here: never a CUDA number
        assert int(float(row["peak_memory_bytes"])) > 50 * 2**20
        assert float(row["wall_s"]) > 0
        if row["method"] in ONLINE:
            assert float(row["completions_per_s"]) > 0 and float(row["tokens_per_s"]) > 0
    befores = {row["accuracy_before"] for row in rows}
    assert len(befores) == 1  # every method starts from the same checkpoint, evaluated once


def test_matched_sampling_budget(suite: Path) -> None:
    """Completions counted where they were generated (TRL: the wrapped generate; engine: its sampler) are the
    same matched number for every online method; each has the same optimizer steps and generation settings."""
    spec = json.loads((suite / "suite.json").read_text())["spec"]
    per_step = spec["train"]["prompts_per_step"] * spec["train"]["group_size"]
    budget = spec["generation"]["max_new_tokens"]
    settings = []
    for method in ONLINE:
        data = result(suite, f"{method}-s0")
        counted = data["throughput"]["completions"]
        assert counted == per_step * spec["train"]["steps"], method
        assert 0 < data["throughput"]["generated_tokens"] <= counted * budget, method
        assert data["throughput"]["steps"] == spec["train"]["steps"], method  # one update per rollout
        generation = data["settings"].get("generation") or {}
        settings.append({k: generation.get(k) for k in ("temperature", "top_p", "top_k", "max_new_tokens")})
    assert all(s == settings[0] for s in settings) and settings[0]["max_new_tokens"] == budget


def test_resume_skips_finished_runs_and_reruns_only_missing_ones(suite: Path) -> None:
    before = {run: result(suite, run)["finished_at"] for run in ("warm_start", "grpo-s0", "ppo-s0")}
    (suite / "runs" / "dpo-s0" / "result.json").unlink()
    proc = run_bench("run", "--preset", "cpu-quick", "--out", str(suite), "--resume",
                     cache_dir=suite.parent.parent / "cache", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("already complete, skipped (--resume)") == len(list((suite / "runs").iterdir())) - 1
    assert {run: result(suite, run)["finished_at"] for run in before} == before  # not re-run
    assert result(suite, "dpo-s0")["status"] == "ok"  # the missing one ran again


def test_every_method_has_phase_times_and_labelled_memory(suite: Path) -> None:
    for method in METHODS:
        data = result(suite, f"{method}-s0")
        phases = data["phases"]
        assert phases["update"]["time_s"] > 0
        if method in ONLINE:
            assert phases["generation"]["time_s"] > 0 and phases["reward"]["count"] > 0
        for name, reading in data["memory"]["phases"].items():
            assert reading["source"] == "cpu-rss" and reading["peak_bytes"] > 0, name
        train_phase_s = sum(v["time_s"] for k, v in phases.items() if k != "evaluation")
        step_s = sum(data_steps(data))
        assert step_s > 0
        assert abs(train_phase_s - step_s) <= 0.10 * step_s, (method, train_phase_s, step_s)


def test_every_method_counts_trained_tokens(suite: Path) -> None:
    for method in METHODS:
        throughput = result(suite, f"{method}-s0")["throughput"]
        assert throughput["trained_tokens"] > 0 and throughput["trained_tokens_per_s"] > 0, method
        if method in ONLINE:  # prompt + completion tokens go through the update, at least once each
            assert throughput["trained_tokens"] > throughput["generated_tokens"], method


def data_steps(data: dict) -> list[float]:
    return data["throughput"]["step_times_s"]


def test_ppo_holds_four_networks_and_grpo_engine_two(suite: Path) -> None:
    ppo = result(suite, "ppo-s0")["memory"]["networks"]
    assert set(ppo) == {"actor", "critic", "reward", "reference"}
    for role, entry in ppo.items():
        assert entry["params"] > 0 and entry["weight_bytes"] >= 4 * entry["params"] * 0.99, role
    assert ppo["reference"]["grad_bytes"] == 0 and ppo["reward"]["optimizer_bytes"] == 0
    assert ppo["actor"]["optimizer_bytes"] > 0 and ppo["critic"]["optimizer_bytes"] > 0
    assert set(result(suite, "ppo_verifier-s0")["memory"]["networks"]) == {"actor", "critic", "reference"}
    assert set(result(suite, "grpo_engine-s0")["memory"]["networks"]) == {"actor", "reference"}
    for method in ("ppo", "ppo_verifier", "grpo_engine"):
        for point in result(suite, f"{method}-s0")["curves"]:
            for key in ("loss", "kl"):
                if key in point:
                    assert point[key] == point[key] and abs(point[key]) < 1e6, (method, key)  # finite


def test_stage_results_are_recorded(suite: Path) -> None:
    rm = result(suite, "reward_model")["metrics"]
    assert 0.0 <= rm["heldout_pair_accuracy"] <= 1.0 and rm["train_pairs"] > 0
    pool = result(suite, "sample_pool")["metrics"]
    assert pool["pairs"] > 0


def test_html_escapes_model_text(suite: Path, tmp_path: Path) -> None:
    run_file = suite / "runs" / "grpo-s0" / "result.json"
    data = json.loads(run_file.read_text())
    data["samples"][0]["completion"] = "<script>alert('x')</script> <answer>7</answer>"
    run_file.write_text(json.dumps(data))
    proc = run_bench("report", str(suite), timeout=300)
    assert proc.returncode == 0, proc.stderr
    html = (suite / "index.html").read_text()
    assert "&lt;script&gt;alert(" in html
    assert "<script>alert(" not in html


def test_lora_runs_count_adapters_as_trainable_and_the_base_once(tmp_path: Path) -> None:
    out = tmp_path / "lora"
    # What is counted needs no trained start: a short warm start, and gold pool pairs so DPO has pairs anyway.
    proc = run_quick_suite(out, "train.lora.enabled=true", "methods.grpo_engine.enabled=false",
                           "methods.ppo.enabled=false", "methods.ppo_verifier.enabled=false", "warm_start.steps=20",
                           "sample_pool.pairs=gold", cache_dir=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for method in ("grpo", "dpo"):
        data = result(out, f"{method}-s0")
        assert data["status"] == "ok", data["error"]
        actor, reference = data["memory"]["networks"]["actor"], data["memory"]["networks"]["reference"]
        assert 0 < actor["trainable_params"] < actor["params"] / 2  # adapters only
        assert actor["grad_bytes"] == 4 * actor["trainable_params"]
        assert actor["optimizer_bytes"] >= 2 * 4 * actor["trainable_params"]  # AdamW: two moments per weight
        # The reference is the same frozen base with adapters off: no second copy of the weights.
        assert reference["weight_bytes"] == 0 and reference["shared_params"] == actor["params"]
        assert data["accuracy"]["after"] is not None


def test_gsm8k_files_and_a_local_model_folder_run_through_the_suite(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU preset's path, offline: GSM8K-format files (written here) and model.source=path."""
    from bench.task.data import tokenizer_corpus
    from bench.model.loading import tiny_model_dir
    from bench.config.loading import load_spec
    from bench.task.problems import generate_synthetic

    data = tmp_path / "gsm8k"
    data.mkdir()
    for split, seed in (("train", 1), ("test", 2)):
        with open(data / f"{split}.jsonl", "w") as handle:
            for problem in generate_synthetic(40, seed=seed, max_operand=9, max_steps=1):
                handle.write(json.dumps({"question": problem["question"], "answer": problem["answer"]}) + "\n")
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    spec = load_spec("cpu-quick")
    model_dir = tiny_model_dir(spec, tokenizer_corpus(spec))
    out = tmp_path / "suite"
    proc = run_quick_suite(out, "task.source=gsm8k", f"task.path={data}", "task.train_size=40", "task.test_size=20",
                           "model.source=path", f"model.name_or_path={model_dir}", "methods.grpo_engine.enabled=false",
                           "methods.ppo.enabled=false", "methods.ppo_verifier.enabled=false",
                           "methods.dpo.enabled=false", cache_dir=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr[-2000:]
    grpo = result(out, "grpo-s0")
    assert grpo["status"] == "ok", grpo["error"]
    assert grpo["accuracy"]["n_questions"] == 20
    assert grpo["spec"]["task"]["path"] == str(data)
    questions = {json.loads(line)["question"] for line in open(data / "test.jsonl")}
    assert all(sample["question"] in questions for sample in grpo["samples"])


def test_report_statistics_from_the_real_files(suite: Path) -> None:
    """Statistics on real result files: every method against the warm start, the reward model's interval, the modes."""
    from bench.report.load import load_suite, results_frame
    from bench.report.reward_check import reward_model_check
    from bench.report.tables import control_checks, start_tests

    loaded = load_suite(suite)
    assert not [p for p in loaded.problems if "malformed" in p]  # every ok result passes the schema check
    tests = {t["run_id"]: t for t in start_tests(loaded)}
    methods = [r.run_id for r in loaded.methods if r.status == "ok"]
    assert sorted(tests) == sorted(methods)  # each method paired with the warm start's own verdicts
    n = result(suite, "warm_start")["accuracy"]["n_questions"]
    assert all(t["n"] == n and 0 <= t["p_value"] <= t["p_holm"] <= 1 for t in tests.values())
    check = reward_model_check(loaded.runs)
    assert check is not None and check["n"] > 0 and check["low"] <= check["accuracy"] <= check["high"]
    frame = results_frame(loaded)
    assert set(frame["headline_mode"]) == {loaded.headline_mode}
    assert frame["accuracy_after_suite_strict"].notna().all()
    for control in control_checks(loaded):  # the control arm, when the preset runs it: lr 0 moves nothing
        assert control["passed"] is True, control


def test_the_report_passes_the_browser_check(suite: Path) -> None:
    """The end-to-end report opened in headless Chromium: no console error, every image decodes, every section."""
    import shutil
    import subprocess

    if not shutil.which("chromium") and not shutil.which("chromium-browser"):
        pytest.skip("no Chromium on this machine (.ci/run installs it: apt-get install -y chromium)")
    repo = Path(__file__).resolve().parents[1]
    shot = suite / "screenshot.png"
    proc = subprocess.run(["bash", str(repo / "scripts" / "check_report.sh"), str(suite), str(shot)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert shot.is_file() and shot.stat().st_size > 10_000


def test_tensorboard_holds_every_runs_curves(suite: Path) -> None:
    """Every run logged to TensorBoard (the default telemetry.report_to) under the curves' own names; read
    back with TensorBoard's reader, its scalars equal result.json's curves at the same steps, with no warning."""
    from tensorboard_events import assert_tensorboard_equals_curves

    planned = json.loads((suite / "suite.json").read_text())["runs"]
    for run_id in planned:
        data = result(suite, run_id)
        record = data["trackers"]
        assert record["run_name"] == f"{suite.name}/{run_id}" and record["warnings"] == [], (run_id, record)
        if data["curves"]:  # the sample pool trains nothing
            assert_tensorboard_equals_curves(suite / "runs" / run_id, data["curves"])
    assert f"tensorboard --logdir {suite / 'runs'}" in (suite / "index.html").read_text()
