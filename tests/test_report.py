"""The report builder on fabricated suite folders: ok, failed, not-run and corrupt runs, hostile completions."""

from __future__ import annotations

import ast
import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.report import CSV_COLUMNS, build_report, load_suite
from bench.results import empty_result, write_json_atomic

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MIB = 1024**2
REQUIRED_FIRST = [
    "method", "seed", "status", "accuracy_before", "accuracy_after", "accuracy_after_low", "accuracy_after_high",
    "peak_memory_bytes", "memory_source", "completions_per_s", "tokens_per_s", "wall_s",
]
FORBIDDEN = ("torch", "transformers", "trl", "peft", "datasets")


def _score(correct: int, total: int) -> dict[str, Any]:
    from bench.scoring.stats import wilson_interval

    low, high = wilson_interval(correct, total)
    return {"correct": correct, "total": total, "accuracy": correct / total, "low": low, "high": high}


def make_result(
    run_id: str,
    method: str,
    label: str,
    *,
    kind: str = "method",
    engine: str = "trl",
    seed: int = 0,
    status: str = "ok",
    before: int = 10,
    after: int = 20,
    total: int = 40,
    source: str = "cpu-rss",
    peak_mib: float | None = 500.0,
    networks: tuple[str, ...] = ("actor", "reference"),
    samples: list[dict[str, Any]] | None = None,
    settings: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    changed: float | None = None,
) -> dict[str, Any]:
    """A filled result dict in the bench.results schema."""
    res = empty_result(run_id, kind, method, label, engine, seed)
    res["status"] = status
    res["error"] = error
    # A worker always stamps these; without them an ok result is malformed and the report shows it as failed.
    res["started_at"], res["finished_at"] = "2025-01-01T00:00:00+00:00", "2025-01-01T00:02:00+00:00"
    res["accuracy"] = {
        "n_questions": total,
        "before": {"strict": _score(before, total), "flexible": _score(before + 2, total)},
        "after": None if status == "failed" else {"strict": _score(after, total), "flexible": _score(after + 3, total)},
    }
    peak = None if peak_mib is None else int(peak_mib * MIB)
    res["memory"] = {
        "peak_bytes": peak,
        "source": source,
        "baseline_bytes": int(200 * MIB),
        "phases": {
            "generation": {"peak_bytes": peak, "source": source},
            "update": {"peak_bytes": None if peak is None else peak - int(50 * MIB), "source": source},
        },
        "networks": {
            n: {"params": 1000, "trainable_params": 1000 if n in ("actor", "critic") else 0,
                "weight_bytes": 40 * MIB, "grad_bytes": 40 * MIB if n in ("actor", "critic") else 0,
                "optimizer_bytes": 80 * MIB if n in ("actor", "critic") else 0}
            for n in networks
        },
    }
    if status == "ok":
        res["throughput"] = {
            "wall_s": 120.5, "train_s": 100.0, "steps": 10, "completions": 80, "generated_tokens": 4000,
            "trained_tokens": None, "completions_per_s": 0.8, "tokens_per_s": 40.0, "trained_tokens_per_s": None,
            "step_s_median": 9.5, "step_s_p90": 11.0,
        }
        res["phases"] = {"generation": {"time_s": 60.0, "count": 10}, "reward": {"time_s": 5.0, "count": 10},
                         "update": {"time_s": 30.0, "count": 10}}
        res["curves"] = [{"step": s, "reward": 0.1 * s, "kl": 0.01 * s, "loss": 1.0 / (s + 1)} for s in range(1, 11)]
    res["samples"] = samples or [{"question": "What is 2+2?", "completion": "<think>2+2</think> 4", "gold": "4",
                                  "correct": True}]
    if changed is not None:
        res["training_change"] = {"params_changed_fraction": changed, "update_to_weight_ratio": 1e-4,
                                  "trainable_params": 1000, "method": "exact"}
    res["settings"] = settings if settings is not None else {"learning_rate": 1e-5, "beta": 0.04}
    res["environment"] = {"python": "3.11", "gpu": None, "torch": "2.5.0"}
    res["spec"] = {"preset": "cpu-tiny"}
    return res


