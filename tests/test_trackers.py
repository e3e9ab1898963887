"""Live curves (bench.telemetry.trackers): the names a run logs, the fan-out that turns a tracker's failure into a
warning, each back-end against a fake of its package (W&B, MLflow, Trackio: never a server), TensorBoard's event files
read back with TensorBoard's own reader, the refusal of a tracker that is not installed, and the report's line.

The end-to-end check (every run of a cpu-quick suite: TensorBoard's scalars equal result.json's curves) is in
tests/test_end_to_end.py, on the suite its module already runs.
"""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import pytest

from bench.errors import UserError
from bench.telemetry import trackers
from bench.telemetry.trackers import RunInfo, Trackers, curve_values
from tensorboard_events import assert_tensorboard_equals_curves, tensorboard_scalars
from test_rollout_engine import model_dirs  # noqa: F401 (a pytest fixture: the engine test's tiny models)

GRPO_NAMES = {"reward": "reward", "rewards/accuracy/mean": "accuracy_reward", "kl": "kl", "loss": "loss"}


def _run(tmp_path: Path, run_id: str = "grpo-s0", spec: dict | None = None) -> RunInfo:
    suite_dir = tmp_path / "suite"
    run_dir = suite_dir / "runs" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    return RunInfo(suite="suite", suite_dir=suite_dir, run_id=run_id, run_dir=run_dir, method="grpo", kind="method",
                   seed=0, spec=spec if spec is not None else {"train": {"steps": 2, "learning_rate": 1e-3},
                                                                "seeds": [0], "model": {"revision": None}})


# -- names ---------------------------------------------------------------------------------------
def test_trl_log_entries_map_to_the_names_result_json_uses() -> None:
    from baselines.common import curves_from_log_history

    history = [{"reward": 0.5, "rewards/accuracy/mean": 0.25, "kl": 0.0, "loss": 1.5, "epoch": 0.1, "step": 1},
               {"grad_norm": 3.0, "step": 2},  # no mapped key: no point
               {"reward": 0.75, "rewards/accuracy/mean": 0.5, "kl": 0.01, "loss": 1.0, "step": 3},
               {"train_runtime": 9.0, "train_loss": 1.2, "step": 3}]  # TRL's summary: never a point
    points = curves_from_log_history(history, GRPO_NAMES)
    live = [{"step": e["step"], **curve_values(e, GRPO_NAMES)} for e in history if curve_values(e, GRPO_NAMES)]
    assert live == points
    assert curve_values({"step": 4, "reward": 1.0, "kl": 0.5}, None) == {"reward": 1.0, "kl": 0.5}  # the engine's


# -- the fan-out -----------------------------------------------------------------------------------
class Recorder:
    """A tracker that keeps what it was given."""

    name = "recorder"

    def __init__(self, run: RunInfo) -> None:
        self.points: list[tuple[int, dict]] = []
        self.closed = False

    def log(self, step, values):
        self.points.append((step, dict(values)))

    def close(self):
        self.closed = True


class Flaky(Recorder):
    """Raises at its second log call."""

    name = "flaky"

    def log(self, step, values):
        if self.points:
            raise ConnectionError("the tracker's server went away\nmid-run")
        super().log(step, values)


