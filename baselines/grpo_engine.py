"""GRPO on the suite's rollout engine: PPO's loop with the critic replaced by a group-relative advantage.

Each rollout step samples G completions per prompt and scores them with the rule verifier; a completion's
advantage is (score - group mean) / (group std + 1e-4) (unbiased std, as TRL's GRPOTrainer), the same on
each of its tokens; the KL to the reference is a loss term beta * k3 (DeepSeekMath), not a reward penalty.
Everything else (sampling, scoring, clipped loss, epochs, minibatches, optimizer) is PPO's code, so
``ppo_verifier`` vs ``grpo_engine`` isolates the critic and the advantage estimator; TRL's GRPO (``grpo``)
stands beside it as the library reference.
"""

from __future__ import annotations

from baselines import rollout_engine
from bench.context import RunContext, TrainOutcome

LABEL = "GRPO (suite engine)"
ENGINE = "suite"
NETWORKS = ("actor", "reference")
"""Resident roles (no critic, no reward network; no reference either when the KL coef is 0)."""


def train(ctx: RunContext) -> TrainOutcome:
    """GRPO (group-relative advantages, no critic) on the suite engine."""
    return rollout_engine.train(ctx, "grpo")
