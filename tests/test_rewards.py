"""bench.task.rewards: reward maths by hand, TRL's reward-function signature, degenerate-output monitors."""

from __future__ import annotations

import pytest

from bench.task.rewards import (completion_text, degenerate_stats, has_repetition, is_empty_answer,
                           make_reward_functions, score_completion)

GOOD = "<think>12+7=19</think> <answer>19</answer>"
WRONG = "<think>12+7=18</think> <answer>18</answer>"
NO_FORMAT = "12+7=19 #### 19"
WEIGHTS = {"accuracy_weight": 1.0, "format_weight": 0.1, "length_threshold": 28, "length_penalty": 0.01}


# --- score_completion ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("completion", "n_tokens", "expected"), [
    # correct + format, under threshold: 1.0*1 + 0.1*1 - 0 = 1.1
    (GOOD, 20, {"total": 1.1, "accuracy": 1.0, "format": 1.0, "length_penalty": 0.0}),
    # exactly at the threshold: no penalty
    (GOOD, 28, {"total": 1.1, "accuracy": 1.0, "format": 1.0, "length_penalty": 0.0}),
    # 40 tokens: 12 over, 0.01*12 = 0.12; 1.1 - 0.12 = 0.98
    (GOOD, 40, {"total": 0.98, "accuracy": 1.0, "format": 1.0, "length_penalty": 0.12}),
    # wrong answer, right format: 0.1
    (WRONG, 10, {"total": 0.1, "accuracy": 0.0, "format": 1.0, "length_penalty": 0.0}),
    # correct (strict, via ####) without the format: 1.0
    (NO_FORMAT, 10, {"total": 1.0, "accuracy": 1.0, "format": 0.0, "length_penalty": 0.0}),
    # nothing right and 128 tokens: -0.01*100 = -1.0
    ("blah", 128, {"total": -1.0, "accuracy": 0.0, "format": 0.0, "length_penalty": 1.0}),
])
def test_score_completion_by_hand(completion: str, n_tokens: int, expected: dict) -> None:
    got = score_completion(completion, "19", n_tokens, **WEIGHTS)
    assert set(got) == {"total", "accuracy", "format", "length_penalty"}
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key


def test_score_completion_other_weights() -> None:
    # 2*1 + 0.5*1 - 0.1*(35-30) = 2.5 - 0.5 = 2.0
    got = score_completion(GOOD, "19", 35, accuracy_weight=2.0, format_weight=0.5, length_threshold=30,
                           length_penalty=0.1)
    assert got["total"] == pytest.approx(2.0)
    assert got["length_penalty"] == pytest.approx(0.5)


def test_score_completion_accuracy_is_suite_strict_by_default() -> None:
    assert score_completion("it is 19", "19", 5, **WEIGHTS)["accuracy"] == 0.0
    assert score_completion("it is 19", "19", 5, **WEIGHTS, mode="suite-flexible")["accuracy"] == 1.0


# --- TRL reward functions -----------------------------------------------------------------------------

def count_chars(text: str) -> int:
    """Stand-in tokenizer: one token per character."""
    return len(text)


def test_reward_functions_names_and_weights() -> None:
    funcs, weights = make_reward_functions(1.0, 0.1, 28, 0.01, count_chars)
    assert [f.__name__ for f in funcs] == ["accuracy", "format", "length_penalty"]
    assert weights == [1.0, 0.1, 1.0]


def test_reward_functions_string_completions() -> None:
    funcs, _ = make_reward_functions(1.0, 0.1, 28, 0.01, count_chars)
    accuracy, fmt, length = funcs
    completions = [GOOD, WRONG, NO_FORMAT]  # 42, 42, 15 characters
    prompts = ["p"] * 3
    answer = ["19", "19", "19"]
    assert accuracy(prompts, completions, answer) == [1.0, 0.0, 1.0]
    assert fmt(prompts=prompts, completions=completions, answer=answer) == [1.0, 1.0, 0.0]
    # 42 chars: 14 over the threshold of 28 -> -0.14; 15 chars: no penalty.
    assert length(prompts, completions, answer) == pytest.approx([-0.14, -0.14, 0.0])
    assert length(prompts, completions, answer)[2] == 0.0


def test_reward_functions_chat_completions_and_extra_kwargs() -> None:
    funcs, _ = make_reward_functions(1.0, 0.1, 28, 0.01, count_chars)
    accuracy, fmt, _length = funcs
    completions = [[{"role": "assistant", "content": GOOD}], [{"role": "assistant", "content": WRONG}]]
    prompts = [[{"role": "user", "content": "q"}]] * 2
    # TRL passes other dataset columns and completion_ids as keyword arguments.
    extra = {"question": ["q", "q"], "completion_ids": [[1, 2], [3]], "trainer_state": None}
    assert accuracy(prompts, completions, answer=["19", "19"], **extra) == [1.0, 0.0]
    assert fmt(prompts, completions, answer=["19", "19"], **extra) == [1.0, 1.0]


