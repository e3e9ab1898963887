"""`bench tune`: each method's settings chosen on a validation split, never on the test split.

A tune is a sweep (bench.config.sweep, ``mode: per_method``) over each method's declared grid (``bench/config/tuning_grids.yaml``,
or ``--grid FILE``): every (method, grid point, seed) is its own worker, the shared stages run once per distinct
value of the keys they depend on (one warm start and sample pool for all), and every evaluation reads the
validation split: ``task.validation_size`` questions carved from the training side (bench.task.problems: synthetic
by working, a file's by a hash of the question), which the training prompts then exclude. The test split is never
loaded (``eval.split: validation``; bench.task.data.load_task).

Each method's best point is the one with the highest mean validation accuracy over the seeds, in the headline
scoring mode (bench.task.verifier.HEADLINE_MODE); only points where every seed finished count, and a tie goes to the
point listed first in the grid (the preset's own value comes first there). The choice is written as a preset that
extends the tuned one (``DIR/tuned-<preset>.yaml``): the chosen values, and under ``tuning:`` (bench.config.spec.TuningSpec)
per method the grid, every point's score (mean, sd, n questions, seeds) and the command that made it. Run it with
``bench run --preset DIR/tuned-<preset>.yaml``; every result then carries ``spec.tuning``, so the report can say
per method "tuned on validation" or "untuned default".

The reward model, a shared stage, is tuned like a method but on its own validation pairs, and first.
A grid file entry's ``reward_model`` grid (axes ``reward_model.<field>``; ``eval_fraction`` is fixed, since it decides
which pairs are held out) is run before any method: every (point, seed) is one run of the stage
(``reward_model@<point>`` at the first seed, ``reward_model-s<seed>@<point>`` at the others), each trained on every
pair of its training questions and scored by ``metrics.heldout_pair_accuracy``: one pair per held-out question of
the sample pool, questions the stage never trains on (baselines/reward_model.py; the held-out questions are drawn
by the run's seed, so the seeds vary them too). Its best point is picked like a method's (highest mean over seeds,
only points where every seed finished, ties to the first) and recorded under ``tuning.methods.reward_model`` with a
method's fields (split ``validation pairs (held-out questions of the sample pool)``, n = held-out pairs). Then the
methods' sweep runs with every point of each method that reads the reward model (PPO with ``reward: model``)
carrying the chosen values, so those methods are tuned at the reward model they will run with; their stage is the
chosen point's first-seed run, reused, not retrained. Their records say so (``tuned_at``) and leave the reward
model's keys out of ``chosen``. Why sequenced rather than one sweep over both: a method's point scored against a
reward model other than the one it ships with chose its settings for the wrong reward, and the grid of both at
once (the product) costs one method run per pair of points. A method grid may then not tune ``reward_model.*``
itself (one line says so). The tune folder is one suite folder for both phases: its ``suite.json`` is written with
the methods at the preset's reward model and, once the reward model is chosen, holds the methods' sweep at the
chosen one; ``--resume`` continues either phase (a folder from another preset or grid is refused). A
``--methods`` list that names ``reward_model`` tunes the stage, alone when it names nothing else; a list of methods
none of which reads the reward model leaves it untuned.

Imports no torch: the workers do the training (bench.execution.runner).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shlex
import statistics
import sys
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from bench.errors import UserError

GRIDS_FILE = "tuning_grids.yaml"
"""The grids shipped with the package (bench/config/tuning_grids.yaml); one entry per preset name, else ``default``."""
DEFAULT_SEEDS = 2
"""Seeds per grid point unless --seeds says otherwise: enough for a mean and a spread, few enough to afford."""
GRID_MODES = ("product", "one_at_a_time")
STAGE = "reward_model"
"""The shared stage a grid entry may tune on its own validation pairs (its ``reward_model`` grid)."""
STAGE_SPLIT = "validation pairs (held-out questions of the sample pool)"
"""What the stage's score is measured on: one pair per held-out question, questions it never trains on."""
STAGE_SCORE = "heldout_pair_accuracy"
"""The stage's score: its result's ``metrics.heldout_pair_accuracy`` (baselines/reward_model.py)."""
STAGE_FIXED = {"reward_model.eval_fraction": "it decides which questions are held out, so its points would be scored "
                                             "on different pairs; set it in the preset"}
"""Reward-model keys its grid may not vary, with the reason."""


@dataclass
class Grid:
    """One method's declared grid."""

    method: str
    axes: dict[str, list[Any]]
    """Dotted spec key -> the values tried; the first is the preset's own value by convention."""
    mode: str = "product"
    """product (every combination) or one_at_a_time (bench.config.sweep.expand's modes)."""

    def points(self) -> list[dict[str, Any]]:
        """The grid's points in order, each {dotted key: value}, expanded by bench.config.sweep.expand."""
        from bench.config.sweep import expand

        stand_in = SimpleNamespace(sweep=SimpleNamespace(axes=self.axes, mode=self.mode))
        return [point.as_dict() for point in expand(stand_in)]  # type: ignore[arg-type]


