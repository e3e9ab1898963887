"""Read a suite folder (suite.json + runs/*/result.json) into records, and the method runs into one DataFrame.

Tolerant by design: the report is most useful exactly when something went wrong, so a missing
``suite.json``, a run without ``result.json`` or a corrupt one never stops the build. Such runs become
``not_run`` records with a note saying why ("not run yet", "result.json unreadable"). A result marked ``ok``
whose shape does not match the schema (:func:`bench.results.result_problems`, the check ``--resume`` uses) is
shown as failed with the problem, never as a finished run.

Per-question verdicts come from the run's completions file (``result["eval_file"]``: ``completions.jsonl``, one
line per question with ``correct: {mode: bool}``; older folders: ``eval_after.jsonl`` with ``correct_strict``).
The question and completion texts are dropped on reading (the paired tests need only the verdicts), which keeps
a suite of many runs x thousands of questions small in memory.

The headline scoring mode of a folder is ``report_settings.json``'s ``headline_mode`` when that file exists,
else ``bench.task.verifier.HEADLINE_MODE``.

:func:`results_frame` flattens every method run into one row of raw numbers (fractions, bytes, seconds; a
value that was not measured is NA, never 0). results.csv is that frame written out, and the across-seeds
aggregate groups it, so the CSV and the page are computed from the same cells.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bench.report import fmt
from bench.report.records import Run
from bench.report.reward_check import flag_unlearned
from bench.results import RESULT_FILE, SCHEMA_VERSION, SUITE_FILE, empty_result, is_run_id, result_problems

RUNS_DIR = "runs"
REPORT_SETTINGS_FILE = "report_settings.json"
"""Optional, in the suite folder: ``{"headline_mode": MODE}`` picks the mode of the headline numbers."""
EVAL_FILES = ("completions.jsonl", "eval_after.jsonl")
"""Per-question files tried, in order, when a result does not name its ``eval_file``."""
_DROPPED_FIELDS = ("prompt", "completion", "question")
"""Per-question text left out when reading verdicts (see the module docstring)."""
INVALID_RESULT = "InvalidResult"
"""The error type of an ok result that failed the schema check (it is shown as failed)."""
STAGES = ("warm_start", "sample_pool", "reward_model")
"""Shared stage names; a run without a result is classed as a stage when its id starts with one."""

_SEED_RE = re.compile(r"^(?P<method>.+?)-s(?P<seed>\d+)$")

NAME_LIMIT = 100
"""Characters kept of a name read from a file (a run's label, method, engine, kind, status, id; a preset's name;
every mapping key): a name is repeated in many rows, figures and tables, so a 5,000-character label would be
100,000 characters of page. Other strings are kept to fmt.TEXT_LIMIT."""
DESCRIPTION_LIMIT = 1000
"""Characters kept of suite.json's description (a preset's description is at most this long)."""
NAME_FIELDS = ("run_id", "kind", "method", "label", "engine", "status")
MAX_RESULT_BYTES = 64 * 2**20
"""Largest result.json (or suite.json, report_settings.json) the report reads: the suite's biggest results (a
long run's curves) are a few MB; a larger file was not written by a run and is left out, not read whole."""
_MAX_DEPTH = 64
"""Nesting kept of a file's data; deeper values are dropped (no result the suite writes goes past 10)."""


def _clean(value: Any, limit: int = fmt.TEXT_LIMIT, depth: int = 0) -> Any:
    """``value`` as the report may show it: every string capped at ``limit`` characters and every mapping key at
    NAME_LIMIT (fmt.cap_text, with the count of what was cut), NaN and infinities as None (not measured: no page
    prints ``nan``), nesting past _MAX_DEPTH dropped. Done once here, so every page, table and figure gets it."""
    if isinstance(value, str):
        return fmt.cap_text(value, limit) if len(value) > limit else value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (dict, list)) and depth >= _MAX_DEPTH:
        return None
    if isinstance(value, dict):
        return {_clean(str(k), NAME_LIMIT): _clean(v, limit, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v, limit, depth + 1) for v in value]
    return value