def test_reward_functions_weighted_sum_matches_score_completion() -> None:
    funcs, weights = make_reward_functions(1.0, 0.1, 28, 0.01, count_chars)
    for completion in (GOOD, WRONG, NO_FORMAT, "x" * 100):
        parts = [f(["p"], [completion], ["19"])[0] for f in funcs]
        total = sum(w * p for w, p in zip(weights, parts))
        assert total == pytest.approx(score_completion(completion, "19", len(completion), **WEIGHTS)["total"])


def test_accuracy_reward_without_answer_column_raises() -> None:
    funcs, _ = make_reward_functions(1.0, 0.1, 28, 0.01, count_chars)
    with pytest.raises(ValueError, match="answer"):
        funcs[0](["p"], [GOOD])


def test_completion_text_forms() -> None:
    assert completion_text("abc") == "abc"
    assert completion_text([{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]) == "ab"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "hi"}]}]) == "hi"
    assert completion_text({"role": "assistant", "content": "x"}) == "x"
    with pytest.raises(TypeError):
        completion_text(42)


# --- degenerate-output monitors -----------------------------------------------------------------------

@pytest.mark.parametrize(("completion", "expected"), [
    (GOOD, False),
    ("#### 5", False),
    ("<think>x</think><answer>five</answer>", True),
    ("the result is 5", True),  # a bare number is not a strict answer
    ("", True),
])
def test_is_empty_answer(completion: str, expected: bool) -> None:
    assert is_empty_answer(completion) is expected


@pytest.mark.parametrize(("completion", "expected"), [
    (GOOD, False),
    ("", False),
    ("He has 5. He has 5. He has 5.", True),  # word span repeated 3 times in a row
    ("He has 5. He has 5.", False),  # only twice
    ("a b c d e a b c d e a b c d e", True),  # a 5-word unit
    ("the cat sat, the cat ran, the cat ate", False),  # repeated phrase, but not back to back
    ("1+1=21+1=21+1=2", True),  # a loop without spaces
    ("1+1=21+1=2", False),
    ("!" * 25, True),  # one character 20+ times
    ("1000000000000", False),  # a big number is not a loop
    ("<think>3*4=12 12+5=17</think> <answer>17</answer>", False),
])
def test_has_repetition(completion: str, expected: bool) -> None:
    assert has_repetition(completion) is expected


def test_has_repetition_parameters() -> None:
    text = "go on go on"
    assert has_repetition(text, ngram=2, threshold=2) is True
    assert has_repetition(text, ngram=3, threshold=2) is False  # "go on go" is not repeated
    with pytest.raises(ValueError):
        has_repetition(text, ngram=0)


def test_degenerate_stats_with_golds() -> None:
    completions = [GOOD, WRONG, "", "He has 5. He has 5. He has 5."]
    stats = degenerate_stats(completions, golds=["19"] * 4)
    # empty answers: "" and the loop -> 2/4; repetition: the loop -> 1/4; format right but wrong: WRONG -> 1/4
    assert stats == pytest.approx({"empty_answer_rate": 0.5, "repetition_rate": 0.25, "format_only_rate": 0.25,
                                   "mean_length_chars": (42 + 42 + 0 + 29) / 4})


def test_degenerate_stats_without_golds_counts_unextractable_format_only() -> None:
    completions = [GOOD, WRONG, "<think>x</think><answer>five</answer>"]
    stats = degenerate_stats(completions)
    assert stats["format_only_rate"] == pytest.approx(1 / 3)  # only the one without a number
    assert stats["empty_answer_rate"] == pytest.approx(1 / 3)


def test_degenerate_stats_chat_form_and_empty_batch() -> None:
    stats = degenerate_stats([[{"role": "assistant", "content": GOOD}]], golds=["19"])
    assert stats == {"empty_answer_rate": 0.0, "repetition_rate": 0.0, "format_only_rate": 0.0,
                     "mean_length_chars": 42.0}
    assert degenerate_stats([]) == {"empty_answer_rate": 0.0, "repetition_rate": 0.0, "format_only_rate": 0.0,
                                    "mean_length_chars": 0.0}
    with pytest.raises(ValueError, match="golds"):
        degenerate_stats([GOOD], golds=["1", "2"])
