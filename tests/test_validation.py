"""Every value validated before any work starts, data checked before the suite folder exists, output
safety (free space, atomic report files) and bounded text in the report.

Each failure is one line naming the key (or the file) and what is allowed; through the CLI it is exit status 2
and no suite folder.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from bench_cli import run_bench
from spec_errors import spec_error

from bench.execution import preflight as pf
from bench.errors import UserError
from bench.config.registry import METHODS, recipe
from bench.results import empty_result, write_json_atomic
from bench.config.spec import Spec
from bench.config.rules import SPEC_RULES
from bench.config.loading import load_spec

# ----------------------------------------------------------------------------------------------
# Helpers


def _numeric_leaves(cls: type, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> type of every int/float field (also optional and list ones) under a spec dataclass."""
    out: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], f"{prefix}{f.name}"
        if key == "methods":
            continue  # recipes check their own Config (test_every_numeric_method_field_has_a_range)
        if dataclasses.is_dataclass(tp):
            out.update(_numeric_leaves(tp, key + "."))
            continue
        args = set(typing.get_args(tp)) | {tp}
        if args & {int, float} or any(typing.get_args(a) and set(typing.get_args(a)) & {int, float} for a in args):
            out[key] = tp
    return out


def _assert_one_error_line(proc: Any) -> str:
    """Exit 2, no traceback, exactly one `bench: error:` line, the last one; returns it."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert sum(line.startswith("bench: error:") for line in lines) == 1, proc.stderr[-2000:]
    assert lines[-1].startswith("bench: error: ")
    return lines[-1]


# ----------------------------------------------------------------------------------------------
# Sizes, counts, rates and choices: one table, every number in it


def test_every_numeric_spec_field_has_a_rule() -> None:
    leaves = _numeric_leaves(Spec)
    text_rules = {"train.lora.target_modules"}  # the table also holds rules for a few free-text fields
    assert set(leaves) == set(SPEC_RULES) - text_rules, "a numeric spec field without its rule (or a rule for no field)"


@pytest.mark.parametrize("key", [k for k in SPEC_RULES
                                 if k not in ("seeds", "gpus", "task.synthetic.seed", "train.lora.target_modules")])
def test_every_rule_refuses_a_negative_value_naming_the_key(key: str) -> None:
    message = spec_error([f"{key}=-1"])
    assert message.startswith(f"'{key}' must be ")
    assert message.endswith((", got -1", ", got -1.0"))


@pytest.mark.parametrize("key, value, allowed", [
    ("train.steps", "0", "must be >= 1"),
    ("train.steps", "-3", "must be >= 1"),
    ("train.prompts_per_step", "0", "must be >= 1"),
    ("task.train_size", "0", "must be >= 1"),
    ("task.test_size", "0", "must be >= 1"),
    ("warm_start.steps", "0", "must be >= 1"),
    ("warm_start.batch_size", "0", "must be >= 1"),
    ("eval.batch_size", "0", "must be >= 1"),
    ("eval.max_new_tokens", "0", "must be >= 1"),
    ("sample_pool.batch_size", "0", "must be >= 1"),
    ("sample_pool.prompts", "0", "must be >= 1"),
    ("sample_pool.samples_per_prompt", "1", "must be >= 2 to form (correct, incorrect) pairs"),
    ("reward_model.epochs", "0", "must be >= 1"),
    ("reward_model.batch_size", "0", "must be >= 1"),
    ("model.tiny.vocab_size", "0", "must be >= 258 (256 byte tokens + <pad> + <eos>)"),
    ("model.tiny.num_layers", "0", "must be >= 1"),
    ("model.scale.num_layers", "0", "must be >= 1 (or null: every layer)"),
    ("train.lora.r", "0", "must be >= 1"),
    ("train.log_every", "0", "must be >= 1"),
    ("parallel_runs", "0", "must be >= 1 or auto (one run per free GPU)"),
    ("task.synthetic.max_operand", "0", "must be >= 1"),
])
def test_sizes_and_counts(key: str, value: str, allowed: str) -> None:
    assert spec_error([f"{key}={value}"]) == f"'{key}' {allowed}, got {value}"


@pytest.mark.parametrize("key, value, expected", [
    ("train.learning_rate", "-1e-4", "'train.learning_rate' must be >= 0, got -0.0001"),
    ("warm_start.learning_rate", "-1", "'warm_start.learning_rate' must be >= 0, got -1.0"),
    ("reward_model.learning_rate", "nan", "'reward_model.learning_rate' must be >= 0, got nan"),
    ("train.kl_beta", "inf", "'train.kl_beta' must be >= 0, got inf"),
    ("train.max_grad_norm", "0", "'train.max_grad_norm' must be > 0"),
    ("generation.temperature", "0", "'generation.temperature' must be > 0, got 0.0"),
    ("generation.top_p", "1.5", "'generation.top_p' must be in (0, 1], got 1.5"),
    ("generation.top_p", "0", "'generation.top_p' must be in (0, 1], got 0.0"),
    ("reward_model.eval_fraction", "1", "'reward_model.eval_fraction' must be in (0, 1), got 1.0"),
    ("reward.length_penalty", "-0.5", "'reward.length_penalty' must be >= 0, got -0.5"),
    ("telemetry.sample_interval_ms", "0", "'telemetry.sample_interval_ms' must be > 0, got 0.0"),
    ("seeds", "[-1]", "'seeds' must list at least one seed, each in [0, 4294967295], got [-1]"),
    ("seeds", "[]", "'seeds' must list at least one seed, each in [0, 4294967295], got []"),
])
def test_rates_and_ranges(key: str, value: str, expected: str) -> None:
    assert spec_error([f"{key}={value}"]).startswith(expected)


@pytest.mark.parametrize("override, expected", [
    ("methods.grpo.loss_type=nope", "'methods.grpo.loss_type' must be one of 'grpo', 'bnpo', 'dapo', 'dr_grpo', "
                                    "got 'nope'"),
    ("methods.grpo_engine.loss_type=nope", "'methods.grpo_engine.loss_type' must be one of"),
    ("methods.grpo_engine.advantage_std=sample", "'methods.grpo_engine.advantage_std' must be one of"),
    ("methods.dpo.loss_type=nope", "'methods.dpo.loss_type' has unknown loss nope; use one of sigmoid"),
    ("methods.ppo.reward=human", "'methods.ppo.reward' must be one of 'model', 'verifier', got 'human'"),
    ("methods.ppo.kl_estimator=k2", "'methods.ppo.kl_estimator' must be one of"),
    ("methods.ppo.loss_aggregation=sum", "'methods.ppo.loss_aggregation' must be one of"),
    ("train.lr_scheduler=step", "'train.lr_scheduler' must be one of 'constant', 'linear', 'cosine', got 'step'"),
    ("sample_pool.pairs=random", "'sample_pool.pairs' must be one of 'verifier', 'gold', got 'random'"),
    ("device=tpu", "'device' must be one of 'auto', 'cpu', 'cuda', got 'tpu'"),
    ("model.dtype=float16", "'model.dtype' must be one of 'float32', 'bfloat16', got 'float16'"),
])
def test_choices(override: str, expected: str) -> None:
    assert spec_error([override]).startswith(expected)


def _method_numeric_fields() -> list[tuple[str, str]]:
    out = []
    for method in METHODS:
        cls = recipe(method).Config
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            args = set(typing.get_args(hints[f.name])) | {hints[f.name]}
            if args & {int, float}:
                out.append((method, f.name))
    return out


@pytest.mark.parametrize("method, name", _method_numeric_fields())
@pytest.mark.parametrize("value", ["-1", "nan"])
def test_every_numeric_method_field_has_a_range(method: str, name: str, value: str) -> None:
    """A recipe's validate covers each number of its Config: a new field without a rule fails here."""
    message = spec_error([f"methods.{method}.enabled=true", f"methods.{method}.{name}={value}"])  # control is opt-in
    assert message.startswith(f"'methods.{method}.{name}' must be "), message
    assert message.endswith((f"got {value}", f"got {float(value)}", f"got '{value}'")), message


