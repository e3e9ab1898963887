"""The report shows result data as written and reads only what the suite wrote.

- every CSV the suite writes (results.csv, memory_per_rank.csv) keeps a text cell a spreadsheet would run as a
  formula as text (a leading ``'``, OWASP), numbers as numbers;
- every Markdown file (summary.md, compare.md) shows ``<script>``, ``&`` and ``|`` from result data as
  written: never raw HTML, never a split cell;
- a measured section (memory, throughput, phases, accuracy) holding a string where a number belongs marks the
  result malformed, naming the key, and --resume runs it again;
- ``bench report`` reads runs/ and result files only as plain folders and files inside the suite folder, says in
  one line what it skipped, and never reads a result file past a size cap.
"""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from report_fixtures import MIB, write_suite

from bench.report import build_report, fmt, load_suite, ranks
from bench.report.compare import compare

FORMULAS = ['=HYPERLINK("http://x","y")', "+SUM(A1)", "-2+3", "@cmd", "\tTAB", "\rCR"]


def _edit(suite: Path, run_id: str, change: Any) -> None:
    path = suite / "runs" / run_id / "result.json"
    result = json.loads(path.read_text())
    change(result)
    path.write_text(json.dumps(result))


def _set(**fields: Any) -> Any:
    return lambda result: result.update(fields)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


# -- CSV: formulas stay text ----------------------------------------------------------------------------------
def test_every_text_cell_of_results_csv_that_a_spreadsheet_would_run_is_text(tmp_path: Path) -> None:
    methods = ("grpo", "grpo_engine", "ppo", "ppo_verifier", "dpo")
    suite = write_suite(tmp_path, methods=methods)
    for method, label in zip(methods, FORMULAS):
        _edit(suite, f"{method}-s0", _set(label=label, engine=FORMULAS[-1]))
    build_report(suite)
    rows = {r["run_id"]: r for r in _rows(suite / "results.csv")}
    for method, label in zip(methods, FORMULAS):
        row = rows[f"{method}-s0"]
        assert row["label"] == "'" + label.replace("\r", "\n"), row["label"]
        assert row["engine"] == "'\nCR"  # a bare CR would end the row: written as a newline, which is quoted
        assert float(row["accuracy_after"]) == pytest.approx(json.loads(
            (suite / "runs" / f"{method}-s0" / "result.json").read_text())["accuracy"]["after"]["strict"]["accuracy"])
        assert row["peak_memory_bytes"].isdigit()  # numbers are written as numbers, never quoted or prefixed


def test_the_per_rank_csv_keeps_formulas_as_text_too(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, methods=("grpo", "dpo"))

    def two_ranks(result: dict[str, Any]) -> None:
        result["label"] = "=cmd|' /C calc'!A0"
        result["memory"]["ranks"] = [{"rank": k, "peak_bytes": (700 + k) * MIB, "source": "cpu-rss"} for k in (0, 1)]
        result["settings"]["parallel"] = {"launcher": "accelerate", "processes": 2, "backend": "gloo",
                                          "strategy": "@ddp"}
        result["throughput"]["processes"] = 2

    _edit(suite, "grpo-s0", two_ranks)
    build_report(suite)
    rows = [r for r in _rows(suite / ranks.CSV_FILE) if r["run_id"] == "grpo-s0"]
    assert rows and all(r["label"] == "'=cmd|' /C calc'!A0" for r in rows)
    assert all(r["strategy"] == "'@ddp" for r in rows)
    assert [r["peak_bytes"] for r in rows] == [str(700 * MIB), str(701 * MIB)]


@pytest.mark.parametrize("value, written", [
    ("=1+1", "'=1+1"), ("+A1", "'+A1"), ("-A1", "'-A1"), ("@A1", "'@A1"), ("\tx", "'\tx"), ("\rx", "'\nx"),
    ("-0.5", "-0.5"), ("+3", "+3"), ("-1e-05", "-1e-05"), ("plain", "plain"), (-0.5, -0.5), (3, 3), (None, None),
])
def test_a_cell_is_text_or_the_number_it_was(value: Any, written: Any) -> None:
    assert fmt.csv_cell(value) == written


# -- Markdown: result data shown as written -------------------------------------------------------------------
HOSTILE = "<script>alert(1)</script> & a|b > c"


def test_summary_md_shows_a_hostile_label_and_error_as_written(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, methods=("grpo", "ppo", "dpo"), failed=("dpo",))
    _edit(suite, "grpo-s0", _set(label=HOSTILE))
    _edit(suite, "dpo-s0", lambda r: r["error"].update(message="bad <img src=x onerror=alert(2)> | row"))
    meta = json.loads((suite / "suite.json").read_text())
    meta.update(preset="<b>preset</b>", description="<i>described</i> | here")
    (suite / "suite.json").write_text(json.dumps(meta))
    build_report(suite)
    md = (suite / "summary.md").read_text(encoding="utf-8")
    assert not re.search(r"<(script|img|b|i)\b", md), re.search(r".{40}<(script|img|b|i)\b.{40}", md)
    assert "&lt;script>alert(1)&lt;/script> &amp; a&#124;b > c" in md
    assert "&lt;img src=x onerror=alert(2)> &#124; row" in md
    assert md.startswith("# Benchmark summary: &lt;b>preset&lt;/b>")
    for block in re.findall(r"(?:^\|.*\n)+", md, re.MULTILINE):  # every row of a table has its header's cells
        widths = {line.count("|") for line in block.splitlines()}
        assert len(widths) == 1, block


