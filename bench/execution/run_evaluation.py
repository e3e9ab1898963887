"""The evaluation of a run: which runs are evaluated, and the greedy scoring of the trained policy on the held-out
rows, in one numerics and at one CPU thread count for every policy, so that a 'before' and an 'after' compare.
"""

from __future__ import annotations

import contextlib
from typing import Any

from bench.execution.cpu_threads import torch_threads


def evaluates(job: dict[str, Any]) -> bool:
    """Method runs and the warm start are evaluated (the warm start's score is every method's 'before')."""
    return job["name"] == "warm_start" or job["kind"] == "method"


def evaluate_policy(spec: Any, outcome: Any, test_rows: list[dict[str, str]], telemetry: Any,
                    threads: int | None = None) -> dict[str, Any]:
    """Greedy evaluation of the trained policy on the held-out rows, timed as phase 'evaluation'.

    The questions are asked in ``spec.eval.prompt_style`` (bench.task.prompts; training used the tags prompt); the
    returned dict is bench.scoring.evaluation.evaluate's plus 'prompt_style' and 'precision'. Every policy — the
    warm start's checkpoint, every method, every seed — is scored in the one evaluation numerics
    (bench.model.numerics.actor_numerics: bf16 autocast with a float32 residual stream under a bfloat16 spec, float32
    otherwise), recorded as 'precision' (bench.model.numerics.evaluation_precision); on a CPU also at one thread
    count (``threads``: :func:`bench.execution.cpu_threads.evaluation_threads`; None: torch's current), recorded
    as precision['cpu_threads'].
    """
    import torch

    from bench.scoring.evaluation import evaluate
    from bench.model.generation import eos_token_ids, sampling_settings
    from bench.model.numerics import actor_numerics, evaluation_precision
    from bench.task.prompts import styled_rows

    # Explicit settings, built from the spec alone (not from the model's generation_config), so that every
    # method is evaluated with the same decoding; evaluate() returns them as "generation" for the result.
    settings = sampling_settings(spec, outcome.tokenizer, eos_token_ids(outcome.policy, outcome.tokenizer),
                                 greedy=True)
    style = spec.eval.prompt_style
    rows = styled_rows(test_rows, outcome.tokenizer, style, spec.model.use_chat_template)
    threads = torch.get_num_threads() if threads is None else threads
    # vLLM decodes in its own threads (and its CPU build refuses torch.set_num_threads once it has bound them).
    by_torch = settings.get("backend") != "vllm"
    with (telemetry.phase("evaluation"), actor_numerics(outcome.policy, spec.model.dtype),
          torch_threads(threads) if by_torch else contextlib.nullcontext()):
        evaluation = evaluate(outcome.policy, outcome.tokenizer, rows, spec.eval.max_new_tokens,
                              spec.eval.batch_size, spec.eval.samples_in_report, settings=settings)
    precision = evaluation_precision(outcome.policy, spec.model.dtype, settings)
    if next(outcome.policy.parameters()).device.type == "cpu" and by_torch:
        precision["cpu_threads"] = threads
    return {**evaluation, "prompt_style": style, "precision": precision}



def source_start_scores(spec: Any, outcome: Any, test_rows: list[dict[str, str]], telemetry: Any, device: str,
                        threads: int | None = None) -> dict[str, Any] | None:
    """The source weights' own scores (bench.scoring.evaluation's 'scores', per mode), when the start every method
    loads is a changed copy of them; None otherwise.

    With the warm start off, the start is the source model saved in the frozen networks' dtype (bf16 under a
    bfloat16 spec: baselines/sft.save_start), and a real model's greedy completions can change with that rounding.
    A reader comparing with a plain run from the fetched weights then needs both starts' accuracy, scored alike
    (the same numerics, threads and rows as the copy's); the warm start's own metrics say whether they differ
    (``start_from``, ``start_max_abs_change``).
    """
    metrics = outcome.metrics or {}
    if metrics.get("start_from") != "source weights" or not metrics.get("start_max_abs_change"):
        return None
    from types import SimpleNamespace

    from bench.model.loading import load_causal_lm

    source = load_causal_lm(outcome.settings["source"], spec.model, device, trained=True)  # float32 values
    try:
        scored = evaluate_policy(spec, SimpleNamespace(policy=source, tokenizer=outcome.tokenizer), test_rows,
                                 telemetry, threads)
    finally:
        del source
    return scored["scores"]
