"""The suite's own on-policy engine: the machinery that PPO (``baselines/ppo.py``) and GRPO
(``baselines/grpo_engine.py``) share. TRL removed its PPOTrainer after v1.12, so PPO runs here; GRPO runs on
the same code so that PPO vs GRPO differ by exactly the critic + GAE versus the group-relative advantage.

The recipes own the algorithm: each has a ``step`` function that reads top to bottom (rollout, advantage,
update). This module owns what is the same for both:

- ``EngineConfig``: the fields every engine method has (epochs, minibatches, clip range, ...);
- ``Engine``: the networks (stored as ``bench.model.precision`` says), the optimizers and schedules, and the named
  pieces of a step — ``sample`` (generation), ``verify`` / ``reward_model_scores`` (reward),
  ``logprobs`` (reference and rollout forwards), ``values`` (critic), ``optimise`` (the minibatch loop);
- ``run``: the loop over rollout steps, firing ``TrainerCallback`` hooks as the TRL trainers do, so the same
  telemetry and progress callbacks attach to both.

Choices (each lands in ``TrainOutcome.settings``, sources: Huang et al. 2024 "The N+ Implementation Details of
RLHF with PPO"; TRL's GRPOTrainer):
- Log-probs divide the logits by the sampling temperature, so ``old_logp`` is the log-prob of the distribution
  that sampled the token. Every forward passes ``position_ids`` from the attention mask, so left-padded prompts
  see the positions they had in ``generate``. Dropout is off in every network: the first update's ratio is 1.
- Precision (``bench.model.precision``): the actor and critic are stored in float32 and run under bf16 autocast when
  ``model.dtype`` is bfloat16; the reference and reward model (and under LoRA the frozen bases) are stored in
  ``model.dtype``. Every network computes in one numerics (``bench.model.numerics``: autocast with a float32
  residual stream), so the bf16 reference's log-probs equal the float32 actor's before the first update (KL 0).
  Generation under autocast keeps a float32 K cache (RoPE promotes the keys to the float32 residual stream's dtype)
  and a bf16 V cache; the memory model counts it that way.
- AdamW: fused on CUDA (no temporary the size of all parameters at the step), torch's default elsewhere
  (``baselines.common.adamw_implementation``, the same choice as TRL's ``optim``).
- Memory: every forward runs ``train.micro_batch_size`` sequences at a time; log-probs and entropies are taken
  a few sequences at a time in float32 (``rl_math.logprobs_from_logits``), never as a float32 copy of the whole
  (b, T, V) logits. The minibatch loss is a sum over micro-batches of per-token losses times weights computed
  for the whole minibatch (``rl_math.loss_weights``), so gradients do not depend on the micro-batch size.
- One AdamW per trained network, each clipped at ``train.max_grad_norm`` on its own; the learning-rate schedule
  steps once per rollout step, so warm-up and decay are in ``train.steps`` units for every method.
- LoRA (``train.lora``, the same block TRL's trainers get): the actor is a peft model whose base weights are
  frozen and whose adapters are trained; the reference is that same base with the adapters switched off
  (``AdapterOffReference``: no second copy of the weights, and the accounting reports it as shared); the critic is
  the policy backbone with its own adapters plus a fully trained value head (``train.lora.critic``, default) or
  fully trained; the reward model stays frozen. Adapter dropout is off, as all dropout here.
- Several processes (bench.execution.launch, ``accelerate launch``): each rank samples its shard of every step's prompts
  (rank k takes prompts k x P/N .. (k + 1) x P/N - 1 of the step, in the seeded global order), so the ranks train
  on different prompts and together on the step's P x G completions. The actor and the critic are wrapped in
  torch's DistributedDataParallel (gradients averaged over the ranks at the last micro-batch's backward); the
  reference and the reward model are replicated, frozen. Step metrics are averaged over the ranks before they are
  logged; only rank 0 evaluates and writes the result (bench.execution.worker). Each rank normalises its loss over its own
  completions and DDP averages: the global loss for per-sequence aggregations (grpo), a mean of the ranks' token
  means for token-mean ones; PPO whitens advantages per rank. With one process nothing of this runs.
- DeepSpeed ZeRO (an accelerate config with a ZeRO stage 1-3, ``bench.config.launcher.engine_zero``): instead of DDP, the
  actor and the critic, each with its AdamW, go through ``deepspeed.initialize`` (one DeepSpeed engine per trained
  network: accelerate's Accelerator prepares one DeepSpeed model per plugin, and PPO trains two with separate
  optimizers and learning rates). The DeepSpeed config is built from the accelerate config's stage and offload
  devices: fp32 weights and master weights (bench.model.precision's bf16 autocast stays the suite's), gradient clipping
  at train.max_grad_norm (DeepSpeed clips, over the shards), no DeepSpeed scheduler (the engine's schedule steps per
  rollout). The loss is backpropagated with ``loss.backward()`` (DeepSpeed's hooks reduce each network's gradients
  at the minibatch's last micro-batch, the accumulation boundary the engine sets), then each DeepSpeed engine
  steps. Under ZeRO-3 the trained weights are partitioned over the ranks: generation runs inside a gather of the
  actor's parameters with DeepSpeed's forward hooks removed (TRL's ``unwrap_model_for_generation``), the weight
  snapshots are taken inside a gather, and after training rank 0 holds a whole copy of the actor and critic for
  evaluation and accounting. The reference and the reward model stay whole and frozen on every rank (replicated,
  not ZeRO-3 inference engines). Stage 0 runs DDP.

The critic and the adapter-off reference are built in ``baselines/engine_networks.py``. What is left here is one
job (about 700 lines): the engine a step runs on — its networks' placement (one process, DDP, DeepSpeed), the
named pieces of a step and the loop — kept in one class so that a recipe's step reads as calls on it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from baselines import rl_math as M
from bench.execution import launch
from bench.config import launcher
from bench.execution.context import MethodConfig, RunContext, TrainOutcome
from bench.task.data import prompts_for_steps
from bench.errors import SpecError
from bench.model.generation import eos_token_ids, generate_with_logprobs, sampling_settings
from bench.model import vllm_backend
from bench.model.loading import load_causal_lm, load_sequence_classifier, reward_read_positions, torch_dtype
from bench.model.numerics import fp32_residual_stream
from bench.model.precision import autocast_dtype, lora_roles, precision_policy, with_shared_reference
from bench.telemetry.monitors import completion_monitors
from bench.task.rewards import score_completion
from baselines.common import ADAMW_KWARGS, adamw_implementation, load_actor
from baselines.engine_networks import AdapterOffReference, build_critic, disable_dropout, freeze


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


@dataclass
class Rollout:
    """One batch of sampled completions and everything needed to score and train on it."""

    rows: list[dict[str, str]]
    """The prompt row of each completion ({'prompt', 'answer', 'question'}), G adjacent copies per prompt."""
    input_ids: torch.Tensor
    """(b, P + T) prompt + completion token ids."""
    attention_mask: torch.Tensor
    """(b, P + T) 1 for real tokens."""
    position_ids: torch.Tensor
    """(b, P + T) positions of the real tokens (left padding skipped, as in generate)."""
    completion_ids: torch.Tensor
    """(b, T) completion tokens, padded after the first EOS."""
    mask: torch.Tensor
    """(b, T) bool: real completion tokens, EOS included."""
    has_eos: torch.Tensor
    """(b,) bool: the completion ended with an EOS within the budget."""
    texts: list[str]
    """Decoded completions (special tokens skipped)."""
    sampler_logprobs: torch.Tensor | None = None
    """(b, T) the sampler's own log-prob of each completion token (vLLM backend; nats, 0 after the mask), or None.
    Old log-probs still come from the trainer; these feed the rollout-vs-trainer mismatch monitor."""

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def lengths(self) -> torch.Tensor:
        """(b,) completion lengths in tokens, EOS included."""
        return self.mask.sum(dim=1)


def sequence_inputs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                    completion_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt (left-padded) + completion (right-padded) -> (input_ids, attention_mask, position_ids).

    Shape: (b, P) and (b, T) -> three (b, P + T) tensors. Positions count real tokens only, as in ``generate``.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask.long(), completion_mask.long()], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


LossFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]
"""loss_fn(rows, weights) -> (loss, stats): rows (m,) indices into the rollout, weights (m, T) from
``rl_math.loss_weights``; loss = sum(per_token * weights) (a scalar to backpropagate); stats are scalars
already weighted the same way, so their sum over a minibatch's micro-batches is the minibatch's value."""


# ----------------------------------------------------------------------------------------------
# The engine


class Engine:
    """Networks, optimizers and the named pieces of one on-policy step (see the module docstring)."""

    def __init__(self, ctx: RunContext, cfg: EngineConfig, *, kl_coef: float, critic_init: str | None = None,
                 reward_model: bool = False, critic_learning_rate: float | None = None) -> None:
        """``critic_init`` None: no critic (GRPO); 'policy' | 'reward_model': PPO's critic. ``kl_coef`` 0 loads no
        reference. ``reward_model``: keep the trained reward model resident (PPO with ``reward: model``)."""
        assert ctx.init_model_dir is not None, "the warm_start stage provides the starting checkpoint"
        spec = ctx.spec
        self.ctx, self.cfg, self.spec = ctx, cfg, spec
        self.device = ctx.device
        self.tokenizer = ctx.starting_tokenizer()
        self.tokenizer.padding_side = "left"
        self.lora = spec.train.lora.enabled
        self.actor = load_actor(ctx.init_model_dir, spec, ctx.device)
        self.reference: nn.Module | None = None
        if kl_coef > 0:  # with LoRA: the actor's base, adapters off (no copy); else a frozen copy
            self.reference = (AdapterOffReference(self.actor) if self.lora
                              else freeze(load_causal_lm(ctx.init_model_dir, spec.model, ctx.device)))
        self.reward_model = (load_sequence_classifier(ctx.reward_model_dir, spec.model.dtype, ctx.device)
                             if reward_model else None)
        self.critic_init = critic_init
        self.critic = (build_critic(ctx, critic_init, lora=self.lora and spec.train.lora.critic)
                       if critic_init else None)
        for net in (self.actor, self.reference, self.critic, self.reward_model):
            if net is not None:
                disable_dropout(net)
        # One compute numerics (bench.model.numerics): a bf16-stored network (the reference, the reward model, a
        # LoRA base) computes under autocast exactly as its float32 copy, so the first KL is 0.
        for net in (self.actor, self.reference, self.reward_model, self.critic and self.critic.backbone):
            if net is not None:
                fp32_residual_stream(net)
        if spec.train.gradient_checkpointing:
            self.actor.gradient_checkpointing_enable()
            if self.critic is not None:
                self.critic.backbone.gradient_checkpointing_enable()
        self.autocast_dtype = autocast_dtype(spec.model.dtype)
        self.eos_ids = eos_token_ids(self.actor, self.tokenizer)
        self.generation = sampling_settings(spec, self.tokenizer, self.eos_ids, greedy=False)
        self.prompts = prompts_for_steps(ctx.train_rows, spec.train.steps, spec.train.prompts_per_step)
        self.learning_rate = cfg.resolved_learning_rate(spec)
        self.rank, self.world_size = launch.rank(), launch.world_size()
        self.zero = launcher.engine_zero(spec) if self.world_size > 1 else None
        """The ZeRO settings the trained networks are sharded with (bench.config.launcher.engine_zero), None: DDP or one process."""
        offload = (self.zero or {}).get("offload_optimizer_device") or "none"
        self.adamw = adamw_implementation(self.device if offload == "none" else offload)
        """'fused' or 'default' (see adamw_implementation): where the optimizer state lives decides."""
        self.optimizers = {"actor": self._adamw(self.actor, self.learning_rate)}
        if self.critic is not None:
            self.optimizers["critic"] = self._adamw(self.critic, critic_learning_rate or self.learning_rate)
        self.schedulers = [self._schedule(opt) for opt in self.optimizers.values()]
        self.micro_batch_size = spec.train.micro_batch_size
        self.ddp = self._data_parallel() if self.zero is None else {}
        self.deepspeed = self._deepspeed() if self.zero is not None else {}
        """Role -> DeepSpeed engine of the trained networks (actor, critic) under ZeRO; empty otherwise."""
        self.optimizer_steps = 0
        self.trained_tokens = 0
        self.generated_tokens = 0
        self.completions = 0
        self.mismatch: SamplerMismatch | None = None
        """The step's rollout-vs-trainer monitor (vLLM backend), reset by every ``sample``."""

    def _data_parallel(self) -> dict[str, nn.Module]:
        """Role -> the trained network wrapped in DistributedDataParallel (actor, critic); empty with one process.

        Buffers are not broadcast at every forward (they are constants: rotary frequencies); the wrappers share
        the networks' parameters, so optimizers, clipping, accounting and generation use the networks themselves.
        """
        if self.world_size <= 1:
            return {}
        from torch.nn.parallel import DistributedDataParallel

        launch.init_process_group(self.device)  # the worker has joined already; idempotent
        import inspect

        ids = [torch.cuda.current_device()] if torch.device(self.device).type == "cuda" else None
        # torch >= 2.13 names it forward_sync_buffers (broadcast_buffers is deprecated there)
        newer = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        no_buffer_sync = {"forward_sync_buffers": False} if newer else {"broadcast_buffers": False}
        trained = {"actor": self.actor, "critic": self.critic}
        return {role: DistributedDataParallel(net, device_ids=ids, **no_buffer_sync)
                for role, net in trained.items() if net is not None}

    def _deepspeed(self) -> dict[str, Any]:
        """Role -> ``deepspeed.initialize``'s engine for each trained network with its AdamW (see the module
        docstring). The modules stay ``self.actor`` / ``self.critic`` (under ZeRO-3 partitioned in place); the
        client AdamW keeps its param groups (DeepSpeed swaps the flat fp32 partitions in), so the engine's schedules
        still set the learning rate."""
        import deepspeed

        launch.init_process_group(self.device)  # DeepSpeed joins the existing group (gloo on a CPU, NCCL on GPUs)
        engines = {}
        for role, net in (("actor", self.actor), ("critic", self.critic)):
            if net is not None:
                engines[role], *_ = deepspeed.initialize(model=net, optimizer=self.optimizers[role],
                                                         config=self._deepspeed_config(), dist_init_required=False)
        return engines

    def _deepspeed_config(self) -> dict[str, Any]:
        """DeepSpeed's config for one trained network: the ZeRO stage and offload devices of the accelerate config,
        the engine's micro-batch, clipping at train.max_grad_norm, fp32 (the suite's autocast does the bf16).

        gradient_accumulation_steps 1: the engine sets the accumulation boundary itself (the last micro-batch of a
        minibatch) and its loss is already weighted over the whole minibatch, so DeepSpeed must not divide it.
        A client torch AdamW is kept under optimizer offload (``zero_force_ds_cpu_optimizer`` false): the same
        optimizer as every other layout; DeepSpeedCPUAdam would be faster."""
        zero, per_rank = self.zero, self.spec.completions_per_step // self.world_size
        minibatch = per_rank // self.cfg.minibatches
        return {
            "train_micro_batch_size_per_gpu": min(self.micro_batch_size or minibatch, minibatch),
            "gradient_accumulation_steps": 1,
            "gradient_clipping": self.spec.train.max_grad_norm,
            "zero_optimization": {"stage": zero["zero_stage"],
                                  "offload_optimizer": {"device": zero["offload_optimizer_device"]},
                                  "offload_param": {"device": zero["offload_param_device"]}},
            "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False,
            "bf16": {"enabled": False},
            "fp16": {"enabled": False},
            "steps_per_print": 2**31 - 1,  # DeepSpeed's own progress lines: off (the suite prints its own)
        }

    @property
    def zero3(self) -> bool:
        """The trained networks' weights are partitioned over the ranks (ZeRO stage 3)."""
        return self.zero is not None and self.zero["zero_stage"] == 3

    def _gathered(self, role: str, without_hooks: bool = False) -> contextlib.AbstractContextManager:
        """Under ZeRO-3, a region in which network ``role`` holds its whole weights on every rank (a collective:
        every rank enters it together); else nothing. ``without_hooks``: DeepSpeed's per-layer fetch/release hooks
        are removed inside, for many forwards over the gathered weights (generation), and put back after."""
        if not self.zero3:
            return contextlib.nullcontext()
        import deepspeed

        engine = self.deepspeed[role]
        stack = contextlib.ExitStack()
        stack.enter_context(deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None))
        if without_hooks:
            from trl.models.utils import add_hooks, remove_hooks

            remove_hooks(engine)
            stack.callback(add_hooks, engine)
        return stack

    def _whole_copy(self, role: str) -> nn.Module | None:
        """Under ZeRO-3: a whole copy of trained network ``role`` on rank 0 (its shards gathered), built as the
        engine built the network and loaded with the trained weights; None on the other ranks (a collective)."""
        net = self.networks[role]
        with self._gathered(role):
            state = {k: v.detach().clone() for k, v in net.state_dict().items()} if self.rank == 0 else None
        if state is None:
            return None
        if role == "actor":
            whole = load_actor(self.ctx.init_model_dir, self.spec, self.device)
        else:
            whole = build_critic(self.ctx, self.critic_init, lora=self.lora and self.spec.train.lora.critic)
        whole.load_state_dict(state)
        disable_dropout(whole)
        fp32_residual_stream(whole if role == "actor" else whole.backbone)
        return whole

    def _through_ddp(self, model: nn.Module) -> nn.Module:
        """The DDP wrapper (or DeepSpeed engine) of ``model`` for a forward whose gradients must be averaged over
        ranks, else ``model``."""
        wrappers = self.ddp or self.deepspeed
        if wrappers and torch.is_grad_enabled():
            for role, wrapper in wrappers.items():
                if self.networks.get(role) is model:
                    return wrapper
        return model

    def _adamw(self, model: nn.Module, lr: float) -> torch.optim.Optimizer:
        params = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=lr, weight_decay=self.spec.train.weight_decay,
                                 **ADAMW_KWARGS[self.adamw])

    def _schedule(self, optimizer: torch.optim.Optimizer) -> Any:
        from transformers import get_scheduler

        t = self.spec.train
        name = "constant_with_warmup" if t.lr_scheduler == "constant" else t.lr_scheduler
        return get_scheduler(name, optimizer, num_warmup_steps=t.warmup_steps, num_training_steps=t.steps)

    @property
    def networks(self) -> dict[str, nn.Module]:
        """Resident networks by role."""
        roles = {"actor": self.actor, "critic": self.critic, "reward": self.reward_model, "reference": self.reference}
        return {role: net for role, net in roles.items() if net is not None}

    def autocast(self, cache: bool = True) -> contextlib.AbstractContextManager:
        """bf16 autocast for every forward when model.dtype is bfloat16 (fp32 master weights stay fp32).

        ``cache``: torch.autocast keeps a bf16 cast of every fp32 leaf weight that requires grad for the whole
        region (2 bytes per trained linear weight: ~1 GiB at 0.5B, ~13 GiB at 7B). A training forward reuses
        each cast in its backward, so the cache pays off there; generation is many small forwards with no
        backward, so ``sample`` turns it off and each weight is cast per forward and freed right after.
        """
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(self.device).type, dtype=torch_dtype(self.autocast_dtype),
                              cache_enabled=cache)

    def micro_batches(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """``rows`` (indices) in pieces of train.micro_batch_size (0: one piece)."""
        size = self.micro_batch_size or len(rows)
        return list(rows.split(size))

    # -- 1. generation ---------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, step: int) -> Rollout:
        """G completions for each of this step's prompts with the matched settings, cut after the first EOS."""
        t, tok = self.spec.train, self.tokenizer
        first = (step - 1) * t.prompts_per_step
        rows = self.prompts[first: step * t.prompts_per_step]
        if self.world_size > 1:  # this rank's shard of the step's prompts (validated: N divides prompts_per_step)
            share = t.prompts_per_step // self.world_size
            first += self.rank * share
            rows = rows[self.rank * share: (self.rank + 1) * share]
            # positions in the matched prompt order: the rank file shows which prompts each rank trained on
            getattr(self.ctx.telemetry, "prompt_ids", []).extend(range(first, first + share))
        rows = [row for row in rows for _ in range(t.group_size)]  # G completions of a prompt adjacent
        enc = tok([r["prompt"] for r in rows], return_tensors="pt", padding=True, add_special_tokens=False)
        prompt_ids, prompt_mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        self.actor.eval()
        # no bf16 weight copies held for the whole generate call; under ZeRO-3 the actor's whole weights
        with self.autocast(cache=False), self._gathered("actor", without_hooks=True):
            sequences, sampler_logprobs = generate_with_logprobs(self.actor, prompt_ids, prompt_mask, self.generation)
        raw = sequences[:, prompt_ids.shape[1]:]
        # EOS presence is read before truncation: when pad == EOS the padding would look like an EOS.
        is_eos = torch.isin(raw, torch.as_tensor(self.eos_ids, device=raw.device))
        has_eos = M.first_true_indices(is_eos) < raw.shape[1]
        completion_ids, mask = M.truncate_after_eos(raw, self.eos_ids, tok.pad_token_id)
        input_ids, attention_mask, position_ids = sequence_inputs(prompt_ids, prompt_mask, completion_ids, mask)
        texts = tok.batch_decode(completion_ids, skip_special_tokens=True)
        batch = Rollout(rows, input_ids, attention_mask, position_ids, completion_ids, mask, has_eos, texts,
                        None if sampler_logprobs is None else sampler_logprobs * mask)
        self.mismatch = SamplerMismatch(len(batch)) if sampler_logprobs is not None else None
        n_tokens = int(batch.lengths.sum())
        self.completions += len(rows)
        self.generated_tokens += n_tokens
        counters = self.ctx.telemetry.counters
        counters["completions"] = counters.get("completions", 0) + len(rows)
        counters["generated_tokens"] = counters.get("generated_tokens", 0) + n_tokens
        return batch

    # -- 2. reward -------------------------------------------------------------------------------
    def verify(self, batch: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
        """Rule-verifier reward of each completion (accuracy + format - length penalty) and the step's monitors.

        Returns scores (b,) float32 on the device and logs. The length penalty counts tokens by re-tokenising the
        decoded text, as the TRL GRPO recipe does, so both GRPOs see the same reward.
        """
        r, tok = self.spec.reward, self.tokenizer
        verdicts = [score_completion(text, row["answer"], len(tok(text, add_special_tokens=False)["input_ids"]),
                                     r.accuracy_weight, r.format_weight, r.length_threshold, r.length_penalty)
                    for text, row in zip(batch.texts, batch.rows)]
        total = torch.tensor([v["total"] for v in verdicts], dtype=torch.float32)
        missing_eos = (~batch.has_eos).float().mean().item()
        logs = {
            "reward": total.mean().item(),
            "reward_std": total.std().item() if len(total) > 1 else 0.0,
            "accuracy_reward": sum(v["accuracy"] for v in verdicts) / len(verdicts),
            "format_reward": sum(v["format"] for v in verdicts) / len(verdicts),
            "length_penalty_reward": -sum(v["length_penalty"] for v in verdicts) / len(verdicts),
            "eos_rate": 1.0 - missing_eos,
        }
        if self.cfg.missing_eos_penalty is not None:  # the term eos_penalised subtracts, whatever the reward source
            logs["missing_eos_penalty_reward"] = -self.cfg.missing_eos_penalty * missing_eos
        # Length, truncation, degenerate-output and 'aha' monitors (bench.telemetry.monitors, the same for every method).
        logs.update(completion_monitors(batch.texts, [row["answer"] for row in batch.rows],
                                        lengths=batch.lengths.tolist(), hit_max=(~batch.has_eos).tolist()))
        return total.to(self.device), logs

    @torch.no_grad()
    def reward_model_scores(self, batch: Rollout) -> torch.Tensor:
        """The reward model's score of each prompt + completion: (b,) float32.

        Read from the backbone's hidden state and the ``score`` head at the position its training read
        (``reward_read_positions``: the last real token, or the one before it when that is the pad token, as
        TRL's RewardTrainer trains it). The model's own pad search cannot be used here: the rollout is also
        padded on the left and after each EOS.
        """
        model = self.reward_model
        backbone = getattr(model, model.base_model_prefix)
        last_real = batch.input_ids.shape[1] - batch.completion_ids.shape[1] + batch.lengths - 1
        last_index = reward_read_positions(batch.input_ids, last_real, model.config.get_text_config().pad_token_id)
        scores = []
        for rows in self.micro_batches(torch.arange(len(batch), device=self.device)):
            with self.autocast():
                hidden = backbone(input_ids=batch.input_ids[rows], attention_mask=batch.attention_mask[rows],
                                  position_ids=batch.position_ids[rows], use_cache=False).last_hidden_state
                picked = hidden[torch.arange(len(rows), device=self.device), last_index[rows]]
                scores.append(model.score(picked).squeeze(-1).float())
        return torch.cat(scores)

    def eos_penalised(self, scores: torch.Tensor, batch: Rollout) -> torch.Tensor:
        """scores - missing_eos_penalty for completions that never ended (unchanged when the penalty is off)."""
        if self.cfg.missing_eos_penalty is None:
            return scores
        return scores - self.cfg.missing_eos_penalty * (~batch.has_eos).float()

    # -- 3./4. forwards --------------------------------------------------------------------------
    def logprobs(self, model: nn.Module, batch: Rollout, rows: torch.Tensor,
                 with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs of the completion tokens of ``rows`` under ``model`` (and entropies, a monitor).

        Shape: rows (m,) -> logp (m, T) nats float32, entropy (m, T) or None. Differentiable when called with
        grad enabled. Only the last T + 1 positions' logits are computed (``logits_to_keep``): the logits at
        position i predict token i + 1.
        """
        T = batch.completion_ids.shape[1]
        temperature = self.spec.generation.temperature
        with self.autocast():
            out = self._through_ddp(model)(input_ids=batch.input_ids[rows], attention_mask=batch.attention_mask[rows],
                                           position_ids=batch.position_ids[rows], logits_to_keep=T + 1,
                                           use_cache=False)
        logits = out.logits[:, :-1]
        logp = M.logprobs_from_logits(logits, batch.completion_ids[rows], temperature)
        entropy = M.entropy_from_logits(logits.detach(), temperature) if with_entropy else None
        if model is self.actor and self.mismatch is not None:  # the trainer's log-probs before this step's update
            self.mismatch.add(rows, logp.detach(), batch)
        return logp, entropy

    def values(self, batch: Rollout, rows: torch.Tensor) -> torch.Tensor:
        """Critic value of each completion position of ``rows``, read from the hidden state before the token.

        Shape: rows (m,) -> (m, T) float32, reward units.
        """
        T = batch.completion_ids.shape[1]
        critic = self._through_ddp(self.critic)
        if critic is not self.critic:  # several processes: through the DDP wrapper, so gradients are averaged
            with self.autocast():
                return critic(batch.input_ids[rows], batch.attention_mask[rows], batch.position_ids[rows], T)
        with self.autocast():
            hidden = self.critic.hidden(batch.input_ids[rows], batch.attention_mask[rows], batch.position_ids[rows])
        return self.critic.values(hidden[:, -T - 1: -1])

    @torch.no_grad()
    def importance_weights(self, batch: Rollout, rows: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor | None:
        """Truncated importance-sampling weights min(exp(old_logp - logp_vllm), cap) of ``rows``: (m, T), detached;
        None unless the vLLM backend sampled the batch and ``generation.importance_sampling_cap`` > 0 (the default 0
        is off). They correct the surrogate for vLLM sampling from slightly different numerics than the trainer's."""
        cap = self.spec.generation.importance_sampling_cap
        if cap <= 0 or batch.sampler_logprobs is None:
            return None
        ratio = torch.exp(old_logp.detach().float() - batch.sampler_logprobs[rows])
        return torch.clamp(ratio, max=cap) * batch.mask[rows]

    @torch.no_grad()
    def rollout_logprobs(self, model: nn.Module, batch: Rollout) -> torch.Tensor:
        """``logprobs`` of the whole batch in eval mode, micro-batch by micro-batch: (b, T)."""
        model.eval()
        every = torch.arange(len(batch), device=self.device)
        return torch.cat([self.logprobs(model, batch, rows)[0] for rows in self.micro_batches(every)])

    @torch.no_grad()
    def rollout_values(self, batch: Rollout) -> torch.Tensor:
        """``values`` of the whole batch in eval mode, micro-batch by micro-batch: (b, T)."""
        self.critic.eval()
        every = torch.arange(len(batch), device=self.device)
        return torch.cat([self.values(batch, rows) for rows in self.micro_batches(every)])

    # -- 5. update -------------------------------------------------------------------------------
    def accumulate(self, loss_fn: LossFn, rows: torch.Tensor, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        """Backward of one minibatch, micro-batch by micro-batch; gradients add up to the minibatch's.

        Shape: rows (m,), weights (m, T) from ``rl_math.loss_weights`` over the whole minibatch. Returns the
        summed (weighted) stats of loss_fn.
        """
        totals: dict[str, torch.Tensor] = {}
        size = self.micro_batch_size or len(rows)
        starts = range(0, len(rows), size)
        for start in starts:
            # Several processes: gradients are averaged once, at the minibatch's last backward (DDP no_sync before)
            for engine in self.deepspeed.values():  # DeepSpeed reduces the gradients at the minibatch's end
                engine.set_gradient_accumulation_boundary(start == starts[-1])
            with self._no_sync(start != starts[-1]):
                loss, stats = loss_fn(rows[start:start + size], weights[start:start + size])
                loss.backward()
            for name, value in stats.items():
                totals[name] = totals.get(name, 0) + value.detach().float()
        return totals

    def _no_sync(self, skip: bool) -> contextlib.AbstractContextManager:
        """With ``skip``, DDP's ``no_sync`` of every wrapper (the backward accumulates locally); else nothing."""
        if not skip or not self.ddp:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        for wrapper in self.ddp.values():
            stack.enter_context(wrapper.no_sync())
        return stack

    def optimise(self, batch: Rollout, loss_fn: LossFn, aggregation: M.Aggregation) -> dict[str, float]:
        """``ppo_epochs`` passes of shuffled minibatches; one clipped AdamW step per minibatch and network.

        Returns the stats of loss_fn averaged over the optimizer steps, the learning rate and the actor's gradient
        norm before clipping (mean over the updates).
        """
        cfg = self.cfg
        lr = self.schedulers[0].get_last_lr()[0]
        self.actor.train()
        if self.critic is not None:
            self.critic.train()
        minibatch = len(batch) // cfg.minibatches
        sampler = vllm_backend.attached(self.actor)
        if sampler is not None:  # its KV cache released while the trainer updates, where the platform can (CUDA)
            sampler.sleep()
        sums: dict[str, torch.Tensor] = {}
        grad_norms: list[float] = []
        updates = 0
        for _ in range(cfg.ppo_epochs):
            for rows in torch.randperm(len(batch), device=self.device).split(minibatch):
                weights = M.loss_weights(batch.mask[rows], aggregation, self.spec.generation.max_new_tokens)
                for opt in self.optimizers.values():
                    opt.zero_grad(set_to_none=True)
                for name, value in self.accumulate(loss_fn, rows, weights).items():
                    sums[name] = sums.get(name, 0) + value
                for role, opt in self.optimizers.items():
                    if role in self.deepspeed:  # DeepSpeed clips (over the shards) and steps
                        self.deepspeed[role].step()
                        norm = self.deepspeed[role].get_global_grad_norm()
                    else:
                        norm = torch.nn.utils.clip_grad_norm_(self.networks[role].parameters(),
                                                              self.spec.train.max_grad_norm)
                        opt.step()
                    if role == "actor":
                        grad_norms.append(float(norm))  # before clipping: what clip_grad_norm_ returns
                self.trained_tokens += int(batch.attention_mask[rows].sum())
                updates += 1
                if self.mismatch is not None:  # later log-probs are of the updated policy: no longer the old ones
                    self.mismatch.closed = True
        for scheduler in self.schedulers:
            scheduler.step()
        self.optimizer_steps += updates
        return {**{name: (value / updates).item() for name, value in sums.items()}, "learning_rate": lr,
                "grad_norm": sum(grad_norms) / len(grad_norms)}

    # -- the loop --------------------------------------------------------------------------------
    def run(self, step_fn: Callable[[int], dict[str, float]]) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
        """``train.steps`` calls of ``step_fn(step) -> metrics``, bracketed by TrainerCallback hooks.

        Returns (log_history: a point every train.log_every steps and at the last, per_step: every step).
        """
        t = self.spec.train
        events = CallbackEvents(self.ctx, t.steps)
        with self._gathered("actor"):  # ZeRO-3: the weight snapshot sees whole weights
            events.fire("on_train_begin", model=self.actor)
        log_history: list[dict[str, float]] = []
        per_step: list[dict[str, float]] = []
        for step in range(1, t.steps + 1):
            events.fire("on_step_begin")
            metrics = {"step": step, **step_fn(step)}
            if self.mismatch is not None:  # vLLM backend: the rollout-vs-trainer monitor of this step
                metrics.update(self.mismatch.metrics())
            if self.world_size > 1:  # every rank logs the mean over the ranks (their shards are equal)
                metrics = launch.mean_across_ranks(metrics)
            events.state.global_step = step
            events.fire("on_step_end")
            per_step.append(metrics)
            if step % t.log_every == 0 or step == t.steps:
                log_history.append(metrics)
                events.state.log_history.append(metrics)
                events.fire("on_log", logs=metrics)
        with self._gathered("actor"):
            events.fire("on_train_end", model=self.actor)
        return log_history, per_step

    def _lora_settings(self) -> dict[str, Any]:
        """What LoRA changed, for the result (nothing without LoRA)."""
        if not self.lora:
            return {}
        lora = self.spec.train.lora
        out: dict[str, Any] = {"lora": {"r": lora.r, "alpha": lora.alpha, "target_modules": lora.target_modules,
                                        "dropout": 0.0, "critic": self.critic is not None and lora.critic}}
        if isinstance(self.reference, AdapterOffReference):
            out["reference"] = "the actor's base model with its adapters disabled (shares the actor's weights)"
        return out

    def _precision(self, roles: tuple[str, ...]) -> dict[str, dict[str, Any]]:
        """bench.model.precision's policy; a shared reference is held as the actor's base weights, not a copy."""
        policy = precision_policy(self.spec.model.dtype, roles, lora_roles=lora_roles(self.spec.train.lora))
        return with_shared_reference(policy) if isinstance(self.reference, AdapterOffReference) else policy

    def _deepspeed_outcome(self, networks: dict[str, nn.Module], optimizers: dict[str, torch.optim.Optimizer]
                           ) -> tuple[dict[str, nn.Module], dict[str, torch.optim.Optimizer], dict[str, Any]]:
        """(networks, optimizers, record) for the result under ZeRO. The sharded optimizers are left out: their
        param groups hold DeepSpeed's flat fp32 partitions, not the modules' parameters, so the accounting (bench.
        telemetry.account_networks) counts what training needs from requires_grad instead, for whole networks. Under
        ZeRO-3 rank 0 gets whole copies of the trained networks (to evaluate and account; :meth:`_whole_copy`)."""
        zero = self.zero
        if self.zero3:
            copies = {role: self._whole_copy(role) for role in self.deepspeed}  # every rank joins the gathers
            if self.rank == 0:
                networks = {**networks, **copies}
        record = {"zero_stage": zero["zero_stage"], "offload_optimizer_device": zero["offload_optimizer_device"],
                  "offload_param_device": zero["offload_param_device"], "sharded": sorted(self.deepspeed),
                  "frozen": "whole on every rank (replicated, not sharded)",
                  "config": self._deepspeed_config(),
                  "accounting": "whole networks (weights, gradients) without the sharded optimizer state; the "
                                "per-rank measured peaks show the sharding"}
        if self.zero3:
            record["generation"] = "inside a gather of the actor's partitions, DeepSpeed's hooks removed"
        return networks, {r: o for r, o in optimizers.items() if r not in self.deepspeed}, record

    def outcome(self, log_history: list[dict[str, float]], per_step: list[dict[str, float]],
                settings: dict[str, Any], metric_keys: tuple[str, ...]) -> TrainOutcome:
        """The trained actor, the resident networks, and first/last-fifth means of ``metric_keys``."""
        fifth = max(1, len(per_step) // 5)
        metrics: dict[str, Any] = {"rollout_steps": len(per_step), "optimizer_steps": self.optimizer_steps}
        for key in metric_keys:
            for name, points in (("first_fifth", per_step[:fifth]), ("last_fifth", per_step[-fifth:])):
                values = [p[key] for p in points if key in p]
                if values:
                    metrics[f"{key}_{name}"] = sum(values) / len(values)
        spreads = [p["zero_std_groups"] for p in per_step if "zero_std_groups" in p]
        if spreads:  # the mean over every step, not the logged ones: 1.0 means no step had a learning signal
            metrics["zero_std_groups_mean"] = sum(spreads) / len(spreads)
        roles = tuple(self.networks)
        settings = {**settings, **self._lora_settings(), "engine": "suite", "learning_rate": self.learning_rate,
                    "ppo_epochs": self.cfg.ppo_epochs, "minibatches": self.cfg.minibatches,
                    "optimizer_steps_per_rollout": self.cfg.ppo_epochs * self.cfg.minibatches,
                    "cliprange": self.cfg.cliprange, "missing_eos_penalty": self.cfg.missing_eos_penalty,
                    "micro_batch_size": self.micro_batch_size or "whole minibatch",
                    "logprob_temperature": self.spec.generation.temperature, "lr_schedule_unit": "rollout step",
                    "optimizers": f"AdamW ({self.adamw}) per network, grad clip per network",
                    "adamw_implementation": self.adamw,
                    "precision": self._precision(roles),
                    "generation": self.generation, **vllm_backend.backend_settings(self.actor, self.generation)}
        networks, optimizers = self.networks, dict(self.optimizers)
        if self.deepspeed:
            networks, optimizers, settings["deepspeed"] = self._deepspeed_outcome(networks, optimizers)
        return TrainOutcome(
            policy=networks["actor"], tokenizer=self.tokenizer, networks=networks, optimizers=optimizers,
            log_history=log_history, steps=self.optimizer_steps,
            completions=self.completions, generated_tokens=self.generated_tokens,
            trained_tokens=self.trained_tokens, settings=settings, metrics=metrics,
        )


class SamplerMismatch:
    """Rollout-vs-trainer monitor of one step (vLLM backend): every completion token's trainer log-prob before the
    step's update against vLLM's own, each row counted once (PPO scores the rollout, then the minibatches again).

    ``sampler_logprob_abs_diff`` = mean |logp_trainer - logp_vllm|; ``sampler_kl`` = KL(vllm || trainer), the k3
    estimate mean(exp(d) - 1 - d) with d = logp_trainer - logp_vllm over tokens vLLM sampled (>= 0; nats per token).
    """

    def __init__(self, rows: int) -> None:
        self.seen = torch.zeros(rows, dtype=torch.bool)
        self.abs_sum = self.kl_sum = 0.0
        self.tokens = 0
        self.closed = False

    def add(self, rows: torch.Tensor, logp: torch.Tensor, batch: Rollout) -> None:
        """``logp`` (m, T): the trainer's log-probs of ``rows`` (m,) of ``batch``."""
        if self.closed or batch.sampler_logprobs is None:
            return
        fresh = ~self.seen[rows.cpu()]
        if not fresh.any():
            return
        self.seen[rows.cpu()[fresh]] = True
        keep = fresh.to(logp.device)
        mask = batch.mask[rows][keep]
        d = (logp[keep].double() - batch.sampler_logprobs[rows][keep].double())[mask]  # float64: exp(d) - 1 - d >= 0
        self.abs_sum += float(d.abs().sum())
        self.kl_sum += float((torch.exp(d) - 1 - d).sum())
        self.tokens += int(d.numel())

    def metrics(self) -> dict[str, float]:
        if not self.tokens:
            return {}
        return {"sampler_logprob_abs_diff": self.abs_sum / self.tokens, "sampler_kl": self.kl_sum / self.tokens}


class CallbackEvents:
    """Calls ``transformers.TrainerCallback`` hooks in the Trainer's order, so that the same callbacks
    (telemetry's step timer and parameter snapshot, the progress reporter) attach to this engine as to TRL's.

    Hooks fired: on_train_begin (with model=), then per rollout step on_step_begin, on_step_end, on_log (every
    ``log_every`` steps), and on_train_end (with model=). The optimizer-step hooks are not fired: the engine
    reports its update phase itself.
    """

    def __init__(self, ctx: RunContext, total_steps: int) -> None:
        from transformers import TrainerControl, TrainerState, TrainingArguments

        from baselines.common import ProgressCallback

        self.args = TrainingArguments(output_dir=str(ctx.run_dir / "engine"), report_to=[], use_cpu=ctx.device == "cpu")
        self.state = TrainerState(max_steps=total_steps)
        self.control = TrainerControl()
        self.callbacks = [ctx.telemetry.trainer_callback(), ProgressCallback(ctx, total_steps)]

    def fire(self, event: str, **kwargs: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, event)(self.args, self.state, self.control, **kwargs)