@dataclass
class PointScore:
    """One method at one grid point: its validation accuracy per seed."""

    method: str
    point: str
    values: dict[str, Any]
    order: int
    """Position in the method's grid (ties go to the lower)."""
    accuracy: dict[int, float] = field(default_factory=dict)
    """Seed -> validation accuracy (0..1) in the headline mode, for the seeds that finished."""
    n_questions: int = 0
    not_ok: dict[int, str] = field(default_factory=dict)
    """Seed -> status of a run that did not finish (failed, skipped, missing)."""

    @property
    def complete(self) -> bool:
        """Every seed finished: only such points are compared (their means average the same seeds)."""
        return bool(self.accuracy) and not self.not_ok

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.accuracy.values()) if self.accuracy else None

    @property
    def sd(self) -> float | None:
        """Sample standard deviation over seeds (None with one seed)."""
        return statistics.stdev(self.accuracy.values()) if len(self.accuracy) > 1 else None

    def record(self) -> dict[str, Any]:
        """As the tuned preset stores it."""
        return {"point": self.point, "values": dict(self.values), "mean": _round(self.mean), "sd": _round(self.sd),
                "n_questions": self.n_questions, "seeds": sorted(self.accuracy),
                "accuracy": {int(s): _round(a) for s, a in sorted(self.accuracy.items())},
                **({"not_ok": {int(s): why for s, why in sorted(self.not_ok.items())}} if self.not_ok else {})}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


# -- grids ----------------------------------------------------------------------------------------------------
def read_grid_file(path: str | None = None) -> dict[str, Any]:
    """The grid file as data (the shipped one without ``path``); UserError for a missing or malformed file."""
    if path is None:
        text = (resources.files("bench.config") / GRIDS_FILE).read_text(encoding="utf-8")
        where = f"bench/{GRIDS_FILE}"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise UserError(f"--grid '{path}': cannot read it ({exc.strerror or type(exc).__name__}); give a YAML "
                            f"file laid out like bench/{GRIDS_FILE}") from None
        where = path
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"grid file '{where}' is not valid YAML ({exc.__class__.__name__}); fix its syntax") from None
    if not isinstance(data, dict):
        raise UserError(f"grid file '{where}' must map preset names (or 'default') to grids")
    return data


def grids_for(preset: str, data: dict[str, Any]) -> tuple[int, dict[str, Grid]]:
    """(validation size, method -> Grid) of ``preset`` in grid-file ``data`` (its own entry, else ``default``)."""
    name = preset if preset in data else "default"
    entry = data.get(name)
    if not isinstance(entry, dict) or not isinstance(entry.get("methods"), dict):
        raise UserError(f"the grid file has no entry for preset '{preset}' and no 'default'; add one with "
                        f"'validation_size' and 'methods'")
    size = entry.get("validation_size", 500)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise UserError(f"grid '{name}': 'validation_size' must be an integer >= 1, got {size!r}")
    grids = {str(method): _parse_grid(f"grid '{name}', method '{method}'", str(method), spec,
                                      f"methods.{method}.learning_rate: [1.0e-5, 3.0e-5]")
             for method, spec in entry["methods"].items()}
    if entry.get(STAGE) is not None:  # the stage tunes its keys on its own pairs: no method may tune them too
        for method, grid in grids.items():
            for key in grid.axes:
                if key.startswith(f"{STAGE}."):
                    raise UserError(f"grid '{name}', method '{method}': axis '{key}' is tuned by the grid's "
                                    f"'{STAGE}' entry, on the reward model's own held-out pairs before any method "
                                    f"runs; remove it from {method}'s axes")
    return size, grids


def _parse_grid(where: str, name: str, spec: Any, example: str) -> Grid:
    """One grid entry ({axes, mode}) as a Grid; UserError naming ``where`` for a malformed one."""
    if not isinstance(spec, dict) or not isinstance(spec.get("axes"), dict) or not spec["axes"]:
        raise UserError(f"{where}: give 'axes' (dotted key -> list of values), e.g. axes: {{{example}}}")
    unknown = sorted(set(spec) - {"axes", "mode"})
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; a grid has 'axes' and 'mode'")
    mode = spec.get("mode", "product")
    if mode not in GRID_MODES:
        raise UserError(f"{where}: 'mode' must be one of {', '.join(GRID_MODES)}, got {mode!r}")
    for key, values in spec["axes"].items():
        if not isinstance(values, list) or not values:
            raise UserError(f"{where}: axis '{key}' must be a non-empty list of values, got {values!r}")
    return Grid(name, {str(k): list(v) for k, v in spec["axes"].items()}, mode)


def stage_grid_for(preset: str, data: dict[str, Any]) -> Grid | None:
    """The reward-model grid of ``preset`` in grid-file ``data`` (its own entry, else ``default``), or None when the
    entry has none; its axes are ``reward_model.<field>`` keys other than :data:`STAGE_FIXED`."""
    name = preset if preset in data else "default"
    entry = data.get(name)
    if not isinstance(entry, dict) or entry.get(STAGE) is None:
        return None
    where = f"grid '{name}', '{STAGE}'"
    grid = _parse_grid(where, STAGE, entry[STAGE], f"{STAGE}.learning_rate: [1.0e-3, 3.0e-4]")
    for key in grid.axes:
        if not key.startswith(f"{STAGE}."):
            raise UserError(f"{where}: axis '{key}' is not a reward-model setting; its axes are {STAGE}.<field> "
                            f"(a method's settings go in that method's grid)")
        if key in STAGE_FIXED:
            raise UserError(f"{where}: axis '{key}' cannot be tuned: {STAGE_FIXED[key]}")
    return grid