def test_a_tracker_that_raises_is_a_warning_and_the_others_go_on(tmp_path: Path) -> None:
    made: dict[str, Recorder] = {}

    def keep(cls):
        def make(run):
            made[cls.__name__] = cls(run)
            return made[cls.__name__]
        return make

    fan = Trackers(_run(tmp_path), ["tensorboard", "wandb"], GRPO_NAMES,
                   backends={"tensorboard": keep(Recorder), "wandb": keep(Flaky)})
    fan.on_log(1, {"reward": 0.5, "kl": 0.0, "epoch": 0.1})
    fan.on_log(2, {"reward": 0.75, "kl": 0.1})
    fan.on_log(3, {"reward": 1.0, "kl": 0.2})
    result = {"status": "ok", "curves": [{"step": 0, "heldout_pair_accuracy": 0.5},  # a stage's own curve
                                         {"step": 1, "reward": 0.5, "kl": 0.0}, {"step": 2, "reward": 0.75, "kl": 0.1},
                                         {"step": 3, "reward": 1.0, "kl": 0.2}],
              "throughput": {"completions_per_s": 2.0}, "accuracy": {"after": {"suite-strict": {"accuracy": 0.5}}}}
    before = json.dumps(result["curves"])
    fan.finish(result)
    assert json.dumps(result["curves"]) == before  # the numbers are not touched
    record = result["trackers"]
    assert record["opened"] == ["tensorboard", "wandb"] and record["run_name"] == "suite/grpo-s0"
    (warning,) = record["warnings"]
    assert warning == "flaky: stopped logging at step 2: ConnectionError: the tracker's server went away mid-run"
    good = made["Recorder"]
    assert good.closed and made["Flaky"].closed
    assert good.points[:3] == [(1, {"reward": 0.5, "kl": 0.0}), (2, {"reward": 0.75, "kl": 0.1}),
                               (3, {"reward": 1.0, "kl": 0.2})]
    # the end of the run adds what the log points missed, once, and the final numbers
    assert good.points[3] == (0, {"heldout_pair_accuracy": 0.5})
    assert good.points[4] == (3, {"final/accuracy/suite-strict": 0.5, "final/throughput/completions_per_s": 2.0})
    assert len(good.points) == 5


def test_a_tracker_that_cannot_start_is_a_warning(tmp_path: Path) -> None:
    def broken(run):
        raise PermissionError("no write access")

    result = {"status": "failed"}
    fan = Trackers(_run(tmp_path), ["mlflow"], None, backends={"mlflow": broken})
    fan.on_log(1, {"reward": 1.0})
    trackers.finish_trackers(fan, result)
    assert result["trackers"]["opened"] == []
    assert result["trackers"]["warnings"] == ["mlflow: could not start, so it logged nothing: PermissionError: no "
                                              "write access"]


def test_report_to_none_opens_nothing(tmp_path: Path) -> None:
    from bench.config.spec import Spec

    spec = Spec()
    spec.telemetry.report_to = ["none"]
    assert trackers.open_trackers(spec, {"run_id": "x", "name": "grpo", "kind": "method", "seed": 0},
                                  tmp_path / "runs" / "x") is None
    trackers.finish_trackers(None, {})  # nothing to close


