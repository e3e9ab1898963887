"""DeepSpeed plumbing without DeepSpeed (bench.execution.launch): choosing a ZeRO config is checked before anything
runs, and a run under one records what actually ran.

- DeepSpeed missing (or installed but not importing): one line naming the fix, the optional extra;
- an accelerate config that does not exist, is not YAML, or names an unknown or invalid ZeRO stage (inline, or in
  the DeepSpeed JSON it points to): one line, exit 2;
- a DeepSpeed config on a CPU spec: refused (DeepSpeed is for GPU machines here);
- under a ZeRO config (stage 1-3) TRL's GRPO and DPO and the suite engine's methods record the config's strategy;
  under stage 0 the engine records ``ddp`` with a note, so the report's "what differs" shows the difference;
- ``BENCH_DEEPSPEED_ON_CPU=1`` (experiments only) lets a DeepSpeed config through on a CPU spec.

A stand-in ``deepspeed`` package on PYTHONPATH plays "installed" (importing or failing to import).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from bench_cli import run_bench
from spec_errors import spec_error

from bench.execution import launch
from bench.config import launcher
from bench.errors import SpecError
from bench.config.loading import load_spec

ZERO_CONFIGS = ("zero2", "zero3", "zero3_offload")
LAUNCHED = ["launcher.name=accelerate", "launcher.num_processes=2"]


def _config(tmp_path: Path, text: str, name: str = "mine.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _deepspeed_yaml(block: str) -> str:
    return f"distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n{block}"


@pytest.fixture
def stand_in_deepspeed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install a stand-in ``deepspeed`` whose import runs ``body``, for this process and its children."""

    def install(body: str) -> None:
        package = tmp_path / "site" / "deepspeed"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(body, encoding="utf-8")
        monkeypatch.syspath_prepend(str(package.parent))
        monkeypatch.setenv("PYTHONPATH", str(package.parent))
        monkeypatch.setenv(launcher.DEEPSPEED_OK_ENV, "")  # no earlier check counts (and the value is restored)

    return install


# -- DeepSpeed missing or broken ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ZERO_CONFIGS)
def test_a_zero_config_without_deepspeed_names_the_extra(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "deepspeed_problem", lambda: "is not installed")
    message = spec_error([*LAUNCHED, f"launcher.config_file={launcher.shipped_config(name)}"])
    assert "is a DeepSpeed config but DeepSpeed is not installed" in message
    assert "pip install '.[deepspeed]'" in message and str(launcher.shipped_config("ddp")) in message


def test_the_command_line_stops_with_one_line_and_exit_2_when_deepspeed_does_not_import() -> None:
    """The real interpreter of this suite has no DeepSpeed (or a broken one): either way, the fix is named."""
    proc = run_bench("run", "--preset", "cpu-quick", "--launcher", "accelerate", "--num-processes", "2",
                     "--accelerate-config", str(launcher.shipped_config("zero2")), "--dry-run")
    if launcher.deepspeed_problem() is None:
        pytest.skip("DeepSpeed imports in this environment")  # then the CPU refusal below applies instead
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("bench: error: 'launcher.config_file'") and "pip install '.[deepspeed]'" in last


def test_a_deepspeed_that_does_not_import_is_named_with_its_error(stand_in_deepspeed) -> None:
    stand_in_deepspeed("raise ImportError('libcudart.so.12: cannot open shared object file')\n")
    assert launcher.deepspeed_problem() == ("is installed but does not import (ImportError: libcudart.so.12: cannot "
                                          "open shared object file)")
    message = spec_error([*LAUNCHED, f"launcher.config_file={launcher.shipped_config('zero3')}"])
    assert "DeepSpeed is installed but does not import (ImportError: libcudart.so.12" in message
    assert "pip install '.[deepspeed]'" in message


