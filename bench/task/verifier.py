"""Answer extraction and comparison for GSM8K-style tasks (pure Python, no torch).

Four named scoring modes (`MODES`), so that every accuracy the suite reports says how its answers were
extracted and compared. Two are the suite's own, two reproduce lm-evaluation-harness exactly:

- ``suite-strict`` (the headline, `HEADLINE_MODE`; also what rewards and the sample pool use): only explicit
  answer markers count, tried in this order (the first kind present wins, and within a kind the LAST
  occurrence is taken, because models restate and correct themselves):
    1. ``<answer>...</answer>`` — the block must hold exactly one number (``<answer>$18</answer>``,
       ``<answer>18 dollars</answer>``); a block with no number or several numbers yields None (no
       fall-through to later markers: a model that wrote answer tags committed to that answer);
    2. ``#### N`` (GSM8K's own gold format);
    3. ``The answer is N`` (also ``The final answer is: N``), case-insensitive;
    4. ``\\boxed{N}``.
  The answer and the gold are compared as numbers (canonical strings, below): ``5.0`` equals ``5``.
- ``suite-flexible``: ``suite-strict``, and if that finds nothing, the last number anywhere in the text
  (HTML-like tags such as ``<h1>`` are removed first so that tag names do not count as numbers).
- ``lmeval-strict`` / ``lmeval-flexible``: lm-evaluation-harness's GSM8K ``strict-match`` (the FIRST
  ``#### N``) and ``flexible-extract`` (the LAST number-like string) filters, compared with its
  ``exact_match`` metric: strings, not numbers (``5.0`` is not ``5``); see `lmeval_extract`.

The old names ``strict`` and ``flexible`` are accepted as aliases of the suite's modes (`resolve_mode`).

Numbers are compared as canonical decimal strings (see `normalize_number`), never as floats: float
rounding would make ``12345678901234567891`` equal ``12345678901234567890``, and ``float()`` would accept
``nan``, ``inf`` and ``1e400``.

Signs and hedges (the suite's modes; lm-eval's modes keep lm-eval's behaviour, noted beside each):

- ``<answer>minus 5</answer>``, ``negative 5``: the word is the sign, so it reads ``-5`` (it read ``5``, and so
  credited a gold of 5). lm-eval: its strict filter sees no ``#### N``; its flexible filter takes the last
  number-like string, ``5``.
- ``−5`` (U+2212 MINUS SIGN) and ``–5`` (U+2013 EN DASH, the usual typeset minus) in sign position read ``-5``
  (they read ``5``). Where they cannot be a sign (``16–3``, right after a digit, letter or bracket) they are a
  binary minus or a range, as ``-`` is. Other dashes (em dash ``—``, figure dash, fullwidth hyphen) are not
  signs: a number after one reads unsigned, as after any punctuation. lm-eval: strict needs ``#### `` then an
  ASCII ``-`` or digit, so ``#### −5`` is ``[invalid]``; flexible reads ``5``.
- A hedged answer is no answer, whatever marker carries it: ``<answer>14 or 15</answer>`` was already rejected,
  and now so are ``The answer is 14 or 15``, ``#### 14 or 15`` and ``\\boxed{14 or 15}`` (the first two credited
  14). A hedge is a second number joined by ``or``, ``and``, ``to``, ``/``, ``-`` or ``–`` right after the first;
  anything else after the number (``The answer is 14 because 2*7=14``) is left alone. lm-eval: strict reads
  ``#### 14 or 15`` as ``14`` and flexible as ``15``; the suite's lm-eval modes reproduce that.

Digits: only ASCII ``0-9`` are numbers. Python's ``\\d``, ``int()`` and ``Decimal()`` all accept other
scripts' digits (Arabic-Indic ``١٨``, fullwidth ``１８``), but the gold answers are ASCII, and every extra
script the verifier accepts is extra surface a policy can exploit (look-alike characters, mixed scripts).
Non-ASCII digits are therefore simply not numbers here: ``<answer>١٨</answer>`` is wrong.
"""

from __future__ import annotations

import re

MODES: tuple[str, ...] = ("suite-strict", "suite-flexible", "lmeval-strict", "lmeval-flexible")
"""The scoring modes, in the order reports list them."""
HEADLINE_MODE = "suite-strict"
"""The mode of a report's headline numbers unless the suite folder's report_settings.json names another."""
MODE_DESCRIPTIONS: dict[str, str] = {
    "suite-strict": "the suite's explicit answer (last <answer>N</answer>, else #### N, 'The answer is N', "
                    "\\boxed{N}), compared as a number",
    "suite-flexible": "suite-strict, else the last number in the completion, compared as a number",
    "lmeval-strict": "lm-evaluation-harness GSM8K strict-match: the first '#### N', compared as a string after "
                     "removing ',', '$' and a final '.' (so 5.0 is not 5)",
    "lmeval-flexible": "lm-evaluation-harness GSM8K flexible-extract: the last run of 2+ characters from 0-9 . , $ "
                       "(so '...' counts) or the last integer, compared as a string after removing ',', '$' and a "
                       "final '.'",
}
"""One honest line per mode, for reports and help texts."""
MODE_ALIASES: dict[str, str] = {"strict": "suite-strict", "flexible": "suite-flexible"}
"""Names older files and commands use: the suite's modes before lm-eval's were added."""

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
    r"the\s+(?:final\s+)?answer\s+is\s*(?::\s*)?(" + _NUMBER_IN_TEXT.pattern + r")", re.IGNORECASE
)  # "\s*(?::\s*)?", not "\s*:?\s*": the same text, but two adjacent \s* split a run of spaces every way (cubic)
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
    if close == -1:
        return None
    # No opening tag before the last closing one means none before any earlier closing one either: one search
    # each way (searching again before every earlier closing tag was quadratic on a line of closing tags).
    start = text.rfind(_ANSWER_OPEN, 0, close)
    return None if start == -1 else text[start + len(_ANSWER_OPEN):close]


