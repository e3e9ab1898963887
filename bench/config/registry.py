"""The one place bench/ learns about baselines/: run name -> recipe module (and that run's own defaults).

A recipe is one module in ``baselines/`` (see ``bench.execution.context`` for the interface). It declares everything
about its method: ``LABEL``, ``ENGINE``, its ``Config`` dataclass (only the fields that method has), the
networks it keeps resident, the stages it needs, its validation and its ``train``. The spec, the planner and
the report read those from the recipe, so adding a method is one recipe file and one line here:

    "rloo": Entry("baselines.rloo"),

Two runs may share a recipe with different defaults (``ppo`` and ``ppo_verifier``).
Recipe modules are imported lazily: reading the registry imports no torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class Entry:
    """One registered run name."""

    module: str
    """Import path of the recipe module."""
    label: str | None = None
    """Label in the report; None: the recipe's LABEL."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """This run's defaults over the recipe's Config defaults."""

    def load(self) -> ModuleType:
        """Import the recipe module."""
        return importlib.import_module(self.module)


NO_WARM_START_LABEL = "Start model (no warm start: the loaded weights, evaluated)"
"""The warm-start stage's label under ``warm_start.enabled: false``: it trains nothing, so it is not an SFT."""

STAGES: dict[str, Entry] = {
    "warm_start": Entry("baselines.sft"),
    "sample_pool": Entry("bench.execution.sample_pool"),
    "reward_model": Entry("baselines.reward_model"),
}
"""Shared stages in run order; each runs once per suite and its output feeds the methods that need it."""

STAGE_NEEDS: dict[str, tuple[str, ...]] = {
    "warm_start": (),
    "sample_pool": ("warm_start",),
    "reward_model": ("warm_start", "sample_pool"),
}
"""Stages each stage reads from."""

METHODS: dict[str, Entry] = {
    "grpo": Entry("baselines.grpo"),
    "grpo_engine": Entry("baselines.grpo_engine"),
    "ppo": Entry("baselines.ppo", label="PPO (reward model)", defaults={"reward": "model"}),
    "ppo_verifier": Entry("baselines.ppo", label="PPO (verifier reward)", defaults={"reward": "verifier"}),
    "dpo": Entry("baselines.dpo"),
    "control": Entry("baselines.control"),  # off by default (methods.control.enabled=true)
    # GRPO's successors: one recipe, each method's differences from GRPO (off by default: methods.<name>.enabled=true)
    "rloo": Entry("baselines.grpo_family", label="RLOO (suite engine)",
                  defaults={"advantage": "leave_one_out", "kl": "reward"}),
    "reinforce_pp": Entry("baselines.grpo_family", label="REINFORCE++ (suite engine)",
                          defaults={"advantage": "reinforce_pp", "kl": "reward", "loss_type": "bnpo"}),
    "dr_grpo": Entry("baselines.grpo_family", label="Dr. GRPO (suite engine)",
                     defaults={"advantage": "group_no_std", "loss_type": "dr_grpo"}),
    "dapo": Entry("baselines.grpo_family", label="DAPO (suite engine)",
                  defaults={"cliprange_high": 0.28, "loss_type": "dapo", "kl": "none", "dynamic_sampling": True,
                            "overlong_penalty": True}),
    "gspo": Entry("baselines.grpo_family", label="GSPO (suite engine)",
                  defaults={"loss": "sequence_clip", "cliprange": 3e-4, "cliprange_high": 4e-4, "kl": "none"}),
    # CISPO's weight bound min(r, 1 + 4.0) = 5: ScaleRL's recommended eps_max, as TRL 1.16 documents it for its
    # cispo loss (whose epsilon_high is the bound on r itself); a bound of 1.28 would clip like DAPO's clip-higher.
    "cispo": Entry("baselines.grpo_family", label="CISPO (suite engine)",
                   defaults={"loss": "cispo", "cliprange_high": 4.0, "loss_type": "dapo"}),
    "sapo": Entry("baselines.grpo_family", label="SAPO (suite engine)", defaults={"loss": "sapo"}),
}
"""Contestants in report order."""

UNTUNABLE = ("control",)
"""Methods never tuned: the control arm runs at learning rate 0 by design."""


def lookup(name: str) -> Entry:
    """Stage or method entry by name (KeyError for an unknown name: the spec has already rejected it)."""
    return STAGES[name] if name in STAGES else METHODS[name]


def recipe(name: str) -> ModuleType:
    """The recipe module of a stage or method."""
    return lookup(name).load()


def label(name: str) -> str:
    """The report label of a stage or method."""
    entry = lookup(name)
    return entry.label or entry.load().LABEL


def engine(name: str) -> str:
    """'trl' or 'suite' (who runs the training loop)."""
    return lookup(name).load().ENGINE


def default_config(name: str) -> Any:
    """A method's Config instance with the recipe's defaults and this run's registry defaults."""
    entry = METHODS[name]
    return entry.load().Config(**entry.defaults)


def stages_needed(spec: Any, name: str) -> list[str]:
    """Stages a method needs, in run order (declared by the recipe from its config)."""
    needed = set(recipe(name).needs(spec, spec.methods[name]))
    closure = set(needed)
    for stage in needed:
        closure.update(STAGE_NEEDS[stage])
    return [stage for stage in STAGES if stage in closure]
