"""The plan: ordered runs with stable ids. Shared stages first, then one run per (method, seed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench import registry
from bench.precision import describe_policy, precision_policy, with_shared_reference
from bench.spec import Spec


@dataclass(frozen=True)
class PlannedRun:
    """One subprocess of the suite."""

    run_id: str
    """Stable id, also its folder name under runs/."""
    name: str
    """Registry name (stage or method)."""
    kind: str
    """'stage' or 'method'."""
    seed: int
    label: str
    engine: str
    needs: tuple[str, ...] = field(default_factory=tuple)
    """Run ids that must have finished successfully first."""
    point: str | None = None
    """Sweep point id (bench.sweep); None outside a sweep."""
    values: tuple[tuple[str, Any], ...] = ()
    """The sweep point's (dotted key, value) pairs applied to the spec for this run; empty outside a sweep."""


def make_plan(spec: Spec) -> list[PlannedRun]:
    """Stages needed by any enabled method (in stage order), then methods x seeds (a sweep: bench.sweep)."""
    if spec.sweep.axes:
        from bench.sweep import plan_sweep

        return plan_sweep(spec)
    methods = spec.enabled_methods()
    needed = {stage for m in methods for stage in registry.stages_needed(spec, m)}
    runs: list[PlannedRun] = []
    stage_seed = spec.seeds[0]  # shared stages are built once: every method starts from the same checkpoint
    for stage in registry.STAGES:
        if stage in needed:
            runs.append(PlannedRun(stage, stage, "stage", stage_seed, registry.label(stage), registry.engine(stage),
                                   registry.STAGE_NEEDS[stage]))
    for seed in spec.seeds:
        for method in methods:
            runs.append(PlannedRun(f"{method}-s{seed}", method, "method", seed, registry.label(method),
                                   registry.engine(method), tuple(registry.stages_needed(spec, method))))
    return runs


def describe_method(spec: Spec, method: str) -> list[str]:
    """The dry run's lines for one method: networks and their precision, lengths, updates, micro-batch."""
    module, cfg = registry.recipe(method), spec.methods[method]
    roles = module.networks(spec, cfg)
    policy = precision_policy(spec.model.dtype, roles)
    if spec.train.lora.enabled:  # every method's reference is then the actor's base, adapters off (no copy)
        policy = with_shared_reference(policy)
    lines = [f"networks: {describe_policy(policy)}",
             f"max length: prompt + {spec.generation.max_new_tokens} new tokens (the longest prompt is measured at "
             f"run time; offline pairs: their longest prompt + completion)"]
    own = f"methods.{method}.learning_rate" if cfg.learning_rate is not None else "train.learning_rate"
    lines.append(f"learning rate: {cfg.resolved_learning_rate(spec):g} ({own})")
    lines += [f"{name}: {value}" for name, value in module.describe(spec, cfg).items()]
    return lines


def describe_plan(spec: Spec, runs: list[PlannedRun]) -> str:
    """Human-readable plan (what --dry-run prints)."""
    t = spec.train
    lines = [
        f"preset {spec.name}: {spec.description}",
        f"model: {spec.model.source} {spec.model.architecture or spec.model.name_or_path or ''}".rstrip()
        + f" ({spec.model.dtype})",
        f"task: {spec.task.source}" + (f" {spec.task.path}" if spec.task.path else "")
        + f"; {spec.task.train_size} train prompts, {spec.task.test_size} test questions",
        f"matched budget: {t.steps} steps x {t.prompts_per_step} prompts x G={t.group_size} = "
        f"{spec.completions_per_step} completions/step, {spec.generation.max_new_tokens} new tokens, "
        f"temperature {spec.generation.temperature}, lr {t.learning_rate} (unless a method sets its own)",
        f"sample pool pairs: {spec.sample_pool.pairs}; evaluation: "
        + (f"{spec.task.test_size} questions, greedy" if spec.eval.enabled else "off (eval.enabled: false)"),
        f"{len(runs)} runs (stages one at a time, then {spec.parallel_runs} method run(s) at a time"
        + (f", {spec.threads} torch thread(s) each):" if spec.threads else "):"),
    ]
    if spec.sweep.axes:
        from bench.sweep import describe_sweep

        lines += describe_sweep(spec)
    for i, run in enumerate(runs, 1):
        after = f" (after {', '.join(run.needs)})" if run.needs else ""
        lines.append(f"  {i:2d}. {run.run_id:<20} {run.label}{after}")
    lines.append("per method:")
    for method in spec.enabled_methods():
        lines.append(f"  {method} ({registry.label(method)}):")
        lines += [f"      {line}" for line in describe_method(spec, method)]
    return "\n".join(lines)
