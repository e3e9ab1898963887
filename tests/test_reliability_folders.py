"""The suite writes only inside the folder it was given and replaces only what it made.

- ``latest``: a file, a folder or a link of the user's by that name beside the suite folder is left alone, with one
  line saying so; only a link the suite made is moved.
- the spec's ``name`` is one safe file name (it names reports/<name>-<time>), and every folder a run creates lies
  inside the suite folder: runs/ or a run folder that leads elsewhere is refused before anything is written.
- ``bench report``, ``bench score`` and ``bench compare`` check a suite folder's suite.json before writing anything
  and refuse an output folder that is one of the inputs or any suite folder.

The runs here use stand-in workers (tests/test_runner_failures.py), so each test takes seconds.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from test_runner_failures import FakeWorkers

from bench.cli import main
from bench.results import write_json_atomic


def _run(monkeypatch: pytest.MonkeyPatch, suite_dir: Path, *overrides: str):
    """run_suite on cpu-quick with stand-in workers and a stand-in report; (outcome, console)."""
    import bench.execution.runner
    import bench.report
    from bench.config.loading import load_spec

    monkeypatch.setattr(bench.report, "build_report", lambda d: (Path(d) / "index.html").write_text("r") and
                        Path(d) / "index.html")
    monkeypatch.setattr(bench.execution.runner, "launch_worker", FakeWorkers())
    stream = io.StringIO()
    outcome = bench.execution.runner.run_suite(load_spec("cpu-quick", list(overrides)), suite_dir, stream=stream,
                                               latest_dir=suite_dir.parent)  # as REPORTS_DIR
    return outcome, stream.getvalue()


# -- latest -------------------------------------------------------------------------------------------------
def test_a_file_named_latest_is_never_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "latest").write_text("my notes\n")
    outcome, _ = _run(monkeypatch, results / "s1")
    assert outcome.exit_code == 0
    assert not (results / "latest").is_symlink() and (results / "latest").read_text() == "my notes\n"
    note = [line for line in capsys.readouterr().err.splitlines() if "latest" in line]
    assert len(note) == 1 and "is a file, so it was left as it is" in note[0], note
    assert sorted(p.name for p in results.iterdir()) == ["latest", "s1"]  # no temporary link left either


def test_latest_moves_only_when_the_suite_made_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture) -> None:
    from bench.execution.suite_folder import _point_latest

    results = tmp_path / "results"
    _run(monkeypatch, results / "s1")
    assert os.readlink(results / "latest") == "s1"
    _run(monkeypatch, results / "s2")
    assert os.readlink(results / "latest") == "s2"  # the suite's own link follows the newest folder
    # A link of the user's (elsewhere, or to a folder that is no suite folder) stays; so does a folder.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (results / "latest").unlink()
    (results / "latest").symlink_to(elsewhere)
    assert _point_latest(results / "s2") is False and os.readlink(results / "latest") == str(elsewhere)
    (results / "latest").unlink()
    (results / "latest").mkdir()
    assert _point_latest(results / "s2") is False and (results / "latest").is_dir()
    assert capsys.readouterr().err.count("left as it is") == 2
    # A file named like the temporary link is someone else's: it is not removed to make room.
    (results / "latest").rmdir()
    squatter = results / f".latest.{os.getpid()}.0"
    squatter.write_text("not ours")
    assert _point_latest(results / "s2") is True
    assert squatter.read_text() == "not ours" and os.readlink(results / "latest") == "s2"


# -- the name and the folders a run creates ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".hidden", "-flag", "a\x01b", "a\x00b", "é" * 3,
                                  "x" * 65, ""])
def test_an_unsafe_name_is_refused_when_the_spec_is_built(name: str) -> None:
    from bench.config.loading import load_spec_dict
    from bench.errors import SpecError

    with pytest.raises(SpecError, match="'name' must be 1 to 64 ASCII letters"):
        load_spec_dict({"name": name})


def test_name_dot_dot_writes_nothing_outside_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert main(["run", "--preset", "cpu-quick", "name=../../x", "--reports-dir", "reports"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'name' must be" in err[0]
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_a_runs_folder_that_leads_outside_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.errors import UserError

    outside = tmp_path / "outside"
    outside.mkdir()
    suite = tmp_path / "s"
    suite.mkdir()
    (suite / "runs").symlink_to(outside)
    with pytest.raises(UserError, match="not a plain folder inside the suite folder"):
        _run(monkeypatch, suite)
    assert list(outside.iterdir()) == [] and sorted(p.name for p in suite.iterdir()) == ["runs"]


def test_a_name_that_slipped_past_validation_still_makes_no_folder_outside(tmp_path: Path) -> None:
    """default_out_dir checks its own result: a Spec built without validation cannot climb out of reports/."""
    from bench.config.spec import Spec
    from bench.errors import UserError
    from bench.execution.suite_folder import default_out_dir

    with pytest.raises(UserError, match="does not make one folder name"):
        default_out_dir(Spec(name="../../x"), tmp_path / "reports")
    assert default_out_dir(Spec(name="ok"), tmp_path / "reports").parent == tmp_path / "reports"


# -- the shape of a suite folder, and where reports may be written -----------------------------------
BAD_SUITE_JSON = {"an empty object": "{}", "a list": "[]", "not JSON": "not json", "runs not a list": '{"runs": 3}',
                  "a run id that climbs out": '{"runs": ["../../elsewhere"]}', "nested deeply": "[" * 100_000}


def _bad_suite(root: Path, text: str) -> Path:
    suite = root / "suite"
    suite.mkdir(parents=True)
    (suite / "suite.json").write_text(text)
    return suite


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("what", list(BAD_SUITE_JSON))
@pytest.mark.parametrize("command", ["report", "score", "compare", "python -m bench.report"])
def test_report_score_and_compare_refuse_a_malformed_suite_json_and_write_nothing(
        command: str, what: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    suite = _bad_suite(tmp_path, BAD_SUITE_JSON[what])
    good = tmp_path / "good"
    write_json_atomic(good / "suite.json", {"preset": "t", "runs": [], "spec": {}})
    before = _files(tmp_path)
    if command == "python -m bench.report":
        from bench.report.__main__ import main as report_main

        code = report_main([str(suite)])
    else:
        argv = {"report": ["report", str(suite)], "score": ["score", str(suite)],
                "compare": ["compare", str(good), str(suite), "--out", str(tmp_path / "cmp")]}[command]
        code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "not a suite" in err[0] and "error:" in err[0], err
    assert _files(tmp_path) == before  # no index.html, summary.md, results.csv, figures/ or cmp/


def _suite_folder(root: Path, name: str) -> Path:
    folder = root / name
    write_json_atomic(folder / "suite.json", {"preset": "t", "runs": [], "spec": {}})
    (folder / "index.html").write_text(f"{name}'s own page")
    return folder


@pytest.mark.parametrize("which", ["the second input", "the first input", "another suite folder"])
def test_compare_refuses_to_write_over_a_suite_folder(which: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    a, b, c = (_suite_folder(tmp_path, n) for n in ("a", "b", "c"))
    out = {"the second input": b, "the first input": a, "another suite folder": c}[which]
    assert main(["compare", str(a), str(b), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("one of the compared folders" in err[0] or "is a suite folder" in err[0]), err
    for folder in (a, b, c):
        assert (folder / "index.html").read_text() == f"{folder.name}'s own page"
        assert not (folder / "compare.md").exists()
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "a-vs-b")]) == 0  # a new folder is fine
    assert (tmp_path / "a-vs-b" / "compare.md").is_file()


def test_compare_out_an_existing_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = _suite_folder(tmp_path, "a"), _suite_folder(tmp_path, "b")
    (tmp_path / "file").write_text("keep")
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "file")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert (tmp_path / "file").read_text() == "keep"


def test_a_figures_link_out_of_the_folder_is_refused_and_its_pngs_kept(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    """The build replaces figures/*.png and removes stale ones: through a link that would be someone's pictures."""
    suite = _suite_folder(tmp_path, "s")
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    (pictures / "holiday.png").write_bytes(b"\x89PNG mine")
    (suite / "figures").symlink_to(pictures)
    assert main(["report", str(suite)]) == 2
    assert "not a plain folder inside the suite folder" in capsys.readouterr().err
    assert (pictures / "holiday.png").read_bytes() == b"\x89PNG mine"
    assert (suite / "index.html").read_text() == "s's own page"


def test_score_refuses_a_run_folder_that_leads_outside(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from test_score import _suite as scored_suite

    suite = scored_suite(tmp_path)
    outside = tmp_path / "outside"
    (suite / "runs" / "grpo-s0").rename(outside)
    (suite / "runs" / "grpo-s0").symlink_to(outside)
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    assert main(["score", str(suite)]) == 2
    assert "leads outside the suite folder" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == before
    assert not (suite / "report_settings.json").exists()
