"""The report builder: a suite folder in, index.html + summary.md + results.csv + figures/*.png out.

Builds from result files alone and imports no torch / transformers / trl / peft / datasets, so a report can
be rebuilt on a laptop from a GPU box's results folder (``python -m bench.report SUITE_DIR``).
"""

from __future__ import annotations

from pathlib import Path

from bench.report.figures import build_figures
from bench.report.html import write_html
from bench.report.load import CSV_COLUMNS, Suite, load_suite, results_frame
from bench.report.tables import write_csv, write_summary

FIGURES_DIR = "figures"

__all__ = ["build_report", "load_suite", "results_frame", "Suite", "CSV_COLUMNS", "FIGURES_DIR"]


def build_report(suite_dir: Path) -> Path:
    """Write ``index.html``, ``summary.md``, ``results.csv`` and ``figures/*.png`` into ``suite_dir``.

    Safe to call repeatedly (e.g. after each run finishes): old PNGs in ``figures/`` are removed first so a
    figure whose data disappeared does not linger beside the new page.

    Returns:
        The path of ``index.html``.
    """
    suite_dir = Path(suite_dir)
    suite = load_suite(suite_dir)
    figures_dir = suite_dir / FIGURES_DIR
    figures_dir.mkdir(parents=True, exist_ok=True)
    for stale in figures_dir.glob("*.png"):
        stale.unlink()
    figures = build_figures(suite, figures_dir)
    write_csv(suite, suite_dir / "results.csv")
    write_summary(suite, suite_dir / "summary.md")
    return write_html(suite, figures, suite_dir / "index.html")
