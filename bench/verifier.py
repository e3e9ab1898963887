"""Answer extraction and comparison for GSM8K-style tasks (pure Python, no torch).

Two named scoring modes, like lm-evaluation-harness's `strict-match` and `flexible-extract`, so that every
accuracy the suite reports can say how its answers were extracted:

- ``strict``: only explicit answer markers count, tried in this order (the first kind present wins, and
  within a kind the LAST occurrence is taken, because models restate and correct themselves):
    1. ``<answer>...</answer>`` — the block must hold exactly one number (``<answer>$18</answer>``,
       ``<answer>18 dollars</answer>``); a block with no number or several numbers yields None (no
       fall-through to later markers: a model that wrote answer tags committed to that answer);
    2. ``#### N`` (GSM8K's own gold format);
    3. ``The answer is N`` (also ``The final answer is: N``), case-insensitive;
    4. ``\\boxed{N}``.
- ``flexible``: ``strict``, and if that finds nothing, the last number anywhere in the text (HTML-like tags
  such as ``<h1>`` are removed first so that tag names do not count as numbers).

Numbers are compared as canonical decimal strings (see `normalize_number`), never as floats: float
rounding would make ``12345678901234567891`` equal ``12345678901234567890``, and ``float()`` would accept
``nan``, ``inf`` and ``1e400``.

Digits: only ASCII ``0-9`` are numbers. Python's ``\\d``, ``int()`` and ``Decimal()`` all accept other
scripts' digits (Arabic-Indic ``١٨``, fullwidth ``１８``), but the gold answers are ASCII, and every extra
script the verifier accepts is extra surface a policy can exploit (look-alike characters, mixed scripts).
Non-ASCII digits are therefore simply not numbers here: ``<answer>١٨</answer>`` is wrong.
"""

from __future__ import annotations

import re

MODES: tuple[str, ...] = ("strict", "flexible")
"""The scoring modes, in the order reports list them."""

# An integer part: either properly grouped thousands ("1,000", "12,345,678") or plain digits. The lookahead
# stops "1,0000" from reading as "1,000" followed by a stray "0".
_INT = r"(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)"
# A full number as written in running text: optional sign (only where it cannot be a binary minus, i.e. not
# right after a digit, letter or closing bracket: "16-3" is 16 and 3, not 16 and -3), optional "$", digits,
# optional fraction. The leading lookbehind keeps a match from starting inside another number.
_NUMBER_IN_TEXT = re.compile(
    r"(?<![0-9])"
    r"(?:(?<![0-9A-Za-z)\]])[-+])?"
    r"\$?"
    r"(?:" + _INT + r"(?:\.[0-9]+)?|\.[0-9]+)"
)
# A whole string that is one number: sign and "$" in either order ("-$5", "$-5"), optional trailing period
# (sentence end), nothing else. Whitespace is stripped before matching.
_NUMBER_WHOLE = re.compile(
    r"(?P<sign>[-+]?)\$?(?P<sign2>[-+]?)(?P<int>" + _INT + r")?(?:\.(?P<frac>[0-9]+))?\.?"
)

_ANSWER_OPEN = "<answer>"
_ANSWER_CLOSE = "</answer>"
_HASHES = re.compile(r"####\s*(" + _NUMBER_IN_TEXT.pattern + r")")
_ANSWER_IS = re.compile(
    r"the\s+(?:final\s+)?answer\s+is\s*:?\s*(" + _NUMBER_IN_TEXT.pattern + r")", re.IGNORECASE
)
_BOXED = re.compile(r"\\boxed\{\s*(" + _NUMBER_IN_TEXT.pattern + r")\s*\}")
# An HTML/XML-like tag: "<" directly followed by a letter (so "3 < 5 and 7 > 2" is not a tag).
_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9_-]*(?:\s[^<>]*)?/?>")
_THINK_THEN_ANSWER = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)


