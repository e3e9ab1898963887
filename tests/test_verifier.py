"""bench.task.verifier: number normalisation, answer extraction (the suite's modes and lm-eval's), correctness and format."""

from __future__ import annotations

import pytest

from bench.task.verifier import (HEADLINE_MODE, MODE_DESCRIPTIONS, MODES, extract_answer, has_format, is_correct, judge,
                            lmeval_normalize, normalize_number, resolve_mode)

# --- normalize_number ---------------------------------------------------------------------------------

NORMALIZE_CASES = [
    ("18", "18"),
    ("  18  ", "18"),
    ("1,000", "1000"),
    ("12,345,678", "12345678"),
    ("$18", "18"),
    ("$1,000.00", "1000"),
    ("18.00", "18"),
    ("18.0", "18"),
    ("18.5", "18.5"),
    ("18.50", "18.5"),
    ("18.", "18"),  # sentence-final period
    ("-7", "-7"),
    ("-$7", "-7"),
    ("$-7", "-7"),
    ("+7", "7"),
    ("-0", "0"),
    ("-0.00", "0"),
    ("007", "7"),
    (".5", "0.5"),
    ("0.25", "0.25"),
    ("123456789012345678901234567890", "123456789012345678901234567890"),
    ("", None),
    ("   ", None),
    ("abc", None),
    ("NaN", None),
    ("nan", None),
    ("inf", None),
    ("-inf", None),
    ("Infinity", None),
    ("1e5", None),  # scientific notation is not accepted (float() would, and also 1e400)
    ("1,00", None),  # wrong thousands grouping
    ("1,0000", None),
    ("18 apples", None),
    ("1 2", None),
    ("--5", None),
    ("+-5", None),
    ("-", None),
    ("$", None),
    (".", None),
    ("١٨", None),  # Arabic-Indic digits: not ASCII, not a number here
    ("１８", None),  # fullwidth digits
    ("²", None),  # superscript two: str.isdigit() is True, still not a number
]


@pytest.mark.parametrize(("text", "expected"), NORMALIZE_CASES)
def test_normalize_number(text: str, expected: str | None) -> None:
    assert normalize_number(text) == expected


def test_normalize_number_huge_values_stay_exact() -> None:
    # Adjacent 20-digit integers are equal as floats; as canonical strings they must differ.
    a, b = "12345678901234567890", "12345678901234567891"
    assert float(a) == float(b)
    assert normalize_number(a) != normalize_number(b)
    assert normalize_number("12,345,678,901,234,567,891") == b


# --- extract_answer -----------------------------------------------------------------------------------

# (completion, strict, flexible)
EXTRACT_CASES = [
    ("", None, None),
    ("I do not know.", None, None),
    ("<answer>18</answer>", "18", "18"),
    ("<think>9*2=18</think> <answer>18</answer>", "18", "18"),
    ("<answer> 18 </answer>", "18", "18"),  # whitespace inside the block
    ("<answer>\n18\n</answer>", "18", "18"),
    ("<answer>$1,000.00</answer>", "1000", "1000"),
    ("<answer>18 dollars</answer>", "18", "18"),
    ("<answer>-5</answer>", "-5", "-5"),
    ("<answer>18.00</answer>", "18", "18"),
    ("<answer>18.5</answer>", "18.5", "18.5"),
    ("<answer><b>18</b></answer>", "18", "18"),  # HTML inside the block is ignored
    # Several blocks: the LAST complete block is the answer.
    ("<answer>5</answer> wait, no: <answer>7</answer>", "7", "7"),
    # Nested tags: the innermost block of the last closing tag.
    ("<answer><answer>5</answer></answer>", "5", "5"),
    # Two numbers in the block: two guesses, not an answer; flexible takes the last number.
    ("<answer>17 or 18</answer>", None, "18"),
    ("<answer>3 + 4 = 7</answer>", None, "7"),
    # The block holds no number: strict stops there (tags are authoritative), flexible falls back.
    ("12+7=19 <answer>nineteen</answer>", None, "19"),
    ("<answer></answer>", None, None),
    # Missing closing tag (truncated generation): strict finds no marker, flexible takes the last number.
    ("<think>12+7=19</think> <answer>19", None, "19"),
    ("<think>12+7=19</think> 19</answer>", None, "19"),
    # Tags are exact: "< answer >" is not an answer tag.
    ("< answer >18</ answer >", None, "18"),
    # GSM8K marker.
    ("12+7=19\n#### 19", "19", "19"),
    ("#### 1,000", "1000", "1000"),
    ("#### 5 then #### 6", "6", "6"),
    ("#### -3", "-3", "-3"),
    # "The answer is".
    ("So the answer is 42.", "42", "42"),
    ("The final answer is: $42", "42", "42"),
    ("THE ANSWER IS 42", "42", "42"),
    # \boxed.
    ("\\boxed{42}", "42", "42"),
    ("\\boxed{ 4,200 }", "4200", "4200"),
    # Marker priority: <answer> over ####.
    ("<answer>8</answer>\n#### 9", "8", "8"),
    # #### over "the answer is".
    ("The answer is 3.\n#### 4", "4", "4"),
    # Only flexible reads bare numbers.
    ("First 3 then 4 and finally 5", None, "5"),
    ("She has 16 - 3 = 13 eggs", None, "13"),
    ("16-3", None, "3"),  # binary minus: "3", not "-3"
    ("It is -5 degrees", None, "-5"),
    ("x = 1,234,567 total.", None, "1234567"),
    # HTML in the completion: tag names are not numbers.
    ("<h1>Result</h1><p>It costs $25</p>", None, "25"),
    ("<h2>Total</h2>", None, None),
    ("3 < 5 and 7 > 2", None, "2"),  # comparison signs are not tags
    # Hostile values.
    ("<answer>NaN</answer>", None, None),
    ("<answer>inf</answer>", None, None),
    ("<answer>1e9</answer>", None, "9"),  # "1e9" is two numbers for the text scanner
    ("<answer>١٨</answer>", None, None),  # Arabic-Indic digits never count
    ("The total is １８", None, None),
    ("<answer>123456789012345678901234567890</answer>",
     "123456789012345678901234567890", "123456789012345678901234567890"),
]


