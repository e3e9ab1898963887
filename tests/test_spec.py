"""Spec validation: every user mistake is one line naming the key and the fix, exit status 2, no traceback."""

from __future__ import annotations

import subprocess

import pytest
from bench_cli import run_bench

from bench.errors import SpecError
from bench.config.registry import METHODS
from bench.config.loading import load_spec, preset_names


PRESETS_WITH_CONTROL = {"cpu-tiny", "gsm8k-qwen0.5b", "gsm8k-qwen0.5b-lora", "gsm8k-rehearsal-cpu"}
SUBSET_PRESETS = {  # presets that run some methods only, and why (each says so in its header)
    "systems-gpu": "a sweep to 7B on one GPU: the methods whose memory differs",
    "smollm2-synthetic-cpu": "a real model's result in an hour on 2 cores: GRPO, DPO and the control arm",
    "frontier-cpu": "GRPO's successors beside GRPO (suite engine), PPO (verifier) and the control arm",
    "gsm8k-qwen0.5b-frontier": "the same methods as frontier-cpu on gsm8k-qwen0.5b's model, task and budget",
}
FRONTIER = ("rloo", "reinforce_pp", "dr_grpo", "dapo", "gspo", "cispo", "sapo")
"""GRPO's successors: off by default, so a preset runs them only where it names them (the frontier presets)."""


def test_shipped_presets_validate() -> None:
    names = preset_names()
    assert {"cpu-tiny", "cpu-quick", "gsm8k-qwen0.5b"} <= set(names)
    for name in names:
        spec = load_spec(name)
        assert spec.name == name
        # Every method runs in every shipped preset; the control arm (lr 0) only where accuracy is the point, and
        # GRPO's successors (off by default) only in the preset that compares them.
        expected = [m for m in METHODS if (m != "control" or name in PRESETS_WITH_CONTROL) and m not in FRONTIER]
        if name in SUBSET_PRESETS:
            assert set(spec.enabled_methods()) < set(METHODS) and spec.enabled_methods(), name
        else:
            assert spec.enabled_methods() == expected, name
    for name in ("frontier-cpu", "gsm8k-qwen0.5b-frontier"):
        spec = load_spec(name)
        assert set(FRONTIER) | {"grpo_engine", "ppo_verifier", "control"} == set(spec.enabled_methods()), name
        # At least two optimizer steps per rollout for every method alike: with one, every ratio is 1.
        assert {spec.methods[m].ppo_epochs * spec.methods[m].minibatches for m in spec.enabled_methods()} == {2}
    gpu, base = load_spec("gsm8k-qwen0.5b-frontier"), load_spec("gsm8k-qwen0.5b")
    assert (gpu.model, gpu.task, gpu.generation, gpu.train, gpu.eval) == (base.model, base.task, base.generation,
                                                                          base.train, base.eval)


