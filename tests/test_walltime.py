"""`bench estimate --time` (bench.systems.walltime): a wall-time projection, checked against hand arithmetic on a small
preset; a calibration folder changes exactly the phases it timed; more GPUs never take longer; bad input is one line
with exit 2.

The numbers come from the CLI (``bench.cli.main`` in-process for the JSON, ``tests/bench_cli.run_bench`` where the
user's view matters: exit status, stderr, the table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli import main
from bench.config.loading import load_spec
from bench.results import write_json_atomic
from bench.systems.walltime import (ADAMW_BYTES_PER_PARAMETER, BANDWIDTH_EFFICIENCY, GPUS, MFU, PHASES,
                                    PROMPT_TOKENS, STARTUP, STARTUP_S, VERIFIER_COMPLETIONS_PER_S)
from bench_cli import run_bench
from report_fixtures import method_result

SMALL = ("cpu-quick", "train.steps=3", "train.prompts_per_step=2", "train.group_size=4",
         "generation.max_new_tokens=16", "eval.max_new_tokens=16")
"""A small preset: cpu-quick's tiny model (hidden 64, 1 layer, 2 heads = 2 KV heads, MLP 128, vocabulary 384, tied
embeddings, float32, HF generate), 3 steps of 2 prompts x G 4."""


def projection(capsys, *argv: str) -> dict:
    """`bench estimate --time ... --json`, parsed."""
    code = main(["estimate", "--time", "--json", *argv])
    out = capsys.readouterr().out
    assert code == 0
    return json.loads(out)


def small(capsys, *extra: str) -> dict:
    preset, *overrides = SMALL
    return projection(capsys, "--preset", preset, "--gpu-type", "l40s", *extra, *overrides)


def run_of(data: dict, run_id: str) -> dict:
    return next(r for r in data["runs"] if r["run_id"] == run_id)


def test_one_phase_is_the_hand_arithmetic(capsys):
    data = small(capsys)
    spec = load_spec(SMALL[0], list(SMALL[1:]))
    tiny, t = spec.model.tiny, spec.train
    h, i, v, layers = tiny.hidden_size, tiny.intermediate_size, tiny.vocab_size, tiny.num_layers
    # Every linear weight a token multiplies by: q, k, v, o (64 x 64 each: 2 KV heads = 2 heads), gate, up (64 x 128),
    # down (128 x 64) per layer, and the tied LM head (384 x 64): 40,960 + 24,576 = 65,536.
    weights = layers * (4 * h * h + 3 * h * i) + v * h
    assert weights == 65_536
    length = PROMPT_TOKENS + spec.generation.max_new_tokens           # 256 + 16 = 272 tokens a sequence
    sequences = t.prompts_per_step * t.group_size                      # 8 completions a step
    bandwidth = GPUS["l40s"].bandwidth * BANDWIDTH_EFFICIENCY          # 864 GB/s x 0.5 = 432 GB/s
    flops_rate = GPUS["l40s"].bf16_flops * MFU                         # 362 TFLOP/s x 0.3 = 108.6 TFLOP/s

    # reference (GRPO, TRL): a forward over every completion of every step: 3 x 8 x 272 = 6,528 tokens, each 2 FLOPs
    # per weight plus attention's 2 x 2 x 64 x 1 layer over 272 / 2 positions: 131,072 + 34,816 = 165,888 FLOPs.
    reference = run_of(data, "grpo-s0")["phases"]["reference"]
    tokens = t.steps * sequences * length
    flops = tokens * (2 * weights + 2 * h * layers * length)
    assert (reference["tokens"], reference["flops"]) == (tokens, flops) == (6_528, 1_082_916_864)
    assert reference["seconds"] == pytest.approx(flops / flops_rate)
    assert reference["rate"] == "assumed"

    # generation: 3 generate calls of 8 sequences; the prefill of 8 x 256 prompt tokens each, then 16 decode steps each
    # reading the float32 weights under HF generate (4 B each) and the float32 KV cache (K and V, 64 wide, 1 layer:
    # 512 B a token) of 8 sequences at the mean context 256 + 8.
    generation = run_of(data, "grpo-s0")["phases"]["generation"]
    new, context = spec.generation.max_new_tokens, PROMPT_TOKENS + spec.generation.max_new_tokens / 2
    step_bytes = weights * 4 + sequences * context * (2 * layers * h * 4)
    step_flops = sequences * (2 * weights + 4 * h * layers * context)
    prefill = t.steps * sequences * PROMPT_TOKENS * (2 * weights + 2 * h * layers * PROMPT_TOKENS)
    assert generation["tokens"] == t.steps * sequences * new
    assert generation["bytes"] == pytest.approx(t.steps * new * step_bytes, rel=1e-12)
    assert generation["flops"] == pytest.approx(prefill + t.steps * new * step_flops, rel=1e-12)
    decode_s = t.steps * new * max(step_bytes / bandwidth, step_flops / flops_rate)  # bandwidth-bound here
    assert generation["seconds"] == pytest.approx(prefill / flops_rate + decode_s)

    # update: forward + activation and weight gradients (no checkpointing in cpu-quick): 3 x the forward's FLOPs,
    # and AdamW's 28 B per parameter per step: the tied embedding 24,576, per layer 40,960 weights + the q/k/v biases
    # (192) + two norms (128), the final norm 64: 65,920 parameters.
    update = run_of(data, "grpo-s0")["phases"]["update"]
    assert not spec.train.gradient_checkpointing
    parameters = v * h + layers * (4 * h * h + 3 * h * i + 3 * h + 2 * h) + h
    assert parameters == 65_920
    assert update["flops"] == 3 * flops
    assert update["bytes"] == t.steps * parameters * ADAMW_BYTES_PER_PARAMETER
    assert update["seconds"] == pytest.approx(3 * flops / flops_rate + update["bytes"] / bandwidth)

    # the verifier scores every completion; each run costs the assumed start-up
    assert run_of(data, "grpo-s0")["phases"]["reward"]["seconds"] == pytest.approx(
        t.steps * sequences / VERIFIER_COMPLETIONS_PER_S)
    assert {r["phases"][STARTUP]["seconds"] for r in data["runs"]} == {STARTUP_S}
    assert data["basis"] == "assumed rates only" and "not a measurement" in data["what"]


def test_every_run_of_the_plan_is_projected_with_every_phase(capsys):
    data = small(capsys)
    ids = [r["run_id"] for r in data["runs"]]
    assert ids == ["warm_start", "sample_pool", "reward_model", "grpo-s0", "grpo_engine-s0", "ppo-s0",
                   "ppo_verifier-s0", "dpo-s0"]  # bench run --dry-run's plan, in its order
    for run in data["runs"]:
        assert set(run["phases"]) == {*PHASES, STARTUP}
        assert run["seconds"] == pytest.approx(sum(p["seconds"] for p in run["phases"].values()))
    ppo, dpo = run_of(data, "ppo-s0")["phases"], run_of(data, "dpo-s0")["phases"]
    assert ppo["critic"]["flops"] > 0 and ppo["reward"]["flops"] > 0   # a critic and a reward model
    assert dpo["generation"]["tokens"] == 0 == dpo["critic"]["flops"]  # offline, no critic
    assert data["total_1_gpu"]["seconds"] == pytest.approx(sum(r["seconds"] for r in data["runs"]))


def _calibration_suite(folder: Path, spec_overrides: tuple[str, ...], phases: dict[str, float], wall_s: float) -> Path:
    """A suite folder holding one finished grpo-s0 run whose result.json has ``phases`` timed (the real shape:
    tests/report_fixtures.method_result) and the resolved spec of SMALL with ``spec_overrides``."""
    spec = load_spec(SMALL[0], [*SMALL[1:], *spec_overrides])
    result = method_result("grpo")
    result["spec"] = spec.to_dict()
    result["phases"] = {name: {"time_s": seconds, "count": spec.train.steps} for name, seconds in phases.items()}
    result["throughput"]["wall_s"] = wall_s
    result["environment"]["gpu_name"] = "NVIDIA L40S"
    write_json_atomic(folder / "suite.json", {"preset": "cpu-quick", "runs": ["grpo-s0"], "spec": spec.to_dict()})
    write_json_atomic(folder / "runs" / "grpo-s0" / "result.json", result)
    return folder


def test_a_calibration_changes_exactly_the_phases_it_timed(capsys, tmp_path):
    before = small(capsys)
    # Measured on the same budget: generation 12 s, update 6 s, 'other' 1 s, in a 30 s run.
    folder = _calibration_suite(tmp_path / "cal", (), {"generation": 12.0, "update": 6.0, "other": 1.0}, 30.0)
    after = small(capsys, "--calibrate", str(folder))
    changed = {(b["run_id"], phase) for b, a in zip(before["runs"], after["runs"])
               for phase in b["phases"] if b["phases"][phase]["seconds"] != a["phases"][phase]["seconds"]}
    assert changed == {("grpo-s0", "generation"), ("grpo-s0", "update"), ("grpo-s0", STARTUP)}
    grpo = run_of(after, "grpo-s0")["phases"]
    # The same work as the calibration run's, so the measured seconds come back; start-up: the wall time less the
    # six phases (the 'other' second included).
    assert grpo["generation"]["seconds"] == pytest.approx(12.0)
    assert grpo["update"]["seconds"] == pytest.approx(6.0)
    assert grpo[STARTUP]["seconds"] == pytest.approx(30.0 - 12.0 - 6.0)
    assert {p: grpo[p]["rate"] for p in grpo} == {**{p: "assumed" for p in grpo}, "generation": "measured",
                                                    "update": "measured", STARTUP: "measured"}
    assert run_of(after, "grpo_engine-s0")["phases"]["generation"]["rate"] == "assumed"  # another run name
    assert after["basis"] == "measured and assumed rates"
    assert after["calibration"]["gpu_names"] == ["NVIDIA L40S"]


def test_a_measured_rate_scales_with_the_work(capsys, tmp_path):
    # Measured on a 1-step run: 4 s of generation; the 3-step preset has 3 times that run's generate calls.
    folder = _calibration_suite(tmp_path / "cal", ("train.steps=1",), {"generation": 4.0}, 10.0)
    data = small(capsys, "--calibrate", str(folder))
    assert run_of(data, "grpo-s0")["phases"]["generation"]["seconds"] == pytest.approx(12.0)
    measured = {(e["run"], e["phase"]): e for e in data["calibration"]["measured"]}
    assert measured[("grpo", "generation")]["measured_s"] == 4.0
    assert measured[("grpo", "generation")]["rate_vs_assumed"] == pytest.approx(
        measured[("grpo", "generation")]["assumed_s"] / 4.0)


def test_more_gpus_never_take_longer_and_follow_bench_runs_placement(capsys):
    data = projection(capsys, "--preset", "gsm8k-qwen0.5b", "--gpu-type", "h100", "--gpus", "8")
    one, eight = data["total_1_gpu"], data["total_n_gpus"]
    stages = [r for r in data["runs"] if r["kind"] == "stage"]
    methods = [r for r in data["runs"] if r["kind"] == "method"]
    assert eight["seconds"] <= one["seconds"]
    assert (eight["gpus"], eight["parallel_runs"], len(eight["slots"])) == (8, 8, 8)  # parallel_runs: auto
    assert eight["stages_s"] == pytest.approx(sum(r["seconds"] for r in stages))  # the stages one at a time
    placed = [run_id for slot in eight["slots"] for run_id in slot["runs"]]
    assert sorted(placed) == sorted(r["run_id"] for r in methods)  # every method run once
    # A critical path, not sum / 8: at least the stages plus the longest method run, and the first 8 method runs of
    # the plan start at once, one per GPU.
    assert eight["seconds"] >= eight["stages_s"] + max(r["seconds"] for r in methods)
    assert [slot["runs"][0] for slot in eight["slots"]] == [r["run_id"] for r in methods[:8]]
    assert one["hours"] == pytest.approx(sum(r["seconds"] for r in data["runs"]) / 3600)


def test_the_table_says_it_is_a_projection_and_names_its_rates():
    done = run_bench("estimate", "--time", "--preset", "gsm8k-qwen0.5b", "--gpu-type", "h100", "--gpus", "8")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for words in ("WALL-TIME PROJECTION, not a measurement", "assumed rates only", "datasheet", "3.35 TB/s",
                  "989 TFLOP/s dense bf16", "50% assumed bandwidth efficiency", "30% assumed MFU",
                  "PROJECTED total on 1 GPU", "PROJECTED total on 8 GPUs", "grpo-s0", "ppo_verifier-s2"):
        assert words in out, words


@pytest.mark.parametrize("argv, words", [
    (["--gpu-type", "h1000"], "unknown --gpu-type 'h1000' (did you mean 'h100'?)"),
    (["--gpu-type", "h100", "--gpus", "0"], "--gpus must be between 1 and"),
    (["--gpu-type", "h100", "--gpus", "-2"], "--gpus must be between 1 and"),
    (["--gpu-type", "h100", "--gpus", "eight"], "invalid int value"),
    (["--gpu-type", "h100", "--calibrate", "{empty}"], "is not a suite run folder (no suite.json)"),
    (["--gpu-type", "h100", "--calibrate", "{unfinished}"], "holds no finished run with phase timings"),
    ([], "--time needs --preset PRESET and --gpu-type TYPE"),
    (["--gpu-type", "h100", "--model", "qwen2.5-7b"], "--model is the memory estimate's"),
])
def test_bad_input_is_one_line_and_exit_2(argv, words, tmp_path):
    (tmp_path / "empty").mkdir()
    unfinished = tmp_path / "unfinished"
    write_json_atomic(unfinished / "suite.json", {"preset": "cpu-quick", "runs": ["grpo-s0"]})
    argv = [a.format(empty=tmp_path / "empty", unfinished=unfinished) for a in argv]
    done = run_bench("estimate", "--time", "--preset", "gsm8k-qwen0.5b", *argv)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert words in lines[0]


def test_the_projection_options_need_time():
    done = run_bench("estimate", "--model", "qwen2.5-0.5b", "--method", "grpo", "--gpu-type", "h100")
    assert done.returncode == 2 and "add --time" in done.stderr and len(done.stderr.strip().splitlines()) == 1
