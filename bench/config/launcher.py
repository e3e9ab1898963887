"""The launcher's configuration: which launcher, how many processes, which accelerate / DeepSpeed config, and the
checks that run when the spec is loaded (:func:`validate_launcher`).

Starting and joining the processes is execution (:mod:`bench.execution.launch`). Nothing here imports torch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from bench.errors import SpecError

LAUNCHERS = ("none", "accelerate")
"""``launcher.name`` values: none runs each method as one process (the default)."""
LAUNCHER_ENV = "BENCH_LAUNCHER"
"""Set by the runner in a launched run's environment: the launcher's name (a rank knows it was launched)."""
CONFIG_ENV = "BENCH_ACCELERATE_CONFIG"
"""Set by the runner: the accelerate config file the ranks were launched with (for the environment block)."""
RANK_FILE = "rank{rank}.json"
"""Each rank's own record in the run folder (rank0.json, rank1.json, ...)."""
SHIPPED_CONFIGS = ("ddp", "zero2", "zero3", "zero3_offload")
"""bench/config/accelerate/<name>.yaml."""
DEFAULT_CONFIG = "ddp"
"""The config used when --accelerate-config is not given (a user's own default accelerate config never leaks in)."""
DISTRIBUTED_TYPES = ("MULTI_GPU", "MULTI_CPU", "DEEPSPEED", "NO")
"""accelerate ``distributed_type`` values this suite launches (FSDP, TPU, Megatron: not mapped)."""
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
ZERO_STAGES = (0, 1, 2, 3)
DEEPSPEED_FIX = "pip install '.[deepspeed]'"
"""How a user installs DeepSpeed for the suite: the optional extra (on a GPU machine)."""
IMPORT_TIMEOUT_S = 120.0
"""How long the check that DeepSpeed imports may take (it runs in a child process: importing DeepSpeed imports torch
and probes the accelerator, which the runner process should not pay for or be changed by)."""
DEEPSPEED_OK_ENV = "BENCH_DEEPSPEED_IMPORTS"
"""Set (to the interpreter's path) once DeepSpeed imported: every worker and rank validates the spec again, and
inherits this instead of importing DeepSpeed once more just to check."""
DEEPSPEED_ON_CPU_ENV = "BENCH_DEEPSPEED_ON_CPU"
"""Set to 1 to let a DeepSpeed config run on a CPU (DeepSpeed's CPU accelerator, ``DS_ACCELERATOR=cpu``, over gloo):
an escape for experiments with the plumbing on a machine without GPUs, not a supported setting (slow, and
DeepSpeed's CPU support is limited)."""


# -- the spec -----------------------------------------------------------------------------------
def shipped_config(name: str) -> Path:
    """The path of a shipped accelerate config (``ddp``, ``zero2``, ``zero3``, ``zero3_offload``)."""
    return Path(str(resources.files("bench.config") / "accelerate" / f"{name}.yaml"))


def active(spec: Any) -> bool:
    """True when the spec asks for a launcher (launcher.name != none)."""
    return spec.launcher.name != "none"


def config_path(spec: Any) -> Path:
    """The accelerate config a launched run uses: launcher.config_file, else the shipped ddp.yaml."""
    return Path(spec.launcher.config_file) if spec.launcher.config_file else shipped_config(DEFAULT_CONFIG)