# Signs written as words or as typeset dashes (see the module docstring), in sign position only: not right after a
# digit, letter or closing bracket, nor after "<digit> " ("16 minus 3" is a subtraction, not -3).
_SIGN_POSITION = r"(?<![0-9A-Za-z)\]])(?<![0-9] )"
_SIGN_WORD = re.compile(_SIGN_POSITION + r"\b(?:minus|negative)\s+(?=\$?[0-9])", re.IGNORECASE)
_SIGN_DASH = re.compile(_SIGN_POSITION + "[\u2212\u2013](?=\\$?[0-9.])")
# A hedge right after an extracted number: a second number joined by or / and / to / a slash or a dash.
_HEDGE = re.compile(r"[ \t]*(?:or|and|to|/|-|\u2013)[ \t]*\$?[0-9]", re.IGNORECASE)


def _normalise_signs(text: str) -> str:
    """``minus 5``, ``negative 5``, ``−5`` and ``–5`` in sign position as ``-5``; everything else unchanged."""
    return _SIGN_DASH.sub("-", _SIGN_WORD.sub("-", text))


def _extract_strict(text: str) -> str | None:
    text = _normalise_signs(text)
    block = _last_answer_block(text)
    if block is not None:
        numbers = _numbers_in(_TAG.sub(" ", block))
        # Exactly one number: "<answer>17 or 18</answer>" is two guesses, not an answer.
        return numbers[0] if len(numbers) == 1 else None
    for pattern in (_HASHES, _ANSWER_IS, _BOXED):
        matches = list(pattern.finditer(text))
        if matches:
            last = matches[-1]
            if _HEDGE.match(text, last.end(1)):  # "The answer is 14 or 15": two guesses, as in the answer block
                return None
            return normalize_number(last.group(1))
    return None


# -- lm-evaluation-harness's GSM8K scoring ----------------------------------------------------------------
# Reproduced from EleutherAI/lm-evaluation-harness at commit 4e7e0d47f33bc71070c1d38394bafbb52b117163:
# - lm_eval/tasks/gsm8k/gsm8k.yaml (task gsm8k, metadata version 3.0): filter "strict-match" = regex
#   "#### (\-?[0-9\.\,]+)" then take_first; filter "flexible-extract" = regex "(-?[$0-9.,]{2,})|(-?[0-9]+)"
#   with group_select -1 then take_first; metric exact_match with ignore_case true, ignore_punctuation false,
#   regexes_to_ignore [",", "\$", "(?s).*#### ", "\.$"]; the reference is doc_to_target "{{answer}}", the
#   whole worked answer. (gsm8k-cot-zeroshot.yaml uses the same flexible filter and metric.)
# - lm_eval/filters/extraction.py RegexFilter.apply: findall, match[group_select], for a tuple the first
#   non-empty group, .strip(); no match -> fallback "[invalid]".
# - lm_eval/api/metrics.py exact_match_hf_evaluate: each ignore regex re.sub'd to "" from prediction and
#   reference in list order, then lower-cased, then compared with ==.
# Generation differs by design: lm-eval also cuts a response at "Question:", "</s>", "<|im_end|>"; the suite
# scores the completion it is given, so score lm-eval's logged responses to compare line by line.
_LMEVAL_FILTERS: dict[str, tuple[re.Pattern[str], int]] = {
    "lmeval-strict": (re.compile(r"#### (\-?[0-9\.\,]+)"), 0),
    "lmeval-flexible": (re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)"), -1),
}
LMEVAL_FALLBACK = "[invalid]"
"""What lm-eval's regex filter returns when nothing matches (never equal to a reference)."""
LMEVAL_IGNORE = (",", r"\$", r"(?s)\A.*#### ", r"\.$")
"""exact_match's regexes_to_ignore for GSM8K, applied in this order to prediction and reference. lm-eval writes the
third ``(?s).*#### ``; anchored at the start (``\A``) it removes the same text (the one match there is, greedy, up to
the last ``#### ``) in one pass, where unanchored re.sub retries ``.*`` from every later position: quadratic."""


def resolve_mode(mode: str) -> str:
    """The canonical name of ``mode`` (an entry of `MODES` or an alias in `MODE_ALIASES`); ValueError otherwise."""
    resolved = MODE_ALIASES.get(mode, mode)
    if resolved not in MODES:
        raise ValueError(f"unknown scoring mode {mode!r}; expected one of {', '.join(MODES)}")
    return resolved


