"""The GPU check: scripts/gpu_check.sh, the systems-qwen0.5b preset, gold preference pairs, eval.enabled, and the
table module (bench.gpu_check_table).

The script is rehearsed on this CPU at a tiny scale of the same architecture (one layer, widths / 16, the real
151,936-entry vocabulary, 4 fixed-length new tokens), so it cannot rot between GPU sessions: one run (about two
minutes on 2 cores) is shared by the tests that read its output.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from bench.errors import SpecError
from bench.gpu_check_table import main as table_main
from bench.results import empty_result, write_json_atomic
from bench.sample_pool import GOLD_PAIRS, VERIFIER_PAIRS, pool_entry, preference_pairs
from bench.spec import load_spec
from bench.tasks import format_target

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
PRESET = "systems-qwen0.5b"
MAX_NEW_TOKENS = 4
TINY = ["device=cpu", "model.scale.num_layers=1", "model.scale.width_divisor=16",
        f"generation.max_new_tokens={MAX_NEW_TOKENS}", f"generation.min_new_tokens={MAX_NEW_TOKENS}",
        "train.prompts_per_step=2", "train.group_size=2", "train.micro_batch_size=2", "train.steps=2",
        "sample_pool.prompts=4", "sample_pool.batch_size=4", "reward_model.batch_size=2", "eval.batch_size=4"]
"""The preset at a CPU rehearsal's scale; model.scale.vocab_size stays null: the real vocabulary."""
STAGES = ["warm_start", "sample_pool", "reward_model"]
ONLINE = ["grpo-s0", "grpo_engine-s0", "ppo-s0", "ppo_verifier-s0"]
METHODS = [*ONLINE, "dpo-s0"]


def run_script(*args: str, env_extra: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    """scripts/gpu_check.sh ARGS with this test's interpreter and extra environment."""
    env = {**os.environ, "GPU_CHECK_PYTHON": sys.executable, **env_extra}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=ROOT)


# --- the whole script, rehearsed on the CPU ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """(the finished process, the suite folder, the $OUT folder) of one tiny run of the script."""
    root = tmp_path_factory.mktemp("gpu-check")
    suite, out = root / "suite", root / "out"
    proc = run_script(*TINY, env_extra={"BENCH_CACHE_DIR": str(root / "cache"), "OUT": str(out),
                                        "GPU_CHECK_SUITE_DIR": str(suite), "GPU_CHECK_TIMEOUT": "600"})
    return proc, suite, out


def result(suite: Path, run_id: str) -> dict:
    return json.loads((suite / "runs" / run_id / "result.json").read_text())


