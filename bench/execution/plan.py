"""The plan: ordered runs with stable ids. Shared stages first, then one run per (method, seed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.config import registry
from bench.model.precision import describe_policy, lora_roles, precision_policy, with_shared_reference
from bench.config.spec import Spec
from bench.config.sweep import STAGE_KEYS, _label, expand, method_points
from bench.config.rules import point_spec
from bench.errors import SpecError
from bench.results import MAX_RUNS


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
    """Sweep point id (bench.config.sweep); None outside a sweep."""
    values: tuple[tuple[str, Any], ...] = ()
    """The sweep point's (dotted key, value) pairs applied to the spec for this run; empty outside a sweep."""


def make_plan(spec: Spec) -> list[PlannedRun]:
    """Stages needed by any enabled method (in stage order), then methods x seeds (a sweep: plan_sweep).

    ``seed_scope: method`` (the default): the stages run once, with the first seed, and every method of every seed
    reads them, so the seeds vary only the method stage. ``seed_scope: pipeline``: the stages run once per seed
    (``warm_start@s1``, ...) and each method run reads its own seed's, so the seeds vary the whole pipeline.
    """
    runs = plan_sweep(spec) if spec.sweep.axes else _plain_plan(spec)
    if len(runs) > MAX_RUNS:  # e.g. seeds=[0..4999]: refused while it is a spec, not after days of runs
        raise SpecError(f"the spec plans {len(runs):,} runs; at most {MAX_RUNS:,} (fewer seeds, methods or sweep "
                        f"points)")
    return runs


def _plain_plan(spec: Spec) -> list[PlannedRun]:
    """make_plan without a sweep."""
    methods = spec.enabled_methods()
    needed = {stage for m in methods for stage in registry.stages_needed(spec, m)}
    runs: list[PlannedRun] = []
    pipeline = spec.seed_scope == "pipeline"
    # method scope: shared stages are built once, so every method starts from the same checkpoint
    for stage_seed in spec.seeds if pipeline else spec.seeds[:1]:
        for stage in registry.STAGES:
            if stage in needed:
                runs.append(PlannedRun(stage_id(stage, stage_seed, pipeline), stage, "stage", stage_seed,
                                       stage_label(spec, stage), registry.engine(stage),
                                       tuple(stage_id(s, stage_seed, pipeline) for s in registry.STAGE_NEEDS[stage])))
    for seed in spec.seeds:
        for method in methods:
            runs.append(PlannedRun(f"{method}-s{seed}", method, "method", seed, registry.label(method),
                                   registry.engine(method),
                                   tuple(stage_id(s, seed, pipeline) for s in registry.stages_needed(spec, method))))
    return runs


def stage_id(stage: str, seed: int, pipeline: bool) -> str:
    """A shared stage's run id: its name, or ``<stage>@s<seed>`` when every seed runs its own stages (the runner
    finds a stage's folder by the name before '@', as for a sweep's stages)."""
    return f"{stage}@s{seed}" if pipeline else stage


def stage_label(spec: Spec, stage: str) -> str:
    """The stage's label as this spec runs it: the sample pool's pairs are gold-labelled under
    ``sample_pool.pairs: gold`` (the gold solution as chosen), verifier-labelled otherwise; the warm start reads
    ``registry.NO_WARM_START_LABEL`` when it is off."""
    label = registry.label(stage)
    if stage == "sample_pool" and spec.sample_pool.pairs == "gold":
        label = label.replace("verifier-labelled", "gold-labelled")
    if stage == "warm_start" and not spec.warm_start.enabled:
        label = registry.NO_WARM_START_LABEL
    return label


def seed_scope_text(spec: Spec) -> str:
    """One line on what the seeds vary (the dry run's and the report's wording)."""
    if spec.seed_scope == "pipeline":
        return (f"seed_scope pipeline: each of the {len(spec.seeds)} seed(s) re-runs the shared stages and "
                f"initialises the model with its own seed, so the spread over seeds is the whole pipeline's")
    return ("seed_scope method: the seeds vary the method stage only (data order, sampling); the warm start, "
            f"sample pool and reward model run once with seed {spec.seeds[0]} and are shared")


def describe_method(spec: Spec, method: str) -> list[str]:
    """The dry run's lines for one method: networks and their precision, lengths, updates, micro-batch."""
    module, cfg = registry.recipe(method), spec.methods[method]
    roles = module.networks(spec, cfg)
    policy = precision_policy(spec.model.dtype, roles, lora_roles=lora_roles(spec.train.lora))
    if spec.train.lora.enabled:  # every method's reference is then the actor's base, adapters off (no copy)
        policy = with_shared_reference(policy)
    lines = [f"networks: {describe_policy(policy)}",
             f"max length: prompt + {spec.generation.max_new_tokens} new tokens (the longest prompt is measured at "
             f"run time; offline pairs: their longest prompt + completion)"]
    own = f"methods.{method}.learning_rate" if cfg.learning_rate is not None else "train.learning_rate"
    lines.append(f"learning rate: {cfg.resolved_learning_rate(spec):g} ({own})")
    lines += [f"{name}: {value}" for name, value in module.describe(spec, cfg).items()]
    return lines


def schedule_text(spec: Spec) -> str:
    """How the method runs are started, for the plan's header line."""
    if spec.scheduler.name == "ray":
        where = "a Ray instance started for the suite" if spec.scheduler.address is None else (
            f"the Ray cluster at {spec.scheduler.address}")
        return f"each method run a Ray task on {where}, as many at once as its free CPUs and GPUs allow"
    if spec.parallel_runs == "auto":
        return "one method run per free GPU, or one at a time on a CPU (parallel_runs: auto)"
    mine = ", each on a GPU of its own" if spec.parallel_runs != 1 and spec.device != "cpu" else ""
    return f"{spec.parallel_runs} method run(s) at a time{mine}"


