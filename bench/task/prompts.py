"""Evaluation prompt styles: the suite's tag prompt and two standard chain-of-thought prompts.

``eval.prompt_style`` picks how the held-out questions are asked at evaluation, so that a GSM8K model can be
lined up with numbers published under a standard prompt. Training always uses the tag prompt
(`bench.task.problems.PROMPT_TEMPLATE`): the rewards score ``<think>...</think> <answer>...</answer>``.

- ``tags`` (default): `bench.task.problems.PROMPT_TEMPLATE`, the prompt every method trains on.
- ``cot``: lm-evaluation-harness's ``gsm8k_cot_zeroshot`` wording, ``"Q: {question}\\nA: Let's think step by
  step."`` (lm_eval/tasks/gsm8k/gsm8k-cot-zeroshot.yaml ``doc_to_text``, EleutherAI/lm-evaluation-harness at
  commit 4e7e0d47f33bc71070c1d38394bafbb52b117163). That task's own strict filter wants "The answer is N", which
  suite-strict also reads.
- ``boxed``: Qwen's math chain-of-thought instruction, ``"Please reason step by step, and put your final answer
  within \\boxed{}."``, as the system message of a chat model (Qwen2.5-Math's ``qwen25-math-cot`` prompt
  type; it replaces the chat template's default system message) and, without a chat template, as a line after
  the question. suite-strict reads ``\\boxed{N}``.

Pure Python; the tokenizer is only asked for its chat template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.errors import UserError
from bench.task.problems import PROMPT_TEMPLATE


@dataclass(frozen=True)
class PromptStyle:
    """One way of asking a question. ``user`` holds ``{question}``; ``system`` is a system message or None."""

    user: str
    system: str | None
    description: str


BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
"""Qwen's instruction for math chain-of-thought (Qwen2.5-Math evaluation, prompt type qwen25-math-cot)."""

STYLES: dict[str, PromptStyle] = {
    "tags": PromptStyle(PROMPT_TEMPLATE, None, "the suite's training prompt: <think></think> then <answer></answer>"),
    "cot": PromptStyle("Q: {question}\nA: Let's think step by step.", None,
                       "lm-evaluation-harness gsm8k_cot_zeroshot: 'Q: ...\\nA: Let's think step by step.'"),
    "boxed": PromptStyle("{question}", BOXED_INSTRUCTION,
                         "Qwen's math CoT: system 'Please reason step by step, and put your final answer within "
                         "\\boxed{}.'"),
}
"""Prompt styles by name (`eval.prompt_style`)."""
DEFAULT_STYLE = "tags"


def style(name: str) -> PromptStyle:
    """The style called ``name``; UserError naming the known styles otherwise."""
    if name not in STYLES:
        raise UserError(f"unknown prompt style '{name}'; set eval.prompt_style to one of {', '.join(STYLES)}")
    return STYLES[name]


def plain_prompt(name: str, question: str) -> str:
    """The prompt text for ``question`` in style ``name`` without a chat template.

    A system instruction goes on a line after the question (there is no system turn without a chat template).
    """
    chosen = style(name)
    text = chosen.user.format(question=question.strip())
    if chosen.system is not None:
        text = f"{text}\n{chosen.system}"
    return text


def render(tokenizer: Any, name: str, question: str, use_chat_template: bool) -> str:
    """The exact prompt string for ``question`` in style ``name``, the chat template applied when asked.

    ``tags`` renders exactly as `bench.task.prompts.render_prompt` renders the training prompts, so evaluating with the
    default style sees the same strings as before. Raises UserError for an unknown style, or for
    ``use_chat_template`` with a tokenizer that has no chat template.
    """
    chosen = style(name)
    if not use_chat_template:
        return plain_prompt(name, question)
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("model.use_chat_template is true but the tokenizer has no chat template; set "
                        "model.use_chat_template=false")
    messages = [{"role": "user", "content": chosen.user.format(question=question.strip())}]
    if chosen.system is not None:
        messages.insert(0, {"role": "system", "content": chosen.system})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def styled_rows(rows: list[dict[str, str]], tokenizer: Any, name: str, use_chat_template: bool) -> list[dict[str, str]]:
    """Copies of ``rows`` ({'question', 'prompt', ...}) whose 'prompt' is asked in style ``name``; ``rows`` is
    left as it is. The default style returns the rows unchanged (their prompts are already rendered)."""
    if name == DEFAULT_STYLE:
        style(name)
        return rows
    return [{**row, "prompt": render(tokenizer, name, row["question"], use_chat_template)} for row in rows]


TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]
"""The answer-format tags, added to the stand-in tokenizers as ordinary tokens (one token each)."""


def render_prompt(tokenizer: Any, prompt: str, use_chat_template: bool) -> str:
    """The exact prompt string every method sees (chat template applied here, once, for all of them)."""
    if not use_chat_template:
        return prompt
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("model.use_chat_template is true but the tokenizer has no chat template; set "
                        "model.use_chat_template=false")
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
