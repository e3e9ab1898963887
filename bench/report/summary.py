"""summary.md: the Markdown a writeup pastes, in the page's order, and the headline rows the page shares.

Moved out of ``tables.py`` so the statistics tables (tables.py, seeds.py, stats) and the document that
arranges them change independently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report import citation, claims, findings, fmt, headline, networks, overview, scaling, tables
from bench.report import phases as phase_times
from bench.report.load import Suite

# --- rows shared by summary.md and index.html ------------------------------------------------------------
HEADLINE_COLUMNS = [
    "method", "seed", "status", "accuracy {headline} (headline; before → after, 95% CI)",
    "accuracy {second} (before → after, 95% CI)", "peak memory (source)",
    "static memory: weights + grads + optimizer (accounting)", "completions/s of training", "median s/step",
    "trained weights changed",
]
"""Column templates of the per-run table; :func:`headline_columns` fills in the scoring modes. Generated
tokens/s, set-up, train and wall seconds are in the throughput table (bench.report.throughput)."""


def row_modes(suite: Suite) -> tuple[str, str]:
    """(headline mode, second mode) of the per-run table: the folder's headline mode first, then the other of
    the suite's own pair (suite-strict <-> suite-flexible), so a reader sees how much extraction changes."""
    headline = suite.headline_mode
    second = "suite-flexible" if headline != "suite-flexible" else "suite-strict"
    return headline, second


def headline_columns(suite: Suite) -> list[str]:
    """The per-run table's header with the scoring modes named ('accuracy suite-strict (headline; ...)')."""
    headline, second = row_modes(suite)
    return [c.format(headline=headline, second=second) for c in HEADLINE_COLUMNS]


def mode_notes(suite: Suite) -> list[str]:
    """One note per scoring mode the per-run table shows (fmt.mode_note), the headline mode first."""
    headline, second = row_modes(suite)
    return [f"Headline mode: {fmt.mode_note(headline)}.", f"Second column: {fmt.mode_note(second)}."]


def headline_rows(suite: Suite) -> list[dict[str, Any]]:
    """Formatted headline cells per method run, plus ``error`` text for failed / missing runs."""
    headline, second = row_modes(suite)
    rows = []
    for run in suite.methods:
        seed = run.result.get("seed")
        rows.append({
            "cells": [
                run.label,
                fmt.MISSING if seed is None else str(seed),
                fmt.status_text(run),
                fmt.before_after_text(run, headline),
                fmt.before_after_text(run, second),
                fmt.peak_memory_text(run),
                networks.static_total_text(run),
                fmt.generation_rate_text(run, "completions_per_s"),
                fmt.float_text(fmt.throughput(run, "step_s_median"), 3, " s"),
                _changed_text(run),
            ],
            "status": run.status,
            "error": fmt.error_text(run),
        })
    return rows


def _changed_text(run: Any) -> str:
    """The share of trained weights that moved; the lr-0 control's 0% is marked as by design (not a lost update)."""
    text = fmt.pct(fmt.changed_fraction(run))
    if run.result.get("method") == tables.CONTROL_METHOD and text != fmt.MISSING:
        text += " (lr 0: by design)"
    return text


def _md_cell(text: str) -> str:
    """A cell or a line of summary.md as Markdown that shows it as written (fmt.md_text): result data in it (a label
    ``<script>``, a pipe, a newline) is shown, never run as HTML, split into cells or ending the row."""
    return fmt.md_text(text)


def warning_lines(warnings: list[str]) -> list[str]:
    """Each warning as its own Markdown blockquote, a blank line after each: consecutive '>' lines would
    otherwise render as one run-on paragraph."""
    return [line for w in warnings for line in (f"> **Warning:** {_md_cell(w)}", "")]


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _md_section(title: str, key: str, table: fmt.Table) -> list[str]:
    """A titled Markdown table with its intro, warnings and notes; nothing when the table is empty."""
    return md_table_section(title, intro(key), table)


def md_table_section(title: str, intro_text: str, table: fmt.Table) -> list[str]:
    """A titled Markdown table: intro, its warnings (at the top, so a caveat is read before the numbers it
    qualifies), the table (best cells of a MarkedTable in bold) and notes."""
    if not table:
        return []
    best = getattr(table, "best", set())
    rows = [[f"**{c}**" if (i, j) in best else c for j, c in enumerate(row)] for i, row in enumerate(table.rows)]
    lines = [f"## {title}", ""] + ([intro_text, ""] if intro_text else []) + warning_lines(table.warnings)
    lines += [_md_table(table.header, rows), ""]
    lines += [f"- {_md_cell(n)}" for n in table.notes] + ([""] if table.notes else [])
    return lines


