"""The real GSM8K shipped in the package (task.source: gsm8k-bundled, bench.task.bundled): counts, content hash,
licence and provenance, the loader's path, and that nothing reads the shared data folder at run or test time."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from bench.task import bundled
from bench.task.problems import read_gsm8k

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("split, count", [("train", 7473), ("test", 1319)])
def test_the_bundled_splits_have_gsm8ks_counts_and_hashes(split: str, count: int) -> None:
    text = bundled.bundled_text(split)
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == bundled.EXPECTED[split][1]
    assert bundled.EXPECTED[split][0] == count
    loaded = read_gsm8k(bundled.BUNDLED_PATH, split)
    assert len(loaded.problems) == loaded.rows == count and loaded.dropped == 0
    assert loaded.source == str(bundled.DATA_DIR / f"{split}.jsonl.gz")


def test_licence_and_provenance_travel_with_the_files() -> None:
    folder = bundled.DATA_DIR
    assert folder.parent == Path(bundled.__file__).resolve().parent  # package data, not a path outside the repo
    assert (folder / "LICENSE").read_text().startswith("MIT License")
    provenance = (folder / "PROVENANCE.md").read_text()
    for split, (count, digest) in bundled.EXPECTED.items():
        assert f"{count:,}" in provenance and digest in provenance, split
    assert "openai/grade-school-math" in provenance
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"bench.task" = ["gsm8k_data/*.jsonl.gz", "gsm8k_data/LICENSE", "gsm8k_data/PROVENANCE.md"]' in pyproject


def test_the_first_test_problem_is_gsm8ks() -> None:
    first = read_gsm8k(bundled.BUNDLED_PATH, "test", limit=1).problems[0]
    assert first["question"].startswith("Janet\u2019s ducks lay 16 eggs per day.")
    assert first["answer"].endswith("#### 18")


def test_a_preset_reads_it_through_the_gsm8k_loader_with_its_checks() -> None:
    from bench.config.loading import load_spec
    from bench.task.data import load_task, tokenizer_corpus

    spec = load_spec("cpu-quick", ["model.source=hub", "model.name_or_path=some/model", "task.source=gsm8k-bundled",
                                   "task.train_size=7473", "task.test_size=1319"])
    data = load_task(spec)
    assert (len(data.train), len(data.test)) == (7473, 1319)
    assert data.checks["question_overlap"] == 0 and data.checks["held_out_by"] == "source: its train and test files"
    assert not data.notes
    assert len(tokenizer_corpus(spec)) == 7473  # the training side only
    carved = load_task(load_spec("cpu-quick", ["model.source=hub", "model.name_or_path=some/model",
                                               "task.source=gsm8k-bundled", "task.validation_size=100",
                                               "task.train_size=500", "task.test_size=50"]))
    assert (len(carved.train), len(carved.validation), len(carved.test)) == (500, 100, 50)


def test_the_hub_error_offers_the_bundled_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.errors import UserError
    from bench.task import problems

    class Unreachable:
        @staticmethod
        def load_dataset(*args: object, **kwargs: object) -> None:
            raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (ConnectionError)")

    monkeypatch.setitem(__import__("sys").modules, "datasets", Unreachable)
    with pytest.raises(UserError) as info:
        problems.read_gsm8k("openai/gsm8k", "test")
    assert "task.source=gsm8k-bundled" in str(info.value) and "\n" not in str(info.value)


def test_nothing_in_the_package_or_tests_reads_the_shared_folder() -> None:
    """The suite must run and test without ../shared: no code path names it."""
    needle = "/".join(("shared", "data"))  # spelled so this file does not match itself
    for top in ("bench", "baselines", "tests", "scripts"):
        for path in (REPO / top).rglob("*"):
            if path.suffix in (".py", ".sh", ".yaml") and path.is_file():
                assert needle not in path.read_text(encoding="utf-8", errors="replace"), path
