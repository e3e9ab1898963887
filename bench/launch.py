"""Several processes per method run, through accelerate (``bench run --launcher accelerate --num-processes N``).

Who does what:

- the runner (:func:`worker_launch`) starts each method run that can run data parallel as
  ``python -m accelerate.commands.accelerate_cli launch --config_file FILE --num_processes N -m bench.worker RUN_DIR``
  (``accelerate launch`` with this interpreter) instead of ``python -m bench.worker RUN_DIR``; shared stages (and a
  method whose recipe does not declare how its matched budget splits over several processes) stay one process;
- accelerate's launcher (torch.distributed's elastic agent) starts the N ranks, each with RANK / WORLD_SIZE /
  LOCAL_RANK set, each in a session of its own;
- each rank (:func:`init_process_group`: accelerate's ``PartialState``, gloo on a CPU, NCCL on GPUs) trains on its
  shard of every step's prompts; rank 0 alone evaluates and writes ``result.json``; every rank writes
  ``rank<k>.json`` (:func:`write_rank_file`: its own memory peaks, counts, timings and the prompts it trained on);
- after the launch exits the runner merges the rank files into the result (:func:`merge_rank_files`): per-rank
  peaks, their max (the headline peak: memory per device) and sum; completions and tokens summed over ranks.

Without a GPU the default config (``bench/accelerate/ddp.yaml``) still works: accelerate's multi-process launcher
starts the ranks and ``PartialState(cpu=True)`` joins them over gloo (accelerate's ``--cpu`` flag alone would start
a single process unless MPI is set up). DeepSpeed configs are checked here (the ZeRO stage, inline or in the
DeepSpeed JSON the config names; offload devices; that DeepSpeed imports; that the run is on a GPU) and are for GPU
machines only (:data:`DEEPSPEED_ON_CPU_ENV` lifts the GPU check for experiments). Under a DeepSpeed config TRL's
trainers (GRPO, DPO) are sharded by DeepSpeed (accelerate hands it to the Trainer); the suite engine's methods are
sharded too when the stage is 1-3 (:func:`engine_zero`: the engine hands its trained networks to
``deepspeed.initialize``); under stage 0 the engine runs DDP (the same layout), and the result says which
(``settings.parallel.strategy``, :func:`parallel_settings`).

Nothing here imports torch at module level: the runner and ``bench run --dry-run`` use it.
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
"""bench/accelerate/<name>.yaml."""
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
    return Path(str(resources.files("bench") / "accelerate" / f"{name}.yaml"))


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

    N >= 1 is a SPEC_RULES rule. Here: N > 1 needs a launcher; a launcher excludes parallel_runs > 1 (the
    processes of one run already share the machine); the config file is checked (:func:`check_config`); each
    rank gets train.prompts_per_step / N prompts, so N must divide it when a data-parallel method is enabled.
    """
    launcher = spec.launcher
    n = launcher.num_processes
    if not active(spec):
        if n != 1:
            raise SpecError(f"'launcher.num_processes' is {n} but no launcher is set; add --launcher accelerate "
                            f"(launcher.name=accelerate) or use 1 process")
        if launcher.config_file:
            raise SpecError("'launcher.config_file' is set but no launcher is; add --launcher accelerate "
                            "(launcher.name=accelerate) or drop --accelerate-config")
        return
    if spec.parallel_runs != 1:
        raise SpecError(f"'parallel_runs' ({spec.parallel_runs}) > 1 cannot be combined with a launcher: each run "
                        f"already uses {n} processes; set parallel_runs=1")
    check_config(read_config(config_path(spec)), config_path(spec), spec.device)
    distributed = [name for name in spec.enabled_methods() if data_parallel(name)]
    if distributed and spec.train.prompts_per_step % n:
        raise SpecError(f"'train.prompts_per_step' ({spec.train.prompts_per_step}) must divide by the number of "
                        f"processes ({n}): each rank samples prompts_per_step / N prompts of every step; choose a "
                        f"multiple of {n} (methods {', '.join(distributed)})")


