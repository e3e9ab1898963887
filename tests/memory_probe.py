"""A CPU measurement of what a piece of code allocates: the peak of live bytes above what was live when it began.

The memory model's per-phase terms (bench.systems.memory_phases) are tested against it: every tensor the CPU
allocator hands out and takes back inside ``allocation_peak(fn)`` is an event of torch's profiler
(``profile_memory=True``), in order, so their running sum is the live bytes at each moment and its maximum the
transient peak of ``fn`` on top of the tensors that existed before (weights, gradients, optimizer state). It is the
CPU counterpart of a per-phase ``torch.cuda.max_memory_allocated`` reading, without the caching allocator's
rounding. The first call in a process starts the profiler (a few seconds); later calls cost little.
"""

from __future__ import annotations

from typing import Any, Callable


def allocation_peak(fn: Callable[[], Any], where: list[str] | None = None) -> tuple[int, int, Any]:
    """(peak live bytes above the start, live bytes at the end above the start, ``fn()``'s return value);
    ``where``, when given, receives the chain of ops that made the peak allocation (for diagnosis)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        value = fn()

    def walk(events: list[Any]):
        for event in events:
            yield event
            yield from walk(event.children)

    tree = prof.profiler.kineto_results.experimental_event_tree()
    allocations = sorted((e for e in walk(tree) if e.tag == _EventType.Allocation), key=lambda e: e.start_time_ns)
    live = peak = 0
    at = None
    for event in allocations:
        live += event.extra_fields.alloc_size
        if live > peak:
            peak, at = live, event
    if where is not None and at is not None:
        chain, parent = [], at.parent
        while parent is not None:
            chain.append(parent.name)
            parent = parent.parent
        where.extend(chain)
    return peak, live, value
