"""Read a suite folder (suite.json + runs/*/result.json) into plain records for the report.

Tolerant by design: the report is most useful exactly when something went wrong, so a missing
``suite.json``, a run without ``result.json`` or a corrupt one never stops the build. Such runs become
``not_run`` records with a note saying why ("not run yet", "result.json unreadable").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.results import RESULT_FILE, SCHEMA_VERSION, empty_result

SUITE_FILE = "suite.json"
RUNS_DIR = "runs"
STAGES = ("warm_start", "sample_pool", "reward_model")
"""Shared stage names; a run without a result is classed as a stage when its id starts with one."""

_SEED_RE = re.compile(r"^(?P<method>.+?)-s(?P<seed>\d+)$")


@dataclass
class Run:
    """One planned run as the report sees it."""

    run_id: str
    result: dict[str, Any]
    """The result dict, completed with every top-level key of ``empty_result`` (so lookups never fail)."""
    note: str | None = None
    """Why there is no real result: "not run yet" or "result.json unreadable"; None when one was read."""
    verdicts: list[dict[str, Any]] | None = None
    """Per-question verdicts from eval_after.jsonl, sorted by index; None when the file is absent."""

    @property
    def kind(self) -> str:
        return str(self.result.get("kind") or "method")

    @property
    def status(self) -> str:
        return str(self.result.get("status") or "not_run")

    @property
    def label(self) -> str:
        return str(self.result.get("label") or self.result.get("method") or self.run_id)


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
    meta: dict[str, Any] = {}
    suite_path = suite_dir / SUITE_FILE
    if suite_path.exists():
        try:
            loaded = json.loads(suite_path.read_text(encoding="utf-8"))
            if isinstance(loaded, dict):
                meta = loaded
            else:
                problems.append(f"{SUITE_FILE} is not a JSON object; runs were listed from the folder")
        except (OSError, ValueError) as exc:
            problems.append(f"{SUITE_FILE} unreadable ({type(exc).__name__}); runs were listed from the folder")
    else:
        problems.append(f"no {SUITE_FILE}; runs were listed from the folder")

    planned: list[dict[str, Any]] = []
    for entry in meta.get("runs") or []:
        if isinstance(entry, str):
            planned.append({"id": entry})
        elif isinstance(entry, dict) and isinstance(entry.get("id") or entry.get("run_id"), str):
            planned.append({**entry, "id": entry.get("id") or entry.get("run_id")})
    listed = {p["id"] for p in planned}
    runs_root = suite_dir / RUNS_DIR
    if runs_root.is_dir():
        for child in sorted(runs_root.iterdir()):
            if child.is_dir() and child.name not in listed and (child / RESULT_FILE).exists():
                planned.append({"id": child.name})

    runs = [_load_run(runs_root / p["id"], p, problems) for p in planned]
    spec = meta.get("spec") if isinstance(meta.get("spec"), dict) else None
    if not spec:
        # Fall back to the spec a run recorded: every result carries the full resolved spec.
        spec = next((r.result["spec"] for r in runs if isinstance(r.result.get("spec"), dict) and r.result["spec"]), {})
    preset = meta.get("preset") or (spec.get("preset") if isinstance(spec.get("preset"), str) else None) or "unknown preset"
    return Suite(
        suite_dir=suite_dir,
        preset=str(preset),
        description=str(meta.get("description") or ""),
        created_at=meta.get("created_at") if isinstance(meta.get("created_at"), str) else None,
        spec=spec,
        runs=runs,
        problems=problems,
    )


def _load_run(run_dir: Path, plan: dict[str, Any], problems: list[str]) -> Run:
    run_id = plan["id"]
    path = run_dir / RESULT_FILE
    data: Any = None
    note: str | None = None
    if not path.exists():
        note = "not run yet"
    else:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = None
        if not isinstance(data, dict):
            note = "result.json unreadable"
            data = None
        elif data.get("schema_version") != SCHEMA_VERSION:
            note = f"result.json has schema_version {data.get('schema_version')!r}, expected {SCHEMA_VERSION}"
            data = None
    if data is None:
        return Run(run_id=run_id, result=_placeholder(run_id, plan), note=note)
    result = empty_result(run_id, "method", "", "", "", 0)
    result.update(data)
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
    result["seed"] = seed  # None when unknown: the CSV shows an empty cell, not a made-up 0
    return result


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
    """Per-question verdicts of the after-training evaluation, or None when the run wrote none."""
    name = result.get("eval_file") or "eval_after.jsonl"
    path = run_dir / str(name)
    if not path.is_file():
        return None
    rows: dict[int, dict[str, Any]] = {}
    bad = 0
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        problems.append(f"{run_dir.name}: {name} unreadable; left out of the paired tests")
        return None
    for line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows[int(row["index"])] = row
        except (ValueError, KeyError, TypeError):
            bad += 1
    if bad:
        problems.append(f"{run_dir.name}: {bad} unreadable line(s) in {name} skipped")
    return [rows[i] for i in sorted(rows)]
