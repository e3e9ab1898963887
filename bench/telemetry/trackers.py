"""Live curves in the experiment trackers people already use: TensorBoard by default, W&B, MLflow or Trackio when
asked (``telemetry.report_to``). Not to be confused with :mod:`bench.telemetry.tracker`, the run's own phase and
memory tracker (``Telemetry``), whose numbers these trackers also show.

One interface, :class:`Tracker` (``log(step, values)``, ``close()``), one class per back-end, and :class:`Trackers`,
the fan-out a run logs through:

- names: a run logs the names ``result["curves"]`` uses (:data:`bench.results.METRIC_NAMES`), at the steps it logs.
  TRL's trainers log their own keys; :meth:`Trackers.on_log` maps them through the recipe's ``CURVE_NAMES`` (the
  map ``curves_from_log_history`` uses for result.json), so nothing is logged under TRL's names (the recipes give
  TRL ``report_to=[]``). The suite's engine logs suite names already. Beside the curves, each log point carries the
  live readings of the run's telemetry (:func:`live_readings`: phase times, memory peaks by source, completions and
  tokens per second so far), and the end of the run adds the result's numbers under ``final/`` (:func:`final_values`).
- one run: ``<suite folder>/<run id>``, with the run's settings (the resolved spec, flattened) and seed as
  hyper-parameters.
- live where the run logs (the TelemetryCallback's ``on_log``: TRL's trainers and the engine both fire it), and
  complete at the end: :meth:`Trackers.finish` logs every curve point of the result that was not logged live (a
  stage's own curves, e.g. the reward model's held-out pair accuracy), so each tracker holds result.json's curves.
- failure is not the run's: a tracker that raises is recorded as a warning in ``result["trackers"]["warnings"]``
  and not called again; the run and its numbers go on unchanged.
- offline by default: event files in ``runs/<run id>/tensorboard/``; W&B offline unless ``WANDB_MODE`` is set;
  MLflow a ``file:`` store in the suite folder (``mlruns/``) unless ``MLFLOW_TRACKING_URI`` is set; Trackio its
  local database unless configured (``TRACKIO_SPACE_ID``).
- a run started again (``--resume`` re-runs a failed run from its first step) appends: TensorBoard writes a new event
  file in the same folder, starting with a restart marker (``purge_step``) so TensorBoard shows the new attempt's
  curves instead of two attempts on top of each other; W&B, MLflow and Trackio get a new run of the same name.

Nothing here imports torch, wandb, mlflow or trackio at module level: each back-end imports its package when opened.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol

from bench.errors import UserError

TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")
"""Every tracker ``telemetry.report_to`` may name (besides 'none'), in the order they are opened."""
MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
"""The package each tracker imports."""
INSTALL = {"tensorboard": "pip install tensorboard (a core dependency: ./run_all.sh --setup installs it)",
           "wandb": "pip install -e '.[wandb]'", "mlflow": "pip install -e '.[mlflow]'",
           "trackio": "pip install -e '.[trackio]'"}
"""How to install each one (the extras in pyproject.toml)."""
TENSORBOARD_DIR = "tensorboard"
"""The event files' folder inside a run's folder: ``tensorboard --logdir SUITE/runs`` shows every run."""
PROJECT = "rlft-bench"
"""W&B project, MLflow experiment and Trackio project (unless WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME /
TRACKIO_PROJECT say otherwise); the suite folder is the W&B and Trackio group."""
FINAL = "final/"
"""Prefix of the result's numbers logged once at the end (accuracy after, throughput, phase times, memory peaks)."""
GIB = 2**30
MESSAGE_LIMIT = 300
"""Characters of an exception's message kept in a warning."""


def asked(report_to: Iterable[str]) -> list[str]:
    """The trackers ``report_to`` names ('none' names none), in :data:`TRACKERS` order."""
    names = set(report_to)
    return [name for name in TRACKERS if name in names]


def missing(report_to: Iterable[str]) -> list[str]:
    """The asked-for trackers whose package is not installed here (looked up, not imported)."""
    return [name for name in asked(report_to) if importlib.util.find_spec(MODULES[name]) is None]


SETTINGS_ENV = ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_BASE_URL", "MLFLOW_TRACKING_URI",
                "MLFLOW_EXPERIMENT_NAME", "TRACKIO_PROJECT", "TRACKIO_SPACE_ID")
