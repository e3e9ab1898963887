"""The report builder: a suite folder in, index.html + summary.md + results.csv + figures/*.png out.

Builds from result files alone and imports no torch / transformers / trl / peft / datasets, so a report can
be rebuilt on a laptop from a GPU box's results folder (``python -m bench.report SUITE_DIR``).

The page and summary.md open with generated findings (bench.report.findings), the seed texts' claims checked
against the measurements (bench.report.claims, baselines/claims.yaml), the headline per method and a citation
block (bench.report.overview, bench.report.citation); what training did (bench.report.dynamics: training
dynamics, reward-hacking monitors and their flags, reward over-optimisation; the "aha" and over-optimisation
figures are in bench.report.figures); ``bench compare`` (bench.report.compare) puts two or
more suite folders side by side; scripts/check_report.sh opens a page in headless Chromium.

Every file is written atomically (a temporary file renamed over the old one), so an interrupted or failed
rebuild — a full disk, a kill — leaves the previous report whole, never a 0-byte results.csv. Free text
(failure reasons, log tails, completions) is capped where it is shown (``fmt.cap_text``).

May import: ``bench.telemetry`` (the monitors' flag rules), ``bench.scoring`` (statistics), ``bench.task`` (the
verifier's mode names), ``bench.config`` and the contracts, and of those only modules that import no torch at
import time. Inside the package ``records`` (Run, FigureInfo) sits below ``fmt``, ``fmt`` below ``load``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from bench.report.figures import FigureInfo, build_figures
from bench.report.html import write_html
from bench.report.load import CSV_COLUMNS, Suite, load_suite, results_frame
from bench.report.summary import write_summary
from bench.report.tables import write_csv

FIGURES_DIR = "figures"

__all__ = ["build_report", "load_suite", "results_frame", "Suite", "CSV_COLUMNS", "FIGURES_DIR"]


def build_report(suite_dir: Path) -> Path:
    """Write ``index.html``, ``summary.md``, ``results.csv`` and ``figures/*.png`` into ``suite_dir``.

    Safe to call repeatedly (e.g. after each run finishes): figures are drawn into a temporary folder and
    renamed into ``figures/`` one by one, then PNGs this build did not draw are removed, so a figure whose
    data disappeared does not linger beside the new page.

    Returns:
        The path of ``index.html``.
    """
    suite_dir = Path(suite_dir)
    suite = load_suite(suite_dir)
    figures = _build_figures_atomically(suite, suite_dir / FIGURES_DIR)
    write_csv(suite, suite_dir / "results.csv")
    write_summary(suite, suite_dir / "summary.md")
    return write_html(suite, figures, suite_dir / "index.html")


def _build_figures_atomically(suite: Suite, figures_dir: Path) -> list[FigureInfo]:
    """Draw the figures beside ``figures_dir`` and move each into it with a rename (atomic on one filesystem)."""
    figures_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{figures_dir.name}-", dir=figures_dir.parent))
    try:
        figures = build_figures(suite, staging)
        drawn = {p.name for p in staging.glob("*.png")}
        for name in sorted(drawn):
            os.replace(staging / name, figures_dir / name)
        for stale in figures_dir.glob("*.png"):
            if stale.name not in drawn:
                stale.unlink()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return figures
