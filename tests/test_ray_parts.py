"""The Ray scheduler's parts that need no Ray: the scheduler block's validation, what a run asks of a node, the
thread share on a node, the worker's environment there, which stage outputs travel, the run folder's way back
(atomic, the driver's run.json kept, node paths moved back, nothing unpacked outside its folder), and the same
through a storage folder (scheduler.storage) instead of the object store; a run Ray started more than once
(scheduler.max_retries) saying so."""

from __future__ import annotations

import io
import json
import sys
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest
from spec_errors import spec_error

from bench.config.loading import load_spec
from bench.execution.plan import make_plan
from bench.execution.ray_channel import ObjectStoreTransfer, StorageTransfer, make_transfer, storage_problem
from bench.execution.ray_node import lay_out, node_env, share_of_node
from bench.execution.processes import Progress
from bench.execution.ray_scheduler import check_fits, cluster_device, run_request, stage_inputs
from bench.execution.ray_session import RaySession, lost_run, retried_placement
from bench.execution.ray_transfer import pack, receive_run_folder, unpack
from bench.errors import UserError


def test_the_scheduler_block_is_validated_in_one_line() -> None:
    assert load_spec("cpu-quick").scheduler.name == "local" and load_spec("cpu-quick").scheduler.address is None
    assert load_spec("cpu-quick", ["scheduler.name=ray", "scheduler.address=ray://head:10001"]).scheduler.address \
        == "ray://head:10001"
    for address in ("auto", "10.0.0.5:6379", "[::1]:6379"):
        assert load_spec("cpu-quick", ["scheduler.name=ray", f"scheduler.address={address}"]).scheduler.address \
            == address
    assert "'scheduler.name' must be one of 'local', 'ray', got 'slurm'" in spec_error(["scheduler.name=slurm"])
    assert "but 'scheduler.name' is 'local'; add scheduler.name=ray" in spec_error(["scheduler.address=auto"])
    assert "'scheduler.address' must be null" in spec_error(["scheduler.name=ray", "scheduler.address=http://x"])
    assert "drop gpus" in spec_error(["scheduler.name=ray", "gpus=[0]"])
    assert "unknown key 'scheduler.nme'" in spec_error(["scheduler.nme=ray"])
    ray = ["scheduler.name=ray"]
    assert load_spec("cpu-quick", ray + ["scheduler.storage=/mnt/shared", "scheduler.max_retries=2"]).scheduler \
        .storage == "/mnt/shared"
    assert "'scheduler.storage' is '/mnt/x' but 'scheduler.name' is 'local'" in spec_error(["scheduler.storage=/mnt/x"])
    assert "'scheduler.storage' must be an absolute path" in spec_error(ray + ["scheduler.storage=shared"])
    assert "'scheduler.max_retries' is 1 but 'scheduler.name' is 'local'" in spec_error(["scheduler.max_retries=1"])
    assert "'scheduler.max_retries' must be an integer in [0, 100]" in spec_error(ray + ["scheduler.max_retries=-1"])


def test_the_plan_says_how_its_runs_are_scheduled() -> None:
    from bench.execution.plan import describe_plan

    def header(*overrides: str) -> str:
        spec = load_spec("cpu-quick", list(overrides))
        return next(line for line in describe_plan(spec, make_plan(spec)).splitlines() if " runs (stages" in line)

    assert "1 method run(s) at a time" in header()
    ray = header("scheduler.name=ray")
    assert "a Ray task on a Ray instance started for the suite" in ray and "method run(s) at a time" not in ray
    assert "the Ray cluster at ray://head:10001" in header("scheduler.name=ray", "scheduler.address=ray://head:10001")


def test_a_run_asks_for_its_threads_and_on_a_gpu_for_its_processes() -> None:
    spec = load_spec("cpu-quick")
    stage, method = make_plan(spec)[0], make_plan(spec)[-1]
    assert run_request(spec, method, "cpu") == (1.0, 0.0)  # threads 0: one CPU
    assert run_request(load_spec("cpu-quick", ["threads=3"]), method, "cpu") == (3.0, 0.0)
    assert run_request(spec, method, "cuda") == (1.0, 1.0) and run_request(spec, stage, "cuda") == (1.0, 1.0)
    spec.launcher.name, spec.launcher.num_processes = "accelerate", 4  # as --launcher accelerate --num-processes 4
    assert run_request(spec, method, "cuda") == (1.0, 4.0)
    assert run_request(spec, stage, "cuda") == (1.0, 1.0)  # stages stay one process
    nodes = [{"node_id": "a", "node_ip": "10.0.0.1", "cpus": 8.0, "gpus": 0.0}]
    assert cluster_device("auto", nodes) == "cpu" and cluster_device("cpu", [dict(nodes[0], gpus=2.0)]) == "cpu"
    assert cluster_device("auto", nodes + [dict(nodes[0], gpus=2.0)]) == "cuda"