"""The trackers' settings read from the environment (where and under which project a run logs). A run started on
another machine (a Ray node) gets the driver's values of these, so it logs where the driver's user asked; their
credentials (WANDB_API_KEY, MLflow's, HF_TOKEN) are not sent along: each node keeps its own."""


def check_stays(report_to: Iterable[str], scheduler: str) -> None:
    """UserError (one line) when a tracker would log into a folder that a run on another machine never sends back:
    under the Ray scheduler MLflow's default store, ``SUITE_DIR/mlruns``, is the node's scratch copy of the suite
    folder, removed when the run's task ends; a tracking server (MLFLOW_TRACKING_URI) keeps the runs."""
    if scheduler == "ray" and "mlflow" in report_to and not os.environ.get("MLFLOW_TRACKING_URI"):
        raise UserError("'telemetry.report_to' lists mlflow under scheduler.name=ray, but MLFLOW_TRACKING_URI is not "
                        "set: MLflow's default store is a folder in the suite folder, and a Ray node's copy of it is "
                        "never sent back; set MLFLOW_TRACKING_URI to an MLflow server (or a file: path every node "
                        "mounts), or leave mlflow out of telemetry.report_to")


def check_installed(report_to: Iterable[str]) -> None:
    """UserError (one line: the CLI prints it and exits 2) when an asked-for tracker is not installed; run before
    any work (bench.execution.preflight)."""
    absent = missing(report_to)
    if absent:
        fixes = "; ".join(INSTALL[name] for name in absent)
        raise UserError(f"'telemetry.report_to' asks for {', '.join(absent)}, not installed here; {fixes}; or leave "
                        f"{'it' if len(absent) == 1 else 'them'} out of telemetry.report_to ([none]: no tracker)")


# -- what a run logs -----------------------------------------------------------------------------
def curve_values(entry: Mapping[str, Any], names: Mapping[str, str] | None) -> dict[str, float]:
    """One log entry's curve values under the suite's names: ``names`` maps a trainer's key to a suite name (TRL's
    recipes' ``CURVE_NAMES``); None: the entry has suite names already (the engine), every number but ``step`` is
    kept. TRL's final summary entry (``train_runtime``) gives nothing, as in ``curves_from_log_history``."""
    if "train_runtime" in entry:
        return {}
    pairs = entry.items() if names is None else ((suite, entry.get(key)) for key, suite in names.items())
    return {name: float(value) for name, value in pairs
            if name != "step" and isinstance(value, (int, float))}


def live_readings(telemetry: Any) -> dict[str, float]:
    """The run's telemetry so far: ``phase_time_s/<phase>`` (exclusive seconds), ``memory_peak_gib/<source>`` (the
    peak so far of each memory source) and ``throughput/completions_per_s`` / ``tokens_per_s`` (counted so far over
    the training time so far); {} before training starts or with telemetry off."""
    summary = telemetry.summary()
    if not summary.get("enabled"):
        return {}
    out = {f"phase_time_s/{name}": float(phase["time_s"]) for name, phase in (summary.get("phases") or {}).items()
           if isinstance(phase.get("time_s"), (int, float))}
    for source, peak in ((summary.get("memory") or {}).get("by_source") or {}).items():
        if isinstance(peak, (int, float)):
            out[f"memory_peak_gib/{source}"] = peak / GIB
    elapsed = telemetry.train_elapsed_s()
    counters = summary.get("counters") or {}
    if elapsed:
        for key, name in (("completions", "completions_per_s"), ("generated_tokens", "tokens_per_s")):
            if counters.get(key):
                out[f"throughput/{name}"] = counters[key] / elapsed
    return out


