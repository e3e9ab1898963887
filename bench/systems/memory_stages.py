"""The memory model of the stages a method reads (their own worker processes, before the method runs): the sample
pool (``bench.execution.sample_pool``: the starting policy, frozen, generating the pool) and the reward model
(``baselines.reward_model``: TRL's RewardTrainer training a sequence classifier on the pool's pairs). Each is
predicted like a method run: static bytes per network (exact), the phases on top of what stays resident between
steps, the peak. The arithmetic is :mod:`bench.systems.memory_terms`; the model as a whole is described in
:mod:`bench.systems.memory_model`. All sizes are bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from bench.systems.memory_phases import (Moments, generation_moments, layer_gradient, layers_saved,
                                         optimizer_step_terms, outside_allocator, peak_moment, peak_of, rebuilt_layer,
                                         totals, trained_net, transient_cast)
from bench.systems.memory_terms import (NetworkMemory, Settings, Shape, final_norm_bytes,
                                        forward_working_bytes, network_memory)
from bench.systems.memory_vllm import stage_generation, start_problem

STAGES_OF: dict[str, tuple[str, ...]] = {
    "ppo": ("sample_pool", "reward_model"),
    "dpo": ("sample_pool",),
}
"""The memory-relevant stages each method reads (``baselines/*.py`` ``needs``; the warm start, shared by every
method, saves the starting checkpoint and is not modelled: with ``warm_start.enabled`` false it trains nothing)."""


@dataclass
class StagePrediction:
    """One stage's predicted memory on one GPU."""

    stage: str
    networks: dict[str, NetworkMemory]
    static_bytes: int
    """The static accounting (weights, gradients, AdamW state) of its networks."""
    resident_bytes: int
    """What stays resident between steps (TRL's RewardTrainer frees the gradients after each step)."""
    phases: dict[str, dict[str, int]]
    moments: dict[str, Moments]
    peak_bytes: int
    peak_phase: str
    outside_allocator: dict[str, int]
    fits: bool
    max_micro_batch: int | None = None
    """The reward-model stage: the largest micro-batch (pairs) that fits (0: none)."""

    @property
    def device_peak_bytes(self) -> int:
        return self.peak_bytes + sum(self.outside_allocator.values())

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "static_bytes": self.static_bytes, "resident_bytes": self.resident_bytes,
                "networks": {r: {**asdict(n), "static_bytes": n.static_bytes} for r, n in self.networks.items()},
                "phases": self.phases, "moments": self.moments, "peak_bytes": self.peak_bytes,
                "peak_phase": self.peak_phase, "peak_moment": peak_moment(self.moments, self.peak_phase),
                "outside_allocator": self.outside_allocator, "device_peak_bytes": self.device_peak_bytes,
                "fits": self.fits, "max_micro_batch": self.max_micro_batch}


def reward_model_pairs_per_micro_batch(s: Settings) -> int:
    """Pairs per forward/backward of the reward-model stage (``baselines.reward_model.pair_micro_batch``): the
    largest divisor of ``reward_model.batch_size`` not above ``train.micro_batch_size`` (0, or at least the batch:
    the whole batch)."""
    batch, micro = s.reward_model_pairs, s.micro_batch_size
    if not micro or micro >= batch:
        return batch
    return max(d for d in range(1, micro + 1) if batch % d == 0)


def reward_model_moments(shape: Shape, s: Settings, net: NetworkMemory) -> dict[str, Moments]:
    """The reward-model stage's phases. RewardTrainer runs chosen and rejected of a micro-batch's pairs as one
    forward of 2 x pairs sequences of prompt + completion tokens under autocast (gradient checkpointing per
    ``gradient_checkpointing``); the ``score`` row reads every position's hidden state (a bf16 cast of the whole
    float32 final-norm output); gradients exist from the first backward to the optimizer step. The held-out
    accuracy (``pairwise_accuracy``) runs ``reward_model_eval_pairs`` pairs per forward in the actor's numerics
    (``bench.model.numerics.actor_numerics``: bf16 autocast with its cache off, a float32 residual stream), with
    the optimizer state resident: one layer's working set, the float32 last hidden state and one transient cast."""
    L = s.prompt_tokens + s.completion_tokens
    sequences = 2 * reward_model_pairs_per_micro_batch(s)
    tokens, compute, h, ck = sequences * L, s.compute, shape.hidden, s.gradient_checkpointing
    t = trained_net(shape, s, net)
    score_cast = 2 * h if t.casts else 0
    casts = t.casts + score_cast
    saved = (layers_saved(shape, t, tokens, ck)
             + final_norm_bytes(shape, compute, tokens, None, t.residual, t.norms_trained, head_input=True))
    grads = net.gradients_bytes
    held_casts = 0 if ck else casts
    update: Moments = {
        "forward": {"gradients": grads, "weight_casts": casts, "activations": saved,
                    "layer_working": forward_working_bytes(shape, compute, tokens) if ck else 0},
        "backward": {"gradients": grads, "casts_saved": held_casts, "activations": saved,
                     "rebuilt_layer": rebuilt_layer(t, tokens) if ck else 0,
                     "weight_gradient": layer_gradient(shape, s, t, tokens)},
        "embedding gradient": {"gradients": grads, "weight_gradient": t.embedding_gradient},
    }
    step = {"gradients": grads, **optimizer_step_terms(s, {"reward": net})}
    eval_tokens = 2 * s.reward_model_eval_pairs * L
    evaluation = {"forward_working": forward_working_bytes(shape, compute, eval_tokens),
                  "last_hidden_state": 4 * h * eval_tokens, "weight_casts": transient_cast(shape, s, net)}
    return {"update": update, "optimizer_step": {"step": step}, "evaluation": {"held-out accuracy": evaluation}}


def sample_pool_moments(shape: Shape, s: Settings) -> dict[str, Moments]:
    """The sample-pool stage's one phase that matters: generate calls of ``pool_batch_size`` prompts x
    ``pool_samples`` completions from the starting policy stored in the spec's dtype, sampled in the actor's
    numerics (bf16 autocast, a float32 residual stream: K float32, V bf16; the bf16 weights need no cast)."""
    if s.generation_backend == "vllm":  # the pool decodes in vLLM: its whole share while it generates
        return {"generation": stage_generation(shape, s)}
    sequences = s.pool_batch_size * s.pool_samples
    return {"generation": generation_moments(shape, s, sequences, s.prompt_tokens, s.completion_tokens, 4, s.compute,
                                             0)}


def stage_memory(shape: Shape, stage: str, s: Settings) -> StagePrediction:
    """The prediction for ``stage`` ('sample_pool' or 'reward_model') on one GPU."""
    if stage == "reward_model":
        net = network_memory(shape, "reward", replace(s, lora_rank=0), trained=True)
        nets = {"reward": net}
        moments = reward_model_moments(shape, s, net)
        resident = net.static_bytes - net.gradients_bytes
    elif stage == "sample_pool":
        net = network_memory(shape, "actor", s, trained=False)
        nets = {"actor": net}
        moments = sample_pool_moments(shape, s)
        resident = net.static_bytes
    else:
        raise ValueError(f"unknown stage {stage!r}; modelled: reward_model, sample_pool")
    phases = totals(moments)
    peak, phase = peak_of(resident, phases)
    outside = outside_allocator(s)
    blocked = stage == "sample_pool" and start_problem(shape, stage, s) is not None  # vLLM could not start
    return StagePrediction(stage, nets, sum(n.static_bytes for n in nets.values()), resident, phases, moments, peak,
                           phase, outside, peak + sum(outside.values()) <= s.gpu_memory_bytes and not blocked)


def stages_for(shape: Shape, method: str, s: Settings) -> dict[str, StagePrediction]:
    """Every modelled stage ``method`` reads, predicted; the reward model's largest micro-batch searched."""
    out = {}
    for stage in STAGES_OF.get(method, ()):
        prediction = stage_memory(shape, stage, s)
        if stage == "reward_model":
            prediction.max_micro_batch = _largest_fitting(
                lambda mb: stage_memory(shape, stage, replace(s, micro_batch_size=mb)).fits, s.reward_model_pairs)
        out[stage] = prediction
    return out


def _largest_fitting(fits: Any, most: int) -> int:
    """Largest n in 1..most with fits(n) (fits is monotone: true, then false); 0 when none."""
    best, lo, hi = 0, 1, most
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best