def write_verdicts(run_dir: Path, correct: list[bool]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"index": i, "correct_strict": c, "correct_flexible": c}) for i, c in enumerate(correct)]
    (run_dir / "eval_after.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def make_suite(root: Path) -> Path:
    """A suite folder with stages, ok / failed / not-run / corrupt methods and a hostile completion."""
    suite = root / "suite"
    runs = ["warm_start-s0", "sample_pool-s0", "reward_model-s0",
            "grpo-s0", "ppo-s0", "dpo-s0", "grpo_engine-s0", "ppo_verifier-s0"]
    write_json_atomic(suite / "suite.json", {
        "preset": "cpu-tiny", "description": "fabricated suite for tests", "created_at": "2025-01-01T00:00:00Z",
        "runs": runs, "spec": {"preset": "cpu-tiny", "train": {"steps": 10}},
    })
    r = suite / "runs"
    stage = make_result("warm_start-s0", "warm_start", "Warm start (SFT)", kind="stage")
    stage["metrics"] = {"train_loss": 0.9}
    write_json_atomic(r / "warm_start-s0" / "result.json", stage)
    pool = make_result("sample_pool-s0", "sample_pool", "Sample pool", kind="stage")
    pool["metrics"] = {"completions": 640, "correct_share": 0.31, "dpo_pairs": 120}
    write_json_atomic(r / "sample_pool-s0" / "result.json", pool)
    rm = make_result("reward_model-s0", "reward_model", "Reward model", kind="stage")
    rm["metrics"] = {"pair_accuracy": 0.83}
    write_json_atomic(r / "reward_model-s0" / "result.json", rm)

    hostile = [{"question": "Q <b>bold</b>?", "completion": "<script>alert(1)</script> answer 4", "gold": "4",
                "correct": False}]
    write_json_atomic(r / "grpo-s0" / "result.json", make_result(
        "grpo-s0", "grpo", "GRPO (TRL)", after=24, samples=hostile, changed=0.1,
        settings={"learning_rate": 1e-5, "beta": 0.04, "num_generations": 8}))
    write_verdicts(r / "grpo-s0", [True] * 24 + [False] * 16)
    write_json_atomic(r / "ppo-s0" / "result.json", make_result(
        "ppo-s0", "ppo", "PPO (suite engine)", engine="suite", after=18, source="cuda-allocated", peak_mib=900.0,
        changed=0.98,
        networks=("actor", "critic", "reward", "reference"),
        settings={"learning_rate": 1e-5, "beta": 0.04, "vf_coef": 0.1}))
    write_verdicts(r / "ppo-s0", [True] * 18 + [False] * 22)
    write_json_atomic(r / "dpo-s0" / "result.json", make_result(
        "dpo-s0", "dpo", "DPO (TRL)", status="failed", peak_mib=None,
        error={"type": "OutOfMemoryError", "message": "CUDA out of memory", "memory_at_failure": "74.2 GiB"}))
    # grpo_engine-s0 is listed but has no folder at all: not run yet.
    (r / "ppo_verifier-s0").mkdir(parents=True)
    (r / "ppo_verifier-s0" / "result.json").write_text('{"schema_version": 1, "status": "ok", ', encoding="utf-8")
    return suite


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    suite = make_suite(tmp_path_factory.mktemp("report"))
    index = build_report(suite)
    assert index == suite / "index.html"
    return suite


def _csv(suite: Path) -> list[dict[str, str]]:
    with open(suite / "results.csv", newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_outputs_exist(built: Path) -> None:
    for name in ("index.html", "summary.md", "results.csv"):
        assert (built / name).is_file() and (built / name).stat().st_size > 0
    assert list((built / "figures").glob("*.png"))


def test_csv_columns_and_order(built: Path) -> None:
    with open(built / "results.csv", newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle))
    assert header[: len(REQUIRED_FIRST)] == REQUIRED_FIRST
    assert header == CSV_COLUMNS
    for extra in ("label", "engine", "train_s", "step_s_median", "error", "accuracy_after_flexible"):
        assert extra in header


def test_csv_rows_values(built: Path) -> None:
    rows = {r["run_id"]: r for r in _csv(built)}
    # Only method runs, in suite.json order, stages excluded; every planned method has a row.
    assert [r["run_id"] for r in _csv(built)] == ["grpo-s0", "ppo-s0", "dpo-s0", "grpo_engine-s0", "ppo_verifier-s0"]
    grpo = rows["grpo-s0"]
    assert grpo["status"] == "ok" and grpo["method"] == "grpo" and grpo["seed"] == "0"
    assert float(grpo["accuracy_after"]) == pytest.approx(0.6)
    assert float(grpo["accuracy_before"]) == pytest.approx(0.25)
    assert float(grpo["accuracy_after_low"]) < 0.6 < float(grpo["accuracy_after_high"])
    assert int(grpo["peak_memory_bytes"]) == 500 * MIB and grpo["memory_source"] == "cpu-rss"
    assert float(grpo["completions_per_s"]) == 0.8 and float(grpo["wall_s"]) == 120.5
    assert float(grpo["accuracy_after_flexible"]) == pytest.approx(27 / 40)
    assert grpo["label"] == "GRPO (TRL)" and grpo["engine"] == "trl" and grpo["error"] == ""
    assert grpo["trained_tokens_per_s"] == ""  # null in the result -> empty cell, not 0

    dpo = rows["dpo-s0"]
    assert dpo["status"] == "failed"
    assert "OutOfMemoryError" in dpo["error"] and "CUDA out of memory" in dpo["error"]
    assert dpo["accuracy_after"] == "" and dpo["peak_memory_bytes"] == "" and dpo["memory_source"] == ""
    assert dpo["completions_per_s"] == "" and dpo["wall_s"] == "" and dpo["tokens_per_s"] == ""
    assert float(dpo["accuracy_before"]) == pytest.approx(0.25)  # measured before the failure: kept

    missing = rows["grpo_engine-s0"]
    assert missing["status"] == "not_run" and missing["error"] == "not run yet"
    assert missing["method"] == "grpo_engine" and missing["seed"] == "0"
    assert all(missing[c] == "" for c in REQUIRED_FIRST[3:])
    corrupt = rows["ppo_verifier-s0"]
    assert corrupt["status"] == "not_run" and "unreadable" in corrupt["error"]


def test_params_changed_fraction_column_and_low_change_warning(built: Path) -> None:
    rows = {r["run_id"]: r for r in _csv(built)}
    assert "params_changed_fraction" in CSV_COLUMNS
    assert float(rows["grpo-s0"]["params_changed_fraction"]) == pytest.approx(0.1)
    assert float(rows["ppo-s0"]["params_changed_fraction"]) == pytest.approx(0.98)
    assert rows["dpo-s0"]["params_changed_fraction"] == ""  # failed: not measured, not 0
    warning = "training moved only 10.0% of the trained weights"
    md = (built / "summary.md").read_text(encoding="utf-8")
    page = (built / "index.html").read_text(encoding="utf-8")
    assert f"> **Warning:** GRPO (TRL): {warning}" in md
    assert warning in page and 'class="warning"' in page
    assert "PPO (suite engine): training moved only" not in md + page  # 98% is not flagged
    assert "| 10.0% |" in md and "| 98.0% |" in md  # the headline column


def test_legend_says_which_readings_are_high_water_marks(tmp_path: Path) -> None:
    from bench.report.tables import notes

    suite = tmp_path / "gpu"
    res = make_result("grpo-s0", "grpo", "GRPO (TRL)", source="cuda-reserved")
    res["memory"]["kind"] = "high-water mark"
    write_json_atomic(suite / "runs" / "grpo-s0" / "result.json", res)
    build_report(suite)
    legend = " ".join(notes(load_suite(suite)))
    assert "`cuda-reserved`" in legend and "high-water mark" in legend
    page = (suite / "index.html").read_text(encoding="utf-8")
    assert "Per-phase readings are high-water marks" in page  # the memory figure's caption


def test_html_escapes_model_text_and_shows_everything(built: Path) -> None:
    page = (built / "index.html").read_text(encoding="utf-8")
    assert "<title>Benchmark report: cpu-tiny · " in page  # then what ran (citation.run_title)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert" not in page
    assert "<b>bold</b>" not in page and "&lt;b&gt;bold&lt;/b&gt;" in page
    # Failed run shows type and message; unrun and corrupt runs are rows, not gaps.
    assert "OutOfMemoryError: CUDA out of memory" in page and "74.2 GiB" in page
    assert "not run yet" in page and "result.json unreadable" in page
    # Memory numbers name their source; a null reading is "not measured", never "0".
    assert "500.0 MiB (cpu-rss)" in page and "900.0 MiB (cuda-allocated)" in page
    assert "not measured" in page
    # Stages, what differs, paired tests, environment and spec.
    assert "pair_accuracy" in page and "0.83" in page and "dpo_pairs" in page
    assert "num_generations" in page and "vf_coef" in page
    assert "Paired tests" in page and "McNemar" in page
    assert "Environment" in page and "3.11" in page
    assert "&#34;steps&#34;: 10" in page or '"steps": 10' in page
    # Figures are referenced relatively and exist.
    for src in (s.split('"')[0] for s in page.split('src="')[1:]):
        assert src.startswith("figures/") and (built / src).is_file()


def test_paired_test_values(built: Path) -> None:
    from bench.report.tables import paired_tests

    tests = paired_tests(load_suite(built))
    assert len(tests) == 1  # only grpo and ppo are ok and have verdicts
    t = tests[0]
    # GRPO right on 0..23, PPO on 0..17: GRPO alone right on 6, PPO alone on 0 -> p = 2 / 2**6.
    assert (t["a"], t["b"], t["n"], t["a_only"], t["b_only"]) == ("GRPO (TRL)", "PPO (suite engine)", 40, 6, 0)
    assert t["p_value"] == pytest.approx(2 / 64)
    assert t["diff"] == pytest.approx(0.15)


def test_figures_are_pngs(built: Path) -> None:
    names = {p.name for p in (built / "figures").glob("*.png")}
    assert {"accuracy_suite-strict.png", "accuracy_suite-flexible.png", "throughput.png", "phases.png",
            "curves.png"} <= names  # accuracy figures are named by scoring mode, the headline mode first
    for p in (built / "figures").glob("*.png"):
        assert p.read_bytes()[:8] == PNG_SIGNATURE, p.name


def test_curves_of_several_seeds_draw_mean_band_and_faint_seeds(tmp_path: Path) -> None:
    """GRPO with two ok seeds (one logs a step the other lacks) is drawn as the mean at the shared steps, a min–max
    band and faint seed lines; the caption says what the band is and that nothing is smoothed."""
    from report_fixtures import method_result, write_suite

    from bench.report import figures

    suite_dir = write_suite(tmp_path, methods=("grpo",))
    second = method_result("grpo", seed=1)
    for point in second["curves"]:
        point["reward"] += 0.1  # seed 1 sits 0.1 above seed 0 at every step
    second["curves"].append({"step": 200, "reward": 9.0})  # a step seed 0 never logged: left out of the mean
    write_json_atomic(suite_dir / "runs" / "grpo-s1" / "result.json", second)
    plan = json.loads((suite_dir / "suite.json").read_text())
    plan["runs"].append("grpo-s1")
    write_json_atomic(suite_dir / "suite.json", plan)
    build_report(suite_dir)
    png = suite_dir / "figures" / "curves.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE

    suite = load_suite(suite_dir)
    info = figures.curves_figure(suite, tmp_path)
    assert info is not None and info.name == "curves.png"
    assert "min–max" in info.caption and "no smoothing" in info.caption, info.caption
    assert "standard deviation" not in info.caption  # only 2 seeds: no sd band
    runs = [r for r in suite.methods if r.result.get("method") == "grpo"]
    assert len(runs) == 2
    steps, mean, low, high = figures._seed_band([figures._series(r, "reward") for r in runs])
    assert steps == list(range(1, 101, 5))  # only the steps both seeds logged
    assert mean[0] == pytest.approx(0.402 + 0.05) and (low[0], high[0]) == (pytest.approx(0.402), pytest.approx(0.502))
    # 3 seeds: the band is the mean ± one sample standard deviation.
    _, mean3, low3, high3 = figures._seed_band([[(1.0, 1.0)], [(1.0, 2.0)], [(1.0, 3.0)]])
    assert (mean3, low3, high3) == ([2.0], [1.0], [3.0])


def test_memory_sources_never_share_a_chart(built: Path) -> None:
    from bench.report import figures, load

    names = {p.name for p in (built / "figures").glob("*.png")}
    assert {"memory_cpu-rss.png", "memory_cuda-allocated.png"} <= names
    suite = load.load_suite(built)
    grpo = next(r for r in suite.runs if r.run_id == "grpo-s0")
    ppo = next(r for r in suite.runs if r.run_id == "ppo-s0")
    # Each chart's data holds only readings of its own source, and its axis names that source.
    assert figures._measured(grpo, "cuda-allocated") == {}
    assert figures._measured(ppo, "cpu-rss") == {}
    assert figures._measured(ppo, "cuda-allocated")["whole run"] == 900 * MIB
    fig, axes = figures._new(5, 4)
    figures._draw_measured(axes[0][0], [grpo, ppo], {"grpo-s0": "g", "ppo-s0": "p"}, "cpu-rss")
    assert axes[0][0].get_ylabel() == "peak memory (cpu-rss, MiB)"
    heights = sorted(round(p.get_height()) for p in axes[0][0].patches)
    assert heights == [450, 500, 500]  # grpo's update, generation and whole-run readings; nothing of ppo


def test_summary_markdown(built: Path) -> None:
    md = (built / "summary.md").read_text(encoding="utf-8")
    assert md.startswith("# Benchmark summary: cpu-tiny")
    # The per-run columns name their scoring modes: the folder's headline mode first, then suite-flexible.
    assert ("| method | seed | status | accuracy suite-strict (headline; before → after, 95% CI) | "
            "accuracy suite-flexible (before → after, 95% CI) |") in md
    assert "- Headline mode: suite-strict (the suite's explicit answer" in md
    assert "| GRPO (TRL) | 0 | ok | 25.0% [" in md and "→ 60.0% [" in md
    assert "| DPO (TRL) | 0 | failed |" in md and "OutOfMemoryError" in md
    assert "| PPO (suite engine) |" in md and "(cuda-allocated)" in md
    assert "## What differs between methods" in md and "vf_coef" in md
    assert "## Notes on sources" in md and "`cpu-rss`" in md and "`cuda-allocated`" in md
    # Every table row has the header's cell count (no stray pipes from content).
    table = [ln for ln in md.split("## Results per method")[1].split("\n\n")[1].splitlines()]
    assert len({ln.count(" | ") for ln in table if not ln.startswith("|---")}) == 1


def test_rebuild_removes_stale_figures_and_handles_empty_suite(tmp_path: Path) -> None:
    suite = tmp_path / "empty"
    (suite / "figures").mkdir(parents=True)
    (suite / "figures" / "old.png").write_bytes(PNG_SIGNATURE)
    write_json_atomic(suite / "suite.json", {"preset": "cpu-tiny", "description": "", "runs": ["grpo-s0"], "spec": {}})
    index = build_report(suite)
    assert not (suite / "figures" / "old.png").exists()
    page = index.read_text(encoding="utf-8")
    assert "not run yet" in page
    rows = _csv(suite)
    assert len(rows) == 1 and rows[0]["status"] == "not_run"


def test_missing_suite_json_lists_run_folders(tmp_path: Path) -> None:
    suite = tmp_path / "nosuite"
    write_json_atomic(suite / "runs" / "grpo-s1" / "result.json",
                      make_result("grpo-s1", "grpo", "GRPO (TRL)", seed=1))
    build_report(suite)
    assert [r["run_id"] for r in _csv(suite)] == ["grpo-s1"]
    assert "no suite.json" in (suite / "index.html").read_text(encoding="utf-8")


def test_cli_builds_report(built: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "bench.report", str(built)], cwd=REPO,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("index.html")


def test_report_imports_no_ml_frameworks(built: Path) -> None:
    """A report must rebuild on a laptop: building one loads none of the training stack."""
    code = (
        "import sys; from pathlib import Path; import bench.scoring.stats, bench.report; "
        f"bench.report.build_report(Path({str(built)!r})); "
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_report_sources_have_no_ml_imports() -> None:
    """Static check too: a lazy import inside a function would slip past the runtime check."""
    files = list((REPO / "bench" / "report").glob("*.py")) + [REPO / "bench" / "scoring" / "stats.py"]
    assert len(files) >= 5
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            else:
                continue
            for mod in mods:
                assert mod.split(".")[0] not in FORBIDDEN, f"{path.name} imports {mod}"


def test_underflowed_p_value_prints_as_a_bound_not_zero() -> None:
    from bench.report.fmt import p_value_text

    assert p_value_text(0.0) == "< 1e-300"
    assert p_value_text(0.0581) == "0.0581"
    assert p_value_text(2.35e-57) == "2.35e-57"


# --- precision per network, lengths, generation settings, throughput basis, across seeds ----------------
BF16_POLICY = {
    "actor": {"storage": "float32", "compute": "bfloat16 autocast", "optimizer_state": "float32"},
    "critic": {"storage": "float32", "compute": "bfloat16 autocast", "optimizer_state": "float32"},
    "reward": {"storage": "bfloat16", "compute": "bfloat16", "optimizer_state": None},
    "reference": {"storage": "bfloat16", "compute": "bfloat16", "optimizer_state": None},
}
SAMPLING = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0,
            "min_new_tokens": 0, "max_new_tokens": 16, "num_beams": 1, "pad_token_id": 0, "eos_token_id": [1]}


def _md_rows(md: str, section: str) -> list[list[str]]:
    """The cells of the first table under '## {section}' in summary.md (header row included)."""
    body = md.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in body.splitlines()
            if line.startswith("| ")]


