"""The suite's own on-policy engine: PPO (actor + critic + reward + reference) and GRPO on the same code.

TRL removed its PPOTrainer after v1.12, so PPO runs here; the same loop also runs a GRPO, so that PPO
and GRPO differ by exactly the critic + GAE versus the group-relative advantage (and where the KL goes).
Written from the algorithm (Huang et al. 2024, "The N+ Implementation Details of RLHF with PPO";
DeepSeekMath for GRPO), CleanRL-style: read ``RolloutEngine.train`` top to bottom.

One step (= one rollout batch; ``telemetry.step_begin/step_end`` bracket it):
  1. generation  take ``prompts_per_step`` prompts in the matched order (cycling), sample ``group_size``
                 completions each with the matched sampling settings (left-padded prompts), cut each
                 completion after its first EOS.
  2. reward      decode; score every completion with the rule verifier (always: it gives the accuracy
                 and format curves of every method) and, for PPO with ``reward: model``, with the reward
                 model at the last real token; subtract ``missing_eos_penalty`` when there is no EOS.
  3. reference   log-probs of the sampled tokens under the frozen reference (only when the KL coef > 0).
  4. critic      (PPO) values of every completion position from the critic.
  5. update      the rollout policy's log-probs (``old_logp``), then the advantages (PPO: per-token
                 rewards = score at the last token - kl_coef * KL, GAE, whitening; GRPO: group-relative
                 score broadcast over tokens), then ``ppo_epochs`` x ``minibatches`` optimizer steps.
Phase rule: every forward of a frozen network has its own phase (reference, critic's rollout forward,
reward); everything the policy's optimisation needs after scoring (old log-probs, advantages, the
updates, the critic's training forward/backward) is "update".

Choices and why (each also lands in ``TrainOutcome.settings``):
- Log-probs divide the logits by the sampling temperature, so ``old_logp`` is the log-prob of the
  distribution that actually sampled the token (N+ details).
- Every forward passes ``position_ids`` computed from the attention mask, so left-padded prompts see the
  same positions as in ``generate``. Dropout is switched off in every network (N+ details): the first
  update's ratio is then exactly 1.
- The critic is a value head (Linear(hidden, 1)) on its own backbone. ``critic_init: policy`` (default)
  starts it from the policy checkpoint: it then reads text as the policy does, it exists for
  ``ppo_verifier`` (which has no reward model), and ``ppo`` and ``ppo_verifier`` differ only in the reward
  source. ``critic_init: reward_model`` starts backbone and head from the reward model (N+ details/TRL).
- The value at completion token t is read from the hidden state before t (the state in which t was
  chosen), aligned with the log-probs.
- Two AdamW optimizers (actor, critic): the report accounts optimizer state per network, and a large
  value gradient cannot shrink the policy's step through a joint clip. The loss is still
  ``policy_loss + vf_coef * value_loss`` in one backward; since the parameters are disjoint, under Adam
  ``vf_coef`` acts through the critic's gradient clipping only. Each network is clipped at
  ``train.max_grad_norm`` on its own.
- Learning-rate schedule: stepped once per rollout step (as TRL's PPO did), so warm-up and decay are in
  ``train.steps`` units for every method, whatever ``ppo_epochs`` x ``minibatches`` is.
- GRPO puts the KL in the loss (``beta * k3``, DeepSeekMath eq. 3-4) instead of the reward; PPO puts
  ``-kl_coef * KL`` (estimator ``kl_estimator``, default k1) into the per-token reward.
- Both modes aggregate losses as a token-level mean over the minibatch's real tokens (the N+ details'
  PPO; TRL GRPO's "dapo"/"bnpo" family), so the loss normalisation is not a PPO/GRPO difference.
- ``old_logp`` is the rollout forward. PPO needs it before the update anyway (the KL penalty in the
  reward); GRPO with ``ppo_epochs == minibatches == 1`` skips that forward and uses the update forward's
  detached log-probs, which are equal (no dropout, same weights).
- The missing-EOS penalty applies in both modes and to both reward sources, so that switching the
  reward source or the advantage estimator changes nothing else.
- The reward model is read at the last real token of prompt + completion (the EOS when there is one),
  from its backbone's hidden state and its ``score`` head, not via the model's own pad-token search
  (which would skip the EOS when pad == EOS).
- ``reward`` in the logs is the rule verifier's mean total for every method (comparable with TRL's
  GRPO curve); ``score`` is what this method optimised (reward model or verifier, after the EOS penalty).
  ``kl`` is a per-token mean: PPO, the reward's estimator at rollout time; GRPO, k3 over the update
  forwards (what TRL's GRPO logs).
- Not supported yet: LoRA (``train.lora.enabled`` raises a UserError naming the fix).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from baselines import rl_math as M
from bench.context import RunContext, TrainOutcome
from bench.data import prompts_for_steps
from bench.errors import UserError
from bench.models import load_causal_lm, load_tokenizer, torch_dtype
from bench.rewards import degenerate_stats, score_completion

Mode = Literal["ppo", "grpo"]


class CallbackEvents:
    """Calls ``transformers.TrainerCallback`` hooks in the Trainer's order, so that the same callbacks
    (telemetry's step timer, the progress reporter) attach to this engine as to TRL's trainers.

    Hooks fired: on_train_begin, then per rollout step on_step_begin, on_step_end, on_log (every
    ``log_every`` steps), and on_train_end. The optimizer-step hooks are not fired: the engine reports its
    update phase itself.
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


# ----------------------------------------------------------------------------------------------
# Settings: everything the loop reads, resolved once from the spec (CleanRL's Args)


@dataclass
class EngineSettings:
    """The resolved settings of one engine run. Defaults live in bench.spec; this is the resolved copy."""

    mode: Mode
    """'ppo' (critic + GAE) or 'grpo' (group-relative advantage, no critic)."""
    steps: int
    """Rollout steps (one rollout batch each)."""
    prompts_per_step: int
    """Distinct prompts per rollout batch."""
    group_size: int
    """Completions sampled per prompt (G)."""
    max_new_tokens: int
    """Completion budget in tokens."""
    temperature: float
    """Sampling temperature; log-probs use logits / temperature."""
    top_p: float
    """Nucleus sampling mass (top-k off, as in TRL's GRPO)."""
    learning_rate: float
    """Peak AdamW learning rate of the actor and the critic."""
    lr_scheduler: str
    """constant | linear | cosine, stepped once per rollout step."""
    warmup_steps: int
    """Linear warm-up, in rollout steps."""
    max_grad_norm: float
    """Gradient clipping norm, per network."""
    weight_decay: float
    """AdamW weight decay."""
    kl_coef: float
    """KL coefficient against the reference (method beta, else train.kl_beta); 0 loads no reference."""
    kl_estimator: str
    """PPO: estimator of the per-token KL penalty in the reward (k1 | k3). GRPO: always k3, in the loss."""
    ppo_epochs: int
    """Passes over each rollout batch."""
    minibatches: int
    """Minibatches per pass (optimizer steps per rollout = ppo_epochs x minibatches)."""
    cliprange: float
    """Clip range of the policy ratio."""
    cliprange_value: float
    """PPO: clip range of the value prediction around the rollout value."""
    vf_coef: float
    """PPO: value-loss coefficient."""
    gamma: float
    """PPO: discount per token."""
    lam: float
    """PPO: GAE lambda."""
    missing_eos_penalty: float | None
    """Subtracted from the score of a completion without an EOS (None: off)."""
    critic_init: str
    """PPO: backbone (and head) the critic starts from: 'policy' or 'reward_model'."""
    reward_source: str
    """'model' (reward model) or 'verifier' (rule reward). GRPO always uses the verifier."""
    advantage_std: str
    """GRPO: std convention of the group advantage ('unbiased', as TRL)."""
    advantage_eps: float
    """GRPO: added to the group std (1e-4, as TRL)."""
    log_every: int
    """A curve point every N rollout steps (and at the last step)."""

    @property
    def batch_size(self) -> int:
        """Completions per rollout batch."""
        return self.prompts_per_step * self.group_size

    @property
    def minibatch_size(self) -> int:
        """Completions per optimizer step."""
        return self.batch_size // self.minibatches


def engine_settings(ctx: RunContext, mode: Mode) -> EngineSettings:
    """Resolve the matched spec and this method's settings; user errors name the key and the fix."""
    spec, t, g, m = ctx.spec, ctx.spec.train, ctx.spec.generation, ctx.method_spec
    s = EngineSettings(
        mode=mode, steps=t.steps, prompts_per_step=t.prompts_per_step, group_size=t.group_size,
        max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p,
        learning_rate=t.learning_rate if m.learning_rate is None else m.learning_rate,
        lr_scheduler=t.lr_scheduler, warmup_steps=t.warmup_steps, max_grad_norm=t.max_grad_norm,
        weight_decay=t.weight_decay, kl_coef=t.kl_beta if m.beta is None else m.beta,
        kl_estimator=m.kl_estimator if mode == "ppo" else "k3",
        ppo_epochs=m.ppo_epochs, minibatches=m.minibatches, cliprange=m.cliprange,
        cliprange_value=m.cliprange_value, vf_coef=m.vf_coef, gamma=m.gamma, lam=m.lam,
        missing_eos_penalty=m.missing_eos_penalty, critic_init=m.critic_init,
        reward_source=m.reward if mode == "ppo" else "verifier",
        advantage_std="unbiased", advantage_eps=1e-4, log_every=t.log_every,
    )
    key = f"methods.{ctx.method}"
    if s.batch_size % s.minibatches:
        raise UserError(f"completions per step ({s.batch_size}) must divide by '{key}.minibatches' ({s.minibatches}); "
                        f"choose a divisor")
    if s.ppo_epochs < 1:
        raise UserError(f"'{key}.ppo_epochs' must be >= 1, got {s.ppo_epochs}")
    if mode == "grpo" and s.group_size < 2:
        raise UserError(f"'train.group_size' must be >= 2 for {ctx.method}, got {s.group_size}")
    needs_reward_model = mode == "ppo" and (s.reward_source == "model" or s.critic_init == "reward_model")
    if needs_reward_model and ctx.reward_model_dir is None:
        raise UserError(f"{ctx.method} needs a trained reward model (reward: model or critic_init: reward_model) but "
                        f"none was given; set {key}.reward=verifier and {key}.critic_init=policy, or run the "
                        f"reward_model stage")
    if spec.train.lora.enabled:
        raise UserError(f"the suite engine ({ctx.method}) does not support LoRA yet; set train.lora.enabled=false "
                        f"or disable {ctx.method}")
    return s


# ----------------------------------------------------------------------------------------------
# Networks


class ValueModel(nn.Module):
    """A critic: a transformer backbone (no LM head) plus a scalar value head.

    forward(input_ids, attention_mask, position_ids) -> hidden states (b, L, H); ``values`` turns the
    hidden states of chosen positions into values (b, T) in reward units.
    The head is float32 whatever the backbone dtype (values and returns are small-variance regressions).
    """

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1, dtype=torch.float32)
        # N+ details: a reward/value head initialised N(0, 1/sqrt(d_model + 1)), bias 0.
        nn.init.normal_(self.head.weight, std=1.0 / math.sqrt(hidden_size + 1))
        nn.init.zeros_(self.head.bias)

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               position_ids: torch.Tensor) -> torch.Tensor:
        """Shape: (b, L) each -> (b, L, H)."""
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False)
        return out.last_hidden_state

    def values(self, hidden: torch.Tensor) -> torch.Tensor:
        """Shape: (b, T, H) -> (b, T)."""
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)


