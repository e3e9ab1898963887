"""Static memory accounting per network, read from the live modules and optimizers.

The numbers are what the tensors occupy (``numel * element_size``), not what an allocator reserved, so
they are the same on CPU and GPU and can be set beside the measured peaks and the analytical model.
All sizes are bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _tensor_bytes(tensor: "torch.Tensor") -> int:
    """Bytes of a tensor's elements (bytes)."""
    return int(tensor.numel()) * int(tensor.element_size())


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
    if ptr and param.numel() > 0:
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
             "shared_params": int}      # elements skipped because an earlier role already counted them

        ``grad_bytes``: a parameter's existing ``.grad`` when there is one; for a trainable parameter
        without one (before the first backward, or after ``zero_grad(set_to_none=True)``) the bytes the
        gradient will take, ``numel * element_size`` of the parameter, because what is wanted is the
        steady-state training footprint, not a snapshot between steps. Frozen parameters: 0.

        ``optimizer_bytes``: only real state tensors (for AdamW: ``exp_avg``, ``exp_avg_sq`` and the
        ``step`` scalar tensor). Before the first optimizer step the state is empty: the role reports 0
        and ``optimizer_state_materialized: False``, meaning the 0 understates the steady state. A role
        with no trainable parameters reports 0 with the flag True (0 is its true value).
    """
    # One lookup from parameter identity to optimizer state, over every distinct optimizer.
    state_by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
    optimized: set[tuple[Any, ...]] = set()  # identity keys of every parameter some optimizer updates
    seen_optimizers: set[int] = set()
    for optimizer in (optimizers or {}).values():
        if optimizer is None or id(optimizer) in seen_optimizers:
            continue
        seen_optimizers.add(id(optimizer))
        for param, state in optimizer.state.items():
            for key in _param_keys(param):
                state_by_key.setdefault(key, state)
        for group in optimizer.param_groups:
            for param in group["params"]:
                optimized.update(_param_keys(param))

    def is_trained(param: "torch.Tensor", keys: list[tuple[Any, ...]]) -> bool:
        # With optimizers given, "trainable" means "some optimizer updates it": libraries leave
        # requires_grad on for networks they never train (TRL's reference copies), and those hold
        # no gradient or optimizer state in steady state.
        if not param.requires_grad:
            return False
        return not seen_optimizers or any(key in optimized for key in keys)

    counted: set[tuple[Any, ...]] = set()  # parameters and buffers already attributed to a role
    result: dict[str, dict[str, Any]] = {}
    for role, module in networks.items():
        entry: dict[str, Any] = {
            "params": 0,
            "trainable_params": 0,
            "weight_bytes": 0,
            "buffer_bytes": 0,
            "grad_bytes": 0,
            "grad_materialized": True,
            "optimizer_bytes": 0,
            "optimizer_state_materialized": True,
            "shared_params": 0,
        }
        if module is None:
            result[role] = entry
            continue
        trainable_without_state = 0
        trainable_with_state = 0
        # parameters() already de-duplicates tied weights (embedding == lm_head) inside one module.
        for param in module.parameters():
            keys = _param_keys(param)
            if any(key in counted for key in keys):
                entry["shared_params"] += int(param.numel())
                continue
            counted.update(keys)
            numel = int(param.numel())
            entry["params"] += numel
            entry["weight_bytes"] += _tensor_bytes(param)
            trained = is_trained(param, keys)
            if param.grad is not None:
                entry["grad_bytes"] += _tensor_bytes(param.grad)
            elif trained:
                entry["grad_bytes"] += _tensor_bytes(param)  # projected: the grad it will hold
                entry["grad_materialized"] = False
            if trained:
                entry["trainable_params"] += numel
            state = next((state_by_key[k] for k in keys if k in state_by_key), None)
            if state:
                entry["optimizer_bytes"] += sum(
                    _tensor_bytes(value) for value in state.values() if _is_tensor(value)
                )
                trainable_with_state += 1
            elif trained:
                trainable_without_state += 1
        for buffer in module.buffers():
            keys = _param_keys(buffer)
            if any(key in counted for key in keys):
                continue
            counted.update(keys)
            entry["buffer_bytes"] += _tensor_bytes(buffer)
        if trainable_without_state and not trainable_with_state:
            entry["optimizer_state_materialized"] = False
        result[role] = entry
    return result


def _is_tensor(value: Any) -> bool:
    """True for torch tensors, without importing torch at module import time."""
    import torch

    return isinstance(value, torch.Tensor)