@pytest.mark.parametrize(("text", "strict", "flexible"), EXTRACT_CASES)
def test_extract_answer(text: str, strict: str | None, flexible: str | None) -> None:
    assert extract_answer(text, "suite-strict") == strict
    assert extract_answer(text, "suite-flexible") == flexible


def test_extract_answer_default_mode_is_suite_strict() -> None:
    assert extract_answer("the total is 5") is None
    assert extract_answer("the total is 5", "suite-flexible") == "5"


def test_old_mode_names_are_aliases_of_the_suite_modes() -> None:
    assert resolve_mode("strict") == "suite-strict" and resolve_mode("flexible") == "suite-flexible"
    assert extract_answer("the total is 5", "flexible") == "5"
    assert extract_answer("the total is 5", "strict") is None


@pytest.mark.parametrize("mode", ["", "Strict", "loose", "exact"])
def test_extract_answer_unknown_mode_raises(mode: str) -> None:
    with pytest.raises(ValueError, match="unknown scoring mode"):
        extract_answer("<answer>1</answer>", mode)


def test_modes_constant() -> None:
    assert MODES == ("suite-strict", "suite-flexible", "lmeval-strict", "lmeval-flexible")
    assert HEADLINE_MODE in MODES
    assert set(MODE_DESCRIPTIONS) == set(MODES) and all(MODE_DESCRIPTIONS.values())


# --- is_correct ---------------------------------------------------------------------------------------

CORRECT_CASES = [
    ("<answer>18</answer>", "18", "suite-strict", True),
    ("<answer>18.00</answer>", "18", "suite-strict", True),
    ("<answer>$18</answer>", "18", "suite-strict", True),
    ("<answer>1000</answer>", "1,000", "suite-strict", True),
    ("<answer>17</answer>", "18", "suite-strict", False),
    ("<answer>18.5</answer>", "18", "suite-strict", False),
    ("the result is 18", "18", "suite-strict", False),
    ("the result is 18", "18", "suite-flexible", True),
    ("<answer>-3</answer>", "-3", "suite-strict", True),
    ("<answer>3</answer>", "-3", "suite-strict", False),
    ("<answer>١٨</answer>", "18", "suite-flexible", False),
    ("<answer>12345678901234567891</answer>", "12345678901234567890", "suite-strict", False),
    ("<answer>12345678901234567890</answer>", "12,345,678,901,234,567,890", "suite-strict", True),
    ("", "0", "suite-flexible", False),
]


@pytest.mark.parametrize(("completion", "gold", "mode", "expected"), CORRECT_CASES)
def test_is_correct(completion: str, gold: str, mode: str, expected: bool) -> None:
    assert is_correct(completion, gold, mode) is expected


@pytest.mark.parametrize("gold", ["", "abc", "NaN", "#### eighteen"])
def test_is_correct_rejects_non_numeric_gold(gold: str) -> None:
    with pytest.raises(ValueError, match="not a number"):
        is_correct("<answer>18</answer>", gold)