@pytest.mark.parametrize("override, expected", [
    ("methods.ppo.minibatches=0", "'methods.ppo.minibatches' must be >= 1, got 0"),
    ("methods.grpo_engine.ppo_epochs=0", "'methods.grpo_engine.ppo_epochs' must be >= 1, got 0"),
    ("methods.ppo.cliprange=0", "'methods.ppo.cliprange' must be > 0, got 0.0"),
    ("methods.ppo.gamma=1.5", "'methods.ppo.gamma' must be in [0, 1], got 1.5"),
    ("methods.ppo.missing_eos_penalty=-1", "'methods.ppo.missing_eos_penalty' must be >= 0, got -1.0"),
    ("methods.dpo.beta=0", "'methods.dpo.beta' must be > 0, got 0.0"),
    ("methods.grpo.learning_rate=-1e-6", "'methods.grpo.learning_rate' must be >= 0, got -1e-06"),
])
def test_method_configs(override: str, expected: str) -> None:
    assert spec_error([override]) == expected


def test_a_disabled_method_is_not_checked() -> None:
    """Its settings are never used: a preset may leave them at anything while the method is off."""
    assert "ppo" not in load_spec("cpu-quick", ["methods.ppo.minibatches=0", "methods.ppo.enabled=false"]
                                  ).enabled_methods()