def final_values(result: Mapping[str, Any]) -> dict[str, float]:
    """A finished run's headline numbers under :data:`FINAL`: accuracy after training per scoring mode, throughput,
    phase times and memory peaks by source (result.json's values; GiB for memory)."""
    out: dict[str, float] = {}
    for mode, score in (((result.get("accuracy") or {}).get("after")) or {}).items():
        if isinstance(score, Mapping) and _number(score.get("accuracy")):
            out[f"{FINAL}accuracy/{mode}"] = float(score["accuracy"])
    throughput = result.get("throughput") or {}
    for key in ("completions_per_s", "tokens_per_s", "trained_tokens_per_s", "step_s_median", "train_s", "wall_s"):
        if _number(throughput.get(key)):
            out[f"{FINAL}throughput/{key}"] = float(throughput[key])
    for name, phase in (result.get("phases") or {}).items():
        if isinstance(phase, Mapping) and _number(phase.get("time_s")):
            out[f"{FINAL}phase_time_s/{name}"] = float(phase["time_s"])
    for source, peak in (((result.get("memory") or {}).get("by_source")) or {}).items():
        if _number(peak):
            out[f"{FINAL}memory_peak_gib/{source}"] = peak / GIB
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- the run ---------------------------------------------------------------------------------------
@dataclass
class RunInfo:
    """Who is logging: one run of a suite."""

    suite: str
    """The suite folder's name (the W&B / Trackio group)."""
    suite_dir: Path
    run_id: str
    run_dir: Path
    method: str
    """Registry name of the method or stage."""
    kind: str
    """'method' or 'stage'."""
    seed: int
    spec: dict[str, Any] = field(default_factory=dict)
    """The resolved spec (its ``to_dict``)."""

    @property
    def name(self) -> str:
        """``<suite>/<run id>``: one name per run in every tracker."""
        return f"{self.suite}/{self.run_id}"

    def config(self) -> dict[str, Any]:
        """Nested settings (W&B, Trackio): the run's identity, seed and spec."""
        return {"suite": self.suite, "run_id": self.run_id, "method": self.method, "kind": self.kind,
                "seed": self.seed, "spec": self.spec}

    def hparams(self) -> dict[str, str | float | int | bool]:
        """Flat settings (TensorBoard's hparams, MLflow's params): the spec's leaves under dotted keys, lists as JSON,
        nulls left out."""
        flat: dict[str, Any] = {"suite": self.suite, "run_id": self.run_id, "method": self.method, "kind": self.kind,
                                "seed": self.seed}
        _flatten(self.spec, "", flat)
        return flat


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _flatten(item, f"{prefix}{key}.", out)
        return
    key = prefix[:-1]
    if value is None or not key:
        return
    out[key] = value if isinstance(value, (str, int, float, bool)) else json.dumps(value, default=str)