def test_is_correct_reads_a_worked_gold_answer() -> None:
    assert is_correct("<answer>1000</answer>", "10*100=<<10*100=1000>>1000\n#### 1,000")
    assert not is_correct("<answer>100</answer>", "10*100=<<10*100=1000>>1000\n#### 1,000")


# --- lm-evaluation-harness modes ------------------------------------------------------------------------
# Expected verdicts worked by hand from lm-eval's gsm8k.yaml filters and exact_match (see bench.task.verifier):
# strict takes the FIRST "#### N" with N in [-0-9.,]; flexible the LAST match of "(-?[$0-9.,]{2,})|(-?[0-9]+)";
# both then drop ",", "$", everything up to the last "#### " and one final "." before comparing strings.
GOLD_5 = "She has 2+3=<<2+3=5>>5 apples.\n#### 5"
GOLD_1000 = "10*100=<<10*100=1000>>1000\n#### 1,000"
GOLD_NEG = "3-8=<<3-8=-5>>-5\n#### -5"

# (completion, gold, lmeval-strict extracted, strict correct, lmeval-flexible extracted, flexible correct)
LMEVAL_CASES = [
    ("#### 5", GOLD_5, "5", True, "5", True),
    ("#### 5.", GOLD_5, "5.", True, "5.", True),  # a final period is ignored
    ("#### $5", GOLD_5, None, False, "$5", True),  # "$" is not in strict's class: [invalid]; flexible keeps "$5"
    ("#### 5.0", GOLD_5, "5.0", False, "5.0", False),  # strings: "5.0" is not "5" (the suite says equal)
    ("#### 4\n#### 5", GOLD_5, "4", False, "5", True),  # strict: the first ####; flexible: the last number
    ("#### 1,000", GOLD_1000, "1,000", True, "1,000", True),  # commas removed on both sides
    ("#### 1000", GOLD_1000, "1000", True, "1000", True),
    ("#### 1,0,0,0", GOLD_1000, "1,0,0,0", True, "1,0,0,0", True),  # every comma goes, grouped or not
    ("#### -5", GOLD_NEG, "-5", True, "-5", True),
    ("#### 5", GOLD_NEG, "5", False, "5", False),
    ("", GOLD_5, None, False, None, False),  # empty completion: [invalid]
    ("I have no idea.", GOLD_5, None, False, None, False),
    ("2+3 is 5, I think 7 is 5", GOLD_5, None, False, "5", True),  # flexible takes the last number
    ("It is 5 not 12", GOLD_5, None, False, "12", False),
    ("The answer is 5.", GOLD_5, None, False, "5.", True),  # "5." matches the {2,} group
    ("####5", GOLD_5, None, False, "5", True),  # strict needs "#### " with the space
    ("#### 5 apples", GOLD_5, "5", True, "5", True),
    ("<answer>5</answer>", GOLD_5, None, False, "5", True),
    ("It is 5...", GOLD_5, None, False, "5...", False),  # only ONE final period is ignored
    ("Thinking....", GOLD_5, None, False, "....", False),  # dots alone are "number-like" to lm-eval
]


@pytest.mark.parametrize(("text", "gold", "strict", "strict_ok", "flexible", "flexible_ok"), LMEVAL_CASES)
def test_lmeval_modes(text: str, gold: str, strict: str | None, strict_ok: bool, flexible: str | None,
                      flexible_ok: bool) -> None:
    assert judge(text, gold, "lmeval-strict") == (strict, strict_ok)
    assert judge(text, gold, "lmeval-flexible") == (flexible, flexible_ok)


def test_lmeval_normalize_is_exact_match_with_the_gsm8k_ignore_regexes() -> None:
    assert lmeval_normalize(GOLD_1000) == "1000"  # everything up to the last "#### " goes
    assert lmeval_normalize("$1,000.") == "1000"
    assert lmeval_normalize("5..") == "5."  # only one final period
    assert lmeval_normalize("[INVALID]") == "[invalid]"  # ignore_case: lower-cased


def test_lmeval_and_suite_modes_disagree_where_they_should() -> None:
    # The suite compares numbers, lm-eval strings: "5.0" vs 5 is right for one and wrong for the other.
    assert is_correct("#### 5.0", GOLD_5, "suite-strict")
    assert not is_correct("#### 5.0", GOLD_5, "lmeval-strict")
    # The suite takes the last "####", lm-eval the first.
    assert is_correct("#### 4\n#### 5", GOLD_5, "suite-strict")
    assert not is_correct("#### 4\n#### 5", GOLD_5, "lmeval-strict")


