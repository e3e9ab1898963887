"""How a run's data travels between the driver and its Ray node (``scheduler.storage``): the one seam between
Ray's object store and a folder every node mounts.

Both ways keep :mod:`bench.execution.ray_transfer`'s tar format. A transfer is made on the driver, used there to
send each stage output once (:meth:`send_input`) and to take a run folder back (:meth:`take_back`), and travels
with each task to its node, which reads the inputs (:meth:`fetch_input`) and sends the run folder
(:meth:`send_back`):

- :class:`ObjectStoreTransfer` (``storage: null``): tar bytes through Ray's object store; no shared filesystem.
- :class:`StorageTransfer` (``storage: PATH``): tar files under ``PATH/<suite folder>-<id>/`` (``inputs/`` written
  once by the driver, ``runs/<run_id>.tar`` written by the node under a temporary name then renamed), since model
  weights can outgrow the object store. Before any work the driver checks that every node shares the folder
  (:func:`probe_storage`); the folder is removed when the suite ends, however it ends.
"""

from __future__ import annotations

import shutil
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bench.errors import UserError
from bench.execution.ray_transfer import pack, pack_file, receive_run_folder

STORAGE_PROBE_TIMEOUT_S = 60.0
"""Seconds every node has to run the storage probe, so that a node that never schedules a task stops the suite
with a line naming it instead of hanging it."""
OBJECT_STORE_FIX = "set scheduler.storage=null to move data through Ray's object store"
"""The way out of every storage problem: no storage."""
STORAGE_FIX = f"mount the same path on every node, or {OBJECT_STORE_FIX}"
"""What a user does about a storage path that a node does not share."""


class Transfer(Protocol):
    """The driver's and the node's halves of moving a run's data (see the module's docstring)."""

    def describe(self) -> str:
        """How data travels, as suite.json's ``schedule.transfer`` records it."""

    def open(self, nodes: list[dict[str, Any]]) -> None:
        """On the driver, once Ray is up and before any work: get ready, checking ``nodes`` can take part."""

    def send_input(self, path: Path, arcname: str) -> Any:
        """On the driver: ``path`` as a tar under ``arcname``; returns what a task passes to :meth:`fetch_input`."""

    def fetch_input(self, sent: Any) -> bytes | Path:
        """On the node: the tar :meth:`send_input` made (bytes or a file), for ray_transfer.unpack."""

    def send_back(self, run_dir: Path, run_id: str) -> Any:
        """On the node: the finished run folder's contents as a tar; returns what the task hands the driver."""

    def take_back(self, sent: Any, run_dir: Path, node_root: str, suite_dir: Path) -> None:
        """On the driver: what :meth:`send_back` returned becomes ``run_dir`` (atomically), its tar then dropped."""

    def drop(self, sent: Any) -> None:
        """On the driver: what :meth:`send_back` returned is no longer needed (read some other way than
        :meth:`take_back`: the rank records of a run's machine other than machine 0)."""

    def close(self) -> None:
        """On the driver, when the suite ends however it ends: remove what the transfer left (idempotent)."""


class ObjectStoreTransfer:
    """``scheduler.storage: null``: tar bytes through Ray's object store (each input put once and shared)."""

    def describe(self) -> str:
        return "object store"

    def open(self, nodes: list[dict[str, Any]]) -> None:
        """Nothing to check: every node reaches the object store."""

    def send_input(self, path: Path, arcname: str) -> Any:
        import ray

        return ray.put(pack(path, arcname))

    def fetch_input(self, sent: Any) -> bytes:
        import ray

        return ray.get(sent)

    def send_back(self, run_dir: Path, run_id: str) -> bytes:
        return pack(run_dir, ".")

    def take_back(self, sent: bytes, run_dir: Path, node_root: str, suite_dir: Path) -> None:
        receive_run_folder(sent, run_dir, node_root, suite_dir)

    def drop(self, sent: bytes) -> None:
        """Nothing to remove: the bytes are the driver's own."""

    def close(self) -> None:
        """Nothing left: the objects go when Ray does."""


