"""Several processes per method run, through accelerate (``bench run --launcher accelerate --num-processes N``).

Who does what:

- the runner (:func:`worker_launch`) starts each method run that can run data parallel as
  ``python -m accelerate.commands.accelerate_cli launch --config_file FILE --num_processes N -m bench.execution.worker RUN_DIR``
  (``accelerate launch`` with this interpreter) instead of ``python -m bench.execution.worker RUN_DIR``; shared stages (and a
  method whose recipe does not declare how its matched budget splits over several processes) stay one process;
- accelerate's launcher (torch.distributed's elastic agent) starts the N ranks, each with RANK / WORLD_SIZE /
  LOCAL_RANK set, each in a session of its own;
- each rank (:func:`init_process_group`: accelerate's ``PartialState``, gloo on a CPU, NCCL on GPUs) trains on its
  shard of every step's prompts; rank 0 alone evaluates and writes ``result.json``; every rank writes
  ``rank<k>.json`` (:func:`write_rank_file`: its own memory peaks, counts, timings and the prompts it trained on);
- after the launch exits the runner merges the rank files into the result (:func:`merge_rank_files`): per-rank
  peaks, their max (the headline peak: memory per device) and sum; completions and tokens summed over ranks.

Without a GPU the default config (``bench/config/accelerate/ddp.yaml``) still works: accelerate's multi-process launcher
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

import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from bench.errors import SpecError
from bench.config.launcher import (CONFIG_ENV, LAUNCHER_ENV, RANK_FILE, active, check_config, config_path, config_strategy, data_parallel, deepspeed_problem, deepspeed_settings, engine_zero, machines_for, processes_for, read_config, shipped_config, validate_launcher)

# -- the runner side ----------------------------------------------------------------------------
@dataclass(frozen=True)
class MachineRole:
    """This machine's part in a run across ``count`` machines (launcher.num_machines > 1): its machine rank (0 holds
    global rank 0, which evaluates and writes result.json) and where machine 0's first rank listens for the others.
    The Ray scheduler gives each of a run's tasks its role (bench.execution.ray_scheduler)."""

    rank: int
    count: int
    address: str
    port: int


def accelerate_command(run_dir: Path, processes: int, config: Path, custom_config: bool,
                       machine: MachineRole | None = None, port: int | None = None,
                       deepspeed: bool = False) -> list[str]:
    """``accelerate launch`` with this interpreter, N processes (over every machine, as accelerate counts them) and
    the config, running ``-m bench.execution.worker``.

    One machine: ``port`` (launcher.main_port) when given, else a free port (``--main_process_port 0``) unless the
    user's own config names one. Several: this machine's rank, machine 0's address and port, and for DeepSpeed the
    ``standard`` multi-node launcher (each machine starts its own ranks, as here; accelerate's default, pdsh, would
    start every machine's ranks over ssh from machine 0).
    """
    machines = machine.count if machine else 1
    cmd = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--config_file", str(config),
           "--num_processes", str(processes), "--num_machines", str(machines)]
    if machine and machines > 1:
        cmd += ["--machine_rank", str(machine.rank), "--main_process_ip", machine.address,
                "--main_process_port", str(machine.port)]
        if deepspeed:
            cmd += ["--deepspeed_multinode_launcher", "standard"]
    elif port is not None:
        cmd += ["--main_process_port", str(port)]
    elif not custom_config:
        cmd += ["--main_process_port", "0"]
    return [*cmd, "-m", "bench.execution.worker", str(run_dir)]


def worker_launch(spec: Any, kind: str, method: str, run_dir: Path, env: Mapping[str, str],
                  gpus: list[str] | tuple[str, ...] | None = None,
                  machine: MachineRole | None = None) -> tuple[list[str] | None, dict[str, str]]:
    """(command, environment) for one planned run: (None, env) for a plain ``python -m bench.execution.worker`` run, else
    the accelerate command and an environment that names the launcher and does not pin the run to one GPU: the
    run's slot ``gpus`` (bench.execution.devices: a group of launcher.num_processes GPUs) when the runner gives one,
    else ``spec.gpus`` when given, else every GPU the runner sees. ``machine``: this machine's part in a run across
    several (its ranks only: launcher.num_processes / launcher.num_machines of them)."""
    env = dict(env)
    if kind != "method" or not active(spec) or not data_parallel(method):
        return None, env
    env = dict(os.environ)  # the runner's own, not the one-GPU environment of a single-process worker
    if spec.device != "cpu" and (gpus or spec.gpus):
        inherited = "CUDA_VISIBLE_DEVICES" in env and not spec.gpus
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in (gpus or spec.gpus))
        if not inherited:
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    for stale in run_dir.glob("rank*.json"):  # an earlier attempt's ranks must not be merged into this one
        stale.unlink(missing_ok=True)
    config = config_path(spec)
    env[LAUNCHER_ENV] = spec.launcher.name
    env[CONFIG_ENV] = str(config)
    deepspeed = str(read_config(config).get("distributed_type", "NO")) == "DEEPSPEED"
    return accelerate_command(run_dir, spec.launcher.num_processes, config, bool(spec.launcher.config_file),
                              machine=machine, port=spec.launcher.main_port, deepspeed=deepspeed), env


# -- the rank side ------------------------------------------------------------------------------
def rank() -> int:
    """This process's global rank (RANK set by the launcher; 0 in a run the runner did not launch, whatever the
    environment says: a RANK inherited from a cluster job must not make a one-process run skip its evaluation)."""
    return int(os.environ.get("RANK", "0") or 0) if launched() else 0


def world_size() -> int:
    """How many ranks this run has (WORLD_SIZE set by the launcher; 1 in a run the runner did not launch)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) if launched() else 1


def machine_rank() -> int:
    """Which of the run's machines this rank is on (GROUP_RANK, set by torch's elastic agent: the node rank; 0 in a
    run the runner did not launch)."""
    return int(os.environ.get("GROUP_RANK", "0") or 0) if launched() else 0


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
    from bench.config.registry import engine

    suite = engine(method) == "suite"
    zero = engine_zero(spec) if suite else None
    strategy = asked if not suite or zero else "ddp"
    out = {"launcher": spec.launcher.name, "processes": n, "machines": machines_for(spec, method),
           "backend": backend(), "strategy": strategy, "config_strategy": asked,
           "prompts_per_rank_per_step": spec.train.prompts_per_step // n}
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
        "rank": rank(), "world_size": world_size(), "machine_rank": machine_rank(), "hostname": socket.gethostname(),
        "pid": os.getpid(), "status": result.get("status"),
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
    from bench.results import MESSAGE_LIMIT, RESULT_FILE, cap_text, read_result, write_json_atomic

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


__all__ = ["validate_launcher", "worker_launch", "MachineRole", "merge_rank_files", "init_process_group", "write_rank_file",
           "mean_across_ranks", "parallel_settings", "launcher_environment", "shipped_config", "check_config",
           "config_strategy", "deepspeed_settings", "deepspeed_problem", "engine_zero"]