def _clean_result(data: dict[str, Any]) -> dict[str, Any]:
    """:func:`_clean` of a result, its names (NAME_FIELDS) capped at NAME_LIMIT."""
    data = _clean(data)
    for key in NAME_FIELDS:
        if isinstance(data.get(key), str):
            data[key] = fmt.cap_text(data[key], NAME_LIMIT) if len(data[key]) > NAME_LIMIT else data[key]
    return data


def not_plain(path: Path, kind: str) -> str | None:
    """Why the report does not read ``path`` (None when it may, or when it does not exist): a symbolic link
    (its results would be another folder's, shown as this suite's) or not a plain ``kind`` (file / folder)."""
    import os
    import stat

    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"is a symbolic link (to {fmt.cap_text(target, 200)!r})"
    plain = stat.S_ISREG(mode) if kind == "file" else stat.S_ISDIR(mode)
    return None if plain else f"is not a plain {kind}"


def _read_json(path: Path) -> Any:
    """A JSON file's data, or raises ValueError / OSError (not UTF-8, not JSON, nested too deeply)."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_RESULT_BYTES + 1)
    if len(data) > MAX_RESULT_BYTES:
        raise ValueError(f"larger than {MAX_RESULT_BYTES // 2**20} MB")
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("nested too deeply") from None


@dataclass
class Suite:
    """Everything the report needs, read once."""

    suite_dir: Path
    preset: str
    description: str
    created_at: str | None
    spec: dict[str, Any]
    runs: list[Run] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Things the reader should know (unreadable suite.json, skipped verdict lines); shown on the page."""
    headline_mode: str = fmt.HEADLINE_MODE
    """The scoring mode of the headline numbers (report_settings.json, else bench.task.verifier.HEADLINE_MODE)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """suite.json as read (strings capped, NaN as None: :func:`_clean`); {} when missing or unreadable."""

    @property
    def methods(self) -> list[Run]:
        return [r for r in self.runs if r.kind == "method"]

    @property
    def stages(self) -> list[Run]:
        return [r for r in self.runs if r.kind == "stage"]


def load_suite(suite_dir: Path) -> Suite:
    """Read ``suite_dir`` into a :class:`Suite`; runs keep the order of ``suite.json["runs"]``.

    Runs found under ``runs/`` but not listed in suite.json are appended (sorted by id) so nothing that ran
    is hidden. ``suite.json["runs"]`` entries may be plain ids or dicts ``{"id", "kind", "method", "label",
    "seed"}``; the dict form lets the report class a run that has not written its result yet.
    """
    suite_dir = Path(suite_dir)
    problems: list[str] = []
    meta = _read_suite_meta(suite_dir, problems)
    runs = _read_runs(suite_dir, _listed_runs(meta, problems), problems)
    skipped = [p for p in problems if " not read" in p or p.startswith(f"{RUNS_DIR}/ ")]
    if skipped:  # on the page too (problems); here so that `bench report` says it where it was run
        print(f"bench: note: the report skipped {len(skipped)} path(s): {skipped[0]}"
              + (f" (and {len(skipped) - 1} more, listed on the page)" if len(skipped) > 1 else ""), file=sys.stderr)
    flag_unlearned(runs)  # a method trained against a reward model that did not learn says so in its label
    spec = meta.get("spec") if isinstance(meta.get("spec"), dict) else None
    if not spec:
        # Fall back to the spec a run recorded: every result carries the full resolved spec.
        spec = next((r.result["spec"] for r in runs if isinstance(r.result.get("spec"), dict) and r.result["spec"]), {})
    preset = meta.get("preset") or (spec.get("preset") if isinstance(spec.get("preset"), str) else None) or "unknown preset"
    return Suite(
        suite_dir=suite_dir,
        preset=fmt.cap_text(str(preset), NAME_LIMIT),
        description=fmt.cap_text(str(meta.get("description") or ""), DESCRIPTION_LIMIT),
        created_at=meta.get("created_at") if isinstance(meta.get("created_at"), str) else None,
        spec=spec,
        runs=runs,
        problems=problems,
        headline_mode=read_headline_mode(suite_dir, problems),
        meta=meta,
    )


def _read_suite_meta(suite_dir: Path, problems: list[str]) -> dict[str, Any]:
    """suite.json, cleaned (:func:`_clean`); {} when missing, unreadable or not an object (said in ``problems``)."""
    suite_path = suite_dir / SUITE_FILE
    if not suite_path.exists():
        problems.append(f"no {SUITE_FILE}; runs were listed from the folder")
        return {}
    try:
        loaded = _read_json(suite_path)
        if isinstance(loaded, dict):
            return _clean(loaded)
        problems.append(f"{SUITE_FILE} is not a JSON object; runs were listed from the folder")
    except (OSError, ValueError) as exc:
        problems.append(f"{SUITE_FILE} unreadable ({type(exc).__name__}); runs were listed from the folder")
    return {}


def _listed_runs(meta: dict[str, Any], problems: list[str]) -> list[dict[str, Any]]:
    """suite.json's run entries as dicts with an ``id``; an entry that is not a run id is left out (and said)."""
    planned: list[dict[str, Any]] = []
    listed_runs = meta.get("runs") if isinstance(meta.get("runs"), list) else []
    for entry in listed_runs:
        run_id = (entry.get("id") or entry.get("run_id")) if isinstance(entry, dict) else entry
        if not is_run_id(run_id):  # '../x' would read outside the folder
            problems.append(f"{SUITE_FILE} lists {fmt.cap_text(repr(run_id), 80)}, which is not a run id (one folder "
                            f"name under {RUNS_DIR}/); left out")
        elif isinstance(entry, str):
            planned.append({"id": entry})
        else:
            planned.append({**entry, "id": run_id})
    return planned


