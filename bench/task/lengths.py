"""Max sequence lengths for TRL's trainers, derived from the data and ``generation.max_new_tokens``.

A hard-coded ``max_length`` silently loses data: a GSM8K chat prompt plus 512 generated tokens is longer
than 256 tokens, so DPO would lose the final answer (the only thing that separates chosen from rejected)
and the reward model would lose whole pairs. Here the length is derived from the longest example instead,
capped only by the model's context (``max_position_embeddings``), and what would still be lost is counted
so a run can stop before training on mangled data (:func:`check_loss`).

What TRL 1.16 does with ``max_length`` (read from trl/trainer/{sft,dpo,reward}_{config,trainer}.py):

- ``SFTConfig.max_length`` (default 1024): prompt + completion + EOS is TRUNCATED during dataset
  preparation, keeping the start (``truncation_mode="keep_start"``, the only mode not deprecated): the end
  of the completion is cut. Examples left with no completion token to learn from (the prompt alone fills
  ``max_length``) are then DROPPED.
- ``DPOConfig.max_length`` (default 1024): prompt + chosen + EOS and prompt + rejected + EOS are each
  TRUNCATED by the collator, keeping the start, so the completion's end (the final answer) is cut. Pairs whose
  prompt alone is at least ``max_length`` tokens are DROPPED when the dataset is prepared. TRL 1.16 has
  no ``max_prompt_length`` or ``max_completion_length`` in ``DPOConfig``.
- ``RewardConfig.max_length`` (default 1024): nothing is truncated; a pair is DROPPED (filtered out of the
  dataset) when its prompt + chosen + EOS or its prompt + rejected + EOS is longer than ``max_length``.

Every length here is in tokens and counts what TRL tokenises: ``prompt + completion`` with the EOS text
appended unless already there, plus any special tokens the tokenizer adds itself (a BOS, for some models).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

LOSS_LIMIT_PERCENT = 5
"""Largest share of examples (percent) a stage may truncate or drop before :func:`check_loss` stops the run."""


@dataclass
class LengthBudget:
    """The max length given to a TRL trainer and what it would cost in data."""

    max_length: int
    """Tokens per sequence (prompt + completion + EOS) passed as the trainer's ``max_length``."""
    examples: int
    """Examples (SFT rows or preference pairs) measured."""
    truncated: int
    """Examples whose completion would be cut at ``max_length`` (TRL keeps the start, so the end is lost)."""
    dropped: int
    """Examples TRL would remove entirely (RewardTrainer: any pair over ``max_length``; SFT/DPO: a prompt
    that alone fills ``max_length``)."""
    longest: int
    """Tokens in the longest sequence of the data (before any cut)."""
    cap: int | None = None
    """The model's context in tokens when it was applied as an upper bound, else None."""
    unit: str = "examples"
    """What one example is, for messages: 'examples' or 'pairs'."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for results.json (``TrainOutcome.metrics['lengths']``)."""
        return asdict(self)