def test_odd_head_width_of_the_tiny_model_is_refused() -> None:
    message = spec_error(["model.tiny.hidden_size=30", "model.tiny.num_heads=2"])
    assert "'model.tiny.hidden_size' / 'model.tiny.num_heads' (30 / 2) must be even" in message


def test_shipped_presets_pass_every_rule() -> None:
    from bench.config.loading import preset_names

    for name in preset_names():
        load_spec(name)


@pytest.mark.parametrize("args, expected", [
    (["--dry-run", "eval.batch_size=0"], "bench: error: 'eval.batch_size' must be >= 1, got 0"),
    (["methods.ppo.minibatches=0"], "bench: error: 'methods.ppo.minibatches' must be >= 1, got 0"),
    (["methods.grpo.loss_type=nope"], "bench: error: 'methods.grpo.loss_type' must be one of"),
])
def test_cli_refuses_a_bad_value_before_anything_starts(tmp_path: Path, args: list[str], expected: str) -> None:
    out = tmp_path / "suite"
    proc = run_bench("run", "--preset", "cpu-quick", "--out", str(out), *args, timeout=120)
    line = _assert_one_error_line(proc)
    assert len(proc.stderr.strip().splitlines()) == 1  # refused before the plan is printed
    assert line.startswith(expected)
    assert not out.exists()


# ----------------------------------------------------------------------------------------------
# Data: loaded and checked by preflight, before the suite folder exists

GOOD = [{"question": f"Tom has {i} pens and buys 2 more. How many?", "answer": f"{i}+2={i + 2}\n#### {i + 2}"}
        for i in range(100)]


def _lines(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode("utf-8")


def _model_folder(root: Path) -> Path:
    """What preflight and validation need of a local model folder (no weights are loaded before the runs)."""
    folder = root / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (folder / "tokenizer.json").write_text("{}")
    return folder


def _gsm8k_overrides(data: Path, model: Path) -> list[str]:
    return ["task.source=gsm8k", f"task.path={data}", "task.train_size=50", "task.test_size=20",
            "model.source=path", f"model.name_or_path={model}"]


BAD_TRAIN_FILES: dict[str, tuple[bytes, str]] = {
    "missing column": (_lines(GOOD[:3] + [{"question": "q", "solution": "#### 1"}] + GOOD[3:]),
                       "train.jsonl:4: no 'answer' column (the row has 'question', 'solution')"),
    "bad gold": (_lines(GOOD[:90] + [{"question": "q", "answer": "about 5"}] * 3),
                 "train.jsonl: 3 of 93 rows have no usable gold answer, more than the 1% allowed (first: "),
    "empty": (b"", "train.jsonl: no rows (the 'train' split is empty)"),
    "not UTF-8": (_lines(GOOD[:2]) + '{"question": "Zoë", "answer": "#### 1"}\n'.encode("latin-1"),
                  "train.jsonl:3: not UTF-8 text (byte 0xeb"),
    "not JSON": (_lines(GOOD[:5]) + b"question,answer\n", "train.jsonl:6: not a JSON line"),
}


def _data_folder(root: Path, train: bytes) -> Path:
    data = root / "gsm8k"
    data.mkdir()
    (data / "train.jsonl").write_bytes(train)
    (data / "test.jsonl").write_bytes(_lines(GOOD[:20]))
    return data


@pytest.mark.parametrize("problem", list(BAD_TRAIN_FILES))
def test_each_data_problem_is_one_line_naming_the_file(tmp_path: Path, problem: str) -> None:
    content, expected = BAD_TRAIN_FILES[problem]
    data = _data_folder(tmp_path, content)
    spec = load_spec("cpu-quick", _gsm8k_overrides(data, _model_folder(tmp_path)))
    out = tmp_path / "suite"
    with pytest.raises(UserError) as info:
        pf.preflight(spec, out)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(data / "train.jsonl")), message
    assert expected in message
    assert not out.exists()