INTROS = {
    "glance": "The lines to quote: the set-up, each method's accuracy over seeds with its interval and its tested "
              "change from the start, its peak memory with the reading's source, and what PPO's four networks cost "
              "and bought. Every number is from a table below; the control arm is a pipeline check, not listed.",
    "findings": "What this run measured, generated from its result files: each with its number, uncertainty and "
                "source. Differences between methods are called significant only when the Holm-adjusted McNemar "
                "p-value is below 0.05.",
    "claims": "The seed texts' quantitative claims (baselines/claims.yaml) beside what this run measured.",
    "headline": "One row per method: the networks it keeps, what they cost, how fast it ran and what it bought.",
    "cite": "What a citation of this run needs.",
    "phase_share": "Where each run's time went: seconds per phase and the share of the run's phase time.",
    "phase_memory": "Peak memory per phase (MiB); on CPU as the change over the reading after the models loaded.",
    "scaling": "The sweep's points: memory against model size, the PPO / GRPO ratio at every point, time against G "
               "and completion length, and the memory model's prediction beside each measurement.",
    "paired": "Between methods on the same questions, within a seed: McNemar's test (exact; clustered where "
              "questions share a working), Holm-adjusted over every comparison, and the difference with a 95% "
              "paired-bootstrap interval (not adjusted).",
    "results": "One row per run (seed): accuracy in the headline scoring mode and in a second mode (each named "
               "in its column), memory, speed and the share of trained weights that moved.",
}
"""Intros of the sections this module adds; the others are tables.INTROS (owned with their tables)."""


def intro(key: str) -> str:
    return INTROS.get(key) or tables.INTROS.get(key, "")


KNOWN_DETAIL = ("seeds", "networks", "throughput", "lengths", "generation", "memory_per_rank", "generation_backend",
                "data_checks")
"""Detail tables placed by name; any other table tables.detail_tables adds is shown under its own key."""


TITLES = {"per_seed": "Accuracy per seed", "seed_tests": "Seed-level tests",
          "ladder": "Ablation ladder (GRPO's successors)", "efficiency": "Accuracy for what it cost",
          "start_tests":
          "Against the starting checkpoint", "reward_model": "Reward model: what PPO (reward model) trains against",
          "control": "Control arm (lr 0)",
          "anchors": "Published anchors (external)", "overoptimisation": "Reward over-optimisation (PPO, reward model)",
          "dynamics": "Training dynamics", "monitors": "Reward-hacking monitors (final evaluation)"}
"""Section titles of the statistics tables (tables.detail_tables keys); an unknown key is titled from its name."""


def extra_detail(detail: dict[str, fmt.Table]) -> list[tuple[str, str, fmt.Table]]:
    """(key, title, table) of detail tables this module does not place by name (new statistics tables)."""
    return [(k, TITLES.get(k) or k.replace("_", " ").capitalize(), t) for k, t in detail.items()
            if k not in KNOWN_DETAIL and t]


def glance_lines(suite: Suite) -> list[str]:
    """'At a glance': the headline block (bench.report.headline), one bullet a line; nothing without a method."""
    block = headline.headline_block(suite)
    if not block:
        return []
    return ["## At a glance", "", intro("glance"), ""] + [f"- {_md_cell(line)}" for line in block] + [""]


def findings_lines(suite: Suite) -> list[str]:
    found = findings.findings(suite)
    body = [f"{i}. {_md_cell(f.text)} ({_md_cell(f.basis)})" for i, f in enumerate(found, 1)]
    return ["## Findings", "", INTROS["findings"], ""] + (body or ["No measurement in this run supports a finding "
                                                                   "(no method run finished ok)."]) + [""]


def cite_lines(suite: Suite) -> list[str]:
    return ["## Cite this run", "", INTROS["cite"], "",
            _md_table(["field", "value"], [[k, fmt.md_code(v) if k.startswith("command") and v != "not recorded" else v]
                                           for k, v in citation.citation(suite)]), ""]


def scaling_lines(suite: Suite) -> list[str]:
    """'Scaling (sweep)': every table of bench.report.scaling in turn; nothing without sweep runs."""
    found = scaling.titled_scaling_tables(suite)
    if not found:
        return []
    lines = ["## Scaling (sweep)", "", INTROS["scaling"], ""]
    for title, table in found.items():
        lines += [f"### {title}", "", _md_table(table.header, table.rows), ""]
        lines += warning_lines(table.warnings)
        lines += [f"- {_md_cell(n)}" for n in table.notes] + ([""] if table.notes else [])
    return lines


