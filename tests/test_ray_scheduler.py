"""The Ray scheduler (scheduler.name=ray) end to end, through the real `bench run` in a subprocess.

- A shortened cpu-quick (every stage and method) under a Ray instance started for the suite ends all ok, and every
  completion file is byte-identical to the same suite under the local scheduler; the record says where each ran.
- Ray missing, or an address that answers nothing: one line, exit status 2, no traceback, nothing written; a storage
  folder missing here is refused by the same preflight.
- Ray's own two-node test cluster (ray.cluster_utils.Cluster on this machine, each node with a scratch folder of its
  own), its data moving through a storage folder (scheduler.storage) rather than the object store: runs land on both
  nodes and every run folder arrives in the driver's suite folder; the node removed while it runs a method leaves
  that run failed naming the node, the rest ok, and --resume completes it; the storage folder is left empty. The
  storage probe refuses, naming a node, a folder the nodes cannot read the driver's probe file in.
- SIGINT during a method run: exit status 130, the run recorded as interrupted, and no Ray process (raylet) and no
  worker left behind.

Every test that needs Ray is skipped, with the reason, where Ray is not installed (the ray extra).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_interrupts import Suite  # a `bench run` whose console is read while it runs

from bench.errors import UserError

pytestmark = pytest.mark.ray
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="Ray is not installed: ./run_all.sh --with-ray (or pip install -e '.[ray]')")

SMALL = ["warm_start.steps=20", "train.steps=2", "task.test_size=16", "sample_pool.prompts=16",
         "sample_pool.pairs=gold", "threads=1", "parallel_runs=2"]
"""cpu-quick cut to seconds per run; gold pairs, so the short warm start still gives the reward model and DPO their
pairs; one thread per method run and two runs at a time under either scheduler, so both run each at the same thread
count (and the local one as fast as Ray on two cores)."""
EVERY_KIND = ["methods.grpo_engine.enabled=false", "methods.ppo_verifier.enabled=false"]
"""Every stage, and a method of each kind: PPO on the suite's engine (it reads every stage), TRL's GRPO (online)
and TRL's DPO (offline, from the pool); the other two engine methods add time, not paths. Six runs."""
ENGINE_ONLY = ["methods.grpo.enabled=false", "methods.ppo.enabled=false", "methods.dpo.enabled=false"]
"""The warm start and the suite engine's GRPO and PPO (verifier): the quickest runs."""
STARTED_ON = re.compile(r"\] (\S+): on Ray node \S+ \([^,]+, node id ([0-9a-f]+)\)")
"""A progress line saying where a run's task started: (run id, node id prefix)."""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One private artefact cache for the module, the hub off, and node scratch folders under a folder of its own."""
    scratch = tmp_path_factory.mktemp("scratch")
    return dict(os.environ, BENCH_CACHE_DIR=str(tmp_path_factory.mktemp("cache")), HF_HUB_OFFLINE="1",
                HF_DATASETS_OFFLINE="1", BENCH_RAY_SCRATCH=str(scratch))


def bench(out: Path, env: dict[str, str], *extra: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", "run", "--preset", "cpu-quick", "--out", str(out), *SMALL,
                           *extra], capture_output=True, text=True, env=env, timeout=timeout)


def result(out: Path, run_id: str) -> dict:
    return json.loads((out / "runs" / run_id / "result.json").read_text())


def run_ids(out: Path) -> list[str]:
    return json.loads((out / "suite.json").read_text())["runs"]


def jsonl_files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.glob("*.jsonl"))}


@needs_ray
def test_a_suite_under_ray_ends_ok_with_the_local_schedulers_completions(tmp_path: Path, env: dict[str, str]) -> None:
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    first = bench(local, env, *EVERY_KIND)
    assert first.returncode == 0, first.stderr[-3000:]
    second = bench(on_ray, env, *EVERY_KIND, "scheduler.name=ray")
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stderr.strip().splitlines()[-1].startswith("all 6 runs ok in "), second.stderr[-2000:]
    assert run_ids(on_ray) == run_ids(local)
    for run_id in run_ids(local):
        written = jsonl_files(on_ray / "runs" / run_id)
        assert written or run_id == "reward_model", f"{run_id}: no completion or pool file came back"
        assert written == jsonl_files(local / "runs" / run_id), f"{run_id}: completions differ between schedulers"
        placed = result(on_ray, run_id)["placement"]
        assert placed["scheduler"] == "ray" and placed["node_id"] and placed["hostname"], placed
        assert placed["cpus"] == 1 and placed["gpus"] == [] and placed["device"] == "cpu", placed
        assert "bench-ray-" not in (on_ray / "runs" / run_id / "result.json").read_text()  # node paths moved back
    schedule = json.loads((on_ray / "suite.json").read_text())["schedule"]
    assert schedule["scheduler"] == "ray" and schedule["address"] == "started here" and len(schedule["nodes"]) == 1
    assert schedule["transfer"] == "object store"
    assert (on_ray / "index.html").is_file()
    assert not list(Path(env["BENCH_RAY_SCRATCH"]).iterdir())  # every task removed its scratch folder


def _one_line_exit_2(proc: subprocess.CompletedProcess, out: Path) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not out.exists()  # refused before the suite folder is made
    return lines[0]


def test_ray_missing_is_one_line_naming_the_fix(tmp_path: Path, env: dict[str, str]) -> None:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "ray.py").write_text("raise ImportError('ray is hidden for this test')\n")
    out = tmp_path / "suite"
    proc = bench(out, dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(hidden), env.get("PYTHONPATH")]))),
                 "scheduler.name=ray", timeout=120)
    line = _one_line_exit_2(proc, out)
    assert "Ray is not installed" in line and "./run_all.sh --with-ray" in line and ".[ray]" in line, line


@needs_ray
def test_an_address_that_answers_nothing_is_one_line_within_a_minute(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "suite"
    started = time.monotonic()
    proc = bench(out, env, "scheduler.name=ray", "scheduler.address=ray://127.0.0.1:9", timeout=120)
    took = time.monotonic() - started
    line = _one_line_exit_2(proc, out)
    assert "'scheduler.address' 'ray://127.0.0.1:9' answers nothing" in line, line
    assert took < 60, f"{took:.0f} s"


@needs_ray
def test_a_storage_folder_missing_here_is_refused_before_any_work(tmp_path: Path) -> None:
    """In this process (bench run's preflight, whose UserError is one line and exit status 2 as for the address
    above), to spare the Ray tests another `bench run`."""
    from bench.config.loading import load_spec
    from bench.execution.preflight import check_scheduler

    missing = tmp_path / "not-mounted"
    with pytest.raises(UserError) as refused:
        check_scheduler(load_spec("cpu-quick", ["scheduler.name=ray", f"scheduler.storage={missing}"]))
    assert str(refused.value).startswith(f"'scheduler.storage' '{missing}' does not exist on this machine; create it")
    check_scheduler(load_spec("cpu-quick", ["scheduler.name=ray", f"scheduler.storage={tmp_path}"]))  # exists: ok


def suite_command(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "bench", "run", "--preset", "cpu-quick", "--out", str(out), *SMALL, *extra]


def _second_method_start_on(node_prefix: str, suite: Suite) -> str | None:
    """The run to lose with the node: a method run that started on the node after some run finished there (so
    the node has sent a run folder back too); None until there is one."""
    lines = suite.text().splitlines()
    finished_there = False
    for index, line in enumerate(lines):
        found = STARTED_ON.search(line)
        if not found or not node_prefix.startswith(found.group(2)):
            continue
        run_id = found.group(1)
        if finished_there and "-s" in run_id:
            return run_id
        finished_there = finished_there or any(f"] {run_id}: ok" in later for later in lines[index:])
    return None


def _probe_refuses_a_folder_the_nodes_do_not_see(address: str, storage: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The storage probe against the real cluster, from this process: the driver's probe file is moved away
    right after the driver writes it (the patched writer), so the probe tasks on the real nodes look for it and do
    not find it, as a node that mounts another filesystem at that path would not (both test nodes share this
    machine's filesystem, so a truly unshared mount cannot be made here). A node that cannot run its task is
    named too. Either way: one line naming the node and the fix, and no probe file left."""
    import logging

    import ray

    from bench.execution import ray_channel
    from bench.execution.ray_session import RaySession

    write = ray_channel.write_driver_probe

    def written_elsewhere(probes: Path, token: str) -> None:
        write(probes, token)
        (probes / ray_channel.DRIVER_PROBE).rename(probes / "elsewhere")

    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    try:
        nodes = RaySession.nodes()
        monkeypatch.setattr(ray_channel, "write_driver_probe", written_elsewhere)
        with pytest.raises(UserError) as refused:
            ray_channel.probe_storage(storage, str(storage), nodes)
        message = str(refused.value)
        assert f"scheduler.storage '{storage}' is not shared with Ray node " in message, message
        assert any(f"({node['node_ip']}): it could not read the probe file the driver wrote there "
                   f"(FileNotFoundError)" in message for node in nodes), message
        assert message.endswith("or set scheduler.storage=null to move data through Ray's object store"), message
        monkeypatch.setattr(ray_channel, "write_driver_probe", write)
        with pytest.raises(UserError, match=r"could not be checked on Ray node 192\.0\.2\.99 .*probe task failed"):
            ray_channel.probe_storage(storage, str(storage), nodes + [{"node_id": "0" * 56, "node_ip": "192.0.2.99"}])
        assert not list(storage.iterdir())
    finally:
        ray.shutdown()


