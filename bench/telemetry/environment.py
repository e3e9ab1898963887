"""What machine and software a result came from (recorded in every result's "environment").

No hostname or user name is recorded (results are shared). Package versions come from
``importlib.metadata``, so transformers / trl / peft are never imported just to read a version.
Every field that cannot be read is None, never a guess.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "tokenizers", "nvidia-ml-py", "psutil")


def _suite_version() -> str:
    """This suite's own version (``bench.__version__``, the one pyproject.toml and CITATION.cff carry)."""
    from bench import __version__

    return __version__


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    """The CPU model name (Linux /proc/cpuinfo, else platform.processor())."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _git(repo_dir: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(repo_dir), *args], capture_output=True, text=True, timeout=10,
                             check=False)
    except (OSError, subprocess.SubprocessError):  # no git binary, hung repository
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _gpu() -> dict[str, Any]:
    """GPU name/count/memory from torch, driver from NVML; all None/0 without a GPU."""
    info: dict[str, Any] = {"gpu_count": 0, "gpus": [], "driver_version": None, "cuda_version": None,
                            "cudnn_version": None}
    try:
        import torch  # the worker has imported it already; needed for more than a version

        info["cuda_version"] = torch.version.cuda
        if torch.cuda.is_available():
            info["gpu_count"] = torch.cuda.device_count()
            for index in range(info["gpu_count"]):
                props = torch.cuda.get_device_properties(index)
                info["gpus"].append({"name": props.name, "memory_bytes": int(props.total_memory),
                                     "capability": f"{props.major}.{props.minor}"})
            cudnn = torch.backends.cudnn.version()
            info["cudnn_version"] = str(cudnn) if cudnn else None
    except Exception:  # noqa: BLE001 - a broken torch must not stop the result being written
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            info["driver_version"] = driver.decode() if isinstance(driver, bytes) else str(driver)
            if not info["gpus"]:  # torch without CUDA on a GPU machine: still say what is there
                count = int(pynvml.nvmlDeviceGetCount())
                info["gpu_count"] = count
                for index in range(count):
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    name = pynvml.nvmlDeviceGetName(handle)
                    info["gpus"].append({"name": name.decode() if isinstance(name, bytes) else str(name),
                                         "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                                         "capability": None})
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no pynvml, no driver (NVMLError_LibraryNotFound)
        pass
    info["gpu_name"] = info["gpus"][0]["name"] if info["gpus"] else None
    return info


def capture_environment(repo_dir: Path | None = None) -> dict[str, Any]:
    """The machine, software versions and code revision of this run.

    Args:
        repo_dir: the suite's git checkout (default: the folder above ``bench/``).

    Returns:
        ``{"time_utc", "os", "python", "cpu_model", "cpu_count_logical", "cpu_count_physical",
        "ram_bytes", "gpu_count", "gpu_name", "gpus": [{"name", "memory_bytes", "capability"}],
        "driver_version", "cuda_version", "cudnn_version", "packages": {name: version | None},
        "suite_version", "git_commit", "git_dirty"}`` — memory in bytes; None where unknown.
    """
    repo = Path(repo_dir) if repo_dir is not None else Path(__file__).resolve().parents[2]
    try:
        import psutil

        ram: int | None = int(psutil.virtual_memory().total)
        physical = psutil.cpu_count(logical=False)
    except Exception:  # noqa: BLE001
        ram, physical = None, None
    commit = _git(repo, "rev-parse", "HEAD")
    status = _git(repo, "status", "--porcelain", "--untracked-files=no") if commit else None
    env: dict[str, Any] = {
        "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "cpu_count_logical": os.cpu_count(),
        "cpu_count_physical": physical,
        "ram_bytes": ram,
    }
    env.update(_gpu())
    env["packages"] = {name: _version(name) for name in PACKAGES}
    env["suite_version"] = _suite_version()
    env["git_commit"] = commit
    env["git_dirty"] = (bool(status) if status is not None else None)
    return env