def _read_runs(suite_dir: Path, planned: list[dict[str, Any]], problems: list[str]) -> list[Run]:
    """The listed runs, then any other run folder with a result (sorted by id), each read; none is read under a
    ``runs/`` that is not a plain folder (each is a placeholder saying why)."""
    listed = {p["id"] for p in planned}
    runs_root = suite_dir / RUNS_DIR
    linked = not_plain(runs_root, "folder")
    if linked:  # `bench run` refuses a linked runs/ too: results from elsewhere are not this suite's
        problems.append(f"{RUNS_DIR}/ {linked}; no result under it was read (the report reads only plain folders "
                        f"and files inside the suite folder)")
        return [Run(run_id=p["id"], result=_placeholder(p["id"], p), note=f"not read: {RUNS_DIR}/ {linked}")
                for p in planned]
    if runs_root.is_dir():
        for child in sorted(runs_root.iterdir()):
            if (child.is_dir() and not child.is_symlink() and child.name not in listed
                    and (child / RESULT_FILE).exists()):
                planned.append({"id": child.name})
    return [_load_run(runs_root / p["id"], p, problems) for p in planned]


def read_headline_mode(suite_dir: Path, problems: list[str]) -> str:
    """The folder's headline mode: ``report_settings.json["headline_mode"]`` if the file names a known mode,
    else :data:`fmt.HEADLINE_MODE` (an unreadable file or an unknown mode is added to ``problems``)."""
    path = Path(suite_dir) / REPORT_SETTINGS_FILE
    if not path.exists():
        return fmt.HEADLINE_MODE
    try:
        data = _read_json(path)
    except (OSError, ValueError) as exc:
        problems.append(f"{REPORT_SETTINGS_FILE} unreadable ({type(exc).__name__}); headline mode "
                        f"{fmt.HEADLINE_MODE}")
        return fmt.HEADLINE_MODE
    mode = data.get("headline_mode") if isinstance(data, dict) else None
    if mode is None:
        return fmt.HEADLINE_MODE
    if mode not in fmt.MODES:
        problems.append(f"{REPORT_SETTINGS_FILE}: headline_mode {fmt.cap_text(str(mode), 80)!r} is not one of "
                        f"{', '.join(fmt.MODES)}; headline mode {fmt.HEADLINE_MODE}")
        return fmt.HEADLINE_MODE
    return str(mode)