def test_with_deepspeed_importing_a_cpu_spec_is_still_refused_and_a_gpu_spec_passes(
        stand_in_deepspeed, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_deepspeed("__version__ = '0.0.0'\n")
    assert launcher.deepspeed_problem() is None
    # once it imported, the workers (which inherit the environment) do not import it again to check
    import os
    import subprocess

    assert os.environ[launcher.DEEPSPEED_OK_ENV] == sys.executable
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("DeepSpeed's import was checked again"))
    assert launcher.deepspeed_problem() is None
    message = spec_error([*LAUNCHED, f"launcher.config_file={launcher.shipped_config('zero2')}"])
    assert "is a DeepSpeed config, which needs GPUs" in message
    zero2 = launcher.shipped_config("zero2")
    launcher.check_config(launcher.read_config(zero2), zero2, "cuda")  # no error: installed, on a GPU


# -- the config file ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("distributed_type: [unclosed\n", "is not valid YAML (ParserError); fix its syntax"),
    ("- a list\n", "must be a YAML mapping (an accelerate config)"),
    ("distributed_type: FSDP\n", "distributed_type 'FSDP' is not supported by the suite"),
    ("distributed_type: DEEPSPEED\n", "a DEEPSPEED config needs a deepspeed_config mapping with zero_stage"),
    (_deepspeed_yaml("  offload_optimizer_device: none\n"), "zero_stage must be 0, 1, 2 or 3, got None"),
    (_deepspeed_yaml("  zero_stage: 4\n"), "zero_stage must be 0, 1, 2 or 3, got 4"),
    (_deepspeed_yaml("  zero_stage: -1\n"), "zero_stage must be 0, 1, 2 or 3, got -1"),
    (_deepspeed_yaml("  zero_stage: true\n"), "zero_stage must be 0, 1, 2 or 3, got True"),
    (_deepspeed_yaml("  zero_stage: two\n"), "zero_stage must be 0, 1, 2 or 3, got 'two'"),
    (_deepspeed_yaml("  zero_stage: 2\n  offload_optimizer_device: gpu\n"),
     "offload_optimizer_device must be one of none, cpu, nvme, got 'gpu'"),
    (_deepspeed_yaml("  zero_stage: 2\n  offload_param_device: cpu\n"), "offload_param_device needs zero_stage 3"),
])
def test_a_bad_config_file_is_one_line(tmp_path: Path, text: str, expected: str) -> None:
    path = _config(tmp_path, text)
    message = spec_error([*LAUNCHED, f"launcher.config_file={path}"])
    assert message.startswith(f"'launcher.config_file' '{path}'") and expected in message


def test_a_missing_config_file_is_one_line(tmp_path: Path) -> None:
    """(The command line turns this SpecError into exit 2 like the DeepSpeed one above.)"""
    missing = tmp_path / "nowhere.yaml"
    assert spec_error([*LAUNCHED, f"launcher.config_file={missing}"]) == (
        f"'launcher.config_file' '{missing}' does not exist; give an accelerate config file, e.g. "
        f"{launcher.shipped_config('ddp')}")


@pytest.mark.parametrize("ds_json, expected", [
    (None, "deepspeed_config_file '{json}' does not exist"),
    ("{not json", "deepspeed_config_file '{json}' is not valid JSON (JSONDecodeError)"),
    ('{"zero_optimization": {"stage": 4}}', "zero_stage must be 0, 1, 2 or 3, got 4"),
    ('{"zero_optimization": [3]}', "zero_optimization must be a mapping"),
    ('{"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}',
     "offload_param_device needs zero_stage 3"),
])
def test_the_deepspeed_json_a_config_names_is_checked(tmp_path: Path, ds_json: str | None, expected: str) -> None:
    json_path = tmp_path / "ds.json"
    if ds_json is not None:
        json_path.write_text(ds_json, encoding="utf-8")
    path = _config(tmp_path, _deepspeed_yaml(f"  deepspeed_config_file: {json_path}\n"))
    message = spec_error([*LAUNCHED, f"launcher.config_file={path}"])
    assert expected.format(json=json_path) in message


