"""bench.task.prompts: evaluation prompt styles, with and without a chat template, and the spec field that picks one."""

from __future__ import annotations

import typing
from typing import Any

import pytest

from bench.errors import UserError
from bench.task.prompts import render_prompt
from bench.task.prompts import BOXED_INSTRUCTION, STYLES, plain_prompt, render, styled_rows
from bench.config.spec import EvalSpec
from bench.task.problems import format_prompt

QUESTION = "  Tom has 3 apples. He buys 4 more. How many apples does he have?  "


class ChatTokenizer:
    """Renders messages as '<|ROLE|>content' lines plus the generation prompt, like a real template would."""

    chat_template = "stand-in"

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool, add_generation_prompt: bool) -> str:
        assert tokenize is False and add_generation_prompt is True
        return "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "<|assistant|>"


class PlainTokenizer:
    chat_template = None


def test_spec_choices_are_the_styles() -> None:
    hints = typing.get_type_hints(EvalSpec)
    assert typing.get_args(hints["prompt_style"]) == tuple(STYLES)
    assert EvalSpec().prompt_style == "tags"


def test_tags_is_the_training_prompt_exactly() -> None:
    for tokenizer, chat in ((PlainTokenizer(), False), (ChatTokenizer(), True)):
        assert render(tokenizer, "tags", QUESTION, chat) == render_prompt(tokenizer, format_prompt(QUESTION), chat)


def test_cot_is_lm_eval_zero_shot_wording() -> None:
    expected = "Q: Tom has 3 apples. He buys 4 more. How many apples does he have?\nA: Let's think step by step."
    assert plain_prompt("cot", QUESTION) == expected
    assert render(ChatTokenizer(), "cot", QUESTION, True) == f"<|user|>{expected}\n<|assistant|>"


def test_boxed_is_a_system_message_in_chat_and_a_trailing_line_without() -> None:
    question = QUESTION.strip()
    assert BOXED_INSTRUCTION == "Please reason step by step, and put your final answer within \\boxed{}."
    assert render(ChatTokenizer(), "boxed", QUESTION, True) == (
        f"<|system|>{BOXED_INSTRUCTION}\n<|user|>{question}\n<|assistant|>")
    assert render(PlainTokenizer(), "boxed", QUESTION, False) == f"{question}\n{BOXED_INSTRUCTION}"


def test_unknown_style_and_missing_chat_template_are_user_errors() -> None:
    with pytest.raises(UserError, match="eval.prompt_style"):
        render(PlainTokenizer(), "fewshot", QUESTION, False)
    with pytest.raises(UserError, match="use_chat_template=false"):
        render(PlainTokenizer(), "cot", QUESTION, True)


def test_styled_rows_replace_only_the_prompt() -> None:
    rows: list[dict[str, Any]] = [{"question": QUESTION, "prompt": "old", "answer": "7", "solution": "#### 7"}]
    styled = styled_rows(rows, PlainTokenizer(), "cot", False)
    assert styled[0]["prompt"].startswith("Q: Tom has 3 apples")
    assert {k: v for k, v in styled[0].items() if k != "prompt"} == {k: v for k, v in rows[0].items() if k != "prompt"}
    assert rows[0]["prompt"] == "old"  # the caller's rows are untouched
    assert styled_rows(rows, PlainTokenizer(), "tags", False) == rows  # already rendered for training
