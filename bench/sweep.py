"""Sweeps: one spec expanded into points, each point x method in its own worker process.

A preset's ``sweep:`` block (``bench.spec.SweepSpec``) names axes, each a dotted spec key with a list of values:

```yaml
sweep:
  axes: {model.architecture: [qwen2.5-0.5b, qwen2.5-1.5b], train.group_size: [4, 8]}
  mode: product            # or one_at_a_time
  steps: 3                 # measured optimizer steps per point ...
  warmup_steps: 1          # ... after one warm-up step (left out of the step-time median)
```

Expansion (:func:`expand`) gives points; a point is the base spec with its axis values applied, validated whole
at load time (a bad value is one line naming the point and the key). Each point has an id built from its values
(``qwen2.5-0.5b-G4``), and each of its method runs the id ``<method>-s<seed>@<point>``.

Per-method points (``mode: per_method``, what ``bench tune`` writes): ``axes`` maps each enabled method to the list
of points it alone runs at, each a mapping of dotted keys to values in which the method's own settings
(``methods.<name>.<field>``) may appear; points with equal values are one point, shared by the methods that list it.

Shared stages (warm start, sample pool, reward model) are planned once per distinct value of the axes their output
depends on (:data:`STAGE_KEYS`): a model-size axis gives every model its own stages, a group-size axis shares them
(``warm_start@qwen2.5-0.5b``). A stage runs with the spec of the first point that reads it.

Out of memory: a worker records an out-of-memory error (CUDA, or MemoryError / the CPU allocator's on a CPU) as
status ``failed`` with error type ``OutOfMemory`` and the phase it happened in (``bench.worker``). In a sweep that is
an expected outcome (finding where a method stops fitting is what the sweep is for): the runner reports it and
keeps the exit status 0 when everything else is ok (``bench.runner.run_verdict``). Outside a sweep an OOM is a
failure like any other. ``sweep.inject_oom`` (a test hook) raises MemoryError when a named phase starts at one point.

Every method run of a sweep stores the memory model's prediction beside its measurement (``result["prediction"]``,
``bench.memory_model.predict_for_spec``) and the same method's prediction for the full-size larger architectures
(``result["prediction_extrapolated"]``); both are null with ``result["sweep"]["prediction_note"]`` saying why when
the memory model is not there.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import typing
from dataclasses import dataclass
from typing import Any, Callable

from bench.errors import SpecError
from bench.plan import PlannedRun
from bench.spec import SPEC_RULES, ScaleSpec, Spec, _build, _convert, _did_you_mean, validate

MAX_POINTS = 256
"""More points than this is almost surely a mistake (a product of long axes); say so before planning hours."""

FORBIDDEN: dict[str, str] = {
    "train.steps": "sweep.steps sets the measured steps (after sweep.warmup_steps)",
    "telemetry.warmup_steps": "sweep.warmup_steps sets it",
    "seeds": "seeds apply to every point; set them outside the sweep",
    "device": "every point runs on the same device", "gpus": "every point runs on the same GPUs",
    "threads": "a point's timing must not change with its thread count", "parallel_runs": "it is how runs are scheduled",
    "name": "it names the whole suite", "description": "it describes the whole suite",
}
"""Keys an axis may not name, with the reason shown in the error."""

STAGE_KEYS: dict[str, tuple[str, ...]] = {
    "warm_start": ("model.", "task.", "warm_start."),
    "sample_pool": ("model.", "task.", "warm_start.", "generation.", "sample_pool.", "reward."),
    "reward_model": ("model.", "task.", "warm_start.", "generation.", "sample_pool.", "reward.", "reward_model."),
}
"""Key prefixes a shared stage's output depends on. Points that agree on these axes share the stage; axes under
``train.`` (G, prompts per step, micro-batch, checkpointing, LoRA) never re-run a stage."""

EXTRAPOLATE_TO = ("qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b")
"""Full-size architectures each sweep run also predicts (nothing measured there: drawn dashed, 'predicted')."""

INJECTABLE_PHASES = ("generation", "reward", "reference", "critic", "update", "evaluation")

_LABELS: dict[str, Callable[[Any], str]] = {
    "model.architecture": str,
    "model.dtype": lambda v: {"float32": "fp32", "bfloat16": "bf16"}.get(v, str(v)),
    "model.scale.num_layers": lambda v: f"L{v}",
    "model.scale.width_divisor": lambda v: f"w{v}",
    "model.scale.vocab_size": lambda v: f"v{v}",
    "generation.max_new_tokens": lambda v: f"len{v}",
    "train.group_size": lambda v: f"G{v}",
    "train.prompts_per_step": lambda v: f"P{v}",
    "train.micro_batch_size": lambda v: f"mb{v}",
    "train.gradient_checkpointing": lambda v: "gc" if v else "nogc",
    "train.lora.enabled": lambda v: "lora" if v else "full",
    "reward_model.epochs": lambda v: f"rmep{v}",
    "reward_model.learning_rate": lambda v: f"rmlr{v:g}" if isinstance(v, float) else f"rmlr{v}",
}
"""How a value shows in a point id; other keys show as their last part followed by the value."""


@dataclass(frozen=True)
class Point:
    """One combination of axis values."""

    point_id: str
    values: tuple[tuple[str, Any], ...]
    """(dotted key, value) for every axis, in axis order."""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)


_METHOD_LABELS: dict[str, str] = {"learning_rate": "lr", "critic_learning_rate": "clr", "kl_coef": "kl",
                                  "beta": "beta", "loss_type": ""}
"""Short names of a method's own settings in a per_method point id (the run id already names the method)."""