def normalize_number(text: str) -> str | None:
    """Canonical string of the single number ``text`` holds, or None if it is not exactly one number.

    Accepts surrounding whitespace, a leading ``+`` or ``-``, a ``$`` (before or after the sign), thousands
    commas in correct groups (``1,000``; ``1,00`` is rejected), a fraction, and one trailing period.
    Canonical form: no commas, no ``$``, no ``+``, no leading zeros, no trailing fractional zeros, no
    ``-`` on zero. So ``"$1,000.00"`` -> ``"1000"``, ``"18.50"`` -> ``"18.5"``, ``"-0"`` -> ``"0"``.
    Two numbers are equal exactly when their canonical strings are equal, at any size (no float rounding).
    Returns None for words, ``NaN``, ``inf``, scientific notation (``1e5``) and non-ASCII digits.
    """
    if not isinstance(text, str):
        return None
    match = _NUMBER_WHOLE.fullmatch(text.strip())
    if match is None or (match["int"] is None and match["frac"] is None):
        return None
    if match["sign"] and match["sign2"]:
        return None  # "+-5", "-$-5": not a number anyone writes
    negative = "-" in (match["sign"], match["sign2"])
    integer = (match["int"] or "").replace(",", "").lstrip("0") or "0"
    fraction = (match["frac"] or "").rstrip("0")
    canonical = integer + ("." + fraction if fraction else "")
    if negative and canonical != "0":
        canonical = "-" + canonical
    return canonical


def _numbers_in(text: str) -> list[str]:
    """Every ASCII number in running text, canonicalised, in order of appearance."""
    found = []
    for match in _NUMBER_IN_TEXT.finditer(text):
        value = normalize_number(match.group(0))
        if value is not None:
            found.append(value)
    return found


def _last_answer_block(text: str) -> str | None:
    """Content of the last complete ``<answer>...</answer>`` block, or None if there is none.

    "Last" means the block closed by the last ``</answer>``, opened by the nearest ``<answer>`` before it;
    for nested tags (``<answer><answer>5</answer></answer>``) that is the innermost block, ``5``.
    """
    close = text.rfind(_ANSWER_CLOSE)
    while close != -1:
        start = text.rfind(_ANSWER_OPEN, 0, close)
        if start != -1:
            return text[start + len(_ANSWER_OPEN):close]
        # A closing tag with no opening before it: look for an earlier closing one.
        close = text.rfind(_ANSWER_CLOSE, 0, close)
    return None


def _extract_strict(text: str) -> str | None:
    block = _last_answer_block(text)
    if block is not None:
        numbers = _numbers_in(_TAG.sub(" ", block))
        # Exactly one number: "<answer>17 or 18</answer>" is two guesses, not an answer.
        return numbers[0] if len(numbers) == 1 else None
    for pattern in (_HASHES, _ANSWER_IS, _BOXED):
        matches = pattern.findall(text)
        if matches:
            return normalize_number(matches[-1])
    return None


def extract_answer(text: str, mode: str = "strict") -> str | None:
    """The final answer in a completion, as a canonical number string (see `normalize_number`), or None.

    ``mode`` is ``"strict"`` (explicit markers only) or ``"flexible"`` (strict, then the last number in the
    text); the module docstring gives the exact rules. Raises ValueError for any other mode.
    """
    if mode not in MODES:
        raise ValueError(f"unknown scoring mode {mode!r}; expected one of {', '.join(MODES)}")
    if not isinstance(text, str) or not text:
        return None
    answer = _extract_strict(text)
    if answer is None and mode == "flexible":
        numbers = _numbers_in(_TAG.sub(" ", text))
        answer = numbers[-1] if numbers else None
    return answer


def is_correct(completion: str, gold: str, mode: str = "strict") -> bool:
    """True when the answer extracted from ``completion`` (in ``mode``) equals the number ``gold``.

    ``gold`` is a bare number (``"18"``, ``"1,000"``); use `bench.tasks.gold_number` first for a GSM8K
    worked answer. Raises ValueError if ``gold`` is not a number (a bug in the caller's data, not a wrong
    completion) or if ``mode`` is unknown.
    """
    expected = normalize_number(gold)
    if expected is None:
        raise ValueError(f"gold answer {gold!r} is not a number")
    return extract_answer(completion, mode) == expected


def has_format(completion: str) -> bool:
    """True when the completion is ``<think>...</think>`` then ``<answer>...</answer>`` and nothing else.

    Whitespace is allowed before, between and after the blocks. Exactly one think block and exactly one
    answer block; the answer block must not be blank (an empty ``<answer></answer>`` would earn the format
    reward for free). The think block may be empty. Tags are exact and lower-case.
    """
    if not isinstance(completion, str):
        return False
    for tag in ("<think>", "</think>", _ANSWER_OPEN, _ANSWER_CLOSE):
        if completion.count(tag) != 1:
            return False
    match = _THINK_THEN_ANSWER.fullmatch(completion)
    return match is not None and match.group(2).strip() != ""
