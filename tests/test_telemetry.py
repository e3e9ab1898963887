"""Tests of bench.telemetry: accounting, memory sources (fake and real NVML), phase/step timers, TRL hooks.

Timing tests assert structure and sums with wide margins, never speed.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import copy
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from torch import nn

from bench.telemetry import Telemetry, account_networks, capture_environment, instrument_trl_trainer, primary_source
from bench.telemetry.memory import (
    CPU_MAXRSS,
    CPU_RSS,
    NVML_DEVICE,
    NVML_PROCESS,
    MemorySampler,
    SampledReaders,
)
from bench.telemetry.tracker import _percentile
from bench.telemetry.trl_hooks import count_generated_tokens


# ---------------------------------------------------------------------------------------------
# accounting
# ---------------------------------------------------------------------------------------------
def _tiny() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))


N_PARAMS = 4 * 8 + 8 + 8 * 2 + 2  # 58


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(v.numel() * v.element_size() for st in optimizer.state.values() for v in st.values()
               if isinstance(v, torch.Tensor))


def test_accounting_before_and_after_an_adamw_step() -> None:
    model = _tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    before = account_networks({"actor": model}, {"actor": optimizer})["actor"]
    assert before["params"] == before["trainable_params"] == N_PARAMS
    assert before["weight_bytes"] == N_PARAMS * 4
    assert before["grad_bytes"] == N_PARAMS * 4  # projected: no .grad yet
    assert before["grad_materialized"] is False
    assert before["optimizer_bytes"] == 0
    assert before["optimizer_state_materialized"] is False

    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    after = account_networks({"actor": model}, {"actor": optimizer})["actor"]
    assert after["grad_bytes"] == N_PARAMS * 4 and after["grad_materialized"] is True
    assert after["optimizer_state_materialized"] is True
    assert after["optimizer_bytes"] == _state_bytes(optimizer)
    moments = sum(st[k].numel() * st[k].element_size() for st in optimizer.state.values()
                  for k in ("exp_avg", "exp_avg_sq"))
    assert moments == 2 * N_PARAMS * 4  # the dominant part: two fp32 moments per parameter
    # what is left is AdamW's per-parameter `step` counter (a scalar tensor in torch 2.x)
    assert after["optimizer_bytes"] - moments == sum(st["step"].numel() * st["step"].element_size()
                                                     for st in optimizer.state.values())


def test_frozen_reference_has_no_grad_or_optimizer_bytes() -> None:
    actor = _tiny()
    reference = copy.deepcopy(actor).requires_grad_(False)
    optimizer = torch.optim.AdamW(actor.parameters())
    actor(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    acc = account_networks({"actor": actor, "reference": reference}, {"actor": optimizer})
    ref = acc["reference"]
    assert ref["params"] == N_PARAMS and ref["trainable_params"] == 0
    assert ref["weight_bytes"] == N_PARAMS * 4
    assert ref["grad_bytes"] == 0 and ref["optimizer_bytes"] == 0
    assert ref["optimizer_state_materialized"] is True  # 0 is its true value
    assert acc["actor"]["optimizer_bytes"] == _state_bytes(optimizer)


def test_shared_parameters_are_counted_once() -> None:
    actor = _tiny()
    # same objects (the LoRA case: the reference is the policy's own base)
    acc = account_networks({"actor": actor, "reference": actor})
    assert acc["actor"]["params"] == N_PARAMS
    assert acc["reference"]["params"] == 0 and acc["reference"]["weight_bytes"] == 0
    assert acc["reference"]["shared_params"] == N_PARAMS
    # different Parameter objects over the same storage (same data_ptr)
    alias = nn.Linear(4, 8)
    alias.weight = nn.Parameter(actor[0].weight.data, requires_grad=False)
    acc = account_networks({"actor": actor, "reference": alias})
    assert acc["reference"]["params"] == 8  # only the bias is its own
    assert acc["reference"]["shared_params"] == 32


def test_lora_like_adapters_trainable_base_counted_once() -> None:
    class Lora(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base = _tiny().requires_grad_(False)
            self.a = nn.Linear(4, 1, bias=False)  # 4 trainable
            self.b = nn.Linear(1, 2, bias=False)  # 2 trainable

    policy = Lora()
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad])
    acc = account_networks({"actor": policy, "reference": policy.base}, {"actor": optimizer})
    assert acc["actor"]["params"] == N_PARAMS + 6
    assert acc["actor"]["trainable_params"] == 6
    assert acc["actor"]["grad_bytes"] == 6 * 4  # the frozen base has no gradient
    assert acc["reference"]["params"] == 0 and acc["reference"]["shared_params"] == N_PARAMS


# ---------------------------------------------------------------------------------------------
# memory sources with a fake NVML
# ---------------------------------------------------------------------------------------------
class _FakeNVMLError(Exception):
    pass


class _FakeLibraryNotFound(_FakeNVMLError):
    pass


def _fake_pynvml(state: dict, init_raises: bool = False) -> types.ModuleType:
    """A module with the pynvml functions the readers call; readings come from ``state``."""
    mod = types.ModuleType("pynvml")
    mod.NVMLError = _FakeNVMLError
    mod.NVMLError_LibraryNotFound = _FakeLibraryNotFound

    def nvmlInit() -> None:
        if init_raises:
            raise _FakeLibraryNotFound("NVML Shared Library Not Found")

    mod.nvmlInit = nvmlInit
    mod.nvmlShutdown = lambda: None
    mod.nvmlDeviceGetCount = lambda: 1
    mod.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=state["used"], total=80 * 2**30)
    mod.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in state["procs"]]
    mod.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []
    mod.nvmlSystemGetDriverVersion = lambda: "999.1"
    mod.nvmlDeviceGetName = lambda h: "Fake GPU"
    return mod


def test_nvml_process_tree_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        foreign = 2**22 + 12345  # above Linux's default pid_max, so never one of ours
        state = {"used": 10_000, "procs": [(os.getpid(), 300), (foreign, 7_000), (child.pid, 50)]}
        monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(state))
        readers = SampledReaders("cuda", children_refresh_s=0.0)
        assert readers.sources == [NVML_DEVICE, NVML_PROCESS, CPU_RSS]
        assert child.pid in readers.tree_pids()
        reading = readers.read()
        assert reading[NVML_DEVICE] == 10_000
        assert reading[NVML_PROCESS] == 350  # the foreign PID's 7000 is ignored
        assert reading[CPU_RSS] > 0
        # only foreign processes on the GPU (e.g. host PIDs seen from a container): absent, not 0
        state["procs"] = [(foreign, 7_000)]
        assert NVML_PROCESS not in readers.read()
        readers.close()
    finally:
        child.kill()
        child.wait()


def test_nvml_phase_peaks_with_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"used": 1_000, "procs": [(os.getpid(), 100)]}
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(state))
    with Telemetry("cuda", interval_s=0.005) as tel:
        tel.mark_baseline()
        with tel.phase("generation"):
            state["used"] = 5_000  # only the background thread can see this spike
            time.sleep(0.2)
            state["used"] = 1_000
        with tel.phase("reward"):
            state["used"] = 2_000  # seen by the synchronous reading at the phase's end
            state["procs"] = [(os.getpid(), 700)]
        state["used"] = 1_000
        state["procs"] = [(os.getpid(), 100)]
    mem = tel.summary()["memory"]
    assert mem["sources"] == [NVML_DEVICE, NVML_PROCESS, CPU_RSS]  # no torch CUDA on this machine
    assert mem["source"] == "cuda-allocated" and mem["peak_bytes"] is None  # absent, never torch's 0
    assert mem["baseline_by_source"][NVML_DEVICE] == 1_000
    assert mem["phases"]["generation"]["by_source"][NVML_DEVICE] == 5_000
    assert mem["phases"]["reward"]["by_source"][NVML_DEVICE] == 2_000
    assert mem["phases"]["reward"]["by_source"][NVML_PROCESS] == 700
    assert mem["by_source"][NVML_DEVICE] == 5_000


def test_nvml_init_failure_degrades_to_rss(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml({"used": 0, "procs": []}, init_raises=True))
    readers = SampledReaders("cuda")
    assert readers.sources == [CPU_RSS]
    assert "LibraryNotFound" in (readers.nvml_error or "")
    assert set(readers.read()) == {CPU_RSS}


def test_pynvml_missing_degrades_to_rss(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert SampledReaders("cuda").sources == [CPU_RSS]


def test_real_pynvml_on_this_machine() -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver; the degradation path is not reachable")
    readers = SampledReaders("cuda")
    assert readers.sources == [CPU_RSS]
    with Telemetry("cpu", interval_s=0.01) as tel:
        tel.mark_baseline()
        with tel.phase("update"):
            time.sleep(0.03)
    mem = tel.summary()["memory"]
    assert mem["source"] == CPU_RSS == primary_source("cpu")
    assert mem["sources"] == [CPU_RSS]
    assert mem["peak_bytes"] > 0 and mem["baseline_bytes"] > 0
    assert not any(src.startswith(("cuda", "nvml")) for src in mem["by_source"])


def test_sampler_peak_and_reset() -> None:
    class Scripted:
        values = iter(range(1, 10_000))
        sources = ["x"]

        def read(self) -> dict[str, int]:
            return {"x": next(self.values)}

    sampler = MemorySampler(Scripted(), interval_s=0.001)  # type: ignore[arg-type]
    with sampler:
        time.sleep(0.05)
    first = sampler.reset_peak()["x"]
    assert first >= 2 and sampler.peak() == {}
    assert sampler.sample_now()["x"] > first and sampler.peak()["x"] > first


def test_primary_source() -> None:
    assert primary_source("cuda") == primary_source("cuda:1") == "cuda-allocated"
    assert primary_source("cpu") == "cpu-rss"


# ---------------------------------------------------------------------------------------------
# tracker
# ---------------------------------------------------------------------------------------------
def test_nested_phases_are_exclusive_and_sum_to_wall_time() -> None:
    with Telemetry("cpu", interval_s=0.01, warmup_steps=0) as tel:
        tel.step_begin()
        with tel.phase("update"):
            time.sleep(0.05)
            with tel.phase("generation"):
                time.sleep(0.3)
                with tel.phase("reward"):
                    time.sleep(0.05)
        time.sleep(0.03)  # in the step, in no phase -> 'other'
        tel.step_end()
        with tel.phase("evaluation"):  # outside any step
            time.sleep(0.02)
    s = tel.summary()
    phases = s["phases"]
    assert set(phases) == {"update", "generation", "reward", "other", "evaluation"}
    assert all(p["count"] == 1 for p in phases.values())
    assert phases["generation"]["time_s"] >= 0.3
    assert phases["update"]["time_s"] >= 0.05
    assert phases["update"]["time_s"] < 0.25  # exclusive: the 0.35 s of nested phases is not in it
    assert phases["other"]["time_s"] >= 0.03
    in_step = sum(p["time_s"] for name, p in phases.items() if name != "evaluation")
    assert in_step == pytest.approx(s["step_times_s"][0], abs=1e-6)  # no double counting, no gaps
    assert sum(p["time_s"] for p in phases.values()) <= s["wall_s"] + 1e-6
    assert set(s["memory"]["phases"]) == set(phases)


def test_reentered_phase_counts_once_and_exceptions_close_phases() -> None:
    with Telemetry("cpu", interval_s=0.05) as tel:
        with tel.phase("generation"):
            with tel.phase("generation"):  # e.g. a hooked forward inside a wrapped generate
                time.sleep(0.01)
        with pytest.raises(RuntimeError):
            with tel.phase("update"):
                tel.begin_phase("reference")  # never closed: the error skips its end
                raise RuntimeError("boom")
        assert tel.active_phases() == ()
    phases = tel.summary()["phases"]
    assert phases["generation"]["count"] == 1
    assert phases["update"]["count"] == 1 and phases["reference"]["count"] == 1


def test_step_statistics_exclude_warmup() -> None:
    with Telemetry("cpu", interval_s=0.05, warmup_steps=2) as tel:
        for duration in (0.25, 0.25, 0.01, 0.01, 0.01, 0.01, 0.01):
            tel.step_begin()
            time.sleep(duration)
            tel.step_end()
    s = tel.summary()
    assert s["steps"] == 7 and len(s["step_times_s"]) == 7
    assert s["step_times_s"][0] >= 0.25
    assert s["step_s_median"] < 0.2 and s["step_s_p90"] < 0.2  # the two slow warmup steps are out
    assert s["phases"]["other"]["count"] == 7


def test_percentile_matches_linear_interpolation() -> None:
    values = [float(v) for v in range(1, 11)]
    assert _percentile(values, 90) == pytest.approx(9.1)
    assert _percentile(values, 50) == pytest.approx(5.5)
    assert _percentile([3.0], 90) == 3.0


def test_disabled_mode_records_only_wall_time_and_maxrss() -> None:
    with Telemetry("cpu", enabled=False) as tel:
        tel.mark_baseline()
        tel.step_begin()
        with tel.phase("update"):
            time.sleep(0.02)
        tel.step_end()
    s = tel.summary()
    assert s["enabled"] is False
    assert s["phases"] == {} and s["steps"] == 0 and s["step_s_median"] is None
    assert s["wall_s"] >= 0.02
    assert s["memory"]["source"] == CPU_MAXRSS and s["memory"]["peak_bytes"] > 0
    assert tel.phase("x") is tel.phase("y")  # one shared no-op context manager


# ---------------------------------------------------------------------------------------------
# the training window: setup vs training time, the post-load baseline, weight change
# ---------------------------------------------------------------------------------------------
def _fire(callback: object, event: str, **kwargs: object) -> None:
    """Call a TrainerCallback hook as the Trainer does: (args, state, control, **kwargs)."""
    getattr(callback, event)(None, None, None, **kwargs)


def test_setup_and_train_time_split_at_the_train_hooks() -> None:
    from bench.telemetry.tracker import TIMING_TRAIN_WINDOW

    with Telemetry("cpu", interval_s=0.01, warmup_steps=0) as tel:
        callback = tel.trainer_callback()
        tel.mark_recipe_start()
        time.sleep(0.15)  # "model loading, trainer construction"
        _fire(callback, "on_train_begin", model=_tiny())
        for _ in range(2):
            _fire(callback, "on_step_begin")
            time.sleep(0.1)
            _fire(callback, "on_step_end")
        _fire(callback, "on_train_end")
        time.sleep(0.1)  # e.g. saving the model after training
        tel.mark_recipe_end()
    timing = tel.summary()["timing"]
    assert timing["timing"] == TIMING_TRAIN_WINDOW
    assert timing["setup_s"] >= 0.15
    assert timing["train_s"] >= 0.2
    assert timing["train_s"] >= sum(tel.summary()["step_times_s"]) - 1e-6  # the steps lie inside the window
    assert timing["setup_s"] + timing["train_s"] + 0.1 <= timing["recipe_s"] + 1e-6  # the tail is neither


def test_a_recipe_without_train_hooks_is_timed_whole() -> None:
    from bench.telemetry.tracker import BASELINE_BEFORE_LOAD, TIMING_WHOLE_RECIPE

    with Telemetry("cpu", interval_s=0.01) as tel:
        tel.mark_baseline(BASELINE_BEFORE_LOAD)
        tel.mark_recipe_start()
        time.sleep(0.05)
        tel.mark_recipe_end()
    s = tel.summary()
    assert s["timing"]["timing"] == TIMING_WHOLE_RECIPE
    assert s["timing"]["setup_s"] is None
    assert s["timing"]["train_s"] == s["timing"]["recipe_s"] >= 0.05
    assert s["memory"]["baseline_at"] == BASELINE_BEFORE_LOAD


def test_baseline_is_read_at_on_train_begin_after_the_models_load(monkeypatch) -> None:
    """The resident set is scripted (the process's real RSS need not grow by an allocation: the allocator may hand
    back pages an earlier test left resident), so the test sees exactly which reading the baseline took."""
    import psutil

    from bench.telemetry.tracker import BASELINE_AFTER_LOAD, BASELINE_BEFORE_LOAD

    resident = {"bytes": 512 * 2**20}
    real = psutil.Process.memory_info
    monkeypatch.setattr(psutil.Process, "memory_info",  # children an earlier test left behind count 0
                        lambda self: real(self)._replace(rss=resident["bytes"] if self.pid == os.getpid() else 0))
    with Telemetry("cpu", interval_s=0.01) as tel:
        before = tel.mark_baseline(BASELINE_BEFORE_LOAD)[CPU_RSS]
        tel.mark_recipe_start()
        resident["bytes"] += 64 * 2**20  # the models load
        _fire(tel.trainer_callback(), "on_train_begin", model=_tiny())
        resident["bytes"] += 256 * 2**20  # training allocates: after the baseline, so not in it
        tel.mark_recipe_end()
    memory = tel.summary()["memory"]
    assert before == 512 * 2**20
    assert memory["baseline_at"] == BASELINE_AFTER_LOAD
    assert memory["baseline_bytes"] == before + 64 * 2**20  # the loaded weights are in the baseline, training not


def test_only_the_first_train_begin_counts() -> None:
    with Telemetry("cpu", interval_s=0.01) as tel:
        callback = tel.trainer_callback()
        tel.mark_recipe_start()
        _fire(callback, "on_train_begin", model=_tiny())
        time.sleep(0.1)
        _fire(callback, "on_train_end")
        _fire(callback, "on_train_begin", model=_tiny())  # a second trainer in the same recipe
        time.sleep(0.05)
        _fire(callback, "on_train_end")
        tel.mark_recipe_end()
    assert tel.summary()["timing"]["train_s"] >= 0.15  # first begin to last end


def test_training_change_through_the_callback() -> None:
    model = _tiny()
    with Telemetry("cpu", interval_s=0.01, track_training_change=True) as tel:
        callback = tel.trainer_callback()
        tel.mark_recipe_start()
        _fire(callback, "on_train_begin", model=model)
        with torch.no_grad():
            model[1].weight.add_(0.5)  # 16 of 58 elements move
        _fire(callback, "on_train_end")  # no model: the one snapshotted at on_train_begin is compared
        tel.mark_recipe_end()
    change = tel.training_change()
    assert change["params_changed_fraction"] == pytest.approx(16 / N_PARAMS)
    assert change["trainable_params"] == N_PARAMS and change["method"] == "exact"


def test_training_change_says_why_it_is_missing() -> None:
    with Telemetry("cpu", track_training_change=True) as tel:
        _fire(tel.trainer_callback(), "on_train_begin")  # an engine that passes no model
        _fire(tel.trainer_callback(), "on_train_end")
    change = tel.training_change()
    assert change["params_changed_fraction"] is None and "no model" in change["reason"]
    untracked = Telemetry("cpu")
    assert untracked.training_change()["reason"] == "not tracked for this run"


def test_timing_is_recorded_with_telemetry_disabled() -> None:
    """The overhead benchmark compares train_s with telemetry off and on: both must have one."""
    with Telemetry("cpu", enabled=False) as tel:
        tel.mark_recipe_start()
        _fire(tel.trainer_callback(), "on_train_begin", model=_tiny())
        time.sleep(0.02)
        _fire(tel.trainer_callback(), "on_train_end")
        tel.mark_recipe_end()
    assert tel.summary()["timing"]["train_s"] >= 0.02


def test_memory_readings_are_labelled_peak_or_high_water_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"used": 1_000, "procs": [(os.getpid(), 100)]}
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(state))
    with Telemetry("cuda", interval_s=0.01) as tel:
        with tel.phase("generation"):
            pass
    memory = tel.summary()["memory"]
    phase = memory["phases"]["generation"]
    assert memory["kind"] == phase["kind"] == "peak (reset per phase)"  # cuda-allocated, the headline source
    assert phase["kinds"][NVML_DEVICE] == phase["kinds"][NVML_PROCESS] == "high-water mark"
    assert phase["kinds"][CPU_RSS] == "sampled peak (reset per phase)"
    assert set(phase["kinds"]) == set(phase["by_source"])  # every reading carries its kind


def test_capture_environment_fields() -> None:
    env = capture_environment()
    for key in ("os", "python", "cpu_model", "cpu_count_logical", "ram_bytes", "gpu_count", "driver_version",
                "cuda_version", "git_commit", "git_dirty", "time_utc"):
        assert key in env
    assert env["packages"]["torch"] and env["packages"]["trl"]
    from bench import __version__

    assert env["suite_version"] == __version__  # the suite that made the numbers, for "Cite this run"
    assert "hostname" not in env and "node" not in env
    if not torch.cuda.is_available():
        assert env["gpu_count"] == 0 and env["gpu_name"] is None


# ---------------------------------------------------------------------------------------------
# TRL integration
# ---------------------------------------------------------------------------------------------
def test_count_generated_tokens_stops_at_first_eos() -> None:
    eos, pad = 2, 0
    seqs = torch.tensor([
        [0, 5, 6, 7, 2, 0, 0],  # prompt (3) + 7,2 -> 2 tokens (EOS included, pads after it not)
        [0, 5, 6, 8, 9, 9, 9],  # no EOS -> all 4 new tokens
        [0, 5, 6, 2, 2, 2, 2],  # EOS first -> 1
    ])
    assert count_generated_tokens(seqs, 3, [eos], pad) == (3, 7)
    assert count_generated_tokens(seqs, 3, [], pad) == (3, 10)


def _tiny_model_dir(root: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    words = "what is one two three four five plus minus times answer the".split()
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<unk>", "<eos>", *words, *map(str, range(10))])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, eos_token_id=2, bos_token_id=None, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    path = root / "tiny-qwen2"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_grpo_trainer_instrumented(tmp_path: Path) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    path = _tiny_model_dir(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)  # from a path, so TRL can load the reference too
    prompts = [f"what is {a} plus {b}" for a, b in [("1", "2"), ("3", "4"), ("5", "6"), ("7", "8")]]
    dataset = Dataset.from_dict({"prompt": prompts})

    def length_reward(completions: list[str], **kwargs: object) -> list[float]:
        return [float(len(c)) / 10.0 for c in completions]

    args = GRPOConfig(output_dir=str(tmp_path / "out"), bf16=False, use_cpu=True, report_to=[], loss_type="grpo",
                      beta=0.04, num_generations=4, per_device_train_batch_size=8, max_completion_length=8,
                      logging_steps=1, save_strategy="no", max_steps=2, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[length_reward], args=args, train_dataset=dataset,
                          processing_class=tokenizer)
    assert trainer.ref_model is not None

    with Telemetry("cpu", interval_s=0.01, warmup_steps=0, track_training_change=True) as tel:
        instrument_trl_trainer(trainer, tel)
        instrument_trl_trainer(trainer, tel)  # idempotent
        tel.mark_recipe_start()
        trainer.train()
        tel.mark_recipe_end()
    s = tel.summary()
    # the Trainer fires on_train_begin / on_train_end with its model: the window and the snapshot attach
    assert s["timing"]["timing"] == "first on_train_begin to last on_train_end"
    assert s["timing"]["setup_s"] >= 0 and s["timing"]["train_s"] >= sum(s["step_times_s"]) - 1e-6
    assert s["memory"]["baseline_at"] == "on_train_begin (models loaded)"
    change = tel.training_change()
    assert change["trainable_params"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert 0 < change["params_changed_fraction"] <= 1 and change["update_to_weight_ratio"] > 0

    phases = s["phases"]
    for name in ("generation", "reward", "reference", "update"):
        assert phases[name]["count"] > 0 and phases[name]["time_s"] > 0, name
    assert s["steps"] == 2
    step_total = sum(s["step_times_s"])
    phase_total = sum(p["time_s"] for p in phases.values())
    assert abs(phase_total - step_total) <= 0.1 * step_total, (phases, step_total)
    # the named phases, not the 'other' remainder, explain most of a step
    assert phases["other"]["time_s"] < 0.5 * step_total, phases
    # 2 steps x 8 completions, each 1..8 new tokens
    assert s["counters"]["completions"] == 16
    assert 16 <= s["counters"]["generated_tokens"] <= 16 * 8
    assert trainer.reward_funcs[0].__name__ == "length_reward"
    assert any("rewards/length_reward/mean" in row for row in trainer.state.log_history)
    assert s["memory"]["source"] == "cpu-rss" and s["memory"]["peak_bytes"] >= s["memory"]["baseline_bytes"]
    assert {"generation", "update"} <= set(s["memory"]["phases"])


def test_requires_grad_network_outside_every_optimizer_counts_as_frozen() -> None:
    """TRL leaves requires_grad on for its reference copy; it is never updated, so no grad/optimizer bytes."""
    import torch
    from torch import nn

    from bench.telemetry import account_networks

    actor, reference = nn.Linear(4, 3), nn.Linear(4, 3)
    assert all(p.requires_grad for p in reference.parameters())
    optimizer = torch.optim.AdamW(actor.parameters())
    actor(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    result = account_networks({"actor": actor, "reference": reference}, {"actor": optimizer})
    assert result["reference"]["grad_bytes"] == 0 and result["reference"]["trainable_params"] == 0
    assert result["reference"]["optimizer_bytes"] == 0
    assert result["actor"]["grad_bytes"] == 15 * 4 and result["actor"]["trainable_params"] == 15
    assert result["actor"]["optimizer_bytes"] >= 2 * 15 * 4


def test_trained_tokens_follow_each_trl_batch_layout() -> None:
    import torch

    from bench.telemetry.trl_hooks import trained_tokens_in

    sft_or_dpo = {"input_ids": torch.ones(2, 4), "attention_mask": torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])}
    assert trained_tokens_in(sft_or_dpo) == 7
    grpo = {"prompt_mask": torch.tensor([[0, 1], [1, 1]]), "completion_mask": torch.tensor([[1, 1, 0], [1, 0, 0]])}
    assert trained_tokens_in(grpo) == 3 + 3
    assert trained_tokens_in({"pixel_values": torch.ones(1)}) == 0
    assert trained_tokens_in(None) == 0


def test_the_weight_snapshot_is_the_instruments_own_line_not_the_methods_memory() -> None:
    """The exact snapshot (one host copy of the trainable weights) is the suite's instrument,
    which a plain TRL run does not hold: its bytes are recorded on their own and taken out of every host reading
    after it (run peak and phase peaks); a run without a snapshot reads as before."""
    model = torch.nn.Linear(2048, 2048, bias=False)  # 4.19M fp32 elements: a 16 MiB snapshot
    size = 2048 * 2048 * 4
    with Telemetry("cpu", interval_s=0.005, track_training_change=True) as tel:
        callback = tel.trainer_callback()
        tel.mark_recipe_start()
        _fire(callback, "on_train_begin", model=model)
        with tel.phase("update"):
            time.sleep(0.05)
        _fire(callback, "on_train_end")
        tel.mark_recipe_end()
    memory = tel.summary()["memory"]
    instrument = memory["instrument"]
    assert instrument["param_snapshot_bytes"] == size and instrument["where"] == "host"
    assert instrument["excluded_from"] == ["cpu-rss"]
    raw = instrument["with_instrument"]["cpu-rss"]
    baseline = memory["baseline_bytes"]
    expected = max(baseline, raw - size)  # the snapshot may reuse memory the process held: never below the baseline
    assert memory["peak_bytes"] == expected and memory["by_source"]["cpu-rss"] == expected
    assert memory["phases"]["update"]["peak_bytes"] == memory["phases"]["update"]["by_source"]["cpu-rss"]
    assert baseline <= memory["phases"]["update"]["peak_bytes"] <= expected
    with Telemetry("cpu", interval_s=0.005) as plain:
        with plain.phase("update"):
            pass
    assert plain.summary()["memory"]["instrument"] is None


def test_a_snapshot_larger_than_the_growth_it_caused_leaves_the_peak_at_the_baseline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot the allocator placed in memory the process already held added less than its bytes to the
    resident set: taking all its bytes out must not put the method's peak below what it held with its models
    loaded (a TRL GRPO run measured a peak 78 KB under its baseline before this floor)."""
    model = torch.nn.Linear(16, 16, bias=False)
    with Telemetry("cpu", interval_s=0.005, track_training_change=True) as tel:
        callback = tel.trainer_callback()
        tel.mark_recipe_start()
        _fire(callback, "on_train_begin", model=model)
        with tel.phase("update"):
            time.sleep(0.02)
        _fire(callback, "on_train_end")
        tel.mark_recipe_end()
    huge = 1 << 40  # far more than any reading: every reading would go negative without the floor
    monkeypatch.setattr(type(tel._snapshot), "host_bytes", property(lambda self: huge))
    memory = tel.summary()["memory"]
    assert memory["instrument"]["param_snapshot_bytes"] == huge
    assert memory["peak_bytes"] == memory["baseline_bytes"] > 0
    assert memory["phases"]["update"]["peak_bytes"] == memory["baseline_bytes"]