def _load_run(run_dir: Path, plan: dict[str, Any], problems: list[str]) -> Run:
    run_id = plan["id"]
    path = run_dir / RESULT_FILE
    data: Any = None
    note: str | None = None
    outside = not_plain(run_dir, "folder") or not_plain(path, "file")
    if outside:
        note = f"result.json not read: {outside}"
        problems.append(f"{run_id}: {note}; the report reads only plain files inside the suite folder")
    elif not path.exists():
        note = "not run yet"
    else:
        try:
            data = _read_json(path)
        except (OSError, ValueError) as exc:
            data = None
            if "larger than" in str(exc):
                note = f"result.json not read: {exc}"
                problems.append(f"{run_id}: {note}; a run writes a few MB at most")
        if not isinstance(data, dict):
            note = note or "result.json unreadable"
            data = None
        elif data.get("schema_version") != SCHEMA_VERSION:
            note = f"result.json has schema_version {data.get('schema_version')!r}, expected {SCHEMA_VERSION}"
            data = None
    if data is None:
        return Run(run_id=run_id, result=_placeholder(run_id, plan), note=note)
    invalid = result_problems(data) if data.get("status") == "ok" else []  # on the data as written (NaN included)
    result = empty_result(run_id, "method", "", "", "", 0)
    result.update(_clean_result(data))
    if invalid:
        # The check --resume uses: such a run is re-run there, so here it is not a finished run either.
        shown = "; ".join(invalid[:3]) + ("; ..." if len(invalid) > 3 else "")
        result["status"] = "failed"
        result["error"] = {"type": INVALID_RESULT, "message": f"result.json says ok but is malformed: {shown}"}
        problems.append(f"{run_id}: result.json says ok but is malformed ({shown}); shown as failed")
    _fill_dict_defaults(result)
    verdicts = _load_verdicts(run_dir, result, problems)
    return Run(run_id=run_id, result=result, verdicts=verdicts)


def _placeholder(run_id: str, plan: dict[str, Any]) -> dict[str, Any]:
    """A not_run result for a planned run, classed from the plan entry or, failing that, its id."""
    match = _SEED_RE.match(run_id)
    method = plan.get("method") or (match.group("method") if match else run_id)
    seed = plan.get("seed")
    if seed is None and match:
        seed = int(match.group("seed"))
    kind = plan.get("kind") or ("stage" if any(str(method).startswith(s) for s in STAGES) else "method")
    result = empty_result(run_id, kind, str(method), str(plan.get("label") or method), str(plan.get("engine") or ""), 0)
    result["seed"] = seed if isinstance(seed, int) and not isinstance(seed, bool) else None  # None when unknown: the CSV shows an empty cell, not a made-up 0
    return _clean_result(result)


def _fill_dict_defaults(result: dict[str, Any]) -> None:
    """Replace nulls / wrong types in the nested containers so the table code can use .get freely."""
    skeleton = empty_result("", "", "", "", "", 0)
    for key in ("accuracy", "memory", "throughput", "phases", "metrics", "settings", "environment", "spec"):
        if not isinstance(result.get(key), dict):
            result[key] = skeleton[key]
    for key in ("samples", "curves"):
        if not isinstance(result.get(key), list):
            result[key] = []
    for key in ("phases", "networks"):
        if not isinstance(result["memory"].get(key), dict):
            result["memory"][key] = {}


def _load_verdicts(run_dir: Path, result: dict[str, Any], problems: list[str]) -> list[dict[str, Any]] | None:
    """Per-question lines of the after-training evaluation without their text, or None when the run wrote none."""
    names = [result["eval_file"]] if isinstance(result.get("eval_file"), str) and result["eval_file"] else EVAL_FILES
    path = next((run_dir / n for n in names if is_run_id(n) and (run_dir / n).is_file()), None)
    if path is None:
        return None
    outside = not_plain(path, "file")
    if outside:  # one file name inside the run folder, not a link out of it
        problems.append(f"{run_dir.name}: {path.name} not read: {outside}; left out of the paired tests")
        return None
    return read_verdicts(path, problems, label=run_dir.name)


