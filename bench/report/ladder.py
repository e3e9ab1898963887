"""The ablation ladder: GRPO's successors, each one change away from the rung before it (pandas-free, torch-free).

Three branches start at GRPO on the suite engine: GRPO → Dr. GRPO → DAPO → GSPO (length normalisation, then
clip-higher / dynamic sampling / overlong penalty, then sequence-level ratios), GRPO → CISPO and GRPO → SAPO (other
ways to bound the importance weight), and GRPO → RLOO → REINFORCE++ (other baselines for the advantage). Each rung
compares a method with the rung before it: the change in accuracy after training (headline mode) as the mean of
the paired per-seed differences, tested with the page's between-methods test over seeds
(:func:`bench.scoring.stats.paired_t_test`, the same test as the seed-level table), Holm-adjusted over the
ladder's rungs (:data:`FAMILY`), a family of its own: a rung is not adjusted again with every other method pair.
"""

from __future__ import annotations

from typing import Any

from bench.config import registry
from bench.report import fmt
from bench.report.load import Suite, results_frame
from bench.scoring import stats

RUNGS: tuple[tuple[str, str], ...] = (
    ("grpo_engine", "dr_grpo"), ("dr_grpo", "dapo"), ("dapo", "gspo"),
    ("grpo_engine", "cispo"), ("grpo_engine", "sapo"),
    ("grpo_engine", "rloo"), ("rloo", "reinforce_pp"),
)
"""(previous rung, this rung) by registry method name, in the order the table lists them."""

FAMILY = "ablation ladder: each rung against the rung before it, over seeds"
"""The Holm family of the ladder's tests: its rungs that have a p-value, and nothing else."""

NOT_RUN = "not in this run"
NO_OK = "no ok run with accuracy"


def ok_accuracy_by_method(suite: Suite) -> dict[str, dict[int, float]]:
    """Registry method name -> {seed: accuracy after (headline mode)} over ok runs that measured it."""
    frame = results_frame(suite)
    ok = frame[(frame["status"] == "ok") & frame["accuracy_after"].notna() & frame["seed"].notna()]
    out: dict[str, dict[int, float]] = {}
    for _, row in ok.iterrows():
        out.setdefault(str(row["method"]), {})[int(row["seed"])] = float(row["accuracy_after"])
    return out


def method_label(suite: Suite, method: str) -> str:
    """The label the page gives ``method``'s runs; the registry's label when none ran; else the name."""
    for run in suite.methods:
        if run.result.get("method") == method:
            return run.label
    entry = registry.METHODS.get(method)
    return (getattr(entry, "label", None) if entry is not None else None) or method


def _rung(suite: Suite, per_method: dict[str, dict[int, float]], prev: str, this: str) -> dict[str, Any]:
    """One rung: its labels, each side's mean over its ok seeds, and the paired test over common seeds (if any)."""
    ran = {r.result.get("method") for r in suite.methods}
    rung: dict[str, Any] = {"prev": prev, "this": this, "a": method_label(suite, this),
                            "b": method_label(suite, prev), "test": None, "missing": None}
    for side, name in (("mean_this", this), ("mean_prev", prev)):
        values = per_method.get(name)
        rung[side] = stats.mean_sd(list(values.values()))[0] if values else None
    absent = [method_label(suite, m) for m in (prev, this) if m not in ran]
    failed = [method_label(suite, m) for m in (prev, this) if m in ran and m not in per_method]
    if absent or failed:
        parts = []
        if absent:
            parts.append(f"{', '.join(absent)}: {NOT_RUN}")
        if failed:
            parts.append(f"{', '.join(failed)}: {NO_OK}")
        rung["missing"] = "; ".join(parts)
        return rung
    common = sorted(set(per_method[prev]) & set(per_method[this]))
    rung["seeds"] = common
    if common:
        rung["test"] = stats.paired_t_test([per_method[this][s] for s in common],
                                           [per_method[prev][s] for s in common])
    return rung


def ladder_rungs(suite: Suite) -> list[dict[str, Any]]:
    """Every rung of :data:`RUNGS` (those with a test Holm-adjusted together as :data:`FAMILY`: ``p_holm``,
    ``family``, ``family_size`` on the rung's ``test``)."""
    per_method = ok_accuracy_by_method(suite)
    rungs = [_rung(suite, per_method, prev, this) for prev, this in RUNGS]
    stats.holm_family([r["test"] for r in rungs if r["test"] is not None], FAMILY)
    return rungs


