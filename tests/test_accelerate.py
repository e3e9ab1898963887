"""Several processes per method run through accelerate (bench.execution.launch).

The launched run: `bench run --preset cpu-quick --launcher accelerate --num-processes 2` at a smaller size, on
gloo (no GPU here): each rank of the engine's GRPO and PPO, TRL's GRPO and TRL's DPO trained on its own prompts (DPO:
its own pairs, together the one-process run's pairs of each step), every rank's memory is recorded, and the result
keeps the one-process result's shape. The rest checks the plumbing: the spec and CLI validation, the shipped
accelerate configs, the command the runner starts, the merge of the ranks (DeepSpeed: test_deepspeed_config.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_cli import run_bench
from spec_errors import spec_error

from bench.execution import launch
from bench.config import launcher
from bench.results import empty_result, write_json_atomic
from bench.config.loading import load_spec

SMALL = ["warm_start.steps=20", "train.steps=2", "task.test_size=8", "eval.batch_size=8",
         "methods.ppo.enabled=false", "sample_pool.prompts=8", "sample_pool.pairs=gold"]
"""cpu-quick cut to what the launched run needs: a short warm start, two steps, eight test questions; the methods
that need no reward model (TRL's GRPO, the engine's GRPO and PPO with the verifier reward, DPO on the pool's pairs).
DPO's pool: eight prompts, gold-vs-sampled pairs (after 20 warm-start steps the policy is rarely right, so verifier
pairs could be none)."""
ONLINE = ["grpo", "grpo_engine", "ppo_verifier"]
"""The launched methods that sample: their completions are counted over the ranks."""
LAUNCHED = [*ONLINE, "dpo"]


# -- validation -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, expected", [
    (["launcher.num_processes=0"], "'launcher.num_processes' must be >= 1, got 0"),
    (["launcher.num_processes=2"], "no launcher is set; add --launcher accelerate"),
    (["launcher.name=torchrun"], "'launcher.name' must be one of 'none', 'accelerate'"),
    (["launcher.name=accelerate", "launcher.num_processes=2", "parallel_runs=2"],
     "'parallel_runs' (2) > 1 cannot be combined with a launcher"),
    (["launcher.name=accelerate", "launcher.num_processes=2", "train.prompts_per_step=3"],
     "'train.prompts_per_step' (3) must divide by the number of processes (2)"),
    (["launcher.name=accelerate", "launcher.config_file=/no/such/file.yaml"], "does not exist"),
    (["launcher.config_file=/no/such/file.yaml"], "'launcher.config_file' is set but no launcher is"),
    (["launcher.name=accelerate", "launcher.num_processes=2", "methods.grpo_engine.minibatches=8"],
     "must divide by 'methods.grpo_engine.minibatches' (8)"),
    (["launcher.num_machines=2"], "'launcher.num_machines' is 2 but no launcher is set"),
    (["launcher.name=accelerate", "launcher.num_processes=3", "launcher.num_machines=2", "scheduler.name=ray",
      "train.prompts_per_step=6"], "'launcher.num_processes' (3) must divide by 'launcher.num_machines' (2)"),
    (["launcher.name=accelerate", "launcher.num_processes=2", "launcher.num_machines=2"],
     "'launcher.num_machines' is 2 but 'scheduler.name' is 'local'; a run across machines is placed by the Ray "
     "scheduler"),
    (["launcher.name=accelerate", "launcher.main_port=70000"], "'launcher.main_port' must be in [1, 65535]"),
    (["launcher.num_machines=0"], "'launcher.num_machines' must be >= 1, got 0"),
])
def test_launcher_settings_are_checked(overrides: list[str], expected: str) -> None:
    assert expected in spec_error(overrides)


def test_more_processes_than_cores_on_a_cpu_only_machine_is_allowed() -> None:
    spec = load_spec("cpu-quick", ["launcher.name=accelerate", "launcher.num_processes=2"])
    assert spec.launcher.num_processes == 2 and spec.device == "cpu"


@pytest.mark.parametrize("name", launcher.SHIPPED_CONFIGS)
def test_shipped_configs_load_in_accelerate(name: str) -> None:
    """accelerate's own loader reads each shipped file; DeepSpeed ones carry a ZeRO stage the suite checks."""
    from accelerate.commands.config.config_args import load_config_from_file

    path = launcher.shipped_config(name)
    config = load_config_from_file(str(path))
    data = launcher.read_config(path)
    assert str(config.distributed_type).split(".")[-1] == data["distributed_type"]
    if name.startswith("zero"):
        assert data["distributed_type"] == "DEEPSPEED"
        assert config.deepspeed_config["zero_stage"] == int(name[4])
        assert (config.deepspeed_config["offload_param_device"] == "cpu") == name.endswith("offload")


