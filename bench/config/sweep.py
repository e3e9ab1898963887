"""Sweeps: one spec expanded into points, each point x method in its own worker process.

A preset's ``sweep:`` block (``bench.config.spec.SweepSpec``) names axes, each a dotted spec key with a list of values:

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
status ``failed`` with error type ``OutOfMemory`` and the phase it happened in (``bench.execution.run_failure``). In a sweep that is
an expected outcome (finding where a method stops fitting is what the sweep is for): the runner reports it and
keeps the exit status 0 when everything else is ok (``bench.execution.runner.run_verdict``). Outside a sweep an OOM is a
failure like any other. ``sweep.inject_oom`` (a test hook) raises MemoryError when a named phase starts at one point.

Every method run of a sweep stores the memory model's prediction beside its measurement (``result["prediction"]``,
``bench.systems.memory_model.predict_for_spec``) and the same method's prediction for the full-size larger architectures
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
from bench.config.spec import Spec, _did_you_mean

MAX_POINTS = 256
"""More points than this is almost surely a mistake (a product of long axes); say so before planning hours."""

FORBIDDEN: dict[str, str] = {
    "train.steps": "sweep.steps sets the measured steps (after sweep.warmup_steps)",
    "telemetry.warmup_steps": "sweep.warmup_steps sets it",
    "seeds": "seeds apply to every point; set them outside the sweep",
    "device": "every point runs on the same device", "gpus": "every point runs on the same GPUs",
    "threads": "a point's timing must not change with its thread count", "parallel_runs": "it is how runs are scheduled",
    "name": "it names the whole suite", "description": "it describes the whole suite",
    "scheduler.name": "it is how runs are scheduled", "scheduler.address": "it is where runs are scheduled",
    "scheduler.storage": "it is how runs' data moves", "scheduler.max_retries": "it is how runs are scheduled",
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
