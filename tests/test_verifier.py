"""bench.verifier: number normalisation, answer extraction (strict / flexible), correctness and format."""

from __future__ import annotations

import pytest

from bench.verifier import MODES, extract_answer, has_format, is_correct, normalize_number

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
    assert extract_answer(text, "strict") == strict
    assert extract_answer(text, "flexible") == flexible


def test_extract_answer_default_mode_is_strict() -> None:
    assert extract_answer("the total is 5") is None
    assert extract_answer("the total is 5", "flexible") == "5"


@pytest.mark.parametrize("mode", ["", "Strict", "loose", "exact"])
def test_extract_answer_unknown_mode_raises(mode: str) -> None:
    with pytest.raises(ValueError, match="unknown scoring mode"):
        extract_answer("<answer>1</answer>", mode)


def test_modes_constant() -> None:
    assert MODES == ("strict", "flexible")


# --- is_correct ---------------------------------------------------------------------------------------

CORRECT_CASES = [
    ("<answer>18</answer>", "18", "strict", True),
    ("<answer>18.00</answer>", "18", "strict", True),
    ("<answer>$18</answer>", "18", "strict", True),
    ("<answer>1000</answer>", "1,000", "strict", True),
    ("<answer>17</answer>", "18", "strict", False),
    ("<answer>18.5</answer>", "18", "strict", False),
    ("the result is 18", "18", "strict", False),
    ("the result is 18", "18", "flexible", True),
    ("<answer>-3</answer>", "-3", "strict", True),
    ("<answer>3</answer>", "-3", "strict", False),
    ("<answer>١٨</answer>", "18", "flexible", False),
    ("<answer>12345678901234567891</answer>", "12345678901234567890", "strict", False),
    ("<answer>12345678901234567890</answer>", "12,345,678,901,234,567,890", "strict", True),
    ("", "0", "flexible", False),
]


@pytest.mark.parametrize(("completion", "gold", "mode", "expected"), CORRECT_CASES)
def test_is_correct(completion: str, gold: str, mode: str, expected: bool) -> None:
    assert is_correct(completion, gold, mode) is expected


@pytest.mark.parametrize("gold", ["", "abc", "NaN", "#### 18"])
def test_is_correct_rejects_non_numeric_gold(gold: str) -> None:
    with pytest.raises(ValueError, match="not a number"):
        is_correct("<answer>18</answer>", gold)


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
