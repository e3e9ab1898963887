"""The name every curve and monitor metric goes by on the page, one dictionary for the tables and the figures.

A metric's unit is not part of its name: it comes from bench.results.METRIC_NAMES, and each place adds it as it
shows the value (a table prints a share as %, a figure's axis as a share in [0, 1]).
"""

from __future__ import annotations

METRIC_LABELS: dict[str, str] = {
    # the rollout
    "reward": "mean reward", "accuracy_reward": "verifier accuracy reward", "format_reward": "format reward",
    "rm_score": "reward-model score", "completion_length": "completion length",
    "completion_length_p90": "completion length p90", "zero_std_groups": "zero-variance groups",
    # the update
    "kl": "KL(policy ‖ reference)", "entropy": "policy entropy", "grad_norm": "gradient norm before clipping",
    "clipfrac": "clip fraction", "ratio_std": "importance-ratio spread", "value_loss": "value loss",
    "explained_variance": "explained variance",
    # the reward-hacking and 'aha' monitors
    "empty_answer_rate": "empty answer", "format_only_rate": "right format, wrong answer",
    "repeated_ngram_rate": "repeated 4-gram", "answer_in_think_rate": "answer in think block",
    "truncated_rate": "truncated", "reflection_rate": "reflection (any phrase)",
    "reflection_count": "reflection phrases",
}
"""Metric (a key of bench.results.METRIC_NAMES) -> its name in a table's column and a figure's axis and title."""


def metric_label(name: str) -> str:
    """The metric's name on the page (:data:`METRIC_LABELS`); a metric without one goes by its key."""
    return METRIC_LABELS.get(name, name)
