"""Independent runs on free GPUs (bench.execution.devices, the runner's pool): with ``parallel_runs: auto`` a box of
eight GPUs runs eight method runs at once, each worker pinned to its own device through CUDA_VISIBLE_DEVICES (or to
its own group of ``launcher.num_processes`` GPUs), no two runs ever share a device, a run that fails gives its
device back, and each result records which GPU ran it.

No CUDA here: the GPU count NVML would give is injected, and a stand-in worker records what it was given.
"""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bench.config.loading import load_spec
from bench.errors import SpecError, UserError
from bench.execution.devices import DevicePool, make_slots, plan_devices


def _spec(*overrides: str):
    return load_spec("cpu-quick", ["device=cuda", *overrides])


# ----------------------------------------------------------------------------------------------
# the plan: which GPUs, which slots, how many at once


def test_auto_on_eight_gpus_is_eight_runs_each_on_its_own_gpu() -> None:
    plan = plan_devices(_spec("parallel_runs=auto"), {}, count=lambda: 8)
    assert plan.device == "cuda" and plan.parallel_runs == 8 and plan.source == "nvml"
    assert plan.slots == [(str(i),) for i in range(8)]
    assert plan.to_dict()["requested"] == "auto"


def test_auto_under_a_launcher_is_one_run_per_group_of_num_processes() -> None:
    spec = _spec("parallel_runs=auto", "launcher.name=accelerate", "launcher.num_processes=2")
    plan = plan_devices(spec, {}, count=lambda: 8)
    assert plan.parallel_runs == 4
    assert plan.slots == [("0", "1"), ("2", "3"), ("4", "5"), ("6", "7")]
    assert make_slots(["0", "1", "2"], 2) == [("0", "1")]  # a GPU left over stays idle
    assert make_slots(["0"], 2) == [("0",)]  # fewer than a group: the run gets what there is (as before)