def test_overrides_are_typed_and_applied() -> None:
    spec = load_spec("cpu-quick", ["train.steps=7", "train.learning_rate=3e-5", "methods.dpo.enabled=false",
                                   "generation.temperature=0.7", "seeds=[1,2]"])
    assert spec.train.steps == 7
    assert spec.train.learning_rate == pytest.approx(3e-5)
    assert "dpo" not in spec.enabled_methods()
    assert spec.generation.temperature == pytest.approx(0.7)
    assert spec.seeds == [1, 2]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["train.stepz=3"], "unknown key 'train.stepz' (did you mean 'steps'?)"),
        (["trian.steps=3"], "unknown key 'trian'"),
        (["train.steps=many"], "'train.steps' must be an integer, got 'many'"),
        (["train.steps=2.5"], "'train.steps' must be an integer"),
        (["train.gradient_checkpointing=maybe"], "'train.gradient_checkpointing' must be true or false"),
        (["train.group_size=1"], "'train.group_size' must be >= 2 for methods.grpo"),
        (["train.group_size=1", "methods.grpo.enabled=false"], "'train.group_size' must be >= 2 for methods.grpo_engine"),
        (["methods.dpo.loss_type=sigmoid,nope"], "'methods.dpo.loss_type' has unknown loss nope"),
        (["methods.ppo.gamma=1.5"], "'methods.ppo.gamma' must be in [0, 1]"),
        (["methods.ppo.critic_learning_rate=-1"], "'methods.ppo.critic_learning_rate' must be >= 0"),
        (["methods.grpo.loss_type=dappo"], "'methods.grpo.loss_type' must be one of"),
        (["methods.grpo.cliprange=0.1"], "unknown key 'methods.grpo.cliprange'"),
        (["train.micro_batch_size=3"], "'train.micro_batch_size' (3) must divide the completions per step"),
        (["train.group_size=3", "methods.ppo.minibatches=4"], "must divide by 'methods.ppo.minibatches' (4)"),
        (["generation.temperature=0"], "'generation.temperature' must be > 0"),
        (["generation.top_p=1.5"], "'generation.top_p' must be in (0, 1]"),
        (["train.lr_scheduler=cosin"], "did you mean 'cosine'?"),
        (["methods.ppx.enabled=true"], "unknown method 'methods.ppx' (did you mean 'ppo'?)"),
        (["model.source=path", "model.name_or_path=/no/such/model"], "folder '/no/such/model' does not exist"),
        (["model.source=hub"], "'model.name_or_path' is required"),
        (["task.source=gsm8k", "task.path=/no/such/file.jsonl", "model.source=hub", "model.name_or_path=x/y"],
         "'task.path' '/no/such/file.jsonl' does not exist"),
        (["seeds=[0,0]"], "'seeds' has duplicates"),
        (["parallel_runs=3", "device=cuda", "gpus=[0,1]"], "'parallel_runs' is 3 but 'gpus' lists 2 GPU(s)"),
        (["train.steps"], "override 'train.steps' has no '='"),
        (["methods.grpo.enabled=false", "methods.grpo_engine.enabled=false", "methods.ppo.enabled=false",
          "methods.ppo_verifier.enabled=false", "methods.dpo.enabled=false"], "no method is enabled"),
    ],
)
def test_bad_specs_name_the_key(overrides: list[str], expected: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec("cpu-quick", overrides)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


def test_group_size_one_is_fine_without_group_methods() -> None:
    spec = load_spec("cpu-quick", ["train.group_size=1", "methods.grpo.enabled=false",
                                   "methods.grpo_engine.enabled=false"])
    assert spec.train.group_size == 1


def test_unknown_preset_and_missing_file(tmp_path) -> None:
    with pytest.raises(SpecError, match="unknown preset 'cpu-tinny' \\(did you mean 'cpu-tiny'\\?\\)"):
        load_spec("cpu-tinny")
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(str(bad))


def test_preset_file_from_disk(tmp_path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\ntrain: {steps: 3}\nmethods: {dpo: false}\n")
    spec = load_spec(str(path))
    assert spec.name == "mine" and spec.train.steps == 3 and "dpo" not in spec.enabled_methods()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return run_bench(*args, timeout=120)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["run", "--preset", "cpu-quick", "--dry-run", "train.stepz=3"], "unknown key 'train.stepz'"),
        (["run", "--preset", "cpu-quick", "--dry-run", "train.group_size=1"], "'train.group_size' must be >= 2"),
        (["run", "--preset", "nope", "--dry-run"], "unknown preset 'nope'"),
        (["report", "/no/such/folder"], "is not a suite run folder"),
        (["score", "/no/such/file.jsonl", "--completion-field", "c", "--gold-field", "g"], "file not found"),
    ],
)
def test_cli_user_errors_exit_2_without_traceback(args: list[str], expected: str) -> None:
    proc = run_cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_dry_run_plans_the_gpu_preset_on_cpu() -> None:
    proc = run_cli("run", "--preset", "gsm8k-qwen0.5b", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for run_id in ("warm_start", "sample_pool", "reward_model", "grpo-s0", "grpo_engine-s0", "ppo-s0",
                   "ppo_verifier-s0", "dpo-s0"):
        assert run_id in out
    assert "16 prompts x G=8 = 128 completions/step" in out


def test_cli_presets_lists_each_with_a_line() -> None:
    proc = run_cli("presets")
    assert proc.returncode == 0
    lines = proc.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == preset_names()
    assert all(len(line.split(maxsplit=1)) == 2 for line in lines)


def test_only_the_gpu_gsm8k_presets_use_vllm_and_the_keys_survive_the_worker_copy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU gsm8k presets generate with vLLM (run_all.sh installs it on a GPU box); every other preset, the CPU
    default cpu-tiny included, stays on transformers. A spec that asks for vLLM keeps its keys through to_dict /
    load_spec_dict (how the worker gets its spec), typed."""
    from bench.config import rules
    from bench.config.loading import load_spec_dict

    vllm = {"gsm8k-qwen0.5b", "gsm8k-qwen0.5b-lora", "gsm8k-qwen0.5b-frontier"}
    for name in preset_names():
        assert load_spec(name).generation.backend == ("vllm" if name in vllm else "transformers"), name
    monkeypatch.setattr(rules, "vllm_installed", lambda: True)
    spec = load_spec("cpu-quick", ["generation.backend=vllm", "generation.vllm_gpu_memory_utilization=1"])
    copy = load_spec_dict(spec.to_dict()).generation
    assert (copy.backend, copy.vllm_gpu_memory_utilization) == ("vllm", 1.0)
    assert isinstance(copy.vllm_gpu_memory_utilization, float)