# -- the back-ends ---------------------------------------------------------------------------------
class Tracker(Protocol):
    """One tracker's run: scalars by step, then closed. Any method may raise; :class:`Trackers` catches it."""

    name: str

    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    """Event files in ``RUN_DIR/tensorboard/`` (torch's SummaryWriter), the settings as TensorBoard hparams."""

    name = "tensorboard"

    def __init__(self, run: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        folder = run.run_dir / TENSORBOARD_DIR
        again = folder.is_dir() and any(folder.glob("events.out.tfevents.*"))
        # A run started again begins at its first step: the restart marker at step 0 makes TensorBoard drop the
        # earlier attempt's points (its file stays on disk) instead of drawing both attempts over each other.
        self.writer = SummaryWriter(str(folder), purge_step=0 if again else None, flush_secs=10)
        writer = self.writer._get_file_writer()
        for summary in hparams(run.hparams(), {}):
            writer.add_summary(summary)
        self.writer.add_text("run", f"{run.name}: {run.method}, seed {run.seed}", 0)
        self.writer.flush()

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()  # a live curve: on disk at every log point, not every flush_secs

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run (offline unless WANDB_MODE says otherwise), files in ``RUN_DIR/wandb/``. Every value is logged with
    the run's step as its x-axis (``define_metric``), so points logged after training at earlier steps are kept."""

    name = "wandb"

    def __init__(self, run: RunInfo) -> None:
        import wandb

        kwargs: dict[str, Any] = {"project": os.environ.get("WANDB_PROJECT") or PROJECT, "name": run.name,
                                  "group": run.suite, "job_type": run.kind, "dir": str(run.run_dir),
                                  "config": run.config(), "mode": os.environ.get("WANDB_MODE") or "offline"}
        if hasattr(wandb, "Settings"):  # leave stdout alone: the worker's progress lines go there
            kwargs["settings"] = wandb.Settings(console="off", silent=True)
        self.run = wandb.init(**kwargs)
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log({"step": step, **values})

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """An MLflow run in experiment :data:`PROJECT` (MLFLOW_EXPERIMENT_NAME), a ``file:`` store in the suite folder
    unless MLFLOW_TRACKING_URI is set; the flat settings as params."""

    name = "mlflow"
    BATCH = 100
    """Params per log_batch call (MLflow's limit)."""
    VALUE_LIMIT = 6000
    """Characters of a param value MLflow keeps."""

    def __init__(self, run: RunInfo) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run.suite_dir / "mlruns").resolve().as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT
        found = self.client.get_experiment_by_name(experiment)
        if found is None:
            try:
                experiment_id = self.client.create_experiment(experiment)
            except Exception:  # noqa: BLE001 - a run beside this one created it first
                experiment_id = self.client.get_experiment_by_name(experiment).experiment_id
        else:
            experiment_id = found.experiment_id
        self.run_id = self.client.create_run(experiment_id, run_name=run.name,
                                             tags={"suite": run.suite, "run_id": run.run_id}).info.run_id
        params = [Param(key, str(value)[: self.VALUE_LIMIT]) for key, value in run.hparams().items()]
        for start in range(0, len(params), self.BATCH):
            self.client.log_batch(self.run_id, params=params[start:start + self.BATCH])

    def log(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key, value, now, step) for key, value in values.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class TrackioTracker:
    """A Trackio run in project :data:`PROJECT` (TRACKIO_PROJECT), grouped by suite; local unless configured."""

    name = "trackio"

    def __init__(self, run: RunInfo) -> None:
        import trackio

        self.trackio = trackio
        kwargs: dict[str, Any] = {"project": os.environ.get("TRACKIO_PROJECT") or PROJECT, "name": run.name,
                                  "config": run.config()}
        if "group" in inspect.signature(trackio.init).parameters:  # older Trackio has no groups
            kwargs["group"] = run.suite
        self.run = trackio.init(**kwargs)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.trackio.log(dict(values), step=step)

    def close(self) -> None:
        self.trackio.finish()


BACKENDS: dict[str, type] = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker,
                             "trackio": TrackioTracker}
"""Tracker name -> its back-end class (tests replace entries)."""