# --- has_format ---------------------------------------------------------------------------------------

FORMAT_CASES = [
    ("<think>9*2=18</think> <answer>18</answer>", True),
    ("<think>9*2=18</think><answer>18</answer>", True),
    ("  <think>x</think>\n\n<answer>18</answer>\n", True),
    ("<think></think><answer>18</answer>", True),  # empty reasoning is allowed
    ("<think>x</think><answer>not a number</answer>", True),  # format only; accuracy judges the value
    ("<think>x</think><answer>  </answer>", False),  # blank answer earns nothing
    ("<answer>18</answer><think>x</think>", False),  # wrong order
    ("<answer>18</answer>", False),  # no think block
    ("<think>x</think>", False),  # no answer block
    ("<think>x</think><answer>1</answer><answer>2</answer>", False),  # two answer blocks
    ("<think>x</think><think>y</think><answer>1</answer>", False),  # two think blocks
    ("<think>x</think> so <answer>18</answer>", False),  # text between the blocks
    ("<think>x</think><answer>18</answer> and more", False),  # text after
    ("preamble <think>x</think><answer>18</answer>", False),  # text before
    ("<think>x<answer>18</answer></think>", False),  # answer nested in think
    ("<think>x</think><answer>18", False),  # unclosed
    ("<THINK>x</THINK><ANSWER>18</ANSWER>", False),  # tags are lower-case
    ("", False),
]


@pytest.mark.parametrize(("completion", "expected"), FORMAT_CASES)
def test_has_format(completion: str, expected: bool) -> None:
    assert has_format(completion) is expected


# --- leniency decided -----------------------------------------------------------------------------------------
# (completion, suite-strict, suite-flexible, lmeval-strict, lmeval-flexible). Before the decision the first three
# read 5 in the suite's modes (crediting a gold of 5), and "The answer is 14 or 15" / "#### 14 or 15" read 14
# while "<answer>14 or 15</answer>" was rejected. lm-eval's modes keep lm-eval's own reading (its strict-match and
# flexible-extract regexes), shown beside the suite's.
LENIENCY_CASES = [
    ("<answer>minus 5</answer>", "-5", "-5", None, "5"),
    ("<answer>Negative 5</answer>", "-5", "-5", None, "5"),
    ("<answer>\u22125</answer>", "-5", "-5", None, "5"),  # U+2212 MINUS SIGN
    ("<answer>\u20135</answer>", "-5", "-5", None, "5"),  # U+2013 EN DASH, the typeset minus
    ("#### \u22125", "-5", "-5", None, "5"),
    ("The answer is \u22125.", "-5", "-5", None, "5."),  # lm-eval keeps the period; its exact_match drops it
    ("16\u20133", None, "3", None, "3"),  # after a digit the dash is a binary minus, as "-" is
    ("<answer>5 minus 3</answer>", None, "3", None, "3"),  # a subtraction: two numbers, no answer
    ("The answer is\u20145", None, "5", None, "5"),  # an em dash is punctuation, never a sign
    ("The answer is 14 or 15", None, "15", None, "15"),
    ("<answer>14 or 15</answer>", None, "15", None, "15"),
    ("#### 14 or 15", None, "15", "14", "15"),
    ("The answer is 14/15.", None, "15", None, "15."),
    ("\\boxed{14 or 15}", None, "15", None, "15"),
    ("The answer is 14 because 2*7=14", "14", "14", None, "14"),  # only a hedge right after the number
    ("The answer is 14\n- next line 3", "14", "14", None, "3"),
]


@pytest.mark.parametrize(("text", "strict", "flexible", "lm_strict", "lm_flexible"), LENIENCY_CASES)
def test_signs_and_hedges_are_decided(text: str, strict: str | None, flexible: str | None, lm_strict: str | None,
                                      lm_flexible: str | None) -> None:
    got = [extract_answer(text, m) for m in ("suite-strict", "suite-flexible", "lmeval-strict", "lmeval-flexible")]
    assert got == [strict, flexible, lm_strict, lm_flexible]


def test_a_negative_answer_never_earns_a_positive_gold() -> None:
    for text in ("<answer>minus 5</answer>", "<answer>\u22125</answer>", "<answer>\u20135</answer>"):
        assert not is_correct(text, "5") and is_correct(text, "-5")
    assert not is_correct("The answer is 14 or 15", "14") and not is_correct("#### 14 or 15", "14")
    assert is_correct("#### 14 or 15", "#### 14", "lmeval-strict")  # lm-eval's strict-match takes the first