def choose_methods(base: Any, grids: dict[str, Grid], asked: str | None) -> list[str]:
    """The methods to tune: --methods (each must be known and have a grid), else every method the preset enables
    that has a grid (control never)."""
    from bench.config.registry import METHODS, UNTUNABLE

    if asked:
        names = [m.strip() for m in asked.split(",") if m.strip()]
        for name in names:
            if name not in METHODS:
                raise UserError(f"--methods: unknown method '{name}'; known methods: {', '.join(METHODS)}")
            if name in UNTUNABLE:
                raise UserError(f"--methods: '{name}' runs at learning rate 0 by design and has nothing to tune")
            if name not in grids:
                raise UserError(f"--methods: no grid for '{name}' in the grid file; add one or leave it out")
        if not names:
            raise UserError("--methods is empty; name methods separated by commas, e.g. --methods grpo,dpo")
        return [m for m in METHODS if m in names]
    names = [m for m in base.enabled_methods() if m in grids and m not in UNTUNABLE]
    if not names:
        raise UserError(f"no method enabled in preset '{base.name}' has a grid; pass --methods with methods from "
                        f"the grid file ({', '.join(grids)})")
    return names


def check_shared_keys(grids: dict[str, Grid], methods: list[str]) -> None:
    """A key outside ``methods.`` (reward_model.*, train.*) applies to every method in the tuned preset, so it may
    be tuned for one method only."""
    owner: dict[str, str] = {}
    for method in methods:
        for key in grids[method].axes:
            if key.startswith("methods."):
                continue
            if key in owner:
                raise UserError(f"grid key '{key}' is tuned for both {owner[key]} and {method}; a shared key's chosen "
                                f"value applies to every method, so tune it for one of them (or tune one at a time "
                                f"with --methods)")
            owner[key] = method


# -- the tune's spec ------------------------------------------------------------------------------------------
def tune_spec(base: Any, grids: dict[str, Grid], methods: list[str], seeds: list[int], validation_size: int,
              stage_values: dict[str, Any] | None = None, readers: list[str] | tuple[str, ...] = ()) -> Any:
    """The base spec as a per_method sweep of the grids: only ``methods`` enabled, every evaluation on a validation
    split of ``validation_size``, the base's own training steps (the sweep's warm-up + measured steps).

    ``stage_values`` (the reward model's, {dotted key: value}) are added to every point of each method in
    ``readers``, so those methods run at that reward model (``reward_model@<its values>``)."""
    from bench.errors import SpecError
    from bench.config.loading import load_spec_dict

    if base.sweep.axes:
        raise UserError(f"preset '{base.name}' is a sweep; tune a preset without a sweep block")
    if not base.eval.enabled:
        raise UserError(f"preset '{base.name}' has eval.enabled false: a tune picks by validation accuracy; "
                        f"set eval.enabled=true")
    data = base.to_dict()
    data["seeds"] = seeds
    data["task"]["validation_size"] = validation_size
    data["eval"]["split"] = "validation"
    for name, settings in data["methods"].items():
        settings["enabled"] = name in methods
    warmup = min(base.telemetry.warmup_steps, base.train.steps - 1)
    axes = {m: [{**point, **(stage_values or {})} if m in readers else point for point in grids[m].points()]
            for m in methods}
    data["sweep"] = {"mode": "per_method", "axes": axes,
                     "steps": base.train.steps - warmup, "warmup_steps": warmup}
    try:
        return load_spec_dict(data)
    except SpecError as exc:
        raise SpecError(f"tuning grid: {exc}") from None


# -- scores and the pick --------------------------------------------------------------------------------------
def collect_scores(suite_dir: Path, spec: Any) -> dict[str, list[PointScore]]:
    """Method -> its grid points' validation scores, from the suite folder's result files (no torch)."""
    from bench.results import read_result
    from bench.config.sweep import expand, method_points
    from bench.execution.plan import run_id
    from bench.task.verifier import HEADLINE_MODE

    values = {p.point_id: p.as_dict() for p in expand(spec)}
    out: dict[str, list[PointScore]] = {}
    for method, ids in method_points(spec).items():
        scores = []
        for order, point in enumerate(ids):
            score = PointScore(method, point, values[point], order)
            for seed in spec.seeds:
                result = read_result(suite_dir / "runs" / run_id(method, seed, point))
                after = ((result or {}).get("accuracy") or {}).get("after") or {}
                headline = after.get(HEADLINE_MODE) if isinstance(after, dict) else None
                if result is None or result.get("status") != "ok" or not isinstance(headline, dict):
                    score.not_ok[seed] = "missing" if result is None else str(result.get("status"))
                    continue
                score.accuracy[seed] = float(headline["accuracy"])
                score.n_questions = int(result["accuracy"].get("n_questions") or 0)
            scores.append(score)
        out[method] = scores
    return out