def test_script_exits_0_and_every_run_is_ok(rehearsal: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    proc, suite, _ = rehearsal
    assert proc.returncode == 0, proc.stderr[-3000:]
    for run_id in STAGES + METHODS:
        assert result(suite, run_id)["status"] == "ok", (run_id, result(suite, run_id).get("error"))


def test_generation_is_fixed_length(rehearsal: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    """min_new_tokens = max_new_tokens: every completion of every online method (and of the pool) is exactly
    max_new_tokens long, so the methods generate the same tokens."""
    _, suite, _ = rehearsal
    for run_id in ONLINE + ["sample_pool"]:
        throughput = result(suite, run_id)["throughput"]
        assert throughput["completions"] > 0, run_id
        assert throughput["generated_tokens"] == throughput["completions"] * MAX_NEW_TOKENS, (run_id, throughput)


def test_nothing_is_evaluated(rehearsal: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    _, suite, _ = rehearsal
    for run_id in STAGES + METHODS:
        res = result(suite, run_id)
        assert res["accuracy"]["before"] is None and res["accuracy"]["after"] is None, run_id
        assert res["eval_file"] is None and res["samples"] == [], run_id
        if run_id != "reward_model":  # its evaluation phase is the held-out pair accuracy, not a GSM8K evaluation
            assert "evaluation" not in res["phases"], run_id
        assert not (suite / "runs" / run_id / "completions.jsonl").exists(), run_id
    with open(suite / "results.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["run_id"] for r in rows] == METHODS
    assert all(r["accuracy_before"] == "" and r["accuracy_after"] == "" for r in rows)


def test_dpo_and_the_reward_model_train_on_gold_pairs(rehearsal: tuple[subprocess.CompletedProcess, Path,
                                                                        Path]) -> None:
    """A random model answers nothing, so every pool prompt gives a (gold, sampled) pair."""
    _, suite, _ = rehearsal
    pool = result(suite, "sample_pool")
    assert pool["settings"]["pairs"] == GOLD_PAIRS
    assert pool["metrics"]["pool_accuracy"] == 0.0 and pool["metrics"]["pairs"] == 4
    assert result(suite, "dpo-s0")["settings"]["pairs_available"] == 4
    assert result(suite, "reward_model")["metrics"]["train_pairs"] + \
        result(suite, "reward_model")["metrics"]["heldout_pairs"] == 4


def test_table_names_cpu_rss_and_no_cuda_numbers(rehearsal: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    proc, _, _ = rehearsal
    table = proc.stdout[proc.stdout.index("GPU check table"):]
    header = next(line for line in table.splitlines() if line.startswith("run "))
    assert "peak cpu-rss GiB" in header and "s/step (median)" in header and "completions/s" in header
    assert "cuda" not in header and "nvml" not in header
    for run_id in STAGES + METHODS:
        assert any(line.startswith(f"{run_id} ") and " ok " in line for line in table.splitlines()), run_id
    assert "static accounting" in table
    assert any(line.split()[:2] == ["ppo-s0", "critic"] for line in table.splitlines())


def test_small_files_come_back_under_out(rehearsal: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    proc, suite, out = rehearsal
    folder = out / "gpu-check"
    assert sorted(p.name for p in folder.iterdir()) == ["results.csv", "results.json", "run.log", "summary.md",
                                                         "table.txt"]  # no nvidia-smi.txt without nvidia-smi
    gathered = json.loads((folder / "results.json").read_text())
    assert sorted(gathered) == sorted(STAGES + METHODS)
    assert (folder / "table.txt").read_text().strip() in proc.stdout


# --- the script's arguments (no run) ---------------------------------------------------------------------------
def test_dry_run_prints_the_plan_with_the_overrides(tmp_path: Path) -> None:
    proc = run_script("--dry-run", "train.steps=2", env_extra={"GPU_CHECK_SUITE_DIR": str(tmp_path / "s")},
                      timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "matched budget: 2 steps x 16 prompts x G=8 = 128 completions/step, 512 new tokens" in proc.stdout
    assert f"--preset {PRESET} --out {tmp_path / 's'} train.steps=2" in proc.stderr
    assert not (tmp_path / "s").exists()


def test_the_guard_stops_the_suite_with_status_124(tmp_path: Path) -> None:
    proc = run_script("device=cpu", env_extra={"GPU_CHECK_SUITE_DIR": str(tmp_path / "s"), "GPU_CHECK_TIMEOUT": "1",
                                               "BENCH_CACHE_DIR": str(tmp_path / "cache")}, timeout=300)
    assert proc.returncode == 124, proc.stderr[-2000:]
    assert "the 1 s guard stopped the suite" in proc.stderr


@pytest.mark.parametrize("args, env, message", [
    (["steps"], {}, "unknown argument 'steps'"),
    (["--fetch-wheels"], {}, "--fetch-wheels needs a folder"),
    ([], {"GPU_CHECK_TIMEOUT": "soon"}, "GPU_CHECK_TIMEOUT must be a positive number"),
])
def test_bad_arguments_exit_2_with_one_line(args: list[str], env: dict[str, str], message: str) -> None:
    proc = run_script(*args, env_extra=env, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# --- the preset and the spec keys ------------------------------------------------------------------------------
def test_preset_has_the_gpu_presets_shapes_and_systems_settings() -> None:
    spec, gpu = load_spec(PRESET), load_spec("gsm8k-qwen0.5b")
    assert (spec.model.source, spec.model.architecture, spec.model.dtype) == ("architecture", "qwen2.5-0.5b",
                                                                              "bfloat16")
    assert spec.model.scale.num_layers is None and spec.model.scale.width_divisor == 1  # the full model
    for key in ("prompts_per_step", "group_size", "micro_batch_size", "gradient_checkpointing"):
        assert getattr(spec.train, key) == getattr(gpu.train, key), key
    assert spec.generation.max_new_tokens == spec.generation.min_new_tokens == gpu.generation.max_new_tokens
    assert (spec.train.steps, spec.telemetry.warmup_steps) == (3, 1)
    assert spec.eval.enabled is False and spec.sample_pool.pairs == GOLD_PAIRS
    assert spec.warm_start.enabled is False and spec.model.use_chat_template is False
    assert spec.enabled_methods() == [m for m in gpu.enabled_methods() if m != "control"]  # lr 0: no systems cost


def test_spec_defaults_and_bad_values() -> None:
    spec = load_spec("cpu-quick")
    assert spec.eval.enabled is True and spec.sample_pool.pairs == VERIFIER_PAIRS
    with pytest.raises(SpecError, match="sample_pool.pairs"):
        load_spec("cpu-quick", ["sample_pool.pairs=golden"])
    with pytest.raises(SpecError, match="eval.enabled"):
        load_spec("cpu-quick", ["eval.enabled=maybe"])


# --- gold pairs -------------------------------------------------------------------------------------------------
ROW = {"prompt": "Question: Sam has 39 pens. He finds 23 more. How many pens does Sam have now?\n",
       "answer": "62", "question": "Sam has 39 pens. He finds 23 more. How many pens does Sam have now?",
       "solution": "39+23=<<39+23=62>>62\n#### 62"}


def test_gold_pairs_put_the_worked_solution_against_a_wrong_sample() -> None:
    entry = pool_entry(ROW, ["62 maybe", "no idea", "7"], [True, False, False], GOLD_PAIRS)
    assert json.loads(json.dumps(entry)) == entry  # one pool line
    assert preference_pairs([entry]) == [{"prompt": ROW["prompt"],
                                          "chosen": "<think>39+23=62</think> <answer>62</answer>",
                                          "rejected": "no idea"}]
    assert entry["gold_completion"] == format_target(ROW["solution"])


def test_gold_pairs_need_no_correct_sample_but_a_wrong_one() -> None:
    all_wrong = pool_entry(ROW, ["", "x"], [False, False], GOLD_PAIRS)
    all_right = pool_entry(ROW, ["62", "62"], [True, True], GOLD_PAIRS)
    assert [p["rejected"] for p in preference_pairs([all_wrong, all_right])] == [""]


def test_verifier_pairs_are_unchanged() -> None:
    mixed = pool_entry(ROW, ["no", "62", "7"], [False, True, False], VERIFIER_PAIRS)
    all_wrong = pool_entry(ROW, ["no", "7"], [False, False], VERIFIER_PAIRS)
    assert "gold_completion" not in mixed
    assert preference_pairs([mixed, all_wrong]) == [{"prompt": ROW["prompt"], "chosen": "62", "rejected": "no"}]
    legacy = {k: v for k, v in mixed.items() if k != "pairs"}  # pool files written before the mode was recorded
    assert preference_pairs([legacy]) == preference_pairs([mixed])


# --- the table module on written results -----------------------------------------------------------------------
def _write_run(suite: Path, run_id: str, kind: str, status: str, by_source: dict[str, int]) -> None:
    res = empty_result(run_id, kind, run_id.split("-")[0], run_id, "suite", 0)
    res.update(status=status, started_at="2026-11-30T12:00:00+00:00", finished_at="2026-11-30T12:01:00+00:00")
    res["memory"] = {"peak_bytes": by_source.get("cuda-allocated"), "source": "cuda-allocated",
                     "by_source": by_source, "phases": {
                         "generation": {"peak_bytes": 2 * 2**30, "source": "cuda-allocated"},
                         "update": {"peak_bytes": 3 * 2**30, "source": "cuda-allocated"}},
                     "networks": {"reference": {"params": 10, "weight_bytes": 2**30, "grad_bytes": 0,
                                                "optimizer_bytes": 0},
                                  "actor": {"params": 10, "weight_bytes": 2**30, "grad_bytes": 2**30,
                                            "optimizer_bytes": 2 * 2**30}}}
    res["throughput"] = {"step_s_median": 1.5, "completions_per_s": 85.3, "completions": 384,
                         "generated_tokens": 384 * 512, "wall_s": 300.0}
    if status == "failed":
        res["error"] = {"type": "OutOfMemoryError", "message": "CUDA out of memory"}
    write_json_atomic(suite / "runs" / run_id / "result.json", res)


def test_table_shows_gpu_sources_by_name_and_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    gpu = {"cuda-allocated": 3 * 2**30, "cuda-reserved": 4 * 2**30, "nvml-process": 5 * 2**30,
           "nvml-device": 6 * 2**30}
    _write_run(tmp_path, "grpo-s0", "method", "ok", gpu)
    assert table_main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("run "))
    assert re.split(r"\s{2,}", header)[3:6] == ["peak cuda-allocated GiB", "peak cuda-reserved GiB", "peak nvml-process GiB"]
    assert "cpu-rss" not in header
    row = next(line for line in lines if line.startswith("grpo-s0 "))
    assert row.split()[3:13] == ["3.00", "4.00", "5.00", "3.00", "-", "-", "update", "1.500", "85.30", "512"]
    actor = next(line for line in lines if line.split()[:2] == ["grpo-s0", "actor"])
    assert actor.split()[2:] == ["10", "1.00", "1.00", "2.00", "4.00"]
    networks = [line.split()[1] for line in lines if line.startswith("grpo-s0 ") and len(line.split()) == 7]
    assert networks == ["actor", "reference"]

    _write_run(tmp_path, "ppo-s0", "method", "failed", gpu)
    assert table_main([str(tmp_path)]) == 1
    assert "failed: OutOfMemoryError: CUDA out of memory" in capsys.readouterr().out


def test_table_keeps_a_gpu_source_without_readings_as_dashes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """In a container NVML may see no process: the nvml-process column stays, with dashes, and the note says why."""
    _write_run(tmp_path, "grpo-s0", "method", "ok", {"cuda-allocated": 3 * 2**30, "cuda-reserved": 4 * 2**30})
    assert table_main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("grpo-s0 "))
    assert row.split()[3:6] == ["3.00", "4.00", "-"]
    assert "no run had a nvml-process reading" in out


def test_table_refuses_a_folder_that_is_no_suite(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert table_main([str(tmp_path)]) == 2
    assert "not a suite folder" in capsys.readouterr().err
