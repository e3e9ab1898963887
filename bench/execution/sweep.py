"""A sweep run's own work: the spec and ``run.json["sweep"]`` the runner writes for it, and in the worker the
point's memory-model predictions and the out-of-memory test hook (``sweep.inject_oom``).

Expansion and validation of a sweep's points are configuration (:mod:`bench.config.sweep`); planning the runs of
the points is :func:`bench.execution.plan.plan_sweep`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bench.config.spec import ScaleSpec, Spec
from bench.config.sweep import EXTRAPOLATE_TO
from bench.config.rules import point_spec
from bench.execution.plan import PlannedRun


# -- what the runner writes for a run ---------------------------------------------------------------------
def job_spec(spec: Spec, run: PlannedRun) -> dict[str, Any]:
    """The resolved spec a run's worker gets: the point's for a sweep run, else the suite's (under ``seed_scope:
    pipeline`` with the run's own seed first: the tiny model's initialisation reads ``seeds[0]``)."""
    if run.point is None:
        data = spec.to_dict()
        if spec.seed_scope == "pipeline":
            data["seeds"] = [run.seed] + [s for s in spec.seeds if s != run.seed]
        return data
    return point_spec(spec, dict(run.values)).to_dict()


def job_sweep(spec: Spec, run: PlannedRun) -> dict[str, Any] | None:
    """``run.json["sweep"]`` (copied into the result): the point, its values, the steps and the OOM test hook."""
    if run.point is None:
        return None
    inject = spec.sweep.inject_oom
    # A stage run carries the first point that reads it, so naming a stage and that point fails the stage.
    hit = inject.point == run.point and (inject.method == run.name or (inject.method is None and run.kind == "method"))
    return {
        "point": run.point, "values": dict(run.values), "mode": spec.sweep.mode,
        # per_method: the axes are methods; the keys of the point are what varied
        "axes": list(dict(run.values)) if spec.sweep.mode == "per_method" else list(spec.sweep.axes),
        "steps": spec.sweep.steps, "warmup_steps": spec.sweep.warmup_steps,
        "inject_oom": {"phase": inject.phase} if hit else None,
    }


# -- in the worker ----------------------------------------------------------------------------------------
def prepare_point(job: dict[str, Any], spec: Spec, result: dict[str, Any], telemetry: Any, tokenizer: Any = None,
                  train_rows: list[dict[str, str]] | None = None) -> None:
    """Record the point and the memory model's predictions in ``result``, and arm the OOM test hook.

    Called before training, so that a run that fails (an OOM above all) keeps its prediction. The prediction is
    made for the longest training prompt in tokens (:func:`longest_prompt`; padding makes every sequence of a
    batch that long). Never raises: a missing or broken memory model leaves a note, not a failed run.
    """
    info = dict(job["sweep"])
    inject = info.pop("inject_oom", None)
    result["sweep"] = info
    if job["kind"] == "method":
        prompt_tokens = longest_prompt(tokenizer, train_rows)
        info["prompt_tokens"] = prompt_tokens
        result["prediction"], note = predict(spec, job["name"], prompt_tokens)
        result["prediction_extrapolated"] = extrapolate(spec, job["name"], prompt_tokens) if note is None else None
        if note is not None:
            result["sweep"]["prediction_note"] = note
    if inject:
        arm_oom(telemetry, inject["phase"], f"out of memory (injected by sweep.inject_oom, a test hook) at point "
                                            f"{info['point']}, phase {inject['phase']}")


def longest_prompt(tokenizer: Any, rows: list[dict[str, str]] | None) -> int | None:
    """Tokens in the longest training prompt (None without a tokenizer or rows: the memory model's default)."""
    if tokenizer is None or not rows:
        return None
    try:
        return max(len(tokenizer(row["prompt"])["input_ids"]) for row in rows)
    except Exception:  # noqa: BLE001 - an estimate's input; the model's default is the fallback
        return None


def predict(spec: Spec, method: str, prompt_tokens: int | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """(the memory model's prediction as JSON, None) or (None, why there is none)."""
    try:
        from bench.systems.memory_model import predict_for_spec
    except ImportError as exc:
        return None, f"no memory model in this checkout ({exc})"
    try:
        extra = {"prompt_tokens": prompt_tokens} if prompt_tokens else {}
        return predict_for_spec(spec, method, **extra).to_json(), None
    except Exception as exc:  # noqa: BLE001 - a model bug must not fail the measurement it is compared with
        return None, f"the memory model failed: {type(exc).__name__}: {exc}"


def extrapolate(spec: Spec, method: str, prompt_tokens: int | None = None) -> dict[str, Any] | None:
    """The method's predictions at the full-size EXTRAPOLATE_TO architectures, with this point's other settings."""
    if spec.model.source != "architecture":
        return None
    out: dict[str, Any] = {}
    for name in EXTRAPOLATE_TO:
        model = dataclasses.replace(spec.model, architecture=name, scale=ScaleSpec())
        prediction, _ = predict(dataclasses.replace(spec, model=model), method, prompt_tokens)
        if prediction is not None:
            out[name] = prediction
    return out or None


def arm_oom(telemetry: Any, phase: str, message: str) -> None:
    """Make the first start of ``phase`` raise MemoryError(message), after the phase is open (so the failure is
    recorded in that phase). The test hook behind ``sweep.inject_oom``."""
    original = telemetry.begin_phase
    fired = [False]

    def begin_phase(name: str) -> None:
        original(name)
        if name == phase and not fired[0]:
            fired[0] = True
            raise MemoryError(message)

    telemetry.begin_phase = begin_phase