def _p_cells(test: dict[str, Any]) -> list[str]:
    """The t-test p and Holm p, or why there is none (one seed in common, zero spread)."""
    if test["p_value"] is None:
        why = "undefined (one seed in common)" if test.get("undefined") == stats.ONE_PAIR else (
            "undefined (zero spread)")
        return [why, why]
    return [fmt.p_value_text(test["p_value"]), fmt.p_value_text(test["p_holm"])]


def _row(rung: dict[str, Any]) -> list[str]:
    means = [fmt.pct(rung["mean_prev"]), fmt.pct(rung["mean_this"])]
    head = [f"{rung['b']} → {rung['a']}", *means]
    if rung["test"] is None:
        return head + [rung["missing"] or "no seed in common", fmt.MISSING, fmt.MISSING, fmt.MISSING]
    t = rung["test"]
    sd = "" if t["sd_diff"] is None else f" ± {100 * t['sd_diff']:.1f}"
    seeds = ", ".join(str(s) for s in rung["seeds"])
    return head + [f"{100 * t['mean_diff']:+.1f}{sd} pp", seeds, *_p_cells(t)]


def updates_per_rollout(suite: Suite) -> dict[str, set[int]]:
    """Label -> the optimizer steps per rollout its ok runs of the ladder's methods recorded (settings
    ``optimizer_steps_per_rollout``: ppo_epochs x minibatches); a method that recorded none is left out."""
    methods = {m for rung in RUNGS for m in rung}
    out: dict[str, set[int]] = {}
    for run in suite.methods:
        steps = fmt.num((run.result.get("settings") or {}).get("optimizer_steps_per_rollout"))
        if run.status == "ok" and run.result.get("method") in methods and steps is not None:
            out.setdefault(run.label, set()).add(int(steps))
    return out


def updates_notes(suite: Suite) -> tuple[list[str], list[str]]:
    """(the note that states the rungs' optimizer steps per rollout, the warning when some rung took one)."""
    found = updates_per_rollout(suite)
    if not found:
        return [], []
    counts = sorted({n for steps in found.values() for n in steps})
    if len(counts) == 1:
        note = f"Every method of the ladder took {counts[0]} optimizer step(s) per rollout (ppo_epochs x minibatches)."
    else:
        note = "Optimizer steps per rollout differ between methods: " + "; ".join(
            f"{label}: {', '.join(map(str, sorted(steps)))}" for label, steps in found.items()) + "."
    single = [label for label, steps in found.items() if 1 in steps]
    warning = [f"{', '.join(single)} took one optimizer step per rollout: the policy has not moved when its loss is "
               f"computed, every importance ratio is 1, and the clip, clip-higher, GSPO's sequence ratio and CISPO's "
               f"and SAPO's weights do nothing, so rungs that differ only there cannot differ. The frontier presets "
               f"take two (methods.<name>.minibatches=2)."] if single else []
    return [note], warning


def ladder_table(suite: Suite) -> fmt.Table:
    """The ladder, one row per rung; empty unless both methods of at least one rung have ok runs with accuracy."""
    rungs = ladder_rungs(suite)
    tested = [r["test"] for r in rungs if r["test"] is not None]
    if not tested:
        return fmt.Table([], [])
    size = tested[0]["family_size"]
    notes = [f"Headline mode {fmt.mode_note(suite.headline_mode)}; accuracy after training, greedy, ok runs only. "
             f"The means are over each method's ok seeds; the change is the mean over the seeds both rungs finished "
             f"of (this rung − previous rung), ± its sample sd.",
             "Test: paired t-test over seeds (seed s of this rung against seed s of the previous one), two-sided, "
             "the same test as the seed-level table; with 2–3 seeds it has little power, so a large p says the "
             "seeds cannot tell the rungs apart, not that they are equal.",
             f"Holm family \"{FAMILY}\": the {size} rung{'s' if size != 1 else ''} of this table with a p-value "
             f"({len(RUNGS)} rungs: GRPO → Dr. GRPO → DAPO → GSPO, GRPO → CISPO, GRPO → SAPO, GRPO → RLOO → "
             f"REINFORCE++), adjusted on their own: these tests are not in the seed-level table's family.",
             f"'{NOT_RUN}': the suite did not plan that method; '{NO_OK}': it ran but no seed finished ok."]
    updates, warnings = updates_notes(suite)
    return fmt.Table(["rung (previous → this)", "previous: mean accuracy", "this: mean accuracy",
                      "change: mean ± sd over seeds", "seeds", "t-test p", "Holm-adjusted p"],
                     [_row(r) for r in rungs], notes + updates, warnings)
