"""The Pareto figure: accuracy after training against what it cost, per method (torch-free).

Two panels share the accuracy axis (headline mode): peak memory (one source, named on the axis) and the run's
wall time (drawn by :func:`bench.report.figures.pareto_figure`). Each ok seed is a small point in its method's colour (:func:`bench.report.figures.method_colors`), each
method's mean over its seeds a large marker with its label. A method up and to the left is cheaper for the same
accuracy. The control arm (lr 0) is a pipeline check, not a trade-off, and is left out.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from bench.report import fmt
from bench.report.load import Suite, results_frame

NAME = "pareto.png"
"""The figure's file; bench.report.figures.pareto_figure draws it from this module's frame and panels."""


def pareto_frame(suite: Suite) -> pd.DataFrame:
    """Ok runs of methods other than the control arm that measured accuracy after (headline mode)."""
    frame = results_frame(suite)
    controls = {r.run_id for r in suite.methods if fmt.is_control(r)}
    keep = (frame["status"] == "ok") & frame["accuracy_after"].notna() & ~frame["run_id"].isin(controls)
    return frame[keep]


def memory_source(frame: pd.DataFrame) -> str | None:
    """The memory source most runs recorded (the first of a tie in run order): one axis, one source."""
    found = [s for s, b in zip(frame["memory_source"], frame["peak_memory_bytes"]) if pd.notna(s) and pd.notna(b)]
    return Counter(found).most_common(1)[0][0] if found else None


def draw_panel(ax: Any, frame: pd.DataFrame, column: str, scale: float, colors: dict[str, str]) -> int:
    """Seeds as points, the method's mean as a large diamond (in the legend); returns how many runs were drawn."""
    drawn = 0
    for label, runs in frame.groupby("label", sort=False):
        runs = runs[runs[column].notna()]
        if runs.empty:
            continue
        xs = [float(v) / scale for v in runs[column]]
        ys = [100 * float(v) for v in runs["accuracy_after"]]
        color = colors.get(str(label), "#222222")
        ax.scatter(xs, ys, s=18, color=color, alpha=0.6, label=None)
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        ax.scatter([mx], [my], s=110, color=color, marker="D", edgecolor="black", linewidth=0.6, label=str(label))
        drawn += len(runs)
    ax.grid(alpha=0.3)
    return drawn


def caption(suite: Suite, frame: pd.DataFrame, source: str | None, on_memory: int, on_time: int) -> str:
    left = len(frame) - on_memory
    return (f"Accuracy after training (%, greedy, headline mode {suite.headline_mode}) against each run's whole-run "
            f"peak memory (MiB, source {source or 'none recorded'}; result.json memory.peak_bytes) and against its "
            f"wall time (s; result.json throughput.wall_s). Small points: one ok seed each ({on_memory} on the "
            f"memory panel, {on_time} on the time panel); diamonds: each method's mean over its seeds; one colour "
            f"per method. Up and to the left is better."
            + (f" {left} run(s) without a {source} reading are left off the memory panel (one axis, one source)."
               if left and source else "")
            + " The control arm (lr 0) is left out: a pipeline check, not a trade-off.")