@dataclass
class StorageTransfer:
    """``scheduler.storage: PATH``: tar files in ``folder`` (PATH/<suite folder>-<id>), which every node mounts at
    the same place. Picklable (a path and the storage setting): it travels with each task."""

    storage: str
    """scheduler.storage as given, for the record and the error lines."""
    folder: str
    """This suite's own folder under it; nothing else under ``storage`` is touched."""

    @classmethod
    def for_suite(cls, storage: str, suite_name: str) -> "StorageTransfer":
        """A transfer in a new folder under ``storage`` named after the suite folder (two suites writing to the
        same storage, or a --resume of this one, never share a folder)."""
        return cls(storage, str(Path(storage) / f"{suite_name}-{uuid.uuid4().hex[:8]}"))

    def describe(self) -> str:
        return f"storage: {self.storage}"

    def open(self, nodes: list[dict[str, Any]]) -> None:
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        probe_storage(Path(self.folder), self.storage, nodes)

    # paths, not strings, travel: ray_transfer.unpack and receive_run_folder read a Path as a tar file
    def send_input(self, path: Path, arcname: str) -> Path:
        return pack_file(path, arcname, Path(self.folder) / "inputs" / f"{arcname}.tar")

    def fetch_input(self, sent: Path) -> Path:
        return Path(sent)

    def send_back(self, run_dir: Path, run_id: str) -> Path:
        return pack_file(run_dir, ".", Path(self.folder) / "runs" / f"{run_id}.tar")

    def take_back(self, sent: Path, run_dir: Path, node_root: str, suite_dir: Path) -> None:
        try:
            receive_run_folder(Path(sent), run_dir, node_root, suite_dir)
        finally:
            Path(sent).unlink(missing_ok=True)

    def drop(self, sent: Path) -> None:
        Path(sent).unlink(missing_ok=True)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def make_transfer(storage: str | None, suite_name: str) -> Transfer:
    """The transfer ``scheduler.storage`` asks for (the only place the choice is made)."""
    return ObjectStoreTransfer() if storage is None else StorageTransfer.for_suite(storage, suite_name)


def storage_problem(storage: str | None) -> str | None:
    """Before any work, on the driver: None when ``storage`` is null or an existing folder this process can write
    in, else the one line saying what is wrong and the fix."""
    if storage is None:
        return None
    path = Path(storage)
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        return (f"'scheduler.storage' {storage!r} {what} on this machine; create it on a filesystem every Ray node "
                f"mounts at the same path, or {OBJECT_STORE_FIX}")
    probe = path / f".bench-write-check-{uuid.uuid4().hex[:8]}"
    try:
        probe.write_text("ok", encoding="utf-8")
        probe.unlink()
    except OSError as exc:
        return (f"'scheduler.storage' {storage!r} is not writable here ({type(exc).__name__}: "
                f"{exc.strerror or exc}); fix its permissions or choose another folder, or {OBJECT_STORE_FIX}")
    return None


# -- the probe: does every node share the folder? ------------------------------------------------------------
DRIVER_PROBE = "driver"
"""The probe file the driver writes (the token); each node writes ``node-<node id>`` (the token and its id)."""