def test_the_stage_and_offload_come_from_the_deepspeed_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative deepspeed_config_file is read from the current folder, where accelerate reads it."""
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "none"}}}), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    path = _config(tmp_path, _deepspeed_yaml("  deepspeed_config_file: ds.json\n"))
    data = launcher.read_config(path)
    assert launcher.deepspeed_settings(data, path) == {
        "zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "none"}
    assert launcher.config_strategy(data, path) == "deepspeed-zero3-offload"


@pytest.mark.parametrize("name, strategy", [("ddp", "ddp"), ("zero2", "deepspeed-zero2"),
                                            ("zero3", "deepspeed-zero3"), ("zero3_offload", "deepspeed-zero3-offload")])
def test_each_shipped_config_names_its_strategy(name: str, strategy: str) -> None:
    path = launcher.shipped_config(name)
    assert launcher.config_strategy(launcher.read_config(path), path) == strategy


# -- what a run under a ZeRO config records -----------------------------------------------------------------
def test_under_a_zero_config_the_engine_and_trl_record_the_config() -> None:
    """TRL's trainers get DeepSpeed from accelerate; the engine hands its trained networks to deepspeed.initialize
    under stages 1-3 (the run itself: test_engine_deepspeed.py): both record the config's strategy, the engine with
    where its frozen networks are and, under ZeRO-3, how it generates."""
    spec = load_spec("cpu-quick", LAUNCHED)  # a GPU machine's spec, minus the checks a CPU spec fails
    spec.launcher.config_file = str(launcher.shipped_config("zero2"))
    for method in ("grpo", "dpo"):
        parallel = launch.parallel_settings(spec, method)
        assert (parallel["strategy"], parallel["config_strategy"]) == ("deepspeed-zero2", "deepspeed-zero2")
        assert "note" not in parallel and "frozen_networks" not in parallel and parallel["processes"] == 2
    for method in ("grpo_engine", "ppo", "ppo_verifier", "control"):
        parallel = launch.parallel_settings(spec, method)
        assert (parallel["strategy"], parallel["config_strategy"]) == ("deepspeed-zero2", "deepspeed-zero2")
        assert "note" not in parallel and "generation" not in parallel
        assert parallel["frozen_networks"].startswith("replicated")
    spec.launcher.config_file = str(launcher.shipped_config("zero3"))
    parallel = launch.parallel_settings(spec, "ppo")
    assert parallel["strategy"] == "deepspeed-zero3" and "gather" in parallel["generation"]
    spec.launcher.config_file = None  # the default ddp.yaml: every method ran what it was asked for
    assert {launch.parallel_settings(spec, m)["strategy"] for m in ("grpo", "dpo", "grpo_engine")} == {"ddp"}
    assert "note" not in launch.parallel_settings(spec, "grpo_engine")
    assert launcher.engine_zero(spec) is None


def test_under_zero_stage_0_the_engine_runs_ddp_and_says_so(tmp_path: Path) -> None:
    spec = load_spec("cpu-quick", LAUNCHED)
    spec.launcher.config_file = str(_config(tmp_path, _deepspeed_yaml("  zero_stage: 0\n")))
    assert launcher.engine_zero(spec) is None
    parallel = launch.parallel_settings(spec, "grpo_engine")
    assert (parallel["strategy"], parallel["config_strategy"]) == ("ddp", "deepspeed-zero0")
    assert parallel["note"].startswith("the config asks for deepspeed-zero0; the suite engine does not shard")
    assert launch.parallel_settings(spec, "grpo")["strategy"] == "deepspeed-zero0"


def test_the_cpu_escape_lets_a_deepspeed_config_through_only_when_set(stand_in_deepspeed,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_deepspeed("__version__ = '0.0.0'\n")
    zero3 = launcher.shipped_config("zero3")
    for value in ("", "0", "yes"):
        monkeypatch.setenv(launcher.DEEPSPEED_ON_CPU_ENV, value)
        with pytest.raises(SpecError, match="needs GPUs"):
            launcher.check_config(launcher.read_config(zero3), zero3, "cpu")
    monkeypatch.setenv(launcher.DEEPSPEED_ON_CPU_ENV, "1")
    launcher.check_config(launcher.read_config(zero3), zero3, "cpu")  # no error: the experiment escape


def test_the_environment_block_records_the_deepspeed_version() -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed: str | None = version("deepspeed")
    except PackageNotFoundError:
        installed = None
    environment = launch.launcher_environment(load_spec("cpu-quick", LAUNCHED))
    assert environment["deepspeed"] == installed and environment["deepspeed_installed"] is (installed is not None)
    assert environment["config"]["distributed_type"] == "MULTI_GPU"
