"""One run across several machines under the Ray scheduler (``launcher.num_machines`` > 1): its nodes reserved
together, one Ray task per machine, and every machine's rank records merged into the run's one result.

The driver reserves one bundle per machine in a placement group (``STRICT_SPREAD``: each bundle on a node of its
own, each holding the CPUs and GPUs of one machine's ranks), so a run never starts with some of its machines and
waits for the rest. A small task in machine 0's bundle says that node's address and the port its first rank will
listen on (``launcher.main_port``, else one free there now). Then each machine's task starts that machine's ranks
through accelerate with its machine rank and that address (:class:`bench.execution.launch.MachineRole`). Machine 0
holds global rank 0, which evaluates and writes result.json; its run folder becomes the run's, and the other
machines' rank records (and worker logs) are added to it before the records are merged
(:func:`bench.execution.launch.merge_rank_files`). A machine whose task Ray loses fails the run, naming that node;
the other machines' tasks are cancelled at once (their ranks would otherwise wait on the lost ones until the
process group's timeout).
"""

from __future__ import annotations

import shutil
import socket
import uuid
from pathlib import Path
from typing import Any

from bench.execution.launch import RANK_FILE, MachineRole, merge_rank_files
from bench.execution.plan import PlannedRun
from bench.execution.processes import Progress, Started, Stopper
from bench.execution.ray_node import relay_key
from bench.execution.ray_session import RaySession, lost_run
from bench.execution.ray_transfer import unpack

STRATEGY = "STRICT_SPREAD"
"""Ray's placement strategy for a run's machines: every bundle on a different node (two machines of one run on one
node would be one machine's GPUs counted twice)."""
POLL_S = 0.5
"""Seconds between looks at the reservation and the tasks: how soon a stop request is noticed."""
WORKER_LOG = "worker.log"
"""The launch's console in the run folder (bench.execution.processes); machine k's arrives as worker.machine<k>.log."""


def node_rendezvous(port: int | None) -> tuple[str, int]:
    """On machine 0's node: its address as the other nodes reach it, and ``port`` or a port free there now (the
    kernel's pick; accelerate checks it again before its first rank listens)."""
    import ray

    address = ray.util.get_node_ip_address()
    if port:
        return address, port
    with socket.socket() as probe:
        probe.bind(("", 0))
        return address, probe.getsockname()[1]


