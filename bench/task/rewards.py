"""Rule-based rewards (accuracy, format, length penalty) and degenerate-output monitors. Pure Python.

One scoring rule, two call sites: `score_completion` for the suite's own rollout engine (PPO / engine GRPO,
and the sample pool), and `make_reward_functions` for TRL's GRPOTrainer, whose weighted sum of the three
functions equals `score_completion`'s ``total`` for the same completion and token count.

Reward per completion (unitless):
    total = accuracy_weight * accuracy + format_weight * format - length_penalty * max(0, n_tokens - length_threshold)
where accuracy is 1.0 when the suite-strict answer equals the gold number (`bench.task.verifier.is_correct`) and
format is 1.0 when the completion is ``<think>...</think> <answer>...</answer>`` (`bench.task.verifier.has_format`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from bench.task.verifier import extract_answer, has_format, is_correct


def score_completion(completion: str, gold: str, n_tokens: int, accuracy_weight: float, format_weight: float,
                     length_threshold: int, length_penalty: float, *, mode: str = "suite-strict") -> dict[str, float]:
    """Reward of one completion and its parts.

    Args:
        completion: the generated text (without the prompt).
        gold: the gold answer as a bare number (``"18"``).
        n_tokens: the completion's length in tokens.
        accuracy_weight / format_weight: reward for a correct answer / for the right format.
        length_threshold: tokens allowed before the length penalty starts.
        length_penalty: reward lost per token past ``length_threshold``.
        mode: answer extraction mode for accuracy (`bench.task.verifier.MODES`); training uses ``suite-strict``.

    Returns ``{"total", "accuracy", "format", "length_penalty"}``: ``accuracy`` and ``format`` are 0.0 or
    1.0 (unweighted); ``length_penalty`` is the non-negative amount subtracted (already multiplied by the
    per-token rate); ``total`` is the weighted sum above.
    """
    accuracy = 1.0 if is_correct(completion, gold, mode) else 0.0
    fmt = 1.0 if has_format(completion) else 0.0
    penalty = length_penalty * max(0, n_tokens - length_threshold)
    total = accuracy_weight * accuracy + format_weight * fmt - penalty
    return {"total": float(total), "accuracy": accuracy, "format": fmt, "length_penalty": float(penalty)}


def completion_text(completion: Any) -> str:
    """The text of one completion as TRL passes it: a string, or a chat-message list
    ``[{"role": "assistant", "content": ...}]`` (assistant contents joined; content parts' text joined)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, Sequence):
        messages = [m for m in completion if isinstance(m, dict)]
        chosen = [m for m in messages if m.get("role") == "assistant"] or messages
        parts = []
        for message in chosen:
            content = message.get("content", "")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, Sequence):  # multimodal style: [{"type": "text", "text": ...}]
                parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
        return "".join(parts)
    raise TypeError(f"completion must be a string or a list of chat messages, got {type(completion).__name__}")


def make_reward_functions(accuracy_weight: float, format_weight: float, length_threshold: int,
                          length_penalty: float, count_tokens: Callable[[str], int],
                          ) -> tuple[list[Callable[..., list[float]]], list[float]]:
    """TRL GRPOTrainer reward functions and their weights (for ``GRPOConfig.reward_weights``).

    Returns ``([accuracy, format, length_penalty], [accuracy_weight, format_weight, 1.0])``. Each function
    has TRL's signature ``f(prompts, completions, answer, **kwargs) -> list[float]`` (``answer`` is the
    dataset column of bare gold numbers) and a ``__name__`` TRL logs it under (``rewards/accuracy/mean``...).
    ``accuracy`` and ``format`` return 0.0/1.0; ``length_penalty`` returns
    ``-length_penalty * max(0, count_tokens(text) - length_threshold)`` (already in reward units, hence
    weight 1.0). Tokens are counted with ``count_tokens`` on the completion text, the same count the suite's
    engine passes to `score_completion`, so both paths give the same total.
    """

    def texts(completions: Sequence[Any]) -> list[str]:
        return [completion_text(c) for c in completions]

    def accuracy(prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[str] | None = None,
                 **kwargs: Any) -> list[float]:
        if answer is None:
            raise ValueError("the accuracy reward needs the dataset's 'answer' column (bare gold numbers)")
        return [1.0 if is_correct(text, gold) else 0.0 for text, gold in zip(texts(completions), answer, strict=True)]

    def format_(prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[str] | None = None,
                **kwargs: Any) -> list[float]:
        return [1.0 if has_format(text) else 0.0 for text in texts(completions)]

    def length(prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[str] | None = None,
               **kwargs: Any) -> list[float]:
        # 0.0 - x rather than -x so that no-penalty comes out as 0.0, not -0.0.
        return [0.0 - length_penalty * max(0, count_tokens(text) - length_threshold) for text in texts(completions)]

    accuracy.__name__ = "accuracy"
    format_.__name__ = "format"
    length.__name__ = "length_penalty"
    return [accuracy, format_, length], [float(accuracy_weight), float(format_weight), 1.0]


