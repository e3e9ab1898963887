"""Pre-flight checks of `bench run`, GPU pinning of workers, and run_all.sh's driver -> torch index mapping.

Nothing here reaches the network: the hub is switched off, or its one metadata request is replaced.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.execution import preflight as pf
from bench.errors import SpecError, UserError
from bench.execution.processes import worker_env
from bench.config.loading import load_spec

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(sys.executable).parent / "bench"


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


needs_no_gpu = pytest.mark.skipif(_cuda_available(), reason="checks the message given on a machine without a GPU")


def _offline_env(tmp_path: Path) -> dict[str, str]:
    """The user's environment with the hub off and an empty Hugging Face cache of its own."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HOME=str(tmp_path / "hf-home"))
    env.pop("HF_HUB_CACHE", None)
    env.pop("HF_DATASETS_CACHE", None)
    return env


def _bench_run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run([str(BENCH), "run", *args], capture_output=True, text=True, env=_offline_env(tmp_path),
                          cwd=tmp_path, timeout=60)
    return proc, time.monotonic() - start


def _assert_one_error_line(proc: subprocess.CompletedProcess) -> str:
    """Exit 2; stderr is exactly one `bench: error:` line, which is returned: the checks run before the plan is
    printed, so a failed one is alone on the console."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench: error: "), proc.stderr[-2000:]
    return lines[0]


def _model_folder(tmp_path: Path, config: bool = True, tokenizer: bool = True) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    if config:
        (folder / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    return folder


# ----------------------------------------------------------------------------------------------
# Device


@needs_no_gpu
def test_the_gpu_preset_on_a_cpu_machine_names_the_way_out(tmp_path: Path) -> None:
    spec = load_spec("gsm8k-qwen0.5b")
    assert spec.device == "cuda"
    with pytest.raises(UserError) as info:
        pf.preflight(spec, tmp_path / "out")
    message = str(info.value)
    assert "'gsm8k-qwen0.5b' needs an NVIDIA GPU" in message
    assert "--preset cpu-tiny" in message and "device=cpu" in message
    assert "\n" not in message
    assert not (tmp_path / "out").exists()


SLOW_START_S = 40
"""Start-up (imports, spec, preflight) on a busy 2-core machine stays far below this; a hub retry loop would not."""


@needs_no_gpu
def test_bench_run_of_the_gpu_preset_stops_in_seconds_with_one_line(tmp_path: Path) -> None:
    proc, seconds = _bench_run(tmp_path, "--preset", "gsm8k-qwen0.5b", "--out", str(tmp_path / "out"))
    line = _assert_one_error_line(proc)
    # The device check runs before anything touches the network, so no hub retry loop (52 s before this check
    # existed) can delay it. The bound is loose on purpose: these machines are shared, the time goes in notes.
    assert seconds < SLOW_START_S
    assert "needs an NVIDIA GPU" in line and "device=cpu" in line
    assert not (tmp_path / "out").exists()


def test_device_messages_tell_a_cpu_torch_from_a_missing_gpu() -> None:
    assert pf.device_problem("p", True, "2.13.0", "12.4", True) is None
    cpu_build = pf.device_problem("p", False, "2.13.0+cpu", None, smi_works=True)
    assert cpu_build is not None and "CPU-only build" in cpu_build and "BENCH_TORCH_INDEX" in cpu_build
    assert "run_all.sh" in cpu_build
    old_driver = pf.device_problem("p", False, "2.13.0", "13.0", smi_works=True)
    assert old_driver is not None and "CUDA 13.0" in old_driver and "BENCH_TORCH_INDEX" in old_driver
    no_gpu = pf.device_problem("p", False, "2.13.0", "12.4", smi_works=False)
    assert no_gpu is not None and "'p' needs an NVIDIA GPU" in no_gpu


def test_cpu_and_auto_devices_need_no_gpu() -> None:
    for device in ("cpu", "auto"):
        pf.check_device(load_spec("gsm8k-qwen0.5b", [f"device={device}"]))


def test_dry_run_skips_the_checks(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.cli import main

    assert main(["run", "--preset", "gsm8k-qwen0.5b", "--dry-run"]) == 0


# ----------------------------------------------------------------------------------------------
# Output folder


def test_an_unwritable_out_is_one_line_naming_out(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = blocker / "suite"
    proc, _ = _bench_run(tmp_path, "--preset", "cpu-quick", "--out", str(out))
    line = _assert_one_error_line(proc)
    assert "--out" in line and str(out) in line


def test_the_output_check_leaves_nothing_behind(tmp_path: Path) -> None:
    pf.check_output_dir(tmp_path / "a" / "b" / "c")
    assert list(tmp_path.iterdir()) == []
    existing = tmp_path / "existing"
    existing.mkdir()
    pf.check_output_dir(existing)
    assert existing.is_dir() and list(existing.iterdir()) == []


# ----------------------------------------------------------------------------------------------
# Model and data


def test_an_unreachable_hub_model_names_model_source_path(tmp_path: Path) -> None:
    # The GPU preset tried on a CPU, with HF generate (its own backend, vLLM, is not installed here).
    overrides = ["model.source=hub", "model.name_or_path=nobody/nothing", "device=cpu",
                 "generation.backend=transformers"]
    proc, seconds = _bench_run(tmp_path, "--preset", "gsm8k-qwen0.5b", *overrides, "--out", str(tmp_path / "o"))
    line = _assert_one_error_line(proc)
    assert "'nobody/nothing'" in line and "model.source=path model.name_or_path=" in line
    assert seconds < SLOW_START_S


@pytest.fixture
def empty_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the hub and datasets caches at empty folders (the libraries read these at call time)."""
    from datasets import config as datasets_config
    from huggingface_hub import constants

    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(datasets_config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
    return cache


def _fake_cached_repo(cache: Path, folder: str, filename: str) -> None:
    """The hub cache layout: refs/main names a snapshot that holds the file."""
    repo = cache / folder
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / filename).write_text("{}")


