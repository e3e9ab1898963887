"""Evidence that training moved the model: which trained weights changed, and by how much.

A run can finish every step, log a falling loss and still leave its weights where they were: a bf16
weight near 0.5 has a spacing of 2**-8 * 0.5 ~ 0.002 between representable values, so an AdamW update of
lr = 1e-6 rounds back to the old value and is lost. Loss curves do not show this; comparing the weights
does. :class:`ParamSnapshot` copies the trainable parameters when training starts and compares them when it
ends:

- ``params_changed_fraction``: the share of trainable ELEMENTS whose stored value differs bit-for-bit
  (``new != old``, in the parameter's own dtype, so a rounded-away update counts as unchanged);
- ``update_to_weight_ratio``: ``||w_end - w_start|| / ||w_start||`` (L2 over all trainable elements
  together, computed in float64);
- ``trainable_params``: the number of trainable elements (``requires_grad=True``; with LoRA, the adapters).

Memory: an exact snapshot holds one host copy of every trainable element (a 7B model in fp32 is 28 GB of
host RAM). Above ``exact_limit`` elements, a fixed, seeded sample of elements per tensor is kept instead
(``sample_elements`` in all, spread over tensors in proportion to their size) and both figures are
estimated from it; ``method`` says which (``"exact"`` or ``"sampled (N elements)"``).

This module imports torch lazily (inside the functions) so that importing the telemetry package stays light.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

EXACT_LIMIT = 200_000_000
"""Trainable elements above which the snapshot samples (200M elements = 800 MB of fp32 host copies)."""
SAMPLE_ELEMENTS = 1_000_000
"""Elements kept in sampled mode, over all tensors: the standard error of the changed share is then at most
sqrt(0.25 / 1e6) = 0.0005, far below the 50% line the report flags."""
SAMPLE_SEED = 0
"""Seed of the sampled element positions (fixed, so two runs sample the same positions)."""


@dataclass
class _Entry:
    """One parameter's start values: the whole tensor (exact) or the values at ``index`` (sampled)."""

    numel: int
    """Elements of the parameter."""
    values: Any
    """torch.Tensor on CPU, flattened, in the parameter's own dtype."""
    index: Any = None
    """torch.LongTensor of sampled flat positions (with repetition); None in exact mode."""


