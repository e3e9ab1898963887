"""The one precision policy: trained networks keep fp32 master weights, frozen ones may be stored in low precision.

Pure-bf16 AdamW at RL learning rates rounds most updates away: bf16 keeps 8 significant bits, so a weight of
magnitude 0.02 moves only by steps of about 6e-5, and an update of lr 1e-6 x (Adam's ~unit step) never reaches
that spacing (a 20-step check moved 2% of the weights). So every network that an optimizer updates is *stored*
in float32 and *computes* under bf16 autocast where the spec asks for bfloat16; networks that are only read
(the reference, the reward model during PPO) are stored in the spec's dtype, which halves their memory and is
exactly how they are used.

This module imports no torch: the dry run, the report and the tests read the policy as plain data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

TRAINED_ROLES = ("actor", "critic")
"""Roles an optimizer updates during a method run (the reward model trains only in its own stage)."""


@dataclass(frozen=True)
class Precision:
    """How one network is held and run.

    storage: dtype of the weights in memory; compute: dtype of matmuls ('bfloat16 autocast' or the storage
    dtype); optimizer_state: dtype of AdamW's moments (None for a frozen network).
    """

    storage: str
    compute: str
    optimizer_state: str | None

    def to_dict(self) -> dict[str, str | None]:
        return asdict(self)


def autocast_dtype(model_dtype: str) -> str | None:
    """The autocast dtype for a spec dtype: 'bfloat16' runs matmuls in bf16 under autocast; float32 none."""
    return "bfloat16" if model_dtype == "bfloat16" else None


def storage_dtype(model_dtype: str, trained: bool) -> str:
    """float32 for anything an optimizer updates (fp32 master weights); the spec's dtype for frozen networks."""
    return "float32" if trained else model_dtype


def precision_for(model_dtype: str, trained: bool) -> Precision:
    """The policy for one network: ``model_dtype`` is spec.model.dtype ('float32' | 'bfloat16')."""
    auto = autocast_dtype(model_dtype)
    storage = storage_dtype(model_dtype, trained)
    compute = f"{auto} autocast" if auto and trained else storage
    return Precision(storage=storage, compute=compute, optimizer_state="float32" if trained else None)


def precision_policy(model_dtype: str, roles: tuple[str, ...] | list[str],
                     trained_roles: tuple[str, ...] = TRAINED_ROLES) -> dict[str, dict[str, str | None]]:
    """{role: Precision as a dict} for the networks a run keeps resident (recorded in every result)."""
    return {role: precision_for(model_dtype, role in trained_roles).to_dict() for role in roles}


def with_shared_reference(policy: dict[str, dict[str, str | None]],
                          owner: str = "actor") -> dict[str, dict[str, str | None]]:
    """``policy`` with the reference held as ``owner``'s own weights: under LoRA every method's reference is the
    actor's base with its adapters disabled (the engine's ``AdapterOffReference``, TRL's adapter switch), so it
    has the owner's storage and compute, no optimizer state, and ``shared_with: owner`` (no copy of its own).
    Returned unchanged when there is no reference or no owner."""
    if "reference" not in policy or owner not in policy:
        return policy
    return {**policy, "reference": {**policy[owner], "optimizer_state": None, "shared_with": owner}}


def describe_policy(policy: dict[str, dict[str, str | None]]) -> str:
    """One line for the dry run: 'actor fp32 weights, bfloat16 autocast; reference bfloat16 (frozen)'; a shared
    reference (:func:`with_shared_reference`): 'reference = actor's base with adapters disabled (...)'."""
    parts = []
    for role, p in policy.items():
        if p.get("shared_with"):
            parts.append(f"{role} = {p['shared_with']}'s base with adapters disabled (its {p['storage']} weights, "
                         f"shared: no copy)")
        elif p["optimizer_state"]:
            parts.append(f"{role} {p['storage']} weights, {p['compute']}")
        else:
            parts.append(f"{role} {p['storage']} (frozen)")
    return "; ".join(parts)
