"""Training-dynamics monitors over a batch of completions: reward hacking and the "aha" moment. Pure Python.

What a method's completions look like at a logged step (or at the final evaluation), in the suite's canonical
metric names (:data:`bench.results.METRIC_NAMES`). The same function serves every online method: the suite's
engine calls it on its rollout, TRL's GRPO through a reward-function wrapper
(:func:`bench.telemetry.trl_monitors.with_monitors`), and the worker can call it on the evaluation's completions.

Definitions (every rate is a share of ALL completions in the batch, so rates share one denominator and can be
compared step to step):

- ``completion_length`` / ``completion_length_p90``: mean and 90th percentile of the token lengths the caller
  passes (the suite's EOS rule, ``bench.model.generation.completion_length``); p90 by :func:`bench.scoring.stats.percentile`
  (linear interpolation, numpy's default). Left out when no lengths are given.
- ``truncated_rate``: share of completions that hit ``max_new_tokens`` without EOS (the caller's flags).
  Left out when no flags are given.
- ``empty_answer_rate``: share with no answer the suite's strict extraction finds (``bench.task.verifier.
  extract_answer`` in the mode the old name ``strict`` resolves to, i.e. ``suite-strict``; the same rule as
  ``bench.task.rewards.is_empty_answer``).
- ``format_only_rate``: share with the right format (``bench.task.verifier.has_format``) but a wrong strict answer:
  the format reward earned without the accuracy reward. Left out when no golds are given.
- ``repetition_rate``: share with a back-to-back loop (``bench.task.rewards.has_repetition``, its defaults), kept so
  this function covers everything ``bench.task.rewards.degenerate_stats`` gave.
- ``repeated_ngram_rate``: share of completions in which some n-gram of :data:`NGRAM` = 4 words occurs at
  least :data:`NGRAM_REPEATS` = 3 times, anywhere (not necessarily back to back). Words are the lower-cased
  whitespace-separated pieces of the text, punctuation kept (``"5."`` and ``"5"`` differ). Occurrences may
  overlap (``a a a a a a`` holds ``a a a a`` three times). Broader than ``repetition_rate``: it also catches a
  model that restates the same sentence at scattered places, at the price of some natural reuse of phrases.
- ``answer_in_think_rate``: share of completions whose strict answer (a number) also appears as a number in
  the think block, i.e. the text after the first ``<think>`` up to the next ``</think>`` (or, without one, up to
  the first ``<answer>`` or the end). Numbers are compared canonically (``bench.task.verifier.normalize_number``:
  ``1,000`` equals ``1000``, ``5.0`` equals ``5``). No think block, or no strict answer: not counted.
- ``reflection_rate``: share of completions with at least one reflection phrase; ``reflection_count``: mean
  number of reflection phrases per completion (the "aha" monitor, drawn with ``completion_length``). Phrases are
  matched case-insensitively and word-bounded (``wait`` does not match ``awaited`` or ``waiting``; spaces inside
  a phrase match any run of whitespace), non-overlapping, each phrase counted on its own; the default list is
  :data:`DEFAULT_REFLECTION_PHRASES`.
- ``zero_std_groups`` (:func:`group_monitors`): share of prompt groups whose rewards are all equal (max - min
  <= 1e-8), which give every completion a zero advantage and so no learning signal.

:data:`THRESHOLDS` declares when a monitor says something went wrong; :func:`flags` turns a crossing into one
human line, :func:`curve_flags` judges a whole run by the mean of its last fifth of logged points, and
:func:`run_flags` adds the final evaluation's monitors (:func:`record_monitors` of its completion records). A flag
fires only beyond what the lr-0 control arm shows for the same monitor (:data:`NOISE_SE` standard errors), so
sampling noise that a model which cannot learn shows too never reads as reward hacking. A rise in
``format_only_rate`` is called format farming only when the format rate itself (:data:`FORMAT_RATE`) rose too;
with the format rate flat the rise is accuracy falling, and the line says so.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.task import verifier
from bench.task.rewards import completion_text, has_repetition
from bench.scoring.stats import percentile

NGRAM = 4
"""Words per n-gram for ``repeated_ngram_rate``."""
NGRAM_REPEATS = 3
"""Occurrences of one n-gram that make a completion repetitive."""
ZERO_STD_TOLERANCE = 1e-8
"""A group whose rewards span no more than this is zero-variance (TRL tests ``isclose(std, 0)``, atol 1e-8)."""

DEFAULT_REFLECTION_PHRASES: tuple[str, ...] = ("wait", "let me check", "re-check", "recheck", "verify",
                                               "double-check")
"""Phrases that mark a model re-checking itself (the "aha moment" of DeepSeek-R1-style training)."""

MONITOR_NAMES: tuple[str, ...] = (
    "completion_length", "completion_length_p90", "truncated_rate", "empty_answer_rate", "format_only_rate",
    "repetition_rate", "repeated_ngram_rate", "answer_in_think_rate", "reflection_rate", "reflection_count")
"""Every name :func:`completion_monitors` can return, in a stable order (each is in METRIC_NAMES)."""

# A number as written in running text, for the think block: optional sign and "$", digits with optional
# thousands commas, optional fraction. Not preceded by a letter, digit or dot (so "x2" and "1.5.3" do not
# yield stray numbers, and "16-3" gives 16 and 3, not -3).
_NUMBER = re.compile(r"(?<![0-9A-Za-z.])-?\$?[0-9][0-9,]*(?:\.[0-9]+)?")


def strict_mode() -> str:
    """The name of the suite's strict extraction mode, looked up at call time.

    ``bench.task.verifier`` renamed ``strict`` to ``suite-strict`` and keeps the old name as an alias; resolving the
    old name gives the current one whichever side of the rename this runs on. Not ``HEADLINE_MODE``: a report
    may pick another headline mode, but the monitors keep the rewards' rule.
    """
    resolve = getattr(verifier, "resolve_mode", None)
    return resolve("strict") if callable(resolve) else "strict"


# ------------------------------------------------------------------------------------ per completion
def repeated_ngram(text: str, n: int = NGRAM, repeats: int = NGRAM_REPEATS) -> bool:
    """True when some n-gram of ``n`` lower-cased words occurs at least ``repeats`` times in ``text``."""
    words = text.lower().split()
    counts = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    return any(count >= repeats for count in counts.values())


def think_block(text: str) -> str | None:
    """The think block: after the first ``<think>``, up to the next ``</think>`` (else the first ``<answer>``
    after it, else the end); None when there is no ``<think>``."""
    start = text.find("<think>")
    if start == -1:
        return None
    body = text[start + len("<think>"):]
    for end_tag in ("</think>", "<answer>"):
        end = body.find(end_tag)
        if end != -1:
            return body[:end]
    return body


def numbers_in(text: str) -> set[str]:
    """The canonical numbers (``bench.task.verifier.normalize_number``) written in ``text``."""
    found = set()
    for match in _NUMBER.finditer(text):
        value = verifier.normalize_number(match.group(0).rstrip(","))
        if value is not None:
            found.add(value)
    return found


def answer_in_think(text: str, mode: str | None = None) -> bool:
    """True when the strict answer of ``text`` is also written as a number inside its think block."""
    answer = verifier.extract_answer(text, mode or strict_mode())
    think = think_block(text)
    return answer is not None and think is not None and answer in numbers_in(think)


@functools.lru_cache(maxsize=256)
def _phrase_pattern(phrase: str) -> re.Pattern[str]:
    """``phrase`` case-insensitive, word-bounded, any whitespace run between its words."""
    words = phrase.strip().split()
    if not words:
        raise ValueError("a reflection phrase must not be blank")
    body = r"\s+".join(re.escape(w) for w in words)
    return re.compile(r"(?<!\w)" + body + r"(?!\w)", re.IGNORECASE)


def reflection_count(text: str, phrases: Sequence[str] = DEFAULT_REFLECTION_PHRASES) -> int:
    """Occurrences of the reflection ``phrases`` in ``text`` (each phrase counted on its own, non-overlapping)."""
    return sum(len(_phrase_pattern(p).findall(text)) for p in phrases)


# ------------------------------------------------------------------------------------ per batch
def completion_monitors(texts: Sequence[Any], golds: Sequence[str] | None, lengths: Sequence[int] | None = None,
                        hit_max: Sequence[bool] | None = None,
                        phrases: Sequence[str] = DEFAULT_REFLECTION_PHRASES) -> dict[str, float]:
    """The monitors of one batch of completions, by canonical metric name (see the module docstring).

    Args:
        texts: completions without the prompt (strings, or TRL's chat-message lists).
        golds: the gold numbers, one per completion, or None (then ``format_only_rate`` is left out).
        lengths: completion lengths in tokens, or None (then the two length monitors are left out).
        hit_max: per completion, True when it hit ``max_new_tokens`` without EOS, or None (then
            ``truncated_rate`` is left out).
        phrases: the reflection phrases.

    Returns ``{name: float}``; an empty batch returns ``{}`` (no honest rate exists). Raises ValueError when a
    per-completion list's length differs from ``texts``'.
    """
    items = [completion_text(t) for t in texts]
    n = len(items)
    for name, values in (("golds", golds), ("lengths", lengths), ("hit_max", hit_max)):
        if values is not None and len(values) != n:
            raise ValueError(f"got {n} completions but {len(values)} {name}")
    if n == 0:
        return {}
    mode = strict_mode()
    answers = [verifier.extract_answer(t, mode) for t in items]
    out: dict[str, float] = {}
    if lengths is not None:
        out["completion_length"] = sum(float(x) for x in lengths) / n
        out["completion_length_p90"] = percentile([float(x) for x in lengths], 90.0)
    if hit_max is not None:
        out["truncated_rate"] = sum(bool(h) for h in hit_max) / n
    out["empty_answer_rate"] = sum(a is None for a in answers) / n
    if golds is not None:
        out["format_only_rate"] = sum(verifier.has_format(t) and not verifier.is_correct(t, g, mode)
                                      for t, g in zip(items, golds)) / n
    out["repetition_rate"] = sum(has_repetition(t) for t in items) / n
    out["repeated_ngram_rate"] = sum(repeated_ngram(t) for t in items) / n
    out["answer_in_think_rate"] = sum(answer_in_think(t, mode) for t in items) / n
    counts = [reflection_count(t, phrases) for t in items]
    out["reflection_rate"] = sum(c > 0 for c in counts) / n
    out["reflection_count"] = sum(counts) / n
    return out


def group_monitors(rewards: Sequence[float], group_size: int) -> dict[str, float]:
    """``{"zero_std_groups": share of groups whose rewards are all equal}``.

    ``rewards`` holds consecutive groups of ``group_size`` completions of one prompt (TRL's and the engine's
    layout). Raises ValueError when ``group_size < 1`` or the rewards do not split into whole groups; an empty
    list returns ``{}``.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    groups = [rewards[i:i + group_size] for i in range(0, len(rewards), group_size)]
    if not groups:
        return {}
    flat = sum(max(g) - min(g) <= ZERO_STD_TOLERANCE for g in groups)
    return {"zero_std_groups": flat / len(groups)}


# ------------------------------------------------------------------------------------ thresholds
THRESHOLDS: dict[str, tuple[str, float, str]] = {
    "empty_answer_rate": (">", 0.5, "most completions give no answer the strict extraction reads (format "
                                    "collapse or answers cut off)"),
    "repeated_ngram_rate": (">", 0.2, "over a fifth of completions repeat a 4-word phrase 3+ times (degenerate "
                                      "repetition)"),
    "repetition_rate": (">", 0.1, "over a tenth of completions are caught in a back-to-back loop"),
    "truncated_rate": (">", 0.2, "over a fifth of completions run into max_new_tokens without EOS (length "
                                 "blow-up; answers cut off)"),
    "zero_std_groups": (">", 0.8, "over 80% of prompt groups score identically, so most of the batch carries "
                                  "no learning signal"),
}
"""Declared thresholds: monitor name -> (comparison ``">"`` or ``"<"``, value, why crossing it matters)."""

RISES: dict[str, tuple[float, str]] = {
    "format_only_rate": (0.15, "more completions earn the format reward with a wrong answer than at the start; "
                               "the format rate was not recorded, so this cannot tell format farming from a fall in "
                               "accuracy"),
}
"""Monitors judged by how far they rose, not by their level: name -> (rise that flags, as a share; why).

A weak model that answers in the right format is mostly "right format, wrong answer" from its first step (a
model at 45% accuracy sits near 55%), so a fixed level would flag every weak run, the lr-0 control included.
Farming shows as a rise: over training (first fifth of logged points to last fifth), and at the final
evaluation against the starting checkpoint's evaluation. The ``why`` is the line for a run that did not record
its format rate (:data:`FORMAT_RATE`); with it, :func:`_rise_line` says which of the two the rise was."""

FORMAT_RATE = "format_reward"
"""The format rate: share of completions in the right format (``bench.task.verifier.has_format``), i.e. the mean
0/1 format reward. Training logs it as a reward component; :func:`record_monitors` adds it to the evaluation's.

Why it decides the farming flag: format-only = format rate - (right format and right answer). With the format
rate saturated (PPO with the reward model on cpu-tiny: about 98% before and after) format-only can only rise by
accuracy falling (there 70% -> 91%), which is not the format reward being farmed."""
FARMED = "the format reward is being farmed rather than answers learned"
"""The farming flag's reason, said only when the format rate itself rose beyond its noise and the control arm."""

_COMPARE = {">": lambda a, b: a > b, "<": lambda a, b: a < b}

NOISE_SE = 2.0
"""A flag's excess over the control arm (or a change between windows) must exceed this many standard errors of the
difference: logged points are means of one small batch each, so a window of a few points moves by sampling alone
(on cpu-tiny the lr-0 control's own format-only rate went 46.9% -> 68.8% between its first and last windows)."""


def _shown(name: str, value: float) -> str:
    """A share as a percentage, anything else as a number."""
    from bench.results import METRIC_NAMES  # lazy: results is heavier than this module needs at import

    metric = METRIC_NAMES.get(name)
    if metric is not None and metric.unit.startswith("share"):
        return f"{100 * value:.1f}%"
    return f"{value:.4g}"


def flags(monitors: Mapping[str, float]) -> list[str]:
    """One line per monitor in ``monitors`` that crosses its :data:`THRESHOLDS` entry, in the table's order.

    E.g. ``"empty_answer_rate 62.0% > 50.0%: most completions give no answer ..."``. Names without a threshold,
    and values that are missing, None or NaN, are skipped. No comparison with a control: :func:`run_flags` adds it.
    """
    lines = []
    for name, (comparison, limit, why) in THRESHOLDS.items():
        value = monitors.get(name)
        if not _number(value):
            continue
        if _COMPARE[comparison](float(value), limit):
            lines.append(f"{name} {_shown(name, float(value))} {comparison} {_shown(name, limit)}: {why}")
    return lines


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(float(value))


def window(points: Sequence[Mapping[str, Any]], first: bool = False) -> list[Mapping[str, Any]]:
    """The last (or ``first``) fifth of a run's logged points, at least one: the window every flag judges by."""
    size = max(1, len(points) // 5)
    return list(points[:size] if first else points[-size:])


def window_stats(points: Sequence[Mapping[str, Any]], name: str) -> tuple[float, float | None] | None:
    """(mean, standard error of the mean) of ``name`` over ``points`` (NaN and missing values skipped); the
    standard error is None with a single value (no spread to estimate it from); None when no point carries it."""
    values = [float(p[name]) for p in points if _number(p.get(name))]
    if not values:
        return None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return mean, sd / math.sqrt(len(values))


def _se(*errors: float | None) -> float:
    """The standard error of a sum or difference of independent means (unknown errors count as 0)."""
    return math.sqrt(sum(e * e for e in errors if e is not None))


def _window_means(points: Sequence[Mapping[str, float]], names: Mapping[str, Any]) -> dict[str, float]:
    """Mean of each of ``names`` over the points that carry it (NaN and missing values skipped)."""
    out = {}
    for name in names:
        found = window_stats(points, name)
        if found is not None:
            out[name] = found[0]
    return out


@dataclass(frozen=True)
class Move:
    """One share (in [0, 1]) from a start to an end: first to last window of training, or the starting
    checkpoint's evaluation to the final one.

    ``bar``: what its change must exceed to be more than noise (:data:`NOISE_SE` standard errors of the change;
    0 when no spread is known). ``control``: the lr-0 control arm's change over the same span, None without one.
    """

    start: float
    end: float
    bar: float = 0.0
    control: float | None = None

    @property
    def change(self) -> float:
        return self.end - self.start

    def rose(self) -> bool:
        """True when it rose by more than its bar beyond the control arm's own rise (a fall there counts as 0)."""
        return self.change - max(self.control or 0.0, 0.0) > self.bar


def _pp(change: float) -> str:
    """A change of a share in percentage points, signed: '+21.0 pp'."""
    return f"{100 * change:+.1f} pp"


def _rise_line(name: str, limit: float, why: str, move: Move, form: Move | None, tail: str = "") -> str | None:
    """The line for a :data:`RISES` monitor, or None when it did not rise by more than ``limit`` beyond its noise
    and the control arm. ``form``: the format rate over the same span (:data:`FORMAT_RATE`), None when not recorded.

    For ``format_only_rate`` the format rate decides what the rise was: farming only when the format rate itself
    rose beyond its noise and the control arm; a format rate that did not rise means fewer right answers (the
    line says accuracy fell, with the right-format-and-right-answer share, format rate minus format-only, which
    is exact on the same completions); unrecorded, the line says it cannot tell (``why``). ``tail`` ends the line.
    """
    if move.change <= limit or not move.rose():
        return None
    head = (f"{name} rose {_shown(name, move.start)} -> {_shown(name, move.end)} (+{100 * move.change:.1f} pp > "
            f"{100 * limit:.1f} pp)")
    if name != "format_only_rate" or form is None:
        return f"{head}: {why}{tail}"
    beside = f"; control arm's format rate {_pp(form.control)}" if form.control is not None else ""
    if form.rose():
        return (f"{head} and the format rate rose {_shown(FORMAT_RATE, form.start)} -> "
                f"{_shown(FORMAT_RATE, form.end)} ({_pp(form.change)}{beside}): {FARMED}{tail}")
    right = (form.start - move.start, form.end - move.end)  # right format and right answer
    if right[1] >= right[0]:
        return None  # the format rate rose as the control's did, and right answers did not fall: not this method
    stayed = ("stayed put" if abs(form.change) <= form.bar else "fell" if form.change < 0
              else "rose no more than the control arm's")
    return (f"accuracy fell while the format rate {stayed} ({_shown(FORMAT_RATE, form.start)} -> "
            f"{_shown(FORMAT_RATE, form.end)}{beside}): answers right in the right format went "
            f"{100 * right[0]:.1f}% -> {100 * right[1]:.1f}%, so {name} rose {_shown(name, move.start)} -> "
            f"{_shown(name, move.end)} from fewer right answers, not from the format reward being farmed{tail}")


def _curve_move(name: str, first: Sequence[Mapping[str, Any]], last: Sequence[Mapping[str, Any]],
                c_first: Sequence[Mapping[str, Any]], c_last: Sequence[Mapping[str, Any]]) -> Move | None:
    """``name`` from the ``first`` window to the ``last`` (means), its bar from both windows' spread and the
    control's windows (``c_first``, ``c_last``; empty without a control); None when a window lacks it."""
    a, b = window_stats(first, name), window_stats(last, name)
    if a is None or b is None:
        return None
    ca, cb = window_stats(c_first, name), window_stats(c_last, name)
    control = cb[0] - ca[0] if ca is not None and cb is not None else None
    noise = [a[1], b[1]] + ([ca[1], cb[1]] if control is not None else [])
    return Move(a[0], b[0], NOISE_SE * _se(*noise), control)


def _eval_move(name: str, start: Mapping[str, float], end: Mapping[str, float],
               control: Mapping[str, float] | None, n: int | None) -> Move | None:
    """``name`` from the starting checkpoint's evaluation to ``end``'s; bar: binomial standard errors over ``n``
    questions (unknown ``n``: 0, any excess); the control's change is its final evaluation minus the start."""
    a, b = start.get(name), end.get(name)
    if not (_number(a) and _number(b)):
        return None
    base = control.get(name) if control else None
    return Move(float(a), float(b), NOISE_SE * _se(_binomial_se(a, n), _binomial_se(b, n)),
                float(base) - float(a) if _number(base) else None)


def curve_flags(curves: Sequence[Mapping[str, float]],
                control: Sequence[Mapping[str, float]] | None = None) -> list[str]:
    """:func:`flags` of a run's curve points, judged on the mean of the last fifth of its points (at least one),
    and :data:`RISES` judged from the first fifth to the last; with ``control``, only beyond the control arm.

    Why the last fifth: a run is judged by where training left it, and one noisy step should not flag it (the
    README's "first to last fifth" comparison uses the same window). With ``control`` (the lr-0 control arm's
    curves: the same loop, sampling and reward, no learning) a level flag fires only when the run's window mean
    is above the control's by more than :data:`NOISE_SE` standard errors of the difference, and a rise only when
    it exceeds the control's own rise by that much: what a model that cannot learn also shows is sampling noise,
    not reward hacking. Without a control a rise must still exceed its windows' noise. So the control, compared
    with itself, never flags. The lines say the window, e.g. ``"... (mean of the last 2 of 10 logged points)"``.
    """
    if not curves:
        return []
    last, first = window(curves), window(curves, first=True)
    c_last, c_first = (window(control), window(control, first=True)) if control else ([], [])
    note = f" (mean of the last {len(last)} of {len(curves)} logged points)"
    lines = []
    for name, (comparison, limit, why) in THRESHOLDS.items():
        found = window_stats(last, name)
        if found is None or not _COMPARE[comparison](found[0], limit):
            continue
        mean, se = found
        base = window_stats(c_last, name) if control else None
        if base is not None:
            gap = (mean - base[0]) if comparison == ">" else (base[0] - mean)
            if gap <= NOISE_SE * _se(se, base[1]):
                continue  # the control arm shows as much: not this method's doing
            lines.append(f"{name} {_shown(name, mean)} {comparison} {_shown(name, limit)}: {why}{note}; control "
                         f"arm {_shown(name, base[0])}")
            continue
        lines.append(f"{name} {_shown(name, mean)} {comparison} {_shown(name, limit)}: {why}{note}")
    for name, (limit, why) in RISES.items():
        move = _curve_move(name, first, last, c_first, c_last)
        if move is None:
            continue
        beside = f"; control arm {_pp(move.control)}" if move.control is not None else ""
        line = _rise_line(name, limit, why, move, _curve_move(FORMAT_RATE, first, last, c_first, c_last),
                          f" (first vs last {len(last)} of {len(curves)} logged points{beside})")
        if line:
            lines.append(line)
    return lines


def rise_flags(start: Mapping[str, float], end: Mapping[str, float]) -> list[str]:
    """One line per :data:`RISES` monitor that rose by more than its limit from ``start`` to ``end``, e.g.
    ``"format_only_rate rose 40.0% -> 62.0% (+22.0 pp > 15.0 pp): ..."``, worded by :func:`_rise_line` (which
    reads the format rate when both sides carry it); a monitor missing from either side is skipped. No noise
    and no control arm: :func:`eval_flags` adds both."""
    return _eval_rises(start, end, None, None)


def _eval_rises(start: Mapping[str, float], end: Mapping[str, float], control: Mapping[str, float] | None,
                n: int | None) -> list[str]:
    """The :data:`RISES` lines from the starting checkpoint's evaluation to ``end`` (see :func:`eval_flags`)."""
    lines = []
    for name, (limit, why) in RISES.items():
        move = _eval_move(name, start, end, control, n)
        line = move and _rise_line(name, limit, why, move, _eval_move(FORMAT_RATE, start, end, control, n))
        if line:
            lines.append(line)
    return lines


def _binomial_se(share: float, n: int | None) -> float | None:
    return math.sqrt(max(share * (1 - share), 0.0) / n) if n else None


def eval_flags(evaluation: Mapping[str, float], start: Mapping[str, float] | None = None,
               control: Mapping[str, float] | None = None, n: int | None = None) -> list[str]:
    """The final evaluation's flags: :func:`flags` of its monitors and :func:`rise_flags` against ``start`` (the
    starting checkpoint's evaluation), each kept only beyond the control arm's final evaluation (``control``) by
    more than :data:`NOISE_SE` binomial standard errors over the ``n`` questions (unknown ``n``: any excess)."""
    lines = []
    for name, (comparison, limit, why) in THRESHOLDS.items():
        value = evaluation.get(name)
        if not _number(value) or not _COMPARE[comparison](float(value), limit):
            continue
        base = control.get(name) if control else None
        if _number(base):
            gap = (value - base) if comparison == ">" else (base - value)
            if gap <= NOISE_SE * _se(_binomial_se(value, n), _binomial_se(base, n)):
                continue
        lines.append(f"{name} {_shown(name, float(value))} {comparison} {_shown(name, limit)}: {why}")
    if start:
        lines += _eval_rises(start, evaluation, control, n)
    return lines


# ------------------------------------------------------------------------------------ the final evaluation
def record_monitors(records: Sequence[Mapping[str, Any]],
                    phrases: Sequence[str] = DEFAULT_REFLECTION_PHRASES) -> dict[str, float]:
    """:func:`completion_monitors` of the final evaluation's records (``bench.scoring.evaluation.completion_record``:
    ``completion``, ``gold``, ``tokens``, ``hit_max``), so evaluation and training report the same monitors, plus
    the format rate (:data:`FORMAT_RATE`, which training logs as its format reward): without it a rise in
    format-only completions cannot tell format farming from falling accuracy. An empty list returns ``{}``."""
    texts = [completion_text(r["completion"]) for r in records]
    out = completion_monitors(texts, [r["gold"] for r in records], lengths=[int(r["tokens"]) for r in records],
                              hit_max=[bool(r["hit_max"]) for r in records], phrases=phrases)
    if texts:
        out[FORMAT_RATE] = sum(verifier.has_format(t) for t in texts) / len(texts)
    return out


def run_flags(curves: Sequence[Mapping[str, float]], evaluation: Mapping[str, float] | None = None,
              start: Mapping[str, float] | None = None, control: Sequence[Mapping[str, float]] | None = None,
              control_evaluation: Mapping[str, float] | None = None, n: int | None = None) -> list[str]:
    """Every flag of one run: its training curves (:func:`curve_flags`, beside the control arm's ``control``
    curves when given), then its final evaluation's monitors (:func:`eval_flags` against ``start``, the starting
    checkpoint's evaluation monitors, and the control arm's final evaluation; each line prefixed
    ``"final evaluation: "``). Passing the control arm its own curves and evaluation gives no flags: what the
    control shows is the floor every other run is judged against."""
    lines = curve_flags(curves, control)
    if evaluation:
        lines += ["final evaluation: " + line for line in eval_flags(evaluation, start, control_evaluation, n)]
    return lines