def _detail_suite(root: Path) -> Path:
    """PPO in bf16 with all four networks, GRPO (TRL) without a recorded policy, DPO with lengths, a stage."""
    suite = root / "detail"
    ppo = make_result("ppo-s0", "ppo", "PPO (suite engine)", engine="suite",
                      networks=("actor", "critic", "reward", "reference"),
                      settings={"learning_rate": 1e-5, "precision": BF16_POLICY, "generation": SAMPLING,
                                "optim": {"betas": [0.9, 0.999], "eps": 1e-8}})
    ppo["throughput"].update({"setup_s": 12.25, "recipe_s": 113.0,
                              "timing": "first on_train_begin to last on_train_end"})
    grpo = make_result("grpo-s0", "grpo", "GRPO (TRL)", settings={"learning_rate": 1e-5, "generation": SAMPLING})
    grpo["memory"]["networks"]["actor"]["optimizer_bytes"] = 0
    grpo["memory"]["networks"]["actor"]["optimizer_state_materialized"] = False  # counted before the first step
    dpo = make_result("dpo-s0", "dpo", "DPO (TRL)", settings={"learning_rate": 1e-6, "max_length": 300})
    dpo["metrics"] = {"lengths": {"max_length": 300, "examples": 120, "truncated": 6, "dropped": 0, "longest": 350,
                                  "cap": None, "unit": "pairs"}}
    dpo["throughput"].update({"setup_s": None, "timing": "whole recipe (no on_train_begin fired)"})
    warm = make_result("warm_start", "warm_start", "Warm start (SFT)", kind="stage")
    warm["metrics"] = {"train_loss": 0.5, "lengths": {"max_length": 280, "examples": 400, "truncated": 0,
                                                      "dropped": 0, "longest": 270, "cap": 32768, "unit": "examples"}}
    for res in (warm, grpo, ppo, dpo):
        write_json_atomic(suite / "runs" / res["run_id"] / "result.json", res)
    write_json_atomic(suite / "suite.json", {"preset": "cpu-tiny", "description": "", "spec": {},
                                             "runs": ["warm_start", "grpo-s0", "ppo-s0", "dpo-s0"]})
    build_report(suite)
    return suite