def test_a_data_problem_through_the_cli_is_exit_2_and_no_folder(tmp_path: Path) -> None:
    content, expected = BAD_TRAIN_FILES["bad gold"]
    data = _data_folder(tmp_path, content)
    out = tmp_path / "suite"
    proc = run_bench("run", "--preset", "cpu-quick", "--out", str(out),
                     *_gsm8k_overrides(data, _model_folder(tmp_path)), timeout=120)
    line = _assert_one_error_line(proc)
    assert f"{data / 'train.jsonl'}: 3 of 93 rows" in line and expected in line
    assert not out.exists()


def test_a_few_bad_rows_are_dropped_and_said(tmp_path: Path) -> None:
    data = _data_folder(tmp_path, _lines(GOOD[:99] + [{"question": "q", "answer": "no number"}]))
    spec = load_spec("cpu-quick", _gsm8k_overrides(data, _model_folder(tmp_path)))
    from bench.task.data import task_problems

    notes = pf.check_task_data(spec)
    assert notes == [f"{data / 'train.jsonl'}: dropped 1 of 100 rows without a usable gold answer (first: "
                     f"{data / 'train.jsonl'}:100: answer has no '#### N' line: 'no number')",
                     f"{data / 'test.jsonl'}: 20 of 20 test questions also occur in {data / 'train.jsonl'} (same "
                     f"text up to whitespace and case), so they are not held out"]  # this fixture reuses train rows
    train, test = task_problems(spec)  # what the workers get: the same rows, the bad one left out
    assert train == GOOD[:50] and test == GOOD[:20]


def test_the_synthetic_task_is_checked_too(tmp_path: Path) -> None:
    spec = load_spec("cpu-quick", ["task.synthetic.max_operand=1", "task.train_size=2000"])  # ~1,400 exist
    with pytest.raises(UserError, match="synthetic task cannot make"):
        pf.preflight(spec, tmp_path / "suite")
    assert not (tmp_path / "suite").exists()


# ----------------------------------------------------------------------------------------------
# Free space


def _disk_with(free: int) -> Any:
    """A stand-in for shutil.disk_usage reporting ``free`` bytes free."""
    return lambda path: types.SimpleNamespace(total=10 * free, used=9 * free, free=free)


def test_too_little_free_space_is_one_line_saying_what_to_free(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_spec("cpu-quick")
    need, _ = pf.estimate_output_bytes(spec, tmp_path / "suite")
    monkeypatch.setattr(pf.shutil, "disk_usage", _disk_with(10 * 2**20))
    with pytest.raises(UserError) as info:
        pf.preflight(spec, tmp_path / "suite")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"not enough free space for '{tmp_path / 'suite'}': the run writes about ")
    assert "2 model checkpoint(s)" in message and "10.0 MiB free" in message
    assert f"free {(need - 10 * 2**20) / 2**20:.1f} MiB there" in message and "--out" in message
    assert not (tmp_path / "suite").exists()