# ------------------------------------------------------------------------------------ degenerate outputs

# A short unit (4..50 characters) repeated back to back `threshold` times:
# the signature of a generation loop ("1+1=21+1=21+1=2"), whatever the tokenizer or spacing.
_CHAR_LOOP_MIN_UNIT = 4
_CHAR_LOOP_MAX_UNIT = 50
# Longest word span checked for loops; longer loop units are rare and would make the check quadratic.
_WORD_LOOP_MAX_UNIT = 50
# A single character repeated this many times ("!!!!...", "0000..."): longer than any number in GSM8K.
_CHAR_RUN = 20


def is_empty_answer(completion: Any) -> bool:
    """True when no answer can be extracted in suite-strict mode (no ``<answer>`` number, ``####``, ...)."""
    return extract_answer(completion_text(completion), "suite-strict") is None


def _word_loop(words: list[str], ngram: int, threshold: int) -> bool:
    """True when some span of ``ngram``..50 words is immediately repeated until it occurs ``threshold`` times.

    A span of ``size`` words repeats ``threshold`` times back to back exactly when ``words[i] ==
    words[i + size]`` holds for ``size * (threshold - 1)`` consecutive ``i``: one linear pass per size.
    """
    n = len(words)
    for size in range(ngram, min(_WORD_LOOP_MAX_UNIT, n // threshold) + 1):
        need, run = size * (threshold - 1), 0
        for i in range(n - size):
            run = run + 1 if words[i] == words[i + size] else 0
            if run >= need:
                return True
    return False


def has_repetition(completion: Any, ngram: int = 3, threshold: int = 3) -> bool:
    """True when the completion shows a repetition loop: some span repeated ``threshold`` times back to back.

    Back to back, not anywhere: natural worked solutions reuse phrases ("the number of", "cups of feed")
    many times; counting scattered repeats flagged 18% of GSM8K's own reference solutions, while a
    generation loop repeats its span contiguously. Three checks, any one suffices:
    - words: a span of ``ngram`` to 50 whitespace-separated words, repeated ``threshold`` times in a row
      ("He has 5. He has 5. He has 5.");
    - characters: a unit of 4..50 characters, repeated ``threshold`` times in a row (loops without spaces,
      common in tiny models: "1+1=21+1=21+1=2"); runs of one character are shortened to three first, so a
      number such as 1000000000000 is not a loop;
    - one character 20 or more times in a row ("!!!!...", "0000..."): longer than any number in GSM8K.
    """
    if ngram < 1 or threshold < 2:
        raise ValueError(f"need ngram >= 1 and threshold >= 2, got ngram={ngram}, threshold={threshold}")
    text = completion_text(completion)
    if _word_loop(text.split(), ngram, threshold):
        return True
    if re.search(r"(.)\1{%d,}" % (_CHAR_RUN - 1), text, re.DOTALL):
        return True
    collapsed = re.sub(r"(.)\1{3,}", r"\1\1\1", text, flags=re.DOTALL)
    loop = r"(.{%d,%d}?)\1{%d,}" % (_CHAR_LOOP_MIN_UNIT, _CHAR_LOOP_MAX_UNIT, threshold - 1)
    return re.search(loop, collapsed, re.DOTALL) is not None


def degenerate_stats(completions: Sequence[Any], golds: Sequence[str] | None = None) -> dict[str, float]:
    """Reward-hacking monitors over a batch of completions (rates in [0, 1], length in characters).

    Returns ``empty_answer_rate`` (`is_empty_answer`), ``repetition_rate`` (`has_repetition` with defaults),
    ``format_only_rate`` and ``mean_length_chars``. ``format_only_rate`` is the share of completions with
    the right format but no credit: with ``golds`` (bare gold numbers, one per completion) that means the
    strict answer is wrong; without them it can only mean the answer block holds no extractable number, a
    lower bound. An empty batch gives all zeros.
    """
    texts = [completion_text(c) for c in completions]
    if golds is not None and len(golds) != len(texts):
        raise ValueError(f"got {len(texts)} completions but {len(golds)} golds")
    if not texts:
        return {"empty_answer_rate": 0.0, "repetition_rate": 0.0, "format_only_rate": 0.0, "mean_length_chars": 0.0}
    n = len(texts)
    empty = [is_empty_answer(t) for t in texts]
    if golds is None:
        format_only = sum(has_format(t) and e for t, e in zip(texts, empty))
    else:
        format_only = sum(has_format(t) and not is_correct(t, g) for t, g in zip(texts, golds))
    return {
        "empty_answer_rate": sum(empty) / n,
        "repetition_rate": sum(has_repetition(t) for t in texts) / n,
        "format_only_rate": format_only / n,
        "mean_length_chars": sum(len(t) for t in texts) / n,
    }
