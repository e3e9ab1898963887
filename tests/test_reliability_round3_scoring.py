"""Scoring a hostile completion takes time linear in its length, in every scoring mode, with the verdicts unchanged.

A completion (or a gold answer) is text the suite did not write: a model's output, another harness's log. Each
pattern the verifier runs on it is timed on one line of 1 MB and on one of 1/8 MB; the ratio of the two times must
be that of linear work (8, with room for noise), not of quadratic work (64) or worse. The rewritten patterns are
also checked against the ones they replace (lm-eval's own ``(?s).*#### ``, the old answer-is and gold-line patterns
and the old answer-block search) on many generated texts: the same matches, the same verdicts.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.task import verifier
from bench.task.verifier import MODES, judge, lmeval_normalize

REPO = Path(__file__).resolve().parents[1]

HOSTILE = {
    "digits": "'1' * n",
    "hashes": "('#### ' * n)[:n]",
    "answer-is then spaces": "'the answer is' + ' ' * n",
    "answer-is repeated": "('The answer is ' * n)[:n]",
    "tag openings": "('<a ' * n)[:n]",
    "answer openings": "('<answer>' * n)[:n]",
    "answer closings": "('</answer>' * n)[:n]",
    "minus then spaces": "'minus' + ' ' * n",
    "boxed then spaces": "'\\\\boxed{' + ' ' * n",
    "grouped thousands": "('1,000' * n)[:n]",
    "dollars": "'$' * n",
    "dots": "'.' * n",
    "newlines": "'\\n' * n",
    "blank lines then hashes": "'\\n' * n + '#### 5'",
    "ordinary text": "('Let me think. 12 + 30 = 42, so #### 42 and <answer>42</answer> ' * n)[:n]",
}
"""Hostile lines, as Python expressions of their length ``n``: each one a pattern of the verifier once took
quadratic (or cubic) time on."""

TIMER = r"""
import json, sys, time
from bench.task.verifier import MODES, judge
cases = json.loads(sys.argv[1])

def best(text, mode, as_gold):
    times = []
    for _ in range(3):
        start = time.perf_counter()
        try:
            judge('5', text, mode) if as_gold else judge(text, '18', mode)
        except ValueError:  # a suite mode's gold that holds no number: refused, which is an answer too
            pass
        times.append(time.perf_counter() - start)
    return min(times)

out = {}
for name, expr in cases.items():
    for mode in MODES:
        for as_gold in (False, True):
            big, small = (best(eval(expr, {"n": n}), mode, as_gold) for n in (1_000_000, 125_000))
            out[f"{name} | {mode} | {'gold' if as_gold else 'completion'}"] = [big, small]
print(json.dumps(out))
"""


def test_every_scoring_mode_is_linear_on_a_one_megabyte_line() -> None:
    # In a subprocess with a deadline: a regular expression cannot be interrupted, and a quadratic one on 1 MB runs
    # for minutes (lmeval-flexible on 1 MB of digits: over 90 s; the answer-is pattern: hours).
    proc = subprocess.run([sys.executable, "-c", TIMER, json.dumps(HOSTILE)], capture_output=True, text=True,
                          cwd=REPO, timeout=240)
    assert proc.returncode == 0, proc.stderr
    slow = []
    for case, (big, small) in json.loads(proc.stdout).items():
        # Linear: 8x the text, about 8x the time. Quadratic would be 64x. Times under 20 ms are noise-dominated
        # (the ratio of two tiny numbers means nothing), so only slower ones are held to the ratio.
        if big > 0.02 and big / max(small, 1e-4) > 24:
            slow.append(f"{case}: {big:.3f} s on 1 MB, {small:.4f} s on 125 kB ({big / max(small, 1e-4):.0f}x)")
        if big > 5:
            slow.append(f"{case}: {big:.1f} s on 1 MB")
    assert not slow, "\n".join(slow)


def test_the_score_command_takes_a_one_megabyte_line_in_seconds(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"completion": "1" * 1_000_000, "gold": "18"}) + "\n", encoding="utf-8")
    for mode in MODES:
        proc = subprocess.run([sys.executable, "-m", "bench", "score", str(path), "--completion-field",
                               "completion", "--gold-field", "gold", "--mode", mode], capture_output=True,
                              text=True, cwd=REPO, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("accuracy: 0.0000 (0/1)"), proc.stdout


# -- the same results: each rewritten pattern against the one it replaces ---------------------------------------
OLD_LMEVAL_IGNORE = (",", r"\$", r"(?s).*#### ", r"\.$")  # lm-eval's gsm8k.yaml, as written there
OLD_ANSWER_IS = re.compile(r"the\s+(?:final\s+)?answer\s+is\s*:?\s*(" + verifier._NUMBER_IN_TEXT.pattern + r")",
                           re.IGNORECASE)
OLD_GOLD_LINE = re.compile(r"^\s*####\s*(.*?)\s*$", re.MULTILINE)
PIECES = ["#### ", "####", " ", "  ", "\n", "\t", "1", "23", "4,567", ".", "$", "-", ":", "the answer is",
          "The final answer is", "<answer>", "</answer>", "\\boxed{", "}", " or ", "x", "5.0", "minus ", "\u2212"]


def _old_lmeval_normalize(text: str) -> str:
    for pattern in OLD_LMEVAL_IGNORE:
        text = re.sub(pattern, "", text)
    return text.lower()


def _old_last_answer_block(text: str) -> str | None:
    close = text.rfind("</answer>")
    while close != -1:
        start = text.rfind("<answer>", 0, close)
        if start != -1:
            return text[start + len("<answer>"):close]
        close = text.rfind("</answer>", 0, close)
    return None


def _texts(count: int = 3000) -> list[str]:
    rng = random.Random(20261204)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14))) for _ in range(count)]


def test_the_rewritten_patterns_match_what_the_old_ones_matched() -> None:
    for text in _texts():
        assert lmeval_normalize(text) == _old_lmeval_normalize(text), repr(text)
        assert ([m.group(1) for m in verifier._ANSWER_IS.finditer(text)]
                == [m.group(1) for m in OLD_ANSWER_IS.finditer(text)]), repr(text)
        assert [m.end(1) for m in verifier._ANSWER_IS.finditer(text)] == [m.end(1) for m in
                                                                          OLD_ANSWER_IS.finditer(text)]
        assert verifier.GOLD_LINE.findall(text) == OLD_GOLD_LINE.findall(text), repr(text)
        assert verifier._last_answer_block(text) == _old_last_answer_block(text), repr(text)


@pytest.mark.parametrize("completion, gold, verdicts", [
    ("<think>6*3</think> <answer>18</answer>", "18", (True, True, False, True)),
    ("So 6*3 = 18.\n#### 18", "Janet has 6*3 = 18.\n#### 18", (True, True, True, True)),
    ("The final answer is: 1,000.", "#### 1,000", (True, True, False, True)),
    ("#### 5.0", "5", (True, True, False, False)),
    ("The answer is 14 or 15", "14", (False, False, False, False)),
    ("no number at all", "7", (False, False, False, False)),
    ("\n\n#### 12\n", "\n\n\n#### 12", (True, True, True, True)),
])
def test_ordinary_verdicts_are_unchanged(completion: str, gold: str, verdicts: tuple[bool, ...]) -> None:
    assert tuple(judge(completion, gold, mode)[1] for mode in MODES) == verdicts