def launch_text(spec: Spec) -> str | None:
    """The plan's line on a launched method run's processes and the machines they take (None without a launcher):
    on GPUs one GPU per process, so N processes over M machines need M machines with N / M GPUs each."""
    launcher = spec.launcher
    if launcher.name == "none":
        return None
    n, machines = launcher.num_processes, launcher.num_machines
    per = n // machines
    gpus = {"cpu": "", "cuda": f" on {per} GPU(s)"}.get(spec.device, f" (on {per} GPU(s) where there are GPUs)")
    where = (f"on one machine{gpus}" if machines == 1 else
             f"over {machines} machines: {machines} Ray nodes reserved together, each running {per} of the "
             f"ranks{gpus}; machine 0 holds rank 0, which evaluates")
    return (f"launch: {launcher.name}, {n} processes per data-parallel method run, {where}; shared stages and "
            f"one-process methods run as one process")


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
        seed_scope_text(spec),
        f"{len(runs)} runs (stages one at a time, then {schedule_text(spec)}"
        + (f", {spec.threads} torch thread(s) each):" if spec.threads else "):"),
    ]
    launch = launch_text(spec)
    if launch:
        lines.insert(-1, launch)
    if spec.sweep.axes:
        lines += describe_sweep(spec)
    for i, run in enumerate(runs, 1):
        after = f" (after {', '.join(run.needs)})" if run.needs else ""
        lines.append(f"  {i:2d}. {run.run_id:<20} {run.label}{after}")
    lines.append("per method:")
    for method in spec.enabled_methods():
        lines.append(f"  {method} ({registry.label(method)}):")
        lines += [f"      {line}" for line in describe_method(spec, method)]
    return "\n".join(lines)


# -- a sweep's plan ---------------------------------------------------------------------------------------------
def run_id(method: str, seed: int, point_id: str) -> str:
    """``<method>-s<seed>@<point>``: the run's folder name says which point it measured."""
    return f"{method}-s{seed}@{point_id}"


def plan_sweep(spec: Spec) -> list[PlannedRun]:
    """Shared stages (one per distinct stage-relevant axis values, in stage order), then seeds x points x methods."""
    from bench.config import registry

    points = expand(spec)
    methods = spec.enabled_methods()
    runs_at = method_points(spec)  # every point, except in per_method mode
    stage_runs: dict[str, PlannedRun] = {}
    method_runs: list[PlannedRun] = []
    needs_of: dict[str, tuple[str, ...]] = {}
    for point in points:
        pspec = point_spec(spec, point.as_dict())
        here = [m for m in methods if point.point_id in runs_at[m]]
        needed = {stage for m in here for stage in registry.stages_needed(pspec, m)}
        ids: dict[str, str] = {}
        for stage in registry.STAGES:
            if stage not in needed:
                continue
            relevant = tuple((k, v) for k, v in point.values if k.startswith(STAGE_KEYS[stage]))
            sid = f"{stage}@{_label(relevant)}" if relevant else stage
            ids[stage] = sid
            if sid not in stage_runs:
                stage_needs = tuple(ids[s] for s in registry.STAGE_NEEDS[stage])
                stage_runs[sid] = PlannedRun(sid, stage, "stage", spec.seeds[0], stage_label(pspec, stage),
                                                  registry.engine(stage), stage_needs, point.point_id, point.values)
        for method in here:
            needs_of[f"{point.point_id}/{method}"] = tuple(ids[s] for s in registry.stages_needed(pspec, method))
    for seed in spec.seeds:
        for point in points:
            for method in (m for m in methods if point.point_id in runs_at[m]):
                method_runs.append(PlannedRun(run_id(method, seed, point.point_id), method, "method", seed,
                                              registry.label(method), registry.engine(method),
                                              needs_of[f"{point.point_id}/{method}"], point.point_id, point.values))
    ordered = sorted(stage_runs.values(), key=lambda r: list(registry.STAGES).index(r.name))
    return ordered + method_runs


def describe_sweep(spec: Spec) -> list[str]:
    """Dry-run lines: the axes, the points and what each point runs."""
    points = expand(spec)
    sw = spec.sweep
    if sw.mode == "per_method":
        runs_at = method_points(spec)
        lines = [f"sweep (per_method): {len(points)} points, {sum(len(v) for v in runs_at.values())} method runs x "
                 f"{len(spec.seeds)} seed(s); {sw.warmup_steps} warm-up + {sw.steps} measured steps each"]
        lines += [f"  {method}: {', '.join(ids)}" for method, ids in runs_at.items()]
        if spec.eval.split == "validation":  # the plan's header counts test questions; a tune never loads them
            lines.append(f"  evaluation on the validation split: {spec.task.validation_size} questions carved from the "
                         f"training side; the test split is not loaded")
        return lines
    lines = [f"sweep ({sw.mode}): {len(points)} points x {len(spec.enabled_methods())} methods x "
             f"{len(spec.seeds)} seed(s); {sw.warmup_steps} warm-up + {sw.steps} measured steps each"]
    lines += [f"  axis {key}: {', '.join(str(v) for v in values)}" for key, values in sw.axes.items()]
    lines.append(f"  points: {', '.join(p.point_id for p in points)}")
    if sw.inject_oom.point is not None:
        lines.append(f"  TEST HOOK: out-of-memory injected at {sw.inject_oom.point} "
                     f"({sw.inject_oom.method or 'every method'}, phase {sw.inject_oom.phase})")
    return lines