def lmeval_extract(text: str, mode: str) -> str | None:
    """lm-eval's filtered response for ``mode`` (``lmeval-strict`` / ``lmeval-flexible``), or None where lm-eval
    would return its fallback ``"[invalid]"``. The string is as lm-eval keeps it (stripped, not normalised):
    ``"#### 1,000."`` -> ``"1,000."``."""
    pattern, group = _LMEVAL_FILTERS[resolve_mode(mode)]
    matches = pattern.findall(text if isinstance(text, str) else "")
    if not matches:
        return None
    match = matches[group]
    if isinstance(match, tuple):  # several groups: the first that matched
        match = next((m for m in match if m), None)
        if match is None:
            return None
    return match.strip()


def lmeval_normalize(text: str) -> str:
    """lm-eval's exact_match normalisation for GSM8K: `LMEVAL_IGNORE` removed in order, then lower case.

    ``"The sum.\n#### 1,000"`` -> ``"1000"``; ``"$5."`` -> ``"5"``; ``"5.0"`` stays ``"5.0"``.
    """
    for pattern in LMEVAL_IGNORE:
        text = re.sub(pattern, "", text)
    return text.lower()


GOLD_LINE = re.compile(r"^[^\S\n]*####\s*(.*?)\s*$", re.MULTILINE)
"""A GSM8K worked answer's final line, ``#### N`` (the text after ``####`` is group 1). Before ``####`` only
spaces within the line: a match that began on an earlier blank line ends at the same ``####`` with the same group,
but let every line start of a run of blank lines scan the whole run (quadratic)."""


def gold_number(answer: str) -> str:
    """The canonical gold number of a GSM8K worked answer: what follows the last ``####``.

    ``"... \\n#### 1,000"`` -> ``"1000"`` (canonicalised by `bench.task.verifier.normalize_number`). Raises
    ValueError if there is no ``####`` line or it does not hold exactly one number.
    """
    matches = GOLD_LINE.findall(answer) if isinstance(answer, str) else []
    if not matches:
        raise ValueError(f"answer has no '#### N' line: {str(answer)[-60:]!r}")
    value = normalize_number(matches[-1])
    if value is None:
        raise ValueError(f"'#### {matches[-1]}' is not a number")
    return value


def _suite_gold(gold: str) -> str:
    """The canonical number of ``gold``: a bare number, or a worked answer ending in ``#### N``."""
    expected = normalize_number(gold)
    if expected is None and isinstance(gold, str) and "####" in gold:
        expected = gold_number(gold)
    if expected is None:
        raise ValueError(f"gold answer {gold!r} is not a number")
    return expected


def extract_answer(text: str, mode: str = HEADLINE_MODE) -> str | None:
    """The final answer in a completion under ``mode``, or None when the mode finds none.

    Suite modes return a canonical number string (see `normalize_number`); lm-eval modes return lm-eval's
    filtered string (`lmeval_extract`). The module docstring gives the exact rules. Raises ValueError for an
    unknown mode (aliases in `MODE_ALIASES` are accepted).
    """
    mode = resolve_mode(mode)
    if mode.startswith("lmeval-"):
        return lmeval_extract(text, mode)
    if not isinstance(text, str) or not text:
        return None
    answer = _extract_strict(text)
    if answer is None and mode == "suite-flexible":
        numbers = _numbers_in(_TAG.sub(" ", _normalise_signs(text)))
        answer = numbers[-1] if numbers else None
    return answer


def judge(completion: str, gold: str, mode: str = HEADLINE_MODE) -> tuple[str | None, bool]:
    """(extracted answer, correct) for one completion under ``mode``.

    ``gold``: the GSM8K worked answer (``"... #### 1,000"``) or a bare number. Suite modes compare the
    extracted number with the gold's number; lm-eval modes compare `lmeval_normalize` of the extracted string
    (``"[invalid]"`` when none) with `lmeval_normalize` of ``gold`` as lm-eval does with the whole worked answer
    (for a gold written plainly, such as ``"18"``, a bare number gives the same verdict). Raises ValueError
    for a suite mode whose gold holds no number, or an unknown mode.
    """
    mode = resolve_mode(mode)
    extracted = extract_answer(completion, mode)
    if mode.startswith("lmeval-"):
        prediction = LMEVAL_FALLBACK if extracted is None else extracted
        return extracted, lmeval_normalize(prediction) == lmeval_normalize(str(gold))
    return extracted, extracted is not None and extracted == _suite_gold(gold)


def is_correct(completion: str, gold: str, mode: str = HEADLINE_MODE) -> bool:
    """True when the answer extracted from ``completion`` (in ``mode``) matches ``gold`` (see `judge`).

    ``gold`` is a bare number (``"18"``, ``"1,000"``) or a GSM8K worked answer ending in ``#### N``. Raises
    ValueError if a suite mode's ``gold`` is not a number (a bug in the caller's data, not a wrong completion)
    or if ``mode`` is unknown.
    """
    return judge(completion, gold, mode)[1]


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
