"""Shared value extraction and formatting, so the CSV, Markdown and HTML never disagree.

Rule: a value that was not measured is ``None`` here, an empty CSV cell, and "not measured" / "—" in text,
never 0.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import results

from bench.task import verifier
from bench.scoring.stats import wilson_interval

from bench.report.records import Run

MISSING = "—"
NOT_MEASURED = "not measured"
MIB = 1024**2
GIB = 1024**3
TEXT_LIMIT = 2000
"""Characters of one free text (a failure reason, a log tail, a completion, a question) the report shows; the
full text stays in the run's result.json and worker.log. A 1 MB completion would otherwise be 1 MB of page."""


def cap_text(text: str, limit: int = TEXT_LIMIT) -> str:
    """``text`` cut to ``limit`` characters (bench.results.cap_text), the report's default limit."""
    return results.cap_text(text, limit)


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (bench.results.write_atomic: the old file or the new one, never half of
    one; a report keeps the mode of the file it replaces, else the user's usual mode)."""
    return results.write_atomic(path, lambda handle: handle.write(text))


def num(value: Any) -> float | None:
    """A finite number or None (bools, strings, NaN and inf are not measurements)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# --- text written into other formats ------------------------------------------------------------------------
CSV_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""A spreadsheet reads a cell that starts with one of these as a formula (OWASP's CSV injection list)."""
_PLAIN_NUMBER = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def csv_cell(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text, never runs: a string starting with a formula character
    (:data:`CSV_FORMULA_STARTS`, a label such as ``=HYPERLINK(...)``) gets a leading ``'`` (OWASP). Numbers, and a
    string that is one plain number (``-0.5``), are left as they are: a spreadsheet reads them as the number. A
    carriage return inside a cell becomes a newline: the writers end lines with ``\\n`` and so quote a cell that
    holds one, but not a cell holding a bare ``\\r``, which a reader takes as the end of the row."""
    if not isinstance(value, str):
        return value
    if value.startswith(CSV_FORMULA_STARTS) and not _PLAIN_NUMBER.fullmatch(value):
        value = "'" + value
    return value.replace("\r\n", "\n").replace("\r", "\n")


def csv_frame(frame: Any) -> Any:
    """A copy of the DataFrame ``frame`` with :func:`csv_cell` applied to its text columns (numbers untouched)."""
    frame = frame.copy()
    for column in frame.columns:
        if frame[column].dtype == object:
            frame[column] = frame[column].map(csv_cell, na_action="ignore")
    return frame


class Markdown(str):
    """Text that is already Markdown, built here (a code span): :func:`md_text` leaves it as it is."""


_MD_TAG_START = re.compile(r"<(?=[A-Za-z/!?])")


def md_text(text: Any) -> str:
    """``text`` (a cell or a line of summary.md or compare.md, result data in it) as Markdown that shows it as
    written: ``&`` as an entity, ``<`` as one where it could open raw HTML, an autolink or a comment (before a
    letter, ``/``, ``!`` or ``?``: a label ``<script>`` is shown, not run; ``p < 0.05`` is text already; with no
    tag opened, a ``>`` closes nothing and is left as written: ``30.0% > 20.0%``),
    ``|`` as ``&#124;`` (a table cell ends at a pipe, escaped by a backslash or not) and a newline as a space (it
    would end the row or the line)."""
    if isinstance(text, Markdown):
        return str(text).replace("\n", " ")
    text = str(text).replace("&", "&amp;")
    return _MD_TAG_START.sub("&lt;", text).replace("|", "&#124;").replace("\n", " ")


def md_code(text: Any) -> Markdown:
    """``text`` as a Markdown code span (shown as written, entities too): fenced by one more backtick than its
    longest run of them, ``|`` as ``\\|`` (what a table cell's code span needs) and a newline as a space."""
    text = str(text).replace("\n", " ").replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return Markdown(f"{fence}{pad}{text}{pad}{fence}")


# --- scoring modes -----------------------------------------------------------------------------------------
MODES: tuple[str, ...] = verifier.MODES
"""The scoring modes every evaluation records, in the order the report lists them."""
HEADLINE_MODE: str = verifier.HEADLINE_MODE
"""The mode headline numbers use unless a suite folder's report_settings.json names another."""
LEGACY_MODES = {"suite-strict": "strict", "suite-flexible": "flexible"}
"""Results written before the modes were renamed store the suite's own modes as 'strict' / 'flexible'; the
report reads them under their new names (same extraction), so old folders still rebuild."""
MODE_DESCRIPTIONS: dict[str, str] = verifier.MODE_DESCRIPTIONS


def _mode_keys(mode: str) -> list[str]:
    """The keys a mode may be stored under: its own name, then its pre-rename name (or the reverse)."""
    keys = [mode]
    if mode in LEGACY_MODES:
        keys.append(LEGACY_MODES[mode])
    keys += [new for new, old in LEGACY_MODES.items() if old == mode]
    return keys


def mode_column(mode: str) -> str:
    """A mode as a CSV column fragment: 'suite-strict' -> 'suite_strict'."""
    return mode.replace("-", "_")


def score(run: Run, when: str, mode: str) -> dict[str, Any] | None:
    """The ``accuracy[when][mode]`` score with ``accuracy``, ``low`` and ``high`` filled in, or None.

    A result written before the modes were renamed is read under the new name ('strict' is 'suite-strict'),
    and the other way round, so callers may use either. When a writer left out the interval but gave counts,
    the Wilson interval is computed here, so every accuracy on the page has one.
    """
    block = run.result.get("accuracy", {}).get(when)
    if not isinstance(block, dict):
        return None
    raw = next((block[k] for k in _mode_keys(mode) if isinstance(block.get(k), dict)), None)
    if raw is None:
        return None
    correct, total = num(raw.get("correct")), num(raw.get("total"))
    acc = num(raw.get("accuracy"))
    if acc is None and correct is not None and total:
        acc = correct / total
    if acc is None:
        return None
    low, high = num(raw.get("low")), num(raw.get("high"))
    if (low is None or high is None) and correct is not None and total is not None and 0 <= correct <= total:
        low, high = wilson_interval(int(correct), int(total))
    out = {"accuracy": acc, "low": low, "high": high, "correct": correct, "total": total, "clusters": None,
           "design_effect": None, "interval": "Wilson"}
    checks = run.result.get("data_checks") if isinstance(run.result.get("data_checks"), dict) else {}
    if num(checks.get("clusters")) is not None and num(checks.get("questions")) == total:
        out["clusters"] = int(checks["clusters"])
    clustered = clustered_score(run, mode) if when == "after" and run.verdicts else None
    if clustered is not None and clustered["n"] == total:
        # The per-question verdicts say which questions share a cluster: the interval respects them (Wilson at
        # the effective sample size; exactly Wilson when every cluster holds one question).
        out["clusters"] = clustered["clusters"]
        out["design_effect"] = clustered["design_effect"]
        if clustered["design_effect"] > 1:
            out.update(low=clustered["low"], high=clustered["high"], interval="cluster-adjusted Wilson")
    return out


# --- clusters: which questions are one unit for the statistics (bench.task.problems.cluster_key) ------------
CLUSTER_UNITS = {"synthetic": "working"}
"""What a cluster is per task source; any other source (GSM8K) has one question per problem."""


def task_source(run: Run) -> str:
    """The task source the run's spec names ('synthetic', 'gsm8k', ...; 'unknown' when not recorded)."""
    task = ((run.result.get("spec") or {}).get("task") or {})
    return str(task.get("source") or "unknown")


def cluster_unit(run: Run) -> str:
    """'working' for the synthetic task, else 'question'."""
    return CLUSTER_UNITS.get(task_source(run), "question")


def question_key(rows: list[dict[str, Any]]) -> Any:
    """How a run's per-question lines are keyed for pairing: by ``id`` when every line has one, else by ``index``
    (bench.report.tables.verdict_map reads the same keys)."""
    by_id = bool(rows) and all(isinstance(r.get("id"), str) and r["id"] for r in rows)
    return (lambda r: r["id"]) if by_id else (lambda r: int(r["index"]))


def cluster_labels(run: Run) -> dict[Any, str]:
    """Question key -> cluster label for the run's per-question lines ({} without them).

    The label is `bench.task.problems.cluster_key` of the line: the synthetic task's working (from the worked
    answer the line keeps as ``gold_answer``), else the question itself. Lines without an ``id`` or a worked
    answer are their own cluster, so nothing is merged on a guess.
    """
    if "clusters" not in run.cache:
        from bench.task.problems import cluster_key  # pure Python; lazy so fmt stays light to import

        rows = run.verdicts or []
        key = question_key(rows)
        source = task_source(run)
        run.cache["clusters"] = {
            key(r): cluster_key(source, str(r.get("id") or f"index {r.get('index')}"),
                                r.get("gold_answer") if isinstance(r.get("gold_answer"), str) else None)
            for r in rows}
    return run.cache["clusters"]


def clustered_score(run: Run, mode: str) -> dict[str, Any] | None:
    """`bench.scoring.stats.clustered_proportion` of the run's per-question verdicts under ``mode``: the accuracy
    after with an interval that respects clusters, ``clusters`` (K) and ``design_effect``; None without verdicts."""
    cache_key = f"clustered:{mode}"
    if cache_key not in run.cache:
        from bench.scoring.stats import clustered_proportion

        rows = run.verdicts or []
        key = question_key(rows)
        labels = cluster_labels(run)
        pairs = [(verdict(r, mode), labels[key(r)]) for r in rows]
        pairs = [(v, c) for v, c in pairs if v is not None]
        run.cache[cache_key] = (clustered_proportion([v for v, _ in pairs], [c for _, c in pairs])
                                if pairs else None)
    return run.cache[cache_key]


def n_text(n: Any, clusters: Any, unit: str) -> str:
    """'5,000 questions (5,000 workings: one question each)', '5,000 questions in 2,099 workings', or the count
    alone when the clusters are not known."""
    if num(n) is None:
        return MISSING
    text = f"{int(n):,} question{'s' if int(n) != 1 else ''}"
    if num(clusters) is None:
        return text
    k = int(clusters)
    if unit == "question":
        return text + " (one per problem)" if k == int(n) else text + f" in {k:,} distinct questions"
    plural = f"{unit}s" if k != 1 else unit
    return text + (f" ({k:,} {plural}: one question each)" if k == int(n) else f" in {k:,} {plural}")


def n_short(n: Any, clusters: Any, unit: str) -> str:
    """'5,000 (5,000 workings)' / '1,319 (1,319 problems)' for a table cell: n and its independent units."""
    if num(n) is None:
        return MISSING
    if num(clusters) is None:
        return f"{int(n):,}"
    k = int(clusters)
    name = "problem" if unit == "question" else unit
    return f"{int(n):,} ({k:,} {name}{'s' if k != 1 else ''})"


def verdict(row: dict[str, Any], mode: str) -> bool | None:
    """One question's verdict under ``mode`` from a per-question line, or None when the line has none.

    Reads the completions file's ``correct: {mode: bool}`` and the older eval_after.jsonl's ``correct_strict`` /
    ``correct_flexible`` (the suite's own modes under their pre-rename names).
    """
    correct = row.get("correct")
    for key in _mode_keys(mode):
        if isinstance(correct, dict) and isinstance(correct.get(key), bool):
            return correct[key]
        if isinstance(row.get(f"correct_{key}"), bool):
            return row[f"correct_{key}"]
    return None


def rate(run: Run, key: str, when: str) -> float | None:
    """``accuracy[key][when]`` for the share-of-questions rates (format_rate, truncated_rate), or None."""
    block = run.result.get("accuracy", {}).get(key)
    return num(block.get(when)) if isinstance(block, dict) else None


def mode_note(mode: str) -> str:
    """'suite-strict (the suite's own strict extraction: ...)' for a table note."""
    return f"{mode} ({MODE_DESCRIPTIONS.get(mode, 'no description recorded')})"


def pct(value: float | None, digits: int = 1) -> str:
    return MISSING if value is None else f"{100 * value:.{digits}f}%"


def score_text(s: dict[str, Any] | None) -> str:
    """'41.0% [35.2–47.1]' (95% Wilson interval), or the dash."""
    if s is None:
        return MISSING
    text = pct(s["accuracy"])
    if s.get("low") is not None and s.get("high") is not None:
        text += f" [{100 * s['low']:.1f}–{100 * s['high']:.1f}]"
    return text


def before_after_text(run: Run, mode: str) -> str:
    """'before → after' accuracy, or 'not evaluated' for a run whose spec switched evaluation off."""
    if not ((run.result.get("spec") or {}).get("eval") or {}).get("enabled", True):
        return "not evaluated (eval.enabled: false)"
    return f"{score_text(score(run, 'before', mode))} → {score_text(score(run, 'after', mode))}"


def byte_unit(max_bytes: float) -> tuple[str, float]:
    """Pick MiB or GiB for a set of readings so a chart's numbers stay readable."""
    return ("GiB", GIB) if max_bytes >= 4 * GIB else ("MiB", MIB)


def bytes_text(value: Any, source: str | None = None) -> str:
    """'1.23 GiB (cuda-allocated)'; a null reading prints 'not measured', never 0."""
    b = num(value)
    if b is None:
        return NOT_MEASURED
    unit, scale = byte_unit(b)
    text = f"{b / scale:.2f} {unit}" if unit == "GiB" else f"{b / scale:.1f} {unit}"
    return f"{text} ({source or 'source unknown'})"


def peak_memory_text(run: Run) -> str:
    memory = run.result.get("memory", {})
    return bytes_text(memory.get("peak_bytes"), memory.get("source"))


def float_text(value: Any, digits: int = 2, unit: str = "") -> str:
    v = num(value)
    if v is None:
        return MISSING
    return f"{v:,.{digits}f}{unit}"


def p_value_text(p: float) -> str:
    """A p-value to three significant digits; one that underflowed to 0.0 prints as a bound, not as 0."""
    return "< 1e-300" if p == 0 else f"{p:.3g}"


def family_note(tests: list[dict[str, Any]]) -> str:
    """Each Holm family among ``tests`` by name and size (stats.holm_family's ``family`` and ``family_size``), for
    the note beside a table of adjusted p-values: 'Holm family "between methods, over seeds": 10 tests; each family
    is adjusted on its own, and no test is in two families.' A family of one test is said to be one (Holm leaves its p
    as it is)."""
    sizes = {t["family"]: t["family_size"] for t in tests if t.get("family")}
    if not sizes:
        return ""
    parts = [f'"{name}": {size} test{"s" if size != 1 else ""}'
             + (" (a family of one: its adjusted p is its p)" if size == 1 else "") for name, size in sizes.items()]
    return (f"Holm famil{'ies' if len(parts) > 1 else 'y'} {'; '.join(parts)}; each family is adjusted on its own, "
            f"and no test is in two families.")


def throughput(run: Run, key: str) -> float | None:
    return num(run.result.get("throughput", {}).get(key))


NO_GENERATION = "n/a (offline)"


def generation_rate_text(run: Run, key: str, digits: int = 2) -> str:
    """A generation rate (completions/s, tokens/s) as text; for a run that generated nothing while training
    (DPO, the SFT and reward-model stages: they train on fixed data) :data:`NO_GENERATION`, so that the dash
    keeps meaning "not measured"."""
    value = throughput(run, key)
    if value is None and run.status == "ok" and num(run.result.get("throughput", {}).get("completions")) == 0:
        return NO_GENERATION
    return float_text(value, digits)


def training_change(run: Run, key: str) -> Any:
    """``result["training_change"][key]`` (None when the run recorded no comparison)."""
    block = run.result.get("training_change")
    return block.get(key) if isinstance(block, dict) else None


def changed_fraction(run: Run) -> float | None:
    """Share of the trained weights that training changed (0..1), or None when not measured."""
    return num(training_change(run, "params_changed_fraction"))


def memory_kind(run: Run, source: str) -> str | None:
    """What a per-phase reading of ``source`` is in this run ("high-water mark", "peak (reset per phase)"),
    as the run recorded it; None for results that predate the label."""
    memory = run.result.get("memory", {})
    if memory.get("source") == source and isinstance(memory.get("kind"), str):
        return memory["kind"]
    for phase in (memory.get("phases") or {}).values():
        kinds = phase.get("kinds") if isinstance(phase, dict) else None
        if isinstance(kinds, dict) and isinstance(kinds.get(source), str):
            return kinds[source]
    return None


def error_text(run: Run) -> str:
    """'OutOfMemoryError: CUDA out of memory (memory at failure: 74.2 GiB)' or '' when no error."""
    err = run.result.get("error")
    if not err:
        return ""
    if not isinstance(err, dict):
        return cap_text(str(err))
    text = f"{err.get('type') or 'Error'}: {cap_text(err.get('message') or '')}".rstrip(": ")
    if err.get("memory_at_failure"):
        text += f" (memory at failure: {err['memory_at_failure']})"
    return cap_text(text, TEXT_LIMIT + 200)  # the message is capped above; this bounds a long type or memory note


def status_text(run: Run) -> str:
    """'ok', 'failed', or the reason there is no result ('not run yet', 'result.json unreadable')."""
    if run.note:
        return cap_text(run.note)
    return {"not_run": "not run"}.get(run.status, run.status)


CONTROL_METHOD = "control"
"""The lr-0 control arm's method key (tables.CONTROL_METHOD): a check of the pipeline, never a contestant."""


def is_control(run: Run) -> bool:
    """Whether ``run`` is the control arm: it is the start by design, so it is ranked, bolded and tested against
    nothing as a method would be (tables.control_table checks it on its own)."""
    return run.result.get("method") == CONTROL_METHOD


def display_names(runs: list[Run]) -> dict[str, str]:
    """Run id -> a short name for charts: the label, plus the seed when a label has several seeds."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.label] = counts.get(r.label, 0) + 1
    names = {}
    for r in runs:
        seed = r.result.get("seed")
        names[r.run_id] = f"{r.label} s{seed}" if counts[r.label] > 1 and seed is not None else r.label
        if counts[r.label] > 1 and seed is None:
            names[r.run_id] = f"{r.label} ({r.run_id})"
    return names


def value_text(value: Any) -> str:
    """A settings / metrics / environment value as compact text (nested values as JSON)."""
    if value is None:
        return MISSING
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list, tuple)):
        return cap_text(json.dumps(value, sort_keys=True, default=str))
    return cap_text(str(value))


def mib_number(value: Any, digits: int = 2) -> str:
    """Bytes as a bare MiB number for a column whose header carries the unit ('0.25', '1,884.12'), or the dash."""
    b = num(value)
    return MISSING if b is None else f"{b / MIB:,.{digits}f}"


def int_text(value: Any) -> str:
    """An integer count with thousands separators ('66,176'), or the dash when not recorded."""
    v = num(value)
    return MISSING if v is None else f"{int(v):,}"


def cell_text(value: Any) -> str:
    """A scalar or a list of scalars as table text: lists as 'a, b, c' rather than JSON brackets."""
    if isinstance(value, (list, tuple)) and all(not isinstance(v, (dict, list, tuple)) for v in value):
        return ", ".join(value_text(v) for v in value) if value else MISSING
    return value_text(value)


def flat_items(data: dict[str, Any], skip: tuple[str, ...] = (), prefix: str = "") -> list[tuple[str, Any]]:
    """``data`` as (dotted key, value) pairs with nested dicts opened up, so no table prints a JSON blob.

    Keys in ``skip`` (top level only) are left out: they have a table of their own (settings' ``precision``
    and ``generation``, metrics' ``lengths``). Lists stay values (see :func:`cell_text`).
    """
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        if not prefix and key in skip:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += flat_items(value, prefix=f"{name}.")
        else:
            out.append((name, value))
    return out


def first_per_label(runs: list[Run], has: Any) -> list[Run]:
    """One run per label (seeds of a method share settings and networks): the first ok run for which
    ``has(run)`` is true, else the first run for which it is; labels with no such run are left out."""
    chosen: dict[str, Run] = {}
    for run in sorted(runs, key=lambda r: r.status != "ok"):  # stable: keeps suite order within each group
        if run.label not in chosen and has(run):
            chosen[run.label] = run
    order = list(dict.fromkeys(r.label for r in runs))
    return [chosen[label] for label in order if label in chosen]


@dataclass
class Table:
    """A formatted table shared by summary.md and index.html: cells are final text (units in the header)."""

    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    """Shown under the table: how the numbers were obtained."""
    warnings: list[str] = field(default_factory=list)
    """Shown under the table, highlighted: something the reader must not miss (lost data, unmatched settings)."""

    def __bool__(self) -> bool:
        return bool(self.rows)