def test_a_run_no_node_can_take_is_refused_on_a_ray_started_here_and_a_warning_on_a_cluster() -> None:
    spec = load_spec("cpu-quick", ["threads=4"])
    nodes = [{"node_id": "a", "node_ip": "10.0.0.1", "cpus": 2.0, "gpus": 0.0}]
    with pytest.raises(UserError, match="asks Ray for 4 CPUs and 0 GPUs, which no node has"):
        check_fits(spec, make_plan(spec), "cpu", nodes, True, io.StringIO())
    said = io.StringIO()
    check_fits(spec, make_plan(spec), "cpu", nodes, False, said)
    assert said.getvalue().startswith("bench: warning: run warm_start asks Ray for 4 CPUs")
    check_fits(spec, make_plan(spec), "cpu", [dict(nodes[0], cpus=4.0)], True, io.StringIO())  # fits: no error


def test_a_run_across_machines_asks_for_a_node_per_machine_and_the_plan_says_how_many() -> None:
    """Each machine's task asks for its share of the GPUs; a cluster with fewer such nodes than machines cannot
    take the run (one line on a Ray started here); the plan's launch line states the machines and their GPUs."""
    from bench.execution.plan import describe_plan

    spec = load_spec("cpu-quick", ["launcher.name=accelerate", "launcher.num_processes=4", "launcher.num_machines=2",
                                   "scheduler.name=ray", "train.prompts_per_step=4"])
    plan = make_plan(spec)
    method = next(run for run in plan if run.name == "grpo_engine")
    assert run_request(spec, method, "cuda") == (1.0, 2.0) and run_request(spec, plan[0], "cuda") == (1.0, 1.0)
    node = {"node_id": "a", "node_ip": "10.0.0.1", "cpus": 8.0, "gpus": 2.0}
    with pytest.raises(UserError, match="spans 2 machines and asks Ray for 2 nodes with 1 CPUs and 2 GPUs each"):
        check_fits(spec, plan, "cuda", [node], True, io.StringIO())
    check_fits(spec, plan, "cuda", [node, dict(node, node_id="b")], True, io.StringIO())  # two such nodes: fits
    gpu = load_spec("cpu-quick", ["launcher.name=accelerate", "launcher.num_processes=4", "launcher.num_machines=2",
                                  "scheduler.name=ray", "train.prompts_per_step=4", "device=cuda"])
    line = next(line for line in describe_plan(gpu, make_plan(gpu)).splitlines() if line.startswith("launch:"))
    assert "4 processes per data-parallel method run, over 2 machines: 2 Ray nodes reserved together, each " \
           "running 2 of the ranks on 2 GPU(s)" in line
    one = load_spec("cpu-quick", ["launcher.name=accelerate", "launcher.num_processes=2"])
    assert "on one machine;" in next(line for line in describe_plan(one, make_plan(one)).splitlines()
                                     if line.startswith("launch:"))
    assert not [line for line in describe_plan(load_spec("cpu-quick"), plan).splitlines()
                if line.startswith("launch:")]


def test_a_node_share_sets_the_threads_only_when_threads_is_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bench.execution.cpu_threads.available_cores", lambda: 8)
    assert share_of_node(0, 1.0, 1) == 8  # 8 cores / 8 runs: one thread each
    assert share_of_node(0, 2.0, 1) == 4
    assert share_of_node(2, 2.0, 1) == 1 and share_of_node(1, 1.0, 2) == 2  # threads set: the plan's, as locally