def pick(scores: list[PointScore]) -> PointScore | None:
    """The complete point with the highest mean validation accuracy; a tie goes to the point first in the grid."""
    complete = [s for s in scores if s.complete]
    if not complete:
        return None
    return max(complete, key=lambda s: (s.mean, -s.order))


def _base_value(base: dict[str, Any], key: str) -> Any:
    """The base spec's value at dotted ``key``; a method's unset learning rate is the matched one it inherits."""
    node: Any = base
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    if node is None and key.startswith("methods.") and key.endswith(".learning_rate") and key.count(".") == 2:
        return base["train"]["learning_rate"]
    return node


def method_record(grid: Grid, scores: list[PointScore], best: PointScore, base: dict[str, Any],
                  seeds: list[int], split_size: int) -> dict[str, Any]:
    """What ``tuning.methods.<method>`` holds: the choice, its score, the grid and every point's score."""
    from bench.task.verifier import HEADLINE_MODE

    default = next((s for s in scores if all(_base_value(base, k) == v for k, v in s.values.items())), None)
    return {
        "chosen": dict(best.values), "point": best.point,
        "score": {"mean": _round(best.mean), "sd": _round(best.sd), "n": len(best.accuracy)},
        "default_point": default.point if default else None,
        "default_score": ({"mean": _round(default.mean), "sd": _round(default.sd), "n": len(default.accuracy)}
                          if default is not None and default.complete else None),
        "split": "validation", "n_questions": best.n_questions, "validation_size": split_size,
        "seeds": list(seeds), "scoring_mode": HEADLINE_MODE,
        "mode": grid.mode, "grid": {k: list(v) for k, v in grid.axes.items()}, "points": len(scores),
        "scores": [s.record() for s in scores],
    }


# -- the reward model, tuned first on its own validation pairs ------------------------------------------------
def stage_readers(base: Any, names: Any) -> list[str]:
    """The methods among ``names`` that read the reward model (its stage is among the stages they need)."""
    from bench.config.registry import stages_needed

    return [m for m in names if m in base.methods and STAGE in stages_needed(base, m)]


@dataclass
class StageTune:
    """The reward model's grid as runs of its stage: every point at every seed, after the warm start and pool."""

    grid: Grid
    readers: list[str]
    """The tuned methods that read it: tuned at its chosen point."""
    spec: Any
    """A per_method sweep of one reader at the grid's points: it plans the stage runs (the reader never runs)."""
    points: list[tuple[str, dict[str, Any]]]
    """(label, values) per grid point, in grid order; the first seed's run is ``reward_model@<label>``."""
    seeds: list[int]
    runs: list[Any]
    """PlannedRuns: the stages it needs, then each point at the first seed, then at each other seed."""

    def run_id(self, label: str, seed: int) -> str:
        """The first seed's run is the stage a method sweep at this point plans (so it is read, not re-run)."""
        return f"{STAGE}@{label}" if seed == self.seeds[0] else f"{STAGE}-s{seed}@{label}"

    def keys(self) -> set[str]:
        return set(self.grid.axes)

    def base_values(self, base: Any) -> dict[str, Any]:
        """The preset's own value of every axis, in axis order."""
        data = base.to_dict()
        return {key: _base_value(data, key) for key in self.grid.axes}


def stage_tune(base: Any, grid: Grid, readers: list[str], seeds: list[int], validation_size: int) -> StageTune:
    """The stage's runs for ``grid`` at ``seeds``, planned as a method sweep plans its stages (same run ids,
    same needs): one reader (a tuned one, else any method that reads the reward model) at the grid's points."""
    from bench.config.registry import METHODS
    from bench.config.sweep import _label
    from bench.execution.plan import make_plan

    planner = readers[0] if readers else next(iter(stage_readers(base, METHODS)), None)
    if planner is None:
        raise UserError(f"no method of preset '{base.name}' reads the reward model (PPO with reward: model), so "
                        f"its grid has nothing to plan it; tune it with a preset where one does")
    spec = tune_spec(base, {planner: Grid(planner, grid.axes, grid.mode)}, [planner], seeds, validation_size)
    stages = {run.run_id: run for run in make_plan(spec) if run.kind == "stage"}
    points = [(_label(tuple(values.items())), values) for values in grid.points()]
    labels = [label for label, _ in points]
    if len(set(labels)) != len(labels):
        raise UserError(f"the {STAGE} grid's points {', '.join(labels)} do not all have their own name; give its "
                        f"axes values that differ in what they print as")
    runs = [run for run in stages.values() if run.name != STAGE]
    tune = StageTune(grid, list(readers), spec, points, list(seeds), runs)
    for seed in seeds:
        for label, _ in points:
            run = stages[f"{STAGE}@{label}"]
            runs.append(run if seed == seeds[0] else replace(run, run_id=tune.run_id(label, seed), seed=seed))
    return tune