def test_cli_flags_map_to_the_spec_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    proc = run_bench("run", "--preset", "cpu-quick", "--launcher", "accelerate", "--num-processes", "0", "--dry-run")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "bench: error: 'launcher.num_processes' must be >= 1, got 0"
    config = tmp_path / "mine.yaml"
    config.write_text(launcher.shipped_config("ddp").read_text())
    proc = run_bench("run", "--preset", "cpu-quick", "--launcher", "accelerate", "--num-processes", "2",
                     "--accelerate-config", str(config), "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]


# -- TRL's GRPO: the budget per device -------------------------------------------------------------------
@pytest.mark.parametrize("micro, per_device, accumulation", [(0, 12, 1), (4, 4, 3)])
def test_trl_grpo_gets_its_share_of_the_step_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         micro: int, per_device: int, accumulation: int) -> None:
    """Two ranks: each generates and trains on prompts_per_step / 2 prompts' G completions, so that
    per_device x accumulation x N is the step's prompts_per_step x G (TRL's generation batch, all whole groups)."""
    from baselines.grpo import grpo_config
    from bench.execution.context import RunContext

    spec = load_spec("cpu-quick", ["launcher.name=accelerate", "launcher.num_processes=2", "train.prompts_per_step=4",
                                  "train.group_size=6", f"train.micro_batch_size={micro}"])
    monkeypatch.setattr(launch, "world_size", lambda: 2)  # what WORLD_SIZE says in a rank
    ctx = RunContext(spec=spec, method="grpo", method_spec=spec.methods["grpo"], seed=0, run_dir=tmp_path,
                     device="cpu", init_model_dir=None, train_rows=[], telemetry=None, progress=lambda *a: None)
    config = grpo_config(ctx)
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (per_device, accumulation)
    assert config.per_device_train_batch_size * config.gradient_accumulation_steps * 2 == 4 * 6
    assert config.num_generations == 6


@pytest.mark.parametrize("processes, micro, per_device, accumulation", [(1, 0, 4, 1), (2, 0, 2, 1), (2, 1, 1, 2),
                                                                     (4, 0, 1, 1)])
def test_dpo_gets_its_share_of_the_pairs_per_process(processes: int, micro: int, per_device: int,
                                                     accumulation: int) -> None:
    """per_device x accumulation x N = prompts_per_step pairs per optimizer step, as in the one-process run."""
    from baselines.dpo import per_device_batching

    spec = load_spec("cpu-quick", ["train.prompts_per_step=4", f"train.micro_batch_size={micro}"])
    assert per_device_batching(spec, processes) == (per_device, accumulation)
    assert per_device * accumulation * processes == 4


def test_a_dpo_micro_batch_that_does_not_split_a_ranks_pairs_is_refused() -> None:
    only_dpo = [f"methods.{m}.enabled=false" for m in ("grpo", "grpo_engine", "ppo", "ppo_verifier", "control")]
    message = spec_error(["launcher.name=accelerate", "launcher.num_processes=2", "train.prompts_per_step=6",
                      "train.micro_batch_size=2", *only_dpo])
    assert "'train.micro_batch_size' (2) must divide the pairs per process (2 processes) per step (3)" in message


def test_a_micro_batch_that_does_not_split_a_ranks_share_is_refused() -> None:
    message = spec_error(["launcher.name=accelerate", "launcher.num_processes=2", "train.micro_batch_size=4",
                      "methods.grpo_engine.enabled=false", "train.prompts_per_step=2", "train.group_size=6"])
    assert "'train.micro_batch_size' (4) must divide the completions per process (2 processes) per step (6)" in message


