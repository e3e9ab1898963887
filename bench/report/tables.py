"""Tables: results.csv, summary.md, and the row data the HTML page shares with them.

``results.csv`` is for spreadsheets and scripts (raw numbers: accuracies as fractions, bytes, seconds);
``summary.md`` is for pasting into a writeup (formatted, every memory number with its source).
"""

from __future__ import annotations

import csv
import itertools
from pathlib import Path
from typing import Any

from bench import stats
from bench.report import fmt
from bench.report import phases as phase_times
from bench.report.load import Run, Suite

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
]

LOW_CHANGE = 0.5
"""A method run whose training changed less than this share of its trained weights is flagged: most of its
updates were lost (e.g. rounded away in bfloat16 weights) or never applied."""


def csv_row(run: Run) -> dict[str, Any]:
    """One results.csv row; None marks an unmeasured value (written as an empty cell)."""
    res = run.result
    strict_b, strict_a = fmt.score(run, "before", "strict"), fmt.score(run, "after", "strict")
    flex_b, flex_a = fmt.score(run, "before", "flexible"), fmt.score(run, "after", "flexible")
    memory = res.get("memory", {})

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
    }


def write_csv(suite: Suite, path: Path) -> Path:
    """Write results.csv: one row per method run (stages are on the page, not in the CSV)."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for run in suite.methods:
            row = csv_row(run)
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return path


# --- rows shared by summary.md and index.html ------------------------------------------------------------
HEADLINE_COLUMNS = [
    "method", "seed", "status", "accuracy strict (before → after, 95% CI)",
    "accuracy flexible (before → after, 95% CI)", "peak memory (source)", "completions/s", "tokens/s", "wall time",
    "trained weights changed",
]


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
                fmt.float_text(fmt.throughput(run, "completions_per_s")),
                fmt.float_text(fmt.throughput(run, "tokens_per_s"), 1),
                fmt.float_text(fmt.throughput(run, "wall_s"), 1, " s"),
                fmt.pct(fmt.changed_fraction(run)),
            ],
            "status": run.status,
            "error": fmt.error_text(run),
        })
    return rows


def weight_change_warnings(suite: Suite) -> list[str]:
    """One warning per ok method run whose training changed under :data:`LOW_CHANGE` of its trained weights."""
    names = fmt.display_names(suite.methods)
    out = []
    for run in suite.methods:
        share = fmt.changed_fraction(run)
        if run.status != "ok" or share is None or share >= LOW_CHANGE:
            continue
        how = fmt.training_change(run, "method") or "not recorded"
        total = fmt.num(fmt.training_change(run, "trainable_params"))
        count = f"; {int(total):,} trainable elements" if total is not None else ""
        out.append(f"{names[run.run_id]}: training moved only {fmt.pct(share)} of the trained weights "
                   f"(comparison: {how}{count}); most updates did not change a stored value.")
    return out


def what_differs(suite: Suite) -> tuple[list[str], list[list[str]]]:
    """The per-method settings as (header, rows): one row per setting key, one column per method label.

    Seeds of one method share their settings, so columns are labels, taken from the first run that recorded
    any. Keys whose value is the same for every method are kept (they are what the preset declared) but sorted
    after the keys that really differ, so the eye lands on the differences first.
    """
    per_label: dict[str, dict[str, Any]] = {}
    for run in suite.methods:
        settings = run.result.get("settings") or {}
        if run.label not in per_label or (not per_label[run.label] and settings):
            per_label[run.label] = settings
    labels = [lbl for lbl, s in per_label.items() if s]
    if not labels:
        return [], []
    keys = list(dict.fromkeys(k for lbl in labels for k in per_label[lbl]))

    def differs(key: str) -> bool:
        return len({fmt.value_text(per_label[lbl].get(key)) for lbl in labels}) > 1

    keys.sort(key=lambda k: not differs(k))  # stable: keeps recorded order within each group
    rows = [[key] + [fmt.value_text(per_label[lbl].get(key)) for lbl in labels] for key in keys]
    return ["setting", *labels], rows


def paired_tests(suite: Suite) -> list[dict[str, Any]]:
    """McNemar (exact) and a paired bootstrap between ok method runs of the same seed, on strict verdicts.

    Only runs of the same seed are paired (seed s of GRPO against seed s of PPO), which keeps the table to
    methods x methods per seed rather than every run against every run. Questions are matched by ``index``;
    only indices both runs judged are compared.
    """
    ok = [r for r in suite.methods if r.status == "ok" and r.verdicts]
    names = fmt.display_names(suite.methods)
    out = []
    for a, b in itertools.combinations(ok, 2):
        if a.result.get("seed") != b.result.get("seed"):
            continue
        va = {int(v["index"]): bool(v.get("correct_strict")) for v in a.verdicts or []}
        vb = {int(v["index"]): bool(v.get("correct_strict")) for v in b.verdicts or []}
        common = sorted(set(va) & set(vb))
        if not common:
            continue
        xa, xb = [va[i] for i in common], [vb[i] for i in common]
        mc = stats.mcnemar_test(xa, xb)
        boot = stats.paired_bootstrap(xa, xb)
        out.append({
            "a": names[a.run_id], "b": names[b.run_id], "n": mc["n"],
            "a_only": mc["a_only"], "b_only": mc["b_only"], "p_value": mc["p_value"],
            "diff": boot["mean_diff"], "diff_low": boot["low"], "diff_high": boot["high"],
        })
    return out


def stage_rows(suite: Suite) -> list[dict[str, Any]]:
    """Shared stages: status, strict accuracy after (the warm start's), wall time and their metrics."""
    rows = []
    for run in suite.stages:
        metrics = run.result.get("metrics") or {}
        rows.append({
            "stage": run.label,
            "run_id": run.run_id,
            "status": fmt.status_text(run),
            "accuracy": fmt.score_text(fmt.score(run, "after", "strict")),
            "wall": fmt.float_text(fmt.throughput(run, "wall_s"), 1, " s"),
            "metrics": [(k, fmt.value_text(v)) for k, v in metrics.items()],
            "error": fmt.error_text(run),
        })
    return rows


def memory_sources(suite: Suite) -> list[str]:
    """Every memory source named by a reading in the suite, in first-seen order."""
    seen: dict[str, None] = {}
    for run in suite.runs:
        memory = run.result.get("memory", {})
        if memory.get("source") and fmt.num(memory.get("peak_bytes")) is not None:
            seen[memory["source"]] = None
        for phase in (memory.get("phases") or {}).values():
            if isinstance(phase, dict) and phase.get("source") and fmt.num(phase.get("peak_bytes")) is not None:
                seen[phase["source"]] = None
    return list(seen)


SOURCE_NOTES = {
    "cpu-rss": "resident set size of the worker process tree (CPU run; includes the Python runtime); "
               "per-phase figures are the highest reading sampled during that phase",
    "cuda-allocated": "torch.cuda.max_memory_allocated: tensors alive in PyTorch's caching allocator; "
                      "per-phase figures are peaks of that phase (the counter is reset per phase)",
    "cuda-reserved": "torch.cuda.max_memory_reserved: memory the caching allocator holds (>= allocated); "
                     "per-phase figures are high-water marks: the allocator keeps its cache, so a phase's figure "
                     "includes memory reserved by earlier phases",
    "nvml-process": "NVML: device memory used by this process tree (includes CUDA context); per-phase figures "
                    "are high-water marks (the caching allocator keeps what it reserved)",
    "nvml-device": "NVML: device-wide used memory (includes other processes); per-phase figures are high-water "
                   "marks (the caching allocator keeps what it reserved)",
}


def notes(suite: Suite) -> list[str]:
    """Plain-language notes on how every number was obtained, for the page and the Markdown."""
    out = [
        "Accuracy: greedy decoding on the held-out split; *strict* needs the answer in the expected format "
        "(answer tags or `####`), *flexible* takes the last number. Brackets are 95% Wilson intervals.",
        "Throughput: completions/s and tokens/s are generated completions and tokens per second of training, "
        "timed from the first training step (on_train_begin) to its end (on_train_end); model loading and "
        "trainer set-up (setup_s in results.csv) are left out. A recipe that fires no on_train_begin is timed "
        "whole (its throughput.timing says so). Wall time is the whole worker (load + train + evaluation).",
        "Trained weights changed: the share of trainable elements (requires_grad; LoRA: the adapters) whose "
        f"stored value differs after training; below {LOW_CHANGE:.0%} the run is flagged.",
        "Memory readings from different sources are not comparable and are never charted together.",
    ]
    parallel = (suite.spec or {}).get("parallel_runs", 1) or 1
    if parallel > 1:
        threads = (suite.spec or {}).get("threads") or "default"
        out.append(f"Concurrency: method runs shared this machine, {parallel} at a time ({threads} torch thread(s) "
                   f"each), so their throughput and time figures carry each other's load and compare only "
                   f"approximately; set parallel_runs=1 for clean timings.")
    for source in memory_sources(suite):
        out.append(f"Memory source `{source}`: {SOURCE_NOTES.get(source, 'see the run environment')}.")
    out.append("A reading shown as 'not measured' was not taken; it is not zero.")
    return out


def _md_cell(text: str) -> str:
    # A pipe would split the cell and a newline would end the row.
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def summary_markdown(suite: Suite) -> str:
    """The summary.md text: headline table, what differs, paired tests, stages and notes on sources."""
    parts = [f"# Benchmark summary: {suite.preset}", ""]
    if suite.description:
        parts += [suite.description, ""]
    head = headline_rows(suite)
    if head:
        parts += ["## Results per method", "", _md_table(HEADLINE_COLUMNS, [r["cells"] for r in head]), ""]
        errors = [(r["cells"][0], r["cells"][1], r["error"]) for r in head if r["error"]]
        for label, seed, err in errors:
            parts.append(f"- **{_md_cell(label)}** (seed {seed}) failed: {_md_cell(err)}")
        if errors:
            parts.append("")
        warnings = weight_change_warnings(suite)
        parts += [f"> **Warning:** {_md_cell(w)}" for w in warnings] + ([""] if warnings else [])
    else:
        parts += ["No method runs were planned or found.", ""]
    header, rows = what_differs(suite)
    if rows:
        parts += ["## What differs between methods", "", _md_table(header, rows), ""]
    tests = paired_tests(suite)
    if tests:
        parts += ["## Paired tests (strict accuracy, same questions)", "",
                  _md_table(["A", "B", "questions", "A only right", "B only right", "McNemar p",
                             "A − B (95% bootstrap CI)"],
                            [[t["a"], t["b"], str(t["n"]), str(t["a_only"]), str(t["b_only"]),
                              fmt.p_value_text(t["p_value"]),
                              f"{100 * t['diff']:+.1f} pp [{100 * t['diff_low']:+.1f}, {100 * t['diff_high']:+.1f}]"]
                             for t in tests]), ""]
    stages = stage_rows(suite)
    if stages:
        parts += ["## Shared stages", "",
                  _md_table(["stage", "status", "accuracy after (strict)", "wall time", "metrics"],
                            [[s["stage"], s["status"], s["accuracy"], s["wall"],
                              "; ".join(f"{k}={v}" for k, v in s["metrics"]) or fmt.MISSING] for s in stages]), ""]
    parts += _phase_section(suite)
    parts += ["## Notes on sources", ""] + [f"- {n}" for n in notes(suite)] + [""]
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
    path.write_text(summary_markdown(suite), encoding="utf-8")
    return path