def test_a_hub_model_in_the_local_cache_passes_offline(empty_hub_cache: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = load_spec("gsm8k-qwen0.5b", ["model.name_or_path=nobody/cached", "device=cpu"])
    with pytest.raises(UserError, match="not in the local Hugging Face cache"):
        pf.check_hub_model(spec)
    _fake_cached_repo(empty_hub_cache, "models--nobody--cached", "config.json")
    pf.check_hub_model(spec)


def test_a_hub_dataset_needs_a_cache_or_names_task_path(empty_hub_cache: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    spec = load_spec("gsm8k-qwen0.5b", ["task.path=nobody/gsm8k-copy"])
    with pytest.raises(UserError) as info:
        pf.check_hub_dataset(spec)
    assert "task.path=/local/gsm8k" in str(info.value) and "\n" not in str(info.value)
    _fake_cached_repo(empty_hub_cache, "datasets--nobody--gsm8k-copy", "train.parquet")
    pf.check_hub_dataset(spec)


def test_a_local_dataset_file_is_not_looked_up_on_the_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text("")
    monkeypatch.setattr(pf, "_hub_problem", lambda *a: pytest.fail("asked the hub about a local file"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    pf.check_hub_dataset(load_spec("gsm8k-qwen0.5b", [f"task.path={data}"]))


def test_online_the_hub_gets_one_short_request(empty_hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import HfApi

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    calls: list[tuple[str, float]] = []

    def unreachable(self: HfApi, repo_id: str, *, timeout: float) -> None:
        calls.append((repo_id, timeout))
        raise ConnectionError("no route to host")

    monkeypatch.setattr(HfApi, "model_info", unreachable)
    spec = load_spec("gsm8k-qwen0.5b", ["model.name_or_path=nobody/nothing", "device=cpu"])
    with pytest.raises(UserError) as info:
        pf.check_hub_model(spec)
    assert calls == [("nobody/nothing", 5.0)]
    assert "could not be reached" in str(info.value) and "model.source=path" in str(info.value)

    monkeypatch.setattr(HfApi, "model_info", lambda self, repo_id, timeout: None)
    pf.check_hub_model(spec)


def test_a_local_model_folder_needs_config_and_tokenizer(tmp_path: Path) -> None:
    folder = _model_folder(tmp_path, config=False)
    spec = load_spec("gsm8k-qwen0.5b", ["model.source=path", f"model.name_or_path={folder}", "device=cpu"])
    with pytest.raises(UserError, match="no config.json"):
        pf.check_model_folder(spec)
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(UserError, match="no tokenizer file"):
        pf.check_model_folder(spec)
    (folder / "tokenizer_config.json").write_text("{}")
    pf.check_model_folder(spec)


def test_a_complete_local_setup_passes_every_check(tmp_path: Path) -> None:
    folder = _model_folder(tmp_path)
    data = tmp_path / "gsm8k"
    data.mkdir()
    rows = {"train": {"question": "Tom has 2 pens and buys 3. How many?", "answer": "2+3=5\n#### 5"},
            "test": {"question": "Ann has 4 cups and buys 1. How many?", "answer": "4+1=5\n#### 5"}}
    for split, row in rows.items():  # different questions: a shared one would be noted as not held out
        (data / f"{split}.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    spec = load_spec("gsm8k-qwen0.5b", ["model.source=path", f"model.name_or_path={folder}", "device=cpu",
                                        f"task.path={data}", "train.prompts_per_step=1", "task.train_size=1",
                                        "generation.backend=transformers"])
    notes = io.StringIO()
    found = pf.preflight(spec, tmp_path / "out", notes=notes)
    # one row where the preset asks for 1,319 test questions: said, not refused
    assert found == [f"{data / 'test.jsonl'}: 1 usable rows, fewer than task.test_size=1319; using 1"]
    assert notes.getvalue() == f"bench: note: {found[0]}\n"
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------
# GPU pinning


@pytest.mark.parametrize("device, gpus, base, expected", [
    ("cuda", [2, 3], {}, "2"),
    ("cuda", [2], {"CUDA_VISIBLE_DEVICES": "0,1"}, "2"),
    ("cuda", [], {"CUDA_VISIBLE_DEVICES": "3,5"}, "3"),
    ("auto", [], {"CUDA_VISIBLE_DEVICES": " 4 "}, "4"),
    ("cuda", [], {"CUDA_VISIBLE_DEVICES": ""}, ""),  # every GPU hidden on purpose stays hidden
    ("auto", [], {}, "0"),
])
def test_workers_are_pinned_to_one_gpu(device: str, gpus: list[int], base: dict[str, str], expected: str) -> None:
    spec = load_spec("cpu-quick", [f"device={device}", f"gpus={gpus}"])
    before = dict(base, PATH="/bin")
    env = worker_env(spec, before)
    assert env["CUDA_VISIBLE_DEVICES"] == expected
    assert env["PATH"] == "/bin"
    assert before == dict(base, PATH="/bin")  # the caller's mapping is not changed


def test_spec_gpu_indices_follow_nvidia_smi_order() -> None:
    spec = load_spec("cpu-quick", ["device=cuda", "gpus=[1]"])
    assert worker_env(spec, {})["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert worker_env(spec, {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


def test_cpu_workers_keep_the_environment() -> None:
    spec = load_spec("cpu-quick", ["device=cpu", "gpus=[1]"])
    assert worker_env(spec, {"CUDA_VISIBLE_DEVICES": "3,5"}) == {"CUDA_VISIBLE_DEVICES": "3,5"}
    assert worker_env(spec, {}) == {}


@pytest.mark.parametrize("gpus", ["[-1]", "[1,1]"])
def test_gpu_indices_are_validated(gpus: str) -> None:
    with pytest.raises(SpecError, match="'gpus'"):
        load_spec("cpu-quick", [f"gpus={gpus}"])
