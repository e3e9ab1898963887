"""The page's line on live curves: the command that shows every run's TensorBoard event files side by side, and the
warnings of any tracker that failed during a run (``result["trackers"]``, written by bench.telemetry.trackers)."""

from __future__ import annotations

import shlex
from typing import Any

from bench.report.load import Suite

TENSORBOARD_DIR = "tensorboard"
"""A run's event-file folder (bench.telemetry.trackers.TENSORBOARD_DIR; the report does not import telemetry)."""


def _record(result: dict[str, Any]) -> dict[str, Any]:
    record = result.get("trackers")
    return record if isinstance(record, dict) else {}


def tensorboard_command(suite: Suite) -> str | None:
    """``tensorboard --logdir SUITE/runs`` when any run wrote event files (recorded, or the folder is there); None
    otherwise."""
    runs = suite.suite_dir / "runs"
    wrote = any(_record(run.result).get("tensorboard_dir") or (runs / run.run_id / TENSORBOARD_DIR).is_dir()
                for run in suite.runs)
    return f"tensorboard --logdir {shlex.quote(str(runs))}" if wrote else None


def tracker_warnings(suite: Suite) -> list[str]:
    """'<run label>: <warning>' for every warning a run's trackers recorded (the run's numbers are unaffected)."""
    out = []
    for run in suite.runs:
        for line in _record(run.result).get("warnings") or []:
            out.append(f"{run.label} ({run.run_id}): {line}")
    return out
