"""`bench estimate`: the table and the JSON answer, defaults from the gsm8k-qwen0.5b preset, bad input as one line
with exit 2, and a fast path that imports no torch."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from importlib import resources

import pytest
import yaml

from bench.cli import main
from bench.systems.estimate import parse_memory
from bench.systems.memory_terms import GIB, Settings


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["estimate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_has_the_promised_fields(capsys):
    code, out, _ = run(capsys, "--model", "qwen2.5-7b", "--method", "ppo", "--gpu-memory", "80GiB", "--json")
    assert code == 0
    data = json.loads(out)
    assert (data["method"], data["model"], data["parameters"]) == ("ppo", "qwen2.5-7b", 7_615_616_512)
    assert set(data["networks"]) == {"actor", "critic", "reward", "reference"}
    for net in data["networks"].values():
        assert {"weights_bytes", "gradients_bytes", "optimizer_bytes"} <= set(net)
    assert data["static_bytes"] == sum(n["static_bytes"] for n in data["networks"].values())
    assert data["peak_bytes"] > data["static_bytes"] > 80 * GIB and data["fits"] is False
    assert data["peak_phase"] in data["phases"]
    # fp32 actor: 7,615,616,512 parameters x (4 weights + 4 gradients + 8 moments) bytes + 4 B per tensor (339)
    actor = data["networks"]["actor"]
    assert actor["weights_bytes"] + actor["gradients_bytes"] + actor["optimizer_bytes"] == 7_615_616_512 * 16 + 4 * 339


def test_the_table_names_every_network_the_peak_and_the_answers(capsys):
    code, out, _ = run(capsys, "--model", "qwen2.5-0.5b", "--method", "grpo", "--gpu-memory", "24GiB")
    assert code == 0
    for words in ("actor", "reference", "bfloat16 (frozen)", "peak", "largest micro-batch", "ZeRO-3", "generation"):
        assert words in out
    assert "critic" not in out


def test_overrides_and_spec_aliases_change_the_settings(capsys):
    _, out, _ = run(capsys, "--model", "qwen2.5-0.5b", "--method", "grpo", "--json", "micro_batch_size=2",
                    "generation.max_new_tokens=128", "train.kl_beta=0", "gradient_checkpointing=false")
    data = json.loads(out)
    assert (data["settings"]["micro_batch_size"], data["settings"]["completion_tokens"]) == (2, 128)
    assert set(data["networks"]) == {"actor"} and data["settings"]["gradient_checkpointing"] is False


def test_all_methods_side_by_side(capsys):
    _, out, _ = run(capsys, "--model", "llama-3.1-8b", "--method", "all", "--json")
    data = json.loads(out)["methods"]
    assert set(data) == {"ppo", "ppo_verifier", "grpo", "grpo_engine", "dpo"}
    assert data["ppo"]["static_bytes"] > 1.8 * data["grpo"]["static_bytes"]  # the critic and the reward model


def test_defaults_are_the_gsm8k_preset_shapes():
    preset = yaml.safe_load((resources.files("bench.config") / "presets" / "gsm8k-qwen0.5b.yaml").read_text())
    s, t = Settings(), preset["train"]
    assert (s.micro_batch_size, s.group_size, s.prompts_per_step) == (t["micro_batch_size"], t["group_size"],
                                                                       t["prompts_per_step"])
    assert (s.gradient_checkpointing, s.kl_beta) == (t["gradient_checkpointing"], t["kl_beta"])
    assert s.completion_tokens == preset["generation"]["max_new_tokens"]
    assert s.dtype == preset["model"]["dtype"]


@pytest.mark.parametrize("text, expected", [("80GiB", 80 * GIB), ("80", 80 * GIB), ("141GB", 141 * 10 ** 9),
                                            ("81920MiB", 80 * GIB), ("0.5 TiB", 512 * GIB)])
def test_memory_sizes_parse(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("argv, words", [
    (["--model", "qwen2.5-7B", "--method", "ppo"], "did you mean 'qwen2.5-7b'"),
    (["--model", "gpt-5", "--method", "ppo"], "known architectures"),
    (["--model", "qwen2.5-7b", "--method", "ppoo"], "did you mean 'ppo'"),
    (["--model", "qwen2.5-7b", "--method", "ppo", "--gpu-memory=-5GiB"], "must be positive"),
    (["--model", "qwen2.5-7b", "--method", "ppo", "--gpu-memory", "-5GiB"], "positive size"),
    (["--model", "qwen2.5-7b", "--method", "ppo", "--gpu-memory", "lots"], "not a memory size"),
    (["--model", "qwen2.5-7b", "--method", "ppo", "micro_batch=4"], "did you mean 'micro_batch_size'"),
    (["--model", "qwen2.5-7b", "--method", "ppo", "micro_batch_size=four"], "must be an integer"),
    (["--model", "qwen2.5-7b", "--method", "ppo", "micro_batch_size=-1"], "must be >= 0"),
    (["--model", "qwen2.5-7b", "--method", "ppo", "dtype=fp8"], "float32 or bfloat16"),
    (["--model", "qwen2.5-7b", "--method", "ppo", "group_size"], "not key=value"),
    (["--method", "ppo"], "required: --model"),
    (["--model", "qwen2.5-7b", "--method", "dappo"], "unknown method 'dappo' (did you mean 'dapo'?)"),
    (["--model", "qwen2.5-7b", "--method", "ppo", "--zero-stage", "4"], "invalid choice: 4"),
    (["--model", "qwen2.5-7b", "--method", "ppo", "--gpus", "0"], "--gpus must be between 1 and 4096"),
    (["--model", "qwen2.5-7b", "--method", "ppo", "--gpus", "eight"], "invalid int value"),
    (["--model", "qwen2.5-7b", "--method", "ppo", "--zero-stage", "2", "--offload", "all"], "needs ZeRO stage 3"),
    (["--model", "qwen2.5-7b", "--method", "ppo", "--offload", "optimizer"], "needs ZeRO stage 1, 2 or 3"),
    (["--model", "qwen2.5-7b", "--method", "ppo", "--offload", "disk"], "invalid choice: 'disk'"),
])
def test_bad_input_is_one_line_and_exit_2(argv, words, capsys):
    try:
        code = main(["estimate", *argv])
    except SystemExit as exc:  # argparse's own errors (made one line in bench.systems.estimate)
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert words in err


FRONTIER = ("rloo", "reinforce_pp", "dr_grpo", "dapo", "gspo", "cispo", "sapo")


@pytest.mark.parametrize("method", FRONTIER)
def test_grpos_successors_are_estimated_with_the_networks_their_recipe_keeps(method, capsys):
    """Each successor is the engine GRPO's networks and phases under another loss: its answer is grpo_engine's,
    without the reference where its KL is off, and the networks are those the recipe itself holds."""
    from baselines import grpo_family
    from bench.config.loading import load_spec

    code, out, _ = run(capsys, "--model", "qwen2.5-0.5b", "--method", method, "--json")
    data = json.loads(out)
    spec = load_spec("gsm8k-qwen0.5b", [f"methods.{method}.enabled=true"])
    assert code == 0 and data["method"] == method
    assert set(data["networks"]) == set(grpo_family.networks(spec, spec.methods[method]))
    beta = ["kl_beta=0"] if "reference" not in data["networks"] else []
    _, same, _ = run(capsys, "--model", "qwen2.5-0.5b", "--method", "grpo_engine", "--json", *beta)
    assert data["peak_bytes"] == json.loads(same)["peak_bytes"]
    assert any(f"{method} is modelled as grpo_engine" in note for note in data["notes"])


def test_the_command_answers_fast_without_torch():
    code = ("import sys, time; t = time.perf_counter(); from bench.cli import main; "
            "rc = main(['estimate', '--model', 'llama-3.1-70b', '--method', 'all']); "
            "print(rc, 'torch' in sys.modules, time.perf_counter() - t, file=sys.stderr)")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    wall = time.perf_counter() - start
    rc, torch_loaded, _ = done.stderr.split()[-3:]
    assert (rc, torch_loaded) == ("0", "False"), done.stderr
    assert wall < 10  # about 0.4 s on an idle core (every layout's GPU count included); loose for a shared box


def test_the_table_says_why_nothing_fits(capsys):
    _, out, _ = run(capsys, "--model", "qwen2.5-7b", "--method", "grpo", "--gpu-memory", "141GB")
    assert "none (the static terms plus one sequence's step exceed one GPU)" in out  # 128 GiB static < 131 GiB
    _, out, _ = run(capsys, "--model", "qwen2.5-7b", "--method", "grpo", "--gpu-memory", "80GiB")
    assert "none (the static terms alone exceed one GPU)" in out


def test_json_carries_the_gpu_count_of_every_layout(capsys):
    _, out, _ = run(capsys, "--model", "qwen2.5-7b", "--method", "grpo", "--json")
    data = json.loads(out)
    assert set(data["gpus"]) == {"dp", "zero1", "zero2", "zero3", "zero3_offload"}
    assert data["gpus_data_parallel"] == data["gpus"]["dp"] and data["gpus_zero3"] == data["gpus"]["zero3"]
    assert data["gpus"]["dp"] is None and data["layout"] is None  # 128 GiB of static state on one 80 GiB GPU
    for name, count in data["gpus"].items():
        memory = data["gpus_memory"][name]
        assert (memory is None) == (count is None)
        if memory:
            assert memory["gpus"] == count and memory["fits"] and memory["peak_bytes"] <= 80 * GIB
    assert data["gpus_memory"]["zero3_offload"]["host_bytes"] > 0 == data["gpus_memory"]["zero3"]["host_bytes"]


def test_one_layout_asked_for_gives_its_per_gpu_peak_and_whether_it_fits(capsys):
    args = ["--model", "qwen2.5-7b", "--method", "grpo", "--json", "--zero-stage", "2"]
    _, out, _ = run(capsys, *args, "--gpus", "8")
    eight = json.loads(out)["layout"]
    assert (eight["layout"], eight["stage"], eight["gpus"], eight["fits"]) == ("zero2", 2, 8, True)
    assert eight["peak_bytes"] == eight["static"]["total"] + eight["phases"][eight["peak_phase"]]["total"]
    assert eight["max_micro_batch"] == 16  # every sequence of this GPU's share (128 / 8) at once
    _, out, _ = run(capsys, *args, "--gpus", "2")
    two = json.loads(out)["layout"]
    assert not two["fits"] and two["peak_bytes"] > eight["peak_bytes"] and two["max_micro_batch"] == 0
    _, out, _ = run(capsys, "--model", "qwen2.5-7b", "--method", "ppo", "--json", "--offload", "all", "--gpus", "2")
    data = json.loads(out)
    offload, nets = data["layout"], data["networks"]
    # The suite's engine offloads its trained networks; the frozen reward model and reference stay whole on the GPU.
    frozen = nets["reward"]["weights_bytes"] + nets["reference"]["weights_bytes"]
    assert (offload["layout"], offload["static"]["weights"], offload["static"]["optimizer"]) == (
        "zero3_offload", frozen, 0)
    assert offload["host_bytes_per_gpu"] * 2 == offload["host_bytes"] > 0


def test_the_table_lists_every_layout_and_the_asked_one(capsys):
    code, out, _ = run(capsys, "--model", "qwen2.5-7b", "--method", "ppo", "--zero-stage", "3", "--gpus", "8",
                       "eval.enabled=false")
    assert code == 0
    for words in ("plain data parallel (DDP)", "ZeRO-1", "ZeRO-2", "ZeRO-3 (+ weights sharded)",
                  "ZeRO-3 + CPU offload", "host memory", "layout: ZeRO-3 on 8 GPUs", "peak per GPU"):
        assert words in out, words
    _, out, _ = run(capsys, "--model", "qwen2.5-7b", "--method", "ppo", "lora_rank=32")
    dp = next(line for line in out.splitlines() if line.strip().startswith("plain data parallel"))
    assert "never" not in dp  # LoRA: the rollout split over enough GPUs fits under plain DDP


def test_lora_drops_the_reference_and_most_gpus(capsys):
    _, full, _ = run(capsys, "--model", "llama-3.1-70b", "--method", "dpo", "--json", "eval.enabled=false")
    _, lora, _ = run(capsys, "--model", "llama-3.1-70b", "--method", "dpo", "--json", "train.lora.r=32",
                     "eval.enabled=false")
    full, lora = json.loads(full), json.loads(lora)
    assert lora["networks"]["reference"]["weights_bytes"] == 0 < full["networks"]["reference"]["weights_bytes"]
    assert lora["gpus"]["zero3"] < full["gpus"]["zero3"]
    _, table, _ = run(capsys, "--model", "llama-3.1-70b", "--method", "dpo", "train.lora.r=32")
    assert "reference  actor's base, adapters off" in table


def test_the_engine_says_why_its_zero_layouts_never_fit(capsys):
    code, out, _ = run(capsys, "--model", "llama-3.1-70b", "--method", "grpo_engine", "lora_rank=32")
    assert code == 0
    zero3 = next(line for line in out.splitlines() if line.strip().startswith("ZeRO-3 (+ weights sharded)"))
    assert "never" in zero3 and "whole fp32 actor gathered to generate" in zero3
    assert "reference and reward model whole on every GPU" in out  # the engine's ZeRO note
    # TRL: sharded, with a count (without the evaluation's rank-0 copy of the whole policy)
    _, out, _ = run(capsys, "--model", "llama-3.1-70b", "--method", "dpo", "eval.enabled=false")
    zero3 = next(line for line in out.splitlines() if line.strip().startswith("ZeRO-3 (+ weights sharded)"))
    assert "never" not in zero3 and "bf16 modules" in out


def test_the_7b_ppo_answer_has_an_update_near_the_hand_calculation_and_the_reward_model_stage(capsys):
    """The 7B PPO update against the hand calculation: 20.3 GiB by hand (see tests/test_memory_model.py), within 15%."""
    _, out, _ = run(capsys, "--model", "qwen2.5-7b", "--method", "ppo", "--gpu-memory", "80GiB", "--json")
    data = json.loads(out)
    assert abs(data["phases"]["update"]["total"] / GIB - 20.3) / 20.3 < 0.15
    assert data["peak_moment"] == "critic forward"
    stage = data["stages"]["reward_model"]
    assert stage["phases"]["update"]["total"] > 0 and "evaluation" in stage["phases"] and stage["fits"] is False
    assert set(data["stages"]) == {"sample_pool", "reward_model"}
    assert data["outside_allocator"]["cuda_context"] > 0
    assert data["device_peak_bytes"] == data["peak_bytes"] + sum(data["outside_allocator"].values())
    what_if = data["what_if"]["zero3_what_if"]
    # With the evaluation on, the engine's own ZeRO-3 never fits (rank 0's whole fp32 copies); the what-if does.
    assert data["gpus"]["zero3"] is None and what_if["gpus"] == 6 and "what-if" in what_if["label"]


@pytest.mark.parametrize("model", ["qwen2.5-7b", "llama-3.1-8b"])
def test_json_has_no_negative_number_for_any_method(model, capsys):
    _, out, _ = run(capsys, "--model", model, "--method", "all", "--json")

    def numbers(x):
        if isinstance(x, dict):
            for v in x.values():
                yield from numbers(v)
        elif isinstance(x, list):
            for v in x:
                yield from numbers(v)
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            yield x

    assert min(numbers(json.loads(out))) >= 0


def test_the_table_shows_the_moment_the_stages_and_the_engine_what_if(capsys):
    _, out, _ = run(capsys, "--model", "qwen2.5-7b", "--method", "ppo")
    for words in ("resident between steps", "at critic forward", "cuda context", "reward-model stage",
                  "sample-pool stage", "what-if ZeRO-3", "what-if, not what the engine does"):
        assert words in out, words
    _, out, _ = run(capsys, "--model", "qwen2.5-7b", "--method", "grpo")
    assert "frees after each step" in out and "what-if" not in out and "stage" not in out
    _, out, _ = run(capsys, "--model", "qwen2.5-0.5b", "--method", "grpo", "device=cpu")
    assert "adamw step temporaries" in out and "cuda context" not in out


def test_the_engine_what_if_can_be_asked_for_as_one_layout(capsys):
    _, out, _ = run(capsys, "--model", "qwen2.5-7b", "--method", "ppo", "--json", "--what-if", "--gpus", "8")
    layout = json.loads(out)["layout"]
    assert (layout["layout"], layout["gpus"], layout["what_if_engine"], layout["fits"]) == ("zero3_what_if", 8, True,
                                                                                            True)
    _, out, _ = run(capsys, "--model", "qwen2.5-7b", "--method", "ppo", "--what-if", "--gpus", "8")
    assert "layout: what-if ZeRO-3 (frozen networks sharded, bf16 generation gather) on 8 GPUs" in out
    for argv, words in ((["--method", "grpo", "--what-if"], "the suite engine's"),
                        (["--method", "ppo", "--what-if", "--zero-stage", "2"], "ZeRO-3 layout without offload")):
        try:
            code = main(["estimate", "--model", "qwen2.5-7b", *argv])
        except SystemExit as exc:
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1
