"""The suite engine under DeepSpeed ZeRO-3 (baselines.rollout_engine, bench.config.launcher.engine_zero).

Two ranks on gloo with DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``) through the experiment escape
``BENCH_DEEPSPEED_ON_CPU=1``: PPO with the verifier reward (actor and critic, both sharded) trains for two steps
under the shipped zero3.yaml. Checks: the run records the ZeRO-3 strategy it ran, both trained networks went through
DeepSpeed, generation ran inside the gather (rank 0 then evaluated a whole copy), and both ranks end with the same
weights after training on different prompts.

Needs DeepSpeed, which the suite's own environment (and CI) does not install: there every test here is skipped with
that reason. Run it with an interpreter that has DeepSpeed, e.g. ``/tmp/dsvenv/bin/python -m pytest
tests/test_engine_deepspeed.py`` (deepspeed 0.19.8, torch 2.13 CPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_cli import run_bench

from bench.config import launcher
if launcher.deepspeed_problem() is not None:
    pytest.skip(f"DeepSpeed {launcher.deepspeed_problem()} in this interpreter: the ZeRO run needs it "
                f"(pip install '.[deepspeed]')", allow_module_level=True)

SMALL = ["warm_start.steps=5", "train.steps=2", "task.test_size=4", "eval.batch_size=4",
         *[f"methods.{m}.enabled=false" for m in ("ppo", "grpo", "dpo", "control", "grpo_engine")]]
"""cpu-quick cut to PPO with the verifier reward (actor + critic + reference, no reward-model stage), two steps."""


@pytest.fixture(scope="module")
def zero3_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zero3")
    out = root / "suite"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DS_ACCELERATOR", "cpu")
        env.setenv(launcher.DEEPSPEED_ON_CPU_ENV, "1")
        proc = run_bench("run", "--preset", "cpu-quick", "--out", str(out), "--launcher", "accelerate",
                         "--num-processes", "2", "--accelerate-config", str(launcher.shipped_config("zero3")), *SMALL,
                         cache_dir=root / "cache", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + "\n".join(
        p.read_text()[-3000:] for p in out.glob("runs/*/worker.log"))
    return out / "runs" / "ppo_verifier-s0"


def test_the_engine_records_the_zero3_layout_it_ran(zero3_run: Path) -> None:
    result = json.loads((zero3_run / "result.json").read_text())
    assert result["status"] == "ok"
    parallel, ran = result["settings"]["parallel"], result["settings"]["deepspeed"]
    assert (parallel["strategy"], parallel["config_strategy"]) == ("deepspeed-zero3", "deepspeed-zero3")
    assert "note" not in parallel and parallel["backend"] == "gloo"
    assert ran["zero_stage"] == 3 and ran["sharded"] == ["actor", "critic"]
    assert "gather" in ran["generation"] and ran["config"]["zero_optimization"]["stage"] == 3
    # rank 0 evaluated and accounted whole copies of the partitioned networks
    assert result["accuracy"]["n_questions"] == 4
    networks = result["memory"]["networks"]
    assert networks["actor"]["params"] == networks["actor"]["trainable_params"] > 0
    assert networks["critic"]["params"] > 0
    assert [r["rank"] for r in result["memory"]["ranks"]] == [0, 1]


def test_both_ranks_end_with_the_same_weights_from_different_prompts(zero3_run: Path) -> None:
    ranks = [json.loads((zero3_run / f"rank{k}.json").read_text()) for k in (0, 1)]
    assert not set(ranks[0]["prompt_ids"]) & set(ranks[1]["prompt_ids"])
    changes = [r["training_change"] for r in ranks]
    assert changes[0]["params_changed_fraction"] > 0.5  # the snapshots saw whole (gathered) weights that moved
    assert changes[0]["trainable_params"] == changes[1]["trainable_params"] > 0
    assert changes[0]["update_to_weight_ratio"] == changes[1]["update_to_weight_ratio"]