# -- what the runner starts ------------------------------------------------------------------------------
def test_method_runs_start_through_accelerate_and_stages_do_not(tmp_path: Path) -> None:
    spec = load_spec("cpu-quick", ["launcher.name=accelerate", "launcher.num_processes=2"])
    (tmp_path / "rank1.json").write_text("{}")  # an earlier attempt's: removed before the launch
    command, env = launch.worker_launch(spec, "method", "grpo_engine", tmp_path, {})
    assert command is not None and command[1:5] == ["-m", "accelerate.commands.accelerate_cli", "launch",
                                                    "--config_file"]
    assert command[5] == str(launcher.shipped_config("ddp"))
    assert command[command.index("--num_processes") + 1] == "2"
    assert command[-3:] == ["-m", "bench.execution.worker", str(tmp_path)]
    assert env[launcher.LAUNCHER_ENV] == "accelerate" and not (tmp_path / "rank1.json").exists()
    assert launch.worker_launch(spec, "method", "grpo", tmp_path, {})[0] is not None  # TRL GRPO maps its budget
    assert launch.worker_launch(spec, "method", "dpo", tmp_path, {})[0] is not None  # and so does TRL's DPO
    assert launch.worker_launch(spec, "stage", "warm_start", tmp_path, {})[0] is None
    plain = load_spec("cpu-quick")
    assert launch.worker_launch(plain, "method", "grpo_engine", tmp_path, {"A": "1"}) == (None, {"A": "1"})


def test_each_machine_of_a_run_across_machines_launches_its_own_ranks(tmp_path: Path) -> None:
    """accelerate's multi-machine launch: the total ranks, this machine's rank, machine 0's address and port; a
    DeepSpeed config launches with the standard multi-node launcher (each machine its own ranks), and one machine
    takes launcher.main_port when it is set."""
    spec = load_spec("cpu-quick", ["launcher.name=accelerate", "launcher.num_processes=4", "launcher.num_machines=2",
                                   "scheduler.name=ray", "train.prompts_per_step=4"])
    command, _ = launch.worker_launch(spec, "method", "grpo_engine", tmp_path, {},
                                      machine=launch.MachineRole(1, 2, "10.0.0.5", 29555))
    flags = dict(zip(command[4:-3:2], command[5:-3:2]))
    assert {k: flags[k] for k in ("--num_processes", "--num_machines", "--machine_rank", "--main_process_ip",
                                  "--main_process_port")} == {
        "--num_processes": "4", "--num_machines": "2", "--machine_rank": "1", "--main_process_ip": "10.0.0.5",
        "--main_process_port": "29555"}
    assert "--deepspeed_multinode_launcher" not in command
    deepspeed = launch.accelerate_command(tmp_path, 4, launcher.shipped_config("zero2"), False,
                                          machine=launch.MachineRole(0, 2, "10.0.0.5", 29555), deepspeed=True)
    assert deepspeed[deepspeed.index("--deepspeed_multinode_launcher") + 1] == "standard"
    one = load_spec("cpu-quick", ["launcher.name=accelerate", "launcher.num_processes=2", "launcher.main_port=29600"])
    command, _ = launch.worker_launch(one, "method", "grpo_engine", tmp_path, {})
    assert command[command.index("--main_process_port") + 1] == "29600" and "--machine_rank" not in command
    assert launcher.machines_for(spec, "grpo_engine") == 2 and launcher.machines_for(spec, "warm_start") == 1


def _rank(rank: int, peak: int, completions: int, status: str = "ok", error: dict | None = None) -> dict:
    return {"rank": rank, "world_size": 2, "status": status, "error": error,
            "memory": {"peak_bytes": peak, "source": "cpu-rss", "by_source": {"cpu-rss": peak}},
            "throughput": {"train_s": 2.0, "completions": completions, "generated_tokens": 10 * completions,
                           "trained_tokens": 20 * completions},
            "prompt_ids": [rank]}