def data_parallel(method: str) -> bool:
    """Whether a method's recipe maps the matched budget onto several processes: every suite-engine method
    (baselines.rollout_engine shards each step's prompts) and recipes that declare ``DATA_PARALLEL = True``
    (TRL's GRPO and DPO). Any other runs as one process under a launcher, and its result says so."""
    from bench.registry import recipe

    module = recipe(method)
    return bool(getattr(module, "DATA_PARALLEL", module.ENGINE == "suite"))


def processes_for(spec: Any, method: str) -> int:
    """How many processes ``method`` runs with in this spec (1 without a launcher or for a one-process method)."""
    return spec.launcher.num_processes if active(spec) and data_parallel(method) else 1


# -- the runner side ----------------------------------------------------------------------------
def accelerate_command(run_dir: Path, processes: int, config: Path, custom_config: bool) -> list[str]:
    """``accelerate launch`` with this interpreter, N processes and the config, running ``-m bench.worker``.

    A free port is picked (``--main_process_port 0``) unless the user's own config names one.
    """
    cmd = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--config_file", str(config),
           "--num_processes", str(processes), "--num_machines", "1"]
    if not custom_config:
        cmd += ["--main_process_port", "0"]
    return [*cmd, "-m", "bench.worker", str(run_dir)]


def worker_launch(spec: Any, kind: str, method: str, run_dir: Path, env: Mapping[str, str]
                  ) -> tuple[list[str] | None, dict[str, str]]:
    """(command, environment) for one planned run: (None, env) for a plain ``python -m bench.worker`` run, else
    the accelerate command and an environment that names the launcher and does not pin the run to one GPU
    (``spec.gpus`` when given, else every GPU the runner sees)."""
    env = dict(env)
    if kind != "method" or not active(spec) or not data_parallel(method):
        return None, env
    env = dict(os.environ)  # the runner's own, not the one-GPU environment of a single-process worker
    if spec.device != "cpu" and spec.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    for stale in run_dir.glob("rank*.json"):  # an earlier attempt's ranks must not be merged into this one
        stale.unlink(missing_ok=True)
    config = config_path(spec)
    env[LAUNCHER_ENV] = spec.launcher.name
    env[CONFIG_ENV] = str(config)
    return accelerate_command(run_dir, spec.launcher.num_processes, config, bool(spec.launcher.config_file)), env


# -- the rank side ------------------------------------------------------------------------------
def rank() -> int:
    """This process's global rank (RANK set by the launcher; 0 in a run the runner did not launch, whatever the
    environment says: a RANK inherited from a cluster job must not make a one-process run skip its evaluation)."""
    return int(os.environ.get("RANK", "0") or 0) if launched() else 0


