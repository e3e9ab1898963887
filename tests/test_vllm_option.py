"""Optional fast generation for TRL's GRPO (issue 14): methods.grpo.generation_backend = vllm.

vLLM is not installed here (and must never be required): the import check is mocked where a test needs it. What is
checked: the spec keys and their one-line errors, the GRPOConfig fields they become, the preflight check for a
device that resolves to the CPU, and how the report shows the backend and vLLM's preallocated memory.
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
from bench.execution import preflight
from bench.execution.context import RunContext
from bench.errors import UserError
from bench.report import build_report, load_suite, ranks, tables
from bench.config.loading import load_spec

GIB = 1024**3
VLLM = ["device=auto", "methods.grpo.generation_backend=vllm"]


@pytest.fixture
def vllm_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpo, "vllm_installed", lambda: True)


def _config(spec: Any, tmp_path: Path) -> Any:
    ctx = RunContext(spec=spec, method="grpo", method_spec=spec.methods["grpo"], seed=0, run_dir=tmp_path,
                     device="cpu", init_model_dir=None, train_rows=[], telemetry=None, progress=lambda *a: None)
    return grpo.grpo_config(ctx)


# -- the spec ------------------------------------------------------------------------------------------------
def test_off_by_default_and_vllm_is_not_needed(tmp_path: Path) -> None:
    spec = load_spec("cpu-quick")
    cfg = spec.methods["grpo"]
    assert (cfg.generation_backend, cfg.vllm_gpu_memory_utilization) == ("transformers", 0.3)
    config = _config(spec, tmp_path)
    assert config.use_vllm is False
    assert config.generation_kwargs["no_repeat_ngram_size"] == 0  # transformers' neutral pins as before
    assert grpo.backend_settings(config) == {"generation_backend": "transformers"}


@pytest.mark.parametrize("overrides, expected", [
    (["methods.grpo.generation_backend=vlm"],
     "'methods.grpo.generation_backend' must be one of 'transformers', 'vllm', got 'vlm' (did you mean 'vllm'?)"),
    (["methods.grpo.vllm_gpu_memory_utilization=0"],
     "'methods.grpo.vllm_gpu_memory_utilization' must be in (0, 1], got 0.0"),
    (["methods.grpo.vllm_gpu_memory_utilization=1.2"],
     "'methods.grpo.vllm_gpu_memory_utilization' must be in (0, 1], got 1.2"),
    (["device=cpu", "methods.grpo.generation_backend=vllm"],
     "'methods.grpo.generation_backend' is 'vllm' but device is 'cpu': vLLM generates on a GPU; use "
     "methods.grpo.generation_backend=transformers on a CPU"),
])
def test_bad_values_are_one_line(overrides: list[str], expected: str, vllm_present: None) -> None:
    assert spec_error(overrides) == expected


def test_vllm_requested_but_not_installed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpo, "vllm_installed", lambda: False)
    assert spec_error(VLLM) == ("'methods.grpo.generation_backend' is 'vllm' but vLLM is not installed; pip install "
                            "'.[vllm]' (on a GPU machine), or use methods.grpo.generation_backend=transformers")


def test_utilization_is_checked_even_when_vllm_is_off() -> None:
    """A preset may keep the setting for later; a value outside (0, 1] is still a mistake worth naming."""
    assert "must be in (0, 1]" in spec_error(["methods.grpo.vllm_gpu_memory_utilization=-0.5"])


def test_cli_refuses_vllm_on_this_cpu_machine_with_exit_2() -> None:
    proc = run_bench("run", "--preset", "cpu-quick", "--dry-run", "methods.grpo.generation_backend=vllm")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("bench: error: 'methods.grpo.generation_backend' is 'vllm' but "), last


def test_device_auto_without_a_gpu_is_refused_before_the_run(vllm_present: None) -> None:
    spec = load_spec("cpu-quick", VLLM)
    with pytest.raises(UserError, match="has no CUDA GPU .* set methods.grpo.generation_backend=transformers"):
        preflight.check_generation_backend(spec, cuda_available=False)
    preflight.check_generation_backend(spec, cuda_available=True)
    preflight.check_generation_backend(load_spec("cpu-quick", ["device=auto"]), cuda_available=False)


# -- GRPOConfig --------------------------------------------------------------------------------------------
def test_vllm_becomes_trl_colocate_fields(tmp_path: Path, vllm_present: None) -> None:
    spec = load_spec("cpu-quick", [*VLLM, "methods.grpo.vllm_gpu_memory_utilization=0.45",
                                   "generation.min_new_tokens=3"])
    config = _config(spec, tmp_path)
    assert (config.use_vllm, config.vllm_mode, config.vllm_gpu_memory_utilization) == (True, "colocate", 0.45)
    # vLLM's SamplingParams get vLLM's spelling of the minimum length, none of transformers' pins
    assert config.generation_kwargs == {"min_tokens": 3}
    # the matched sampling settings TRL hands vLLM itself
    gen = spec.generation
    assert (config.temperature, config.top_p, config.top_k, config.max_completion_length) == (
        gen.temperature, gen.top_p, gen.top_k, gen.max_new_tokens)
    settings = grpo.backend_settings(config)
    assert settings["generation_backend"] == "vllm"
    assert settings["vllm"]["mode"] == "colocate" and settings["vllm"]["gpu_memory_utilization"] == 0.45
    assert settings["vllm"]["importance_sampling_correction"] is True  # TRL's default, recorded
    assert grpo.describe(spec, spec.methods["grpo"])["generation"].startswith("vllm (colocate")


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
