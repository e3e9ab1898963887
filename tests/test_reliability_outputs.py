"""Where commands write: what each command writes can be written, replaces
only what the suite made, and stays inside the folder it was given; a failed write, a Ctrl-C at start-up and a
full stdout are one line, not a traceback.

- a read-only folder for `bench report`, `bench score`, `bench compare --out`, `bench data --export`: one line
  naming the folder, exit 2, before any figure is drawn; a write that fails anyway (a full disk) is one line too.
- `bench data --export` into a folder holding files (a GSM8K copy, the very data the preset reads), `bench compare
  --out` into a user's folder or inside a suite folder, `--verdicts` over a file that is no verdicts file (a
  suite.json): refused, nothing replaced; re-running a comparison or a scoring into its own output still works.
- `bench compare A A` (or a folder and a link to it): refused, every difference would read zero.
- `REPORTS_DIR/latest` only: a run written elsewhere (--out) makes no link beside its folder.
- a new --out / --export name with a control character; a suite.json or a plan with more than MAX_RUNS runs; an
  empty completions file; a task.path the source does not read (a note).

The runs here use stand-in workers (tests/test_runner_failures.py), so each test takes seconds.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from bench.cli import main


def _suite(folder: Path, runs: list[str] | None = None) -> Path:
    """A suite folder with no results (the report shows its runs as not started)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "suite.json").write_text(json.dumps({"preset": "t", "runs": runs or [], "spec": {}}))
    return folder


def _listing(root: Path) -> dict[str, bytes | str | None]:
    """Every entry under ``root``: a file's bytes, a link's target, None for a folder."""
    out: dict[str, bytes | str | None] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            out[str(path.relative_to(root))] = (os.readlink(path) if path.is_symlink() else
                                                None if path.is_dir() else path.read_bytes())
    return out


def _one_line(capsys: pytest.CaptureFixture, *words: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench: error: ") and "Traceback" not in err[0], err[-5:]
    for word in words:
        assert word in err[0], err[0]
    return err[0]


def _refused(argv: list[str], root: Path, capsys: pytest.CaptureFixture, *words: str) -> str:
    """main(argv) is exit 2, one line holding ``words``, and nothing under ``root`` changed."""
    before = _listing(root)
    assert main(argv) == 2
    line = _one_line(capsys, *words)
    assert _listing(root) == before, sorted(set(_listing(root)) ^ set(before))
    return line


# -- a folder that cannot be written --------------------------------------------------------------------------
@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A folder holding a suite folder ('s'), then made unwritable: chmod for a user, a read-only tmpfs for root
    (who writes through any mode); skipped where neither works."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        _suite(folder / "s")
        folder.chmod(0o555)
        (folder / "s").chmod(0o555)
        yield folder
        (folder / "s").chmod(0o755)
        folder.chmod(0o755)
        return
    if not shutil.which("mount") or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)],
                                                   capture_output=True).returncode:
        pytest.skip("no way to make a read-only folder here")
    try:
        _suite(folder / "s")
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, capture_output=True)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