def probe_storage(folder: Path, storage: str, nodes: list[dict[str, Any]],
                  timeout: float = STORAGE_PROBE_TIMEOUT_S) -> None:
    """Check that every live node shares ``folder`` with the driver, both ways: the driver writes a probe file
    with a random token, one tiny task pinned to each node (no CPU) reads it and writes its own, and the driver
    reads each node's. Any failure, or a node that does not run its task within ``timeout`` seconds, is one line
    (UserError) naming the node and the fix. The probe files are removed however it ends."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probes = folder / "probe"
    token = uuid.uuid4().hex
    probes.mkdir(parents=True, exist_ok=True)
    try:
        write_driver_probe(probes, token)
        task = ray.remote(probe_on_node)
        refs = {node["node_id"]: task.options(
            num_cpus=0, max_retries=0, name="bench:storage-probe",
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["node_id"], soft=False)).remote(str(probes), token)
            for node in nodes}
        ready, _ = (ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout) if refs else ([], []))
        try:
            for node in nodes:
                check_node_probe(storage, probes, token, node, refs[node["node_id"]], refs[node["node_id"]] in ready,
                                 timeout)
        finally:
            for ref in refs.values():
                if ref not in ready:
                    _cancel(ref)
    finally:
        shutil.rmtree(probes, ignore_errors=True)


def _cancel(ref: Any) -> None:
    """Cancel a probe task that has not run (best effort: its node may be gone)."""
    import ray

    try:
        ray.cancel(ref, force=True)
    except Exception:  # noqa: BLE001 - finished meanwhile, or its node is gone
        pass


def write_driver_probe(probes: Path, token: str) -> None:
    """The driver's probe file: the token each node must read back."""
    (probes / DRIVER_PROBE).write_text(token, encoding="utf-8")


def check_node_probe(storage: str, probes: Path, token: str, node: dict[str, Any], ref: Any, answered: bool,
                     timeout: float) -> None:
    """One node's side of :func:`probe_storage`: its task ran, read the driver's token and wrote a probe file
    this machine reads back; else UserError naming the node."""
    import ray

    where = f"Ray node {node['node_ip']} (node id {node['node_id'][:16]})"
    if not answered:
        raise UserError(f"scheduler.storage {storage!r} could not be checked on {where}: its probe task did not run "
                        f"within {timeout:g} s; check the node (`ray status`), or {OBJECT_STORE_FIX}")
    try:
        answer = ray.get(ref)
    except Exception as exc:  # noqa: BLE001 - the node died, or Ray refused the task: one line naming the node
        raise UserError(f"scheduler.storage {storage!r} could not be checked on {where}: its probe task failed "
                        f"({type(exc).__name__}); check the node (`ray status`), or {OBJECT_STORE_FIX}") from None
    where = f"Ray node {answer['hostname']} ({answer['node_ip']})"
    if answer["problem"]:
        raise UserError(f"scheduler.storage {storage!r} is not shared with {where}: it could not {answer['problem']}; "
                        f"{STORAGE_FIX}")
    try:
        seen = (probes / f"node-{node['node_id']}").read_text(encoding="utf-8")
    except OSError as exc:
        seen = f"unreadable ({type(exc).__name__})"
    if seen != f"{token} {node['node_id']}":
        why = seen if seen.startswith("unreadable") else "a different file"
        raise UserError(f"scheduler.storage {storage!r} is not shared with {where}: the probe file it wrote there is "
                        f"{why} on this machine; {STORAGE_FIX}")


def probe_on_node(probes: str, token: str) -> dict[str, Any]:
    """The probe task on one node: read the driver's token and write this node's probe file, both in ``probes``.
    Returns the node's name and address, and ``problem``: None, or what it could not do (with the error's type)."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    answer: dict[str, Any] = {"hostname": socket.gethostname(), "node_ip": ray.util.get_node_ip_address(),
                              "problem": None}
    folder = Path(probes)
    try:
        seen = (folder / DRIVER_PROBE).read_text(encoding="utf-8")
    except OSError as exc:
        answer["problem"] = f"read the probe file the driver wrote there ({type(exc).__name__})"
        return answer
    if seen != token:
        answer["problem"] = "find the driver's probe file there (it read another suite's, or another folder)"
        return answer
    try:
        (folder / f"node-{node_id}").write_text(f"{token} {node_id}", encoding="utf-8")
    except OSError as exc:
        answer["problem"] = f"write a probe file there ({type(exc).__name__})"
    return answer


__all__ = ["Transfer", "ObjectStoreTransfer", "StorageTransfer", "make_transfer", "storage_problem",
           "probe_storage", "probe_on_node", "STORAGE_PROBE_TIMEOUT_S"]
