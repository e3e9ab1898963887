"""GRPO's successors on the suite engine (baselines/grpo_family.py): each is registered, off by default and valid;
one engine step's loss equals the method's loss written from rl_math for the batch that step trained on; DAPO's
dynamic sampling counts every completion it draws; the engine GRPO's loss is unchanged; one short end-to-end run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from baselines import grpo_engine, grpo_family
from baselines import rl_math as M
from baselines.engine_step import StepPieces
from bench.config import registry
from bench.config.spec import Spec
from test_rollout_engine import G, NEW_TOKENS, PROMPTS, _context, model_dirs  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parents[1]
FRONTIER = ("rloo", "reinforce_pp", "dr_grpo", "dapo", "gspo", "cispo", "sapo")

pytestmark = pytest.mark.usefixtures("one_thread")


def test_each_method_is_registered_off_by_default_and_valid() -> None:
    from bench.config.loading import load_spec

    for name in FRONTIER:
        assert registry.METHODS[name].module == "baselines.grpo_family"
        assert registry.label(name).endswith("(suite engine)")
        assert Spec().methods[name].enabled is False
    for preset in ("cpu-quick", "cpu-tiny", "gsm8k-qwen0.5b"):
        assert not set(FRONTIER) & set(load_spec(preset, []).enabled_methods()), preset
    spec = load_spec("cpu-quick", [f"methods.{name}.enabled=true" for name in FRONTIER])
    assert set(FRONTIER) <= set(spec.enabled_methods())
    assert grpo_family.networks(spec, spec.methods["dapo"]) == ("actor",)  # no KL: no reference
    assert grpo_family.networks(spec, spec.methods["rloo"]) == ("actor", "reference")


def test_settings_out_of_range_are_refused() -> None:
    from bench.config.loading import load_spec
    from bench.errors import SpecError

    for override, words in (("methods.dapo.max_extra_rounds=-1", "max_extra_rounds"),
                            ("methods.cispo.cliprange_high=0", "cliprange_high"),
                            ("methods.reinforce_pp.kl=loss", "folds the KL into the reward"),
                            ("methods.dapo.overlong_cache=999", "overlong_cache")):
        with pytest.raises(SpecError, match=words):
            load_spec("cpu-quick", ["methods.dapo.enabled=true", "methods.cispo.enabled=true",
                                    "methods.reinforce_pp.enabled=true", override])


def _expected_loss(name: str, cfg, engine, batch) -> torch.Tensor:
    """The method's minibatch loss for ``batch``, written from rl_math (one update per rollout: old = logp)."""
    kl_coef = (grpo_engine if name == "grpo_engine" else grpo_family).beta(engine.spec, cfg)
    scores, _ = engine.verify(batch)
    if getattr(cfg, "overlong_penalty", False):
        scores = scores + M.overlong_penalty(batch.lengths, NEW_TOKENS, NEW_TOKENS // 5)
    logp = engine.logprobs(engine.actor, batch, torch.arange(len(batch)))[0]
    ref = engine.rollout_logprobs(engine.reference, batch) if kl_coef > 0 else None
    k1 = None if ref is None else M.kl_per_token(logp, ref, "k1") * batch.mask
    zero = torch.zeros_like(logp)
    A = {"rloo": lambda: M.leave_one_out_advantages(scores - kl_coef * k1.sum(1), G).unsqueeze(1),
         "reinforce_pp": lambda: M.reinforce_pp_advantages(scores, k1, batch.mask, kl_coef),
         "dr_grpo": lambda: M.group_advantages(scores, G, scale=False).unsqueeze(1),
         "grpo_engine": lambda: M.group_advantages(scores, G).unsqueeze(1)}.get(
        name, lambda: M.group_advantages(scores, G).unsqueeze(1))()
    per_token = {
        "dapo": lambda: M.clipped_surrogate(zero, A, 0.2, 0.28)[0],
        "gspo": lambda: M.clipped_surrogate(M.importance_log_ratio(logp, logp, batch.mask, "sequence"), A,
                                            3e-4, 4e-4)[0].expand_as(logp),
        "cispo": lambda: M.cispo_loss(logp, zero, A, 5.0),
        "sapo": lambda: M.sapo_loss(zero, A).expand_as(logp),
    }.get(name, lambda: M.clipped_surrogate(zero, A, 0.2)[0])()
    if ref is not None and name not in ("rloo", "reinforce_pp"):  # GRPO's k3 loss term (ratio 1 here)
        per_token = per_token + kl_coef * M.kl_per_token(logp, ref, "k3")
    weights = M.loss_weights(batch.mask, M.TRL_LOSS_AGGREGATION[cfg.loss_type], NEW_TOKENS)
    return (per_token * weights).sum()


def _one_step(name: str, tmp_path: Path, model_dirs, monkeypatch):  # noqa: F811
    """One step of ``name``; returns (outcome, [(recorded loss, expected loss, batch size)] per step)."""
    recipe = grpo_engine if name == "grpo_engine" else grpo_family
    config = recipe.Config(**registry.METHODS[name].defaults)
    ctx = _context(tmp_path, model_dirs, name, config)
    ctx.spec.train.steps = 1
    seen = []
    original = StepPieces.optimise

    def recording(self, batch, loss_fn, aggregation):
        with torch.no_grad():
            weights = M.loss_weights(batch.mask, aggregation, NEW_TOKENS)
            recorded = loss_fn(torch.arange(len(batch)), weights)[0]
            seen.append((recorded, _expected_loss(name, config, self, batch), len(batch)))
        return original(self, batch, loss_fn, aggregation)

    monkeypatch.setattr(StepPieces, "optimise", recording)
    return recipe.train(ctx), seen


@pytest.mark.parametrize("name", [*FRONTIER, "grpo_engine"])
def test_one_step_loss_is_the_methods_rl_math_loss(name, tmp_path, model_dirs, monkeypatch):  # noqa: F811
    outcome, seen = _one_step(name, tmp_path, model_dirs, monkeypatch)
    (recorded, expected, size), = seen
    assert size == PROMPTS * G  # the matched batch, DAPO's included
    torch.testing.assert_close(recorded, expected, rtol=1e-5, atol=1e-6)
    assert outcome.settings["mode"] == ("grpo" if name == "grpo_engine" else name)


def test_dapo_counts_every_completion_it_draws(tmp_path, model_dirs, monkeypatch):  # noqa: F811
    outcome, _ = _one_step("dapo", tmp_path, model_dirs, monkeypatch)
    (point,) = outcome.log_history
    assert 0 <= point["dynamic_sampling_rounds"] <= 3
    extra = point["dynamic_sampling_completions"]
    assert outcome.completions == PROMPTS * G + extra
    assert outcome.metrics["extra_generation_rounds"] == point["dynamic_sampling_rounds"]
    assert outcome.settings["max_extra_rounds"] == 3 and outcome.settings["dynamic_sampling"] is True


def _one_step_with(name: str, tmp_path: Path, model_dirs, monkeypatch, **settings):  # noqa: F811
    """One step of ``name`` with ``settings`` over its registry defaults, its verifier replaced by scores that
    differ within every group (the fixture's random model earns none, so nothing would move); returns the point."""
    original = StepPieces.verify

    def spread_scores(self, batch):
        scores, logs = original(self, batch)
        return torch.arange(len(batch), dtype=scores.dtype) % G / G, logs

    monkeypatch.setattr(StepPieces, "verify", spread_scores)
    recipe = grpo_engine if name == "grpo_engine" else grpo_family
    config = recipe.Config(**{**registry.METHODS[name].defaults, **settings})
    ctx = _context(tmp_path, model_dirs, name, config)
    ctx.spec.train.steps = 1
    (point,) = recipe.train(ctx).log_history
    return point


@pytest.mark.parametrize("name", ["grpo_engine", "gspo", "cispo"])
def test_ratio_spread_is_logged_and_zero_until_the_policy_moves(name, tmp_path, model_dirs, monkeypatch):  # noqa: F811
    still = _one_step_with(name, tmp_path / "one", model_dirs, monkeypatch)  # one update per rollout: ratios all 1
    assert still["ratio"] == pytest.approx(1.0, abs=1e-6) and still["ratio_std"] == pytest.approx(0.0, abs=1e-6)
    moved = _one_step_with(name, tmp_path / "two", model_dirs, monkeypatch, minibatches=2)  # 2nd sees a new policy
    assert moved["ratio_std"] > 1e-4


class _Batch:
    """The one member of a Rollout that policy_update reads besides its length."""

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask

    def __len__(self) -> int:
        return len(self.mask)


class _Engine:
    """The members of the engine policy_update calls; optimise makes one pass over the whole batch."""

    def __init__(self, entropy: torch.Tensor) -> None:
        from test_rollout_engine import FakeTelemetry

        self.entropy, self.actor = entropy, "actor"
        self.ctx = type("Ctx", (), {"telemetry": FakeTelemetry()})()

    def logprobs(self, actor, batch, rows, with_entropy):
        return torch.zeros(len(rows), batch.mask.shape[1], requires_grad=True), self.entropy[rows]

    def optimise(self, batch, loss_fn, aggregation):
        weights = M.loss_weights(batch.mask, aggregation, batch.mask.shape[1])
        _, stats = loss_fn(torch.arange(len(batch)), weights)
        return {**{name: float(v.detach()) for name, v in stats.items()}, "learning_rate": 0.0, "grad_norm": 0.0}


@pytest.mark.parametrize("loss_type", ["dr_grpo", "dapo"])
def test_logged_stats_are_token_means_whatever_the_normaliser(loss_type) -> None:
    """Dr. GRPO divides its loss by batch x max length, so its weights sum to mean length / max length; the logged
    entropy and ratio are still token means, and ratio_std the tokens' population std of the ratios."""
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    entropy = torch.tensor([[1.0, 2, 3, 4], [5, 6, 9, 9], [7, 9, 9, 9]])
    ratio = torch.tensor([[1.0, 1.1, 0.9, 1.2], [0.8, 1.0, 9, 9], [1.3, 9, 9, 9]])
    cfg = grpo_engine.Config(loss_type=loss_type)

    def token_loss(rows, logp, old, ref):
        return logp * 0, {"ratio": ratio[rows]}

    logs = grpo_engine.policy_update(_Engine(entropy), cfg, _Batch(mask), None, token_loss)
    real = ratio[mask].double()
    assert logs["entropy"] == pytest.approx(entropy[mask].mean().item(), rel=1e-6)  # 37 / 7, not 37 / 12
    assert logs["ratio"] == pytest.approx(real.mean().item(), rel=1e-6)
    assert logs["ratio_std"] == pytest.approx(real.std(unbiased=False).item(), rel=1e-5)
    assert logs["kl"] == 0.0 and "ratio_dev_sq" not in logs and "loss_weight" not in logs


def test_select_and_join_keeps_rows_and_pads_to_the_widest() -> None:
    from baselines.engine_rollout import Rollout, select_and_join

    def rollout(P: int, T: int, fill: int) -> Rollout:
        ids = torch.full((2, P + T), fill)
        mask = torch.ones(2, T, dtype=torch.bool)
        return Rollout([{"prompt": str(fill)}] * 2, ids, torch.ones(2, P + T, dtype=torch.long),
                       torch.arange(P + T).expand(2, -1), ids[:, P:], mask, torch.ones(2, dtype=torch.bool),
                       [str(fill)] * 2)

    joined = select_and_join([(rollout(3, 2, 7), torch.tensor([1])), (rollout(2, 4, 9), torch.tensor([0, 1]))], 0)
    assert joined.input_ids.shape == (3, 7) and joined.completion_ids.shape == (3, 4)
    assert joined.input_ids[0].tolist() == [7, 7, 7, 7, 7, 0, 0]
    assert joined.input_ids[1].tolist() == [0, 9, 9, 9, 9, 9, 9]
    assert joined.lengths.tolist() == [2, 4, 4] and joined.position_ids[1, 1].item() == 0
    assert [r["prompt"] for r in joined.rows] == ["7", "9", "9"]


def test_end_to_end_dapo_on_cpu_quick(tmp_path: Path) -> None:
    out = tmp_path / "out"
    others = [f"methods.{m}.enabled=false" for m in ("grpo", "grpo_engine", "ppo", "ppo_verifier", "dpo")]
    env = dict(os.environ, BENCH_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "bench", "run", "--preset", "cpu-quick", "--out", str(out), *others,
                           "methods.dapo.enabled=true", "warm_start.enabled=false", "train.steps=2"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "runs" / "dapo-s0" / "result.json").read_text())
    assert result["status"] == "ok" and result["label"] == "DAPO (suite engine)"
    assert result["throughput"]["completions"] >= 2 * 2 * 4  # the matched batches, and any extra rounds
    assert "DAPO (suite engine)" in (out / "index.html").read_text()