def value_label(key: str, value: Any) -> str:
    """How ``value`` of axis ``key`` shows in a point id (letters, digits and . _ + - only)."""
    last = key.rsplit(".", 1)[-1]
    if key in _LABELS:
        text = _LABELS[key](value)
    elif key.startswith("methods.") and last in _METHOD_LABELS:
        shown = f"{value:g}" if isinstance(value, float) else str(value).replace(",", "+")
        text = f"{_METHOD_LABELS[last]}{shown}"
    else:
        text = f"{last}{value}"
    return re.sub(r"[^A-Za-z0-9._+-]", "", text) or "x"


def _label(values: tuple[tuple[str, Any], ...]) -> str:
    return "-".join(value_label(k, v) for k, v in values)


def expand(spec: Spec) -> list[Point]:
    """The sweep's points, in order: the product of the axes (first axis slowest), one axis at a time, or (per_method)
    every method's points in turn, equal ones once."""
    if spec.sweep.mode == "per_method":
        return _expand_per_method(spec)[0]
    axes = list(spec.sweep.axes.items())
    if spec.sweep.mode == "product":
        combos = [tuple(zip([k for k, _ in axes], combo)) for combo in itertools.product(*[v for _, v in axes])]
    else:
        first = tuple((k, v[0]) for k, v in axes)
        combos = [first]
        for i, (key, values) in enumerate(axes):
            for value in values[1:]:
                combos.append(first[:i] + ((key, value),) + first[i + 1:])
    points, seen = [], set()
    for combo in combos:
        point_id = _label(combo)
        if point_id in seen:  # two labels can collide (a generic label of odd values); keep ids unique
            point_id = f"{point_id}-{len(points) + 1}"
        seen.add(point_id)
        points.append(Point(point_id, combo))
    return points


def _expand_per_method(spec: Spec) -> tuple[list[Point], dict[str, list[str]]]:
    """(points, method -> ids of the points it runs at) of a per_method sweep.

    A point's id names only the values that differ from its method's first point ("base"): ``kl0.1`` rather than
    ``lr0.0002-clrNone-kl0.1-rmep2-rmlr0.001``; the result records every value (``result["sweep"]["values"]``)."""
    points: list[Point] = []
    by_values: dict[str, Point] = {}
    of_method: dict[str, list[str]] = {}
    for method, entries in spec.sweep.axes.items():
        first = dict(entries[0] or {}) if entries else {}
        for entry in entries:
            combo = tuple((entry or {}).items())
            key = repr(combo)
            if key not in by_values:
                differs = tuple((k, v) for k, v in combo if k not in first or first[k] != v)
                point_id = _label(differs) or "base"
                taken = {p.point_id for p in points}
                if point_id in taken:  # another method's base, or its own setting with the same short label
                    point_id = f"{point_id}-{method}"
                if point_id in taken:
                    point_id = f"{point_id}-{len(points) + 1}"
                by_values[key] = Point(point_id, combo)
                points.append(by_values[key])
            of_method.setdefault(method, []).append(by_values[key].point_id)
    return points, of_method


def method_points(spec: Spec) -> dict[str, list[str]]:
    """Enabled method -> the ids of the points it runs at: every point, except in per_method mode."""
    if spec.sweep.mode == "per_method":
        of_method = _expand_per_method(spec)[1]
        return {m: of_method.get(m, []) for m in spec.enabled_methods()}
    ids = [p.point_id for p in expand(spec)]
    return {m: ids for m in spec.enabled_methods()}


