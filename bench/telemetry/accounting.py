"""Static memory accounting per network, read from the live modules and optimizers.

The numbers are what the tensors occupy (``numel * element_size``), not what an allocator reserved, so
they are the same on CPU and GPU and can be set beside the measured peaks and the analytical model.
All sizes are bytes.

A parameter partitioned by DeepSpeed ZeRO-3 holds an empty local tensor and its full element count in
``ds_numel``: it is counted by that full shape (the whole network, as for every other layout; the per-rank
measured peaks show the sharding), and the role's ``partitioned_params`` says how many elements were.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _numel(tensor: "torch.Tensor") -> int:
    """Elements of a tensor: its full shape's (``ds_numel``) for a parameter DeepSpeed ZeRO-3 partitioned."""
    full = getattr(tensor, "ds_numel", None)
    return int(full) if isinstance(full, int) else int(tensor.numel())


def _tensor_bytes(tensor: "torch.Tensor") -> int:
    """Bytes of a tensor's elements (bytes), by its full shape when it is ZeRO-3-partitioned."""
    return _numel(tensor) * int(tensor.element_size())


def _param_keys(param: "torch.Tensor") -> list[tuple[Any, ...]]:
    """Identity keys of a parameter: the object itself, and where its data lives.

    The data pointer catches two Parameter objects over the same memory (a reference model built
    from the policy's storage); the object id catches the plain case and tensors without storage
    (meta tensors, empty tensors report a data pointer of 0).
    """
    keys: list[tuple[Any, ...]] = [("id", id(param))]
    try:
        ptr = param.data_ptr()
    except (RuntimeError, NotImplementedError):  # e.g. tensor subclasses without storage
        ptr = 0
    if ptr and param.numel() > 0 and not hasattr(param, "ds_numel"):  # a partition's storage is not the param's
        keys.append(("ptr", str(param.device), ptr, param.dtype, int(param.numel())))
    return keys


def account_networks(
    networks: dict[str, "torch.nn.Module"],
    optimizers: dict[str, "torch.optim.Optimizer"] | None = None,
) -> dict[str, dict[str, Any]]:
    """Parameter counts and bytes of weights, gradients and optimizer state per network role.

    Args:
        networks: modules by role ('actor', 'critic', 'reward', 'reference'); the order matters for
            sharing: a parameter reachable from two roles (same tensor object or same data pointer)
            is counted once, under the role that comes first. With LoRA, pass the policy first: the
            reference (the frozen base of the same model) then reports only what it does not share.
        optimizers: optimizers by role. Every optimizer given is searched for every role's
            parameters, so one optimizer over actor + critic parameters is attributed correctly.

    Returns:
        Per role::

            {"params": int,             # elements of the parameters counted for this role
             "trainable_params": int,   # of which trained: requires_grad and, when optimizers are given,
                                       # updated by one of them (LoRA adapters, full fine-tuning)
             "weight_bytes": int,       # parameters only; buffers (rotary tables, ...) are in buffer_bytes
             "buffer_bytes": int,       # registered buffers, not counted as weights
             "grad_bytes": int,         # see below
             "grad_materialized": bool, # False when some trainable parameter had no .grad yet
             "optimizer_bytes": int,    # tensors in optimizer.state for this role's parameters
             "optimizer_state_materialized": bool,
             "partitioned_params": int, # of params, elements counted by their full shape (ds_numel) because
                                       # DeepSpeed ZeRO-3 held only a partition on this rank (0 otherwise)
             "shared_params": int,      # elements skipped because an earlier role already counted them
             "shared_with": list[str]}  # those earlier roles, in order (['actor'] for a LoRA reference that is
                                       # the actor's base with adapters off: its weights cost nothing extra)

        ``grad_bytes``: a parameter's existing ``.grad`` when there is one; for a trainable parameter
        without one (before the first backward, or after ``zero_grad(set_to_none=True)``) the bytes the
        gradient will take, ``numel * element_size`` of the parameter, because what is wanted is the
        steady-state training footprint, not a snapshot between steps. Frozen parameters: 0.

        ``optimizer_bytes``: only real state tensors (for AdamW: ``exp_avg``, ``exp_avg_sq`` and the
        ``step`` scalar tensor). Before the first optimizer step the state is empty: the role reports 0
        and ``optimizer_state_materialized: False``, meaning the 0 understates the steady state. A role
        with no trainable parameters reports 0 with the flag True (0 is its true value).
    """
    index = _index_optimizers(optimizers or {})
    counted: dict[tuple[Any, ...], str] = {}  # parameters and buffers already attributed -> the role that has them
    return {role: _account_role(role, module, index, counted) for role, module in networks.items()}


@dataclass
class _OptimizerIndex:
    """Every given optimizer's parameters and state, looked up by parameter identity (see :func:`_param_keys`)."""

    state_by_key: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    """Identity key -> that parameter's optimizer state (AdamW: exp_avg, exp_avg_sq, step)."""
    optimized: set[tuple[Any, ...]] = field(default_factory=set)
    """Identity keys of every parameter some optimizer updates (in any param group)."""
    any_optimizer: bool = False
    """Whether any optimizer was given: without one, requires_grad alone decides what is trained."""

    def state_of(self, keys: list[tuple[Any, ...]]) -> dict[str, Any] | None:
        """The optimizer state of the parameter with these identity keys, or None (none yet, or frozen)."""
        return next((self.state_by_key[k] for k in keys if k in self.state_by_key), None)

    def trains(self, param: "torch.Tensor", keys: list[tuple[Any, ...]]) -> bool:
        """Whether ``param`` is trained: requires_grad and, when optimizers are given, updated by one of them.

        Why both: libraries leave requires_grad on for networks they never train (TRL's reference copies),
        and those hold no gradient or optimizer state in steady state.
        """
        if not param.requires_grad:
            return False
        return not self.any_optimizer or any(key in self.optimized for key in keys)


