"""How many CPU threads torch uses in a worker: a method run takes cores / parallel runs, a stage every core (stages
run alone), an explicit ``spec.threads`` wins; every evaluation runs at a method run's count.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator


def configure_threads(spec: Any, kind: str, concurrent: Any = None) -> int:
    """Set torch's CPU threads for this run (:func:`worker_threads`) and return the number set.

    ``concurrent``: how many runs share the machine, as the runner resolved ``parallel_runs`` (an int; ``auto``
    or None: ``spec.parallel_runs`` when it is a number, else 1)."""
    import torch

    threads = worker_threads(spec.threads, concurrent_runs(spec, concurrent), kind, available_cores())
    torch.set_num_threads(threads)
    return threads


def evaluation_threads(spec: Any, concurrent: Any = None) -> int:
    """torch CPU threads of every evaluation, a stage's included: a method run's (:func:`worker_threads` of kind
    'method'), so the start and every method are scored at the same thread count.

    Why: a CPU matmul splits its work by the thread count, and the split changes the order of its sums; a real
    model's greedy completion can turn on that last bit (SmolLM2-135M under bf16 autocast: 1 of 4 questions
    differed between 1 and 2 threads), so a start scored by a stage at every core and a control arm at its share
    would differ with no weight changed. On a GPU the count does not enter (the record carries it on a CPU only)."""
    return worker_threads(spec.threads, concurrent_runs(spec, concurrent), "method", available_cores())


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """A region in which torch uses ``threads`` CPU threads; the count before it is restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def concurrent_runs(spec: Any, concurrent: Any = None) -> int:
    """The resolved number of method runs at a time: ``concurrent`` when the runner gave one, else
    ``spec.parallel_runs`` when it is a number (``auto`` unresolved: 1)."""
    for value in (concurrent, spec.parallel_runs):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return 1


def worker_threads(threads: int, parallel_runs: int, kind: str, cores: int) -> int:
    """torch CPU threads of one worker: ``threads`` when set (> 0; with ``parallel_runs`` > 1 for method runs
    only), else cores / parallel_runs for a method run (at least 1) and every core for a stage (stages run alone).

    Why not torch's default (every core per process): two runs side by side with every core each oversubscribe
    the machine (a real model's evaluation of 12 questions took 301 s that way, 28-70 s at 1 thread)."""
    if kind == "method":
        return threads if threads > 0 else max(1, cores // max(1, parallel_runs))
    return threads if threads > 0 and parallel_runs == 1 else cores


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else os.cpu_count())."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)