def world_size() -> int:
    """How many ranks this run has (WORLD_SIZE set by the launcher; 1 in a run the runner did not launch)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) if launched() else 1


def launched() -> bool:
    """True in a rank started by the runner through a launcher."""
    return bool(os.environ.get(LAUNCHER_ENV))


def is_main() -> bool:
    """Rank 0 (or a run without a launcher): the one process that evaluates and writes result.json."""
    return rank() == 0


def init_process_group(device: str) -> str | None:
    """Join the run's process group through accelerate's ``PartialState`` (gloo on a CPU, NCCL on GPUs; each
    rank on its own GPU); returns the backend, None when there is a single process. Idempotent: TRL's
    TrainingArguments find the same shared state."""
    if world_size() <= 1:
        return None
    from accelerate import PartialState

    state = PartialState(cpu=device == "cpu")
    return state.backend


def backend() -> str | None:
    """The torch.distributed backend in use, None when not initialised."""
    import torch.distributed as dist

    return dist.get_backend() if dist.is_available() and dist.is_initialized() else None


def mean_across_ranks(metrics: dict[str, Any]) -> dict[str, Any]:
    """Every float metric averaged over the ranks (each rank's value has equal weight: equal shards); ints
    (the step) and other values are taken from this rank. A metric some rank lacks is averaged over those that
    have it. Identity with one process."""
    import torch.distributed as dist

    if world_size() <= 1 or not dist.is_initialized():
        return metrics
    gathered: list[dict[str, Any]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, {k: v for k, v in metrics.items() if isinstance(v, float)})
    out = dict(metrics)
    for key in {k for g in gathered for k in g}:
        values = [g[key] for g in gathered if key in g]
        out[key] = sum(values) / len(values)
    return out


def finish() -> None:
    """Leave the process group (best effort) so that a rank exits cleanly."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - exiting anyway
        pass


def parallel_settings(spec: Any, method: str) -> dict[str, Any]:
    """settings["parallel"] of a method run under a launcher: the layout the report's "what differs" shows.

    ``strategy`` is what ran, ``config_strategy`` what the accelerate config asks for (:func:`config_strategy`).
    TRL's trainers follow the config (accelerate hands them DeepSpeed). The suite engine follows a ZeRO stage 1-3
    (:func:`engine_zero`: its actor and critic with their optimizers go through ``deepspeed.initialize``; the
    frozen reference and reward model stay whole on every rank, and ``frozen_networks`` says so); under stage 0 it
    runs DDP, so its strategy is ``ddp`` and ``note`` says so.
    """
    n = processes_for(spec, method)
    if n == 1 and not data_parallel(method):
        return {"launcher": "none", "processes": 1, "backend": None,
                "note": "not mapped onto several processes (the matched budget would change): one process"}
    path = config_path(spec)
    asked = config_strategy(read_config(path), path)
    from bench.registry import engine

    suite = engine(method) == "suite"
    zero = engine_zero(spec) if suite else None
    strategy = asked if not suite or zero else "ddp"
    out = {"launcher": spec.launcher.name, "processes": n, "backend": backend(), "strategy": strategy,
           "config_strategy": asked, "prompts_per_rank_per_step": spec.train.prompts_per_step // n}
    if zero:
        out["frozen_networks"] = "replicated: the reference and the reward model are whole and frozen on every rank"
        if zero["zero_stage"] == 3:
            out["generation"] = "inside a gather of the actor's ZeRO-3 partitions (whole weights on every rank)"
    if strategy != asked:
        out["note"] = (f"the config asks for {asked}; the suite engine does not shard under stage 0: it ran DDP, "
                       f"each rank holding whole trained networks, gradients and optimizer state")
    return out


def launcher_environment(spec: Any) -> dict[str, Any]:
    """environment["launcher"]: the launcher, N, the config file and its content, accelerate's version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        accelerate_version: str | None = version("accelerate")
    except PackageNotFoundError:
        accelerate_version = None
    path = Path(os.environ.get(CONFIG_ENV) or config_path(spec))
    try:
        config: dict[str, Any] | None = read_config(path)
    except SpecError:
        config = None
    try:
        deepspeed_version: str | None = version("deepspeed")
    except PackageNotFoundError:
        deepspeed_version = None
    return {"name": os.environ.get(LAUNCHER_ENV) or spec.launcher.name, "processes": world_size(),
            "backend": backend(), "config_file": str(path), "config": config, "accelerate": accelerate_version,
            "deepspeed": deepspeed_version, "deepspeed_installed": deepspeed_version is not None}


def write_rank_file(run_dir: Path, result: Mapping[str, Any], prompt_ids: list[int]) -> Path:
    """This rank's record: status and error, its own memory reading (peak, source, per source, baseline), counts
    and timings, the positions (in the matched prompt order) of the prompts it trained on, and how training
    changed its weights (bench.telemetry.param_change; equal on every rank when the gradients were averaged)."""
    from bench.results import write_json_atomic

    memory = result.get("memory") or {}
    throughput = result.get("throughput") or {}
    record = {
        "rank": rank(), "world_size": world_size(), "pid": os.getpid(), "status": result.get("status"),
        "error": result.get("error"),
        "memory": {k: memory.get(k) for k in ("peak_bytes", "source", "kind", "by_source", "baseline_bytes")},
        "throughput": {k: throughput.get(k) for k in ("train_s", "setup_s", "completions", "generated_tokens",
                                                      "trained_tokens", "steps", "step_s_median")},
        "prompt_ids": list(prompt_ids),
        # after data-parallel training every rank holds the same weights: the same change from the same start
        "training_change": result.get("training_change"),
    }
    path = run_dir / RANK_FILE.format(rank=rank())
    write_json_atomic(path, record)
    return path


# -- after the launch: one result -----------------------------------------------------------------
def read_rank_files(run_dir: Path) -> list[dict[str, Any]]:
    """Every rank<k>.json of a run, by rank (unreadable files are skipped)."""
    records = []
    for path in sorted(run_dir.glob("rank*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("rank"), int):
            records.append(data)
    return sorted(records, key=lambda r: r["rank"])


def merge_rank_files(run_dir: Path) -> dict[str, Any] | None:
    """Fold the ranks' records into result.json (written by rank 0) and return it; None without a result.

    memory: ``ranks`` (each rank's peak, source, per-source peaks), ``peak_bytes_max`` / ``peak_bytes_sum`` and
    ``peak_bytes`` = the max (memory per device, what decides whether a run fits), ``peak_scope`` saying so.
    throughput: completions, generated and trained tokens summed over the ranks, rates over rank 0's training
    time, ``processes``. A failed rank's error is added to a failed result's message (a rank that died takes
    the others down with a less telling error).
    """
    from bench.results import RESULT_FILE, cap_text, read_result, write_json_atomic
    from bench.worker import MESSAGE_LIMIT

    result = read_result(run_dir)
    records = read_rank_files(run_dir)
    if result is None or not records:
        return result
    memory = result.setdefault("memory", {})
    peaks = [r["memory"].get("peak_bytes") for r in records if isinstance(r["memory"].get("peak_bytes"), int)]
    memory["ranks"] = [{"rank": r["rank"], **r["memory"]} for r in records]
    if peaks:
        memory["peak_bytes_rank0"] = memory.get("peak_bytes")
        memory["peak_bytes_max"], memory["peak_bytes_sum"] = max(peaks), sum(peaks)
        memory["peak_bytes"] = max(peaks)
        memory["peak_scope"] = f"max over {len(records)} ranks (each rank's own {memory.get('source')} peak)"
    throughput = result.setdefault("throughput", {})
    throughput["processes"] = len(records)
    for key in ("completions", "generated_tokens", "trained_tokens"):
        counts = [r["throughput"].get(key) for r in records]
        if all(isinstance(c, int) for c in counts):
            throughput[key] = sum(counts)
    train_s = throughput.get("train_s")
    if isinstance(train_s, (int, float)) and train_s > 0:
        for count, rate in (("completions", "completions_per_s"), ("generated_tokens", "tokens_per_s"),
                            ("trained_tokens", "trained_tokens_per_s")):
            if throughput.get(count):
                throughput[rate] = throughput[count] / train_s
    throughput["per_rank"] = [{"rank": r["rank"], **r["throughput"], "prompts": len(r.get("prompt_ids") or [])}
                              for r in records]
    failed = [r for r in records if r.get("status") == "failed" and r["rank"] != 0 and isinstance(r.get("error"), dict)]
    if failed:
        extra = "; ".join(f"rank {r['rank']}: {r['error'].get('type')}: {r['error'].get('message')}" for r in failed)
        if result.get("status") == "ok":  # rank 0 finished, another rank did not: the run did not train as planned
            result["status"] = "failed"
            result["error"] = {**failed[0]["error"], "message": cap_text(extra, MESSAGE_LIMIT)}
        elif isinstance(result.get("error"), dict):
            result["error"]["message"] = cap_text(f"{result['error'].get('message')} | {extra}", MESSAGE_LIMIT)
    write_json_atomic(run_dir / RESULT_FILE, result)
    return result


__all__ = ["validate_launcher", "worker_launch", "merge_rank_files", "init_process_group", "write_rank_file",
           "mean_across_ranks", "parallel_settings", "launcher_environment", "shipped_config", "check_config",
           "config_strategy", "deepspeed_settings", "deepspeed_problem", "engine_zero"]