def start_across_machines(spec: Any, suite_dir: Path, run: PlannedRun, run_dir: Path, progress: Progress,
                          stopper: Stopper, session: RaySession, request: tuple[float, float],
                          task_args: tuple[dict[str, Any], list, dict[str, str]]) -> Started:
    """Reserve the run's machines, start one task on each, and make their folders the run's (see the module's
    docstring). ``request``: (CPUs, GPUs) of each machine; ``task_args``: (run.json, stage inputs, forwarded
    environment), what every machine's task gets besides its role."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    job, inputs, forwarded = task_args
    machines = spec.launcher.num_machines
    cpus, gpus = request
    bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    group = placement_group([dict(bundle) for _ in range(machines)], strategy=STRATEGY,
                            name=f"bench:{run.run_id}:{uuid.uuid4().hex[:6]}")
    try:
        progress.note(f"waiting for {machines} Ray nodes with {cpus:g} CPUs"
                      + (f" and {gpus:g} GPUs" if gpus else "") + " each")
        while not group.wait(timeout_seconds=POLL_S):
            if stopper.requested.is_set():
                return Started(None)
        on = [PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=k) for k in range(machines)]
        try:
            address, port = ray.get(ray.remote(num_cpus=0)(node_rendezvous).options(scheduling_strategy=on[0])
                                    .remote(spec.launcher.main_port))
        except ray.exceptions.RayError as exc:  # machine 0's node went away between the reservation and now
            lost = lost_run(exc, None)
            return Started(None, lost=f"machine 0 of {machines}: {lost.lost}", lost_type=lost.lost_type)
        roles = [MachineRole(k, machines, address, port) for k in range(machines)]
        refs = []
        for role in roles:
            key = relay_key(run.run_id, role)
            session.expect(key, progress if role.rank == 0 else None)
            # max_retries=0 whatever scheduler.max_retries says: one machine started again could not rejoin its peers
            task = session.run_task.options(num_cpus=cpus, num_gpus=gpus, max_retries=0, retry_exceptions=False,
                                            name=f"bench:{run.run_id}:machine{role.rank}",
                                            scheduling_strategy=on[role.rank])
            refs.append(task.remote(spec, job, inputs, cpus, forwarded, suite_dir.name, session.relay, role,
                                    transfer=session.transfer))
            session.track(key, refs[-1])
        return _collect(suite_dir, run, run_dir, roles, refs, stopper, session)
    finally:
        remove_placement_group(group)


def _collect(suite_dir: Path, run: PlannedRun, run_dir: Path, roles: list[MachineRole], refs: list[Any],
             stopper: Stopper, session: RaySession) -> Started:
    """Wait for every machine's task; the first one Ray loses cancels the others and fails the run, naming its
    node; when all came back, machine 0's folder becomes the run's and the others' rank records join it."""
    import ray

    keys = [relay_key(run.run_id, role) for role in roles]
    outcomes: dict[int, tuple] = {}
    failure: tuple[int, BaseException] | None = None
    pending = dict(zip(refs, range(len(refs))))
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
        for ref in ready:
            k = pending.pop(ref)
            try:
                outcomes[k] = ray.get(ref)
            except ray.exceptions.RayError as exc:
                if failure is None:
                    failure = (k, exc)
                    for other in pending.values():  # its peers would wait for it until gloo/NCCL time out
                        session.cancel(keys[other])
    placed = [session.untrack(key) for key in keys]
    if stopper.requested.is_set() and (failure or len(outcomes) < len(roles)):
        for key in keys:
            session.wait_until_ended(key)
        return Started(None, placed=_placement(placed))
    if failure is not None:
        k, exc = failure
        lost = lost_run(exc, placed[k])
        return Started(None, placed=_placement(placed), lost=f"machine {k} of {len(roles)}: {lost.lost}",
                       lost_type=lost.lost_type)
    _, status, launched, node_root, data = outcomes[0]
    session.transfer.take_back(data, run_dir, node_root, suite_dir)
    for k in range(1, len(roles)):  # each machine's folder: tar bytes, or a tar file on scheduler.storage
        other_status = outcomes[k][1]
        try:
            _add_machine_records(outcomes[k][4], run_dir, k)
        finally:
            session.transfer.drop(outcomes[k][4])
        if status == 0 and other_status != 0:
            status = other_status
    merge_rank_files(run_dir)
    return Started(status, launched=launched, placed=_placement(placed))


def _add_machine_records(data: bytes | Path, run_dir: Path, machine: int) -> None:
    """Machine ``machine``'s rank records (rank<k>.json) and its worker log (as worker.machine<k>.log), from the run
    folder it sent back, into the driver's run folder; each file written whole (a copy, then a rename)."""
    incoming = run_dir.with_name(f".{run_dir.name}.machine{machine}-{uuid.uuid4().hex[:8]}")
    try:
        unpack(data, incoming)
        copies = [(path, run_dir / path.name) for path in incoming.glob(RANK_FILE.format(rank="*"))]
        if (incoming / WORKER_LOG).is_file():
            copies.append((incoming / WORKER_LOG, run_dir / f"worker.machine{machine}.log"))
        for source, target in copies:
            partial = target.with_name(f".{target.name}.partial")
            shutil.copyfile(source, partial)
            partial.replace(target)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)


def _placement(placed: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """result["placement"] of a run across machines: machine 0's (where rank 0 evaluated), with ``machines``
    listing every machine's node in machine-rank order (None for one whose task never reached a node)."""
    if placed[0] is None:
        return None
    return {**placed[0], "machines": placed}


__all__ = ["start_across_machines", "node_rendezvous", "STRATEGY"]
