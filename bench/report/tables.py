"""Tables: results.csv and the row data summary.md (bench.report.summary) and the HTML page share.

``results.csv`` is for spreadsheets and scripts (raw numbers: accuracies as fractions, bytes, seconds);
``summary.md`` is for pasting into a writeup (formatted, every memory number with its source).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from bench import stats
from bench.report import fmt, networks, seeds, settings, throughput
from bench.report.load import Suite, results_frame

LOW_CHANGE = 0.5
"""A method run whose training changed less than this share of its trained weights is flagged: most of its
updates were lost (e.g. rounded away in bfloat16 weights) or never applied."""


def write_csv(suite: Suite, path: Path) -> Path:
    """Write results.csv: the results frame, one row per method run (stages are on the page, not in the CSV).

    A value that was not measured is an empty cell, never 0.
    """
    text = results_frame(suite).to_csv(index=False, na_rep="", lineterminator="\n")
    return fmt.write_text_atomic(path, text)  # never a half-written (or 0-byte) results.csv


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


NOT_RECORDED = "n/a"
"""A setting the method does not have (not recorded), as opposed to a recorded empty value (the dash)."""


def what_differs(suite: Suite) -> tuple[list[str], list[list[str]]]:
    """The per-method settings as (header, rows): one row per setting key, one column per method label.

    Seeds of one method share their settings, so columns are labels, taken from the first run that recorded
    any. Keys whose value is the same for every method that records them are kept (they are what the preset
    declared) but sorted after the keys that really differ, so the eye lands on the differences first; a method
    without the key shows "n/a". ``precision`` and ``generation`` have tables of their own and are left out; any
    other nested setting is opened up into dotted keys (``optim.betas``), so no cell is a JSON blob.
    """
    per_label: dict[str, dict[str, Any]] = {}
    for run in suite.methods:
        recorded = dict(fmt.flat_items(run.result.get("settings") or {}, skip=settings.OWN_TABLE_SETTINGS))
        if run.label not in per_label or (not per_label[run.label] and recorded):
            per_label[run.label] = recorded
    labels = [lbl for lbl, s in per_label.items() if s]
    if not labels:
        return [], []
    keys = list(dict.fromkeys(k for lbl in labels for k in per_label[lbl]))

    def cell(label: str, key: str) -> str:
        return fmt.cell_text(per_label[label][key]) if key in per_label[label] else NOT_RECORDED

    def differs(key: str) -> bool:
        # A method that does not record a setting has no value to differ with (TRL's GRPO has no ppo_epochs):
        # only the methods that recorded it are compared.
        return len({cell(lbl, key) for lbl in labels if key in per_label[lbl]}) > 1

    keys.sort(key=lambda k: not differs(k))  # stable: keeps recorded order within each group
    rows = [[key] + [cell(lbl, key) for lbl in labels] for key in keys]
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
    """Shared stages: status, strict accuracy after (the warm start's), wall time and their metrics.

    ``metrics["lengths"]`` is left out (the max-lengths table shows it); other nested metrics are opened up.
    """
    rows = []
    for run in suite.stages:
        metrics = run.result.get("metrics") or {}
        rows.append({
            "stage": run.label,
            "run_id": run.run_id,
            "status": fmt.status_text(run),
            "accuracy": fmt.score_text(fmt.score(run, "after", "strict")),
            "wall": fmt.float_text(fmt.throughput(run, "wall_s"), 1, " s"),
            "metrics": [(k, fmt.cell_text(v)) for k, v in fmt.flat_items(metrics, skip=settings.OWN_TABLE_METRICS)],
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
        "Throughput: completions/s and tokens/s are generated completions and tokens per second of training time "
        "(train_s); the timing basis, set-up and wall time are under 'Throughput and time'.",
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


INTROS = {
    "seeds": "Mean and spread over each method's ok seeds (shown because some method has more than one).",
    "networks": "Every network a method keeps in memory while it trains, how it is stored and computed, and what "
                "its weights, gradients and optimizer state cost (static accounting, MiB).",
    "throughput": "Seconds and rates per run; set-up is shown beside training because the rates leave it out.",
    "lengths": "The max_length each TRL stage or method trained with (tokens) and what it cost in data.",
    "generation": "Decoding settings, once for the suite: one column per distinct sampling configuration "
                  "(matched methods share one), then the greedy evaluation.",
}
"""One line under each section title, shared by summary.md and index.html."""


def detail_tables(suite: Suite) -> dict[str, fmt.Table]:
    """The tables built outside this module, by section key (see :data:`INTROS`); empty ones included."""
    return {
        "seeds": seeds.across_seeds(suite),
        "networks": networks.network_table(suite),
        "throughput": throughput.throughput_table(suite),
        "lengths": settings.length_table(suite),
        "generation": settings.generation_table(suite),
    }
