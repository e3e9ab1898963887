"""Whether the learned reward model carries a signal PPO can use: its held-out pair accuracy against chance and
against its own untrained head.

The reward-model stage (baselines/reward_model.py) records ``metrics.heldout_pairs`` (one pair per held-out
question, so the pairs are independent units), ``heldout_pair_accuracy`` and ``heldout_pair_accuracy_untrained``
(the same pairs scored by the freshly initialised head). A reward model *learned* when the 95% Wilson lower bound
of its held-out accuracy is above 50% and above its untrained head's accuracy; otherwise every method trained
against it carries :data:`FLAG` in its label wherever the report shows it (tables, figures, headline), because
its accuracy then measures what an uninformative reward does, not what the method can do.

Sits below ``load`` (which applies the flag), beside ``records`` and ``fmt``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bench.report import fmt
from bench.report.records import Run
from bench.scoring.stats import wilson_interval

REWARD_STAGE = "reward_model"
"""The reward-model stage's method name (its run ids start with it)."""
CHANCE = 0.5
"""A reward model that ranks held-out (chosen, rejected) pairs no better than a coin gives PPO no signal."""

FLAG = "reward model did not learn"
"""Appended to the label of every method trained against a reward model that did not learn (see the module)."""


def uses_reward_model(run: Run) -> bool:
    """A method trained against the learned reward model (PPO with reward: model)."""
    source = (run.result.get("settings") or {}).get("reward_source")
    if isinstance(source, str):
        return source == "model"
    return run.result.get("method") == "ppo" or "reward" in ((run.result.get("memory") or {}).get("networks") or {})


def reward_model_check(runs: Iterable[Run]) -> dict[str, Any] | None:
    """The reward-model stage's held-out pair accuracy with n, a 95% Wilson interval and the verdict, or None.

    ``runs``: the suite's runs (stages are picked out). The correct count is rounded from accuracy x n (the stage
    records the share, and n pairs make it a multiple of 1/n). Keys: run_id, label, n, correct, accuracy, low,
    high, untrained (None when not recorded), ``chance_inside`` (the interval contains 50%: the data cannot tell
    the model from a coin) and ``learned`` (low above 50% and above the untrained head's accuracy).
    """
    run = next((r for r in runs if r.kind == "stage" and r.status == "ok"
                and (r.result.get("method") == REWARD_STAGE or r.run_id.startswith(REWARD_STAGE))), None)
    if run is None:
        return None
    metrics = run.result.get("metrics") or {}
    n, acc = fmt.num(metrics.get("heldout_pairs")), fmt.num(metrics.get("heldout_pair_accuracy"))
    if n is None or acc is None or n <= 0 or not 0 <= acc <= 1:
        return None
    n = int(n)
    correct = round(acc * n)
    low, high = wilson_interval(correct, n)
    untrained = fmt.num(metrics.get("heldout_pair_accuracy_untrained"))
    learned = low > CHANCE and (untrained is None or low > untrained)
    return {"run_id": run.run_id, "label": run.label, "n": n, "correct": correct, "accuracy": acc, "low": low,
            "high": high, "untrained": untrained, "chance_inside": low <= CHANCE <= high, "learned": learned,
            "train_accuracy": fmt.num(metrics.get("train_pair_accuracy"))}


def interval_text(check: dict[str, Any]) -> str:
    """'61.0% [56.2, 65.6] on 410 held-out pairs (untrained head: 50.2%)'."""
    untrained = f" (untrained head: {fmt.pct(check['untrained'])})" if check.get("untrained") is not None else ""
    return (f"{fmt.pct(check['accuracy'])} [{100 * check['low']:.1f}, {100 * check['high']:.1f}] on "
            f"{check['n']:,} held-out pairs{untrained}")


def verdict_sentence(check: dict[str, Any]) -> str:
    """One plain sentence on what the reward model's held-out accuracy shows (95% Wilson, n pairs)."""
    if check["learned"]:
        return (f"The reward model learned: it ranks held-out pairs {interval_text(check)} right, above chance and "
                f"above its untrained head.")
    if check["chance_inside"]:
        why = f"not distinguishable from chance (n = {check['n']:,})"
    elif check["low"] <= CHANCE:
        why = "no better than chance"
    else:
        why = "not better than its untrained head"
    return (f"The reward model did not learn: it ranks held-out pairs {interval_text(check)} right, {why}; so "
            f"the accuracy of every method trained against it, marked '{FLAG}', measures what an uninformative "
            f"reward does, not what the method can do.")


def flag_unlearned(runs: list[Run]) -> None:
    """Mark every method trained against a reward model that did not learn (:func:`reward_model_check`) with
    :data:`FLAG`, which its label then carries."""
    check = reward_model_check(runs)
    if check is None or check["learned"]:
        return
    for run in runs:
        if run.kind != "stage" and uses_reward_model(run):
            run.flag = FLAG