def test_a_folder_that_cannot_be_written_is_one_line_before_any_work(
        read_only: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.report

    def no_build(*args: object) -> None:
        raise AssertionError("the report was started on a folder it cannot write")

    monkeypatch.setattr(bench.report, "load_suite", no_build)
    a, b = _suite(tmp_path / "a"), _suite(tmp_path / "b")
    completions = tmp_path / "c.jsonl"
    completions.write_text(json.dumps({"c": "#### 4", "g": "4"}) + "\n")
    cannot = ("read-only filesystem", "permission denied")
    for argv in (["report", str(read_only / "s")], ["score", str(read_only / "s")],
                 ["compare", str(a), str(b), "--out", str(read_only / "cmp")],
                 ["data", "--preset", "cpu-quick", "--export", str(read_only / "splits")],
                 ["score", str(completions), "--completion-field", "c", "--gold-field", "g",
                  "--verdicts", str(read_only / "v.jsonl")]):
        assert main(argv) == 2, argv
        line = _one_line(capsys)
        assert any(c in line for c in cannot), line
    assert sorted(p.name for p in read_only.iterdir()) == ["s"]


def test_a_write_that_fails_half_way_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk that fills up (or turns read-only) after the checks: one line naming the file, no traceback; a full
    disk is exit 1 (as in `bench run`), a folder that cannot be written exit 2."""
    import bench.report.compare

    a, b = _suite(tmp_path / "a"), _suite(tmp_path / "b")
    for code, status in ((errno.ENOSPC, 1), (errno.EROFS, 2)):
        def failing(path: Path, text: str, code: int = code) -> Path:
            raise OSError(code, os.strerror(code), str(path))

        monkeypatch.setattr(bench.report.compare.fmt, "write_text_atomic", failing)
        assert main(["compare", str(a), str(b), "--out", str(tmp_path / f"cmp{code}")]) == status
        _one_line(capsys, "cannot write", "compare.md", os.strerror(code))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_stdout_is_one_line() -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "bench", "presets"], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "bench: error: cannot write the output (standard output or a file) (No space left on device); free space "
        "there, or write elsewhere"]


def test_a_closed_stdout_is_not_a_traceback() -> None:
    """`bench presets >&-`: Python has no sys.stdout at all; the flush that catches a full stdout must not trip."""
    proc = subprocess.run([sys.executable, "-m", "bench", "presets"], stderr=subprocess.PIPE, text=True, timeout=120,
                          preexec_fn=lambda: os.close(1))  # the child starts with no fd 1, as after `>&-`
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_ctrl_c_while_the_command_line_loads_is_one_line(capsys: pytest.CaptureFixture,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.cli

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(bench.cli, "build_parser", interrupted)
    assert main(["presets"]) == 130
    assert capsys.readouterr().err == "bench: interrupted\n"


# -- nothing the suite did not make is replaced ------------------------------------------------------------------
def test_export_never_writes_over_files_and_never_over_its_own_data(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "gsm8k"
    data.mkdir()
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(
            {"question": f"What is {i} + {len(split)}?", "answer": f"#### {i + len(split)}"}) + "\n" for i in range(40)))
    reads_itself = ["data", "--preset", "cpu-quick", "task.source=gsm8k", f"task.path={data}", "model.source=path",
                    f"model.name_or_path={tmp_path}", "task.train_size=10", "task.test_size=5", "--export", str(data)]
    _refused(reads_itself, tmp_path, capsys, "--export", "already holds test.jsonl, train.jsonl", "new or empty")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "train.jsonl").write_text("my own rows\n")
    _refused(["data", "--preset", "cpu-quick", "--export", str(mine)], tmp_path, capsys, "already holds train.jsonl")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["data", "--preset", "cpu-quick", "--export", str(empty)]) == 0  # an empty folder is fine


def test_compare_writes_only_a_new_folder_or_its_own_earlier_one(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    a, b = _suite(tmp_path / "a"), _suite(tmp_path / "b")
    users = tmp_path / "users"
    users.mkdir()
    (users / "index.html").write_text("<p>my page</p>")
    _refused(["compare", str(a), str(b), "--out", str(users)], tmp_path, capsys, "already holds index.html")
    _refused(["compare", str(a), str(b), "--out", str(a / "cmp")], tmp_path, capsys, "lies inside the suite folder")
    out = tmp_path / "a-vs-b"
    assert main(["compare", str(a), str(b), "--out", str(out)]) == 0
    assert main(["compare", str(a), str(b), "--out", str(out)]) == 0  # its own earlier comparison is replaced
    assert sorted(p.name for p in out.iterdir()) == ["compare.md", "index.html"]


def test_compare_refuses_one_folder_given_twice(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = _suite(tmp_path / "reports" / "a")
    (tmp_path / "reports" / "latest").symlink_to("a")
    _refused(["compare", str(a), str(a), "--out", str(tmp_path / "o")], tmp_path, capsys, "is given twice")
    _refused(["compare", str(tmp_path / "reports" / "latest"), str(a), "--out", str(tmp_path / "o")], tmp_path,
             capsys, "is the same folder as")


def test_verdicts_replace_only_an_earlier_verdicts_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    completions = tmp_path / "c.jsonl"
    completions.write_text(json.dumps({"c": "#### 4", "g": "4"}) + "\n")
    suite = _suite(tmp_path / "s")
    score = ["score", str(completions), "--completion-field", "c", "--gold-field", "g", "--verdicts"]
    _refused(score + [str(suite / "suite.json")], tmp_path, capsys, "is not a verdicts file")
    verdicts = tmp_path / "v.jsonl"
    assert main(score + [str(verdicts)]) == 0
    assert main(score + [str(verdicts)]) == 0  # what it wrote before, it may write again
    assert json.loads(verdicts.read_text()) == {"line": 1, "extracted": "4", "gold": "4", "correct": True}


def test_latest_is_made_only_in_reports_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--out ~/myrun` must not create ~/latest: the link lives in REPORTS_DIR, beside the folders made there."""
    import bench.execution.runner
    import bench.report
    from test_runner_failures import FakeWorkers

    from bench.config.loading import load_spec

    monkeypatch.setattr(bench.report, "build_report", lambda d: (Path(d) / "index.html").write_text("r") and
                        Path(d) / "index.html")
    monkeypatch.setattr(bench.execution.runner, "launch_worker", FakeWorkers())
    spec = load_spec("cpu-quick")
    home, reports = tmp_path / "home", tmp_path / "home" / "reports"
    import io

    bench.execution.runner.run_suite(spec, home / "myrun", stream=io.StringIO(), latest_dir=reports)
    assert sorted(p.name for p in home.iterdir()) == ["myrun"]  # no home/latest
    bench.execution.runner.run_suite(spec, reports / "r1", stream=io.StringIO(), latest_dir=reports)
    assert os.readlink(reports / "latest") == "r1"


# -- bounded, decoded, named -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["run\n", "a\x1b[31mb", "tab\there"])
def test_a_new_folder_name_with_a_control_character_is_refused(name: str, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    for argv in (["run", "--preset", "cpu-quick", "--out", str(tmp_path / name), "--dry-run"],
                 ["data", "--preset", "cpu-quick", "--export", str(tmp_path / name / "splits")]):
        _refused(argv, tmp_path, capsys, "control character")


def test_a_suite_of_more_runs_than_any_plan_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A suite.json listing 200,000 run ids kept `bench report` busy for minutes; a plan that long is refused too."""
    from bench.results import MAX_RUNS

    huge = _suite(tmp_path / "huge", [f"r{i}" for i in range(MAX_RUNS + 1)])
    _refused(["report", str(huge)], tmp_path, capsys, f"at most {MAX_RUNS:,}")
    seeds = ",".join(str(s) for s in range(MAX_RUNS // 5 + 1))
    _refused(["run", "--preset", "cpu-quick", f"seeds=[{seeds}]", "--dry-run"], tmp_path, capsys, "runs; at most")


def test_an_empty_completions_file_is_not_a_zero_accuracy(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    empty = tmp_path / "c.jsonl"
    empty.write_text("\n\n")
    _refused(["score", str(empty), "--completion-field", "c", "--gold-field", "g"], tmp_path, capsys,
             "holds no completions")


def test_a_task_path_the_source_does_not_read_gets_a_note(capsys: pytest.CaptureFixture) -> None:
    assert main(["data", "--preset", "cpu-quick", "task.path=/data/my-gsm8k.jsonl"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    assert notes == ["note: task.path '/data/my-gsm8k.jsonl' is not read: task.source is 'synthetic' (set "
                     "task.source=gsm8k to train and test on that data)"]


def test_tune_runs_preflight_before_its_plan(tmp_path: Path, capsys: pytest.CaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.execution.preflight

    from bench.errors import UserError

    def failing(spec: object, suite_dir: object, notes: object = None) -> None:
        raise UserError("not enough free space (a stand-in for any preflight check)")

    monkeypatch.setattr(bench.execution.preflight, "preflight", failing)
    assert main(["tune", "--preset", "cpu-quick", "--out", str(tmp_path / "t")]) == 2
    assert capsys.readouterr().err == "bench: error: not enough free space (a stand-in for any preflight check)\n"


def test_a_suite_folder_is_never_written_inside_another(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`--out reports/a/runs/new` made a suite (and a `latest` link) inside suite a's runs/ folder."""
    outer = _suite(tmp_path / "a")
    _refused(["run", "--preset", "cpu-quick", "--out", str(outer / "runs" / "new"), "train.steps=1"], tmp_path,
             capsys, "lies inside the suite folder")


@pytest.mark.parametrize("text, key", [("train:\n  steps: 2\ntrain:\n  steps: 3\n", "train"),
                                       ("train: {steps: 2, steps: 3}\n", "steps")])
def test_a_key_given_twice_in_a_preset_is_refused(text: str, key: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    """YAML keeps the last of two equal keys silently: the second `train:` block replaced the first."""
    preset = tmp_path / "p.yaml"
    preset.write_text("extends: cpu-quick\n" + text)
    _refused(["run", "--preset", str(preset), "--dry-run"], tmp_path, capsys, f"key '{key}' is given twice")


def test_an_integer_beyond_any_count_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """train.steps=10**30 passed the >= 1 rule and printed a plan of 10**30 steps."""
    _refused(["run", "--preset", "cpu-quick", "--dry-run", f"train.steps={10**30}"], tmp_path, capsys,
             "'train.steps' is 1e+30, beyond any count")
