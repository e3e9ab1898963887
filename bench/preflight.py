"""Checks run before the first stage of `bench run`: fail in seconds, not after an hour of set-up.

Each check raises ``UserError`` with one line naming the problem and the fix (the CLI prints it and exits
2). Only the hub checks may touch the network: one metadata request each, with a short timeout and no
retries, skipped when the local cache has the files, and replaced by an immediate failure when the hub is
switched off (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` / ``HF_DATASETS_OFFLINE``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench.errors import UserError
from bench.spec import Spec

HUB_TIMEOUT_S = 5.0
"""Seconds one hub metadata request may take; a slower hub counts as unreachable."""
NVIDIA_SMI_TIMEOUT_S = 5.0
"""Seconds `nvidia-smi -L` may take; a hung driver counts as no GPU."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "vocab.txt",
                   "spiece.model")
"""Any one of these in a model folder means a tokenizer can be loaded from it."""
_LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
_TRUE = {"1", "true", "yes", "on"}


def preflight(spec: Spec, suite_dir: Path) -> None:
    """Raise UserError for the first thing that would make this run fail for a reason the user can fix now.

    Local checks first (device, output folder, model folder), then the hub ones, which may wait up to
    ``HUB_TIMEOUT_S`` each.
    """
    check_device(spec)
    check_output_dir(suite_dir)
    check_model_folder(spec)
    check_hub_model(spec)
    check_hub_dataset(spec)


# ----------------------------------------------------------------------------------------------
# Device


def check_device(spec: Spec) -> None:
    """device=cuda needs a GPU that torch can use; say why it cannot (no GPU, CPU-only torch, driver)."""
    if spec.device != "cuda":
        return
    import torch

    problem = device_problem(spec.name, torch.cuda.is_available(), torch.__version__, torch.version.cuda,
                             nvidia_smi_works())
    if problem:
        raise UserError(problem)


def device_problem(preset: str, cuda_available: bool, torch_version: str, torch_cuda: str | None,
                   smi_works: bool) -> str | None:
    """The one-line message for a device=cuda spec on this machine, or None when torch can use a GPU.

    ``torch_cuda`` is ``torch.version.cuda`` (None for a CPU-only build); ``smi_works``: `nvidia-smi -L`
    succeeded, i.e. the driver sees a GPU.
    """
    if cuda_available:
        return None
    reinstall = ("remove .venv and rerun ./run_all.sh (it installs a CUDA build for your driver), or set "
                 "BENCH_TORCH_INDEX to a CUDA wheel index such as https://download.pytorch.org/whl/cu124 first")
    if smi_works and torch_cuda is None:
        return f"torch {torch_version} is a CPU-only build but nvidia-smi sees a GPU; {reinstall}"
    if smi_works:
        return (f"torch {torch_version} (built for CUDA {torch_cuda}) cannot use the GPU nvidia-smi sees (a driver "
                f"older than the build, or CUDA_VISIBLE_DEVICES hides it); {reinstall}")
    return (f"preset '{preset}' needs an NVIDIA GPU (device: cuda) but torch sees none; run ./run_all.sh --preset "
            f"cpu-tiny, or set device=cpu to try it on this CPU (slow)")


