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

from bench.config.paths import check_path, shown
from bench.errors import UserError
from bench.report.figures import FigureInfo, build_figures
from bench.report.html import write_html
from bench.report.load import CSV_COLUMNS, Suite, load_suite, results_frame
from bench.report.summary import write_summary
from bench.report.tables import write_csv

FIGURES_DIR = "figures"
OUTPUT_FILES = ("index.html", "summary.md", "results.csv", "memory_per_rank.csv")
"""What a build writes beside figures/ (each replaced atomically; an existing symbolic link is replaced, never
followed)."""

__all__ = ["build_report", "load_suite", "results_frame", "Suite", "CSV_COLUMNS", "FIGURES_DIR"]


def build_report(suite_dir: Path) -> Path:
    """Write ``index.html``, ``summary.md``, ``results.csv`` and ``figures/*.png`` into ``suite_dir``.

    Safe to call repeatedly (e.g. after each run finishes): figures are drawn into a temporary folder and
    renamed into ``figures/`` one by one, then PNGs this build did not draw are removed, so a figure whose
    data disappeared does not linger beside the new page.

    Returns:
        The path of ``index.html``.
    """
    suite_dir = check_output_folder(Path(suite_dir))
    suite = load_suite(suite_dir)
    figures = _build_figures_atomically(suite, suite_dir / FIGURES_DIR)
    write_csv(suite, suite_dir / "results.csv")
    write_summary(suite, suite_dir / "summary.md")
    return write_html(suite, figures, suite_dir / "index.html")


def check_output_folder(suite_dir: Path) -> Path:
    """Refuse, before anything is written, a folder the report must not be written into: not a folder, a
    ``suite.json`` that is there but not one `bench run` writes (bench.results.suite_problems), or an output path
    that is a folder where a file goes, a ``figures`` that is not a plain folder inside this one (a link
    elsewhere would have the build replace, and delete stale, PNG files outside the suite folder), or a folder
    that cannot be written (bench.config.outputs.check_writable)."""
    from bench.results import SUITE_FILE, read_suite_file

    suite_dir = check_path(suite_dir, "dir", "suite folder", hint="give a folder written by `bench run`")
    if (suite_dir / SUITE_FILE).exists() or (suite_dir / SUITE_FILE).is_symlink():
        _, problems = read_suite_file(suite_dir)
        if problems:
            raise UserError(f"'{shown(suite_dir)}' is not a suite folder ({problems[0]}); give a folder written by "
                            f"`bench run`, e.g. reports/latest")
    for name in OUTPUT_FILES:
        path = suite_dir / name
        if path.is_dir() and not path.is_symlink():
            raise UserError(f"'{shown(path)}' is a folder where the report writes a file; move it away first")
    figures = suite_dir / FIGURES_DIR
    if figures.is_symlink() or (figures.exists() and not figures.is_dir()):
        raise UserError(f"'{shown(figures)}' is not a plain folder inside the suite folder (a link or a file); the "
                        f"report replaces and removes PNG files there: move it away first")
    from bench.config.outputs import check_writable

    # A read-only copy (a mounted results disk) is one line here, not a traceback after the figures were drawn.
    return check_writable(suite_dir, "suite folder", "copy it somewhere you can write and rebuild the copy")


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