def test_the_worker_on_a_node_gets_the_nodes_environment_without_rays(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RAY_RAYLET_PID": "1", "RAY_JOB_ID": "x", "OMP_NUM_THREADS": "1", "PYTHONBREAKPOINT": "r",
                        "MY_SETTING": "kept"}.items():
        monkeypatch.setenv(name, value)
    env = node_env({"HF_HUB_OFFLINE": "1"})
    assert env["MY_SETTING"] == "kept" and env["HF_HUB_OFFLINE"] == "1"
    assert not [k for k in env if k.startswith("RAY_")] and "OMP_NUM_THREADS" not in env
    assert node_env({"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"  # the driver's own setting travels


def test_a_scratch_folder_whose_task_is_gone_is_removed_by_the_next_task(tmp_path: Path) -> None:
    """A task killed with no chance to clean up (a second Ctrl-C shuts Ray down under it) leaves its scratch folder;
    the next task on the node removes it. A folder whose task still runs, or that has no owner record yet (being
    made), stays."""
    import subprocess
    import sys as system

    from bench.execution.ray_node import OWNER_FILE, claim_scratch, sweep_stale_scratch

    live, gone, unclaimed = (tmp_path / f"bench-ray-{name}" for name in ("live", "gone", "new"))
    for folder in (live, gone, unclaimed):
        folder.mkdir()
    claim_scratch(live)  # this process: running
    ended = subprocess.run([system.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (gone / OWNER_FILE).write_text(json.dumps({"pid": int(ended.stdout), "started": 1.0}))
    (gone / "model.safetensors").write_bytes(b"weights")
    other = tmp_path / "not-ours"
    other.mkdir()
    (other / OWNER_FILE).write_text(json.dumps({"pid": int(ended.stdout), "started": 1.0}))
    assert sweep_stale_scratch(tmp_path) == [gone]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench-ray-live", "bench-ray-new", "not-ours"]


def test_the_warm_start_sends_its_model_and_its_scores_only(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    inputs = {"init_model_dir": str(suite / "runs/warm_start/model"), "warm_start_dir": str(suite / "runs/warm_start"),
              "pool_path": str(suite / "runs/sample_pool/pool.jsonl"), "reward_model_dir": None}
    assert stage_inputs(suite, inputs) == [
        ("init_model_dir", "runs/warm_start/model", suite / "runs/warm_start/model", "runs/warm_start/model"),
        ("warm_start_dir", "runs/warm_start", suite / "runs/warm_start/result.json", "runs/warm_start/result.json"),
        ("pool_path", "runs/sample_pool/pool.jsonl", suite / "runs/sample_pool/pool.jsonl",
         "runs/sample_pool/pool.jsonl")]


def test_stage_outputs_land_in_the_suites_layout_on_the_node(tmp_path: Path) -> None:
    suite, node = tmp_path / "suite", tmp_path / "node" / "suite"
    (suite / "runs/warm_start/model").mkdir(parents=True)
    (suite / "runs/warm_start/model/config.json").write_text("{}")
    job = {"run_id": "grpo-s0", "inputs": {"init_model_dir": str(suite / "runs/warm_start/model")}}
    run_dir = lay_out(node, job, [("init_model_dir", "runs/warm_start/model",
                                   pack(suite / "runs/warm_start/model", "runs/warm_start/model"))])
    assert run_dir == node / "runs/grpo-s0"
    written = json.loads((run_dir / "run.json").read_text())
    assert written["inputs"] == {"init_model_dir": str(node / "runs/warm_start/model")}
    assert (node / "runs/warm_start/model/config.json").read_text() == "{}"


def test_a_run_folder_comes_back_whole_with_the_drivers_paths(tmp_path: Path) -> None:
    suite, node_root = tmp_path / "suite", tmp_path / "scratch" / "suite"
    run_dir = suite / "runs" / "ppo-s0"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text('{"asked": "by the driver"}')
    (run_dir / "stale.txt").write_text("from an earlier attempt")
    sent = node_root / "runs" / "ppo-s0"
    sent.mkdir(parents=True)
    (sent / "run.json").write_text('{"asked": "rewritten on the node"}')
    (sent / "result.json").write_text(json.dumps({"model": str(node_root / "runs/warm_start/model")}))
    (sent / "completions.jsonl").write_text('{"text": "7"}\n')
    receive_run_folder(pack(sent, "."), run_dir, str(node_root), suite)
    assert json.loads((run_dir / "result.json").read_text()) == {"model": str(suite / "runs/warm_start/model")}
    assert (run_dir / "run.json").read_text() == '{"asked": "by the driver"}'
    assert (run_dir / "completions.jsonl").read_text() == '{"text": "7"}\n'
    assert not (run_dir / "stale.txt").exists()
    assert sorted(p.name for p in (suite / "runs").iterdir()) == ["ppo-s0"]  # no temporary sibling left


def test_an_archive_member_outside_its_folder_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = b"x"
        member = tarfile.TarInfo("../escaped.txt")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    with pytest.raises((tarfile.TarError, ValueError)):  # the data filter's OutsideDestinationError, or ours
        unpack(buffer.getvalue(), tmp_path / "root")
    assert not (tmp_path / "escaped.txt").exists()


# -- a run across machines: the driver's side, against a stand-in for Ray ------------------------------------------
def _error(name: str) -> type:
    """An exception class named like one of Ray's (lost_run tells a lost node from a failed task by the name)."""
    return type(name, (Exception,), {})


class _FakeRay:
    """ray.wait / ray.get over callables: the newest submitted task finishes first (so machine 1 before machine
    0); each ref returns its task's outcome or raises its error."""

    class exceptions:
        RayError = Exception

    @staticmethod
    def wait(refs: list, num_returns: int, timeout: float) -> tuple[list, list]:
        return refs[-num_returns:], refs[:-num_returns]

    @staticmethod
    def get(ref):
        return ref()


class _Session:
    """The RaySession calls _collect makes: where each key's task ran, and which keys it cancelled."""

    def __init__(self, placed: dict) -> None:
        self.placed, self.cancelled = placed, []
        self.transfer = ObjectStoreTransfer()  # tar bytes, as through the object store

    def untrack(self, key: str) -> dict:
        return self.placed[key]

    def cancel(self, key: str) -> None:
        self.cancelled.append(key)

    def wait_until_ended(self, key: str) -> None:
        pass


def _machine_folder(root: Path, files: dict[str, str]) -> bytes:
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return pack(root, ".")


def _node(name: str) -> dict:
    return {"node_id": f"{name}-0123456789abcdef", "node_ip": f"10.0.0.{len(name)}", "hostname": name}


def _rank_record(rank: int) -> str:
    return json.dumps({"rank": rank, "world_size": 2, "machine_rank": rank, "status": "ok", "error": None,
                       "memory": {"peak_bytes": 100 * (rank + 1), "source": "cpu-rss"},
                       "throughput": {"completions": 4, "generated_tokens": 40, "trained_tokens": 80},
                       "prompt_ids": [rank]})


def _two_machines(run_id: str) -> tuple[Any, list, dict]:
    from bench.execution.launch import MachineRole
    from bench.execution.plan import PlannedRun

    run = PlannedRun(run_id, run_id.split("-")[0], "method", 0, run_id, "suite")
    return run, [MachineRole(k, 2, "10.0.0.1", 29500) for k in (0, 1)], {run_id: _node("a"),
                                                                          f"{run_id}@machine1": _node("bb")}


def test_a_run_across_machines_gets_every_machines_rank_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Machine 0's folder becomes the run's; machine 1's rank record and console join it; the records merge into
    one result over both ranks, and the placement lists both nodes."""
    from bench.execution.processes import Stopper
    from bench.execution.ray_machines import _collect
    from bench.results import empty_result

    monkeypatch.setitem(sys.modules, "ray", _FakeRay)
    suite, run_id = tmp_path / "suite", "grpo_engine-s0"
    run, roles, placed = _two_machines(run_id)
    run_dir = suite / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text("{}")
    result = dict(empty_result(run_id, "method", "grpo_engine", "GRPO (suite engine)", "suite", 0), status="ok",
                  memory={"peak_bytes": 100, "source": "cpu-rss"}, throughput={"train_s": 2.0, "completions": 4})
    zero = _machine_folder(tmp_path / "m0", {"result.json": json.dumps(result), "rank0.json": _rank_record(0),
                                             "worker.log": "machine 0"})
    one = _machine_folder(tmp_path / "m1", {"rank1.json": _rank_record(1), "worker.log": "machine 1"})
    refs = [lambda: (placed[run_id], 0, True, "/scratch/suite", zero),
            lambda: (placed[f"{run_id}@machine1"], 0, True, "/scratch/suite", one)]
    started = _collect(suite, run, run_dir, roles, refs, Stopper(io.StringIO()), _Session(placed))
    assert started.status == 0 and started.lost is None
    assert [m["hostname"] for m in started.placed["machines"]] == ["a", "bb"] and started.placed["hostname"] == "a"
    merged = json.loads((run_dir / "result.json").read_text())
    assert [r["rank"] for r in merged["memory"]["ranks"]] == [0, 1] and merged["memory"]["peak_bytes"] == 200
    assert merged["throughput"]["completions"] == 8 and merged["throughput"]["processes"] == 2
    assert (run_dir / "worker.log").read_text() == "machine 0"
    assert (run_dir / "worker.machine1.log").read_text() == "machine 1"
    assert (run_dir / "run.json").read_text() == "{}"  # the driver's own


def test_a_lost_machine_fails_the_run_naming_it_and_cancels_the_others(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Machine 1's node dies: machine 0's task is cancelled at once (its rank would wait for machine 1's until the
    process group timed out) and the run is a lost cell naming machine 1 and its node."""
    from bench.execution.processes import Stopper
    from bench.execution.ray_machines import _collect

    monkeypatch.setitem(sys.modules, "ray", _FakeRay)
    run_id = "ppo_verifier-s0"
    run, roles, placed = _two_machines(run_id)

    def node_died():
        raise _error("NodeDiedError")("Task failed because the node it was running on is dead or unavailable. More")

    def cancelled():
        raise _error("TaskCancelledError")("Task was cancelled")

    session = _Session(placed)
    started = _collect(tmp_path, run, tmp_path / run_id, roles, [cancelled, node_died], Stopper(io.StringIO()),
                       session)
    assert session.cancelled == [run_id]  # machine 0's task
    assert started.status is None and started.lost_type == "RayNodeLost"
    assert started.lost == ("machine 1 of 2: its Ray task ended on Ray node bb (10.0.0.2, node id bb-0123456789abc) "
                            "without sending the run folder back (NodeDiedError: Task failed because the node it was "
                            "running on is dead or unavailable)")
    assert [m["hostname"] for m in started.placed["machines"]] == ["a", "bb"]


def test_a_storage_folder_must_exist_and_be_writable_on_the_driver(tmp_path: Path) -> None:
    assert storage_problem(None) is None and storage_problem(str(tmp_path)) is None
    missing = storage_problem(str(tmp_path / "nowhere"))
    assert missing and "does not exist on this machine" in missing and "scheduler.storage=null" in missing
    (tmp_path / "file").write_text("")
    assert "is not a folder" in (storage_problem(str(tmp_path / "file")) or "")
    assert list(tmp_path.iterdir()) == [tmp_path / "file"]  # the write check leaves nothing behind


def _node_run_folder(node_root: Path) -> Path:
    sent = node_root / "runs" / "grpo-s0"
    (sent / "tensorboard").mkdir(parents=True)
    (sent / "run.json").write_text("{}")
    (sent / "result.json").write_text(json.dumps({"model": str(node_root / "runs/warm_start/model")}))
    (sent / "tensorboard" / "events").write_bytes(bytes(range(256)) * 64)
    return sent


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_storage_folder_carries_inputs_and_run_folders_as_the_object_store_does(tmp_path: Path) -> None:
    storage, suite, node_root = tmp_path / "storage", tmp_path / "suite", tmp_path / "scratch" / "suite"
    storage.mkdir()
    transfer = make_transfer(str(storage), "suite")
    assert isinstance(make_transfer(None, "suite"), ObjectStoreTransfer) and isinstance(transfer, StorageTransfer)
    assert transfer.describe() == f"storage: {storage}" and ObjectStoreTransfer().describe() == "object store"
    folder = Path(transfer.folder)
    assert folder.parent == storage and folder.name.startswith("suite-")
    (suite / "runs/warm_start/model").mkdir(parents=True)
    (suite / "runs/warm_start/model/config.json").write_text('{"layers": 2}')
    sent = transfer.send_input(suite / "runs/warm_start/model", "runs/warm_start/model")
    assert Path(sent) == folder / "inputs/runs/warm_start/model.tar"
    job = {"run_id": "grpo-s0", "inputs": {"init_model_dir": str(suite / "runs/warm_start/model")}}
    lay_out(node_root, job, [("init_model_dir", "runs/warm_start/model", transfer.fetch_input(sent))])
    assert (node_root / "runs/warm_start/model/config.json").read_text() == '{"layers": 2}'

    by_storage, by_object_store = suite / "runs" / "grpo-s0", tmp_path / "other" / "runs" / "grpo-s0"
    for run_dir in (by_storage, by_object_store):
        run_dir.mkdir(parents=True)
        (run_dir / "run.json").write_text('{"asked": "by the driver"}')
    on_node = _node_run_folder(node_root)
    tar = transfer.send_back(on_node, "grpo-s0")
    assert Path(tar) == folder / "runs" / "grpo-s0.tar"
    assert sorted(p.name for p in (folder / "runs").iterdir()) == ["grpo-s0.tar"]  # no temporary name left
    transfer.take_back(tar, by_storage, str(node_root), suite)
    objects = ObjectStoreTransfer()
    objects.take_back(objects.send_back(on_node, "grpo-s0"), by_object_store, str(node_root), suite)
    assert _tree(by_storage) == _tree(by_object_store) and "tensorboard/events" in _tree(by_storage)
    assert json.loads((by_storage / "result.json").read_text()) == {"model": str(suite / "runs/warm_start/model")}
    assert not Path(tar).exists()  # the driver drops the tar once the run folder is in place
    transfer.close()
    assert list(storage.iterdir()) == []  # the suite's storage folder is gone; the storage itself stays
    transfer.close()  # idempotent


def test_a_run_ray_started_again_says_so_on_its_line_in_its_placement_and_when_it_fails() -> None:
    spec = load_spec("cpu-quick", ["scheduler.name=ray", "scheduler.max_retries=2"])
    run = make_plan(spec)[-1]
    said = io.StringIO()
    session = RaySession(None, said, max_retries=spec.scheduler.max_retries)
    session.expect(run.run_id, Progress(said, threading.Lock(), False, 7, 7, run))
    first = {"scheduler": "ray", "node_id": "a" * 56, "node_ip": "192.0.2.2", "hostname": "gone", "gpus": [],
             "cpus": 1.0}
    second = dict(first, node_id="b" * 56, node_ip="192.0.2.3", hostname="kept", gpus=["0"])
    session._show(run.run_id, ("start", first))
    assert retried_placement(session._attempts[run.run_id], set()) == first  # one attempt: the placement as it was
    session._show(run.run_id, ("start", second))
    assert said.getvalue().splitlines()[1:] == [  # after the line Progress opens with
        f"[7/7] {run.run_id}: on Ray node gone (192.0.2.2, node id aaaaaaaaaaaaaaaa)",
        f"[7/7] {run.run_id}: retrying on Ray node kept (192.0.2.3, node id bbbbbbbbbbbbbbbb), GPUs 0 (attempt 2 of 3)"]

    placed = retried_placement(session._attempts[run.run_id], {"a" * 56})
    assert placed is not None and placed["node_id"] == "b" * 56 and placed["gpus"] == ["0"]  # where it ran last
    assert placed["attempts"] == [{"node_id": "a" * 56, "node_ip": "192.0.2.2", "hostname": "gone"},
                                  {"node_id": "b" * 56, "node_ip": "192.0.2.3", "hostname": "kept"}]
    assert placed["retried"] == ("retried 1 time: attempt 1 on Ray node gone (192.0.2.2, node id aaaaaaaaaaaaaaaa) "
                                 "was lost (its node died)")
    assert retried_placement([first, first, second], set())["retried"].startswith(
        "retried 2 times: attempt 1 on Ray node gone (192.0.2.2, node id aaaaaaaaaaaaaaaa) was lost (its worker "
        "process died); attempt 2 on")
    assert retried_placement([], set()) is None

    exhausted = lost_run(_error("NodeDiedError")("Task failed because the node it was running on is dead. More"),
                         placed)
    assert exhausted.lost_type == "RayNodeLost" and exhausted.placed == placed
    assert exhausted.lost == (
        "its Ray task ended on Ray node kept (192.0.2.3, node id bbbbbbbbbbbbbbbb) without sending the run folder "
        "back (NodeDiedError: Task failed because the node it was running on is dead) after 2 attempts (retried 1 "
        "time: attempt 1 on Ray node gone (192.0.2.2, node id aaaaaaaaaaaaaaaa) was lost (its node died))")
    assert "attempts" not in (lost_run(_error("NodeDiedError")("x"), first).lost or "")  # attempted once: as before