# -- the fan-out -------------------------------------------------------------------------------------
class Trackers:
    """Every tracker of one run. Whatever a tracker raises becomes a warning (and that tracker is not called again);
    nothing here raises into the run.

    ``names``: the recipe's ``CURVE_NAMES`` (a trainer's log key -> suite name), None where the run logs suite names.
    """

    def __init__(self, run: RunInfo, report_to: list[str], names: Mapping[str, str] | None = None,
                 backends: Mapping[str, type] | None = None) -> None:
        self.run = run
        self.report_to = list(report_to)
        self.names = dict(names) if names is not None else None
        self.warnings: list[str] = []
        self.logged: set[tuple[int, str]] = set()
        """(step, name) pairs logged so far: the end of the run logs only what is missing."""
        self.active: list[Any] = []
        self.opened: list[str] = []
        self._live = True
        for name in asked(report_to):
            try:
                self.active.append((backends or BACKENDS)[name](run))
                self.opened.append(name)
            except Exception as exc:  # noqa: BLE001 - a tracker that cannot start is a warning, not a failed run
                self._warn(f"{name}: could not start, so it logged nothing: {_describe(exc)}")

    def _warn(self, line: str) -> None:
        self.warnings.append(line)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        """Log ``values`` at ``step`` to every tracker still working."""
        if not values:
            return
        step = int(step)
        self.logged.update((step, key) for key in values)
        for tracker in list(self.active):
            try:
                tracker.log(step, values)
            except Exception as exc:  # noqa: BLE001 - logging failure is not a run failure
                self._drop(tracker, f"{tracker.name}: stopped logging at step {step}: {_describe(exc)}")

    def _drop(self, tracker: Any, line: str) -> None:
        self._warn(line)
        self.active.remove(tracker)
        try:
            tracker.close()
        except Exception:  # noqa: BLE001 - it already failed; the warning says so
            pass

    def on_log(self, step: int, logs: Mapping[str, Any], telemetry: Any = None) -> None:
        """A log point of the run (TrainerCallback.on_log): its curve values under the suite's names, with the
        telemetry's live readings beside them."""
        values = curve_values(logs, self.names)
        if not values:
            return
        if telemetry is not None and self._live:
            try:
                values.update(live_readings(telemetry))
            except Exception as exc:  # noqa: BLE001 - the curves still go out
                self._live = False
                self._warn(f"live readings (phase times, memory, throughput) stopped at step {step}: "
                           f"{_describe(exc)}")
        self.log(step, values)

    def finish(self, result: dict[str, Any]) -> None:
        """At the end of the run, whatever its status: the result's curve points not logged live, the result's
        numbers under :data:`FINAL` (ok runs), then close every tracker and record ``result["trackers"]``."""
        try:
            curves = result.get("curves") or []
            for point in curves:
                if not isinstance(point, Mapping) or not _number(point.get("step")):
                    continue
                step = int(point["step"])
                rest = {key: value for key, value in curve_values(point, None).items() if (step, key) not in self.logged}
                self.log(step, rest)
            if result.get("status") == "ok":
                steps = [int(p["step"]) for p in curves if isinstance(p, Mapping) and _number(p.get("step"))]
                last = max(steps, default=int((result.get("throughput") or {}).get("steps") or 0))
                self.log(last, final_values(result))
        except Exception as exc:  # noqa: BLE001 - the result is written whatever happens here
            self._warn(f"the end-of-run logging failed: {_describe(exc)}")
        for tracker in list(self.active):
            try:
                tracker.close()
            except Exception as exc:  # noqa: BLE001
                self._warn(f"{tracker.name}: could not close: {_describe(exc)}")
        self.active = []
        result["trackers"] = self.record()

    def record(self) -> dict[str, Any]:
        """``result["trackers"]``: what was asked, the run's name in the trackers, where the event files are, and
        the warnings (empty when every tracker worked)."""
        record: dict[str, Any] = {"report_to": self.report_to, "run_name": self.run.name, "opened": self.opened,
                                  "warnings": list(self.warnings)}
        if "tensorboard" in self.opened:
            record["tensorboard_dir"] = TENSORBOARD_DIR
        return record


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if len(text) > MESSAGE_LIMIT:
        text = text[: MESSAGE_LIMIT - 1] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def recipe_curve_names(method: str) -> dict[str, str] | None:
    """The recipe's ``CURVE_NAMES`` (TRL trainers' key -> suite name), None for a recipe that logs suite names."""
    from bench.config.registry import recipe

    names = getattr(recipe(method), "CURVE_NAMES", None)
    return dict(names) if isinstance(names, Mapping) else None


def open_trackers(spec: Any, job: Mapping[str, Any], run_dir: Path) -> Trackers | None:
    """The run's trackers (``spec.telemetry.report_to``), or None for [none]; the worker's rank 0 alone calls it.
    Never raises: a tracker that cannot start is a warning in the result."""
    report_to = list(spec.telemetry.report_to)
    if not asked(report_to):
        return None
    run_dir = Path(run_dir)
    suite_dir = run_dir.resolve().parent.parent  # SUITE/runs/<run id>
    run = RunInfo(suite=suite_dir.name, suite_dir=suite_dir, run_id=str(job["run_id"]), run_dir=run_dir,
                  method=str(job["name"]), kind=str(job["kind"]), seed=int(job["seed"]), spec=dict(job.get("spec") or {}))
    try:
        names = recipe_curve_names(run.method)
    except Exception as exc:  # noqa: BLE001 - without the map the end of the run still logs the result's curves
        trackers = Trackers(run, report_to, {})
        trackers._warn(f"no live curves: the recipe's CURVE_NAMES could not be read ({_describe(exc)}); the curves "
                       f"were logged at the end of the run")
        return trackers
    return Trackers(run, report_to, names)


def finish_trackers(trackers: Trackers | None, result: dict[str, Any]) -> None:
    """:meth:`Trackers.finish` when the run had trackers; never raises."""
    if trackers is None:
        return
    try:
        trackers.finish(result)
    except Exception as exc:  # noqa: BLE001 - the result is written whatever happens here
        result["trackers"] = {**trackers.record(), "warnings": [*trackers.warnings, f"closing failed: {_describe(exc)}"]}

