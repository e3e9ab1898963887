"""Sweeps (bench.config.sweep): the sweep block's validation, expansion into points and runs, out-of-memory recording with
its phase, the exit status, the scaling tables and figures (bench.report.scaling), and one tiny systems-cpu-shaped
sweep end to end with an out-of-memory injected at one point."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench.errors import SpecError
from bench.execution.plan import PlannedRun, make_plan
from bench.report.load import load_suite
from bench.report.scaling import error_by_source, scaling_figures, scaling_tables
from bench.results import empty_result, write_json_atomic
from bench.config.loading import load_spec
from bench.config.sweep import expand
from bench.config.rules import point_spec

ROOT = Path(__file__).resolve().parents[1]


# --- expansion and the plan ---------------------------------------------------------------------------------
def test_one_at_a_time_and_product_points() -> None:
    spec = load_spec("systems-cpu")
    ids = [p.point_id for p in expand(spec)]
    assert ids == ["qwen2.5-0.5b-G2-len8", "qwen2.5-1.5b-G2-len8", "qwen2.5-3b-G2-len8", "qwen2.5-7b-G2-len8",
                   "qwen2.5-0.5b-G4-len8", "qwen2.5-0.5b-G2-len16"]
    product = load_spec("systems-cpu", ["sweep.mode=product"])
    assert len(expand(product)) == 4 * 2 * 2


def test_runs_name_their_point_and_stages_are_shared_where_their_inputs_agree() -> None:
    spec = load_spec("systems-cpu")
    runs = {r.run_id: r for r in make_plan(spec)}
    assert len(runs) == 44  # 4 warm starts, 5 pools and reward models (per model and length), 6 points x 5 methods
    # G does not change a stage: the G4 point reads the G2 point's stages; the length changes the pool.
    assert runs["ppo-s0@qwen2.5-0.5b-G4-len8"].needs == ("warm_start@qwen2.5-0.5b", "sample_pool@qwen2.5-0.5b-len8",
                                                         "reward_model@qwen2.5-0.5b-len8")
    assert runs["dpo-s0@qwen2.5-0.5b-G2-len16"].needs == ("warm_start@qwen2.5-0.5b",
                                                          "sample_pool@qwen2.5-0.5b-len16")
    assert runs["grpo_engine-s0@qwen2.5-7b-G2-len8"].values == (
        ("model.architecture", "qwen2.5-7b"), ("train.group_size", 2), ("generation.max_new_tokens", 8))


def test_a_point_is_a_plain_spec_with_the_sweep_steps_and_fixed_length_kept() -> None:
    spec = load_spec("systems-cpu")
    point = point_spec(spec, {"generation.max_new_tokens": 16, "train.group_size": 4})
    assert (point.generation.max_new_tokens, point.generation.min_new_tokens) == (16, 16)
    assert point.train.group_size == 4 and point.train.steps == 4 and point.telemetry.warmup_steps == 1
    assert point.sweep.axes == {}  # a worker never expands its point again


def test_stage_inputs_are_found_by_run_id() -> None:
    from bench.execution.runner import run_inputs

    run = PlannedRun("ppo-s0@x", "ppo", "method", 0, "PPO", "suite",
                     ("warm_start@m", "sample_pool@m-len8", "reward_model@m-len8"), "x", ())
    inputs = run_inputs(Path("/s"), run)
    assert inputs["init_model_dir"] == "/s/runs/warm_start@m/model"
    assert inputs["pool_path"] == "/s/runs/sample_pool@m-len8/pool.jsonl"
    assert inputs["reward_model_dir"] == "/s/runs/reward_model@m-len8/model"


# --- validation: one line, naming the key --------------------------------------------------------------------
@pytest.mark.parametrize("override, expected", [
    ("sweep.axes={train.group_sise: [2, 4]}", "unknown key 'train.group_sise' in 'sweep.axes' (did you mean 'group_size'?)"),
    ("sweep.axes={train.group_size: []}", "'sweep.axes.train.group_size' must be a non-empty list"),
    ("sweep.axes={train.group_size: [two]}", "'sweep.axes.train.group_size' must be an integer, got 'two'"),
    ("sweep.axes={train.group_size: [0, 4]}", "'sweep.axes.train.group_size' must be >= 1, got 0"),
    ("sweep.axes={train.group_size: [4, 4]}", "'sweep.axes.train.group_size' lists a value twice"),
    ("sweep.axes={train.steps: [2, 4]}", "'sweep.axes' key 'train.steps' cannot be swept: sweep.steps"),
    ("sweep.axes={model.scale: [1]}", "is a group of settings; sweep one of them, e.g. 'model.scale.num_layers'"),
    ("sweep.axes={methods.ppo.vf_coef: [0.1]}", "cannot be swept"),
    ("sweep.axes={scheduler.name: [local, ray]}", "'sweep.axes' key 'scheduler.name' cannot be swept: it is how runs"),
    ("sweep.axes={scheduler.storage: [/a, /b]}", "'sweep.axes' key 'scheduler.storage' cannot be swept: it is how"),
    ("sweep.axes={model.architecture: [qwen2.5-0.5b, qwen9]}", "sweep point qwen9 (model.architecture=qwen9): "
                                                               "unknown 'model.architecture' 'qwen9'"),
    ("sweep.axes={train.group_size: [1, 2]}", "sweep point G1 (train.group_size=1): "),  # GRPO needs G >= 2
    ("sweep.inject_oom.point=nowhere", "'sweep.inject_oom.point' 'nowhere' is not a point of this sweep"),
    ("sweep.inject_oom.phase=lunch", "'sweep.inject_oom.phase' must be one of generation"),
    ("sweep.steps=0", "'sweep.steps' must be >= 1, got 0"),
])
def test_a_bad_sweep_is_one_line_at_load_time(override: str, expected: str) -> None:
    extra = ["sweep.inject_oom.point=qwen2.5-3b-G2-len8"] if "phase" in override else []
    with pytest.raises(SpecError) as err:
        load_spec("systems-cpu", [override, *extra])
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_inject_oom_needs_a_sweep() -> None:
    with pytest.raises(SpecError, match="'sweep.axes' is empty"):
        load_spec("cpu-quick", ["sweep.inject_oom.point=G4"])


def test_the_cli_says_one_line_and_exits_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", "run", "--preset", "systems-cpu", "--dry-run",
                           "sweep.axes={train.group_size: []}"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "sweep.axes.train.group_size" in proc.stderr


# --- out of memory: recorded with its phase; expected at a sweep point -----------------------------------------
def test_an_out_of_memory_is_recorded_with_the_phase_it_happened_in() -> None:
    from bench.telemetry import Telemetry
    from bench.execution.run_failure import failure_phase, failure_record, is_out_of_memory

    live: dict[str, Any] = {}
    telemetry = Telemetry("cpu", interval_s=0.01)
    with pytest.raises(MemoryError):
        with telemetry, failure_phase(telemetry, live):
            telemetry.train_begin()
            telemetry.step_begin()
            with telemetry.phase("update"):
                raise MemoryError("no room")
    record = failure_record(MemoryError("no room"), telemetry, live["failure_phase"])
    assert (record["type"], record["exception"], record["phase"]) == ("OutOfMemory", "MemoryError", "update")
    assert is_out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate "
                                         "memory: you tried to allocate 1099511627776 bytes"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert failure_record(ValueError("x"), None)["type"] == "ValueError"


def _write_result(suite: Path, run_id: str, method: str, status: str = "ok", sweep: dict | None = None,
                  error: dict | None = None, **extra: Any) -> None:
    result = empty_result(run_id, "method", method, method.upper(), "suite", 0)
    result.update(status=status, error=error, sweep=sweep, started_at="2026-01-01T00:00:00+00:00",
                  finished_at="2026-01-01T00:01:00+00:00", **extra)
    result["throughput"].setdefault("wall_s", 1.0)
    write_json_atomic(suite / "runs" / run_id / "result.json", result)


def test_an_oom_at_a_sweep_point_keeps_exit_status_0_and_elsewhere_it_is_a_failure(tmp_path: Path) -> None:
    from bench.execution.runner import run_verdict, summarize

    oom = {"type": "OutOfMemory", "message": "out of memory", "memory_at_failure": None, "phase": "update"}
    _write_result(tmp_path, "a", "grpo_engine", sweep={"point": "p"})
    _write_result(tmp_path, "b", "ppo", "failed", sweep={"point": "p"}, error=oom)
    runs = [PlannedRun(r, "x", "method", 0, "X", "suite") for r in ("a", "b")]
    assert run_verdict(tmp_path / "runs" / "b") == ("oom", "out of memory in phase update")
    outcome = summarize(tmp_path, runs, tmp_path / "index.html", None, 1.0)
    assert outcome.exit_code == 0 and "1 of 2 runs ok; 1 sweep run(s) out of memory" in outcome.summary
    assert "b (out of memory in phase update)" in outcome.summary
    skipped = {"type": "PrerequisiteFailed", "message": "stage reward_model@big ran out of memory",
               "memory_at_failure": None}
    _write_result(tmp_path, "b", "ppo", "failed", sweep={"point": "p"}, error=skipped)  # after a stage's OOM
    assert run_verdict(tmp_path / "runs" / "b")[0] == "oom"
    assert summarize(tmp_path, runs, tmp_path / "index.html", None, 1.0).exit_code == 0
    _write_result(tmp_path, "b", "ppo", "failed", sweep=None, error=oom)  # not a sweep: a failure
    assert summarize(tmp_path, runs, tmp_path / "index.html", None, 1.0).exit_code == 1


# --- the scaling report, from result files alone --------------------------------------------------------------
MIB = 2**20


def _prediction(params: int, peak: float, nets: dict[str, tuple[int, int, int]]) -> dict[str, Any]:
    return {"parameters": params, "peak_bytes": peak * MIB, "peak_phase": "update", "fits": True,
            "static_bytes": sum(sum(v) for v in nets.values()),
            "networks": {n: {"weights_bytes": w, "gradients_bytes": g, "optimizer_bytes": o}
                         for n, (w, g, o) in nets.items()}}


def _measured_networks(nets: dict[str, tuple[int, int, int]], params: int) -> dict[str, Any]:
    return {n: {"params": params, "weight_bytes": w, "grad_bytes": g, "optimizer_bytes": o}
            for n, (w, g, o) in nets.items()}


@pytest.fixture()
def fake_sweep(tmp_path: Path) -> Path:
    """Two model sizes x (PPO, GRPO engine), the second size's PPO out of memory; memory on the CPU."""
    suite = tmp_path / "suite"
    axes = {"model.architecture": ["small", "big"]}
    write_json_atomic(suite / "suite.json", {"preset": "t", "runs": [], "spec": {"sweep": {"axes": axes}}})
    for arch, params, scale in (("small", 1_000_000, 1), ("big", 4_000_000, 4)):
        for method, roles in (("ppo", ("actor", "critic", "reward", "reference")), ("grpo_engine", ("actor", "reference"))):
            nets = {r: (4 * params, 4 * params if r in ("actor", "critic") else 0, 8 * params if r in ("actor", "critic") else 0)
                    for r in roles}
            run_id = f"{method}-s0@{arch}"
            sweep = {"point": arch, "values": {"model.architecture": arch}}
            weights = sum(w for w, _, _ in nets.values())
            prediction = _prediction(params, 100 * scale * len(roles) / 2 + weights / MIB, nets)
            extrapolated = {"qwen2.5-14b": _prediction(14_000_000_000, 200_000 * len(roles), nets)}
            if method == "ppo" and arch == "big":
                _write_result(suite, run_id, method, "failed", sweep=sweep, prediction=prediction,
                              error={"type": "OutOfMemory", "message": "x", "memory_at_failure": None, "phase": "critic"})
                continue
            memory = {"peak_bytes": 500 * MIB, "source": "cpu-rss", "networks": _measured_networks(nets, params),
                      "by_source": {"cpu-rss": (400 + 110 * scale * len(roles) / 2) * MIB},
                      "baseline_by_source": {"cpu-rss": 400 * MIB}}
            _write_result(suite, run_id, method, sweep=sweep, prediction=prediction, memory=memory,
                          prediction_extrapolated=extrapolated,
                          throughput={"step_s_median": 0.5 * scale, "tokens_per_s": 100 / scale, "wall_s": 1.0})
    return suite


