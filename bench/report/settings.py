"""Settings tables that would otherwise print as JSON blobs: generation settings and max lengths.

Recipes record two nested settings (``settings["generation"]``, ``settings["precision"]``) and the TRL stages
record ``metrics["lengths"]``. Printed inside the "what differs" or stage tables they would be one long JSON
string per cell; here they get tables of their own (precision: bench.report.networks), and
:data:`OWN_TABLE_SETTINGS` / :data:`OWN_TABLE_METRICS` keep them out of the generic tables.
"""

from __future__ import annotations

from typing import Any

from bench.report import fmt
from bench.report.load import Run, Suite

OWN_TABLE_SETTINGS = ("precision", "generation")
"""Settings keys shown in a table of their own, left out of "what differs"."""
OWN_TABLE_METRICS = ("lengths",)
"""Metrics keys shown in a table of their own, left out of the stage metrics."""

GENERATION_FIELDS = (
    ("do_sample", "sampling (do_sample)"),
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("top_k", "top_k (0 = off)"),
    ("repetition_penalty", "repetition_penalty (1 = off)"),
    ("min_new_tokens", "min new tokens"),
    ("max_new_tokens", "max new tokens"),
)
"""The decoding fields a reader compares (the rest are pinned to "off" by bench.model.generation)."""


def _generation(settings: Any) -> dict[str, Any] | None:
    gen = settings.get("generation") if isinstance(settings, dict) else None
    return gen if isinstance(gen, dict) and gen else None


def _sampled(run: Run) -> bool:
    return _generation(run.result.get("settings")) is not None


SAMPLING_ONLY = ("temperature", "top_p", "top_k")
"""Fields greedy decoding ignores (transformers applies them only when sampling)."""
UNUSED_GREEDY = "not used (greedy)"


def _shown(gen: dict[str, Any]) -> tuple[str, ...]:
    """The compared fields of one generation dict as text: what decides whether two methods sampled alike.

    For greedy decoding the sampling-only fields print as "not used (greedy)": a recorded temperature of 1.0
    there is the value meaning "off", and printing it would suggest the evaluation sampled.
    """
    greedy = gen.get("do_sample") is False
    return tuple(UNUSED_GREEDY if greedy and key in SAMPLING_ONLY else fmt.value_text(gen.get(key))
                 for key, _ in GENERATION_FIELDS)


def generation_table(suite: Suite) -> fmt.Table:
    """One row per decoding field: one column per distinct sampling configuration (headed by the methods and
    stages that used it: the sample pool samples too, and DPO learns from it), then the evaluation's decoding.

    Runs whose settings agree share one column, so a matched suite shows a single sampling column; more than
    one column means the runs did not sample alike, and the warning names them.
    """
    runs = fmt.first_per_label(suite.methods, _sampled) + fmt.first_per_label(suite.stages, _sampled)
    groups: dict[tuple[str, ...], list[str]] = {}
    for run in runs:
        groups.setdefault(_shown(_generation(run.result["settings"]) or {}), []).append(run.label)
    evaluations = _evaluation_settings(suite)
    if not groups and not evaluations:
        return fmt.Table([], [])
    columns = [(f"sampling: {', '.join(labels)}", values) for values, labels in groups.items()]
    if evaluations:
        evaluation = evaluations[0]
        columns.append(("evaluation (greedy)" if evaluation.get("do_sample") is False else "evaluation",
                        _shown(evaluation)))
    header = ["setting"] + [name for name, _ in columns]
    rows = [[label] + [values[i] for _, values in columns] for i, (_, label) in enumerate(GENERATION_FIELDS)]
    warnings = []
    if len(groups) > 1:
        warnings.append("Generation settings differ: "
                        + " vs ".join(", ".join(labels) for labels in groups.values())
                        + " sampled with different settings, so their completions are not matched.")
    if len({_shown(e) for e in evaluations}) > 1:
        warnings.append("Evaluation decoding differs between methods; the column shows the first ok run's.")
    grouped = {label for labels in groups.values() for label in labels}
    ok = fmt.first_per_label(suite.methods, lambda r: r.status == "ok")
    without = [r.label for r in ok if r.label not in grouped]
    notes = ["Only the fields a reader compares; every other decoding option is pinned off (bench.model.generation)."]
    if without and groups:
        notes.append(f"{', '.join(without)}: no sampling settings recorded (offline training on pool pairs, "
                     f"or a recipe that does not record them).")
    return fmt.Table(header, rows, notes, warnings)


def _evaluation_settings(suite: Suite) -> list[dict[str, Any]]:
    """The evaluation's decoding settings (``result["generation"]``) of every method run that recorded them,
    ok runs first."""
    runs = sorted(suite.methods, key=lambda r: r.status != "ok")
    return [r.result["generation"] for r in runs if isinstance(r.result.get("generation"), dict)
            and r.result["generation"]]


LENGTH_HEADER = ["stage / method", "max_length (tokens)", "examples", "truncated", "dropped",
                 "longest (tokens)", "cap: model context (tokens)"]
LENGTH_NOTE = ("max_length is the longest prompt + completion + EOS a TRL trainer keeps, derived from the data "
               "(bench.task.lengths). Truncated: the completion's end was cut (TRL keeps the start, so a final answer "
               "can be lost); dropped: removed from training entirely. Longest: the longest sequence in the data "
               "before any cut. Cap: the model's context when it bounded max_length (— = not capped).")


def _lengths(run: Run) -> dict[str, Any] | None:
    lengths = (run.result.get("metrics") or {}).get("lengths")
    return lengths if isinstance(lengths, dict) and lengths else None


def _share_text(count: Any, total: Any) -> str:
    """'3 (8.3%)', '0', or the dash when the count was not recorded."""
    c, t = fmt.num(count), fmt.num(total)
    if c is None:
        return fmt.MISSING
    return f"{int(c):,} ({c / t:.1%})" if c and t else f"{int(c):,}"


def length_table(suite: Suite) -> fmt.Table:
    """Rows for stages, then one per method label; a warning for each run that lost data to max_length."""
    runs = [r for r in suite.stages if _lengths(r)] + fmt.first_per_label(suite.methods, lambda r: bool(_lengths(r)))
    rows, warnings = [], []
    for run in runs:
        lengths = _lengths(run) or {}
        unit = str(lengths.get("unit") or "examples")
        total = lengths.get("examples")
        examples = fmt.int_text(total)
        rows.append([run.label, fmt.int_text(lengths.get("max_length")),
                     examples if examples == fmt.MISSING else f"{examples} {unit}",
                     _share_text(lengths.get("truncated"), total), _share_text(lengths.get("dropped"), total),
                     fmt.int_text(lengths.get("longest")), fmt.int_text(lengths.get("cap"))])
        lost = [f"{int(v):,} {what}" for what, v in (("truncated", fmt.num(lengths.get("truncated"))),
                                                     ("dropped", fmt.num(lengths.get("dropped")))) if v]
        if lost:
            warnings.append(f"{run.label}: {' and '.join(lost)} of {examples} {unit} at max_length "
                            f"{fmt.int_text(lengths.get('max_length'))} tokens.")
    return fmt.Table(list(LENGTH_HEADER), rows, [LENGTH_NOTE], warnings) if rows else fmt.Table([], [])