def describe_stage_tune(tune: StageTune, base: Any, dry_run: bool = False) -> str:
    """The plan's lines for the reward model's grid: what it scores, its points and its runs (``dry_run``: says
    that the methods' plan printed after it shows them at the preset's reward model, not yet the chosen one)."""
    shown = (f" (the plan below shows them at the preset's reward model, {_values_text(tune.base_values(base))})"
             if dry_run else "")
    then = (f"then {', '.join(tune.readers)} tuned at the chosen point{shown}" if tune.readers
            else "no method tuned after it")
    lines = [f"reward model first ({STAGE} grid, {tune.grid.mode}): {len(tune.points)} points x {len(tune.seeds)} "
             f"seed(s) = {len(tune.points) * len(tune.seeds)} runs of the stage, each scored by its held-out pair "
             f"accuracy on {STAGE_SPLIT}: reward_model.eval_fraction {base.reward_model.eval_fraction} of the "
             f"pool's questions, one pair each, never trained on; the best mean over seeds is chosen, {then}"]
    lines += [f"  axis {key}: {', '.join(str(v) for v in values)}" for key, values in tune.grid.axes.items()]
    lines.append(f"  points: {', '.join(label for label, _ in tune.points)}")
    for i, run in enumerate(tune.runs, 1):
        after = f" (after {', '.join(run.needs)})" if run.needs else ""
        lines.append(f"  {i:2d}. {run.run_id:<28} {run.label}, seed {run.seed}{after}")
    return "\n".join(lines)


