"""summary.md: the Markdown a writeup pastes, in the page's order, and the headline rows the page shares.

Moved out of ``tables.py`` so the statistics tables (tables.py, seeds.py, stats) and the document that
arranges them change independently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report import fmt, networks, tables
from bench.report import phases as phase_times
from bench.report.load import Suite

# --- rows shared by summary.md and index.html ------------------------------------------------------------
HEADLINE_COLUMNS = [
    "method", "seed", "status", "accuracy strict (before → after, 95% CI)",
    "accuracy flexible (before → after, 95% CI)", "peak memory (source)",
    "static memory: weights + grads + optimizer (accounting)", "completions/s", "median s/step",
    "trained weights changed",
]
"""Generated tokens/s, set-up, train and wall seconds are in the throughput table (bench.report.throughput)."""


def headline_rows(suite: Suite) -> list[dict[str, Any]]:
    """Formatted headline cells per method run, plus ``error`` text for failed / missing runs."""
    rows = []
    for run in suite.methods:
        seed = run.result.get("seed")
        rows.append({
            "cells": [
                run.label,
                fmt.MISSING if seed is None else str(seed),
                fmt.status_text(run),
                fmt.before_after_text(run, "strict"),
                fmt.before_after_text(run, "flexible"),
                fmt.peak_memory_text(run),
                networks.static_total_text(run),
                fmt.generation_rate_text(run, "completions_per_s"),
                fmt.float_text(fmt.throughput(run, "step_s_median"), 3, " s"),
                fmt.pct(fmt.changed_fraction(run)),
            ],
            "status": run.status,
            "error": fmt.error_text(run),
        })
    return rows


def _md_cell(text: str) -> str:
    # A pipe would split the cell and a newline would end the row.
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _md_section(title: str, key: str, table: fmt.Table) -> list[str]:
    """A titled Markdown table with its intro, warnings and notes; nothing when the table is empty."""
    if not table:
        return []
    lines = [f"## {title}", "", tables.INTROS[key], "", _md_table(table.header, table.rows), ""]
    lines += [f"> **Warning:** {_md_cell(w)}" for w in table.warnings] + ([""] if table.warnings else [])
    lines += [f"- {_md_cell(n)}" for n in table.notes] + ([""] if table.notes else [])
    return lines


def summary_markdown(suite: Suite) -> str:
    """The summary.md text, in the page's order: results, across seeds, paired tests, what differs, networks,
    throughput, phases, stages, max lengths, generation settings and notes on sources."""
    parts = [f"# Benchmark summary: {suite.preset}", ""]
    if suite.description:
        parts += [fmt.cap_text(suite.description), ""]
    head = headline_rows(suite)
    if head:
        parts += ["## Results per method", "", _md_table(HEADLINE_COLUMNS, [r["cells"] for r in head]), ""]
        errors = [(r["cells"][0], r["cells"][1], r["error"]) for r in head if r["error"]]
        for label, seed, err in errors:
            parts.append(f"- **{_md_cell(label)}** (seed {seed}) failed: {_md_cell(err)}")
        if errors:
            parts.append("")
        warnings = tables.weight_change_warnings(suite)
        parts += [f"> **Warning:** {_md_cell(w)}" for w in warnings] + ([""] if warnings else [])
    else:
        parts += ["No method runs were planned or found.", ""]
    detail = tables.detail_tables(suite)
    parts += _md_section("Across seeds", "seeds", detail["seeds"])
    tests = tables.paired_tests(suite)
    if tests:
        parts += ["## Paired tests (strict accuracy, same questions)", "",
                  _md_table(["A", "B", "questions", "A only right", "B only right", "McNemar p",
                             "A − B (95% bootstrap CI)"],
                            [[t["a"], t["b"], str(t["n"]), str(t["a_only"]), str(t["b_only"]),
                              fmt.p_value_text(t["p_value"]),
                              f"{100 * t['diff']:+.1f} pp [{100 * t['diff_low']:+.1f}, {100 * t['diff_high']:+.1f}]"]
                             for t in tests]), ""]
    header, rows = tables.what_differs(suite)
    if rows:
        parts += ["## What differs between methods", "", _md_table(header, rows), ""]
    parts += _md_section("Networks resident while training", "networks", detail["networks"])
    parts += _md_section("Throughput and time", "throughput", detail["throughput"])
    parts += _phase_section(suite)
    stages = tables.stage_rows(suite)
    if stages:
        parts += ["## Shared stages", "",
                  _md_table(["stage", "status", "accuracy after (strict)", "wall time", "metrics"],
                            [[s["stage"], s["status"], s["accuracy"], s["wall"],
                              "; ".join(f"{k}={v}" for k, v in s["metrics"]) or fmt.MISSING] for s in stages]), ""]
    parts += _md_section("Max lengths and truncation", "lengths", detail["lengths"])
    parts += _md_section("Generation settings", "generation", detail["generation"])
    parts += ["## Notes on sources", ""] + [f"- {n}" for n in tables.notes(suite)] + [""]
    return "\n".join(parts)


def _phase_section(suite: Suite) -> list[str]:
    """'Time per phase' lines for summary.md: the table, then why any phase is 'not instrumented'."""
    header, rows = phase_times.phase_table(suite)
    if not rows:
        return []
    notes_ = phase_times.phase_notes(suite)
    return (["## Time per phase", "", "Exclusive seconds per phase (bench.telemetry).", "", _md_table(header, rows), ""]
            + [f"- {n}" for n in notes_] + ([""] if notes_ else []))


def write_summary(suite: Suite, path: Path) -> Path:
    """Write summary.md atomically (temporary file + rename)."""
    return fmt.write_text_atomic(path, summary_markdown(suite))
