"""`bench tune`: each method's settings chosen on a validation split, never on the test split.

A tune is a sweep (bench.config.sweep, ``mode: per_method``) over each method's declared grid (``bench/config/tuning_grids.yaml``,
or ``--grid FILE``): every (method, grid point, seed) is its own worker, the shared stages run once per distinct
value of the keys they depend on (one warm start and sample pool for all; a reward model per reward-model value),
and every evaluation reads the validation split: ``task.validation_size`` questions carved from the training side
(bench.task.problems: synthetic by working, a file's by a hash of the question), which the training prompts then exclude.
The test split is never loaded (``eval.split: validation``; bench.task.data.load_task).

Each method's best point is the one with the highest mean validation accuracy over the seeds, in the headline
scoring mode (bench.task.verifier.HEADLINE_MODE); only points where every seed finished count, and a tie goes to the
point listed first in the grid (the preset's own value comes first there). The choice is written as a preset that
extends the tuned one (``DIR/tuned-<preset>.yaml``): the chosen values, and under ``tuning:`` (bench.config.spec.TuningSpec)
per method the grid, every point's score (mean, sd, n questions, seeds) and the command that made it. Run it with
``bench run --preset DIR/tuned-<preset>.yaml``; every result then carries ``spec.tuning``, so the report can say
per method "tuned on validation" or "untuned default".

Imports no torch: the workers do the training (bench.execution.runner).
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys
from dataclasses import dataclass, field
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
    grids: dict[str, Grid] = {}
    for method, spec in entry["methods"].items():
        where = f"grid '{name}', method '{method}'"
        if not isinstance(spec, dict) or not isinstance(spec.get("axes"), dict) or not spec["axes"]:
            raise UserError(f"{where}: give 'axes' (dotted key -> list of values), e.g. "
                            f"axes: {{methods.{method}.learning_rate: [1.0e-5, 3.0e-5]}}")
        unknown = sorted(set(spec) - {"axes", "mode"})
        if unknown:
            raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; a method's grid has 'axes' and 'mode'")
        mode = spec.get("mode", "product")
        if mode not in GRID_MODES:
            raise UserError(f"{where}: 'mode' must be one of {', '.join(GRID_MODES)}, got {mode!r}")
        for key, values in spec["axes"].items():
            if not isinstance(values, list) or not values:
                raise UserError(f"{where}: axis '{key}' must be a non-empty list of values, got {values!r}")
        grids[str(method)] = Grid(str(method), {str(k): list(v) for k, v in spec["axes"].items()}, mode)
    return size, grids


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
def tune_spec(base: Any, grids: dict[str, Grid], methods: list[str], seeds: list[int], validation_size: int) -> Any:
    """The base spec as a per_method sweep of the grids: only ``methods`` enabled, every evaluation on a validation
    split of ``validation_size``, the base's own training steps (the sweep's warm-up + measured steps)."""
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
    data["sweep"] = {"mode": "per_method", "axes": {m: grids[m].points() for m in methods},
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
                                          "grid, control never)")
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                        help=f"seeds per grid point, 0..N-1 (default {DEFAULT_SEEDS})")
    parser.add_argument("--grid", help=f"grid file (default: the shipped bench/{GRIDS_FILE})")
    parser.add_argument("--out", help="tune folder to write (default: REPORTS_DIR/tune/<preset>-<time>)")
    parser.add_argument("--reports-dir", default="reports", help="where tune folders go, under tune/ (default: reports)")
    parser.add_argument("--resume", action="store_true", help="continue --out, skipping runs already complete")
    parser.add_argument("--dry-run", action="store_true", help="validate and print the grid points and the plan")
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


def run_tune(args: argparse.Namespace) -> int:
    """`bench tune`: plan and run the grid on the validation split, pick per method, write the tuned preset.

    Exit status: 0 every run ok, 1 some failed (the preset is still written from the complete points), 2 a usage or
    spec error, 130 interrupted (nothing is picked; --resume continues).
    """
    from bench.config.loading import load_spec

    if args.seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {args.seeds}")
    base = load_spec(args.preset, args.overrides)
    size, grids = grids_for(base.name, read_grid_file(args.grid))
    methods = choose_methods(base, grids, args.methods)
    check_shared_keys(grids, methods)
    size = base.task.validation_size or size  # task.validation_size=N on the command line wins
    spec = tune_spec(base, grids, methods, list(range(args.seeds)), size)
    from bench.execution.plan import describe_plan, make_plan

    if args.dry_run:
        print(describe_plan(spec, make_plan(spec)))
        return 0
    from bench.execution.runner import run_suite
    from bench.execution.suite_folder import SuiteLock, check_suite_dir

    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    suite_dir = Path(args.out) if args.out else Path(args.reports_dir) / "tune" / f"{base.name}-{stamp}"
    check_suite_dir(spec, suite_dir.resolve(), args.resume)
    SuiteLock(suite_dir.resolve()).refuse_if_held()
    from bench.execution.preflight import preflight

    preflight(spec, suite_dir)  # before the plan, as in `bench run`: a failed check is the only line printed
    print(describe_plan(spec, make_plan(spec)), file=sys.stderr)
    print(f"tuning on {size} validation questions; writing to {suite_dir}", file=sys.stderr)
    resume = tune_command(args, suite_dir) + " --resume"
    outcome = run_suite(spec, suite_dir, resume=args.resume, repo_dir=Path.cwd(), resume_command=resume,
                        latest_dir=Path(args.reports_dir) / "tune")
    if outcome.exit_code == 130:
        return 130
    return finish_tune(suite_dir.resolve(), spec, base, grids, methods, args, tune_command(args, suite_dir),
                       outcome.exit_code)


def finish_tune(suite_dir: Path, spec: Any, base: Any, grids: dict[str, Grid], methods: list[str],
                args: argparse.Namespace, command: str, exit_code: int = 0) -> int:
    """Pick each method's best point from the folder's results, write the tuned preset and say how to use it."""
    scores = collect_scores(suite_dir, spec)
    base_data = base.to_dict()
    chosen: dict[str, dict[str, Any]] = {}
    records: dict[str, Any] = {}
    for method in methods:
        best = pick(scores[method])
        if best is None:
            print(f"bench tune: {method}: no grid point finished on every seed; left untuned", file=sys.stderr)
            continue
        chosen[method] = dict(best.values)
        records[method] = method_record(grids[method], scores[method], best, base_data, spec.seeds,
                                        spec.task.validation_size)
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
        print(f"{method}: {shown}: validation {record['scoring_mode']} {_score_text(record['score'])} over "
              f"{record['n_questions']} questions; default {_score_text(record['default_score'])}")
    print(f"tuned preset: {path}")
    print(f"use it: {use_command(path, list(args.overrides))}")
    return exit_code