@needs_ray
def test_two_nodes_share_the_runs_and_a_lost_node_is_a_failed_cell_that_resume_completes(
        tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.cluster_utils import Cluster

    head_scratch, other_scratch, storage = tmp_path / "head-scratch", tmp_path / "other-scratch", tmp_path / "storage"
    for folder in (head_scratch, other_scratch, storage):
        folder.mkdir()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                            "env_vars": {"BENCH_RAY_SCRATCH": str(head_scratch)}})
    try:
        other = cluster.add_node(num_cpus=1, env_vars={"BENCH_RAY_SCRATCH": str(other_scratch)})
        cluster.wait_for_nodes()
        _probe_refuses_a_folder_the_nodes_do_not_see(cluster.address, storage, monkeypatch)
        out = tmp_path / "suite"
        command = suite_command(out, *ENGINE_ONLY, "seeds=[0,1,2]", "scheduler.name=ray",
                                f"scheduler.address={cluster.address}",  # six method runs for two nodes
                                f"scheduler.storage={storage}")  # their data through a folder both nodes mount
        suite = Suite(command, env, tmp_path / "console.txt")
        lost: list[str] = []

        workers: list[psutil.Process] = []

        def lose_the_node() -> bool:  # once that run's worker process is up on the node
            run_id = _second_method_start_on(other.node_id, suite)
            workers[:] = _workers_under(other_scratch) if run_id else []
            if workers:
                lost.append(run_id)
                cluster.remove_node(other, allow_graceful=False)
            return bool(workers)

        suite.wait_for(lose_the_node, "a second method run on the node to lose")
        assert suite.finish(timeout=180) == 1, suite.text()[-3000:]
        console = suite.text()
        print(f"node {other.node_id[:16]} removed while {lost[0]} ran on it; console:\n{console}")
        failed = result(out, lost[0])
        assert failed["status"] == "failed" and failed["error"]["type"] == "RayNodeLost", failed["error"]
        assert other.node_id[:16] in failed["error"]["message"], failed["error"]["message"]
        assert "--resume re-runs it" in failed["error"]["message"]
        landed = {result(out, run_id)["placement"]["node_id"] for run_id in run_ids(out) if run_id != lost[0]}
        assert landed == {cluster.head_node.node_id, other.node_id}, landed  # both nodes ran and sent back runs
        others = [run_id for run_id in run_ids(out) if run_id != lost[0]]
        assert all(result(out, run_id)["status"] == "ok" for run_id in others), console[-3000:]
        assert not list(head_scratch.iterdir())
        assert json.loads((out / "suite.json").read_text())["schedule"]["transfer"] == f"storage: {storage}"
        assert not list(storage.iterdir()), list(storage.rglob("*"))  # the suite's storage folder went with it
        deadline = time.monotonic() + 20  # the lost node's worker sees its parent die and stops itself
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p.pid for p in workers if alive(p)], "the lost node's worker is still running"

        resumed = subprocess.run(command + ["--resume"], capture_output=True, text=True, env=env, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"{lost[0]}: on Ray node" in resumed.stderr and "already complete, skipped (--resume)" in resumed.stderr
        assert result(out, lost[0])["status"] == "ok"
        assert result(out, lost[0])["placement"]["node_id"] == cluster.head_node.node_id
        assert not list(storage.iterdir())
    finally:
        cluster.shutdown()


@needs_ray
def test_a_run_across_two_machines_takes_a_node_for_each_and_merges_every_machines_ranks(
        tmp_path: Path, env: dict[str, str]) -> None:
    """launcher.num_machines=2 on Ray's two-node test cluster: the engine's GRPO run reserves both nodes (a placement
    group, one bundle per node), each node's task launches its one rank as machine 0 or 1 (accelerate's
    multi-machine launch, gloo over the node's address), and the run's folder holds both machines' rank records,
    merged into one result that names both nodes. Its data moves through a storage folder (scheduler.storage),
    where each machine sends back a tar of its own."""
    from ray.cluster_utils import Cluster

    from bench.execution import launch

    scratch = [tmp_path / "head-scratch", tmp_path / "other-scratch"]
    storage = tmp_path / "storage"
    for folder in (*scratch, storage):
        folder.mkdir()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                            "env_vars": {"BENCH_RAY_SCRATCH": str(scratch[0])}})
    try:
        other = cluster.add_node(num_cpus=1, env_vars={"BENCH_RAY_SCRATCH": str(scratch[1])})
        cluster.wait_for_nodes()
        out = tmp_path / "suite"
        proc = bench(out, env, *ENGINE_ONLY, "methods.ppo_verifier.enabled=false", "parallel_runs=1", "warm_start.steps=2",
                     "launcher.name=accelerate", "launcher.num_processes=2", "launcher.num_machines=2",
                     "scheduler.name=ray", f"scheduler.address={cluster.address}", f"scheduler.storage={storage}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert not list(storage.iterdir())
        run_dir = out / "runs" / "grpo_engine-s0"
        ran = result(out, "grpo_engine-s0")
        machines = ran["placement"]["machines"]
        assert {m["node_id"] for m in machines} == {cluster.head_node.node_id, other.node_id}, machines
        assert ran["placement"]["node_id"] == machines[0]["node_id"]  # rank 0's machine evaluated
        ranks = launch.read_rank_files(run_dir)
        assert [(r["rank"], r["machine_rank"], r["status"]) for r in ranks] == [(0, 0, "ok"), (1, 1, "ok")]
        assert [r["rank"] for r in ran["memory"]["ranks"]] == [0, 1] and ran["throughput"]["processes"] == 2
        assert ran["settings"]["parallel"]["machines"] == 2 and ran["status"] == "ok"
        assert (run_dir / "worker.machine1.log").is_file()
        assert "waiting for 2 Ray nodes with 1 CPUs each" in proc.stderr
        assert not any(list(folder.iterdir()) for folder in scratch)  # both tasks removed their scratch folders
    finally:
        cluster.shutdown()


def _workers_under(scratch: Path) -> list[psutil.Process]:
    """The bench worker processes whose run folder lies under ``scratch`` (one node's)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if "bench.execution.worker" in line and str(scratch) in line:
            found.append(process)
    return found


def _ray_processes(root: int) -> list[psutil.Process]:
    """The Ray daemons (raylet, GCS) and bench workers below process ``root``."""
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for child in children:
        try:
            line = " ".join(child.cmdline())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if "raylet" in line or "gcs_server" in line or "bench.execution.worker" in line:
            found.append(child)
    return found


def alive(process: psutil.Process) -> bool:
    """Running and not a zombie (a zombie has stopped; only its exit status waits to be collected)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _raylets() -> set[int]:
    proc = subprocess.run(["pgrep", "-f", "raylet"], capture_output=True, text=True)
    return {int(pid) for pid in proc.stdout.split()}


@needs_ray
def test_sigint_cancels_every_task_and_leaves_no_ray_process(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "suite"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    suite = Suite(suite_command(out, "scheduler.name=ray", "train.steps=40", "methods.dpo.enabled=false",
                                  "methods.ppo.enabled=false", "methods.ppo_verifier.enabled=false"),
                    dict(env, BENCH_RAY_SCRATCH=str(scratch)), tmp_path / "console.txt")
    suite.wait_for(lambda: "grpo-s0: step " in suite.text(), "a training step of grpo-s0")
    processes = _ray_processes(suite.process.pid)
    raylets = {p.pid for p in processes if "raylet" in " ".join(p.cmdline())}
    assert raylets and any("bench.execution.worker" in " ".join(p.cmdline()) for p in processes), processes
    suite.process.send_signal(signal.SIGINT)
    assert suite.finish(timeout=180) == 130, suite.text()[-3000:]
    deadline = time.monotonic() + 15
    while any(alive(p) for p in processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p.pid for p in processes if alive(p)]
    assert not left and not raylets & _raylets(), f"left behind: {left}"
    stopped = result(out, "grpo-s0")
    assert stopped["error"]["type"] == "Interrupted" and "its task was cancelled" in stopped["error"]["message"]
    assert "interrupted (SIGINT): " in suite.text() and "resume with: " in suite.text()
    assert not list(scratch.iterdir())  # the cancelled task removed its scratch folder