def read_verdicts(path: Path, problems: list[str], label: str = "") -> list[dict[str, Any]] | None:
    """The lines of one per-question file keyed and sorted by ``index``, text fields dropped; unreadable lines are
    skipped and counted in ``problems``. None when the file cannot be read."""
    rows: dict[int, dict[str, Any]] = {}
    bad = 0
    where = f"{label}: {path.name}" if label else str(path)
    try:
        handle = path.open(encoding="utf-8")
    except OSError:
        problems.append(f"{where} unreadable; left out of the paired tests")
        return None
    with handle:
        try:
            for line in handle:  # line by line: a completions file of a big eval can be tens of MB
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    rows[int(row["index"])] = _clean({k: v for k, v in row.items() if k not in _DROPPED_FIELDS})
                except (ValueError, KeyError, TypeError, RecursionError):
                    bad += 1
        except (OSError, UnicodeDecodeError):
            problems.append(f"{where} unreadable; left out of the paired tests")
            return None
    if bad:
        problems.append(f"{where}: {bad} unreadable line(s) skipped")
    return [rows[i] for i in sorted(rows)]


# --- one DataFrame of method runs (results.csv, the across-seeds table) ----------------------------------
CSV_COLUMNS = [
    # The first twelve are a stable contract (scripts read them by position too); add new ones at the end.
    "method", "seed", "status",
    "accuracy_before", "accuracy_after", "accuracy_after_low", "accuracy_after_high",
    "peak_memory_bytes", "memory_source",
    "completions_per_s", "tokens_per_s", "wall_s",
    "label", "engine", "run_id",
    "accuracy_before_low", "accuracy_before_high",
    "accuracy_before_flexible", "accuracy_after_flexible",
    "accuracy_after_flexible_low", "accuracy_after_flexible_high",
    "n_questions", "baseline_memory_bytes",
    "train_s", "steps", "step_s_median", "step_s_p90", "trained_tokens_per_s",
    "error",
    "setup_s", "params_changed_fraction", "update_to_weight_ratio",
    "recipe_s", "timing",
    "headline_mode",
    *[f"accuracy_{when}_{fmt.mode_column(m)}{part}" for m in fmt.MODES
      for when, part in (("before", ""), ("after", ""), ("after", "_low"), ("after", "_high"))],
    "format_rate_before", "format_rate_after", "truncated_rate_before", "truncated_rate_after",
]
INT_COLUMNS = ("seed", "peak_memory_bytes", "n_questions", "baseline_memory_bytes", "steps")
"""Counts and bytes: nullable integers (pandas ``Int64``), so a missing seed is an empty cell, not ``0.0``."""
TEXT_COLUMNS = ("method", "status", "memory_source", "label", "engine", "run_id", "error", "timing", "headline_mode")
"""Everything else is a measurement: nullable floats (``Float64``)."""