def test_rank_files_merge_into_one_result(tmp_path: Path) -> None:
    result = empty_result("grpo_engine-s0", "method", "grpo_engine", "GRPO (suite engine)", "suite", 0)
    result.update(status="ok", memory={"peak_bytes": 300, "source": "cpu-rss", "networks": {}},
                  throughput={"train_s": 2.0, "completions": 8, "generated_tokens": 80, "wall_s": 3.0})
    write_json_atomic(tmp_path / "result.json", result)
    write_json_atomic(tmp_path / "rank0.json", _rank(0, 300, 8))
    write_json_atomic(tmp_path / "rank1.json", _rank(1, 500, 8))
    merged = launch.merge_rank_files(tmp_path)
    assert merged == json.loads((tmp_path / "result.json").read_text())
    memory, throughput = merged["memory"], merged["throughput"]
    assert [r["peak_bytes"] for r in memory["ranks"]] == [300, 500]
    assert (memory["peak_bytes_max"], memory["peak_bytes_sum"], memory["peak_bytes"]) == (500, 800, 500)
    assert memory["peak_bytes_rank0"] == 300
    assert (throughput["completions"], throughput["generated_tokens"], throughput["processes"]) == (16, 160, 2)
    assert throughput["completions_per_s"] == 8.0 and throughput["tokens_per_s"] == 80.0


def test_a_failed_rank_fails_the_run_with_its_reason(tmp_path: Path) -> None:
    result = empty_result("grpo-s0", "method", "grpo", "GRPO (TRL)", "trl", 0)
    result.update(status="ok", throughput={"train_s": 1.0, "wall_s": 1.0})
    write_json_atomic(tmp_path / "result.json", result)
    write_json_atomic(tmp_path / "rank0.json", _rank(0, 1, 1))
    write_json_atomic(tmp_path / "rank1.json", _rank(1, 1, 1, "failed", {"type": "ValueError", "message": "boom"}))
    merged = launch.merge_rank_files(tmp_path)
    assert merged["status"] == "failed" and merged["error"]["type"] == "ValueError"
    assert merged["error"]["message"] == "rank 1: ValueError: boom"