@dataclass
class Networks:
    """The resident networks of one run (None when the mode does not need them)."""

    tokenizer: Any
    actor: nn.Module
    reference: nn.Module | None
    critic: ValueModel | None
    reward: nn.Module | None


def disable_dropout(model: nn.Module) -> None:
    """Zero every dropout probability (nn.Dropout modules and attention-dropout attributes)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def freeze(model: nn.Module) -> nn.Module:
    """Eval mode, no gradients: a network that is only read."""
    model.eval()
    model.requires_grad_(False)
    return model


def load_sequence_classifier(path: Any, dtype: torch.dtype, device: str) -> nn.Module:
    """The reward model (sequence classification, one label), frozen.

    transformers 5.x rejects ``num_labels`` next to a config, so the label count is set on a config copy.
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(str(path))
    config.num_labels = 1
    model = AutoModelForSequenceClassification.from_pretrained(str(path), config=config, dtype=dtype)
    return freeze(model.to(device))


def build_critic(ctx: RunContext, s: EngineSettings, dtype: torch.dtype) -> ValueModel:
    """Value head on its own backbone (a separate copy: the critic trains, the reward model stays frozen).

    critic_init 'policy': the policy checkpoint's base model (LM head dropped), a fresh head.
    critic_init 'reward_model': the reward model's base model, and its score head copied into the value head.
    """
    from transformers import AutoModel

    if s.critic_init == "policy":
        backbone = AutoModel.from_pretrained(str(ctx.init_model_dir), dtype=dtype)
        critic = ValueModel(backbone, backbone.config.hidden_size)
    else:
        reward_model = load_sequence_classifier(ctx.reward_model_dir, dtype, "cpu")
        backbone = getattr(reward_model, reward_model.base_model_prefix)
        critic = ValueModel(backbone, backbone.config.hidden_size)
        with torch.no_grad():
            critic.head.weight.copy_(reward_model.score.weight.float())
        backbone.requires_grad_(True)  # load_sequence_classifier froze it
    return critic.to(ctx.device)