def test_scaling_tables_put_predicted_beside_measured_with_the_error(fake_sweep: Path) -> None:
    suite = load_suite(fake_sweep)
    tables = scaling_tables(suite)
    points = tables[0]
    statuses = {(row[0], row[1]): row[2] for row in points.rows}
    assert statuses[("big", "PPO")] == "OOM in critic" and statuses[("small", "PPO")] == "ok"
    assert any("ppo-s0@big (critic)" in note for note in points.notes)
    from bench.report.scaling import sweep_points

    errors = error_by_source(sweep_points(suite))
    assert errors["static accounting"] == [0.0, 0.0, 0.0]  # identical bytes: exact
    # cpu-rss delta: measured 110 MiB x size x roles/2, predicted 100 x the same: -9.1% everywhere
    assert [round(e, 1) for e in errors["cpu-rss delta"]] == [-9.1, -9.1, -9.1]
    ratio = next(t for t in tables if t.header[:1] == ["point"] and "static accounting" in t.header)
    by_point = {row[0]: row for row in ratio.rows}
    assert by_point["small"][1] == "2.00x"  # four networks' delta vs two
    assert by_point["small"][2] == "2.00x" and by_point["big"][1] == "—"  # static: (16+16+4+4) / (16+4); OOM


def test_scaling_figures_draw_the_points_that_finished(fake_sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "figures"
    out.mkdir()
    figures = scaling_figures(load_suite(fake_sweep), out)
    names = [f.name for f in figures]
    assert names == ["scaling_memory.png", "scaling_predicted_vs_measured.png"]
    assert all((out / n).stat().st_size > 10_000 for n in names)
    assert "ppo-s0@big" in figures[0].caption and "predicted" in figures[0].caption


def test_a_suite_without_a_sweep_has_no_scaling_section(tmp_path: Path) -> None:
    _write_result(tmp_path, "grpo-s0", "grpo")
    assert scaling_tables(load_suite(tmp_path)) == [] and scaling_figures(load_suite(tmp_path), tmp_path) == []


# --- end to end: a tiny systems-cpu-shaped sweep with an OOM at one point ---------------------------------------
TINY_SWEEP = {
    "name": "sweep-tiny", "description": "a tiny sweep (test)", "seeds": [0], "device": "cpu", "threads": 1,
    "parallel_runs": 2,
    "model": {"source": "architecture", "architecture": "qwen2.5-0.5b",
              "scale": {"num_layers": 1, "width_divisor": 16, "vocab_size": 2048}},
    "task": {"source": "synthetic", "train_size": 16, "test_size": 4},
    "warm_start": {"enabled": False},
    "generation": {"max_new_tokens": 4, "min_new_tokens": 4},
    "train": {"prompts_per_step": 2, "group_size": 2, "log_every": 1},
    "eval": {"enabled": False},
    "methods": {"grpo": False, "ppo": False, "dpo": False},
    "sweep": {"axes": {"train.group_size": [2, 4]}, "steps": 1, "warmup_steps": 1,
              "inject_oom": {"point": "G4", "method": "ppo_verifier", "phase": "update"}},
}


def test_a_tiny_sweep_records_the_oom_with_its_phase_goes_on_and_draws_the_rest(tmp_path: Path) -> None:
    from bench.execution.runner import run_suite

    preset = tmp_path / "tiny.yaml"
    preset.write_text(yaml.safe_dump(TINY_SWEEP))
    suite = tmp_path / "suite"
    console = io.StringIO()
    outcome = run_suite(load_spec(preset), suite, stream=console)
    assert outcome.exit_code == 0, console.getvalue()[-3000:]
    assert "1 sweep run(s) out of memory" in outcome.summary

    def result(run_id: str) -> dict[str, Any]:
        return json.loads((suite / "runs" / run_id / "result.json").read_text())

    oom = result("ppo_verifier-s0@G4")
    assert oom["status"] == "failed" and oom["error"]["type"] == "OutOfMemory"
    assert oom["error"]["phase"] == "update" and oom["error"]["exception"] == "MemoryError"
    assert oom["sweep"]["point"] == "G4" and oom["spec"]["train"]["group_size"] == 4
    for run_id in ("grpo_engine-s0@G2", "ppo_verifier-s0@G2", "grpo_engine-s0@G4"):  # the sweep went on
        ok = result(run_id)
        assert ok["status"] == "ok", ok["error"]
        assert ok["throughput"]["steps"] == 2 and ok["memory"]["networks"]["actor"]["params"] > 0
        assert ok["prediction"] is not None or "prediction_note" in ok["sweep"]
    figures = tmp_path / "figures"
    figures.mkdir()
    drawn = {f.name for f in scaling_figures(load_suite(suite), figures)}
    assert "scaling_time_group_size.png" in drawn and "scaling_memory.png" in drawn
    rows = scaling_tables(load_suite(suite))[0].rows
    assert ["G4", "PPO (verifier reward)", "OOM in update"] == rows[-1][:3]


def test_resume_keeps_a_sweep_point_recorded_as_out_of_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OOM at a sweep point is a finding: --resume does not run it again (an ordinary failure it does re-run),
    unless a stage it read was re-run since."""
    import bench.report
    import bench.execution.runner
    from bench.execution.worker import RUN_FILE

    launched: list[str] = []
    oom_at = {"ppo_verifier-s0@G4"}

    def worker(run_dir: Path, progress: Any, env: Any = None, stopper: Any = None) -> int:
        job = json.loads((run_dir / RUN_FILE).read_text())
        launched.append(job["run_id"])
        result = empty_result(job["run_id"], job["kind"], job["name"], job["label"], job["engine"], job["seed"])
        result.update(status="ok", started_at="2026-01-01T00:00:00+00:00", finished_at="2026-01-01T00:00:01+00:00",
                      inputs_hash=job["inputs_hash"], sweep=job["sweep"])
        result["throughput"].update(wall_s=time.perf_counter(), steps=2)  # no two results are the same file
        if job["run_id"] in oom_at:
            result.update(status="failed", error={"type": "OutOfMemory", "message": "out of memory",
                                                  "memory_at_failure": None, "phase": "update"})
        write_json_atomic(run_dir / "result.json", result)
        return 0 if result["status"] == "ok" else 1

    monkeypatch.setattr(bench.execution.runner, "launch_worker", worker)
    monkeypatch.setattr(bench.report, "build_report", lambda d: Path(d) / "index.html")
    preset = tmp_path / "tiny.yaml"
    preset.write_text(yaml.safe_dump({**TINY_SWEEP, "sweep": {**TINY_SWEEP["sweep"], "inject_oom": {}}}))
    spec, suite = load_spec(preset), tmp_path / "suite"
    assert bench.execution.runner.run_suite(spec, suite, stream=io.StringIO()).exit_code == 0
    assert "ppo_verifier-s0@G4" in launched
    launched.clear()
    console = io.StringIO()
    outcome = bench.execution.runner.run_suite(spec, suite, resume=True, stream=console)
    assert launched == [] and outcome.exit_code == 0, console.getvalue()
    assert "ppo_verifier-s0@G4: out of memory at this sweep point, kept (--resume does not re-run it" in \
        console.getvalue()
    assert "1 sweep run(s) out of memory" in outcome.summary
    # A failure that is not an out-of-memory is re-run; so is the OOM point once the stage it read has changed.
    oom_at.clear()
    stage = next(p for p in (suite / "runs").iterdir() if p.name.startswith("warm_start"))
    (stage / "result.json").unlink()
    bench.execution.runner.run_suite(spec, suite, resume=True, stream=io.StringIO())
    assert stage.name in launched and "ppo_verifier-s0@G4" in launched
