"""One suite's connection to Ray (the driver's side of :mod:`bench.execution.ray_scheduler`): starting a Ray
instance here or joining a cluster, and closing it however the suite ends; the stage outputs sent once (through the
object store, or a storage folder: :mod:`bench.execution.ray_channel`); the relay that carries each running task's
progress to its progress line; and cancelling every task.

Progress travels through a small actor (:class:`bench.execution.ray_node.Relay`) rather than a streaming generator
because Ray Client (``ray://HOST:PORT``) cannot stream a generator's results; one relay serves every run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator, TextIO

from bench.errors import UserError
from bench.execution.processes import KILL_AFTER_S, Progress, Started
from bench.execution.ray_channel import ObjectStoreTransfer, Transfer

WORKER_NICENESS_ENV = "RAY_worker_niceness"
"""Ray starts its worker processes at nice 15 (seen in a task: os.getpriority) unless this says otherwise, and a
run's worker inherits it. A Ray started here sets 0, the priority the local scheduler's workers have, so a run on a
machine shared with other work competes as it would without Ray. A joined cluster keeps its own setting."""
RELAY_POLL_S = 0.3
"""Seconds between the driver's collections of the relayed progress."""
LOST_TYPES = ("NodeDiedError", "WorkerCrashedError", "ObjectLostError", "OwnerDiedError", "RaySystemError",
              "ActorDiedError", "LocalRayletDiedError", "ObjectFetchTimedOutError")
"""Ray exceptions that mean the node or the task's worker process went away (error type RayNodeLost); any other
is the task failing (RayTaskFailed)."""


def first_sentence(exc: BaseException) -> str:
    """The first sentence of an exception's message (Ray's run to paragraphs), at most 300 characters."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return line.split(". ", 1)[0].rstrip(".")[:300]


def lost_run(exc: BaseException, placed: dict[str, Any] | None) -> Started:
    """A run whose task Ray lost: the failed cell names the node (or says the task never reached one) and, when
    Ray had started it more than once (scheduler.max_retries), how many attempts it made."""
    cause = getattr(exc, "cause", None) if type(exc).__name__ == "RayTaskError" else None
    kind = type(cause or exc).__name__
    where = f"on {node_name(placed)}" if placed else "before it reached a Ray node"
    attempts = len(placed.get("attempts", [])) if placed else 0
    tried = f" after {attempts} attempts ({placed['retried']})" if attempts > 1 else ""
    lost_type = "RayNodeLost" if kind in LOST_TYPES else "RayTaskFailed"
    return Started(None, placed=placed, lost=f"its Ray task ended {where} without sending the run folder back "
                                             f"({kind}: {first_sentence(cause or exc)}){tried}", lost_type=lost_type)


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """``name=value`` in this process's environment for the block (what processes started in it inherit)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


