"""Time per phase: the table (summary.md, index.html) and the data of the time figure (phases.png).

A TRL run records which telemetry seams attached (``result["seams"]``, see bench.telemetry.trl_hooks). A
phase fed by a missing seam was not measured: the table says "not instrumented" and the figure leaves the
phase out with a note, because a zero there would read as "took no time". Runs without a seam record (the
suite's own engine, which times every phase directly, and results written before seams were recorded) have
every recorded phase measured.
"""

from __future__ import annotations

from typing import Any

from bench.report import fmt
from bench.report.load import Run, Suite
from bench.results import PHASES

NOT_INSTRUMENTED = "not instrumented"
"""Table text for a phase whose seam did not attach: not measured, not zero."""


def missing_seams(run: Run) -> list[dict[str, Any]]:
    """The run's missing seams (dicts with at least ``seam``; ``phase``/``counters``/``reason`` when known)."""
    seams = run.result.get("seams")
    missing = seams.get("missing") if isinstance(seams, dict) else None
    if not isinstance(missing, list):
        return []
    return [m for m in missing if isinstance(m, dict) and m.get("seam")]


def uninstrumented(run: Run) -> dict[str, list[str]]:
    """Phase -> names of the missing seams that would have fed it (empty for suite-engine runs)."""
    out: dict[str, list[str]] = {}
    for m in missing_seams(run):
        if isinstance(m.get("phase"), str):
            out.setdefault(m["phase"], []).append(str(m["seam"]))
    return out


def measured_times(run: Run) -> dict[str, float]:
    """Phase -> seconds for the phases that were measured and took time: the figure's bars."""
    skip = uninstrumented(run)
    phases = run.result.get("phases") or {}
    times = {p: fmt.num(v.get("time_s")) for p, v in phases.items() if isinstance(v, dict) and p not in skip}
    return {p: t for p, t in times.items() if t is not None and t > 0}


def _runs(suite: Suite) -> list[Run]:
    """Method runs, then stages, that recorded a phase or a seam."""
    return [r for r in suite.methods + suite.stages if (r.result.get("phases") or uninstrumented(r))]


def _order(names: set[str]) -> list[str]:
    return [p for p in PHASES if p in names] + sorted(names - set(PHASES))


def phase_table(suite: Suite) -> tuple[list[str], list[list[str]]]:
    """Header and rows: seconds per phase per run; 'not instrumented' where the seam was missing.

    A dash means the run recorded no such phase (e.g. DPO does not generate).
    """
    runs = _runs(suite)
    if not runs:
        return [], []
    names = fmt.display_names(runs)
    columns = _order({p for r in runs for p in (r.result.get("phases") or {})} | {p for r in runs
                                                                                  for p in uninstrumented(r)})
    rows = []
    for run in runs:
        missing, phases = uninstrumented(run), run.result.get("phases") or {}
        cells = [names[run.run_id]]
        for phase in columns:
            if phase in missing:
                cells.append(NOT_INSTRUMENTED)
            elif isinstance(phases.get(phase), dict):
                cells.append(fmt.float_text(phases[phase].get("time_s"), 2, " s"))
            else:
                cells.append(fmt.MISSING)
        rows.append(cells)
    return ["run", *columns], rows


def phase_notes(suite: Suite) -> list[str]:
    """One line per missing seam: what was not measured, and why (shown under the table)."""
    runs = [r for r in suite.methods + suite.stages if missing_seams(r)]
    names = fmt.display_names(runs)
    out = []
    for run in runs:
        for m in missing_seams(run):
            what = [f"phase '{m['phase']}'"] if isinstance(m.get("phase"), str) else []
            what += [f"counter '{c}'" for c in (m.get("counters") or []) if isinstance(c, str)]
            subject = " and ".join(what) or "an undeclared part of the trainer"
            reason = f": {m['reason']}" if m.get("reason") else ""
            out.append(f"{names[run.run_id]}: {subject} not instrumented (TRL seam `{m['seam']}` missing{reason}); "
                       f"not measured, not zero.")
    return out


def figure_note(suite: Suite) -> str:
    """The caption addition naming phases left out of the time figure, or ''."""
    names = fmt.display_names(suite.methods)
    left_out = [f"{names[r.run_id]}: {', '.join(_order(set(uninstrumented(r))))}"
                for r in suite.methods if uninstrumented(r)]
    if not left_out:
        return ""
    return " Not instrumented, so left out (not zero): " + "; ".join(left_out) + "."
