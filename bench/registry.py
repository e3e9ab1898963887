"""The one place bench/ learns about baselines/: run name -> recipe module, label, engine, prerequisites.

Adding a method (RLOO, Online DPO) is one recipe file in baselines/ plus one entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from bench.spec import Spec


@dataclass(frozen=True)
class RecipeInfo:
    """How to run one stage or method."""

    name: str
    module: str
    label: str
    engine: str
    kind: str  # "stage" or "method"

    def load(self) -> ModuleType:
        """Import the recipe module (lazily: torch and TRL load only inside the worker)."""
        return importlib.import_module(self.module)


STAGES: dict[str, RecipeInfo] = {
    "warm_start": RecipeInfo("warm_start", "baselines.sft", "Warm start (SFT, TRL)", "trl", "stage"),
    "sample_pool": RecipeInfo("sample_pool", "bench.sample_pool", "Sample pool (verifier-labelled)", "suite", "stage"),
    "reward_model": RecipeInfo("reward_model", "baselines.reward_model", "Reward model (TRL)", "trl", "stage"),
}

METHODS: dict[str, RecipeInfo] = {
    "grpo": RecipeInfo("grpo", "baselines.grpo", "GRPO (TRL)", "trl", "method"),
    "grpo_engine": RecipeInfo("grpo_engine", "baselines.grpo_engine", "GRPO (suite engine)", "suite", "method"),
    "ppo": RecipeInfo("ppo", "baselines.ppo", "PPO (reward model)", "suite", "method"),
    "ppo_verifier": RecipeInfo("ppo_verifier", "baselines.ppo", "PPO (verifier reward)", "suite", "method"),
    "dpo": RecipeInfo("dpo", "baselines.dpo", "DPO (TRL, pool pairs)", "trl", "method"),
}


def lookup(name: str) -> RecipeInfo:
    """Stage or method by name."""
    if name in STAGES:
        return STAGES[name]
    return METHODS[name]


def prerequisites(spec: Spec, method: str) -> list[str]:
    """Stages a method needs, in run order."""
    needs = ["warm_start"]
    if method == "dpo":
        needs.append("sample_pool")
    if method.startswith("ppo") and spec.methods[method].reward == "model":
        needs += ["sample_pool", "reward_model"]
    return needs