# -- the spec and the refusal -------------------------------------------------------------------------
@pytest.mark.parametrize("value, message", [
    ("[]", "'telemetry.report_to' is empty"),
    ("[wandb,wandb]", "'telemetry.report_to' has duplicates"),
    ("[none,tensorboard]", "'telemetry.report_to' lists 'none' beside trackers"),
    ("[tensorbaord]", "did you mean 'tensorboard'?"),
])
def test_report_to_is_checked_when_the_spec_loads(value: str, message: str) -> None:
    from bench.config.loading import load_spec
    from bench.errors import SpecError

    assert load_spec("cpu-quick", []).telemetry.report_to == ["tensorboard"]  # the default
    with pytest.raises(SpecError) as err:
        load_spec("cpu-quick", [f"telemetry.report_to={value}"])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_missing_tracker_is_refused_before_any_work(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.config.spec import Spec
    from bench.execution.preflight import check_trackers

    monkeypatch.setitem(trackers.MODULES, "mlflow", "bench_no_such_module")
    spec = Spec()
    spec.telemetry.report_to = ["tensorboard", "mlflow"]
    with pytest.raises(UserError) as err:
        check_trackers(spec)
    text = str(err.value)
    assert "\n" not in text and text.startswith("'telemetry.report_to' asks for mlflow, not installed here;")
    assert "pip install -e '.[mlflow]'" in text
    spec.telemetry.report_to = ["none"]
    check_trackers(spec)


def test_under_ray_mlflow_needs_a_store_that_outlives_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ray node's scratch copy of the suite folder, with MLflow's default store in it, is removed when its task
    ends: under scheduler.name=ray mlflow without MLFLOW_TRACKING_URI is one line before any work; with it, fine,
    and the nodes get its value (the trackers' settings travel with every run, their credentials do not)."""
    from bench.config.loading import load_spec
    from bench.execution.preflight import check_trackers
    from bench.execution.ray_scheduler import FORWARDED_ENV

    monkeypatch.setattr(trackers, "missing", lambda report_to: [])  # installed or not, the store is the question
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = load_spec("cpu-quick", ["telemetry.report_to=[tensorboard,mlflow]", "scheduler.name=ray"])
    with pytest.raises(UserError) as err:
        check_trackers(spec)
    assert "\n" not in str(err.value) and "set MLFLOW_TRACKING_URI to an MLflow server" in str(err.value)
    check_trackers(load_spec("cpu-quick", ["telemetry.report_to=[mlflow]"]))  # local: the store is the suite's
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    check_trackers(spec)
    assert {"MLFLOW_TRACKING_URI", "WANDB_PROJECT", "TRACKIO_SPACE_ID"} <= set(FORWARDED_ENV)
    assert not {"WANDB_API_KEY", "HF_TOKEN"} & set(FORWARDED_ENV)


def test_bench_run_refuses_an_uninstalled_tracker_in_one_line_with_exit_2(tmp_path: Path) -> None:
    from bench_cli import run_quick_suite

    absent = trackers.missing(["wandb", "mlflow", "trackio"])
    if not absent:
        pytest.skip("wandb, mlflow and trackio are all installed here")
    out = tmp_path / "suite"
    proc = run_quick_suite(out, f"telemetry.report_to=[{absent[0]}]", cache_dir=tmp_path / "cache", timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"asks for {absent[0]}, not installed here" in lines[0], proc.stderr
    assert not out.exists()  # before any work: no suite folder


def test_a_dry_run_refuses_an_uninstalled_tracker_too(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from bench.cli import main

    monkeypatch.setitem(trackers.MODULES, "mlflow", "bench_no_such_module")
    assert main(["run", "--preset", "cpu-quick", "telemetry.report_to=[mlflow]", "--dry-run"]) == 2
    out = capsys.readouterr()
    assert "asks for mlflow, not installed here" in out.err and "runs (" not in out.out
    assert main(["run", "--preset", "cpu-quick", "--dry-run"]) == 0


# -- the back-ends, each against a fake of its package -------------------------------------------------------
def test_wandb_is_offline_unless_asked_and_logs_on_the_runs_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, list] = {"init": [], "define_metric": [], "log": [], "finish": []}

    class FakeRun:
        def define_metric(self, *args, **kwargs):
            calls["define_metric"].append((args, kwargs))

        def log(self, data):
            calls["log"].append(dict(data))

        def finish(self):
            calls["finish"].append(True)

    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: calls["init"].append(kwargs) or FakeRun()
    fake.Settings = lambda **kwargs: kwargs
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    run = _run(tmp_path)
    fan = Trackers(run, ["wandb"], GRPO_NAMES)
    fan.on_log(2, {"reward": 0.5, "loss": 1.0})
    fan.finish({"status": "ok", "curves": [{"step": 1, "reward": 0.25}, {"step": 2, "reward": 0.5, "loss": 1.0}]})
    (init,) = calls["init"]
    assert init["mode"] == "offline" and init["name"] == "suite/grpo-s0" and init["group"] == "suite"
    assert init["project"] == trackers.PROJECT and init["dir"] == str(run.run_dir)
    assert init["config"]["seed"] == 0 and init["config"]["spec"]["train"]["steps"] == 2
    assert init["settings"]["console"] == "off"  # the worker's stdout carries its progress lines
    assert (("*",), {"step_metric": "step"}) in calls["define_metric"]
    assert calls["log"] == [{"step": 2, "reward": 0.5, "loss": 1.0}, {"step": 1, "reward": 0.25}]
    assert calls["finish"] == [True] and fan.warnings == []
    monkeypatch.setenv("WANDB_MODE", "online")  # the user's own setting wins
    Trackers(run, ["wandb"], None)
    assert calls["init"][-1]["mode"] == "online"


def test_mlflow_writes_a_file_store_in_the_suite_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from collections import namedtuple

    state: dict = {"experiments": {}, "runs": [], "batches": [], "terminated": []}

    class FakeClient:
        def __init__(self, tracking_uri):
            state["uri"] = tracking_uri

        def get_experiment_by_name(self, name):
            eid = state["experiments"].get(name)
            return None if eid is None else types.SimpleNamespace(experiment_id=eid)

        def create_experiment(self, name):
            state["experiments"][name] = str(len(state["experiments"]))
            return state["experiments"][name]

        def create_run(self, experiment_id, run_name=None, tags=None):
            state["runs"].append((experiment_id, run_name, tags))
            return types.SimpleNamespace(info=types.SimpleNamespace(run_id=f"r{len(state['runs'])}"))

        def log_batch(self, run_id, metrics=(), params=()):
            state["batches"].append((run_id, list(metrics), list(params)))

        def set_terminated(self, run_id):
            state["terminated"].append(run_id)

    entities = types.ModuleType("mlflow.entities")
    entities.Metric = namedtuple("Metric", "key value timestamp step")
    entities.Param = namedtuple("Param", "key value")
    tracking = types.ModuleType("mlflow.tracking")
    tracking.MlflowClient = FakeClient
    root = types.ModuleType("mlflow")
    root.entities, root.tracking = entities, tracking
    for name, module in (("mlflow", root), ("mlflow.entities", entities), ("mlflow.tracking", tracking)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.setattr(trackers.MlflowTracker, "BATCH", 3)
    run = _run(tmp_path)
    fan = Trackers(run, ["mlflow"], GRPO_NAMES)
    fan.on_log(1, {"reward": 0.5})
    fan.finish({"status": "failed"})
    assert state["uri"] == (run.suite_dir / "mlruns").resolve().as_uri() and state["uri"].startswith("file:")
    assert state["runs"] == [("0", "suite/grpo-s0", {"suite": "suite", "run_id": "grpo-s0"})]
    params = [p for _, _, batch in state["batches"] for p in batch]
    assert all(len(batch) <= 3 for _, _, batch in state["batches"])
    assert {(p.key, p.value) for p in params} >= {("train.steps", "2"), ("seed", "0"), ("seeds", "[0]"),
                                                   ("method", "grpo")}
    assert "model.revision" not in {p.key for p in params}  # nulls left out
    metrics = [m for _, batch, _ in state["batches"] for m in batch]
    assert [(m.key, m.value, m.step) for m in metrics] == [("reward", 0.5, 1)]
    assert state["terminated"] == ["r1"] and fan.warnings == []


def test_trackio_gets_the_run_name_group_and_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, list] = {"init": [], "log": [], "finish": []}
    fake = types.ModuleType("trackio")

    def init(project, name=None, group=None, config=None, resume="never"):
        calls["init"].append({"project": project, "name": name, "group": group, "config": config})

    fake.init = init
    fake.log = lambda metrics, step=None: calls["log"].append((step, dict(metrics)))
    fake.finish = lambda: calls["finish"].append(True)
    monkeypatch.setitem(sys.modules, "trackio", fake)
    fan = Trackers(_run(tmp_path), ["trackio"], None)
    fan.on_log(3, {"step": 3, "reward": 0.5})
    fan.finish({"status": "failed"})
    assert calls["init"][0]["name"] == "suite/grpo-s0" and calls["init"][0]["group"] == "suite"
    assert calls["log"] == [(3, {"reward": 0.5})] and calls["finish"] == [True]


# -- TensorBoard, for real -----------------------------------------------------------------------------
def test_tensorboard_event_files_hold_the_curves_and_a_run_started_again_replaces_them(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    run = _run(tmp_path)
    first = Trackers(run, ["tensorboard"], GRPO_NAMES)
    for step in (1, 2, 3):
        first.on_log(step, {"reward": 0.1 * step, "kl": 0.01})
    first.finish({"status": "failed"})  # killed at step 3; --resume runs it again from its first step
    again = Trackers(run, ["tensorboard"], GRPO_NAMES)
    curves = [{"step": 1, "reward": 0.5, "kl": float("nan")}, {"step": 2, "reward": 0.7, "kl": 0.02}]
    for point in curves:
        again.on_log(point["step"], point)
    result = {"status": "ok", "curves": curves}
    again.finish(result)
    folder = run.run_dir / trackers.TENSORBOARD_DIR
    assert len(list(folder.glob("events.out.tfevents.*"))) == 2  # appended: the first attempt's file is kept
    assert result["trackers"]["tensorboard_dir"] == "tensorboard"
    assert_tensorboard_equals_curves(run.run_dir, curves)  # the first attempt's step 3 is gone from the view
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(folder))
    acc.Reload()
    assert "_hparams_/session_start_info" in acc.summary_metadata  # the settings, as TensorBoard hparams


def test_the_engine_logs_live_and_a_failing_tracker_changes_no_number(tmp_path: Path, model_dirs) -> None:  # noqa: F811
    """GRPO on the suite's engine twice from one seed: without trackers, then with TensorBoard and a tracker that
    raises mid-run. The curves are the same, the failure is one warning, and TensorBoard holds the curves, logged
    live at the engine's log points (with the telemetry's readings beside them)."""
    pytest.importorskip("tensorboard")
    import torch
    from transformers import set_seed

    from baselines import grpo_engine
    from bench.telemetry import Telemetry
    from test_rollout_engine import _context

    def train(folder: Path, fan_out) -> list[dict]:
        ctx = _context(folder, model_dirs, "grpo_engine", grpo_engine.Config())
        ctx.telemetry = Telemetry("cpu")
        ctx.telemetry.trackers = fan_out
        set_seed(0)
        with ctx.telemetry:
            return grpo_engine.train(ctx).log_history

    torch.set_num_threads(1)
    plain = train(tmp_path / "plain", None)
    run = _run(tmp_path, "grpo_engine-s0")
    seen: list[int] = []

    class Watch(Flaky):
        def log(self, step, values):
            seen.append(step)
            super().log(step, values)

    fan = Trackers(run, ["tensorboard", "wandb"], None,
                   backends={"tensorboard": trackers.TensorBoardTracker, "wandb": Watch})
    logged = train(run.run_dir, fan)
    assert logged == plain  # same numbers, whatever the trackers did
    assert seen[:2] == [1, 2]  # called live, at the engine's log points (train.log_every = 1)
    result = {"status": "ok", "curves": logged}
    fan.finish(result)
    assert result["trackers"]["warnings"] == [
        "flaky: stopped logging at step 2: ConnectionError: the tracker's server went away mid-run"]
    assert_tensorboard_equals_curves(run.run_dir, logged)
    tags = tensorboard_scalars(run.run_dir / trackers.TENSORBOARD_DIR)
    assert "phase_time_s/generation" in tags and "memory_peak_gib/cpu-rss" in tags
    assert "throughput/completions_per_s" in tags


def test_wandb_offline_writes_a_local_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real package, where it is installed (the wandb extra): an offline run in the run's folder."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = _run(tmp_path)
    fan = Trackers(run, ["wandb"], GRPO_NAMES)
    fan.on_log(1, {"rewards/accuracy/mean": 0.25})
    fan.finish({"status": "ok", "curves": [{"step": 1, "accuracy_reward": 0.25}]})
    assert fan.warnings == []
    (data,) = list((run.run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    for _ in range(100):  # W&B's service process may still be writing the file when finish() returns
        content = data.read_bytes()
        if b"accuracy_reward" in content:
            break
        time.sleep(0.1)
    assert b"suite/grpo-s0" in content and b"accuracy_reward" in content


# -- the report ---------------------------------------------------------------------------------------
def test_the_page_gives_the_tensorboard_command_and_tracker_warnings(tmp_path: Path) -> None:
    from report_fixtures import write_suite

    from bench.report.html import render_html
    from bench.report.load import load_suite
    from bench.results import write_json_atomic

    folder = write_suite(tmp_path, methods=("grpo",))
    assert "tensorboard --logdir" not in render_html(load_suite(folder), [])  # no run logged to TensorBoard
    path = folder / "runs" / "grpo-s0" / "result.json"
    result = json.loads(path.read_text())
    result["trackers"] = {"report_to": ["tensorboard", "wandb"], "opened": ["tensorboard", "wandb"],
                          "run_name": "suite/grpo-s0", "tensorboard_dir": "tensorboard",
                          "warnings": ["wandb: stopped logging at step 2: ConnectionError: gone"]}
    write_json_atomic(path, result)
    page = render_html(load_suite(folder), [])
    assert f"tensorboard --logdir {folder / 'runs'}" in page
    assert "wandb: stopped logging at step 2: ConnectionError: gone" in page
