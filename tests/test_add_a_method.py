"""The README's promise, kept: adding a method is one recipe file in baselines/ and one line in bench/config/registry.py.

The test copies the suite's packages into a temporary folder, writes a new method there (RLOO on the suite's
engine: REINFORCE with a leave-one-out baseline,
under a name of its own beside the shipped `rloo`), registers it with one line, and runs it end to end on cpu-quick
through the real CLI. Nothing else in the copy is edited: the spec, the planner, the worker and the report learn
about the method from the recipe.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RLOO_RECIPE = '''"""RLOO on the suite engine: REINFORCE with a leave-one-out baseline (a test's example of a new method)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from baselines import rl_math as M
from baselines.engine_config import EngineConfig, engine_description, validate_engine
from baselines.rollout_engine import Engine
from bench.errors import SpecError

LABEL = "RLOO example (suite engine)"
ENGINE = "suite"


@dataclass
class Config(EngineConfig):
    """RLOO's settings."""

    baseline_weight: float = 1.0
    """Scale of the leave-one-out baseline (0: plain REINFORCE), in [0, 1]."""


def networks(spec, cfg):
    return ("actor",)


def needs(spec, cfg):
    return ("warm_start",)


def validate(spec, cfg, key):
    validate_engine(spec, cfg, key)
    if not 0 <= cfg.baseline_weight <= 1:
        raise SpecError(f"'{key}.baseline_weight' must be in [0, 1], got {cfg.baseline_weight}")


def describe(spec, cfg):
    return engine_description(spec, cfg)


def rloo_step(engine, cfg, step):
    tel, G = engine.ctx.telemetry, engine.spec.train.group_size
    with tel.phase("generation"):
        batch = engine.sample(step)
    with tel.phase("reward"):
        scores, logs = engine.verify(batch)
    grouped = scores.reshape(-1, G)
    baseline = (grouped.sum(1, keepdim=True) - grouped) / (G - 1)
    advantages = (grouped - cfg.baseline_weight * baseline).reshape(-1)

    def loss_fn(rows, weights):
        logp, _ = engine.logprobs(engine.actor, batch, rows)
        loss = (-advantages[rows].unsqueeze(1) * logp * weights).sum()
        return loss, {"loss": loss}

    with tel.phase("update"):
        logs.update(engine.optimise(batch, loss_fn, "sequence_mean"))
    return logs


def train(ctx):
    cfg = ctx.method_spec
    engine = Engine(ctx, cfg, kl_coef=0.0)
    log_history, per_step = engine.run(lambda step: rloo_step(engine, cfg, step))
    return engine.outcome(log_history, per_step, {"advantage": "leave-one-out"}, ("reward",))
'''

REGISTRY_LINE = '    "rloo_example": Entry("baselines.rloo_example"),\n'


def _copy_with_new_method(root: Path) -> Path:
    copy = root / "suite"
    for package in ("bench", "baselines"):
        shutil.copytree(REPO / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "baselines" / "rloo_example.py").write_text(RLOO_RECIPE, encoding="utf-8")
    registry = copy / "bench" / "config" / "registry.py"
    text = registry.read_text(encoding="utf-8")
    anchor = '    "dpo": Entry("baselines.dpo"),\n'
    assert anchor in text, "the registry's METHODS table changed; update this test's anchor"
    registry.write_text(text.replace(anchor, anchor + REGISTRY_LINE), encoding="utf-8")
    return copy


def _bench(copy: Path, *args: str, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(copy), BENCH_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=900)


def test_a_method_added_as_one_file_and_one_registry_line_runs_end_to_end(tmp_path: Path) -> None:
    copy = _copy_with_new_method(tmp_path)
    others = [f"methods.{m}.enabled=false" for m in ("grpo", "grpo_engine", "ppo", "ppo_verifier", "dpo")]

    bad = _bench(copy, "run", "--preset", "cpu-quick", "--dry-run", *others, "methods.rloo_example.baseline_weight=2",
                 cache=tmp_path / "cache")
    assert bad.returncode == 2 and "'methods.rloo_example.baseline_weight' must be in [0, 1]" in bad.stderr

    out = tmp_path / "out"
    proc = _bench(copy, "run", "--preset", "cpu-quick", "--out", str(out), *others, cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == ["rloo_example-s0", "warm_start"]  # its prerequisites came from the recipe's needs()
    result = json.loads((out / "runs" / "rloo_example-s0" / "result.json").read_text())
    assert result["status"] == "ok" and result["label"] == "RLOO example (suite engine)"
    assert result["throughput"]["completions"] > 0 and result["accuracy"]["after"]
    assert result["spec"]["methods"]["rloo_example"]["baseline_weight"] == 1.0
    assert "RLOO example (suite engine)" in (out / "index.html").read_text()