def _values_text(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def collect_stage_scores(suite_dir: Path, tune: StageTune) -> list[PointScore]:
    """The reward model's grid points' held-out pair accuracy per seed, from the stage runs' result files; a run
    that did not finish, or finished without a held-out pair accuracy, makes its point incomplete."""
    from bench.results import read_result

    scores = []
    for order, (label, values) in enumerate(tune.points):
        score = PointScore(STAGE, label, dict(values), order)
        for seed in tune.seeds:
            result = read_result(suite_dir / "runs" / tune.run_id(label, seed))
            metrics = (result or {}).get("metrics") or {}
            value = metrics.get(STAGE_SCORE) if isinstance(metrics, dict) else None
            if result is None or result.get("status") != "ok":
                score.not_ok[seed] = "missing" if result is None else str(result.get("status"))
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                score.not_ok[seed] = f"no {STAGE_SCORE}"
            else:
                score.accuracy[seed] = float(value)
                score.n_questions = int(metrics.get("heldout_pairs") or 0)
        scores.append(score)
    return scores


def stage_record(tune: StageTune, scores: list[PointScore], best: PointScore, base: dict[str, Any]) -> dict[str, Any]:
    """What ``tuning.methods.reward_model`` holds: a method's record (bench.execution.tune.method_record) scored on
    the stage's own validation pairs (n = held-out pairs), and the methods tuned at its choice."""
    record = method_record(tune.grid, scores, best, base, tune.seeds, best.n_questions)
    record.update(split=STAGE_SPLIT, scoring_mode=STAGE_SCORE, heldout_pairs=best.n_questions,
                  eval_fraction=(base.get(STAGE) or {}).get("eval_fraction"), stage=True, read_by=list(tune.readers))
    return record


def run_stage_runs(spec: Any, suite_dir: Path, runs: list[Any], repo_dir: Path | None, resume_command: str,
                   prepare: Any = None, stream: Any = None) -> bool:
    """Run ``runs`` (shared-stage runs) into ``suite_dir`` one at a time, as the runner runs a plan's stages (each
    in its own worker, with every core; a run already complete from unchanged inputs is kept), holding the folder's
    lock; ``prepare`` (called under the lock first) writes suite.json. True when interrupted (the runs left are
    not started; the running one records itself as interrupted)."""
    import threading

    from bench.execution.devices import placement, plan_devices
    from bench.execution.processes import Progress, Stopper, worker_env
    from bench.execution.runner import execute_run
    from bench.execution.suite_folder import SuiteLock

    stream = stream or sys.stderr
    devices = plan_devices(spec, os.environ)
    slot = devices.slots[0] if devices.slots else ()
    lock = SuiteLock(suite_dir)
    lock.acquire(stream)

    def exit_now() -> None:
        lock.release()
        stream.write(f"resume with: {resume_command}\n")
        stream.flush()

    stopper = Stopper(stream, on_exit_now=exit_now)
    printing = threading.Lock()
    try:
        if prepare is not None:
            prepare()
        stopper.install()
        env = worker_env(spec, os.environ, slot)
        for index, run in enumerate(runs, 1):
            if stopper.requested.is_set():
                break
            progress = Progress(stream, printing, stream.isatty(), index, len(runs), run)
            execute_run(spec, suite_dir, run, True, repo_dir, env, progress, stopper, gpus=slot,
                        placed=placement(devices, 0, slot))
    finally:
        stopper.restore()
        lock.release()
    return stopper.requested.is_set()


def _without_stage_values(data: Any, keys: set[str]) -> Any:
    """Spec data with ``keys`` taken out of every per_method point: the tune's identity, whatever reward model the
    methods' points carry."""
    data = copy.deepcopy(data) if isinstance(data, dict) else {}
    axes = (data.get("sweep") or {}).get("axes")
    if isinstance(axes, dict):
        for method, entries in axes.items():
            if isinstance(entries, list):
                axes[method] = [{k: v for k, v in e.items() if k not in keys} if isinstance(e, dict) else e
                                for e in entries]
    return data


def check_stage_resume(spec: Any, suite_dir: Path, keys: set[str]) -> None:
    """--resume of a tune that tunes the reward model first: the folder's suite.json must be this tune's, equal to
    ``spec`` but for the reward-model values its methods' points carry (the choice made when it last ran)."""
    from bench.results import SUITE_FILE

    path = suite_dir / SUITE_FILE
    if not path.is_file():
        raise UserError(f"--resume: '{suite_dir}' is not a tune folder (no {SUITE_FILE}); give --out a folder "
                        f"written by `bench tune`, or drop --resume")
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise UserError(f"--resume: '{path}' is unreadable ({type(exc).__name__}); start a new --out folder") from None
    old_spec = old.get("spec") if isinstance(old, dict) else None
    if _without_stage_values(old_spec, keys) != _without_stage_values(spec.to_dict(), keys):
        raise UserError(f"--resume: the tune differs from the one '{suite_dir}' was made with; use the same "
                        f"preset, grid, seeds and overrides, or a new --out folder")


def set_suite_spec(suite_dir: Path, spec: Any) -> None:
    """Point suite.json at ``spec`` (the methods' sweep at the chosen reward model), so that the runner continues
    the folder with it (bench.execution.suite_folder.check_suite_dir compares the two)."""
    from bench.results import SUITE_FILE, write_json_atomic

    path = suite_dir / SUITE_FILE
    meta = json.loads(path.read_text(encoding="utf-8"))
    meta["spec"] = spec.to_dict()
    write_json_atomic(path, meta)


# -- the tuned preset -----------------------------------------------------------------------------------------
def tuned_preset_data(extends: str, chosen: dict[str, dict[str, Any]], records: dict[str, Any], source: Path,
                      command: str) -> dict[str, Any]:
    """The tuned preset: ``extends`` the base, the chosen values as nested keys, and the ``tuning`` record."""
    data: dict[str, Any] = {"extends": extends}
    for values in chosen.values():
        for key, value in values.items():
            *parents, last = key.split(".")
            node = data
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
    data["tuning"] = {"source": str(source), "command": command, "methods": records}
    return data


def _percent(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{100 * value:.1f}%"


def _score_text(score: dict[str, Any] | None) -> str:
    if not score:
        return "not measured"
    sd = f" ± {100 * score['sd']:.1f}" if score.get("sd") is not None else ""
    return f"{_percent(score['mean'])}{sd} (n seeds {score['n']})"


def write_tuned_preset(path: Path, data: dict[str, Any], base_name: str, overrides: list[str]) -> None:
    """The tuned preset with a header saying what it is, how it was made and how to use it (written atomically)."""
    records = data["tuning"]["methods"]
    lines = [f"# Tuned settings for preset {base_name}: chosen by `bench tune` on a validation split carved from the",
             "# training split (the test split was never loaded), each method's grid point with the highest mean",
             "# validation accuracy over seeds (scoring mode and every point's score under tuning.methods).",
             f"# Made by: {data['tuning']['command']}",
             f"# Use:     {use_command(path, overrides)}"]
    if overrides:
        lines.append("# The tune ran with the overrides above; the Use line repeats them, so the run matches the tune.")
    if STAGE in records:
        lines += ["# The reward model was tuned first, by its mean held-out pair accuracy over seeds on its own",
                  "# validation pairs (held-out questions of the sample pool, never trained on); the methods that read",
                  "# it were then tuned at its chosen point (tuned_at)."]
    for method, record in records.items():
        chosen = ", ".join(f"{k}={v}" for k, v in record["chosen"].items())
        lines.append(f"# {method}: {chosen}: {_score_text(record['score'])}; default {_score_text(record['default_score'])}")
    text = "\n".join(lines) + "\n" + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def use_command(path: Path, overrides: list[str]) -> str:
    """`bench run` of the tuned preset, with the overrides the tune ran under (its values were chosen under them)."""
    return shlex.join(["bench", "run", "--preset", str(path), *overrides])


# -- the command ----------------------------------------------------------------------------------------------
def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    """`bench tune`'s options."""
    parser.add_argument("--preset", required=True, help="preset name (see `bench presets`) or a YAML file")
    parser.add_argument("--methods", help="comma-separated methods to tune (default: every enabled method with a "
                                          "grid, control never); the grid's reward_model is tuned first when a "
                                          "method read it, or when the list names reward_model (alone: only it)")
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                        help=f"seeds per grid point, 0..N-1 (default {DEFAULT_SEEDS})")
    parser.add_argument("--grid", help=f"grid file (default: the shipped bench/{GRIDS_FILE})")
    parser.add_argument("--out", help="tune folder to write (default: REPORTS_DIR/tune/<preset>-<time>)")
    parser.add_argument("--reports-dir", default="reports", help="where tune folders go, under tune/ (default: reports)")
    parser.add_argument("--resume", action="store_true", help="continue --out, skipping runs already complete")
    parser.add_argument("--dry-run", action="store_true", help="validate and print the grid points and the plan "
                                                               "(the reward model's grid first, when tuned)")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value",
                        help="spec overrides applied before tuning, e.g. train.steps=100")


