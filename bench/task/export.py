"""`bench data`: show, and optionally export, the exact train, validation and test splits a preset uses.

    bench data --preset NAME [key.path=value ...] [--export DIR]

Prints one line per split (its problem count, and the file it went to with ``--export``), then the overlap checks
(`bench.task.data.TaskData.checks`) and any notes from loading. ``--export DIR`` writes ``DIR/train.jsonl`` and
``DIR/test.jsonl`` in GSM8K's layout, one ``{"question", "answer"}`` object a line, in the order the suite loads
them (after ``task.train_size`` / ``task.test_size``; training runs then shuffle the train rows per seed). The
files load back as a GSM8K source (``task.source=gsm8k task.path=DIR``), so anyone can inspect or reuse them. DIR
must be new or empty (:func:`check_export_folder`): the export never writes over files it did not make.

With a validation split (``task.validation_size`` > 0, as `bench tune` uses) it is written too, to
``DIR/validation.jsonl``, and ``train.jsonl`` holds the training problems left once it is carved out. With
``eval.split=validation`` (a tuning run's settings) the test split is not loaded, so it is neither counted nor
written: the line says so.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.errors import UserError
from bench.results import write_atomic

SPLITS = ("train", "validation", "test")
"""The splits printed and written, in this order, each to ``DIR/<split>.jsonl`` (validation only when the preset has
one, test unless evaluation reads validation)."""


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `bench data` (used by bench.cli)."""
    parser.add_argument("--preset", required=True, help="preset name (see `bench presets`) or a YAML file")
    parser.add_argument("--export", metavar="DIR",
                        help="write DIR/train.jsonl, DIR/test.jsonl and, when task.validation_size > 0, "
                             "DIR/validation.jsonl (GSM8K columns question, answer)")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value",
                        help="spec overrides, e.g. task.test_size=100")


def write_jsonl_atomic(path: Path, rows: list[dict[str, str]]) -> None:
    """Write ``rows`` as JSON Lines atomically (bench.results.write_atomic): a reader never sees a half-written file.

    Raises OSError when the folder cannot be written; a failure leaves any earlier file at ``path`` as it was.
    """
    write_atomic(path, lambda handle: handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def export_splits(splits: dict[str, list[dict[str, str]]], folder: Path) -> dict[str, Path]:
    """Write each split to ``folder/<name>.jsonl`` (GSM8K columns only, other keys dropped); returns the paths.

    ``folder`` is created when missing. Raises UserError (one line) when it cannot be created or written.
    """
    folder = Path(folder)
    paths = {name: folder / f"{name}.jsonl" for name in splits}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, problems in splits.items():
            write_jsonl_atomic(paths[name], [{"question": p["question"], "answer": p["answer"]} for p in problems])
    except OSError as exc:
        where = f" at {exc.filename}" if exc.filename and Path(exc.filename) != folder else ""
        raise UserError(f"cannot write the splits to {folder} ({exc.strerror or type(exc).__name__}{where}); "
                        f"give --export a folder you can write to") from None
    return paths


def check_export_folder(value: str | Path) -> Path:
    """``--export`` as a folder the splits may go into: a new or an empty one that can be written (UserError, one
    line, otherwise). A folder holding files is refused, even train.jsonl and test.jsonl: they may be a GSM8K copy
    of the user's, or the very files the preset reads, which the export would replace with a cut of themselves."""
    from bench.config.outputs import check_fresh_folder, check_writable
    from bench.config.paths import check_path

    hint = "give a new or empty folder, e.g. --export /tmp/splits"
    folder = check_path(value, "out-dir", "--export", hint=hint)
    check_fresh_folder(folder, "--export", hint)
    return check_writable(folder, "--export", hint)


def _checks_line(checks: dict[str, int | str]) -> str:
    """``checks: working_overlap 0, question_overlap 0 (held out by working: ...)``."""
    counts = ", ".join(f"{key} {value}" for key, value in checks.items() if key.endswith("_overlap"))
    held_out_by = checks.get("held_out_by")
    return f"checks: {counts or 'none'}" + (f" (held out by {held_out_by})" if held_out_by else "")


def loaded_splits(spec: Any, data: Any) -> dict[str, list[dict[str, str]]]:
    """Split name -> problems as ``bench.task.data.load_task`` returned them (``data``, a TaskData): train always,
    validation when ``task.validation_size`` > 0, test unless evaluation reads validation (then it was not loaded)."""
    splits = {"train": data.train}
    if spec.task.validation_size:
        splits["validation"] = data.validation
    if data.eval_split != "validation":
        splits["test"] = data.test
    return splits


def run_data(args: argparse.Namespace) -> int:
    """`bench data`: load the preset's splits as every run does, print counts and checks, export on request.

    Returns the exit status (0); a bad preset, override or data, or an unwritable ``--export`` folder, raises
    UserError, which the CLI prints as one line with exit status 2.
    """
    from bench.task.data import load_task  # the spec and task modules are loaded only when the command runs
    from bench.config.loading import load_spec

    folder = check_export_folder(args.export) if args.export else None  # before the data is read
    spec = load_spec(args.preset, args.overrides)
    data = load_task(spec)
    splits = loaded_splits(spec, data)
    paths = export_splits(splits, folder) if folder is not None else {}
    for name in SPLITS:
        if name in splits:
            print(f"{name}: {len(splits[name])} problems" + (f" -> {paths[name]}" if name in paths else ""))
        elif name == "test" and data.eval_split == "validation":
            print("test: not loaded (eval.split is validation: the test split is never read)")
    print(_checks_line(data.checks))
    for note in data.notes:
        print(f"note: {note}")
    return 0