def _index_optimizers(optimizers: dict[str, "torch.optim.Optimizer | None"]) -> _OptimizerIndex:
    """One index over every distinct optimizer (one optimizer given under two roles is read once)."""
    index = _OptimizerIndex()
    seen: set[int] = set()
    for optimizer in optimizers.values():
        if optimizer is None or id(optimizer) in seen:
            continue
        seen.add(id(optimizer))
        index.any_optimizer = True
        for param, state in optimizer.state.items():
            for key in _param_keys(param):
                index.state_by_key.setdefault(key, state)
        for group in optimizer.param_groups:
            for param in group["params"]:
                index.optimized.update(_param_keys(param))
    return index


def _empty_entry() -> dict[str, Any]:
    """A role's accounting before anything is counted (the flags start True: nothing is missing yet)."""
    return {"params": 0, "trainable_params": 0, "weight_bytes": 0, "buffer_bytes": 0, "grad_bytes": 0,
            "grad_materialized": True, "optimizer_bytes": 0, "optimizer_state_materialized": True,
            "partitioned_params": 0, "shared_params": 0, "shared_with": []}


def _account_role(role: str, module: "torch.nn.Module | None", index: _OptimizerIndex,
                  counted: dict[tuple[Any, ...], str]) -> dict[str, Any]:
    """One role's entry (see :func:`account_networks`); adds what it counts to ``counted`` (sharing)."""
    entry = _empty_entry()
    if module is None:
        return entry
    with_state, without_state = _account_parameters(role, module, index, counted, entry)
    _account_buffers(role, module, counted, entry)
    # Trainable parameters, none with state yet: before the first optimizer step, so 0 understates it.
    entry["optimizer_state_materialized"] = not (without_state and not with_state)
    return entry


def _account_parameters(role: str, module: "torch.nn.Module", index: _OptimizerIndex,
                        counted: dict[tuple[Any, ...], str], entry: dict[str, Any]) -> tuple[int, int]:
    """Add the module's not-yet-counted parameters to ``entry`` (bytes); a shared one goes to shared_params.

    Returns (parameters with optimizer state, trained parameters without it), for the materialized flag.
    ``module.parameters()`` already de-duplicates tied weights (embedding == lm_head) inside one module.
    """
    with_state = without_state = 0
    for param in module.parameters():
        keys = _param_keys(param)
        numel = _numel(param)
        owner = _owner(keys, counted)
        if owner is not None:
            entry["shared_params"] += numel
            _note_shared(entry, owner, role)
            continue
        counted.update(dict.fromkeys(keys, role))
        entry["params"] += numel
        if hasattr(param, "ds_numel"):
            entry["partitioned_params"] += numel
        entry["weight_bytes"] += _tensor_bytes(param)
        trained = index.trains(param, keys)
        _account_grad(param, trained, entry)
        if trained:
            entry["trainable_params"] += numel
        state = index.state_of(keys)
        if state:
            entry["optimizer_bytes"] += sum(_tensor_bytes(value) for value in state.values() if _is_tensor(value))
            with_state += 1
        elif trained:
            without_state += 1
    return with_state, without_state


def _account_grad(param: "torch.Tensor", trained: bool, entry: dict[str, Any]) -> None:
    """Add the gradient's bytes: the existing ``.grad``, else (trained) the projected one, else nothing."""
    if param.grad is not None:
        entry["grad_bytes"] += _tensor_bytes(param.grad)
    elif trained:
        entry["grad_bytes"] += _tensor_bytes(param)  # projected: the grad it will hold
        entry["grad_materialized"] = False


def _account_buffers(role: str, module: "torch.nn.Module", counted: dict[tuple[Any, ...], str],
                     entry: dict[str, Any]) -> None:
    """Add the module's not-yet-counted registered buffers (rotary tables, ...) to buffer_bytes."""
    for buffer in module.buffers():
        keys = _param_keys(buffer)
        owner = _owner(keys, counted)
        if owner is not None:
            _note_shared(entry, owner, role)
            continue
        counted.update(dict.fromkeys(keys, role))
        entry["buffer_bytes"] += _tensor_bytes(buffer)


def _owner(keys: list[tuple[Any, ...]], counted: dict[tuple[Any, ...], str]) -> str | None:
    """The role that already counted a tensor with these identity keys, or None."""
    return next((counted[key] for key in keys if key in counted), None)


def _note_shared(entry: dict[str, Any], owner: str, role: str) -> None:
    """Record that ``role`` reuses tensors another role counted (each owner once, in order of first reuse)."""
    if owner != role and owner not in entry["shared_with"]:
        entry["shared_with"].append(owner)


def _is_tensor(value: Any) -> bool:
    """True for torch tensors, without importing torch at module import time."""
    import torch

    return isinstance(value, torch.Tensor)
