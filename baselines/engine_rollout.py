"""The rollout batch of the suite engine and the monitor that compares its sampler with the trainer.

``Rollout`` is one step's completions (b completions, group by group; P padded prompt length; T completion
length), ``sequence_inputs`` joins prompts and completions the way ``generate`` saw them, and ``SamplerMismatch``
measures, with the vLLM backend, how far the trainer's log-probs are from the sampler's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


def select_and_join(parts: list[tuple[Rollout, torch.Tensor]], pad_id: int) -> Rollout:
    """The rows ``index`` of each rollout, in order, joined into one batch: prompts left-padded and completions
    right-padded to the widest, positions recomputed as ``generate`` saw them (DAPO's dynamic sampling keeps
    groups from several generation rounds).

    Shape: parts [(Rollout with b_k rows, index (m_k,))] -> Rollout with sum m_k rows.
    """
    P = max(b.input_ids.shape[1] - b.completion_ids.shape[1] for b, _ in parts)
    T = max(b.completion_ids.shape[1] for b, _ in parts)
    prompt_ids, prompt_mask, completion_ids, mask, logps = [], [], [], [], []
    for b, index in parts:
        t_k = b.completion_ids.shape[1]
        p_k = b.input_ids.shape[1] - t_k
        pad_left, pad_right = P - p_k, T - t_k
        prompt_ids.append(torch.nn.functional.pad(b.input_ids[index, :p_k], (pad_left, 0), value=pad_id))
        prompt_mask.append(torch.nn.functional.pad(b.attention_mask[index, :p_k], (pad_left, 0), value=0))
        completion_ids.append(torch.nn.functional.pad(b.completion_ids[index], (0, pad_right), value=pad_id))
        mask.append(torch.nn.functional.pad(b.mask[index], (0, pad_right), value=False))
        if b.sampler_logprobs is not None:
            logps.append(torch.nn.functional.pad(b.sampler_logprobs[index], (0, pad_right), value=0.0))
    completions, masks = torch.cat(completion_ids), torch.cat(mask)
    input_ids, attention_mask, position_ids = sequence_inputs(torch.cat(prompt_ids), torch.cat(prompt_mask),
                                                              completions, masks)
    rows, texts, eos = [], [], []
    for b, index in parts:
        rows += [b.rows[i] for i in index.tolist()]
        texts += [b.texts[i] for i in index.tolist()]
        eos.append(b.has_eos[index])
    return Rollout(rows, input_ids, attention_mask, position_ids, completions, masks, torch.cat(eos), texts,
                   torch.cat(logps) if len(logps) == len(parts) else None)