def token_lengths(tokenizer: Any, texts: list[str]) -> list[int]:
    """Tokens in each text, without the tokenizer's own special tokens (one batched call)."""
    if not texts:
        return []
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def model_context(model: Any) -> int | None:
    """The model's context in tokens (``config.max_position_embeddings``), or None when it has none."""
    config = getattr(model, "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def _special_tokens(tokenizer: Any) -> int:
    """Tokens the tokenizer adds around one text (e.g. a BOS): TRL tokenises with them, so they count."""
    count = getattr(tokenizer, "num_special_tokens_to_add", None)
    return int(count(pair=False)) if callable(count) else 0


def _with_eos(text: str, eos: str) -> str:
    """``text`` with the EOS text appended as TRL does (only when it does not already end with it)."""
    return text if not eos or text.endswith(eos) else text + eos


def _prompt_and_sequence_lengths(tokenizer: Any, prompts: list[str], completions: list[str]) -> tuple[list[int],
                                                                                                     list[int]]:
    """(prompt tokens, prompt + completion + EOS tokens) per example, special tokens included.

    The full sequence is tokenised as one text, as TRL does, so tokens merging across the boundary are
    counted correctly.
    """
    eos = getattr(tokenizer, "eos_token", None) or ""
    extra = _special_tokens(tokenizer)
    prompt_lengths = [n + extra for n in token_lengths(tokenizer, prompts)]
    sequences = [_with_eos(p + c, eos) for p, c in zip(prompts, completions)]
    return prompt_lengths, [n + extra for n in token_lengths(tokenizer, sequences)]


def derive_max_length(prompt_lengths: list[int], sequence_lengths: list[list[int]], max_new_tokens: int,
                      cap: int | None) -> int:
    """``longest prompt + max(longest completion, max_new_tokens + 1)`` tokens, then at most ``cap``.

    A completion's length includes its EOS; ``max_new_tokens + 1`` is a generation that ran to the limit
    (no EOS generated) plus the EOS TRL appends, so any completion the matched generation settings can
    produce fits, not just the ones in this data. Every example of the data fits by construction; only
    ``cap`` (the model's context) can make the result shorter than an example.
    """
    longest_prompt = max(prompt_lengths, default=0)
    longest_completion = max((s - p for p, seqs in zip(prompt_lengths, sequence_lengths) for s in seqs), default=0)
    derived = longest_prompt + max(longest_completion, max_new_tokens + 1)
    return min(derived, cap) if cap is not None else derived


def _budget(prompt_lengths: list[int], sequence_lengths: list[list[int]], max_new_tokens: int,
            cap: int | None, *, drops: bool, unit: str) -> LengthBudget:
    """Derive the max length and count what TRL would cut (``drops=False``) or drop (``drops=True``)."""
    max_length = derive_max_length(prompt_lengths, sequence_lengths, max_new_tokens, cap)
    truncated = dropped = 0
    for prompt, seqs in zip(prompt_lengths, sequence_lengths):
        too_long = max(seqs) > max_length
        if (too_long if drops else prompt >= max_length):
            dropped += 1
        elif too_long:
            truncated += 1
    longest = max((max(seqs) for seqs in sequence_lengths), default=0)
    capped = cap if cap is not None and max_length == cap else None
    return LengthBudget(max_length=max_length, examples=len(prompt_lengths), truncated=truncated, dropped=dropped,
                        longest=longest, cap=capped, unit=unit)


def sft_budget(tokenizer: Any, rows: list[dict[str, str]], max_new_tokens: int,
               cap: int | None = None) -> LengthBudget:
    """Max length for SFTTrainer on {'prompt', 'completion'} rows (SFT truncates, keeping the start).

    ``max_length = longest prompt + max(longest completion + EOS, max_new_tokens + 1)`` tokens, at most
    ``cap``. Counted as truncated: rows whose completion would be cut; as dropped: rows whose prompt alone
    fills ``max_length`` (TRL removes them, they have nothing left to learn from).
    """
    prompts, sequences = _prompt_and_sequence_lengths(tokenizer, [r["prompt"] for r in rows],
                                                      [r["completion"] for r in rows])
    return _budget(prompts, [[s] for s in sequences], max_new_tokens, cap, drops=False, unit="examples")


def pair_budget(tokenizer: Any, pairs: list[dict[str, str]], max_new_tokens: int, *, drops: bool,
                cap: int | None = None) -> LengthBudget:
    """Max length for {'prompt', 'chosen', 'rejected'} pairs: DPOTrainer (``drops=False``) or RewardTrainer
    (``drops=True``).

    ``max_length = longest prompt + max(longest chosen or rejected + EOS, max_new_tokens + 1)`` tokens, at
    most ``cap``. DPO truncates each sequence keeping the start (the answer at the end is what is lost) and
    drops pairs whose prompt alone fills ``max_length``; RewardTrainer drops any pair with a sequence over
    ``max_length``.
    """
    prompts = [p["prompt"] for p in pairs]
    prompt_lengths, chosen = _prompt_and_sequence_lengths(tokenizer, prompts, [p["chosen"] for p in pairs])
    _, rejected = _prompt_and_sequence_lengths(tokenizer, prompts, [p["rejected"] for p in pairs])
    return _budget(prompt_lengths, [list(s) for s in zip(chosen, rejected)], max_new_tokens, cap, drops=drops,
                   unit="pairs")


def check_loss(budget: LengthBudget, stage: str, setting: str) -> None:
    """Raise a one-line UserError when more than 5% of the examples would be truncated or dropped.

    ``setting`` is the fix to name, e.g. 'lower generation.max_new_tokens'; the message adds the other fix
    (a model with a longer context). Training on data whose answers were cut (DPO) or silently thinned
    (reward model) would measure something else than the preset claims, so the run stops instead.
    """
    from bench.errors import UserError

    lost = budget.truncated + budget.dropped
    if lost * 100 <= LOSS_LIMIT_PERCENT * budget.examples:  # integers: exactly 5% passes
        return
    verb = {(True, False): "truncate", (False, True): "drop"}.get((budget.truncated > 0, budget.dropped > 0),
                                                                   "truncate or drop")
    where = f"{budget.max_length:,} tokens" + (", the model's context" if budget.cap is not None else "")
    raise UserError(f"{stage} would {verb} {lost / budget.examples:.1%} of its {budget.examples:,} {budget.unit} "
                    f"(longer than {where}); {setting} or use a model with a longer context")