@pytest.mark.parametrize("overrides, env, slots, source", [
    ([], {"CUDA_VISIBLE_DEVICES": "4, 6,7"}, [("4",), ("6",), ("7",)], "CUDA_VISIBLE_DEVICES"),
    (["gpus=[2,5]"], {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, [("2",), ("5",)], "gpus"),
    ([], {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}, [("GPU-aaaa",), ("GPU-bbbb",)], "CUDA_VISIBLE_DEVICES"),
])
def test_the_gpu_list_comes_from_gpus_then_cuda_visible_devices_then_nvml(
        overrides: list[str], env: dict[str, str], slots: list[tuple[str, ...]], source: str) -> None:
    plan = plan_devices(_spec("parallel_runs=auto", *overrides), env, count=lambda: 8)
    assert plan.slots == slots and plan.source == source and plan.parallel_runs == len(slots)


def test_an_explicit_count_needs_that_many_gpus() -> None:
    assert plan_devices(_spec("parallel_runs=3"), {}, count=lambda: 8).slots == [("0",), ("1",), ("2",)]
    with pytest.raises(UserError, match=r"'parallel_runs' is 4 but only 2 run\(s\) fit at once.*parallel_runs=auto"):
        plan_devices(_spec("parallel_runs=4"), {}, count=lambda: 2)
    with pytest.raises(UserError, match="no GPU is visible"):
        plan_devices(_spec("parallel_runs=2"), {}, count=lambda: 0)
    with pytest.raises(SpecError, match=r"'parallel_runs' is 3 but 'gpus' lists 2 GPU\(s\)"):  # known at load time
        _spec("parallel_runs=3", "gpus=[0,1]")


def test_a_cpu_shares_its_cores_and_auto_is_one_run_there() -> None:
    plan = plan_devices(load_spec("cpu-quick", ["parallel_runs=auto"]), {}, count=lambda: 8)
    assert (plan.device, plan.parallel_runs, plan.slots) == ("cpu", 1, [()])
    assert plan_devices(load_spec("cpu-quick", ["parallel_runs=2"]), {}).slots == [(), ()]
    # device auto without a GPU is a CPU run
    plan = plan_devices(load_spec("cpu-quick", ["device=auto", "parallel_runs=auto"]), {}, count=lambda: 0)
    assert (plan.device, plan.parallel_runs) == ("cpu", 1)


def test_parallel_runs_accepts_auto_and_counts_only() -> None:
    assert load_spec("cpu-quick", ["parallel_runs=auto"]).parallel_runs == "auto"
    assert load_spec("cpu-quick", ["device=cuda", "parallel_runs=2"]).parallel_runs == 2  # no longer refused on GPU
    with pytest.raises(SpecError, match="'parallel_runs' must be >= 1 or auto"):
        load_spec("cpu-quick", ["parallel_runs=0"])
    with pytest.raises(SpecError, match="'parallel_runs'"):
        load_spec("cpu-quick", ["parallel_runs=many"])
    with pytest.raises(SpecError, match="cannot be combined with a launcher on a CPU"):
        load_spec("cpu-quick", ["device=cpu", "launcher.name=accelerate", "launcher.num_processes=2",
                                "parallel_runs=2"])


def test_workers_see_their_own_slot_only() -> None:
    from bench.execution.launch import worker_launch
    from bench.execution.processes import worker_env

    spec = _spec("parallel_runs=auto")
    assert worker_env(spec, {}, ("5",))["CUDA_VISIBLE_DEVICES"] == "5"
    assert worker_env(spec, {}, ("5",))["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # NVML's numbering is nvidia-smi's
    inherited = worker_env(spec, {"CUDA_VISIBLE_DEVICES": "6,7"}, ("7",))
    assert inherited == {"CUDA_VISIBLE_DEVICES": "7"}  # the inherited order is kept
    assert worker_env(spec, {}, ())["CUDA_VISIBLE_DEVICES"] == "0"  # no slot: pinned as before

    launched = _spec("parallel_runs=auto", "launcher.name=accelerate", "launcher.num_processes=2")
    command, env = worker_launch(launched, "method", "grpo_engine", Path("/nonexistent"), {}, gpus=("2", "3"))
    assert command is not None and env["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_a_slot_is_given_back_however_the_run_ends() -> None:
    pool = DevicePool([("0",), ("1",)])
    with pytest.raises(RuntimeError, match="boom"):
        with pool.hold() as (index, slot):
            assert slot == ("0",) and pool.free == [1]
            raise RuntimeError("boom")
    assert pool.free == [0, 1]
    index, _ = pool.acquire()
    pool.release(index)
    with pytest.raises(RuntimeError, match="released twice"):
        pool.release(index)


# ----------------------------------------------------------------------------------------------
# the runner on a fake eight-GPU box


class DeviceWorkers:
    """Stands in for launch_worker: checks that no two live workers share a device, records what each saw, keeps
    the first ``together`` workers waiting until that many run at once (proof that they do), and fails the runs in
    ``fail`` (a failed result, or no result at all: the runner records WorkerDied)."""

    def __init__(self, together: int = 0, fail: dict[str, str] | None = None, hold_s: float = 0.05) -> None:
        self.lock = threading.Lock()
        self.busy: dict[str, str] = {}
        self.shared: list[str] = []
        self.log: list[dict[str, Any]] = []
        self.barrier = threading.Barrier(together, timeout=30) if together else None
        self.waiting = together
        self.fail = fail or {}
        self.hold_s = hold_s
        self.peak = 0

    def __call__(self, run_dir: Path, progress: Any, env: Any = None, stopper: Any = None) -> int:
        from bench.execution.run_failure import failure_record
        from bench.execution.worker import RUN_FILE
        from bench.results import write_json_atomic
        from test_runner_failures import ok_result

        job = json.loads((run_dir / RUN_FILE).read_text())
        device = env["CUDA_VISIBLE_DEVICES"]
        with self.lock:
            if device in self.busy:
                self.shared.append(f"{job['run_id']} on {device}, held by {self.busy[device]}")
            self.busy[device] = job["run_id"]
            self.peak = max(self.peak, len(self.busy))
            started = time.monotonic()
            wait = self.barrier is not None and job["kind"] == "method" and self.waiting > 0
            if wait:
                self.waiting -= 1
        if wait:
            self.barrier.wait()
        time.sleep(self.hold_s)
        with self.lock:
            del self.busy[device]
            self.log.append({"run_id": job["run_id"], "device": device, "start": started, "end": time.monotonic(),
                             "parallel_runs": job.get("parallel_runs")})
        how = self.fail.get(job["run_id"])
        if how == "no result":
            return 1
        result = ok_result(job["run_id"], job["kind"], job["inputs_hash"])
        if how:
            result.update(status="failed", error=failure_record(RuntimeError(how), None))
        write_json_atomic(run_dir / "result.json", result)
        return 0 if not how else 1


def _run_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: DeviceWorkers, gpus: int,
               *overrides: str):
    import bench.execution.devices
    import bench.execution.runner
    import bench.report

    def fake_report(suite_dir: Path) -> Path:
        (Path(suite_dir) / "index.html").write_text("report")
        return Path(suite_dir) / "index.html"

    monkeypatch.setattr(bench.report, "build_report", fake_report)
    monkeypatch.setattr(bench.execution.runner, "launch_worker", workers)
    monkeypatch.setattr(bench.execution.devices, "nvml_gpu_count", lambda: gpus)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    spec = _spec("parallel_runs=auto", *overrides)
    suite = tmp_path / "suite"
    outcome = bench.execution.runner.run_suite(spec, suite, stream=io.StringIO())
    return outcome, suite


def _result(suite: Path, run_id: str) -> dict[str, Any]:
    return json.loads((suite / "runs" / run_id / "result.json").read_text())


def test_eight_fake_gpus_run_eight_methods_at_once_never_sharing_a_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    workers = DeviceWorkers(together=8)
    outcome, suite = _run_suite(tmp_path, monkeypatch, workers, 8, "seeds=[0,1]")
    assert outcome.exit_code == 0, outcome.summary
    assert workers.shared == []  # no device ever held by two live workers
    assert workers.peak == 8  # the barrier let the first eight method runs through only when all eight ran at once
    meta = json.loads((suite / "suite.json").read_text())
    assert meta["schedule"] == {"device": "cuda", "parallel_runs": 8, "requested": "auto",
                                "slots": [[str(i)] for i in range(8)], "source": "nvml"}
    methods = [e for e in workers.log if not e["run_id"].startswith(("warm_start", "sample_pool", "reward_model"))]
    assert len(methods) == 10  # 5 methods x 2 seeds
    for entry in workers.log:  # each result says where it ran, and it is the device its worker saw
        placed = _result(suite, entry["run_id"])["placement"]
        assert placed["gpus"] == [entry["device"]] and placed["device"] == "cuda" and placed["parallel_runs"] == 8
        assert placed["slot"] == int(entry["device"])
        assert entry["parallel_runs"] == 8  # run.json tells the worker how many share the machine (its CPU threads)
    # stages run one at a time, before the methods, on the first free GPU
    stages = [e for e in workers.log if e not in methods]
    assert [e["device"] for e in stages] == ["0", "0", "0"]
    assert max(e["end"] for e in stages) <= min(e["start"] for e in methods)


@pytest.mark.parametrize("how", ["a failed result", "no result"])
def test_a_failed_run_frees_its_device_for_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      how: str) -> None:
    workers = DeviceWorkers(fail={"grpo-s0": "no result" if how == "no result" else "boom"})
    outcome, suite = _run_suite(tmp_path, monkeypatch, workers, 2, "seeds=[0,1]")
    assert outcome.exit_code == 1 and "grpo-s0" in outcome.summary
    assert workers.shared == []
    failed = next(e for e in workers.log if e["run_id"] == "grpo-s0")
    later = [e for e in workers.log if e["start"] >= failed["end"] and e["device"] == failed["device"]]
    assert later, f"device {failed['device']} was not used again after grpo-s0 failed on it: {workers.log}"
    assert len(workers.log) == 13  # every run ran: 3 stages + 10 method runs on two GPUs
    result = _result(suite, "grpo-s0")
    assert result["status"] == "failed" and result["placement"]["gpus"] == [failed["device"]]
    if how == "no result":
        assert result["error"]["type"] == "WorkerDied"


def test_launched_runs_get_a_group_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    workers = DeviceWorkers()

    def launch_worker(run_dir: Path, progress: Any, env: Any = None, stopper: Any = None,
                      command: list[str] | None = None) -> int:
        return workers(run_dir, progress, env, stopper)

    import bench.execution.launch

    monkeypatch.setattr(bench.execution.launch, "merge_rank_files", lambda run_dir: None)
    outcome, suite = _run_suite(tmp_path, monkeypatch, launch_worker, 4,  # type: ignore[arg-type]
                                "launcher.name=accelerate", "launcher.num_processes=2")
    assert outcome.exit_code == 0, outcome.summary
    assert workers.shared == []
    devices = {e["run_id"]: e["device"] for e in workers.log}
    assert devices["warm_start"] == "0"  # a stage is one process: the first GPU of the first group
    assert devices["grpo_engine-s0"] in ("0,1", "2,3")  # a launched run sees its whole group
    assert _result(suite, "grpo_engine-s0")["placement"]["gpus"] == devices["grpo_engine-s0"].split(",")


def test_the_report_says_which_gpu_ran_what(tmp_path: Path) -> None:
    from report_fixtures import write_suite

    from bench.report import build_report
    from bench.results import write_json_atomic

    suite = write_suite(tmp_path)
    meta = json.loads((suite / "suite.json").read_text())
    meta["spec"]["parallel_runs"] = "auto"
    meta["schedule"] = {"device": "cuda", "parallel_runs": 8, "requested": "auto",
                        "slots": [[str(i)] for i in range(8)], "source": "nvml"}
    write_json_atomic(suite / "suite.json", meta)
    placed = {}
    for i, run_dir in enumerate(sorted((suite / "runs").iterdir())):
        result = json.loads((run_dir / "result.json").read_text())
        result["placement"] = {"device": "cuda", "gpus": [str(i % 8)], "slot": i % 8, "parallel_runs": 8,
                               "gpu_source": "nvml"}
        placed[result["run_id"]] = str(i % 8)
        write_json_atomic(run_dir / "result.json", result)
    build_report(suite)
    md = (suite / "summary.md").read_text(encoding="utf-8")
    section = md.split("## Throughput and time\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in section.splitlines()
            if line.startswith("| ")]
    header, body = rows[0], [row for row in rows[1:] if not set("".join(row)) <= set("-: ")]
    assert header[-1] == "GPU" and len(body) >= 3
    assert all(row[-1] in set(placed.values()) for row in body), body
    assert "GPU: the device(s) the run's worker saw" in section
    assert "method runs ran 8 at a time, each on GPUs of its own" in md  # "auto" resolved from the schedule