def paired_table(suite: Suite) -> fmt.Table:
    """Between-method McNemar tests with Holm-adjusted p-values (tables.paired_tests_table)."""
    return tables.paired_tests_table(suite)


def summary_markdown(suite: Suite) -> str:
    """The summary.md text, in the page's order: findings, claims check, headline, citation, then the details
    (results per run, across seeds, paired tests, what differs, networks, throughput, phases, per-phase memory,
    stages, max lengths, generation settings) and notes on sources."""
    parts = [_md_cell(f"# Benchmark summary: {suite.preset} · {citation.run_title(suite)}"), "",
             _md_cell(fmt.cap_text(citation.run_description(suite))), ""]
    parts += [f"> {_md_cell(p)}" for p in suite.problems] + ([""] if suite.problems else [])
    parts += glance_lines(suite)
    parts += findings_lines(suite)
    parts += md_table_section("Claims check", intro("claims"), claims.claims_table(suite))
    parts += md_table_section("Headline", intro("headline"), overview.headline_table(suite))
    detail = tables.detail_tables(suite)
    parts += _md_section("Data checks", "data_checks", detail["data_checks"])
    parts += cite_lines(suite)
    head = headline_rows(suite)
    if head:
        parts += ["## Results per method", "", intro("results"), "",
                  _md_table(headline_columns(suite), [r["cells"] for r in head]), ""]
        parts += [f"- {_md_cell(n)}" for n in mode_notes(suite)] + [""]
        errors = [(r["cells"][0], r["cells"][1], r["error"]) for r in head if r["error"]]
        for label, seed, err in errors:
            parts.append(f"- **{_md_cell(label)}** (seed {seed}) failed: {_md_cell(err)}")
        if errors:
            parts.append("")
        warnings = tables.run_warnings(suite)
        parts += warning_lines(warnings)
    else:
        parts += ["No method runs were planned or found.", ""]
    parts += _md_section("Across seeds", "seeds", detail["seeds"])
    parts += md_table_section("Paired tests (headline accuracy, same questions)", intro("paired"),
                              paired_table(suite))
    for key, title, table in extra_detail(detail):
        parts += md_table_section(title, intro(key), table)
    header, rows = tables.what_differs(suite)
    if rows:
        parts += ["## What differs between methods", "", _md_table(header, rows), ""]
    parts += _md_section("Networks resident while training", "networks", detail["networks"])
    parts += _md_section("Throughput and time", "throughput", detail["throughput"])
    parts += _phase_section(suite)
    parts += md_table_section("Time per phase: shares", intro("phase_share"), overview.phase_share_table(suite))
    parts += md_table_section("Peak memory per phase", intro("phase_memory"), overview.phase_memory_table(suite))
    parts += _md_section("Memory per rank", "memory_per_rank", detail["memory_per_rank"])
    parts += _md_section("Generation backend", "generation_backend", detail["generation_backend"])
    parts += scaling_lines(suite)
    stages = tables.stage_rows(suite)
    if stages:
        parts += ["## Shared stages", "",
                  _md_table(["stage", "status", f"accuracy after ({suite.headline_mode})", "wall time", "metrics"],
                            [[s["stage"], s["status"], s["accuracy"], s["wall"],
                              "; ".join(f"{k}={v}" for k, v in s["metrics"]) or fmt.MISSING] for s in stages]), ""]
    parts += _md_section("Max lengths and truncation", "lengths", detail["lengths"])
    parts += _md_section("Generation settings", "generation", detail["generation"])
    parts += ["## Notes on sources", ""] + [f"- {_md_cell(n)}" for n in tables.notes(suite)] + [""]
    return "\n".join(parts)


def _phase_section(suite: Suite) -> list[str]:
    """'Time per phase' lines for summary.md: the table, then why any phase is 'not instrumented'."""
    header, rows = phase_times.phase_table(suite)
    if not rows:
        return []
    notes_ = phase_times.phase_notes(suite)
    return (["## Time per phase", "", "Exclusive seconds per phase (bench.telemetry).", "", _md_table(header, rows), ""]
            + [f"- {_md_cell(n)}" for n in notes_] + ([""] if notes_ else []))


def write_summary(suite: Suite, path: Path) -> Path:
    """Write summary.md atomically (temporary file + rename)."""
    return fmt.write_text_atomic(path, summary_markdown(suite))