# -- the launched run --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("accelerate")
    out = root / "suite"
    proc = run_bench("run", "--preset", "cpu-quick", "--out", str(out), "--launcher", "accelerate",
                     "--num-processes", "2", *SMALL, cache_dir=root / "cache", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + "\n".join(
        p.read_text()[-3000:] for p in out.glob("runs/*/worker.log"))
    return out


@pytest.mark.parametrize("method", LAUNCHED)
def test_two_ranks_train_on_different_prompts(launched: Path, method: str) -> None:
    run_dir = launched / "runs" / f"{method}-s0"
    spec = json.loads((launched / "suite.json").read_text())["spec"]
    t = spec["train"]
    ranks = [json.loads((run_dir / f"rank{k}.json").read_text()) for k in (0, 1)]
    ids = [r["prompt_ids"] for r in ranks]
    assert all(r["status"] == "ok" for r in ranks)
    assert len(ids[0]) == len(ids[1]) == t["steps"] * t["prompts_per_step"] // 2
    assert not set(ids[0]) & set(ids[1])  # different prompts ...
    assert sorted(ids[0] + ids[1]) == list(range(t["steps"] * t["prompts_per_step"]))  # ... the step's, together


def test_dpo_ranks_take_the_one_process_runs_pairs_of_every_step(launched: Path) -> None:
    """The one-process DPO run takes the pairs of each step from one seeded permutation (the Trainer's random
    sampler, made seedable by accelerate: torch.randperm seeded with the run's seed); under two ranks every rank
    draws the same permutation and takes every other batch, so each step trains on the same pairs."""
    import torch

    t = json.loads((launched / "suite.json").read_text())["spec"]["train"]
    ids = [json.loads((launched / "runs" / "dpo-s0" / f"rank{k}.json").read_text())["prompt_ids"] for k in (0, 1)]
    order = torch.randperm(t["steps"] * t["prompts_per_step"], generator=torch.Generator().manual_seed(0)).tolist()
    share = t["prompts_per_step"] // 2
    for step in range(t["steps"]):
        trained = ids[0][step * share:(step + 1) * share] + ids[1][step * share:(step + 1) * share]
        assert sorted(trained) == sorted(order[step * t["prompts_per_step"]:(step + 1) * t["prompts_per_step"]])


@pytest.mark.parametrize("method", LAUNCHED)
def test_gradients_are_averaged_over_the_ranks(launched: Path, method: str) -> None:
    """Different prompts, yet both ranks end with the same weights: the same change from the same start
    (without the averaging each rank would follow its own prompts' gradients)."""
    run_dir = launched / "runs" / f"{method}-s0"
    changes = [json.loads((run_dir / f"rank{k}.json").read_text())["training_change"] for k in (0, 1)]
    assert changes[0]["params_changed_fraction"] > 0.5
    assert changes[0]["update_to_weight_ratio"] == changes[1]["update_to_weight_ratio"]


@pytest.mark.parametrize("method", LAUNCHED)
def test_per_rank_memory_and_counts_across_ranks(launched: Path, method: str) -> None:
    result = json.loads((launched / "runs" / f"{method}-s0" / "result.json").read_text())
    spec = result["spec"]
    memory, throughput = result["memory"], result["throughput"]
    peaks = [r["peak_bytes"] for r in memory["ranks"]]
    assert [r["rank"] for r in memory["ranks"]] == [0, 1] and all(p > 50 * 2**20 for p in peaks)
    assert {r["source"] for r in memory["ranks"]} == {"cpu-rss"}
    assert memory["peak_bytes_max"] == max(peaks) == memory["peak_bytes"] and memory["peak_bytes_sum"] == sum(peaks)
    t = spec["train"]
    assert [r["prompts"] for r in throughput["per_rank"]] == [t["steps"] * t["prompts_per_step"] // 2] * 2
    if method in ONLINE:  # the matched budget over both ranks: steps x prompts_per_step x G completions
        assert throughput["completions"] == t["steps"] * t["prompts_per_step"] * t["group_size"]
        assert [r["completions"] for r in throughput["per_rank"]] == [throughput["completions"] // 2] * 2
    assert result["settings"]["parallel"]["processes"] == 2 and result["settings"]["parallel"]["backend"] == "gloo"
    launcher = result["environment"]["launcher"]
    assert launcher["name"] == "accelerate" and launcher["processes"] == 2
    assert launcher["config"]["distributed_type"] == "MULTI_GPU"


def test_the_launched_result_has_the_one_process_shape(launched: Path) -> None:
    """The same keys as a one-process result: the warm start ran as one process in the same suite, through the same
    worker and TRL; the engine's runs have no TRL seams. Rank 0 evaluated; every section of the one-process result
    is there, with the per-rank fields added."""
    runs = launched / "runs"
    stage = json.loads((runs / "warm_start" / "result.json").read_text())
    trl = json.loads((runs / "grpo-s0" / "result.json").read_text())
    assert set(trl) == set(stage)
    for method in LAUNCHED:
        result = json.loads((runs / f"{method}-s0" / "result.json").read_text())
        assert result["status"] == "ok"
        assert set(result) == set(trl) - ({"seams"} if result["engine"] == "suite" else set())
        for section in ("memory", "throughput", "accuracy"):
            assert set(stage[section]) <= set(result[section]), section
        assert result["accuracy"]["after"] and result["accuracy"]["n_questions"] == 8
        assert (runs / f"{method}-s0" / "completions.jsonl").is_file()


def test_two_machines_over_loopback_train_as_one_machine_with_two_processes(launched: Path,
                                                                             tmp_path: Path) -> None:
    """The launched suite's engine GRPO run again, as two machines of one process each (machine ranks 0 and 1,
    accelerate's multi-machine launch over 127.0.0.1, gloo): each machine starts its rank, they rendezvous at
    machine 0's port, and the run trains on the same prompts to the same loss and the same weights as the one
    machine's two processes."""
    import os
    import socket
    import subprocess

    one_machine = launched / "runs" / "grpo_engine-s0"
    run_dir = tmp_path / "grpo_engine-s0"
    run_dir.mkdir()
    (run_dir / "run.json").write_bytes((one_machine / "run.json").read_bytes())  # same inputs, seed and spec
    spec = load_spec("cpu-quick", ["launcher.name=accelerate", "launcher.num_processes=2",
                                   "launcher.num_machines=2", "scheduler.name=ray"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    machines = []
    for k in (0, 1):
        command, env = launch.worker_launch(spec, "method", "grpo_engine", run_dir, os.environ,
                                            machine=launch.MachineRole(k, 2, "127.0.0.1", port))
        with open(tmp_path / f"machine{k}.log", "w") as log:
            machines.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        statuses = [machine.wait(timeout=300) for machine in machines]
    finally:
        for machine in machines:
            machine.kill()
    assert statuses == [0, 0], "\n".join((tmp_path / f"machine{k}.log").read_text()[-2000:] for k in (0, 1))
    two = launch.merge_rank_files(run_dir)
    one = json.loads((one_machine / "result.json").read_text())
    ranks = launch.read_rank_files(run_dir)
    assert two["status"] == "ok" and [r["machine_rank"] for r in ranks] == [0, 1]
    assert [r["prompt_ids"] for r in ranks] == [r["prompt_ids"] for r in launch.read_rank_files(one_machine)]
    assert [c["loss"] for c in two["curves"]] == pytest.approx([c["loss"] for c in one["curves"]], rel=1e-6,
                                                               abs=1e-9)
    assert two["training_change"]["update_to_weight_ratio"] == pytest.approx(
        one["training_change"]["update_to_weight_ratio"], rel=1e-6)
    assert two["settings"]["parallel"]["processes"] == 2


# -- stopping a launched run --------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sigterm_stops_every_rank_and_records_the_run_as_interrupted(tmp_path: Path) -> None:
    """The launcher starts each rank in a session of its own; the runner's stop still reaches them all."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    out = tmp_path / "suite"
    console = tmp_path / "console.txt"
    env = dict(os.environ, BENCH_CACHE_DIR=str(tmp_path / "cache"))
    command = [sys.executable, "-m", "bench", "run", "--preset", "cpu-quick", "--out", str(out), "--launcher",
               "accelerate", "--num-processes", "2", "warm_start.steps=5", "train.steps=200",
               "methods.grpo.enabled=false", "methods.ppo.enabled=false", "methods.dpo.enabled=false",
               "methods.ppo_verifier.enabled=false"]
    with open(console, "w") as handle:
        suite = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=handle, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while "grpo_engine-s0: step " not in console.read_text():  # both ranks are past set-up, training
            assert suite.poll() is None and time.monotonic() < deadline, console.read_text()[-3000:]
            time.sleep(0.1)
        processes = psutil.Process(suite.pid).children(recursive=True)
        ranks = [p for p in processes if p.cmdline()[-2:] == ["bench.execution.worker", str(out / "runs" / "grpo_engine-s0")]
                 and "accelerate" not in " ".join(p.cmdline())]
        assert len(ranks) == 2 and len({os.getpgid(p.pid) for p in ranks}) == 2  # each rank in a group of its own
        suite.send_signal(signal.SIGTERM)
        assert suite.wait(timeout=120) == 130, console.read_text()[-3000:]
    finally:
        if suite.poll() is None:
            suite.kill()
            suite.wait()  # reaped: the ranks see the runner gone
    deadline = time.monotonic() + 15
    while any(_alive(p.pid) for p in processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p.pid for p in processes if _alive(p.pid)], "a rank or the launcher outlived the suite"
    stopped = json.loads((out / "runs" / "grpo_engine-s0" / "result.json").read_text())
    assert stopped["status"] == "failed" and stopped["error"]["type"] == "Interrupted", stopped["error"]
    ranks_recorded = launch.read_rank_files(out / "runs" / "grpo_engine-s0")
    assert [r["error"]["type"] for r in ranks_recorded] == ["Interrupted", "Interrupted"]
    resume = [line for line in console.read_text().splitlines() if line.startswith("resume with: ")]
    assert resume and "launcher.name=accelerate launcher.num_processes=2" in resume[-1]  # --resume launches again