def csv_row(run: Run, headline_mode: str = fmt.HEADLINE_MODE) -> dict[str, Any]:
    """One method run as raw values keyed by :data:`CSV_COLUMNS`; None marks a value that was not measured.

    ``accuracy_before`` / ``accuracy_after`` (and their intervals) are in ``headline_mode``, named in the
    ``headline_mode`` column; ``accuracy_*_flexible`` are suite-flexible (their meaning before the modes were
    renamed); every mode also has its own ``accuracy_{before,after}_<mode>`` columns.
    """
    res = run.result
    strict_b, strict_a = fmt.score(run, "before", headline_mode), fmt.score(run, "after", headline_mode)
    flex_b, flex_a = fmt.score(run, "before", "suite-flexible"), fmt.score(run, "after", "suite-flexible")
    memory = res.get("memory", {})
    timing = res.get("throughput", {}).get("timing")

    def part(s: dict[str, Any] | None, key: str) -> float | None:
        return None if s is None else s.get(key)

    return {
        "method": res.get("method") or run.run_id,
        "seed": res.get("seed"),
        "status": run.status,
        "accuracy_before": part(strict_b, "accuracy"),
        "accuracy_after": part(strict_a, "accuracy"),
        "accuracy_after_low": part(strict_a, "low"),
        "accuracy_after_high": part(strict_a, "high"),
        "peak_memory_bytes": fmt.num(memory.get("peak_bytes")),
        # The source is only meaningful beside a reading; without one the cell stays empty.
        "memory_source": memory.get("source") if fmt.num(memory.get("peak_bytes")) is not None else None,
        "completions_per_s": fmt.throughput(run, "completions_per_s"),
        "tokens_per_s": fmt.throughput(run, "tokens_per_s"),
        "wall_s": fmt.throughput(run, "wall_s"),
        "label": run.label,
        "engine": res.get("engine") or None,
        "run_id": run.run_id,
        "accuracy_before_low": part(strict_b, "low"),
        "accuracy_before_high": part(strict_b, "high"),
        "accuracy_before_flexible": part(flex_b, "accuracy"),
        "accuracy_after_flexible": part(flex_a, "accuracy"),
        "accuracy_after_flexible_low": part(flex_a, "low"),
        "accuracy_after_flexible_high": part(flex_a, "high"),
        "n_questions": fmt.num(res.get("accuracy", {}).get("n_questions")) or None,
        "baseline_memory_bytes": fmt.num(memory.get("baseline_bytes")),
        "train_s": fmt.throughput(run, "train_s"),
        "steps": fmt.throughput(run, "steps"),
        "step_s_median": fmt.throughput(run, "step_s_median"),
        "step_s_p90": fmt.throughput(run, "step_s_p90"),
        "trained_tokens_per_s": fmt.throughput(run, "trained_tokens_per_s"),
        "error": fmt.error_text(run) or run.note or None,
        "setup_s": fmt.throughput(run, "setup_s"),
        "params_changed_fraction": fmt.changed_fraction(run),
        "update_to_weight_ratio": fmt.num(fmt.training_change(run, "update_to_weight_ratio")),
        "recipe_s": fmt.throughput(run, "recipe_s"),
        "timing": timing if isinstance(timing, str) and timing else None,
        "headline_mode": headline_mode,
        **_mode_cells(run),
        "format_rate_before": fmt.rate(run, "format_rate", "before"),
        "format_rate_after": fmt.rate(run, "format_rate", "after"),
        "truncated_rate_before": fmt.rate(run, "truncated_rate", "before"),
        "truncated_rate_after": fmt.rate(run, "truncated_rate", "after"),
    }


def _mode_cells(run: Run) -> dict[str, float | None]:
    """``accuracy_before_<mode>``, ``accuracy_after_<mode>`` and the after interval, for every mode."""
    out: dict[str, float | None] = {}
    for mode in fmt.MODES:
        before, after = fmt.score(run, "before", mode), fmt.score(run, "after", mode)
        col = fmt.mode_column(mode)
        out[f"accuracy_before_{col}"] = before and before["accuracy"]
        out[f"accuracy_after_{col}"] = after and after["accuracy"]
        out[f"accuracy_after_{col}_low"] = after and after["low"]
        out[f"accuracy_after_{col}_high"] = after and after["high"]
    return out


def _column(name: str, values: list[Any]) -> pd.Series:
    """One typed column: text as ``object`` (None stays None), counts as ``Int64``, measurements as ``Float64``."""
    if name in TEXT_COLUMNS:
        return pd.Series(values, dtype=object, name=name)
    if name in INT_COLUMNS:
        try:
            return pd.Series(pd.array(values, dtype="Int64"), name=name)
        except (TypeError, ValueError):  # a fractional value where a count was expected: keep it, as a float
            pass
    return pd.Series(pd.array([float(v) if v is not None else None for v in values], dtype="Float64"), name=name)


def results_frame(suite: Suite) -> pd.DataFrame:
    """One row per method run (suite order), columns :data:`CSV_COLUMNS`; NA where nothing was measured.

    Stages are left out: they are not comparable rows (the page shows them in their own tables).
    """
    rows = [csv_row(run, suite.headline_mode) for run in suite.methods]
    return pd.DataFrame({name: _column(name, [row[name] for row in rows]) for name in CSV_COLUMNS})
