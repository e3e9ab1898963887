"""What each method's accuracy gain cost: per training step, per generated token and per second (torch-free).

Matched methods share their steps, so accuracy per step compares what each does with the same budget of updates.
They do not all generate alike: DAPO's dynamic sampling draws extra rounds of prompts in place of groups without
signal, and every extra completion is counted against it. Gains per generated token and per second of training
put that spending beside the step budget, so a method that buys accuracy with more generation is seen doing so.

Each rate is the mean over a method's ok seeds of the change in accuracy from the start (headline mode,
percentage points) divided by the mean of what it spent: a ratio of means, so one short seed does not dominate.
Offline methods (DPO) generate nothing while training and the control arm (lr 0) is a pipeline check; both are
left out.
"""

from __future__ import annotations

from typing import Any

from bench.report import fmt
from bench.report.load import Run, Suite

PER_STEPS = 100
PER_TOKENS = 1_000_000
PER_SECONDS = 3600


def _spent(run: Run) -> dict[str, float | None]:
    return {key: fmt.throughput(run, key) for key in ("steps", "completions", "generated_tokens", "train_s")}


def _change(run: Run, mode: str) -> float | None:
    before, after = fmt.score(run, "before", mode), fmt.score(run, "after", mode)
    if before is None or after is None:
        return None
    return after["accuracy"] - before["accuracy"]


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known and len(known) == len(values) else None


def method_costs(suite: Suite) -> list[dict[str, Any]]:
    """Per method label (suite order): its ok seeds, mean accuracy change (fraction) and mean spending."""
    by_label: dict[str, list[Run]] = {}
    for run in suite.methods:
        generated = fmt.throughput(run, "generated_tokens")
        if run.status != "ok" or fmt.is_control(run) or not generated:
            continue
        if _change(run, suite.headline_mode) is not None:
            by_label.setdefault(run.label, []).append(run)
    out = []
    for label, runs in by_label.items():
        spent = [_spent(r) for r in runs]
        row: dict[str, Any] = {"label": label, "seeds": [r.result.get("seed") for r in runs],
                               "change": _mean([_change(r, suite.headline_mode) for r in runs])}
        row.update({key: _mean([s[key] for s in spent]) for key in spent[0]})
        out.append(row)
    return out


def _rate(change: float | None, spent: float | None, per: float) -> str:
    if change is None or not spent:
        return fmt.MISSING
    value = 100 * change * per / spent
    return f"{value:+,.{0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2}f}"


def _count(value: float | None) -> str:
    return fmt.MISSING if value is None else f"{value:,.0f}"


def efficiency_table(suite: Suite) -> fmt.Table:
    """One row per online method with an ok seed; empty unless two methods qualify (one has nothing to compare)."""
    costs = method_costs(suite)
    if len(costs) < 2:
        return fmt.Table([], [])
    rows = [[c["label"], ", ".join(str(s) for s in c["seeds"]),
             fmt.MISSING if c["change"] is None else f"{100 * c['change']:+.1f}",
             _count(c["steps"]), _count(c["completions"]), _count(c["generated_tokens"]),
             fmt.MISSING if c["train_s"] is None else f"{c['train_s']:,.0f}",
             _rate(c["change"], c["steps"], PER_STEPS), _rate(c["change"], c["generated_tokens"], PER_TOKENS),
             _rate(c["change"], c["train_s"], PER_SECONDS)] for c in costs]
    notes = [f"Headline mode {fmt.mode_note(suite.headline_mode)}; change: accuracy after training minus accuracy "
             f"at the start, percentage points (pp), mean over the ok seeds listed.",
             "Spent: mean over the same seeds of the optimizer steps, completions and tokens generated while "
             "training (every completion a method drew, DAPO's extra rounds included) and the training time "
             "(first on_train_begin to last on_train_end: generation, scoring and updates; not the evaluation).",
             f"Each rate is the mean change divided by the mean spent (a ratio of means), per {PER_STEPS} steps, "
             f"per {PER_TOKENS:,} generated tokens and per hour ({PER_SECONDS} s) of training; seconds depend on "
             "the machine and on how many runs shared it (the preset's parallel_runs).",
             "No test separates these rates; read them beside the paired tests of the accuracies they divide. "
             "Offline methods (DPO: nothing generated while training) and the control arm are left out."]
    return fmt.Table(["method", "seeds", "change from start (pp)", "optimizer steps", "completions generated",
                      "tokens generated", "training time (s)", f"pp per {PER_STEPS} optimizer steps",
                      f"pp per {PER_TOKENS // 1_000_000}M generated tokens", "pp per hour of training"], rows, notes)