def test_compare_md_shows_hostile_labels_as_written(tmp_path: Path) -> None:
    a, b = write_suite(tmp_path, name="a"), write_suite(tmp_path, name="b")
    _edit(b, "grpo-s0", _set(label=HOSTILE))
    compare([a, b], tmp_path / "cmp")
    md = (tmp_path / "cmp" / "compare.md").read_text(encoding="utf-8")
    assert "<script>" not in md and "&lt;script>" in md


@pytest.mark.parametrize("text, shown", [
    ("<script>x</script>", "&lt;script>x&lt;/script>"), ("<http://x>", "&lt;http://x>"),
    ("<!-- c -->", "&lt;!-- c -->"), ("30% > 20%", "30% > 20%"), ("p < 0.05", "p < 0.05"), ("a & b", "a &amp; b"), ("a|b", "a&#124;b"),
    ("two\nlines", "two lines"), ("&lt;", "&amp;lt;"),
])
def test_markdown_text_is_shown_as_written(text: str, shown: str) -> None:
    assert fmt.md_text(text) == shown


def test_a_command_is_a_code_span_whatever_it_holds() -> None:
    assert fmt.md_code("bench run --out a") == "`bench run --out a`"
    assert fmt.md_code("a `b` | <c>") == "``a `b` \\| <c>``"
    assert fmt.md_code("`b`") == "`` `b` ``"
    assert fmt.md_text(fmt.md_code("<c>")) == "`<c>`"


# -- measured sections hold numbers ---------------------------------------------------------------------------
@pytest.mark.parametrize("section, key, value", [
    ("throughput", "tokens_per_s", "fast"), ("memory", "peak_bytes", "lots"), ("throughput", "wall_s", "1 min"),
    ("phases", "generation", {"time_s": "long", "count": 3}), ("training_change", "params_changed_fraction", "all"),
])
def test_text_where_a_number_belongs_marks_the_result_malformed(tmp_path: Path, section: str, key: str,
                                                               value: Any) -> None:
    from bench.results import result_problems

    suite = write_suite(tmp_path, methods=("grpo", "dpo"))
    _edit(suite, "grpo-s0", lambda r: r[section].update({key: value}))
    result = json.loads((suite / "runs" / "grpo-s0" / "result.json").read_text())
    problems = result_problems(result)  # what --resume asks before it reuses a run: this one is run again
    assert any("text where a measurement belongs" in p and f"{section}.{key}" in p for p in problems), problems
    build_report(suite)
    row = next(r for r in _rows(suite / "results.csv") if r["run_id"] == "grpo-s0")
    assert row["status"] == "failed" and f"{section}.{key}" in row["error"]
    assert not result_problems(json.loads((suite / "runs" / "dpo-s0" / "result.json").read_text()))


# -- the loader reads only the suite folder's own plain files -------------------------------------------------
def test_a_linked_runs_folder_is_not_read(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    suite, outside = write_suite(tmp_path, name="a"), write_suite(tmp_path, name="outside")
    import shutil

    shutil.rmtree(suite / "runs")
    (suite / "runs").symlink_to(outside / "runs")
    loaded = load_suite(suite)
    assert all(r.status == "not_run" for r in loaded.runs)
    assert any(p.startswith("runs/ is a symbolic link") for p in loaded.problems)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "skipped" in err[0] and "symbolic link" in err[0]


def test_a_linked_result_or_verdicts_file_is_not_read(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    suite, outside = write_suite(tmp_path, name="b"), write_suite(tmp_path, name="outside")
    (suite / "runs" / "grpo-s0" / "result.json").unlink()
    (suite / "runs" / "grpo-s0" / "result.json").symlink_to(outside / "runs" / "grpo-s0" / "result.json")
    (suite / "runs" / "ppo-s0" / "eval_after.jsonl").unlink()
    (suite / "runs" / "ppo-s0" / "eval_after.jsonl").symlink_to(outside / "runs" / "ppo-s0" / "eval_after.jsonl")
    loaded = load_suite(suite)
    runs = {r.run_id: r for r in loaded.runs}
    assert runs["grpo-s0"].status == "not_run" and "symbolic link" in (runs["grpo-s0"].note or "")
    assert runs["ppo-s0"].verdicts is None
    assert "skipped 2 path(s)" in capsys.readouterr().err


def test_a_result_file_past_the_cap_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.report import load

    suite = write_suite(tmp_path, methods=("grpo",))
    monkeypatch.setattr(load, "MAX_RESULT_BYTES", 1000)
    loaded = load.load_suite(suite)
    grpo = next(r for r in loaded.runs if r.run_id == "grpo-s0")
    assert grpo.status == "not_run" and "larger than" in (grpo.note or "")