@dataclass
class ParamSnapshot:
    """Start values of a model's trainable parameters, to compare with the same model after training."""

    entries: dict[str, _Entry] = field(default_factory=dict)
    """By parameter name (``named_parameters``; tied weights appear once)."""
    trainable_params: int = 0
    """Trainable elements in the model at snapshot time."""
    sampled: bool = False
    """True when only a sample of elements was kept (see the module docstring)."""
    snapshot_s: float = 0.0
    """Seconds spent copying (measurement overhead, excluded from training time by the caller)."""

    @classmethod
    def take(cls, model: Any, exact_limit: int = EXACT_LIMIT, sample_elements: int = SAMPLE_ELEMENTS,
             seed: int = SAMPLE_SEED) -> "ParamSnapshot":
        """Copy (detached, to CPU) every parameter of ``model`` with ``requires_grad=True``.

        Args:
            model: a ``torch.nn.Module``.
            exact_limit: trainable elements above which only a sample is kept.
            sample_elements: elements kept in sampled mode, in total (at least one per tensor).
            seed: seed of the sampled positions.
        """
        import torch

        start = time.perf_counter()
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        total = sum(p.numel() for _, p in named)
        snap = cls(trainable_params=total, sampled=total > exact_limit)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in named:
                flat = p.detach().reshape(-1)
                if snap.sampled:
                    k = max(1, round(sample_elements * p.numel() / total))
                    # With repetition: randperm would need numel * 8 bytes for the largest tensor.
                    index = torch.randint(0, p.numel(), (k,), generator=generator)
                    values = flat[index.to(flat.device)].to("cpu", copy=True)
                    snap.entries[name] = _Entry(p.numel(), values, index)
                else:
                    snap.entries[name] = _Entry(p.numel(), flat.to("cpu", copy=True))
        snap.snapshot_s = time.perf_counter() - start
        return snap

    @property
    def method(self) -> str:
        """'exact' or 'sampled (N elements)'."""
        if not self.sampled:
            return "exact"
        return f"sampled ({sum(e.values.numel() for e in self.entries.values())} elements)"

    @property
    def host_bytes(self) -> int:
        """Bytes of host memory the snapshot holds (its copied values and, when sampled, their positions)."""
        return sum(e.values.numel() * e.values.element_size()
                   + (e.index.numel() * e.index.element_size() if e.index is not None else 0)
                   for e in self.entries.values())

    def compare(self, model: Any) -> dict[str, Any]:
        """Compare ``model``'s current parameters with the snapshot.

        Returns:
            ``params_changed_fraction`` (0..1, share of trainable elements whose value changed),
            ``update_to_weight_ratio`` (L2 ratio; None when the start weights are all zero),
            ``trainable_params`` (elements), ``method`` ('exact' / 'sampled (N elements)'),
            ``missing_params`` (names in the snapshot the model no longer has, e.g. after a LoRA merge;
            they are left out of both figures) and ``compare_s`` / ``snapshot_s`` (seconds).
        """
        import torch

        start = time.perf_counter()
        params = dict(model.named_parameters())
        changed = 0.0
        diff_sq = 0.0
        start_sq = 0.0
        counted = 0
        missing = []
        with torch.no_grad():
            for name, entry in self.entries.items():
                p = params.get(name)
                if p is None or p.numel() != entry.numel:
                    missing.append(name)
                    continue
                tensor_changed, tensor_diff_sq, tensor_start_sq = _compare_entry(p, entry)
                counted += entry.numel
                # Sampled: each element stands for numel / k elements of its tensor (stratified estimate).
                weight = entry.numel / entry.values.numel()
                changed += weight * tensor_changed
                diff_sq += weight * tensor_diff_sq
                start_sq += weight * tensor_start_sq
        return {
            "params_changed_fraction": changed / counted if counted else None,
            "update_to_weight_ratio": math.sqrt(diff_sq) / math.sqrt(start_sq) if start_sq > 0 else None,
            "trainable_params": self.trainable_params,
            "method": self.method,
            "missing_params": missing,
            "snapshot_s": self.snapshot_s,
            "compare_s": time.perf_counter() - start,
        }


def _compare_entry(param: Any, entry: _Entry) -> tuple[int, float, float]:
    """(changed elements, sum of squared differences, sum of squared start values) over the kept elements."""
    flat = param.detach().reshape(-1)
    now = flat[entry.index.to(flat.device)] if entry.index is not None else flat
    now = now.to("cpu")
    changed = int((now != entry.values).sum())
    old = entry.values.double()
    diff_sq = float((now.double() - old).square().sum())
    return changed, diff_sq, float(old.square().sum())


# -- did the movement come from learning? ---------------------------------------------------------------
# A changed weight is not yet learning: AdamW divides each gradient by its own running scale, so a gradient of pure
# noise (a reference that disagrees with the actor by numerics alone, KL ~ 0.002 before any update) still moves
# nearly every weight by about the learning rate, and decoupled weight decay moves every weight whatever the
# gradient. Two checks separate that from learning: whether the reward ever told completions apart (a GRPO group
# whose G rewards are equal has advantage 0: no signal), and whether the weights moved further than weight decay
# alone would have moved them.

VERDICTS = ("moved", "no learning signal", "within the weight-decay floor", "mostly rounded away",
            "unchanged (learning rate 0)", "not moved", "not measured")
"""``training_change["verdict"]``, in the order :func:`assess_training_change` tests them."""
FLOOR_MARGIN = 0.05
"""Relative margin above the weight-decay floor that movement must clear to count as beyond it."""
ROUNDED_AWAY_BELOW = 0.5
"""params_changed_fraction below which a run's updates were mostly lost (bf16 storage; the report's 50% line)."""


