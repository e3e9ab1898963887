"""Threads per worker: by default a method run takes cores / parallel runs (never every core beside
another run: a real model's evaluation took 301 s that way instead of 28-70 s), a stage takes every core (stages
run alone), and an explicit spec.threads wins. Every evaluation, a stage's included, runs at a method run's count
(a CPU matmul's sums follow the thread count, and a real model's greedy completion turned on it)."""

from __future__ import annotations

import pytest
import torch

from bench.config.loading import load_spec
from bench.execution import cpu_threads, run_evaluation
from bench.execution.cpu_threads import (concurrent_runs, configure_threads, evaluation_threads, torch_threads,
                                         worker_threads)
from bench.execution.run_result import evaluation_record

TORCH_SET_NUM_THREADS = torch.set_num_threads
"""torch's own setter, taken at collection (before any test runs): vLLM's CPU build replaces it with a no-op in a
process where its engine has bound the threads (tests/test_vllm_backend.py starts one in the test process)."""


@pytest.fixture(autouse=True)
def torch_can_set_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check what the suite sets; a vLLM test earlier in the same process must not decide them."""
    monkeypatch.setattr(torch, "set_num_threads", TORCH_SET_NUM_THREADS)


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


def test_every_evaluation_runs_at_a_method_runs_thread_count(monkeypatch) -> None:
    monkeypatch.setattr(cpu_threads, "available_cores", lambda: 16)
    spec = load_spec("cpu-quick", ["threads=0", "parallel_runs=2"])
    assert evaluation_threads(spec, 2) == worker_threads(0, 2, "method", 16) == 8
    assert worker_threads(0, 2, "stage", 16) == 16  # the stage trains and samples at every core, scores at 8
    spec = load_spec("cpu-quick", ["threads=1", "parallel_runs=2"])
    assert evaluation_threads(spec, 2) == 1


def test_torch_threads_sets_the_count_for_its_region_and_restores_it() -> None:
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError("a failed evaluation")
    assert torch.get_num_threads() == before


def test_the_evaluation_scores_at_the_given_count_and_records_it(monkeypatch) -> None:
    """evaluate_policy holds torch at ``threads`` while it generates, restores the count after, and records it with
    the numerics (the generation itself is replaced: what is checked is the count it ran at)."""
    import contextlib
    from types import SimpleNamespace

    seen: list[int] = []

    def fake_evaluate(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return {"records": []}

    monkeypatch.setattr("bench.scoring.evaluation.evaluate", fake_evaluate)
    monkeypatch.setattr("bench.model.generation.eos_token_ids", lambda model, tokenizer: [0])
    monkeypatch.setattr("bench.model.generation.sampling_settings",
                        lambda spec, tokenizer, eos, greedy: {"max_new_tokens": 4, "backend": "transformers"})
    monkeypatch.setattr("bench.task.prompts.styled_rows", lambda rows, tokenizer, style, chat: rows)
    spec = load_spec("cpu-quick")
    telemetry = SimpleNamespace(phase=lambda name: contextlib.nullcontext())
    outcome = SimpleNamespace(policy=torch.nn.Linear(2, 2), tokenizer=None)
    before = torch.get_num_threads()
    out = run_evaluation.evaluate_policy(spec, outcome, [], telemetry, threads=1)
    assert seen == [1] and torch.get_num_threads() == before
    assert out["precision"] == {"storage": "float32", "compute": "float32", "cpu_threads": 1}


def test_a_vllm_evaluation_leaves_torchs_threads_alone(monkeypatch) -> None:
    """Under the vllm backend vLLM decodes in its own threads: the count is neither set nor recorded."""
    import contextlib
    from types import SimpleNamespace

    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setattr("bench.scoring.evaluation.evaluate", lambda *args, **kwargs: {"records": []})
    monkeypatch.setattr("bench.model.generation.eos_token_ids", lambda model, tokenizer: [0])
    monkeypatch.setattr("bench.model.generation.sampling_settings",
                        lambda spec, tokenizer, eos, greedy: {"max_new_tokens": 4, "backend": "vllm",
                                                              "vllm": {"dtype": "float32"}})
    monkeypatch.setattr("bench.task.prompts.styled_rows", lambda rows, tokenizer, style, chat: rows)
    telemetry = SimpleNamespace(phase=lambda name: contextlib.nullcontext())
    outcome = SimpleNamespace(policy=torch.nn.Linear(2, 2), tokenizer=None)
    out = run_evaluation.evaluate_policy(load_spec("cpu-quick"), outcome, [], telemetry, threads=1)
    assert calls == [] and "cpu_threads" not in out["precision"]
    assert out["precision"]["compute"] == "vllm (float32)"


def test_a_start_scored_at_another_thread_count_is_not_the_same_numerics() -> None:
    one = {"storage": "float32", "compute": "bfloat16 autocast, float32 residual stream", "cpu_threads": 1}
    assert evaluation_record(one, {"evaluation": {"precision": dict(one)}})["same_numerics"] is True
    two = {**one, "cpu_threads": 2}
    assert evaluation_record(one, {"evaluation": {"precision": two}})["same_numerics"] is False
    gpu = {"storage": "float32", "compute": "bfloat16 autocast, float32 residual stream"}  # no count on a GPU
    assert evaluation_record(gpu, {"evaluation": {"precision": dict(gpu)}})["same_numerics"] is True
