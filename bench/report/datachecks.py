"""The data checks on the page: what the evaluated split shares with training, and what that lets the report say.

Every result records ``data_checks`` (bench.task.data.TaskData.checks): how many evaluated problems share their
question text (``question_overlap``), their whole working (``working_overlap``, synthetic task) or some step of it
(``step_overlap``, ``steps_all_seen``) with a training problem, how many questions and clusters the split has, and
how the splits were kept apart (``held_out_by``). The report calls the split "held out" only at the levels whose
overlap is 0, and says which: the synthetic task holds out whole workings, so its test questions are held-out
combinations of steps that training also uses (never "unseen problems"); a GSM8K file that serves as both splits
is not held out at all.
"""

from __future__ import annotations

from typing import Any

from bench.report import fmt
from bench.report.load import Suite

LEVELS = (("question_overlap", "question text"), ("working_overlap", "whole working"),
          ("step_overlap", "a step of the working"))
"""The overlap counts, from the weakest sharing a reader would call 'seen' to the finest."""
HELD_OUT_STEPS = "held-out combinations of seen steps"
"""What the synthetic split holds out (bench.task.data.HELD_OUT_STEPS: whole workings, not their steps)."""


def checks(suite: Suite) -> dict[str, Any]:
    """The data checks of the first ok method run that recorded them (every run of a suite loads the same
    splits), else of any run; {} when none did (results written before the checks existed)."""
    runs = sorted(suite.methods, key=lambda r: r.status != "ok") + list(suite.stages)
    for run in runs:
        found = run.result.get("data_checks")
        if isinstance(found, dict) and found:
            return found
    return {}


def split_name(found: dict[str, Any]) -> str:
    return "validation split" if found.get("eval_split") == "validation" else "test split"


def held_out_levels(found: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(levels with overlap 0, levels with an overlap above 0) among those the checks recorded."""
    clean, shared = [], []
    for key, what in LEVELS:
        value = fmt.num(found.get(key))
        if value is None:
            continue
        (clean if value == 0 else shared).append(what)
    return clean, shared


def split_text(suite: Suite) -> str:
    """What the evaluated split is, in the words its checks allow: 'the test split (held out by whole working:
    held-out combinations of seen steps; ...)', '... NOT held out: 12 of 1,319 questions also occur in training'."""
    found = checks(suite)
    if not found:
        return "the evaluated split (its overlap with training was not recorded)"
    name = split_name(found)
    n = fmt.num(found.get("questions"))
    q_overlap, w_overlap = fmt.num(found.get("question_overlap")), fmt.num(found.get("working_overlap"))
    if str(found.get("held_out_by", "")).startswith("none"):
        return f"the {name}, not held out (one file serves as both splits: its questions are trained on)"
    if q_overlap:
        of = f" of {int(n):,}" if n is not None else ""
        return f"the {name}, not held out: {int(q_overlap):,}{of} questions also occur in training"
    if w_overlap:
        of = f" of {int(n):,}" if n is not None else ""
        return (f"the {name}, held out by question text but not by working: {int(w_overlap):,}{of} problems "
                f"repeat a training working")
    if w_overlap == 0:
        return f"the {name}, held out by whole working ({HELD_OUT_STEPS})"
    if q_overlap == 0:
        return f"the {name}, held out by question (no test question occurs in training)"
    return f"the {name}"


def clusters(suite: Suite) -> tuple[float | None, float | None, str]:
    """(questions, clusters, unit) of the evaluated split: from the data checks, else counted from the first ok
    method run's per-question verdicts (results written before the checks recorded clusters)."""
    found = checks(suite)
    n, k = fmt.num(found.get("questions")), fmt.num(found.get("clusters"))
    unit = str(found.get("cluster_unit") or "")
    if n is None or k is None:
        for run in suite.methods:
            if run.status == "ok" and run.verdicts:
                scored = fmt.clustered_score(run, suite.headline_mode)
                if scored is not None:
                    return scored["n"], scored["clusters"], unit or fmt.cluster_unit(run)
    return n, k, unit or "question"


def interval_text(suite: Suite) -> str:
    """How the accuracy intervals treat the questions: one per cluster, or clusters of several."""
    n, k, unit = clusters(suite)
    if n is None or k is None:
        return "Wilson intervals over the questions (clusters not recorded: read as independent questions)"
    if n == k:
        one = "one question per working" if unit == "working" else "one question per problem"
        return f"Wilson intervals over the questions ({one}: the questions are independent units)"
    return (f"Wilson intervals at the effective sample size of {int(k):,} {unit}s of {int(n):,} questions "
            f"(cluster-adjusted: questions of one {unit} count once)")


def data_checks_table(suite: Suite) -> fmt.Table:
    """The evaluated split against the training split: questions and clusters, each overlap, how they were kept
    apart, and whether the report may call the split held out at each level."""
    found = checks(suite)
    if not found:
        return fmt.Table([], [])
    name = split_name(found)
    n = fmt.num(found.get("questions"))

    def count(value: Any) -> str:
        v = fmt.num(value)
        if v is None:
            return fmt.MISSING
        return f"{int(v):,}" + (f" of {int(n):,} ({v / n:.1%})" if n else "")

    rows = []
    n_q, k, unit = clusters(suite)
    n = n if n is not None else n_q
    if n is not None:
        rows.append([f"{name}: questions", f"{int(n):,}", fmt.MISSING])
    if k is not None:
        recorded = "" if fmt.num(found.get("clusters")) is not None else " (counted from the per-question files)"
        rows.append([f"{name}: clusters ({unit}s){recorded}", f"{int(k):,}",
                     "one question each: independent units" if n == k else
                     f"several questions per {unit}: the statistics resample and test {unit}s"])
    verdicts = {"question_overlap": "held out by question", "working_overlap": "held out by whole working",
                "step_overlap": "held out by step"}
    for key, what in LEVELS:
        if key in found:
            v = fmt.num(found.get(key))
            held = (f"yes: {verdicts[key]}" if v == 0 else
                    f"no: not {verdicts[key]}" + (f" ({HELD_OUT_STEPS})" if key == "step_overlap" else ""))
            rows.append([f"{name} problems sharing their {what} with training", count(v), held])
    if "steps_all_seen" in found:
        rows.append([f"{name} problems every step of which occurs in training", count(found["steps_all_seen"]),
                     "by design: the task holds out workings, not steps"])
    for key, value in found.items():
        if key.startswith("validation_") and key.endswith("_overlap"):
            rows.append([f"validation problems sharing their {key[len('validation_'):-len('_overlap')]} with "
                         f"training", f"{int(value):,}" if fmt.num(value) is not None else fmt.cell_text(value),
                         "yes" if fmt.num(value) == 0 else "no"])
    rows.append(["kept apart by", fmt.cell_text(found.get("held_out_by", fmt.MISSING)), fmt.MISSING])
    warnings = []
    if fmt.num(found.get("question_overlap")) or str(found.get("held_out_by", "")).startswith("none"):
        warnings.append(f"The {name} is not held out: some of its questions are also in the training data, so "
                        f"its accuracy mixes recall with generalisation.")
    notes = [f"Recorded by every run (result data_checks, from bench.task.data); the report calls the split "
             f"held out only at a level whose overlap is 0. Split described as: {split_text(suite)}."]
    return fmt.Table(["check", "count", "held out at this level?"], rows, notes, warnings)
