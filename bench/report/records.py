"""The report's record types: one planned run as the report sees it, and a written figure.

They sit below every other report module (formatting, loading, figures), so those import them without a circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.config import registry


@dataclass
class Run:
    """One planned run as the report sees it."""

    run_id: str
    result: dict[str, Any]
    """The result dict, completed with every top-level key of ``empty_result`` (so lookups never fail)."""
    note: str | None = None
    """Why there is no real result: "not run yet" or "result.json unreadable"; None when one was read."""
    verdicts: list[dict[str, Any]] | None = None
    """Per-question lines of the after-training evaluation (completions.jsonl or eval_after.jsonl) without
    their text, sorted by index; None when the file is absent. Read a verdict with :func:`fmt.verdict`."""
    cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """Values the report derives from the verdicts once per run (cluster labels, clustered scores)."""
    flag: str | None = None
    """A caveat the label carries wherever the report shows it (bench.report.reward_check: a method trained
    against a reward model that did not learn); None for none."""

    @property
    def kind(self) -> str:
        return str(self.result.get("kind") or "method")

    @property
    def status(self) -> str:
        return str(self.result.get("status") or "not_run")

    @property
    def label(self) -> str:
        """The recorded label, as the run's own spec ran it (`label_as_run`), with its :attr:`flag` in brackets."""
        spec = self.result.get("spec")
        label = label_as_run(self.result.get("method"), str(self.result.get("label") or self.result.get("method")
                                                             or self.run_id), spec if isinstance(spec, dict) else {})
        return f"{label} [{self.flag}]" if self.flag else label


def label_as_run(method: Any, label: str, spec: dict[str, Any]) -> str:
    """A stage's label as ``spec`` (a spec dict) ran it, whatever an older result recorded: under
    ``sample_pool.pairs: gold`` the pool's pairs are gold-labelled (the gold solution as chosen), and a warm start
    that was off is the start model (it trained nothing). Other labels are returned unchanged."""
    if method == "sample_pool" and (spec.get("sample_pool") or {}).get("pairs") == "gold":
        return label.replace("verifier-labelled", "gold-labelled")
    if method == "warm_start" and (spec.get("warm_start") or {}).get("enabled") is False:
        return registry.NO_WARM_START_LABEL
    return label


@dataclass
class FigureInfo:
    """A written figure: the file name under figures/ and the caption shown under it."""

    name: str
    caption: str
