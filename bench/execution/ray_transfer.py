"""Moving run folders between the driver and a Ray node without a shared filesystem: a folder or file as an
uncompressed tar, as bytes (through Ray's object store) or as a file (on a path every node mounts,
``scheduler.storage``: :mod:`bench.execution.ray_channel`), unpacked under a root that keeps the suite folder's
relative layout; absolute paths in JSON files moved from one root to the other; a run folder replaced atomically.

Uncompressed because a run's bulk is model weights, which gzip barely shrinks, at CPU seconds per hundred MB.
Nothing here imports Ray.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import uuid
from pathlib import Path

JSON_REWRITE_LIMIT = 64 * 2**20
"""Bytes: a JSON file larger than this is left as it is when paths are moved (none the suite writes comes close)."""


def pack(path: Path, arcname: str) -> bytes:
    """``path`` (a folder with everything under it, or a file) as tar bytes, stored under ``arcname``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(str(path), arcname=arcname)
    return buffer.getvalue()


def pack_file(path: Path, arcname: str, target: Path) -> Path:
    """:func:`pack`'s tar written to the file ``target`` instead (streamed: a model's weights never sit in memory
    whole), under a temporary name first and then renamed, so ``target`` is complete or absent; returns it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        with tarfile.open(str(partial), mode="w") as tar:
            tar.add(str(path), arcname=arcname)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def unpack(data: bytes | Path, root: Path) -> None:
    """Extract a tar made by :func:`pack` (its bytes) or :func:`pack_file` (its file) under ``root``; members that
    would land outside it are refused (tarfile's ``data`` filter, where this Python has it)."""
    root.mkdir(parents=True, exist_ok=True)
    opened = (tarfile.open(str(data), mode="r") if isinstance(data, Path)
              else tarfile.open(fileobj=io.BytesIO(data), mode="r"))
    with opened as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(str(root), filter="data")
        else:  # Python before 3.10.12 / 3.11.4: check the names by hand
            for member in tar.getmembers():
                target = (root / member.name).resolve()
                if root.resolve() not in (target, *target.parents) or member.issym() or member.islnk():
                    raise ValueError(f"unsafe member {member.name!r} in a run folder's archive")
            tar.extractall(str(root))


def move_paths(folder: Path, old_root: str, new_root: str) -> int:
    """Replace ``old_root`` by ``new_root`` in every JSON file under ``folder`` (result.json, rank records, model
    configs); returns how many files changed. Done on the text, as JSON escapes the string, so every absolute
    path into the old root (a node's scratch folder) now points into the new one (the driver's suite folder)."""
    old, new = json.dumps(old_root)[1:-1], json.dumps(new_root)[1:-1]
    changed = 0
    for path in folder.rglob("*.json"):
        if not path.is_file() or path.stat().st_size > JSON_REWRITE_LIMIT:
            continue
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        if old in text:
            path.write_text(text.replace(old, new), encoding="utf-8", errors="surrogateescape")
            changed += 1
    return changed


def replace_folder(target: Path, incoming: Path) -> None:
    """Put the folder ``incoming`` (a sibling of ``target``) in ``target``'s place: ``target`` is moved aside,
    ``incoming`` renamed into its place, then the old one removed, so ``target`` never holds a half-written mix."""
    aside = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    if target.exists():
        os.replace(target, aside)
    os.replace(incoming, target)
    shutil.rmtree(aside, ignore_errors=True)


def receive_run_folder(data: bytes | Path, run_dir: Path, node_root: str, suite_dir: Path) -> None:
    """The run folder a node sent back (a tar of its contents: bytes, or a file) becomes ``run_dir``, atomically:
    unpacked into a temporary sibling, the driver's own run.json kept, absolute paths moved from ``node_root`` to
    ``suite_dir``, then swapped in (:func:`replace_folder`)."""
    from bench.execution.worker import RUN_FILE

    incoming = run_dir.with_name(f".{run_dir.name}.incoming-{uuid.uuid4().hex[:8]}")
    try:
        unpack(data, incoming)
        if (run_dir / RUN_FILE).is_file():  # what the driver asked for, with the driver's paths
            shutil.copy2(run_dir / RUN_FILE, incoming / RUN_FILE)
        move_paths(incoming, node_root, str(suite_dir))
        replace_folder(run_dir, incoming)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)


__all__ = ["pack", "pack_file", "unpack", "move_paths", "replace_folder", "receive_run_folder"]
