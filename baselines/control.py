"""The control arm: the engine's online GRPO loop with a learning rate of 0, the pipeline's own check.

Everything that ``grpo_engine`` does happens here too — the same prompts in the same order, the same sampling,
reward, reference forward, loss, backward passes and AdamW steps, the same evaluation — except that every update
is multiplied by a learning rate of 0. Two things follow, and the report reads both:

- its accuracy after training must equal the starting checkpoint's exactly under greedy decoding: anything else
  is a fault of the pipeline (evaluation, checkpoint loading, state leaking between runs), not of a method;
- its training-reward curve is the pipeline's noise floor: how far a reward curve moves from sampling alone,
  with a policy that does not change. Another method's curve means something only where it leaves this band.

Why AdamW with lr 0 leaves every weight bit-identical (``tests/test_control.py`` checks it): torch's AdamW
multiplies each weight by ``1 - lr * weight_decay`` = 1 exactly and adds ``-lr / bias_correction * m / (sqrt(v) +
eps)`` = 0 (eps > 0 keeps the quotient finite; clipping keeps gradients finite); every learning-rate schedule
scales the base rate, so warm-up and decay stay at 0. (The one bit pattern that can change is a weight stored as
-0.0, which adding a zero turns into +0.0: equal in value, and absent from trained checkpoints in practice.) With
LoRA the same holds for the adapters (the base weights are frozen anyway). The parameter-change telemetry then reports 0% changed, by design; the report should not
flag it as a method that failed to train.

It reuses ``baselines.grpo_engine`` (step, networks, validation) rather than repeating it; only the learning
rate is its own, and it must be 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baselines import grpo_engine
from bench.execution.context import RunContext, TrainOutcome
from bench.errors import SpecError

LABEL = "Control (lr 0)"
ENGINE = "suite"


@dataclass
class Config(grpo_engine.Config):
    """The engine GRPO's settings (``baselines/grpo_engine.py``), with the learning rate fixed at 0."""

    enabled: bool = False
    """Run the control arm (off by default: it doubles the cost of an engine GRPO run; turn it on with
    methods.control.enabled=true)."""
    learning_rate: float | None = 0.0
    """Always 0: the control arm's point is that it does not learn (any other value is refused)."""


def networks(spec: Any, cfg: Config) -> tuple[str, ...]:
    """The engine GRPO's roles: the actor, and the reference when beta > 0."""
    return grpo_engine.networks(spec, cfg)


def needs(spec: Any, cfg: Config) -> tuple[str, ...]:
    """Only the shared starting checkpoint."""
    return grpo_engine.needs(spec, cfg)


def validate(spec: Any, cfg: Config, key: str) -> None:
    """The engine GRPO's checks (each number in its range first), then a learning rate of exactly 0."""
    grpo_engine.validate(spec, cfg, key)
    if cfg.learning_rate != 0:
        raise SpecError(f"'{key}.learning_rate' must be 0 (the control arm measures the pipeline without learning), "
                        f"got {cfg.learning_rate}; remove the override, or compare with methods.grpo_engine")


def describe(spec: Any, cfg: Config) -> dict[str, str]:
    """Dry-run lines: the engine GRPO's, plus what the arm is for."""
    return {**grpo_engine.describe(spec, cfg),
            "control": "learning rate 0: accuracy after must equal before; its reward curve is the noise floor"}


def train(ctx: RunContext) -> TrainOutcome:
    """The engine's GRPO loop at learning rate 0 (``Config`` pins it, ``validate`` refuses anything else)."""
    assert ctx.method_spec.learning_rate == 0, "validate() refuses a control arm with a learning rate"
    outcome = grpo_engine.train(ctx)
    outcome.settings.update(mode="control", control="GRPO (suite engine) loop at learning rate 0")
    return outcome