def tune_command(args: argparse.Namespace, out: Path | None) -> str:
    """The command line that makes (or, with --resume, continues) this tune, runnable from any folder."""
    from bench.execution.commands import bench_program

    preset = args.preset
    if (preset.endswith((".yaml", ".yml")) or "/" in preset) and Path(preset).is_file():
        preset = str(Path(preset).resolve())
    words = ["tune", "--preset", preset, "--seeds", str(args.seeds)]
    if args.methods:
        words += ["--methods", args.methods]
    if args.grid:
        words += ["--grid", str(Path(args.grid).resolve())]
    if out is not None:
        words += ["--out", str(out.resolve())]
    return shlex.join([*bench_program(), *words, *args.overrides])


@dataclass
class TunePlan:
    """What one `bench tune` runs: the base spec, the grids and the methods tuned on them, the seeds and the
    validation size, the reward model's stage tune (None when it is not tuned) and the sweep spec of the folder."""

    base: Any
    grids: dict[str, Grid]
    methods: list[str]
    seeds: list[int]
    size: int
    readers: list[str]
    """The tuned methods that read the reward model."""
    stage: StageTune | None
    at: dict[str, Any] | None
    """The reward model's values the methods are tuned at before its own tune picks (the preset's)."""
    spec: Any


def plan_tune(args: argparse.Namespace) -> TunePlan:
    """Read the preset, the grid file and --methods into the plan (UserError on a usage or spec error)."""
    from bench.config.loading import load_spec

    if args.seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {args.seeds}")
    base = load_spec(args.preset, args.overrides)
    data = read_grid_file(args.grid)
    size, grids = grids_for(base.name, data)
    stage_grid = stage_grid_for(base.name, data)
    asked = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else []
    if STAGE in asked and stage_grid is None:
        raise UserError(f"--methods: no '{STAGE}' grid in the grid file's entry for preset '{base.name}'; add one "
                        f"(axes {STAGE}.<field>) or leave it out")
    others = ",".join(m for m in asked if m != STAGE)
    methods = [] if asked and not others else choose_methods(base, grids, others or None)
    check_shared_keys(grids, methods)
    size = base.task.validation_size or size  # task.validation_size=N on the command line wins
    seeds = list(range(args.seeds))
    readers = stage_readers(base, methods)
    tune = (stage_tune(base, stage_grid, readers, seeds, size)
            if stage_grid is not None and (readers or STAGE in asked) else None)
    at = tune.base_values(base) if tune else None
    if methods:
        spec = tune_spec(base, grids, methods, seeds, size, at, readers)
    else:  # --methods reward_model alone: the stage's own sweep is the folder's spec
        spec = tune.spec  # type: ignore[union-attr]
    return TunePlan(base, grids, methods, seeds, size, readers, tune, at, spec)


def run_tune(args: argparse.Namespace) -> int:
    """`bench tune`: plan and run the grid on the validation split, pick per method, write the tuned preset.

    With a reward-model grid (and a method that reads it, or ``--methods`` naming it): its stage runs first, its
    point is picked, and the methods' sweep then runs at it (the module docstring).

    Exit status: 0 every run ok, 1 some failed (the preset is still written from the complete points), 2 a usage or
    spec error, 130 interrupted (nothing is picked; --resume continues).
    """
    plan = plan_tune(args)
    from bench.execution.plan import describe_plan, make_plan

    if args.dry_run:
        print("\n".join(([describe_stage_tune(plan.stage, plan.base, dry_run=True)] if plan.stage else [])
                        + ([describe_plan(plan.spec, make_plan(plan.spec))] if plan.methods else [])))
        return 0
    from bench.execution.runner import run_suite

    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    suite_dir = Path(args.out) if args.out else Path(args.reports_dir) / "tune" / f"{plan.base.name}-{stamp}"
    check_tune_folder(plan, suite_dir, args.resume)
    from bench.execution.preflight import preflight

    preflight(plan.spec, suite_dir)  # before the plan, as in `bench run`: a failed check is the only line printed
    resume = tune_command(args, suite_dir) + " --resume"
    code = 0
    if plan.stage is not None:
        code, done = tune_reward_model_first(plan, args, suite_dir, resume)
        if done:
            return code
    spec = plan.spec
    print(describe_plan(spec, make_plan(spec)), file=sys.stderr)
    print(f"tuning on {plan.size} validation questions; writing to {suite_dir}", file=sys.stderr)
    outcome = run_suite(spec, suite_dir, resume=args.resume or plan.stage is not None, repo_dir=Path.cwd(),
                        resume_command=resume, latest_dir=Path(args.reports_dir) / "tune")
    if outcome.exit_code == 130:
        return 130
    return finish_tune(suite_dir.resolve(), spec, plan.base, plan.grids, plan.methods, args,
                       tune_command(args, suite_dir), max(code, outcome.exit_code), plan.stage)


def check_tune_folder(plan: TunePlan, suite_dir: Path, resume: bool) -> None:
    """The checks `bench run` makes on its folder (its spec, its run folders, the lock), before anything runs."""
    from bench.execution.suite_folder import SuiteLock, check_run_folders, check_suite_dir

    tune = plan.stage
    if tune is not None and resume:  # suite.json holds the methods at the reward model chosen last time
        check_stage_resume(plan.spec, suite_dir.resolve(), tune.keys())
        check_run_folders(suite_dir.resolve(), tune.runs)
    else:
        check_suite_dir(plan.spec, suite_dir.resolve(), resume)
        if tune is not None:
            check_run_folders(suite_dir.resolve(), tune.runs)
    SuiteLock(suite_dir.resolve()).refuse_if_held()


