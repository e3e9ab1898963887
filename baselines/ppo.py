"""PPO on the suite's rollout engine (TRL removed PPOTrainer after v1.12): four networks, written from the algorithm.

What PPO does here, each rollout step:
  1. sample G completions for each of ``prompts_per_step`` prompts from the actor (the matched sampling settings);
  2. score each completion: the reward model at its last token (``reward: model``, run ``ppo``) or the rule
     verifier (``reward: verifier``, run ``ppo_verifier``), minus ``missing_eos_penalty`` when it never ended;
  3. per-token reward = -kl_coef * KL(actor || reference) on every token, + the score on the last token;
  4. the critic (a value head on its own backbone) predicts the return at every token; GAE (gamma, lam) turns
     rewards and values into advantages, whitened over the batch;
  5. ``ppo_epochs`` passes of ``minibatches`` minibatches: clipped policy loss + vf_coef * clipped value loss,
     one AdamW step for the actor and one for the critic per minibatch.
Everything is in ``baselines.rollout_engine`` (the loop) and ``baselines.rl_math`` (the maths).
"""

from __future__ import annotations

from baselines import rollout_engine
from bench.context import RunContext, TrainOutcome
from bench.spec import MethodSpec

LABEL = "PPO (suite engine)"
"""Generic label; the registry names the two runs 'PPO (reward model)' / 'PPO (verifier reward)'."""
ENGINE = "suite"
NETWORKS = ("actor", "critic", "reward", "reference")
"""Roles resident with the default settings (reward: model, KL coef > 0); see ``networks_for``."""


def networks_for(method_spec: MethodSpec, kl_coef: float) -> tuple[str, ...]:
    """Roles resident for these settings: no 'reward' with the verifier, no 'reference' when the KL coef is 0."""
    return tuple(role for role in NETWORKS
                 if not (role == "reward" and method_spec.reward == "verifier")
                 and not (role == "reference" and kl_coef == 0))


def train(ctx: RunContext) -> TrainOutcome:
    """PPO with a critic and GAE on the suite engine."""
    return rollout_engine.train(ctx, "ppo")