# -- one point's spec -------------------------------------------------------------------------------------
def point_data(spec: Spec, values: dict[str, Any]) -> dict[str, Any]:
    """Plain spec data of the point: the base with ``values`` applied, sweep steps set and the sweep block cleared
    (a point is a plain spec: its worker must not expand it again)."""
    data = spec.to_dict()
    data["sweep"] = {}
    fixed_length = spec.generation.min_new_tokens == spec.generation.max_new_tokens
    for key, value in values.items():
        _set(data, key, value)
        if key == "generation.max_new_tokens" and fixed_length:
            _set(data, "generation.min_new_tokens", value)  # fixed-length generation stays fixed-length
    data["train"]["steps"] = spec.sweep.warmup_steps + spec.sweep.steps
    data["telemetry"]["warmup_steps"] = spec.sweep.warmup_steps
    return data


def point_spec(spec: Spec, values: dict[str, Any]) -> Spec:
    """The validated Spec of one point (SpecError names the point and the key)."""
    try:
        point = _build(Spec, point_data(spec, values), "")
        validate(point)
    except SpecError as exc:
        shown = ", ".join(f"{k}={v}" for k, v in values.items())
        raise SpecError(f"sweep point {_label(tuple(values.items()))} ({shown}): {exc}") from None
    return point


