"""--resume of a suite folder written before a spec key existed: the missing key is read as its default (how that
folder ran), so the folder continues; a real change of the spec is still refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.config.loading import load_spec
from bench.errors import UserError
from bench.execution.suite_folder import backfilled, check_suite_dir, prepare_suite_dir
from bench.execution.plan import make_plan
from bench.results import SUITE_FILE


def _older_folder(tmp_path: Path) -> Path:
    """A cpu-quick suite folder whose suite.json predates the scheduler block and GRPO's successors."""
    spec = load_spec("cpu-quick")
    suite_dir = tmp_path / "suite"
    prepare_suite_dir(spec, suite_dir, make_plan(spec), resume=False)
    meta = json.loads((suite_dir / SUITE_FILE).read_text(encoding="utf-8"))
    del meta["spec"]["scheduler"]
    for name in ("rloo", "dapo", "gspo"):
        del meta["spec"]["methods"][name]
    (suite_dir / SUITE_FILE).write_text(json.dumps(meta), encoding="utf-8")
    return suite_dir


def test_a_folder_from_before_a_key_existed_resumes(tmp_path: Path) -> None:
    suite_dir = _older_folder(tmp_path)
    check_suite_dir(load_spec("cpu-quick"), suite_dir, resume=True)  # no error: the missing keys are defaults


def test_a_real_change_is_still_refused(tmp_path: Path) -> None:
    suite_dir = _older_folder(tmp_path)
    with pytest.raises(UserError, match=r"the spec differs .*train\.steps"):
        check_suite_dir(load_spec("cpu-quick", ["train.steps=3"]), suite_dir, resume=True)
    with pytest.raises(UserError, match=r"the spec differs .*scheduler"):
        check_suite_dir(load_spec("cpu-quick", ["scheduler.name=ray"]), suite_dir, resume=True)


def test_backfill_fills_missing_keys_only() -> None:
    defaults = {"a": 1, "b": {"c": 2, "d": 3}, "e": {"f": 4}}
    assert backfilled({"b": {"c": 9}, "x": 0}, defaults) == {"b": {"c": 9, "d": 3}, "x": 0, "a": 1, "e": {"f": 4}}