def load_networks(ctx: RunContext, s: EngineSettings) -> Networks:
    """Actor (trainable), frozen reference, critic (PPO) and frozen reward model (PPO, reward: model)."""
    assert ctx.init_model_dir is not None, "the warm_start stage provides the starting checkpoint"
    dtype = torch_dtype(ctx.spec.model.dtype)
    tokenizer = load_tokenizer(ctx.init_model_dir)
    tokenizer.padding_side = "left"
    actor = load_causal_lm(ctx.init_model_dir, ctx.spec.model, ctx.device)
    reference = freeze(load_causal_lm(ctx.init_model_dir, ctx.spec.model, ctx.device)) if s.kl_coef > 0 else None
    reward = None
    if s.mode == "ppo" and s.reward_source == "model":
        reward = load_sequence_classifier(ctx.reward_model_dir, dtype, ctx.device)
    critic = build_critic(ctx, s, dtype) if s.mode == "ppo" else None
    for net in (actor, reference, critic, reward):
        if net is not None:
            disable_dropout(net)
    if ctx.spec.train.gradient_checkpointing:
        actor.gradient_checkpointing_enable()
        if critic is not None:
            critic.backbone.gradient_checkpointing_enable()
    return Networks(tokenizer, actor, reference, critic, reward)


# ----------------------------------------------------------------------------------------------
# Forward helpers (all shapes: b completions, P padded prompt length, T completion length, V vocab)