def read_config(path: Path) -> dict[str, Any]:
    """An accelerate config file as a mapping; SpecError (one line) when it is missing or not a YAML mapping."""
    import yaml

    if not path.is_file():
        raise SpecError(f"'launcher.config_file' '{path}' does not exist; give an accelerate config file, e.g. "
                        f"{shipped_config(DEFAULT_CONFIG)}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SpecError(f"'launcher.config_file' '{path}' is not valid YAML ({type(exc).__name__}); fix its syntax") \
            from None
    if not isinstance(data, dict):
        raise SpecError(f"'launcher.config_file' '{path}' must be a YAML mapping (an accelerate config)")
    return data


def deepspeed_settings(data: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """A DeepSpeed accelerate config's ZeRO settings: ``{"zero_stage", "offload_optimizer_device",
    "offload_param_device"}``, from its ``deepspeed_config`` block or from the DeepSpeed JSON that the block names
    (``deepspeed_config_file``; a relative path is read from the current folder, as accelerate does). SpecError
    (one line, naming the file and the fix) for a missing block, an unreadable JSON, a stage that is not 0-3 or an
    unknown offload device."""
    where = f"'launcher.config_file' '{path}'"
    ds = data.get("deepspeed_config")
    if not isinstance(ds, dict):
        raise SpecError(f"{where}: a DEEPSPEED config needs a deepspeed_config mapping with zero_stage (0-3), e.g. "
                        f"{shipped_config('zero2')}")
    if ds.get("deepspeed_config_file"):
        ds = _deepspeed_json_settings(Path(str(ds["deepspeed_config_file"])), path)
    stage = ds.get("zero_stage")
    if isinstance(stage, bool) or stage not in ZERO_STAGES:  # YAML's true would otherwise pass as stage 1
        raise SpecError(f"{where}: deepspeed_config.zero_stage must be 0, 1, 2 or 3, got {stage!r}")
    settings = {"zero_stage": stage}
    for key in ("offload_optimizer_device", "offload_param_device"):
        value = str(ds.get(key) or "none")
        if value not in OFFLOAD_DEVICES:
            raise SpecError(f"{where}: deepspeed_config.{key} must be one of {', '.join(OFFLOAD_DEVICES)}, got "
                            f"{value!r}")
        settings[key] = value
    if settings["offload_param_device"] != "none" and stage != 3:
        raise SpecError(f"{where}: offload_param_device needs zero_stage 3, got stage {stage}")
    return settings


def _deepspeed_json_settings(json_path: Path, config: Path) -> dict[str, Any]:
    """The ``deepspeed_config`` keys read from a DeepSpeed JSON (``zero_optimization.stage`` and its offload
    devices; DeepSpeed's default stage is 0)."""
    where = f"'launcher.config_file' '{config}': deepspeed_config_file '{json_path}'"
    try:
        data = json.loads(json_path.read_text(encoding="utf-8"))
    except OSError:
        raise SpecError(f"{where} does not exist (a relative path is read from the current folder, as accelerate "
                        f"does); give the DeepSpeed JSON's path, or set deepspeed_config.zero_stage instead") from None
    except ValueError as exc:
        raise SpecError(f"{where} is not valid JSON ({type(exc).__name__}); fix its syntax") from None
    zero = data.get("zero_optimization", {}) if isinstance(data, dict) else None
    if not isinstance(zero, dict):
        raise SpecError(f"{where}: zero_optimization must be a mapping")

    def device(key: str) -> Any:
        block = zero.get(key)
        return block.get("device") if isinstance(block, dict) else None

    return {"zero_stage": zero.get("stage", 0), "offload_optimizer_device": device("offload_optimizer"),
            "offload_param_device": device("offload_param")}


def deepspeed_problem() -> str | None:
    """None when ``import deepspeed`` works in this interpreter, else why not ("is not installed", or "does not
    import (ImportError: ...)" with the last line of its error). The import runs in a child process, once per suite
    (:data:`DEEPSPEED_OK_ENV`)."""
    if importlib.util.find_spec("deepspeed") is None:
        return "is not installed"
    if os.environ.get(DEEPSPEED_OK_ENV) == sys.executable:
        return None
    try:
        proc = subprocess.run([sys.executable, "-c", "import deepspeed"], capture_output=True, text=True,
                              timeout=IMPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"did not import within {IMPORT_TIMEOUT_S:g} s"
    if proc.returncode == 0:
        os.environ[DEEPSPEED_OK_ENV] = sys.executable
        return None
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    return f"is installed but does not import ({lines[-1] if lines else f'exit status {proc.returncode}'})"


def check_config(data: Mapping[str, Any], path: Path, device: str) -> None:
    """The config's distributed type, and for DeepSpeed its ZeRO settings (:func:`deepspeed_settings`), that
    DeepSpeed imports and that the run is on a GPU. Raises SpecError naming the file and the fix."""
    kind = str(data.get("distributed_type", "NO"))
    if kind not in DISTRIBUTED_TYPES:
        raise SpecError(f"'launcher.config_file' '{path}': distributed_type {kind!r} is not supported by the suite; "
                        f"use one of {', '.join(DISTRIBUTED_TYPES)} (e.g. the shipped {', '.join(SHIPPED_CONFIGS)})")
    if kind != "DEEPSPEED":
        return
    deepspeed_settings(data, path)
    problem = deepspeed_problem()
    if problem:
        raise SpecError(f"'launcher.config_file' '{path}' is a DeepSpeed config but DeepSpeed {problem}; install the "
                        f"optional extra on a GPU machine: {DEEPSPEED_FIX} (or use {shipped_config(DEFAULT_CONFIG)})")
    if device == "cpu" and os.environ.get(DEEPSPEED_ON_CPU_ENV) != "1":
        raise SpecError(f"'launcher.config_file' '{path}' is a DeepSpeed config, which needs GPUs (the suite does not "
                        f"run DeepSpeed on a CPU); run it on a GPU machine, or use {shipped_config(DEFAULT_CONFIG)}")


def config_strategy(data: Mapping[str, Any], path: Path) -> str:
    """What an accelerate config asks for: ``ddp`` (MULTI_GPU, MULTI_CPU, NO) or ``deepspeed-zero<stage>``, with
    ``-offload`` when the optimizer state or the weights are offloaded. The config must have passed
    :func:`check_config`."""
    if str(data.get("distributed_type", "NO")) != "DEEPSPEED":
        return "ddp"
    ds = deepspeed_settings(data, path)
    offload = any(ds[k] != "none" for k in ("offload_optimizer_device", "offload_param_device"))
    return f"deepspeed-zero{ds['zero_stage']}" + ("-offload" if offload else "")


def engine_zero(spec: Any) -> dict[str, Any] | None:
    """The ZeRO settings the suite engine shards with in this launched spec (:func:`deepspeed_settings`), or None
    when it runs DDP: no launcher, a non-DeepSpeed config, or ZeRO stage 0 (plain data parallelism, which is what
    DDP does; DeepSpeed's stage 0 also lacks the direct ``loss.backward()`` the engine's shared actor + critic loss
    needs). The engine (baselines.rollout_engine) and :func:`parallel_settings` both decide from here."""
    if not active(spec):
        return None
    path = config_path(spec)
    data = read_config(path)
    if str(data.get("distributed_type", "NO")) != "DEEPSPEED":
        return None
    settings = deepspeed_settings(data, path)
    return settings if settings["zero_stage"] > 0 else None


def validate_launcher(spec: Any) -> None:
    """launcher.* against each other and the rest of the spec; one-line SpecError for the first problem.

    N >= 1 is a SPEC_RULES rule. Here: N > 1 needs a launcher; on a CPU a launcher excludes parallel_runs > 1 (the
    processes of one run already share the cores; on GPUs each concurrent run gets N GPUs of its own,
    bench.execution.devices); the config file is checked (:func:`check_config`); each
    rank gets train.prompts_per_step / N prompts, so N must divide it when a data-parallel method is enabled.
    """
    launcher = spec.launcher
    n = launcher.num_processes
    if not active(spec):
        if launcher.num_machines != 1:
            raise SpecError(f"'launcher.num_machines' is {launcher.num_machines} but no launcher is set; add "
                            f"--launcher accelerate (launcher.name=accelerate) or use 1 machine")
        if n != 1:
            raise SpecError(f"'launcher.num_processes' is {n} but no launcher is set; add --launcher accelerate "
                            f"(launcher.name=accelerate) or use 1 process")
        if launcher.config_file:
            raise SpecError("'launcher.config_file' is set but no launcher is; add --launcher accelerate "
                            "(launcher.name=accelerate) or drop --accelerate-config")
        return
    if spec.parallel_runs not in (1, "auto") and spec.device == "cpu":  # on GPUs each concurrent run gets N GPUs
        raise SpecError(f"'parallel_runs' ({spec.parallel_runs}) > 1 cannot be combined with a launcher on a CPU: "
                        f"each run already uses {n} processes sharing the cores; set parallel_runs=1")
    check_config(read_config(config_path(spec)), config_path(spec), spec.device)
    _validate_machines(spec)
    distributed = [name for name in spec.enabled_methods() if data_parallel(name)]
    if distributed and spec.train.prompts_per_step % n:
        raise SpecError(f"'train.prompts_per_step' ({spec.train.prompts_per_step}) must divide by the number of "
                        f"processes ({n}): each rank samples prompts_per_step / N prompts of every step; choose a "
                        f"multiple of {n} (methods {', '.join(distributed)})")


def _validate_machines(spec: Any) -> None:
    """launcher.num_machines > 1: the ranks split evenly over the machines, and a scheduler that can place them.

    Only the Ray scheduler starts a run's machines: it reserves the nodes together and tells each task its machine
    rank and machine 0's address. The local scheduler has one machine; starting the other machines' ranks by hand
    for every run of a suite would be a scheduler of the suite's own, which Ray already is."""
    launcher = spec.launcher
    machines = launcher.num_machines
    if machines == 1:
        return
    if launcher.num_processes % machines:
        raise SpecError(f"'launcher.num_processes' ({launcher.num_processes}) must divide by 'launcher.num_machines' "
                        f"({machines}): each machine starts the same number of ranks; e.g. "
                        f"launcher.num_processes={machines * max(1, launcher.num_processes // machines)}")
    if spec.scheduler.name != "ray":
        raise SpecError(f"'launcher.num_machines' is {machines} but 'scheduler.name' is "
                        f"'{spec.scheduler.name}'; a run across machines is placed by the Ray scheduler (one task "
                        f"per machine): add scheduler.name=ray (docs/ray.md), or set launcher.num_machines=1")


def machines_for(spec: Any, method: str) -> int:
    """How many machines a run of ``method`` spans (launcher.num_machines for a launched data-parallel method,
    else 1: shared stages and one-process methods stay on one machine)."""
    return spec.launcher.num_machines if processes_for(spec, method) > 1 else 1


def data_parallel(method: str) -> bool:
    """Whether a method's recipe maps the matched budget onto several processes: every suite-engine method
    (baselines.rollout_engine shards each step's prompts) and recipes that declare ``DATA_PARALLEL = True``
    (TRL's GRPO and DPO). Any other runs as one process under a launcher, and its result says so."""
    from bench.config.registry import recipe

    module = recipe(method)
    return bool(getattr(module, "DATA_PARALLEL", module.ENGINE == "suite"))


def processes_for(spec: Any, method: str) -> int:
    """How many processes ``method`` runs with in this spec (1 without a launcher or for a one-process method)."""
    return spec.launcher.num_processes if active(spec) and data_parallel(method) else 1