def test_enough_free_space_passes_and_the_estimate_scales_with_the_model(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    tiny, _ = pf.estimate_output_bytes(load_spec("cpu-quick"), tmp_path)
    assert tiny < 128 * 2**20  # two checkpoints of a few hundred KiB plus the margin
    real, what = pf.estimate_output_bytes(load_spec("systems-qwen0.5b"), tmp_path)
    assert real > 2 * 494_000_000 * 4 and "~1.8 GiB" in what  # Qwen2.5-0.5B: 494 M parameters, float32
    monkeypatch.setattr(pf.shutil, "disk_usage", _disk_with(tiny))
    pf.check_free_space(load_spec("cpu-quick"), tmp_path / "suite")


def test_checkpoints_already_written_are_not_counted_again(tmp_path: Path) -> None:
    spec = load_spec("systems-qwen0.5b")
    fresh, _ = pf.estimate_output_bytes(spec, tmp_path)
    (tmp_path / "runs" / "warm_start" / "model").mkdir(parents=True)  # a resumed suite's finished stage
    resumed, what = pf.estimate_output_bytes(spec, tmp_path)
    assert resumed < fresh and what.startswith("1 model checkpoint(s)")


# ----------------------------------------------------------------------------------------------
# The report: bounded text, atomic files

PAGE_LIMIT = 512 * 1024
"""index.html of a suite with a 1 MB completion and a 200 kB error stays under this."""


def _suite_with_huge_text(root: Path) -> Path:
    suite = root / "suite"
    runs = ["warm_start", "grpo-s0", "dpo-s0"]
    write_json_atomic(suite / "suite.json", {"preset": "cpu-quick", "description": "huge text", "runs": runs,
                                             "spec": {"preset": "cpu-quick"}})
    huge = "x" * 1_000_000
    for run_id, method, status in (("warm_start", "warm_start", "failed"), ("grpo-s0", "grpo", "ok"),
                                   ("dpo-s0", "dpo", "failed")):
        result = empty_result(run_id, "stage" if run_id == "warm_start" else "method", method, method, "trl", 0)
        result["status"] = status
        if status == "failed":
            result["error"] = {"type": "RuntimeError", "message": "boom | " + "log line\n" * 20_000}
        result["samples"] = [{"question": huge, "completion": huge, "gold": "4", "correct": False}] * 3
        write_json_atomic(suite / "runs" / run_id / "result.json", result)
    return suite


def test_a_1mb_completion_and_a_200kb_error_keep_the_report_small(tmp_path: Path) -> None:
    from bench.report import build_report
    from bench.report.fmt import TEXT_LIMIT, cap_text

    suite = _suite_with_huge_text(tmp_path)
    build_report(suite)
    page = (suite / "index.html").read_text(encoding="utf-8")
    assert len(page.encode("utf-8")) < PAGE_LIMIT
    assert f"… ({1_000_000 - TEXT_LIMIT:,} more characters)" in page  # the completion, cut and said so
    assert "more characters)" in (suite / "summary.md").read_text(encoding="utf-8")  # the error
    for name in ("summary.md", "results.csv"):
        assert (suite / name).stat().st_size < 64 * 1024, name
    assert (suite / "index.html").stat().st_mode & 0o777 == 0o644  # readable like any written file, not 0600
    assert cap_text("abc", 5) == "abc"
    assert cap_text("abcdefg", 5) == "abcde… (2 more characters)"


class _FullDisk:
    """A file handle on a full disk: opening works, writing fails as the kernel says it does (ENOSPC)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def __enter__(self) -> "_FullDisk":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.handle.close()

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


_REAL_FDOPEN = os.fdopen


def _full_disk_fdopen(fd: int, *args: Any, **kwargs: Any) -> _FullDisk:
    return _FullDisk(_REAL_FDOPEN(fd, *args, **kwargs))


def test_report_files_are_replaced_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebuild that fails mid-way (here: a full disk on the rename) leaves the old files whole, no temp files."""
    from bench import results
    from bench.report import build_report

    suite = _suite_with_huge_text(tmp_path)
    build_report(suite)
    before = {name: (suite / name).read_bytes() for name in ("index.html", "summary.md", "results.csv")}
    figures = sorted(p.name for p in (suite / "figures").glob("*.png"))

    monkeypatch.setattr(results.os, "fdopen", _full_disk_fdopen)  # every atomic write: bench.results.write_atomic
    with pytest.raises(OSError) as info:
        build_report(suite)
    assert info.value.errno == errno.ENOSPC
    assert {name: (suite / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in (suite / "figures").glob("*.png")) == figures
    leftovers = [p.name for p in suite.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]
    assert leftovers == []
