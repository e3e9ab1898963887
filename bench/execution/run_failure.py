"""What a failed run records: the error's type (``Interrupted``, OUT_OF_MEMORY, or the exception's class), a one-line
capped message, the memory reading at the failure, and the phase the run was in when it failed.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from bench.execution.worker_signals import Interrupted, interruption_message
from bench.results import MESSAGE_LIMIT, cap_text

OUT_OF_MEMORY = "OutOfMemory"
"""error.type of a run that ran out of memory (CUDA, or MemoryError / the allocator's error on a CPU); the error
also names the exception and the phase it happened in (bench.execution.runner treats it as expected at a sweep point)."""


def failure_record(exc: BaseException, telemetry: Any, phase: str | None = None) -> dict[str, Any]:
    """result["error"] for ``exc``: its type (``Interrupted`` for a stop request, OUT_OF_MEMORY for any
    out-of-memory error, whose class goes to ``exception``), a one-line, capped message, the memory reading and
    the phase the run was in (:func:`failure_phase`; None when unknown)."""
    stop = stop_request(exc)
    interrupted = stop is not None
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if stop is not None:
        text = interruption_message(stop)
    kind = "Interrupted" if interrupted else OUT_OF_MEMORY if is_out_of_memory(exc) else type(exc).__name__
    record = {
        "type": kind,
        "message": cap_text(text or type(exc).__name__, MESSAGE_LIMIT),
        "memory_at_failure": _memory_at_failure(telemetry),
        "phase": phase,
    }
    if kind == OUT_OF_MEMORY:
        record["exception"] = type(exc).__name__
    return record


def stop_request(exc: BaseException) -> BaseException | None:
    """The stop request (Interrupted, KeyboardInterrupt) that ``exc`` is or that it was raised from, else None.
    A stop that lands inside an import can come out as another error: Python wraps it in a RuntimeError when it
    arrives in a class's ``__set_name__``, and transformers' lazy modules turn that into a ModuleNotFoundError
    ("Could not import module 'TrainerCallback'"); the chain (``__cause__``, ``__context__``) still holds it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, (Interrupted, KeyboardInterrupt)):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def is_out_of_memory(exc: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError (any class named OutOfMemoryError), MemoryError, or the RuntimeError that the
    CUDA runtime and torch's CPU allocator raise when an allocation fails."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


@contextlib.contextmanager
def failure_phase(telemetry: Any, live: dict[str, Any]) -> Iterator[None]:
    """On an exception, record in ``live["failure_phase"]`` where the run was: the innermost phase open when it was
    raised, else 'setup' before training started (models loading), else 'other'.

    A ``with telemetry.phase(...)`` block closes its phase while the exception passes through it, so the phase is
    noted as it closes (the innermost first, with the exception in flight); a phase still open when the exception
    arrives here (one closed by no ``with``) is read directly. Entered inside ``with telemetry``.
    """
    seen: dict[str, Any] = {}
    original = telemetry.end_phase

    def end_phase(name: str) -> None:
        exc = sys.exc_info()[1]
        if exc is not None and seen.get("exc") is not exc:
            active = telemetry.active_phases()
            seen.update(exc=exc, phase=active[-1] if active else name)
        original(name)

    telemetry.end_phase = end_phase
    try:
        yield
    except BaseException as exc:
        try:
            live["failure_phase"] = _phase_of(exc, seen, telemetry)
        except Exception:  # noqa: BLE001 - best effort while another failure is on its way out
            pass
        raise
    finally:
        telemetry.end_phase = original


def _phase_of(exc: BaseException, seen: dict[str, Any], telemetry: Any) -> str:
    """The phase noted for ``exc`` (or for an exception it was raised from), else the open one, else setup/other."""
    link: BaseException | None = exc
    while link is not None:
        if seen.get("exc") is link:
            return seen["phase"]
        link = link.__cause__ or link.__context__
    active = telemetry.active_phases()
    if active:
        return active[-1]
    return "other" if (telemetry.timing() or {}).get("setup_s") is not None else "setup"


def _memory_at_failure(telemetry: Any) -> str | None:
    """The telemetry's peak memory with its source, for the failure's record; None when there is none to read."""
    if telemetry is None:
        return None
    try:
        memory = telemetry.summary()["memory"]
    except Exception:  # noqa: BLE001 - best effort while reporting another failure
        return None
    if memory.get("peak_bytes") is None:
        return None
    return f"{memory['peak_bytes'] / 2**30:.2f} GiB peak ({memory['source']})"
