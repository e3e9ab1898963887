"""Networks resident while training: one row per (method, role) with its precision and static bytes.

The memory figure stacks these bytes, but a reader also needs to see *which* networks a method keeps, how each
is stored and computed (``settings["precision"]``: fp32 master weights under bf16 autocast vs a frozen bf16
copy), and what each costs. Bytes come from ``memory["networks"]`` (bench.telemetry.accounting: counted from
the live modules and the optimizer's real state tensors), so every byte column is labelled "accounting".

A network that reuses another's weights (``shared_with``, e.g. a LoRA reference: the actor's base with adapters
disabled) is shown as "shared with actor (0 B own weights)", not as a second copy.

Two accounting flags change what a number means, and the table says so instead of printing a bare figure:
``optimizer_state_materialized: False`` with 0 bytes means the optimizer had not stepped when it was counted
(not measured, not zero); ``grad_materialized: False`` means some gradients were counted from parameter shapes
because no ``.grad`` existed at that moment.
"""

from __future__ import annotations

from typing import Any

from bench.report import fmt
from bench.report.load import Run, Suite

ROLES = ("actor", "critic", "reward", "reference")
"""Known roles in display order; any other role a recipe records follows them."""

HEADER = ["method", "network", "params", "storage dtype", "compute", "optimizer state dtype",
          "weights (MiB, accounting)", "grads (MiB, accounting)", "optimizer (MiB, accounting)",
          "total (MiB, accounting)"]
ALL_NETWORKS = "all (sum)"
"""The per-method total row: weights, grads and optimizer of every resident network added up."""
FROM_SHAPES = " †"
"""Marks gradient bytes counted from parameter shapes (no ``.grad`` existed when the run counted)."""
NOTE_FROM_SHAPES = ("† gradient bytes counted from parameter shapes: no .grad existed when the run counted "
                    "(the steady-state size, not a reading).")
NO_STEP = "not measured (no optimizer step yet)"
NOTE_NO_STEP = (f"'{NO_STEP}': the optimizer state was empty when the run counted, so "
                "its size is unknown, not zero.")


NOTE_SHARED = ("'shared with actor': the network reuses the actor's weights (under LoRA, the reference is the "
               "actor's base model with its adapters disabled), so it holds no copy of its own; its parameters are "
               "counted once, under the actor.")


def _networks(run: Run) -> dict[str, dict[str, Any]]:
    nets = run.result.get("memory", {}).get("networks") or {}
    return {k: v for k, v in nets.items() if isinstance(v, dict)}


def _precision(run: Run) -> dict[str, dict[str, Any]]:
    policy = (run.result.get("settings") or {}).get("precision")
    return {k: v for k, v in policy.items() if isinstance(v, dict)} if isinstance(policy, dict) else {}


def _roles(run: Run) -> list[str]:
    found = list(dict.fromkeys([*_networks(run), *_precision(run)]))
    return [r for r in ROLES if r in found] + [r for r in found if r not in ROLES]


def shared_with(entry: dict[str, Any] | None, policy: dict[str, Any] | None = None) -> list[str]:
    """The earlier roles whose weights this network reuses (``memory.networks.<net>.shared_with``, else the
    precision policy's): ['actor'] for a LoRA reference that is the actor's base with adapters disabled."""
    for found in ((entry or {}).get("shared_with"), (policy or {}).get("shared_with")):
        if isinstance(found, str) and found:
            return [found]
        if isinstance(found, (list, tuple)) and found:
            return [str(f) for f in found]
    return []


def role_text(role: str, entry: dict[str, Any] | None, policy: dict[str, Any] | None = None) -> str:
    """'reference: shared with actor (0 B own weights)' for a network that reuses another's weights, else the role.

    Under LoRA the engine's reference is the actor with adapters disabled: one copy of the weights serves both,
    so the row must not read as a second copy."""
    shared = shared_with(entry, policy)
    if not shared:
        return role
    own = fmt.num((entry or {}).get("weight_bytes"))
    own_text = "0 B own weights" if own == 0 else (f"{fmt.mib_number(own)} MiB own weights" if own is not None
                                                   else "own weights not recorded")
    return f"{role}: shared with {', '.join(shared)} ({own_text})"


def _params_text(entry: dict[str, Any]) -> str:
    """'66,176', plus the trained share when it is not all ('66,176 (1,024 trained)' with LoRA) and the
    elements shared with an earlier role (a LoRA reference is the actor's frozen base: counted once)."""
    text = fmt.int_text(entry.get("params"))
    trained = fmt.num(entry.get("trainable_params"))
    if trained and trained != fmt.num(entry.get("params")):
        text += f" ({int(trained):,} trained)"
    shared = fmt.num(entry.get("shared_params"))
    if shared:
        owners = ", ".join(shared_with(entry)) or "an earlier network"
        text += f" (+{int(shared):,} shared with {owners}, counted there)"
    return text