@pytest.fixture(scope="module")
def detail(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _detail_suite(tmp_path_factory.mktemp("detail"))


def test_networks_table_names_each_role_with_its_precision_and_bytes(detail: Path) -> None:
    rows = _md_rows((detail / "summary.md").read_text(encoding="utf-8"), "Networks resident while training")
    assert rows[0][:6] == ["method", "network", "params", "storage dtype", "compute", "optimizer state dtype"]
    assert all("MiB, accounting" in h for h in rows[0][6:])  # every byte column names its unit and source
    ppo = {r[1]: r for r in rows if r[0] == "PPO (suite engine)"}
    assert list(ppo) == ["actor", "critic", "reward", "reference", "all (sum)"]
    # make_result: 40 MiB weights each; trained roles add 40 MiB grads and 80 MiB optimizer state.
    assert ppo["actor"][2:] == ["1,000", "float32", "bfloat16 autocast", "float32", "40.00", "40.00", "80.00", "160.00"]
    assert ppo["reference"][2:] == ["1,000", "bfloat16", "bfloat16", "none (frozen)", "40.00", "0.00", "0.00", "40.00"]
    assert ppo["all (sum)"][6:] == ["160.00", "80.00", "160.00", "400.00"]  # 4x40, 2x40, 2x80; 160+80+160
    grpo = {r[1]: r for r in rows if r[0] == "GRPO (TRL)"}
    assert grpo["actor"][3:6] == ["not recorded"] * 3  # no policy in its settings: said, not guessed
    # An optimizer that had not stepped is not measured, not 0 MiB, and the totals that need it are unknown.
    assert grpo["actor"][8] == "not measured (no optimizer step yet)" and grpo["actor"][9] == "—"
    assert grpo["all (sum)"][8:] == ["—", "—"]
    page = (detail / "index.html").read_text(encoding="utf-8")
    assert "Networks resident while training" in page and "bfloat16 autocast" in page
    assert "not measured (no optimizer step yet)" in page


def test_headline_static_memory_is_labelled_and_unknown_when_a_part_is(detail: Path) -> None:
    rows = {r[0]: r for r in _md_rows((detail / "summary.md").read_text(encoding="utf-8"), "Results per method")}
    column = rows["method"].index("static memory: weights + grads + optimizer (accounting)")
    assert rows["PPO (suite engine)"][column] == "400.00 MiB (accounting; actor, critic, reward, reference)"
    assert rows["GRPO (TRL)"][column] == "not measured"


def test_lengths_table_and_no_nested_dict_printed_as_json(detail: Path) -> None:
    md = (detail / "summary.md").read_text(encoding="utf-8")
    rows = _md_rows(md, "Max lengths and truncation")
    assert rows[0] == ["stage / method", "max_length (tokens)", "examples", "truncated", "dropped",
                       "longest (tokens)", "cap: model context (tokens)"]
    assert rows[1] == ["Warm start (SFT)", "280", "400 examples", "0", "0", "270", "32,768"]
    assert rows[2] == ["DPO (TRL)", "300", "120 pairs", "6 (5.0%)", "0", "350", "—"]  # 6 / 120 = 5%
    assert "> **Warning:** DPO (TRL): 6 truncated of 120 pairs at max_length 300 tokens." in md
    stages = _md_rows(md, "Shared stages")
    assert stages[1][-1] == "train_loss=0.5"  # the lengths dict has its own table, not a JSON cell here
    page = (detail / "index.html").read_text(encoding="utf-8")
    for blob in ('"max_length"', "&#34;max_length&#34;", '"storage"', "&#34;storage&#34;", "&#34;temperature&#34;"):
        assert blob not in page.split('<h3 id="spec">')[0], blob  # only the resolved spec may hold JSON


def test_what_differs_has_no_json_blobs(detail: Path) -> None:
    from bench.report.tables import what_differs

    header, rows = what_differs(load_suite(detail))
    assert header == ["setting", "GRPO (TRL)", "PPO (suite engine)", "DPO (TRL)"]
    keys = [r[0] for r in rows]
    assert "precision" not in keys and "generation" not in keys  # tables of their own
    by_key = {r[0]: r[1:] for r in rows}
    assert by_key["optim.betas"] == ["n/a", "0.9, 0.999", "n/a"] and by_key["optim.eps"] == ["n/a", "1e-08", "n/a"]
    # only PPO records optim.*: nothing to differ with, so those rows come after the real differences
    differing = [k for k in keys if len({c for c in by_key[k] if c != "n/a"}) > 1]
    assert keys[:len(differing)] == differing and keys.index("optim.betas") >= len(differing)
    for row in rows:
        for cell in row:
            assert not cell.startswith(("{", "[")), (row[0], cell)


def test_generation_settings_shown_once_and_flagged_when_methods_differ(detail: Path, tmp_path: Path) -> None:
    md = (detail / "summary.md").read_text(encoding="utf-8")
    rows = _md_rows(md, "Generation settings")
    # Matched: one sampling column for both online methods, then the evaluation (none recorded here).
    assert rows[0] == ["setting", "sampling: GRPO (TRL), PPO (suite engine)"]
    assert ["temperature", "1"] in rows and ["max new tokens", "16"] in rows
    assert "Generation settings differ" not in md
    assert "DPO (TRL): no sampling settings recorded" in md

    suite = tmp_path / "unmatched"
    hot = make_result("grpo-s0", "grpo", "GRPO (TRL)", settings={"generation": {**SAMPLING, "temperature": 0.7}})
    cold = make_result("ppo-s0", "ppo", "PPO", settings={"generation": SAMPLING})
    cold["generation"] = {**SAMPLING, "do_sample": False}  # the evaluation's greedy decoding
    for res in (hot, cold):
        write_json_atomic(suite / "runs" / res["run_id"] / "result.json", res)
    build_report(suite)
    md = (suite / "summary.md").read_text(encoding="utf-8")
    rows = {r[0]: r[1:] for r in _md_rows(md, "Generation settings")}
    assert rows["setting"] == ["sampling: GRPO (TRL)", "sampling: PPO", "evaluation (greedy)"]
    assert rows["temperature"] == ["0.7", "1", "not used (greedy)"]
    assert "> **Warning:** Generation settings differ: GRPO (TRL) vs PPO sampled with different settings" in md
    assert "Generation settings differ" in (suite / "index.html").read_text(encoding="utf-8")


def test_throughput_table_shows_setup_and_the_timing_basis(detail: Path) -> None:
    md = (detail / "summary.md").read_text(encoding="utf-8")
    rows = {r[0]: r for r in _md_rows(md, "Throughput and time")}
    header = rows["run"]
    assert header[1:4] == ["steps", "setup (s)", "train (s)"]
    assert rows["PPO (suite engine)"][2:4] == ["12.25", "100.00"]
    assert rows["DPO (TRL)"][2] == "in train (timed whole)"  # no on_train_begin: set-up is inside train_s
    section = md.split("## Throughput and time", 1)[1].split("\n## ", 1)[0]
    assert "Timing basis of train (s): first on_train_begin to last on_train_end" in section
    assert "Timed differently: DPO (TRL): whole recipe (no on_train_begin fired)." in section
    assert "Timing basis not recorded (a result written before it was): GRPO (TRL), Warm start (SFT)." in section
    csv_rows = {r["run_id"]: r for r in _csv(detail)}
    assert float(csv_rows["ppo-s0"]["setup_s"]) == 12.25 and csv_rows["dpo-s0"]["setup_s"] == ""
    assert csv_rows["ppo-s0"]["timing"] == "first on_train_begin to last on_train_end"


def _seeds_suite(root: Path) -> Path:
    """GRPO with two ok seeds, PPO with two ok seeds on different memory sources plus a failed one, DPO once."""
    suite = root / "seeds"
    runs = [
        make_result("grpo-s0", "grpo", "GRPO", seed=0, after=24, peak_mib=500.0),
        make_result("grpo-s1", "grpo", "GRPO", seed=1, after=20, peak_mib=600.0),
        make_result("ppo-s0", "ppo", "PPO", seed=0, after=18, source="cuda-allocated", peak_mib=900.0),
        make_result("ppo-s1", "ppo", "PPO", seed=1, after=22, peak_mib=800.0),
        make_result("ppo-s2", "ppo", "PPO", seed=2, status="failed", peak_mib=None,
                    error={"type": "RuntimeError", "message": "boom"}),
        make_result("dpo-s0", "dpo", "DPO", seed=0, after=30),
    ]
    runs[1]["throughput"]["step_s_median"] = 10.5  # grpo-s0 keeps make_result's 9.5
    for res in runs:
        write_json_atomic(suite / "runs" / res["run_id"] / "result.json", res)
    build_report(suite)
    return suite


def test_across_seeds_aggregates_by_hand(tmp_path: Path) -> None:
    from bench.report.seeds import seed_stats

    suite = _seeds_suite(tmp_path)
    stats = seed_stats(load_suite(suite)).set_index("label")
    grpo, ppo, dpo = stats.loc["GRPO"], stats.loc["PPO"], stats.loc["DPO"]
    # GRPO: accuracy 24/40 = 0.60 and 20/40 = 0.50 -> mean 0.55, sd sqrt((0.05^2 + 0.05^2) / 1) = 0.0707.
    assert (grpo["seeds"], grpo["seed_list"]) == (2, [0, 1])
    assert grpo["accuracy_after_mean"] == pytest.approx(0.55)
    assert grpo["accuracy_after_sd"] == pytest.approx(0.05 * 2**0.5)
    assert (grpo["accuracy_after_min"], grpo["accuracy_after_max"]) == (pytest.approx(0.5), pytest.approx(0.6))
    # s/step 9.5 and 10.5 -> mean 10.0, sd 0.7071; peak 500 and 600 MiB -> mean 550 MiB, sd 70.71 MiB.
    assert grpo["step_s_median_mean"] == pytest.approx(10.0) and grpo["step_s_median_sd"] == pytest.approx(0.5**0.5)
    assert grpo["peak_memory_bytes_mean"] == pytest.approx(550 * MIB)
    assert grpo["peak_memory_bytes_sd"] == pytest.approx(50 * 2**0.5 * MIB)
    assert grpo["memory_source"] == "cpu-rss"
    # PPO: the failed seed 2 is left out: 18/40 and 22/40 -> mean 0.5. Its two peaks are from different
    # sources (cuda-allocated 900 MiB, cpu-rss 800 MiB), so they are not averaged.
    assert (ppo["seeds"], ppo["seed_list"]) == (2, [0, 1])
    assert ppo["accuracy_after_mean"] == pytest.approx(0.5)
    assert ppo["memory_source"] == "mixed" and pd_isna(ppo["peak_memory_bytes_mean"])
    # DPO: one seed, so no spread (NA, not 0).
    assert dpo["seeds"] == 1 and dpo["accuracy_after_mean"] == pytest.approx(0.75) and pd_isna(dpo["accuracy_after_sd"])

    md = (suite / "summary.md").read_text(encoding="utf-8")
    rows = {r[0]: r[1:] for r in _md_rows(md, "Across seeds")}
    assert rows["GRPO"] == ["2 (seed 0, 1)", "55.0% ± 7.1 pp (50.0%–60.0%)", "10.0 s ± 0.707 s (9.50 s–10.5 s)",
                            "550.0 MiB ± 70.7 MiB (500.0 MiB–600.0 MiB) [cpu-rss]"]
    assert rows["PPO"][0] == "2 (seed 0, 1)" and rows["PPO"][3].startswith("not averaged")
    assert rows["DPO"] == ["1 (seed 0)", "75.0%", "9.50 s", "500.0 MiB [cpu-rss]"]
    assert "Across seeds" in (suite / "index.html").read_text(encoding="utf-8")


def test_across_seeds_only_when_a_method_has_several_ok_seeds(built: Path, detail: Path) -> None:
    for suite in (built, detail):
        assert "Across seeds" not in (suite / "summary.md").read_text(encoding="utf-8")
        assert 'id="seeds"' not in (suite / "index.html").read_text(encoding="utf-8")


def test_results_frame_is_typed_and_matches_the_csv(built: Path) -> None:
    from bench.report import results_frame

    frame = results_frame(load_suite(built))
    assert list(frame.columns) == CSV_COLUMNS and len(frame) == 5
    assert str(frame["seed"].dtype) == "Int64" and str(frame["peak_memory_bytes"].dtype) == "Int64"
    assert str(frame["accuracy_after"].dtype) == "Float64"
    dpo = frame.set_index("run_id").loc["dpo-s0"]
    assert pd_isna(dpo["accuracy_after"]) and pd_isna(dpo["peak_memory_bytes"])  # not measured: NA, never 0
    assert [r["run_id"] for r in _csv(built)] == list(frame["run_id"])


def pd_isna(value: Any) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


def test_accuracy_of_a_run_without_evaluation_reads_not_evaluated() -> None:
    from bench.report.fmt import before_after_text
    from bench.report.load import Run

    run = Run("ppo-s0", {"status": "ok", "spec": {"eval": {"enabled": False}},
                         "accuracy": {"before": None, "after": None}})
    assert before_after_text(run, "strict") == "not evaluated (eval.enabled: false)"


# --- modes, completions files, tests against the start, seeds, Holm, reward model, control, anchors ----
MODES = ("suite-strict", "suite-flexible", "lmeval-strict", "lmeval-flexible")
N_Q = 20
START = set(range(8))  # the warm start is right on questions 0..7 (suite-strict)


def _verdicts(right: set[int]) -> dict[str, list[bool]]:
    """Per-mode verdicts from one set of right questions: flexible also gets question 18, lmeval-strict loses 0."""
    return {"suite-strict": [i in right for i in range(N_Q)],
            "suite-flexible": [i in right or i == 18 for i in range(N_Q)],
            "lmeval-strict": [i in right and i != 0 for i in range(N_Q)],
            "lmeval-flexible": [i in right or i == 18 for i in range(N_Q)]}


def _scores(verdicts: dict[str, list[bool]]) -> dict[str, Any]:
    return {mode: _score(sum(v), len(v)) for mode, v in verdicts.items()}


def write_completions(run_dir: Path, verdicts: dict[str, list[bool]]) -> None:
    """completions.jsonl in the new per-question format (one line per question, verdict per mode)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"index": i, "id": f"q{i:03d}", "prompt": "Q?", "completion": "#### 1", "tokens": 4,
                         "hit_max": False, "gold": "1", "gold_answer": "... #### 1",
                         "extracted": {m: "1" for m in verdicts}, "correct": {m: v[i] for m, v in verdicts.items()}})
             for i in range(N_Q)]
    (run_dir / "completions.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _new_run(suite: Path, run_id: str, method: str, label: str, right: set[int], seed: int = 0,
             kind: str = "method", **kw: Any) -> dict[str, Any]:
    res = make_result(run_id, method, label, kind=kind, seed=seed, **kw)
    res["accuracy"] = {"n_questions": N_Q, "before": _scores(_verdicts(START)), "after": _scores(_verdicts(right)),
                       "format_rate": {"before": 0.9, "after": 0.95}, "truncated_rate": {"before": 0.1, "after": 0.05}}
    res["eval_file"] = "completions.jsonl"
    write_json_atomic(suite / "runs" / run_id / "result.json", res)
    write_completions(suite / "runs" / run_id, _verdicts(right))
    return res


def _stats_suite(root: Path, model: dict[str, Any] | None = None) -> Path:
    """Warm start, reward model (62% of 200 held-out pairs: it learned), GRPO / PPO (reward model) / control over seeds 0, 1."""
    suite = root / "stats"
    model = model or {"source": "hub", "name_or_path": "Qwen/Qwen2.5-0.5B-Instruct"}
    spec = {"preset": "test", "model": model}
    runs = ["warm_start", "reward_model", "grpo-s0", "ppo-s0", "control-s0", "grpo-s1", "ppo-s1", "control-s1"]
    write_json_atomic(suite / "suite.json", {"preset": "test", "description": "", "runs": runs, "spec": spec})
    _new_run(suite, "warm_start", "warm_start", "Warm start (SFT)", START, kind="stage")
    rm = make_result("reward_model", "reward_model", "Reward model", kind="stage")
    rm["metrics"] = {"train_pairs": 800, "heldout_pairs": 200, "heldout_pair_accuracy": 0.62,
                     "heldout_pair_accuracy_untrained": 0.5}
    write_json_atomic(suite / "runs" / "reward_model" / "result.json", rm)
    ppo_settings = {"learning_rate": 1e-5, "reward_source": "model"}
    _new_run(suite, "grpo-s0", "grpo", "GRPO", set(range(14)))
    _new_run(suite, "ppo-s0", "ppo", "PPO (reward model)", set(range(6)) | {8, 9}, settings=ppo_settings)
    _new_run(suite, "control-s0", "control", "Control (lr 0)", START)
    _new_run(suite, "grpo-s1", "grpo", "GRPO", set(range(12)), seed=1)
    _new_run(suite, "ppo-s1", "ppo", "PPO (reward model)", set(range(10)), seed=1, settings=ppo_settings)
    _new_run(suite, "control-s1", "control", "Control (lr 0)", START | {19}, seed=1)  # one question moved
    for res_seed in (0, 1):
        for method in ("grpo", "ppo", "control"):
            res = json.loads((suite / "runs" / f"{method}-s{res_seed}" / "result.json").read_text())
            res["spec"] = spec
            write_json_atomic(suite / "runs" / f"{method}-s{res_seed}" / "result.json", res)
    return suite


@pytest.fixture(scope="module")
def stats_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    suite = _stats_suite(tmp_path_factory.mktemp("stats"))
    build_report(suite)
    return suite


def test_completions_file_is_read_without_its_text_and_csv_has_every_mode(stats_suite: Path) -> None:
    suite = load_suite(stats_suite)
    grpo = next(r for r in suite.runs if r.run_id == "grpo-s0")
    assert grpo.verdicts is not None and len(grpo.verdicts) == N_Q
    assert "completion" not in grpo.verdicts[0] and "prompt" not in grpo.verdicts[0]  # dropped on reading
    assert suite.headline_mode == "suite-strict"  # no report_settings.json: bench.task.verifier's HEADLINE_MODE
    rows = {r["run_id"]: r for r in _csv(stats_suite)}
    g = rows["grpo-s0"]
    # GRPO s0 is right on 0..13: suite-strict 14/20; flexible adds question 18 (15/20); lmeval-strict drops 0 (13/20).
    assert g["headline_mode"] == "suite-strict" and float(g["accuracy_after"]) == pytest.approx(0.70)
    assert float(g["accuracy_after_suite_strict"]) == pytest.approx(0.70)
    assert float(g["accuracy_after_suite_flexible"]) == pytest.approx(0.75)
    assert float(g["accuracy_after_lmeval_strict"]) == pytest.approx(0.65)
    assert float(g["accuracy_before_lmeval_strict"]) == pytest.approx(0.35)  # start 0..7 without 0: 7/20
    assert float(g["accuracy_after_lmeval_flexible_low"]) < 0.75 < float(g["accuracy_after_lmeval_flexible_high"])
    assert float(g["format_rate_after"]) == 0.95 and float(g["truncated_rate_before"]) == 0.1


def test_headline_mode_comes_from_report_settings(tmp_path: Path) -> None:
    suite = _stats_suite(tmp_path)
    (suite / "report_settings.json").write_text(json.dumps({"headline_mode": "lmeval-strict"}), encoding="utf-8")
    loaded = load_suite(suite)
    assert loaded.headline_mode == "lmeval-strict"
    from bench.report.load import results_frame
    from bench.report.tables import paired_tests_table

    frame = results_frame(loaded).set_index("run_id")
    assert frame.loc["grpo-s0", "accuracy_after"] == pytest.approx(0.65)  # the lmeval-strict score
    assert frame.loc["grpo-s0", "headline_mode"] == "lmeval-strict"
    assert "lmeval-strict" in paired_tests_table(loaded).notes[0]  # each table says which mode it uses
    (suite / "report_settings.json").write_text(json.dumps({"headline_mode": "exact"}), encoding="utf-8")
    loaded = load_suite(suite)
    assert loaded.headline_mode == "suite-strict" and any("headline_mode 'exact'" in p for p in loaded.problems)


def test_between_method_mcnemar_with_holm_by_hand(stats_suite: Path) -> None:
    from bench.report.tables import paired_tests, paired_tests_table

    tests = paired_tests(load_suite(stats_suite))
    # Seed 0: GRPO 0..13, PPO 0..5+8,9; seed 1: GRPO 0..11, PPO 0..9. The control arm is left out: it is its start,
    # so GRPO against it is GRPO against the start (that family's test, not this one's).
    # GRPO-PPO s0: 6 vs 0 -> 2/2^6 = 0.03125; GRPO-PPO s1: 2 vs 0 -> 2/4 = 0.5.
    got = [(t["seed"], t["a"].split(" s")[0], t["b"].split(" s")[0], t["a_only"], t["b_only"]) for t in tests]
    assert got == [(0, "GRPO", "PPO (reward model)", 6, 0), (1, "GRPO", "PPO (reward model)", 2, 0)]
    assert [t["p_value"] for t in tests] == pytest.approx([0.03125, 0.5])
    # Holm over the family of 2: 0.03125 x 2 = 0.0625; 0.5 x 1 = 0.5.
    assert [t["p_holm"] for t in tests] == pytest.approx([0.0625, 0.5])
    table = paired_tests_table(load_suite(stats_suite))
    assert "Holm-adjusted p" in table.header and table.rows[0][7] == "0.0625"
    assert any("family of all 2 between-method" in n for n in table.notes)
    assert any('Holm family "between methods, same questions, per seed": 2 tests' in n for n in table.notes)


def test_every_method_against_its_start_by_hand(stats_suite: Path) -> None:
    from bench.report.tables import start_tests, start_tests_table

    tests = {t["run_id"]: t for t in start_tests(load_suite(stats_suite))}
    # Start right on 0..7. GRPO s0 (0..13): gained 6, lost 0 -> p = 2/64 = 0.03125. PPO s0 (0..5, 8, 9): gained 2,
    # lost 2 -> 1. GRPO s1 (0..11): gained 4 -> 2/16 = 0.125. PPO s1 (0..9): gained 2 -> 0.5. The control arm is
    # not in this family: its check is the control table's (after equals before exactly).
    assert {k: (t["gained"], t["lost"]) for k, t in tests.items()} == {
        "grpo-s0": (6, 0), "ppo-s0": (2, 2), "grpo-s1": (4, 0), "ppo-s1": (2, 0)}
    assert {k: t["p_value"] for k, t in tests.items()} == pytest.approx(
        {"grpo-s0": 0.03125, "ppo-s0": 1.0, "grpo-s1": 0.125, "ppo-s1": 0.5})
    # Holm over these 4: 0.03125 x 4 = 0.125; 0.125 x 3 = 0.375; 0.5 x 2 = 1; 1.
    assert tests["grpo-s0"]["p_holm"] == pytest.approx(0.125) and tests["grpo-s1"]["p_holm"] == pytest.approx(0.375)
    assert tests["ppo-s1"]["p_holm"] == 1.0
    assert tests["grpo-s0"]["before"] == pytest.approx(0.4) and tests["grpo-s0"]["after"] == pytest.approx(0.7)
    assert tests["grpo-s0"]["diff"] == pytest.approx(0.3)
    row = start_tests_table(load_suite(stats_suite)).rows[0]
    assert row[:7] == ["GRPO s0", "0", "20", "40.0%", "70.0%", "6", "0"]


def test_seed_level_t_tests_by_hand(stats_suite: Path) -> None:
    from bench.report.seeds import per_seed_table, seed_tests, seed_tests_table

    tests = {(t["a"], t["b"]): t for t in seed_tests(load_suite(stats_suite))}
    # Accuracies after: GRPO 0.70, 0.60; PPO 0.40, 0.50; control 0.40, 0.45.
    # GRPO - PPO: d = [0.30, 0.10], mean 0.20, sd 0.1414, se 0.1, t = 2, df 1 (Cauchy): p = 1 - 2 atan(2)/pi = 0.295167.
    g_p = tests[("GRPO", "PPO (reward model)")]
    assert g_p["mean_diff"] == pytest.approx(0.20) and g_p["t"] == pytest.approx(2.0)
    assert g_p["p_value"] == pytest.approx(0.295167, abs=1e-6)
    # GRPO - control: d = [0.30, 0.15], mean 0.225, se 0.075, t = 3: p = 1 - 2 atan(3)/pi = 0.204833.
    assert tests[("GRPO", "Control (lr 0)")]["p_value"] == pytest.approx(0.204833, abs=1e-6)
    # PPO - control: d = [0, 0.05], mean 0.025, se 0.025, t = 1: p = 1 - 2 atan(1)/pi = 0.5.
    assert tests[("PPO (reward model)", "Control (lr 0)")]["p_value"] == pytest.approx(0.5)
    # Two families: GRPO - PPO alone between methods (a family of one: Holm = p); against the control arm (the
    # start), 0.204833 x 2 = 0.409666 and 0.5 x 1 -> 0.5.
    assert [t["p_holm"] for t in tests.values()] == pytest.approx([0.295167, 0.409666, 0.5], abs=1e-5)
    assert [t["family_size"] for t in tests.values()] == [1, 2, 2]
    table = seed_tests_table(load_suite(stats_suite))
    assert table.rows[0][:4] == ["GRPO", "PPO (reward model)", "0, 1", "+20.0 ± 14.1 pp"]
    per_seed = per_seed_table(load_suite(stats_suite))
    assert per_seed.header == ["method", "seed 0", "seed 1", "mean ± sd"]
    # GRPO: 70% and 60% -> mean 65%, sd sqrt(2 x 0.05^2) = 7.1 pp.
    assert per_seed.rows[0] == ["GRPO", "70.0%", "60.0%", "65.0% ± 7.1 pp (n = 2)"]


def _with_reward_model(suite: Path, accuracy: float, untrained: float = 0.5) -> Path:
    rm = json.loads((suite / "runs" / "reward_model" / "result.json").read_text())
    rm["metrics"].update(heldout_pair_accuracy=accuracy, heldout_pair_accuracy_untrained=untrained)
    write_json_atomic(suite / "runs" / "reward_model" / "result.json", rm)
    return suite


def test_a_reward_model_at_chance_is_said_plainly_and_flags_its_arm_everywhere(tmp_path: Path) -> None:
    # 55% [48.1, 61.7] of 200 is not distinguishable from chance, not 'at chance'; the arm trained
    # against it carries the flag in its name in every table, figure and the headline.
    from bench.report.reward_check import reward_model_check
    from bench.report.tables import reward_model_table

    suite = _with_reward_model(_stats_suite(tmp_path), 0.55)
    check = reward_model_check(load_suite(suite).runs)
    # 110 of 200: z^2 = 3.8416, denom = 1.019208, centre = (0.55 + 0.009604) / 1.019208 = 0.549058,
    # half = (1.96 / 1.019208) x sqrt(0.2475/200 + 3.8416/160000) = 1.923062 x 0.0355177 = 0.068303.
    assert (check["n"], check["correct"]) == (200, 110)
    assert check["low"] == pytest.approx(0.549058 - 0.068303, abs=1e-5)
    assert check["high"] == pytest.approx(0.549058 + 0.068303, abs=1e-5)
    assert check["chance_inside"] is True and check["learned"] is False
    table = reward_model_table(load_suite(suite))
    assert table.rows[0][:4] == ["Reward model", "200", "55.0% [48.1, 61.7] (not distinguishable from chance, "
                                 "n = 200)", "50.0%"]
    assert table.rows[0][-1] == "no"
    assert table.warnings == ["The reward model did not learn: it ranks held-out pairs 55.0% [48.1, 61.7] on 200 "
                              "held-out pairs (untrained head: 50.0%) right, not distinguishable from chance "
                              "(n = 200); so the accuracy of every method trained against it, marked 'reward model "
                              "did not learn', measures what an uninformative reward does, not what the method "
                              "can do.", FEW_PAIRS.format(n=200, width=13.7)]
    loaded = load_suite(suite)
    flagged = {r.label for r in loaded.methods if r.result.get("method") == "ppo"}
    assert flagged == {"PPO (reward model) [reward model did not learn]"}
    assert {r.label for r in loaded.methods if r.result.get("method") != "ppo"} == {"GRPO", "Control (lr 0)"}
    build_report(suite)
    md = (suite / "summary.md").read_text(encoding="utf-8")
    assert "PPO (reward model) |" not in md and "| PPO (reward model) [reward model did not learn]" in md
    assert md.count("The reward model did not learn") >= 1
    # The plain sentence opens the section on PPO (reward model)'s reward model, before its numbers.
    section = md[md.index("## Reward model: what PPO (reward model) trains against"):]
    assert section.index("> **Warning:** The reward model did not learn") < section.index("| stage |"), section[:900]
    page = (suite / "index.html").read_text(encoding="utf-8")
    html_section = page[page.index('id="reward_model"'):]
    assert html_section.index("The reward model did not learn") < html_section.index("<table>")
    assert "PPO (reward model) [reward model did not learn]" in (suite / "results.csv").read_text(encoding="utf-8")


def test_a_reward_model_above_chance_but_not_above_its_untrained_head_did_not_learn(tmp_path: Path) -> None:
    from bench.report.tables import reward_model_table

    suite = _with_reward_model(_stats_suite(tmp_path), 0.62, untrained=0.58)  # low 0.551: above 50%, not 58%
    table = reward_model_table(load_suite(suite))
    assert table.rows[0][-1] == "no" and "not better than its untrained head" in table.warnings[0]


def test_a_reward_model_that_learned_has_no_warning_and_no_flag(stats_suite: Path) -> None:
    from bench.report.tables import reward_model_table

    table = reward_model_table(load_suite(stats_suite))  # 124/200: Wilson low = 0.551 > 0.5 and > 0.5 untrained
    assert table.rows[0][2] == "62.0% [55.1, 68.4]" and table.rows[0][-1] == "yes"
    assert table.warnings == [FEW_PAIRS.format(n=200, width=13.3)]  # learned, but on fewer pairs than the suite asks
    assert {r.label for r in load_suite(stats_suite).methods} == {"GRPO", "PPO (reward model)", "Control (lr 0)"}


def test_four_hundred_held_out_pairs_need_no_warning(tmp_path: Path) -> None:
    from bench.report.tables import reward_model_table

    suite = _with_reward_model(_stats_suite(tmp_path), 0.62)
    rm = json.loads((suite / "runs" / "reward_model" / "result.json").read_text())
    for n, warned in ((399, True), (400, False)):
        rm["metrics"]["heldout_pairs"] = n
        write_json_atomic(suite / "runs" / "reward_model" / "result.json", rm)
        table = reward_model_table(load_suite(suite))
        assert table.rows[0][1] == f"{n}" and table.rows[0][-1] == "yes"
        assert bool(table.warnings) is warned and all(f"Only {n} held-out pairs" in w for w in table.warnings)


FEW_PAIRS = ("Only {n} held-out pairs: the interval is {width} points wide, too few to tell a reward model that learned "
             "a little from one that learned nothing (the suite aims at 400 or more: raise sample_pool.prompts or "
             "reward_model.eval_fraction).")


def test_control_arm_check(stats_suite: Path) -> None:
    from bench.report.tables import control_table

    table = control_table(load_suite(stats_suite))
    rows = {r[0]: r for r in table.rows}
    assert rows["Control (lr 0) s0"][2] == "yes (0 differing questions)"
    assert rows["Control (lr 0) s1"][2] == "no (1 differing questions)"  # question 19 moved at learning rate 0
    assert len(table.warnings) == 1 and table.warnings[0].startswith("Pipeline problem: Control (lr 0) s1")


def test_anchors_shown_only_for_the_matching_pretrained_model(stats_suite: Path, tmp_path: Path) -> None:
    from bench.report.anchors import anchor_table, load_anchors

    shipped = load_anchors()
    assert sorted(a["value"] for a in shipped if a["model"] == "Qwen/Qwen2.5-0.5B-Instruct") == [49.6, 54.3, 56.7]
    table = anchor_table(load_suite(stats_suite))
    rows = {r[0]: r for r in table.rows}
    assert set(rows) == {"49.6% (external)", "56.7% (external)", "54.3% (external)"}
    # PPO after: 0.40 and 0.50 -> mean 45.0%; GRPO: 0.70, 0.60 -> 65.0%; the start: 8/20 = 40.0%.
    # verl's GSM8K PPO trains on a rule reward: it sits beside PPO (verifier reward), which this suite did not
    # run, never beside PPO with the learned reward model.
    assert rows["56.7% (external)"][2] == "not measured"
    assert "PPO (reward model)" not in rows["56.7% (external)"][2]
    assert rows["54.3% (external)"][2] == "65.0% (GRPO after, suite-strict, mean of 2 seed(s))"
    # The budget column says what this run did, from its spec: the LoRA anchor never claims "full fine-tuning
    # here" for a run that used LoRA.
    assert rows["54.3% (external)"][6].endswith("; this run: full fine-tuning")  # its spec records no more
    assert rows["49.6% (external)"][2].startswith("40.0% [")
    assert "verl" in rows["56.7% (external)"][7] and rows["56.7% (external)"][8] == "yes"
    assert rows["49.6% (external)"][8].startswith("unverified")
    md = (stats_suite / "summary.md").read_text(encoding="utf-8")
    assert "| 56.7% (external) |" in md  # summary.md places every detail table
    # Random weights of the same shape, a local copy under another name, and the tiny model: no anchors.
    for model in ({"source": "architecture", "architecture": "qwen2.5-0.5b"},
                  {"source": "path", "name_or_path": "/models/other-model"}, {"source": "tiny"}):
        assert not anchor_table(load_suite(_stats_suite(tmp_path / model["source"], model)))
    local = load_suite(_stats_suite(tmp_path / "local", {"source": "path",
                                                          "name_or_path": "/models/qwen2.5-0.5b-instruct/"}))
    assert len(anchor_table(local).rows) == 3


def test_anchor_budget_follows_the_preset_that_ran() -> None:
    from types import SimpleNamespace

    from bench.report.anchors import load_anchors, run_budget

    lora = SimpleNamespace(spec={"train": {"steps": 500, "prompts_per_step": 16, "group_size": 8,
                                           "lora": {"enabled": True, "r": 32}}, "generation": {"max_new_tokens": 256}})
    assert run_budget(lora) == "this run: LoRA rank 32, 500 steps of 16 prompts x G 8, up to 256 new tokens"
    assert run_budget(SimpleNamespace(spec={"train": {"lora": {"enabled": False}}})).startswith(
        "this run: full fine-tuning")
    assert not any("full fine-tuning here" in a["budget"] for a in load_anchors())  # the file states no run's budget
    assert {a["value"]: a["beside"] for a in load_anchors()}[56.7] == "ppo_verifier"


def test_a_malformed_anchor_is_refused(tmp_path: Path) -> None:
    from bench.report.anchors import load_anchors

    path = tmp_path / "anchors.yaml"
    path.write_text("anchors:\n  - model: m\n    value: 50\n", encoding="utf-8")
    with pytest.raises(ValueError, match="anchor 1 lacks what"):
        load_anchors(path)


def test_a_malformed_ok_result_renders_as_failed(tmp_path: Path) -> None:
    """An ok result that fails the schema check (the one --resume uses) is not a finished run."""
    suite = tmp_path / "bad"
    good = make_result("grpo-s0", "grpo", "GRPO")
    bad = make_result("ppo-s0", "ppo", "PPO")
    bad["accuracy"]["after"] = []  # not a dict: what a truncated or hand-edited file looks like
    skeleton = empty_result("dpo-s0", "method", "dpo", "DPO", "trl", 0)
    skeleton["status"] = "ok"  # a run that never ran, marked ok
    for res in (good, bad, skeleton):
        write_json_atomic(suite / "runs" / res["run_id"] / "result.json", res)
    build_report(suite)
    rows = {r["run_id"]: r for r in _csv(suite)}
    assert rows["grpo-s0"]["status"] == "ok"
    assert rows["ppo-s0"]["status"] == "failed" and "accuracy.after" in rows["ppo-s0"]["error"]
    assert rows["dpo-s0"]["status"] == "failed" and "malformed" in rows["dpo-s0"]["error"]
    page = (suite / "index.html").read_text(encoding="utf-8")
    assert "result.json says ok but is malformed" in page


def test_old_and_new_mode_keys_read_alike() -> None:
    """Results and verdict lines written before the modes were renamed read under the new names, and back."""
    from bench.report import fmt
    from bench.report.load import Run

    old = Run("a", {"accuracy": {"after": {"strict": _score(3, 4), "flexible": _score(4, 4)}}})
    new = Run("b", {"accuracy": {"after": {"suite-strict": _score(3, 4), "lmeval-strict": _score(2, 4)}}})
    assert fmt.score(old, "after", "suite-strict")["accuracy"] == 0.75 == fmt.score(new, "after", "strict")["accuracy"]
    assert fmt.score(old, "after", "suite-flexible")["accuracy"] == 1.0
    assert fmt.score(old, "after", "lmeval-strict") is None  # never recorded: not guessed from another mode
    assert fmt.verdict({"index": 0, "correct_strict": True, "correct_flexible": False}, "suite-strict") is True
    assert fmt.verdict({"index": 0, "correct_strict": True, "correct_flexible": False}, "suite-flexible") is False
    assert fmt.verdict({"index": 0, "correct": {"lmeval-strict": False}}, "lmeval-strict") is False
    assert fmt.verdict({"index": 0, "correct": {"suite-strict": True}}, "strict") is True
    assert fmt.verdict({"index": 0}, "lmeval-flexible") is None


def test_lora_reference_shared_with_the_actor_is_not_a_second_copy() -> None:
    """memory.networks.reference.shared_with = ['actor']: the row says so, with 0 B of its own weights."""
    from bench.report import networks
    from bench.report.load import Run, Suite

    nets = {"actor": {"params": 1000, "trainable_params": 40, "weight_bytes": 4000, "grad_bytes": 160,
                      "optimizer_bytes": 320},
            "reference": {"params": 0, "trainable_params": 0, "weight_bytes": 0, "grad_bytes": 0,
                          "optimizer_bytes": 0, "shared_params": 960, "shared_with": ["actor"]}}
    run = Run("grpo_engine-s0", {"kind": "method", "method": "grpo_engine", "label": "GRPO (suite engine)",
                                 "status": "ok", "memory": {"networks": nets}})
    table = networks.network_table(Suite(Path("."), "", "", None, {}, runs=[run]))
    ref = next(row for row in table.rows if row[1].startswith("reference"))
    assert ref[1] == "reference: shared with actor (0 B own weights)"
    assert ref[2] == "0 (+960 shared with actor, counted there)" and ref[6] == "0.00"
    assert any("shared with actor" in n and "adapters disabled" in n for n in table.notes)
    assert networks.static_total_text(run).endswith("(accounting; actor, reference shared with actor)")
    # Without shared_with (full fine-tuning) the reference is its own copy: the plain role name.
    nets["reference"] = {"params": 1000, "weight_bytes": 4000, "grad_bytes": 0, "optimizer_bytes": 0}
    table = networks.network_table(Suite(Path("."), "", "", None, {}, runs=[run]))
    assert [row[1] for row in table.rows] == ["actor", "reference", "all (sum)"]