def nvidia_smi_works() -> bool:
    """Whether `nvidia-smi -L` lists a GPU within NVIDIA_SMI_TIMEOUT_S."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False
    try:
        proc = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and "GPU" in proc.stdout


# ----------------------------------------------------------------------------------------------
# Output folder


def check_output_dir(suite_dir: Path) -> None:
    """The suite folder can be created and written: create it, write and delete a file, remove what we made.

    Folders this check creates are removed again, so a later failure leaves no empty suite folder behind.
    """
    suite_dir = Path(suite_dir).expanduser()
    created: list[Path] = []
    missing = suite_dir
    while not missing.exists() and missing != missing.parent:
        created.append(missing)
        missing = missing.parent
    try:
        suite_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=suite_dir, prefix=".bench-write-test-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UserError(f"cannot write the output folder '{suite_dir}' ({reason}); pass --out a folder you can "
                        f"write, e.g. --out /tmp/bench-run") from None
    finally:
        for folder in created:  # deepest first; a failed mkdir may have made only the upper ones
            try:
                folder.rmdir()
            except FileNotFoundError:
                continue
            except OSError:
                break


# ----------------------------------------------------------------------------------------------
# Model and data


def check_model_folder(spec: Spec) -> None:
    """A local model folder (model.source=path, or a hub/config name that is an existing folder) is loadable."""
    name = spec.model.name_or_path
    if spec.model.source == "tiny" or not name:
        return
    folder = Path(name).expanduser()
    if spec.model.source != "path" and not folder.is_dir():
        return  # a hub id: check_hub_model's business
    if not folder.is_dir():
        raise UserError(f"model folder '{name}' does not exist; set model.name_or_path to a folder with config.json")
    if not (folder / "config.json").is_file():
        raise UserError(f"model folder '{name}' has no config.json; give the folder a model was saved to "
                        f"(save_pretrained), e.g. model.name_or_path=/models/qwen")
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise UserError(f"model folder '{name}' has no tokenizer file ({', '.join(TOKENIZER_FILES[:3])}, ...); "
                        f"save the tokenizer into it too (tokenizer.save_pretrained)")


def check_hub_model(spec: Spec) -> None:
    """A hub model id (model.source=hub) is in the local cache or answers one quick metadata request."""
    name = spec.model.name_or_path
    if spec.model.source != "hub" or not name or Path(name).expanduser().is_dir():
        return
    if _model_cached(name):
        return
    fix = "download it and use model.source=path model.name_or_path=/local/folder"
    if hub_offline("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        raise UserError(f"model '{name}' is not in the local Hugging Face cache and the hub is switched off "
                        f"(HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE); {fix}")
    problem = _hub_problem(name, "model")
    if problem:
        raise UserError(f"model '{name}' {problem}; {fix}")


def check_hub_dataset(spec: Spec) -> None:
    """A GSM8K hub dataset id (task.source=gsm8k, task.path not local) is cached or reachable."""
    path = spec.task.path
    if spec.task.source != "gsm8k" or not path or _looks_local(path):
        return
    if _dataset_cached(path):
        return
    fix = "download it and set task.path=/local/gsm8k (a local .jsonl/.parquet file or folder)"
    if hub_offline("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        raise UserError(f"dataset '{path}' is not in the local Hugging Face cache and the hub is switched off "
                        f"(HF_HUB_OFFLINE/HF_DATASETS_OFFLINE); {fix}")
    problem = _hub_problem(path, "dataset")
    if problem:
        raise UserError(f"dataset '{path}' {problem}; {fix}")


def hub_offline(*names: str) -> bool:
    """Whether any of these environment variables switches the hub off (1/true/yes/on, as huggingface_hub reads)."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in names)


def _looks_local(path: str) -> bool:
    # Mirrors bench.tasks.load_gsm8k: what it would open as a file or folder rather than a hub id.
    local = Path(path).expanduser()
    return path.startswith((".", "/", "~")) or local.suffix in _LOCAL_SUFFIXES or local.exists()


def _model_cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a valid repo id: not cached; the hub check words the error
        return False
    return isinstance(found, str)  # None: unknown; a sentinel object: known not to exist


def _dataset_cached(repo_id: str) -> bool:
    """In the hub's download cache (datasets--owner--name) or in `datasets`' prepared cache (owner___name)."""
    from huggingface_hub import constants

    snapshots = Path(constants.HF_HUB_CACHE) / f"datasets--{repo_id.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir() and any(snapshots.iterdir()):
        return True
    try:
        from datasets import config as datasets_config
    except ImportError:
        return False
    prepared = Path(datasets_config.HF_DATASETS_CACHE) / repo_id.replace("/", "___")
    return prepared.is_dir() and any(prepared.iterdir())


def _hub_problem(repo_id: str, repo_type: str) -> str | None:
    """One metadata request (HUB_TIMEOUT_S, no retries): None when the repo answers, else what went wrong."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError

    api = HfApi()
    info = api.model_info if repo_type == "model" else api.dataset_info
    try:
        info(repo_id, timeout=HUB_TIMEOUT_S)
    except HFValidationError:
        return "is not a valid hub id (owner/name)"
    except RepositoryNotFoundError:
        return "was not found on the hub (wrong id, or private without a token: run `hf auth login`)"
    except Exception as exc:  # connection refused, DNS, timeout, proxy, 5xx: all "unreachable" to the user
        return f"could not be reached on the hub within {HUB_TIMEOUT_S:.0f} s ({type(exc).__name__})"
    return None
