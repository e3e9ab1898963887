"""The one precision policy: trained networks keep fp32 master weights, frozen ones may be stored in low precision.

Pure-bf16 AdamW at RL learning rates rounds most updates away: bf16 keeps 8 significant bits, so a weight of
magnitude 0.02 moves only by steps of about 6e-5, and an update of lr 1e-6 x (Adam's ~unit step) never reaches
that spacing (a 20-step check moved 2% of the weights). So every network that an optimizer updates is *stored*
in float32 and *computes* under bf16 autocast where the spec asks for bfloat16; networks that are only read
(the reference, the reward model during PPO) are stored in the spec's dtype, which halves their memory. Under
LoRA the actor's base is frozen too: it is stored in the spec's dtype and only its adapters are float32
(``adapters``).

Every network computes in the same numerics whatever its storage: under bf16 autocast with a float32 residual
stream (``bench.model.numerics``), so a bf16-stored reference gives exactly the float32 actor's log-probs at the
first step, and the starting checkpoint and every trained policy are scored alike.

This module imports no torch: the dry run, the report and the tests read the policy as plain data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

TRAINED_ROLES = ("actor", "critic")
"""Roles an optimizer updates during a method run (the reward model trains only in its own stage)."""


@dataclass(frozen=True)
class Precision:
    """How one network is held and run.

    storage: dtype of the weights in memory (under LoRA: of the frozen base); compute: dtype of matmuls ('bfloat16
    autocast' or the storage dtype); optimizer_state: dtype of AdamW's moments (None for a frozen network);
    adapters: dtype of the trained LoRA adapters (None without LoRA, and then left out of ``to_dict``).
    """

    storage: str
    compute: str
    optimizer_state: str | None
    adapters: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        record = asdict(self)
        if record["adapters"] is None:
            del record["adapters"]
        return record


def autocast_dtype(model_dtype: str) -> str | None:
    """The autocast dtype for a spec dtype: 'bfloat16' runs matmuls in bf16 under autocast; float32 none."""
    return "bfloat16" if model_dtype == "bfloat16" else None


def storage_dtype(model_dtype: str, trained: bool) -> str:
    """float32 for anything an optimizer updates (fp32 master weights); the spec's dtype for frozen networks."""
    return "float32" if trained else model_dtype


def precision_for(model_dtype: str, trained: bool, lora: bool = False) -> Precision:
    """The policy for one network: ``model_dtype`` is spec.model.dtype ('float32' | 'bfloat16'); ``lora``: a
    trained network whose base is frozen and whose float32 adapters are trained (the base is stored as frozen).

    Every network, frozen ones too, computes under bf16 autocast when the spec asks for bfloat16 (the one compute
    numerics of ``bench.model.numerics``)."""
    auto = autocast_dtype(model_dtype)
    storage = storage_dtype(model_dtype, trained and not lora)
    compute = f"{auto} autocast" if auto else storage
    return Precision(storage=storage, compute=compute, optimizer_state="float32" if trained else None,
                     adapters="float32" if trained and lora else None)


def precision_policy(model_dtype: str, roles: tuple[str, ...] | list[str],
                     trained_roles: tuple[str, ...] = TRAINED_ROLES,
                     lora_roles: tuple[str, ...] = ()) -> dict[str, dict[str, str | None]]:
    """{role: Precision as a dict} for the networks a run keeps resident (recorded in every result);
    ``lora_roles``: the trained roles that train LoRA adapters over a frozen base."""
    return {role: precision_for(model_dtype, role in trained_roles, role in lora_roles).to_dict() for role in roles}


def lora_roles(lora: Any) -> tuple[str, ...]:
    """The trained roles that train adapters over a frozen base under ``lora`` (spec.train.lora): the actor, and
    the engine's critic when ``lora.critic``; none when LoRA is off."""
    if not lora.enabled:
        return ()
    return ("actor", "critic") if lora.critic else ("actor",)


def with_shared_reference(policy: dict[str, dict[str, str | None]],
                          owner: str = "actor") -> dict[str, dict[str, str | None]]:
    """``policy`` with the reference held as ``owner``'s own weights: under LoRA every method's reference is the
    actor's base with its adapters disabled (the engine's ``AdapterOffReference``, TRL's adapter switch), so it
    has the owner's storage and compute, no optimizer state, and ``shared_with: owner`` (no copy of its own).
    Returned unchanged when there is no reference or no owner."""
    if "reference" not in policy or owner not in policy:
        return policy
    shared = {k: v for k, v in policy[owner].items() if k != "adapters"}  # the adapters are off in it
    return {**policy, "reference": {**shared, "optimizer_state": None, "shared_with": owner}}


def describe_policy(policy: dict[str, dict[str, str | None]]) -> str:
    """One line for the dry run: 'actor fp32 weights, bfloat16 autocast; reference bfloat16 (frozen)'; a shared
    reference (:func:`with_shared_reference`): 'reference = actor's base with adapters disabled (...)'."""
    parts = []
    for role, p in policy.items():
        if p.get("shared_with"):
            parts.append(f"{role} = {p['shared_with']}'s base with adapters disabled (its {p['storage']} weights, "
                         f"shared: no copy)")
        elif p["optimizer_state"] and p.get("adapters"):
            parts.append(f"{role} {p['storage']} base + {p['adapters']} adapters, {p['compute']}")
        elif p["optimizer_state"]:
            parts.append(f"{role} {p['storage']} weights, {p['compute']}")
        else:
            parts.append(f"{role} {p['storage']} (frozen)")
    return "; ".join(parts)
