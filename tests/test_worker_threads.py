"""Threads per worker (issue 20): by default a method run takes cores / parallel runs (never every core beside
another run: a real model's evaluation took 301 s that way instead of 28-70 s), a stage takes every core (stages
run alone), and an explicit spec.threads wins."""

from __future__ import annotations

import pytest
import torch

from bench.config.loading import load_spec
from bench.execution.worker import concurrent_runs, configure_threads, worker_threads


@pytest.mark.parametrize("threads, runs, kind, cores, want", [
    (0, 1, "method", 16, 16),
    (0, 2, "method", 16, 8),
    (0, 3, "method", 16, 5),
    (0, 4, "method", 2, 1),  # never 0
    (0, 2, "stage", 16, 16),  # stages run alone
    (1, 2, "method", 16, 1),  # explicit: method runs
    (1, 2, "stage", 16, 16),  # ... only, when runs share the machine
    (3, 1, "stage", 16, 3),  # one run at a time: everything
])
def test_worker_threads(threads, runs, kind, cores, want) -> None:
    assert worker_threads(threads, runs, kind, cores) == want


def test_concurrent_runs_reads_the_resolved_count() -> None:
    spec = load_spec("cpu-quick", ["parallel_runs=3"])
    assert concurrent_runs(spec) == 3
    assert concurrent_runs(spec, 2) == 2  # the runner's resolution wins
    spec.parallel_runs = "auto"
    assert concurrent_runs(spec) == 1 and concurrent_runs(spec, 4) == 4


def test_configure_threads_sets_torch() -> None:
    before = torch.get_num_threads()
    try:
        spec = load_spec("cpu-quick", ["threads=0", "parallel_runs=2"])
        set_to = configure_threads(spec, "method", 2)
        assert set_to == torch.get_num_threads() >= 1
        spec = load_spec("cpu-quick", ["threads=1", "parallel_runs=2"])
        assert configure_threads(spec, "method") == torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