def _set(data: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    node = data
    for part in parents:
        node = node[part]
    node[last] = value


# -- validation -------------------------------------------------------------------------------------------
def _leaf_type(key: str) -> Any:
    """The declared type of dotted ``key`` (SpecError for an unknown key or a group of settings)."""
    where = f"'sweep.axes' key '{key}'"
    if key in FORBIDDEN:
        raise SpecError(f"{where} cannot be swept: {FORBIDDEN[key]}")
    if key == "methods" or key.startswith(("methods.", "sweep.")) or key == "sweep":
        raise SpecError(f"{where} cannot be swept: sweep the matched budget (train.*, generation.*, model.*), "
                        f"not per-method settings or the sweep itself")
    tp: Any = Spec
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(tp):
            raise SpecError(f"{where}: '{'.'.join(parts[:i])}' is a single setting, it has no '{part}'")
        names = [f.name for f in dataclasses.fields(tp)]
        if part not in names:
            group = ".".join(parts[:i]) or "the top level"
            raise SpecError(f"unknown key '{key}' in 'sweep.axes'{_did_you_mean(part, names)}; "
                            f"known keys under '{group}': {', '.join(names)}")
        tp = typing.get_type_hints(tp)[part]
    if dataclasses.is_dataclass(tp):
        first = dataclasses.fields(tp)[0].name
        raise SpecError(f"{where} is a group of settings; sweep one of them, e.g. '{key}.{first}'")
    return tp


def _method_leaf_type(spec: Spec, method: str, key: str, where: str) -> Any:
    """The declared type of ``key`` in a point of ``method`` (per_method mode): its own methods.<name>.<field>, or
    any key an axis may name."""
    if not key.startswith("methods."):
        return _leaf_type(key)
    prefix = f"methods.{method}."
    if not key.startswith(prefix):
        raise SpecError(f"'{where}' sets '{key}'; a point of {method} may set only its own settings "
                        f"({prefix}<field>) and shared keys")
    cls = type(spec.methods[method])
    names = [f.name for f in dataclasses.fields(cls) if f.name != "enabled"]
    name = key[len(prefix):]
    if name not in names:
        raise SpecError(f"unknown key '{key}' in '{where}'{_did_you_mean(name, names)}; known keys under "
                        f"'{prefix.rstrip('.')}': {', '.join(names)}")
    return typing.get_type_hints(cls)[name]


def _validate_method_axes(spec: Spec) -> None:
    """per_method mode: every axis an enabled method, with a non-empty list of distinct points, each a mapping of
    known keys to values of their type and range; every enabled method listed."""
    enabled = spec.enabled_methods()
    for method, entries in spec.sweep.axes.items():
        name = f"sweep.axes.{method}"
        if method not in spec.methods:
            raise SpecError(f"'{name}': with sweep.mode per_method each axis is a method; known methods: "
                            f"{', '.join(spec.methods)}{_did_you_mean(method, list(spec.methods))}")
        if method not in enabled:
            raise SpecError(f"'{name}': method '{method}' is not enabled; enable it (methods.{method}.enabled=true) "
                            f"or remove its points")
        if not isinstance(entries, list) or not entries:
            raise SpecError(f"'{name}' must be a non-empty list of points, e.g. [{{methods.{method}.learning_rate: "
                            f"1.0e-5}}], got {entries!r}")
        converted: list[dict[str, Any]] = []
        for i, entry in enumerate(entries):
            where = f"{name}[{i}]"
            if entry is not None and not isinstance(entry, dict):
                raise SpecError(f"'{where}' must be a mapping of dotted keys to values, e.g. "
                                f"{{methods.{method}.learning_rate: 1.0e-5}}, got {entry!r}")
            point: dict[str, Any] = {}
            for key, value in (entry or {}).items():
                value = _convert(_method_leaf_type(spec, method, str(key), where), value, f"{where}.{key}")
                rule = SPEC_RULES.get(str(key))
                if rule is not None and value is not None and not rule.ok(value):
                    raise SpecError(f"'{where}.{key}' {rule.allowed}, got {value!r}")
                point[str(key)] = value
            converted.append(point)
        if len({repr(sorted(p.items())) for p in converted}) != len(converted):
            raise SpecError(f"'{name}' lists a point twice; list each point once")
        spec.sweep.axes[method] = converted
    missing = [m for m in enabled if m not in spec.sweep.axes]
    if missing:
        raise SpecError(f"'sweep.axes' (mode per_method) lists no points for enabled method(s) {', '.join(missing)}; "
                        f"give each its points or disable it")


def validate_axes(spec: Spec) -> None:
    """Each axis: a known single setting, a non-empty list of distinct values, each of the key's type and range."""
    if spec.sweep.mode == "per_method":
        _validate_method_axes(spec)
        return
    for key, values in spec.sweep.axes.items():
        tp = _leaf_type(key)
        name = f"sweep.axes.{key}"
        if not isinstance(values, list) or not values:
            raise SpecError(f"'{name}' must be a non-empty list of values, got {values!r}; e.g. {key}: [4, 8]")
        converted = [_convert(tp, value, name) for value in values]
        rule = SPEC_RULES.get(key)
        for value in converted:
            if rule is not None and value is not None and not rule.ok(value):
                raise SpecError(f"'{name}' {rule.allowed}, got {value!r}")
        if len({repr(v) for v in converted}) != len(converted):
            raise SpecError(f"'{name}' lists a value twice: {values}; list each value once")
        spec.sweep.axes[key] = converted


def validate_sweep(spec: Spec) -> None:
    """Axes (:func:`validate_axes`), the point count, every point's whole spec, and the OOM test hook."""
    validate_axes(spec)
    points = expand(spec)
    if len(points) > MAX_POINTS:
        raise SpecError(f"'sweep.axes' expands to {len(points)} points (at most {MAX_POINTS}); shorten an axis or "
                        f"use sweep.mode=one_at_a_time")
    for point in points:
        point_spec(spec, point.as_dict())
    inject = spec.sweep.inject_oom
    if inject.point is not None:
        ids = [p.point_id for p in points]
        if inject.point not in ids:
            raise SpecError(f"'sweep.inject_oom.point' '{inject.point}' is not a point of this sweep"
                            f"{_did_you_mean(inject.point, ids)}; points: {', '.join(ids)}")
        from bench.registry import STAGES

        methods = spec.enabled_methods() + list(STAGES)
        if inject.method is not None and inject.method not in methods:
            raise SpecError(f"'sweep.inject_oom.method' '{inject.method}' is not an enabled method or a stage; "
                            f"choose one of: {', '.join(methods)}")
        if inject.phase not in INJECTABLE_PHASES:
            raise SpecError(f"'sweep.inject_oom.phase' must be one of {', '.join(INJECTABLE_PHASES)}, "
                            f"got {inject.phase!r}")


# -- the plan ---------------------------------------------------------------------------------------------
def run_id(method: str, seed: int, point_id: str) -> str:
    """``<method>-s<seed>@<point>``: the run's folder name says which point it measured."""
    return f"{method}-s{seed}@{point_id}"


def plan_sweep(spec: Spec) -> list[PlannedRun]:
    """Shared stages (one per distinct stage-relevant axis values, in stage order), then seeds x points x methods."""
    from bench import registry

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
            stage_id = f"{stage}@{_label(relevant)}" if relevant else stage
            ids[stage] = stage_id
            if stage_id not in stage_runs:
                stage_needs = tuple(ids[s] for s in registry.STAGE_NEEDS[stage])
                stage_runs[stage_id] = PlannedRun(stage_id, stage, "stage", spec.seeds[0], registry.label(stage),
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


# -- what the runner writes for a run ---------------------------------------------------------------------
def job_spec(spec: Spec, run: PlannedRun) -> dict[str, Any]:
    """The resolved spec a run's worker gets: the point's for a sweep run, else the suite's."""
    if run.point is None:
        return spec.to_dict()
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
        from bench.memory_model import predict_for_spec
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
