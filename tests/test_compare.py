"""`bench compare`: two suite folders side by side, environment differences first; a bad folder is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from report_fixtures import run_without_torch, write_suite

from bench.report.compare import compare


def _set_trl(suite: Path, version: str) -> None:
    """Every result of ``suite`` records ``version`` of trl (as a folder made with another TRL would)."""
    for path in (suite / "runs").glob("*/result.json"):
        data = json.loads(path.read_text())
        data["environment"]["packages"]["trl"] = version
        path.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("compare")
    a = write_suite(root, methods=("grpo", "ppo"), name="a")
    b = write_suite(root, methods=("grpo", "ppo", "dpo"), failed=("dpo",), name="b")
    _set_trl(b, "1.17.0")
    data = json.loads((b / "runs" / "grpo-s0" / "result.json").read_text())
    data["throughput"]["completions_per_s"] = 320.0  # twice a's
    (b / "runs" / "grpo-s0" / "result.json").write_text(json.dumps(data))
    out = root / "cmp"
    compare([a, b], out)
    return a, b, out


def test_environment_differences_come_first(pair: tuple[Path, Path, Path]) -> None:
    md = (pair[2] / "compare.md").read_text(encoding="utf-8")
    env = md.split("## Environment differences\n", 1)[1].split("\n## ", 1)[0]
    assert md.index("## Environment differences") < md.index("## Headline numbers")
    assert "| packages |" in env and "trl 1.16.0" in env and "trl 1.17.0" in env
    assert "| preset |" not in env  # the same in both: listed under 'in common'
    assert "| preset | cpu-tiny |" in md.split("## Environment in common", 1)[1]


def test_every_headline_number_and_its_difference(pair: tuple[Path, Path, Path]) -> None:
    md = (pair[2] / "compare.md").read_text(encoding="utf-8")
    rows = [line for line in md.splitlines() if line.startswith("| GRPO (TRL) |")]
    numbers = {line.split(" | ")[1]: line.split(" | ")[2:] for line in rows}
    assert numbers["completions/s of training (1/s)"] == ["160.00", "320.00", "+160.00 1/s, 2.00× |"]
    assert numbers["static memory, accounting (MiB)"][:2] == ["17.00", "17.00"]
    assert numbers["accuracy after (suite-strict)"][2].startswith("+0.0 pp")  # the row names its scoring mode
    assert any(line.startswith("| DPO (TRL, pool pairs) | accuracy after (suite-strict) | not in this run | failed |")
               for line in md.splitlines())
    assert "- Accuracy: every folder in suite-strict (" in md
    page = (pair[2] / "index.html").read_text(encoding="utf-8")
    assert "Environment differences" in page and "+160.00 1/s, 2.00×" in page
    assert "http://" not in page and "https://" not in page and "<img" not in page  # self-contained


def test_bad_folder_is_one_line_exit_2(tmp_path: Path, pair: tuple[Path, Path, Path]) -> None:
    (tmp_path / "empty").mkdir()
    proc = run_without_torch(tmp_path, "compare", str(pair[0]), str(tmp_path / "empty"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "no suite.json" in proc.stderr


def test_bench_compare_runs_where_torch_cannot_be_imported(tmp_path: Path, pair: tuple[Path, Path, Path]) -> None:
    proc = run_without_torch(tmp_path, "compare", str(pair[0]), str(pair[1]), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "index.html").is_file() and (tmp_path / "out" / "compare.md").is_file()


def test_folders_with_different_headline_modes_compare_in_one_mode(tmp_path: Path) -> None:
    a = write_suite(tmp_path, methods=("grpo",), name="a")
    b = write_suite(tmp_path, methods=("grpo",), name="b")
    (b / "report_settings.json").write_text(json.dumps({"headline_mode": "suite-flexible"}), encoding="utf-8")
    compare([a, b], tmp_path / "cmp")
    md = (tmp_path / "cmp" / "compare.md").read_text(encoding="utf-8")
    # Both folders in a's headline mode (suite-strict: 160 of 400), so the difference is like for like: 0.
    row = next(line for line in md.splitlines() if line.startswith("| GRPO (TRL) | accuracy after (suite-strict) |"))
    assert row.split(" | ")[2].startswith("40.0%") and row.split(" | ")[3].startswith("40.0%")
    assert row.split(" | ")[4].startswith("+0.0 pp")
    assert "- b: its own headline mode is suite-flexible; compared here in suite-strict, like for like." in md