def weight_decay_floor(learning_rate: float, weight_decay: float, steps: int) -> float:
    """The update-to-weight ratio that decoupled weight decay alone produces over ``steps`` optimizer steps at
    most: AdamW multiplies every decayed weight by (1 - lr x wd) each step, so ||w_end - w_0|| / ||w_0|| =
    1 - (1 - lr x wd)^steps exactly at a constant ``learning_rate`` (a schedule that never exceeds it, or decay on
    a subset of the weights, as TRL's trainers leave biases and norms undecayed, moves less). 0 without decay."""
    if weight_decay <= 0 or learning_rate <= 0 or steps <= 0:
        return 0.0
    return 1.0 - (1.0 - learning_rate * weight_decay) ** steps


def learning_signal(curves: list[dict[str, Any]], metrics: dict[str, Any]) -> dict[str, Any]:
    """``result["learning_signal"]``: whether the reward ever told a prompt's completions apart.

    Read from ``metrics["zero_std_groups_mean"]`` (the suite engine: the mean over every step) or else the
    ``zero_std_groups`` curve points (TRL's GRPO: each point the mean over the steps since the last one). Returns
    {'zero_std_groups_mean': share of groups (0..1) whose G rewards were all equal, or None for a method without
    groups (DPO), 'source': where it was read, 'no_learning_signal': True when every group of every step had equal
    rewards (the group-relative advantage was 0 everywhere; any movement of the weights is then noise), False
    when some group had a spread, None when not measured}."""
    mean = metrics.get("zero_std_groups_mean")
    source = "every step (suite engine)"
    if not isinstance(mean, (int, float)):
        points = [p["zero_std_groups"] for p in curves if isinstance(p.get("zero_std_groups"), (int, float))]
        mean = sum(points) / len(points) if points else None
        source = "logged curve points (each the mean since the last)" if points else "not measured (no groups)"
    none = None if mean is None else bool(mean >= 1.0)
    return {"zero_std_groups_mean": mean, "source": source, "no_learning_signal": none}


def assess_training_change(change: dict[str, Any], signal: dict[str, Any], learning_rate: float,
                           weight_decay: float, steps: int) -> dict[str, Any]:
    """``change`` (:meth:`ParamSnapshot.compare`'s dict, or a 'reason' when not measured) with three more keys:

    - ``weight_decay_floor``: :func:`weight_decay_floor` for the run's base learning rate, decay and optimizer steps;
    - ``moved_beyond_floor``: update_to_weight_ratio above that floor (None when not measured);
    - ``verdict``: one of :data:`VERDICTS` — 'unchanged (learning rate 0)' for the control arm, 'no learning signal'
      when ``signal`` says no group ever had a reward spread (whatever moved), 'within the weight-decay floor',
      'mostly rounded away' (fewer than half the weights changed), 'not moved', else 'moved'.
    """
    out = dict(change)
    floor = weight_decay_floor(learning_rate, weight_decay, steps)
    ratio, fraction = change.get("update_to_weight_ratio"), change.get("params_changed_fraction")
    out["weight_decay_floor"] = floor
    # Margins: every decayed float32 weight is rounded once a step (by at most 2**-24 of it), so decay alone can
    # measure a little above the closed form; movement counts only past FLOOR_MARGIN and that rounding.
    beyond = None if ratio is None else bool(ratio > floor * (1 + FLOOR_MARGIN) + steps * 2.0**-24)
    out["moved_beyond_floor"] = beyond
    if fraction is None or ratio is None:
        verdict = "not measured"
    elif learning_rate == 0:
        verdict = "unchanged (learning rate 0)" if fraction == 0 else "moved"  # moved at lr 0: a pipeline fault
    elif signal.get("no_learning_signal"):
        verdict = "no learning signal"
    elif fraction == 0:
        verdict = "not moved"
    elif not beyond:
        verdict = "within the weight-decay floor"
    elif fraction < ROUNDED_AWAY_BELOW:
        verdict = "mostly rounded away"
    else:
        verdict = "moved"
    out["verdict"] = verdict
    return out
