"""What one step of the suite engine does: the named pieces a recipe's step calls, in the order it calls them.

``StepPieces`` is the run's ``Placement`` (baselines.engine_placement: where the networks live) plus the pieces of
a rollout step: ``sample`` (generation), ``verify`` / ``reward_model_scores`` / ``eos_penalised`` (reward),
``logprobs`` / ``rollout_logprobs`` (reference and rollout forwards), ``values`` / ``rollout_values`` (critic),
``importance_weights`` (vLLM's correction), ``optimise`` (the minibatch loop). A rollout batch is a ``Rollout``
(b completions, group by group; P padded prompt length; T completion length; V vocabulary).

Choices (sources: Huang et al. 2024 "The N+ Implementation Details of RLHF with PPO"; TRL's GRPOTrainer):
- Log-probs divide the logits by the sampling temperature, so ``old_logp`` is the log-prob of the distribution
  that sampled the token. Every forward passes ``position_ids`` from the attention mask, so left-padded prompts
  see the positions they had in ``generate``.
- Memory: every forward runs ``train.micro_batch_size`` sequences at a time; log-probs and entropies are taken
  a few sequences at a time in float32 (``rl_math.logprobs_from_logits``), never as a float32 copy of the whole
  (b, T, V) logits. The minibatch loss is a sum over micro-batches of per-token losses times weights computed
  for the whole minibatch (``rl_math.loss_weights``), so gradients do not depend on the micro-batch size.
- Several processes: rank k samples prompts k x P/N .. (k + 1) x P/N - 1 of each step (in the seeded global
  order), so the ranks train on different prompts and together on the step's P x G completions. Each rank
  normalises its loss over its own completions and DDP averages.
- Counts: completions and generated tokens go to the telemetry's counters, the one place they are kept (the
  result reads them there, as for TRL's recipes); trained tokens and optimizer steps are the engine's own.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from baselines import rl_math as M
from baselines.engine_config import EngineConfig
from baselines.engine_placement import Placement
from baselines.engine_rollout import Rollout, SamplerMismatch, sequence_inputs
from bench.execution.context import RunContext
from bench.model import vllm_backend
from bench.model.generation import eos_token_ids, generate_with_logprobs, sampling_settings
from bench.model.loading import reward_read_positions
from bench.task.data import prompts_for_steps
from bench.task.rewards import score_completion
from bench.telemetry.monitors import completion_monitors


LossFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]
"""loss_fn(rows, weights) -> (loss, stats): rows (m,) indices into the rollout, weights (m, T) from
``rl_math.loss_weights``; loss = sum(per_token * weights) (a scalar to backpropagate); stats are scalars
already weighted the same way, so their sum over a minibatch's micro-batches is the minibatch's value."""


class StepPieces(Placement):
    """The networks of one run (:class:`Placement`) and the named pieces of one on-policy step."""

    def __init__(self, ctx: RunContext, cfg: EngineConfig, *, kl_coef: float, critic_init: str | None = None,
                 reward_model: bool = False, critic_learning_rate: float | None = None) -> None:
        """See :class:`Placement`; adds what sampling reads (EOS ids, the matched settings, the prompt order)."""
        super().__init__(ctx, cfg, kl_coef=kl_coef, critic_init=critic_init, reward_model=reward_model,
                         critic_learning_rate=critic_learning_rate)
        self.eos_ids = eos_token_ids(self.actor, self.tokenizer)
        self.generation = sampling_settings(ctx.spec, self.tokenizer, self.eos_ids, greedy=False)
        self.prompts = prompts_for_steps(ctx.train_rows, ctx.spec.train.steps, ctx.spec.train.prompts_per_step)
        self.optimizer_steps = 0
        self.trained_tokens = 0
        self.mismatch: SamplerMismatch | None = None
        """The step's rollout-vs-trainer monitor (vLLM backend), reset by every ``sample``."""

    def micro_batches(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """``rows`` (indices) in pieces of train.micro_batch_size (0: one piece)."""
        size = self.micro_batch_size or len(rows)
        return list(rows.split(size))

    # -- 1. generation ---------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, step: int) -> Rollout:
        """G completions for each of this step's prompts with the matched settings, cut after the first EOS."""
        t = self.spec.train
        first = (step - 1) * t.prompts_per_step
        rows = self.prompts[first: step * t.prompts_per_step]
        if self.world_size > 1:  # this rank's shard of the step's prompts (validated: N divides prompts_per_step)
            share = t.prompts_per_step // self.world_size
            first += self.rank * share
            rows = rows[self.rank * share: (self.rank + 1) * share]
            # positions in the matched prompt order: the rank file shows which prompts each rank trained on
            getattr(self.ctx.telemetry, "prompt_ids", []).extend(range(first, first + share))
        return self.sample_prompts(rows)

    @torch.no_grad()
    def sample_prompts(self, rows: list[dict[str, str]]) -> Rollout:
        """G completions for each prompt row of ``rows`` (the body of ``sample``; DAPO's dynamic sampling calls it
        again for the prompts it draws beyond the step's). Every completion and token is counted."""
        t, tok = self.spec.train, self.tokenizer
        rows = [row for row in rows for _ in range(t.group_size)]  # G completions of a prompt adjacent
        enc = tok([r["prompt"] for r in rows], return_tensors="pt", padding=True, add_special_tokens=False)
        prompt_ids, prompt_mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        self.actor.eval()
        # no bf16 weight copies held for the whole generate call; under ZeRO-3 the actor's whole weights
        with self.autocast(cache=False), self.gathered("actor", without_hooks=True):
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
            out = self.through_ddp(model)(input_ids=batch.input_ids[rows], attention_mask=batch.attention_mask[rows],
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
        critic = self.through_ddp(self.critic)
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
            with self.no_sync(start != starts[-1]):
                loss, stats = loss_fn(rows[start:start + size], weights[start:start + size])
                loss.backward()
            for name, value in stats.items():
                totals[name] = totals.get(name, 0) + value.detach().float()
        return totals


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
