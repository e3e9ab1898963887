"""The report's record types: one planned run as the report sees it, and a written figure.

They sit below every other report module (formatting, loading, figures), so those import them without a circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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

    @property
    def kind(self) -> str:
        return str(self.result.get("kind") or "method")

    @property
    def status(self) -> str:
        return str(self.result.get("status") or "not_run")

    @property
    def label(self) -> str:
        return str(self.result.get("label") or self.result.get("method") or self.run_id)


@dataclass
class FigureInfo:
    """A written figure: the file name under figures/ and the caption shown under it."""

    name: str
    caption: str