def _grad_text(entry: dict[str, Any]) -> str:
    text = fmt.mib_number(entry.get("grad_bytes"))
    return text + FROM_SHAPES if entry.get("grad_materialized") is False and text != fmt.MISSING else text


def _optimizer_unknown(entry: dict[str, Any]) -> bool:
    """True when the optimizer state was counted before the first step: its 0 bytes are not a measurement."""
    return entry.get("optimizer_state_materialized") is False and not fmt.num(entry.get("optimizer_bytes"))


def _optimizer_text(entry: dict[str, Any]) -> str:
    return NO_STEP if _optimizer_unknown(entry) else fmt.mib_number(entry.get("optimizer_bytes"))


def _total_text(entry: dict[str, Any]) -> str:
    """Weights + grads + optimizer in MiB; the dash when any part is unknown (a partial sum would mislead)."""
    return _sum_row("", [entry])[-1]


def _row(name: str, role: str, entry: dict[str, Any] | None, policy: dict[str, Any] | None) -> list[str]:
    policy = policy or {}
    if policy:
        storage, compute = fmt.value_text(policy.get("storage")), fmt.value_text(policy.get("compute"))
        opt = policy.get("optimizer_state")
        opt_dtype = fmt.value_text(opt) if opt else "none (frozen)"
    else:
        storage = compute = opt_dtype = "not recorded"
    if entry is None:
        sizes = [fmt.NOT_MEASURED] * 4
    else:
        sizes = [fmt.mib_number(entry.get("weight_bytes")), _grad_text(entry), _optimizer_text(entry),
                 _total_text(entry)]
    params = fmt.NOT_MEASURED if entry is None else _params_text(entry)
    return [name, role_text(role, entry, policy), params, storage, compute, opt_dtype, *sizes]


def _sum_row(name: str, entries: list[dict[str, Any]]) -> list[str]:
    """The :data:`ALL_NETWORKS` row: static totals per column over ``entries`` (a dash where any part is
    unknown), in MiB; its last cell is the whole static footprint."""
    def total(key: str) -> float | None:
        values = [fmt.num(e.get(key)) for e in entries]
        return None if any(v is None for v in values) else sum(values)

    weights, grads = total("weight_bytes"), total("grad_bytes")
    optimizer = None if any(_optimizer_unknown(e) for e in entries) else total("optimizer_bytes")
    whole = None if None in (weights, grads, optimizer) else weights + grads + optimizer
    return [name, ALL_NETWORKS, fmt.int_text(total("params")), "", "", "",
            fmt.mib_number(weights), fmt.mib_number(grads), fmt.mib_number(optimizer), fmt.mib_number(whole)]


def network_table(suite: Suite) -> fmt.Table:
    """One row per (method label, role); empty when no method recorded networks or a precision policy.

    Seeds of a method keep the same networks, so each label is shown once, from its first ok run that
    recorded them.
    """
    runs = fmt.first_per_label(suite.methods, lambda r: bool(_networks(r) or _precision(r)))
    rows = []
    for run in runs:
        nets, policy = _networks(run), _precision(run)
        rows += [_row(run.label, role, nets.get(role), policy.get(role)) for role in _roles(run)]
        if len(nets) > 1:
            rows.append(_sum_row(run.label, list(nets.values())))
    if not rows:
        return fmt.Table([], [])
    notes = ["Storage: the dtype the weights are kept in; compute: the dtype the forward and backward run in "
             "(bfloat16 autocast over float32 master weights, or the storage dtype); optimizer state: AdamW's "
             "moments (none for a frozen network). Bytes are static accounting from the live modules and the "
             "optimizer's state tensors, not a measured peak."]
    flat = [c for row in rows for c in row]
    if any(c.endswith(FROM_SHAPES) for c in flat):
        notes.append(NOTE_FROM_SHAPES)
    if NO_STEP in flat:
        notes.append(NOTE_NO_STEP)
    if any(": shared with " in row[1] for row in rows):
        notes.append(NOTE_SHARED)
    return fmt.Table(list(HEADER), rows, notes)


def static_total_text(run: Run) -> str:
    """'0.76 MiB (accounting; actor, reference)': the run's static total for the headline, or 'not measured'.

    Unknown when any network's optimizer state was not yet materialised (a partial sum would understate it).
    """
    nets = _networks(run)
    if not nets:
        return fmt.NOT_MEASURED
    total = _sum_row("", list(nets.values()))[-1]
    if total == fmt.MISSING:
        return fmt.NOT_MEASURED
    roles = [r + (f" shared with {', '.join(shared_with(nets[r]))}" if shared_with(nets[r]) else "")
             for r in _roles(run) if r in nets]
    return f"{total} MiB (accounting; {', '.join(roles)})"