class RaySession:
    """One suite's connection to Ray: started or joined by :meth:`open`, ended by :meth:`close` (a Ray instance
    started here is shut down, so no Ray process outlives the suite, and the transfer's leftovers removed); the stage
    outputs already sent; the tasks running, each with its progress line, for the relay and :meth:`cancel_all`."""

    def __init__(self, address: str | None, stream: TextIO, transfer: Transfer | None = None,
                 max_retries: int = 0) -> None:
        self.address, self.stream = address, stream
        self.transfer: Transfer = transfer or ObjectStoreTransfer()
        self.max_retries = max_retries
        self.started_here = False
        self.relay: Any = None
        self.run_task: Any = None
        self._refs: dict[str, Any] = {}
        self._running: dict[str, tuple[Any, Progress]] = {}
        self._attempts: dict[str, list[dict[str, Any]]] = {}
        self._ended: set[str] = set()
        self._cancelled = False
        self._lock = threading.Lock()
        self._relay_lock = threading.Lock()
        self._closing = threading.Event()

    def open(self) -> dict[str, Any]:
        """Start or join Ray and start the relay; returns the cluster as suite.json records it."""
        import ray

        from bench.execution.ray_node import Relay, run_task

        options: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
        try:
            if self.address is None:
                # "local": a new instance even where another is running (None would join that one)
                with _environment(WORKER_NICENESS_ENV, "0"):
                    ray.init(address="local", include_dashboard=False, **options)
                self.started_here = True
            else:
                ray.init(address=self.address, **options)
            self.relay = ray.remote(num_cpus=0, max_restarts=0)(Relay).remote()
            self.run_task = ray.remote(run_task)  # each run's options (CPUs, GPUs, name) are set at submission
        except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, ...: one line, exit 2
            self.close()  # joined or started before the relay failed: leave nothing running
            raise UserError(f"Ray could not {'start here' if self.address is None else f'join {self.address!r}'} "
                            f"({type(exc).__name__}: {first_sentence(exc)}); check `ray status`, or set "
                            f"scheduler.name=local") from None
        threading.Thread(target=self._pump_until_closed, name="ray-relay", daemon=True).start()
        return {"scheduler": "ray", "address": self.address or "started here", "transfer": self.transfer.describe(),
                "nodes": self.nodes()}

    @staticmethod
    def nodes() -> list[dict[str, Any]]:
        """Each live node: its id, IP and CPUs and GPUs as Ray counts them."""
        import ray

        return [{"node_id": n["NodeID"], "node_ip": n.get("NodeManagerAddress"),
                 "cpus": n.get("Resources", {}).get("CPU", 0.0), "gpus": n.get("Resources", {}).get("GPU", 0.0)}
                for n in ray.nodes() if n.get("Alive")]

    def close(self) -> None:
        """Stop relaying, leave Ray (shutting down a Ray started here) and remove what the transfer left."""
        import ray

        self._closing.set()
        try:
            if ray.is_initialized():
                ray.shutdown()
        finally:
            self.transfer.close()

    def input_ref(self, path: Path, arcname: str) -> Any:
        """What a task fetches ``path`` from, as a tar under ``arcname`` (sent once, then shared)."""
        with self._lock:
            if arcname not in self._refs:
                self._refs[arcname] = self.transfer.send_input(path, arcname)
            return self._refs[arcname]

    # -- running tasks ----------------------------------------------------------------------------------
    def expect(self, run_id: str, progress: Progress | None) -> None:
        """Route ``run_id``'s relayed progress to ``progress`` (before its task is submitted: nothing is missed);
        None keeps only where its task started (a run's machine other than machine 0)."""
        with self._lock:
            self._running[run_id] = (None, progress)

    def track(self, run_id: str, task: Any) -> None:
        """Remember ``run_id``'s submitted task; cancel it at once when a stop already came."""
        with self._lock:
            self._running[run_id] = (task, self._running[run_id][1])
            cancelled = self._cancelled
        if cancelled:
            self._cancel(task)

    def untrack(self, run_id: str) -> dict[str, Any] | None:
        """Stop routing ``run_id`` after relaying what it sent; returns where its task ran (None if unknown), with
        each attempt's node and a ``retried`` note when Ray started it more than once (:func:`retried_placement`)."""
        self.pump()
        with self._lock:
            self._running.pop(run_id, None)
            attempts = list(self._attempts.get(run_id, []))
        return retried_placement(attempts, self._dead_nodes() if len(attempts) > 1 else set())

    @staticmethod
    def _dead_nodes() -> set[str]:
        """The ids of the nodes Ray counts as dead (best effort: empty when Ray cannot say)."""
        import ray

        try:
            return {n["NodeID"] for n in ray.nodes() if not n.get("Alive")}
        except Exception:  # noqa: BLE001 - Ray is closing: the note then says only that the attempt was lost
            return set()

    def wait_until_ended(self, run_id: str, timeout: float = KILL_AFTER_S + 10) -> None:
        """After a cancel: until the task says it has stopped its worker and removed its scratch folder (its
        last relayed message), so that Ray is not shut down under it; at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while run_id not in self._ended and time.monotonic() < deadline:
            self.pump()
            time.sleep(RELAY_POLL_S)

    def cancel(self, run_id: str) -> None:
        """Cancel ``run_id``'s task if it is still tracked (one machine of a run whose other machine was lost)."""
        with self._lock:
            task = self._running.get(run_id, (None, None))[0]
        if task is not None:
            self._cancel(task)

    def cancel_all(self) -> None:
        """Cancel every task submitted and not finished (queued ones never start; running ones stop their worker)."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            running = [task for task, _ in self._running.values() if task is not None]
        for task in running:
            self._cancel(task)

    @staticmethod
    def _cancel(task: Any) -> None:
        import ray

        try:
            ray.cancel(task)
        except Exception:  # noqa: BLE001 - finished meanwhile, or its node is gone: nothing left to stop
            pass

    # -- the relay ---------------------------------------------------------------------------------------
    def pump(self) -> None:
        """Collect what the tasks relayed and show it on their progress lines."""
        import ray

        with self._relay_lock:
            try:
                messages = ray.get(self.relay.drain.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - the relay's node is gone or Ray is closing: progress is best effort
                return
            for run_id, message in messages:
                self._show(run_id, message)

    def _pump_until_closed(self) -> None:
        while not self._closing.wait(RELAY_POLL_S):
            self.pump()

    def _show(self, run_id: str, message: tuple) -> None:
        kind = message[0]
        if kind == "ended":
            self._ended.add(run_id)
            return
        with self._lock:
            progress = self._running.get(run_id, (None, None))[1]
        if kind == "start":  # once per attempt: Ray starts the task again after a system failure (max_retries)
            placed = message[1]
            with self._lock:
                attempts = self._attempts.setdefault(run_id, [])
                attempts.append(placed)
                attempt = len(attempts)
        if progress is None:
            return
        if kind == "start":  # the clock starts on the node, as under the local scheduler (not in Ray's queue)
            progress.started = time.monotonic()
            again = "retrying " if attempt > 1 else ""
            of = f" (attempt {attempt} of {self.max_retries + 1})" if attempt > 1 else ""
            progress.note(f"{again}on {node_name(placed)}" + (f", GPUs {','.join(placed['gpus'])}" if placed["gpus"]
                                                             else "") + of)
        elif kind == "phase":
            progress.last_phase = message[1]
        elif kind == "progress":
            progress.update(message[1], message[2], message[3])


def node_name(placed: dict[str, Any]) -> str:
    """A node as the console and the record name it: ``Ray node HOST (IP, node id FIRST-16-HEX)``."""
    return f"Ray node {placed['hostname']} ({placed['node_ip']}, node id {placed['node_id'][:16]})"


def retried_placement(attempts: list[dict[str, Any]], dead_nodes: set[str]) -> dict[str, Any] | None:
    """A run's ``placement`` from the placement each attempt of its task relayed as it started: the last one, and
    when Ray started the task more than once (``scheduler.max_retries``), ``attempts`` (each attempt's node, in
    order) and ``retried``, a note naming each earlier attempt's node and whether that node died (``dead_nodes``)
    or only the task's worker process was lost. None when no attempt started."""
    if not attempts:
        return None
    placed = dict(attempts[-1])
    if len(attempts) == 1:
        return placed
    lost = "; ".join(f"attempt {i} on {node_name(a)} was lost "
                     f"({'its node died' if a['node_id'] in dead_nodes else 'its worker process died'})"
                     for i, a in enumerate(attempts[:-1], 1))
    retries = len(attempts) - 1
    placed["attempts"] = [{k: a[k] for k in ("node_id", "node_ip", "hostname")} for a in attempts]
    placed["retried"] = f"retried {retries} time{'s' if retries > 1 else ''}: {lost}"
    return placed


__all__ = ["RaySession", "first_sentence", "lost_run", "LOST_TYPES", "node_name", "retried_placement",
           "WORKER_NICENESS_ENV"]