def sequence_inputs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                    completion_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt (left-padded) + completion (right-padded) -> (input_ids, attention_mask, position_ids).

    Shape: (b, P) and (b, T) -> three (b, P + T) tensors. Positions count real tokens only, as in
    ``generate``, so a left-padded prompt gets the same positions it had during sampling.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask.long(), completion_mask.long()], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def policy_forward(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   position_ids: torch.Tensor, completion_ids: torch.Tensor, temperature: float,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the completion tokens (and the entropy at each position) under ``model``.

    Shape: inputs (b, P + T), completion_ids (b, T) -> logp (b, T) nats, entropy (b, T) nats or None.
    Only the last T + 1 positions' logits are computed (``logits_to_keep``): the logits at position i
    predict token i + 1, so positions P - 1 .. P + T - 2 score the T completion tokens. Logits are divided
    by the sampling temperature. The entropy is computed without gradient (a monitor, not a loss).
    """
    T = completion_ids.shape[1]
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                logits_to_keep=T + 1, use_cache=False)
    logits = out.logits[:, :-1] / temperature
    logp = M.logprobs_from_logits(logits, completion_ids)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = M.entropy_from_logits(logits.detach())
    return logp, entropy


def critic_values(critic: ValueModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  position_ids: torch.Tensor, n_completion: int) -> torch.Tensor:
    """Value of each completion position, read from the hidden state before the token.

    Shape: inputs (b, P + T) -> (b, T), reward units.
    """
    hidden = critic.hidden(input_ids, attention_mask, position_ids)
    return critic.values(hidden[:, -n_completion - 1 : -1])


def reward_model_scores(reward_model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        position_ids: torch.Tensor, last_index: torch.Tensor) -> torch.Tensor:
    """The reward model's score of each prompt + completion, read at its last real token.

    Shape: inputs (b, L), last_index (b,) -> (b,), reward-model units.
    """
    backbone = getattr(reward_model, reward_model.base_model_prefix)
    head = getattr(reward_model, "score", None)
    if head is None:
        raise TypeError(f"{type(reward_model).__name__} has no 'score' head; the engine reads the reward at the "
                        f"last real token from the backbone and the score head")
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=False).last_hidden_state
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return head(hidden[rows, last_index]).squeeze(-1).float()


def chunks(n: int, size: int) -> list[slice]:
    """Slices covering range(n) in pieces of ``size`` (the rollout forwards' batch size)."""
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def eos_token_ids(model: nn.Module, tokenizer: Any) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS plus the model's (as TRL's GRPO does)."""
    declared = getattr(model.generation_config, "eos_token_id", None)
    ids = [] if declared is None else [declared] if isinstance(declared, int) else list(declared)
    if tokenizer.eos_token_id not in ids:
        ids = [tokenizer.eos_token_id, *ids]
    return ids


# ----------------------------------------------------------------------------------------------
# The engine


@dataclass
class Rollout:
    """One rollout batch. b = prompts_per_step x G completions, group by group; T completion length."""

    input_ids: torch.Tensor
    """(b, P + T) prompt + completion token ids."""
    attention_mask: torch.Tensor
    """(b, P + T) 1 for real tokens."""
    position_ids: torch.Tensor
    """(b, P + T) positions of the real tokens."""
    completion_ids: torch.Tensor
    """(b, T) completion tokens, padded after the first EOS."""
    mask: torch.Tensor
    """(b, T) bool: real completion tokens (EOS included)."""
    scores: torch.Tensor
    """(b,) the score this method optimises (after the missing-EOS penalty)."""
    logs: dict[str, float]
    """Step metrics gathered while building the batch (reward, accuracy, length, ...)."""


class RolloutEngine:
    """Generate, score, compute advantages, update: PPO (mode 'ppo') or GRPO (mode 'grpo')."""

    def __init__(self, ctx: RunContext, mode: Mode) -> None:
        self.ctx = ctx
        self.s = engine_settings(ctx, mode)
        self.nets = load_networks(ctx, self.s)
        self.tokenizer = self.nets.tokenizer
        self.eos_ids = eos_token_ids(self.nets.actor, self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id
        self.prompts = prompts_for_steps(ctx.train_rows, self.s.steps, self.s.prompts_per_step)
        self.optimizers = {"actor": self._adamw(self.nets.actor)}
        if self.nets.critic is not None:
            self.optimizers["critic"] = self._adamw(self.nets.critic)
        self.schedulers = [self._schedule(opt) for opt in self.optimizers.values()]
        self.trained_tokens = 0
        self.generated_tokens = 0

    def _adamw(self, model: nn.Module) -> torch.optim.Optimizer:
        params = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=self.s.learning_rate, weight_decay=self.s.weight_decay)

    def _schedule(self, optimizer: torch.optim.Optimizer) -> Any:
        from transformers import get_scheduler

        name = "constant_with_warmup" if self.s.lr_scheduler == "constant" else self.s.lr_scheduler
        return get_scheduler(name, optimizer, num_warmup_steps=self.s.warmup_steps, num_training_steps=self.s.steps)

    # -- the loop --------------------------------------------------------------------------------
    def train(self) -> TrainOutcome:
        """Run ``steps`` rollout + update iterations and hand back the outcome."""
        s = self.s
        log_history: list[dict[str, float]] = []
        per_step: list[dict[str, float]] = []
        events = CallbackEvents(self.ctx, s.steps)  # telemetry and progress attach as for the TRL trainers
        events.fire("on_train_begin")
        for step in range(1, s.steps + 1):
            events.fire("on_step_begin")
            batch = self.rollout(step)
            update_logs = self.learn(batch)
            events.state.global_step = step
            events.fire("on_step_end")
            metrics = {"step": step, **batch.logs, **update_logs}
            per_step.append(metrics)
            if step % s.log_every == 0 or step == s.steps:
                log_history.append(metrics)
                events.state.log_history.append(metrics)
                events.fire("on_log", logs=metrics)
        events.fire("on_train_end")
        return self.outcome(log_history, per_step)

    # -- rollout ---------------------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, step: int) -> Rollout:
        """Sample, truncate, decode and score one batch (phases: generation, reward)."""
        s, nets, tel, tok = self.s, self.nets, self.ctx.telemetry, self.tokenizer
        rows = self.prompts[(step - 1) * s.prompts_per_step : step * s.prompts_per_step]
        rows = [row for row in rows for _ in range(s.group_size)]  # G completions of a prompt adjacent

        with tel.phase("generation"):
            enc = tok([r["prompt"] for r in rows], return_tensors="pt", padding=True, add_special_tokens=False)
            prompt_ids = enc["input_ids"].to(self.ctx.device)
            prompt_mask = enc["attention_mask"].to(self.ctx.device)
            nets.actor.eval()
            sequences = nets.actor.generate(
                input_ids=prompt_ids, attention_mask=prompt_mask, do_sample=True, max_new_tokens=s.max_new_tokens,
                temperature=s.temperature, top_p=s.top_p, top_k=0, repetition_penalty=1.0,
                pad_token_id=self.pad_id, eos_token_id=self.eos_ids,
            )
            raw = sequences[:, prompt_ids.shape[1] :]
            # EOS presence is read before truncation: when pad == EOS the padding would look like an EOS.
            is_eos = torch.isin(raw, torch.as_tensor(self.eos_ids, device=raw.device))
            has_eos = M.first_true_indices(is_eos) < raw.shape[1]
            completion_ids, mask = M.truncate_after_eos(raw, self.eos_ids, self.pad_id)
            lengths = mask.sum(dim=1)
            self.generated_tokens += int(lengths.sum())
            counters = tel.counters
            counters["completions"] = counters.get("completions", 0) + len(rows)
            counters["generated_tokens"] = counters.get("generated_tokens", 0) + int(lengths.sum())
        input_ids, attention_mask, position_ids = sequence_inputs(prompt_ids, prompt_mask, completion_ids, mask)

        with tel.phase("reward"):
            texts = tok.batch_decode(completion_ids, skip_special_tokens=True)
            verdicts = self.verify(texts, rows)
            verifier_total = torch.tensor([v["total"] for v in verdicts], dtype=torch.float32)
            if s.reward_source == "model":
                last_index = prompt_ids.shape[1] + lengths - 1
                scores = torch.cat([
                    reward_model_scores(nets.reward, input_ids[c], attention_mask[c], position_ids[c], last_index[c])
                    for c in chunks(len(rows), s.minibatch_size)
                ])
            else:
                scores = verifier_total.to(self.ctx.device)
            raw_scores = scores
            if s.missing_eos_penalty is not None:
                scores = scores - s.missing_eos_penalty * (~has_eos).float()

        logs = {
            "reward": verifier_total.mean().item(),
            "reward_std": verifier_total.std().item() if len(rows) > 1 else 0.0,
            "accuracy_reward": sum(v["accuracy"] for v in verdicts) / len(verdicts),
            "format_reward": sum(v["format"] for v in verdicts) / len(verdicts),
            "score": scores.mean().item(),
            "completion_length": lengths.float().mean().item(),
            "eos_rate": has_eos.float().mean().item(),
        }
        if s.reward_source == "model":
            logs["rm_score"] = raw_scores.mean().item()
        if s.mode == "grpo":
            grouped = scores.reshape(-1, s.group_size)
            logs["zero_std_groups"] = (grouped.amax(1) == grouped.amin(1)).float().mean().item()
        stats = degenerate_stats(texts, [r["answer"] for r in rows])
        logs.update({k: v for k, v in stats.items() if k != "mean_length_chars"})
        return Rollout(input_ids, attention_mask, position_ids, completion_ids, mask, scores, logs)

    def verify(self, texts: list[str], rows: list[dict[str, str]]) -> list[dict[str, float]]:
        """Rule-verifier reward of each completion (accuracy + format - length penalty).

        The length is counted by re-tokenising the decoded text, exactly as the TRL GRPO recipe counts it,
        so both GRPOs see the same length penalty.
        """
        r, tok = self.ctx.spec.reward, self.tokenizer
        return [
            score_completion(text, row["answer"], len(tok(text, add_special_tokens=False)["input_ids"]),
                             r.accuracy_weight, r.format_weight, r.length_threshold, r.length_penalty)
            for text, row in zip(texts, rows)
        ]

    # -- advantages and updates ------------------------------------------------------------------
    def learn(self, batch: Rollout) -> dict[str, float]:
        """Reference / critic forwards, advantages, then ppo_epochs x minibatches optimizer steps."""
        s, nets, tel = self.s, self.nets, self.ctx.telemetry
        b, T = batch.completion_ids.shape
        parts = chunks(b, s.minibatch_size)
        inputs = (batch.input_ids, batch.attention_mask, batch.position_ids)
        mask = batch.mask
        logs: dict[str, float] = {}

        with torch.no_grad():
            ref_logp = None
            if nets.reference is not None:
                with tel.phase("reference"):
                    ref_logp = torch.cat([policy_forward(nets.reference, *(x[c] for x in inputs),
                                                         batch.completion_ids[c], s.temperature)[0] for c in parts])
            old_values = None
            if nets.critic is not None:
                with tel.phase("critic"):
                    nets.critic.eval()
                    old_values = torch.cat([critic_values(nets.critic, *(x[c] for x in inputs), T) for c in parts])

            with tel.phase("update"):
                reuse_update_logp = s.mode == "grpo" and s.ppo_epochs * s.minibatches == 1
                old_logp = None
                if not reuse_update_logp:
                    nets.actor.eval()
                    old_logp = torch.cat([policy_forward(nets.actor, *(x[c] for x in inputs),
                                                         batch.completion_ids[c], s.temperature)[0] for c in parts])
                if s.mode == "ppo":
                    kl = (M.kl_per_token(old_logp, ref_logp, s.kl_estimator) if ref_logp is not None
                          else torch.zeros_like(old_logp))
                    rewards, non_score = M.ppo_rewards(batch.scores, kl, mask, s.kl_coef)
                    advantages, returns = M.gae(rewards, old_values, mask, s.gamma, s.lam)
                    advantages = M.masked_whiten(advantages, mask)
                    logs["kl"] = M.masked_mean(kl, mask).item()
                    logs["non_score_reward"] = non_score.sum(dim=1).mean().item()
                    logs["explained_variance"] = M.explained_variance(old_values, returns, mask).item()
                    logs["value_mean"] = M.masked_mean(old_values, mask).item()
                else:
                    per_completion = M.group_advantages(batch.scores, s.group_size, s.advantage_eps, s.advantage_std)
                    advantages = per_completion.unsqueeze(1) * mask  # the same advantage on every real token
                    returns = None

        with tel.phase("update"):
            logs.update(self.optimise(batch, inputs, old_logp, ref_logp, advantages, old_values, returns))
        return logs

    def optimise(self, batch: Rollout, inputs: tuple[torch.Tensor, ...], old_logp: torch.Tensor | None,
                 ref_logp: torch.Tensor | None, advantages: torch.Tensor, old_values: torch.Tensor | None,
                 returns: torch.Tensor | None) -> dict[str, float]:
        """ppo_epochs passes of shuffled minibatches; one optimizer step per minibatch and network."""
        s, nets = self.s, self.nets
        b, T = batch.completion_ids.shape
        mask = batch.mask
        lr = self.schedulers[0].get_last_lr()[0]
        nets.actor.train()
        if nets.critic is not None:
            nets.critic.train()
        sums: dict[str, torch.Tensor] = {}
        kl_sum = torch.zeros((), device=mask.device)
        n_updates = 0
        trained = torch.zeros((), dtype=torch.long, device=mask.device)

        def add(name: str, value: torch.Tensor) -> None:
            sums[name] = sums.get(name, 0) + value.detach().float()

        for _ in range(s.ppo_epochs):
            for idx in torch.randperm(b, device=mask.device).split(s.minibatch_size):
                mb_inputs = [x[idx] for x in inputs]
                mb_mask = mask[idx]
                logp, entropy = policy_forward(nets.actor, *mb_inputs, batch.completion_ids[idx], s.temperature,
                                               with_entropy=True)
                mb_old = logp.detach() if old_logp is None else old_logp[idx]
                loss, pstats = M.policy_loss(logp, mb_old, advantages[idx], mb_mask, s.cliprange)
                add("loss", loss)
                total = loss
                if s.mode == "grpo" and ref_logp is not None:
                    kl = M.masked_mean(M.kl_per_token(logp, ref_logp[idx], "k3"), mb_mask)
                    total = total + s.kl_coef * kl
                    kl_sum = kl_sum + kl.detach()
                if nets.critic is not None:
                    values = critic_values(nets.critic, *mb_inputs, T)
                    vloss, vstats = M.value_loss(values, old_values[idx], returns[idx], mb_mask, s.cliprange_value)
                    total = total + s.vf_coef * vloss
                    add("value_loss", vloss)
                    add("vf_clipfrac", vstats["vf_clipfrac"])
                for opt in self.optimizers.values():
                    opt.zero_grad(set_to_none=True)
                total.backward()
                torch.nn.utils.clip_grad_norm_(nets.actor.parameters(), s.max_grad_norm)
                if nets.critic is not None:
                    torch.nn.utils.clip_grad_norm_(nets.critic.parameters(), s.max_grad_norm)
                for opt in self.optimizers.values():
                    opt.step()
                add("clipfrac", pstats["clipfrac"])
                add("approx_kl", pstats["approx_kl"])
                add("entropy", M.masked_mean(entropy, mb_mask))
                trained = trained + mb_inputs[1].sum()
                n_updates += 1
        for scheduler in self.schedulers:
            scheduler.step()
        self.trained_tokens += int(trained)
        logs = {name: (value / n_updates).item() for name, value in sums.items()}
        if s.mode == "grpo":
            logs["kl"] = (kl_sum / n_updates).item() if ref_logp is not None else 0.0
        logs["learning_rate"] = lr
        return logs

    # -- result ----------------------------------------------------------------------------------
    def outcome(self, log_history: list[dict[str, float]], per_step: list[dict[str, float]]) -> TrainOutcome:
        """The trained actor, the resident networks and the run's settings and summary metrics."""
        s, nets = self.s, self.nets
        networks: dict[str, nn.Module] = {"actor": nets.actor}
        for role, net in (("critic", nets.critic), ("reward", nets.reward), ("reference", nets.reference)):
            if net is not None:
                networks[role] = net
        fifth = max(1, len(per_step) // 5)
        first, last = per_step[:fifth], per_step[-fifth:]

        def mean(points: list[dict[str, float]], key: str) -> float:
            return sum(p[key] for p in points) / len(points)

        metrics: dict[str, Any] = {
            "rollout_steps": s.steps,
            "optimizer_steps": s.steps * s.ppo_epochs * s.minibatches,
            "reward_first_fifth": mean(first, "reward"), "reward_last_fifth": mean(last, "reward"),
            "accuracy_reward_first_fifth": mean(first, "accuracy_reward"),
            "accuracy_reward_last_fifth": mean(last, "accuracy_reward"),
            "score_first_fifth": mean(first, "score"), "score_last_fifth": mean(last, "score"),
        }
        if s.mode == "grpo":
            metrics["zero_std_groups_mean"] = mean(per_step, "zero_std_groups")
        return TrainOutcome(
            policy=nets.actor, tokenizer=self.tokenizer, networks=networks, optimizers=dict(self.optimizers),
            log_history=log_history, steps=s.steps * s.ppo_epochs * s.minibatches,
            completions=s.steps * s.batch_size, generated_tokens=self.generated_tokens,
            trained_tokens=self.trained_tokens, settings=self.settings(), metrics=metrics,
        )

    def settings(self) -> dict[str, Any]:
        """What this engine run does differently from the matched budget (the report's 'what differs')."""
        s = self.s
        common = {
            "engine": "suite", "mode": s.mode, "ppo_epochs": s.ppo_epochs, "minibatches": s.minibatches,
            "optimizer_steps_per_rollout": s.ppo_epochs * s.minibatches, "cliprange": s.cliprange,
            "learning_rate": s.learning_rate, "kl_coef": s.kl_coef, "missing_eos_penalty": s.missing_eos_penalty,
            "reward_source": s.reward_source, "loss_aggregation": "token mean over the minibatch",
            "logprob_temperature": s.temperature, "lr_schedule_unit": "rollout step",
            "optimizers": "AdamW per network, grad clip per network",
        }
        if s.mode == "ppo":
            return {**common, "advantage": "GAE, whitened over the batch's real tokens", "gamma": s.gamma,
                    "lam": s.lam, "vf_coef": s.vf_coef, "cliprange_value": s.cliprange_value,
                    "kl_estimator": s.kl_estimator, "kl_placement": "per-token penalty in the reward",
                    "critic_init": s.critic_init}
        return {**common, "advantage": f"group (r - mean) / (std + {s.advantage_eps}), {s.advantage_std} std",
                "advantage_std": s.advantage_std, "kl_estimator": "k3", "kl_placement": "loss term beta * k3"}


def train(ctx: RunContext, mode: Mode) -> TrainOutcome:
    """Build the engine for ``mode`` ('ppo' or 'grpo') and train (the recipes' one call)."""
    return RolloutEngine(ctx, mode).train()


__all__ = ["EngineSettings", "RolloutEngine", "ValueModel", "engine_settings", "train"]
