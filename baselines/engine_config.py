"""What every method on the suite engine configures (``EngineConfig``), the checks of those fields against the
matched budget (``validate_engine``) and the dry-run lines they give (``engine_description``). PPO
(``baselines/ppo.py``) and GRPO (``baselines/grpo_engine.py``) add their own fields to ``EngineConfig``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.config import launcher
from bench.errors import SpecError
from bench.execution.context import MethodConfig


@dataclass
class EngineConfig(MethodConfig):
    """Fields every method on the suite engine has (PPO and GRPO add their own)."""

    ppo_epochs: int = 1
    """Passes over each rollout batch (>= 1). 1 (with minibatches 1) is one optimizer step per rollout, as TRL's
    GRPO makes (num_iterations 1): the shipped presets keep every online method at the same number of updates."""
    minibatches: int = 1
    """Minibatches per pass; optimizer steps per rollout = ppo_epochs x minibatches. Must divide the completions
    per step (train.prompts_per_step x train.group_size)."""
    cliprange: float = 0.2
    """Clip range of the policy ratio (> 0); inactive with one update per rollout (the ratio is then 1)."""
    missing_eos_penalty: float | None = None
    """Subtracted from the score of a completion that never ended (null: off, as in TRL's GRPO)."""


def validate_engine(spec: Any, cfg: EngineConfig, key: str) -> None:
    """Checks every engine method shares: each EngineConfig field in its range (one rule per field, the same
    table form as bench.config.rules.SPEC_RULES), then how they meet the matched budget. Raises SpecError naming the key."""
    from bench.config.rules import COUNT, RATE, above, check_rules

    check_rules(cfg, {
        "learning_rate": RATE,
        "ppo_epochs": COUNT,
        "minibatches": COUNT,
        "cliprange": above(0),
        "missing_eos_penalty": RATE,
    }, f"{key}.")
    per_step = spec.completions_per_step
    if per_step % cfg.minibatches:
        raise SpecError(f"completions per step ({per_step} = train.prompts_per_step x train.group_size) must divide "
                        f"by '{key}.minibatches' ({cfg.minibatches}); choose a divisor")
    processes = spec.launcher.num_processes if launcher.active(spec) else 1
    if processes > 1 and (per_step // processes) % cfg.minibatches:  # each rank splits its own completions
        raise SpecError(f"each of the {processes} processes samples {per_step // processes} completions per step, "
                        f"which must divide by '{key}.minibatches' ({cfg.minibatches}); choose a divisor")


def engine_description(spec: Any, cfg: EngineConfig) -> dict[str, str]:
    """Dry-run lines every engine method shares: updates per rollout, micro-batch size and LoRA (when on)."""
    per_step = spec.completions_per_step
    minibatch = per_step // cfg.minibatches
    micro = spec.train.micro_batch_size or minibatch
    lines = {"updates per rollout": f"{cfg.ppo_epochs * cfg.minibatches} ({cfg.ppo_epochs} epoch(s) x "
                                    f"{cfg.minibatches} minibatch(es) of {minibatch} completions)",
             "micro-batch": f"{min(micro, minibatch)} sequences per forward/backward"}
    lora = spec.train.lora
    if lora.enabled:
        lines["lora"] = (f"rank {lora.r}, alpha {lora.alpha} on {lora.target_modules}: the actor trains adapters only; "
                         f"a reference is its base with adapters off (no copy); PPO's critic "
                         f"{'has its own adapters + a trained value head' if lora.critic else 'trains every weight'}")
    return lines