def tune_reward_model_first(plan: TunePlan, args: argparse.Namespace, suite_dir: Path,
                            resume: str) -> tuple[int, bool]:
    """Run the reward model's grid, pick its point and set the folder's spec to the methods' sweep at it.

    Returns (exit status so far, done): done when the tune ends here (interrupted: 130; the reward model tuned
    alone: the tuned preset is written and its status returned)."""
    from bench.execution.plan import make_plan
    from bench.execution.suite_folder import prepare_suite_dir

    tune, spec, base = plan.stage, plan.spec, plan.base
    assert tune is not None
    print(describe_stage_tune(tune, base), file=sys.stderr)
    print(f"tuning the reward model on its held-out pairs; writing to {suite_dir}", file=sys.stderr)
    folder = suite_dir.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    fresh = not args.resume
    prepare = (lambda: prepare_suite_dir(spec, folder, make_plan(spec), False, resume)) if fresh else None
    if run_stage_runs(spec, folder, tune.runs, Path.cwd(), resume, prepare):
        print(f"resume with: {resume}", file=sys.stderr)
        return 130, True
    from bench.results import is_complete

    ok = sum(is_complete(folder / "runs" / run.run_id) for run in tune.runs)
    code = 0 if ok == len(tune.runs) else 1
    best = pick(collect_stage_scores(folder, tune))
    chosen = dict(best.values) if best is not None else plan.at
    print(f"reward model grid: {ok} of {len(tune.runs)} runs ok; chosen {_values_text(chosen or {})} "
          + (f"(held-out pair accuracy {_percent(best.mean)} over {best.n_questions} held-out pairs)"
             if best is not None else "(no grid point finished on every seed: the preset's values)"),
          file=sys.stderr)
    if not plan.methods:
        return finish_tune(folder, spec, base, plan.grids, plan.methods, args, tune_command(args, suite_dir), code,
                           tune), True
    plan.spec = tune_spec(base, plan.grids, plan.methods, plan.seeds, plan.size, chosen, plan.readers)
    set_suite_spec(folder, plan.spec)
    return code, False


def finish_tune(suite_dir: Path, spec: Any, base: Any, grids: dict[str, Grid], methods: list[str],
                args: argparse.Namespace, command: str, exit_code: int = 0, stage: StageTune | None = None) -> int:
    """Pick each method's best point (and, with ``stage``, the reward model's, first) from the folder's results,
    write the tuned preset and say how to use it."""
    scores = collect_scores(suite_dir, spec)
    base_data = base.to_dict()
    chosen: dict[str, dict[str, Any]] = {}
    records: dict[str, Any] = {}
    keys = stage.keys() if stage is not None else set()
    if stage is not None:
        stage_scores = collect_stage_scores(suite_dir, stage)
        best = pick(stage_scores)
        if best is None:
            print(f"bench tune: {STAGE}: no grid point finished on every seed; left at the preset's values "
                  f"(the methods that read it were tuned there)", file=sys.stderr)
        else:
            chosen[STAGE] = dict(best.values)
            records[STAGE] = stage_record(stage, stage_scores, best, base_data)
    for method in methods:
        tuned_at: dict[str, Any] = {}
        if stage is not None and method in stage.readers:  # every point ran at the reward model chosen first
            for score in scores[method]:
                tuned_at = {k: v for k, v in score.values.items() if k in keys}
                score.values = {k: v for k, v in score.values.items() if k not in keys}
        best = pick(scores[method])
        if best is None:
            print(f"bench tune: {method}: no grid point finished on every seed; left untuned", file=sys.stderr)
            continue
        chosen[method] = dict(best.values)
        records[method] = method_record(grids[method], scores[method], best, base_data, spec.seeds,
                                        spec.task.validation_size)
        if tuned_at:
            records[method]["tuned_at"] = tuned_at
    if not records:
        print("bench: error: no method has a grid point that finished on every seed; nothing written "
              f"(see {suite_dir})", file=sys.stderr)
        return 1
    preset = args.preset
    extends = str(Path(preset).resolve()) if (preset.endswith((".yaml", ".yml")) or "/" in preset) else preset
    path = suite_dir / f"tuned-{base.name}.yaml"
    data = tuned_preset_data(extends, chosen, records, path, command)
    write_tuned_preset(path, data, base.name, list(args.overrides))
    for method, record in records.items():
        shown = ", ".join(f"{k}={v}" for k, v in record["chosen"].items())
        if record.get("stage"):
            print(f"{method}: {shown}: held-out pair accuracy {_score_text(record['score'])} over "
                  f"{record['heldout_pairs']} held-out pairs; default {_score_text(record['default_score'])}")
            continue
        at = f"; at reward model {_values_text(record['tuned_at'])}" if record.get("tuned_at") else ""
        print(f"{method}: {shown}: validation {record['scoring_mode']} {_score_text(record['score'])} over "
              f"{record['n_questions']} questions; default {_score_text(record['default_score'])}{at}")
    print(f"tuned preset: {path}")
    print(f"use it: {use_command(path, list(args.overrides))}")
    return exit_code
