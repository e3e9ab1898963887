"""Where the suite engine's networks live: loaded, stored, wrapped for several processes, and optimised.

``Placement`` holds the actor, the reference, the critic and the reward model of one engine run (only those the
method needs), their optimizers and learning-rate schedules, and the wrappers that place them over processes
(none, DistributedDataParallel, or one DeepSpeed engine per trained network). The step's pieces
(``baselines.engine_step.StepPieces``) run on it.

- Precision (``bench.model.precision``): the actor and critic are stored in float32 and run under bf16 autocast when
  ``model.dtype`` is bfloat16; the reference and reward model (and under LoRA the frozen bases) are stored in
  ``model.dtype``. Every network computes in one numerics (``bench.model.numerics``: autocast with a float32
  residual stream), so the bf16 reference's log-probs equal the float32 actor's before the first update (KL 0).
  Dropout is off in every network: the first update's ratio is 1.
- AdamW: fused on CUDA (no temporary the size of all parameters at the step), torch's default elsewhere
  (``baselines.common.adamw_implementation``, the same choice as TRL's ``optim``). One AdamW per trained network;
  the learning-rate schedule steps once per rollout step, so warm-up and decay are in ``train.steps`` units.
- LoRA (``train.lora``): the actor is a peft model whose adapters are trained; the reference is that same base with
  the adapters switched off (``AdapterOffReference``: no second copy, reported as shared); the critic is the policy
  backbone with its own adapters plus a trained value head (``train.lora.critic``, default) or fully trained; the
  reward model stays frozen (``baselines.engine_networks`` builds them).
- Several processes (``accelerate launch``): the actor and the critic are wrapped in DistributedDataParallel
  (gradients averaged at the last micro-batch's backward); the reference and the reward model are replicated,
  frozen. With one process nothing of this runs.
- DeepSpeed ZeRO (an accelerate config with a ZeRO stage 1-3, ``bench.config.launcher.engine_zero``): instead of DDP,
  the actor and the critic, each with its AdamW, go through ``deepspeed.initialize`` (one DeepSpeed engine per
  trained network: PPO trains two with separate optimizers and learning rates). fp32 weights and master weights
  (the suite's autocast does the bf16), clipping at train.max_grad_norm by DeepSpeed, no DeepSpeed scheduler. Under
  ZeRO-3 the trained weights are partitioned: generation and weight snapshots run inside a gather
  (:meth:`Placement.gathered`), and after training rank 0 gets whole copies (:meth:`Placement.whole_copy`). The
  reference and the reward model stay whole and frozen on every rank. Stage 0 runs DDP.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch
from torch import nn

from baselines.common import ADAMW_KWARGS, adamw_implementation, load_actor
from baselines.engine_config import EngineConfig
from baselines.engine_networks import AdapterOffReference, build_critic, disable_dropout, freeze
from bench.config import launcher
from bench.execution import launch
from bench.execution.context import RunContext
from bench.model.loading import load_causal_lm, load_sequence_classifier, torch_dtype
from bench.model.numerics import fp32_residual_stream
from bench.model.precision import autocast_dtype


class Placement:
    """The networks of one engine run, their optimizers and schedules, and how they sit over processes."""

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
        # The load order is the random-number order (the critic's fresh head draws): keep it.
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
        self.learning_rate = cfg.resolved_learning_rate(spec)
        self.rank, self.world_size = launch.rank(), launch.world_size()
        self.zero = launcher.engine_zero(spec) if self.world_size > 1 else None
        """The ZeRO settings the trained networks are sharded with (bench.config.launcher.engine_zero), None: DDP or
        one process."""
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

    @property
    def networks(self) -> dict[str, nn.Module]:
        """Resident networks by role."""
        roles = {"actor": self.actor, "critic": self.critic, "reward": self.reward_model, "reference": self.reference}
        return {role: net for role, net in roles.items() if net is not None}

    def _adamw(self, model: nn.Module, lr: float) -> torch.optim.Optimizer:
        params = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=lr, weight_decay=self.spec.train.weight_decay,
                                 **ADAMW_KWARGS[self.adamw])

    def _schedule(self, optimizer: torch.optim.Optimizer) -> Any:
        from transformers import get_scheduler

        t = self.spec.train
        name = "constant_with_warmup" if t.lr_scheduler == "constant" else t.lr_scheduler
        return get_scheduler(name, optimizer, num_warmup_steps=t.warmup_steps, num_training_steps=t.steps)

    # -- several processes: DDP -------------------------------------------------------------------
    def _data_parallel(self) -> dict[str, nn.Module]:
        """Role -> the trained network wrapped in DistributedDataParallel (actor, critic); empty with one process.

        Buffers are not broadcast at every forward (they are constants: rotary frequencies); the wrappers share
        the networks' parameters, so optimizers, clipping, accounting and generation use the networks themselves.
        """
        if self.world_size <= 1:
            return {}
        from torch.nn.parallel import DistributedDataParallel

        launch.init_process_group(self.device)  # the worker has joined already; idempotent
        ids = [torch.cuda.current_device()] if torch.device(self.device).type == "cuda" else None
        # torch >= 2.13 names it forward_sync_buffers (broadcast_buffers is deprecated there)
        newer = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        no_buffer_sync = {"forward_sync_buffers": False} if newer else {"broadcast_buffers": False}
        trained = {"actor": self.actor, "critic": self.critic}
        return {role: DistributedDataParallel(net, device_ids=ids, **no_buffer_sync)
                for role, net in trained.items() if net is not None}

    def no_sync(self, skip: bool) -> contextlib.AbstractContextManager:
        """With ``skip``, DDP's ``no_sync`` of every wrapper (the backward accumulates locally); else nothing."""
        if not skip or not self.ddp:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        for wrapper in self.ddp.values():
            stack.enter_context(wrapper.no_sync())
        return stack

    def through_ddp(self, model: nn.Module) -> nn.Module:
        """The DDP wrapper (or DeepSpeed engine) of ``model`` for a forward whose gradients must be averaged over
        ranks, else ``model``."""
        wrappers = self.ddp or self.deepspeed
        if wrappers and torch.is_grad_enabled():
            for role, wrapper in wrappers.items():
                if self.networks.get(role) is model:
                    return wrapper
        return model

    # -- several processes: DeepSpeed ZeRO --------------------------------------------------------
    def _deepspeed(self) -> dict[str, Any]:
        """Role -> ``deepspeed.initialize``'s engine for each trained network with its AdamW. The modules stay
        ``self.actor`` / ``self.critic`` (under ZeRO-3 partitioned in place); the client AdamW keeps its param
        groups (DeepSpeed swaps the flat fp32 partitions in), so the engine's schedules still set the learning
        rate."""
        import deepspeed

        launch.init_process_group(self.device)  # DeepSpeed joins the existing group (gloo on a CPU, NCCL on GPUs)
        engines = {}
        for role, net in (("actor", self.actor), ("critic", self.critic)):
            if net is not None:
                engines[role], *_ = deepspeed.initialize(model=net, optimizer=self.optimizers[role],
                                                         config=self.deepspeed_config(), dist_init_required=False)
        return engines

    def deepspeed_config(self) -> dict[str, Any]:
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

    def gathered(self, role: str, without_hooks: bool = False) -> contextlib.AbstractContextManager:
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

    def whole_copy(self, role: str) -> nn.Module | None:
        """Under ZeRO-3: a whole copy of trained network ``role`` on rank 0 (its shards gathered), built as the
        engine built the network and loaded with the trained weights; None on the other ranks (a collective)."""
        net = self.networks[role]
        with self.gathered(role):
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

    # -- numerics ---------------------------------------------------------------------------------
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

    def shared_reference(self) -> bool:
        """The reference is the actor's base with its adapters off (LoRA): it holds no weights of its own."""
        return isinstance(self.reference, AdapterOffReference)
