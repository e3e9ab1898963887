"""`bench score`: score completions with the suite's verifier, a JSON Lines file or a whole suite folder.

    bench score FILE.jsonl --completion-field F --gold-field G [--mode MODE] [--verdicts OUT.jsonl]
    bench score SUITE_DIR [--mode MODE]

A file: each line's gold field may be a bare number (``"18"``, ``"1,000"``) or a GSM8K worked answer ending in
``#### N``; prints ``accuracy: 0.xxxx (n/N) [mode]``. Useful to score another harness's generations exactly the
way the suite scores its own (``--mode lmeval-strict`` agrees with lm-evaluation-harness line by line when the gold
field holds the whole worked answer, lm-eval's reference).

A suite folder (one with suite.json): every run's completions.jsonl is re-scored under every mode in MODES (its
``extracted`` and ``correct`` rewritten), each result.json's accuracy scores and format rate follow, MODE becomes
the folder's headline mode (report_settings.json), the report is rebuilt, and one line per run gives its accuracy
under MODE. Runs from before completions were kept (eval_after.jsonl: verdicts without text) are left as they are.
MODE is one of bench.task.verifier.MODES; the old names ``strict`` and ``flexible`` mean suite-strict and
suite-flexible.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

from bench.config.paths import check_path, check_suite_folder, decode_text, inside, shown
from bench.results import SUITE_FILE
from bench.task.export import write_jsonl_atomic
from bench.errors import UserError
from bench.task.problems import gold_number
from bench.task.verifier import HEADLINE_MODE, MODE_ALIASES, MODE_DESCRIPTIONS, MODES, judge, normalize_number, resolve_mode


def _gold(value: object, path: Path, line: int, field: str) -> str:
    """The canonical gold number of one line's gold field (bare number or ``... #### N``)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UserError(f"{path}:{line}: gold field '{field}' must be a number or a string, got {type(value).__name__}")
    text = str(value)
    gold = normalize_number(text)
    if gold is None and "####" in text:
        try:
            gold = gold_number(text)
        except ValueError:
            gold = None
    if gold is None:
        raise UserError(f"{path}:{line}: gold field '{field}' is not a number or a '#### N' answer: "
                        f"{text[-40:]!r}; fix the line or pick another --gold-field")
    return gold


def _json_objects(path: Path, what: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line of the JSON Lines file ``path`` (1-based numbers).

    Raises UserError naming the file and line for a line that is not one JSON object; ``what`` says what each
    line should be, for that message.
    """
    try:
        handle = path.open("rb")  # bytes: each line is decoded on its own, so a bad byte is named by its line
    except OSError as exc:
        raise UserError(f"{shown(path)}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    with handle:
        for number, data in enumerate(handle, start=1):
            raw = decode_text(data, shown(path), first_line=number)
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise UserError(f"{shown(path)}:{number}: not valid JSON ({exc.msg}); each line must be {what}") from None
            except RecursionError:
                raise UserError(f"{shown(path)}:{number}: JSON nested too deeply; each line must be {what}") from None
            if not isinstance(row, dict):
                raise UserError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}; "
                                f"each line must be {what}")
            yield number, row


def score_file(path: Path, completion_field: str, gold_field: str, mode: str,
               verdicts_out: Path | None) -> tuple[int, int]:
    """Score every line of ``path``; returns ``(correct, total)``.

    Each non-blank line is one JSON object holding ``completion_field`` (the text) and ``gold_field``.
    Blank lines are skipped. ``verdicts_out``, if given, receives one JSON line per scored line:
    ``{"line": i, "extracted": str | None, "gold": str, "correct": bool}`` with ``i`` the 1-based line
    number in ``path``. Raises UserError (one line, with the line number) for a missing file, a line that is
    not a JSON object, a missing field, a gold that is not a number, or an unknown ``mode``.
    """
    mode = _mode(mode)
    path = check_path(path, "file", "FILE", hint="give a JSON Lines file of completions",
                      missing="does not exist (file not found)")
    if verdicts_out is not None:
        verdicts_out = check_verdicts_path(verdicts_out, path)
    verdicts: list[dict] = []
    correct = total = 0
    for number, row in _json_objects(path, "one JSON object"):
        for field in (completion_field, gold_field):
            if field not in row:
                present = ", ".join(sorted(row)) or "none"
                raise UserError(f"{path}:{number}: no field '{field}' (fields present: {present}); "
                                "pass --completion-field/--gold-field")
        completion = row[completion_field]
        if not isinstance(completion, str):
            raise UserError(f"{path}:{number}: completion field '{completion_field}' must be a string, "
                            f"got {type(completion).__name__}")
        gold = _gold(row[gold_field], path, number, gold_field)
        # lm-eval compares against the gold text as written (its reference is the whole worked answer);
        # the suite's modes against its number.
        reference = str(row[gold_field]) if mode.startswith("lmeval-") else gold
        extracted, ok = judge(completion, reference, mode)
        correct += ok
        total += 1
        verdicts.append({"line": number, "extracted": extracted, "gold": gold, "correct": ok})
    if not total:  # "accuracy 0.0000 (0/0)" would read as a measured zero; an empty file is the wrong file
        raise UserError(f"{shown(path)} holds no completions (no line that is not blank); give the JSON Lines file "
                        f"of completions")
    if verdicts_out is not None:
        # Written only after the whole input has been read, so a bad line never leaves half a verdicts file.
        verdicts_out.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl_atomic(verdicts_out, verdicts)
    return correct, total


def check_verdicts_path(verdicts: Path, scored: Path) -> Path:
    """``--verdicts`` checked as a file to write (bench.config.paths.check_path) that can be written, is not the
    scored file (the completions would be replaced by their verdicts) and, when it exists, is empty or a verdicts
    file an earlier `bench score` wrote (:func:`is_verdicts_file`): any other file (a suite's suite.json, data)
    is never replaced."""
    from bench.config.outputs import check_writable

    hint = "give a new file, e.g. --verdicts verdicts.jsonl"
    verdicts = check_path(verdicts, "out-file", "--verdicts", hint=hint)
    if verdicts.exists() and os.path.samefile(verdicts, scored):
        raise UserError(f"--verdicts '{shown(verdicts)}' is the file being scored; it would be replaced by its "
                        f"verdicts: {hint}")
    if verdicts.exists() and not is_verdicts_file(verdicts):
        raise UserError(f"--verdicts '{shown(verdicts)}' exists and is not a verdicts file `bench score` wrote; it "
                        f"is not replaced: {hint}")
    return check_writable(verdicts, "--verdicts", hint)


VERDICT_KEYS = frozenset({"line", "extracted", "gold", "correct"})
"""The keys of one line of a verdicts file (:func:`score_file`)."""


def is_verdicts_file(path: Path) -> bool:
    """Whether ``path`` is empty or opens with a verdicts line (a JSON object of exactly VERDICT_KEYS): what an
    earlier --verdicts wrote, so writing the new verdicts over it loses nothing of the user's."""
    try:
        if path.stat().st_size == 0:
            return True
        with path.open("rb") as handle:
            first = handle.readline(1 << 16).strip()
    except OSError:
        return False
    try:
        row = json.loads(first)
    except (ValueError, RecursionError):
        return False
    return isinstance(row, dict) and set(row) == VERDICT_KEYS


# -- a whole suite folder ---------------------------------------------------------------------------------
COMPLETIONS_FILE = "completions.jsonl"
"""The per-question file of an evaluation (bench.execution.run_result.EVAL_FILE), the only one that can be re-scored."""


def _mode(mode: str) -> str:
    """``mode`` resolved (aliases allowed); UserError naming the modes otherwise."""
    try:
        return resolve_mode(mode)
    except ValueError:
        raise UserError(f"unknown --mode '{mode}'; use one of {', '.join(MODES)}") from None


def rescore_records(path: Path) -> list[dict[str, Any]]:
    """The records of one completions.jsonl with ``extracted`` and ``correct`` recomputed under every mode.

    Raises UserError (file and line named) for a line that is not a JSON object with the fields
    bench.scoring.evaluation.completion_record writes (completion, gold, gold_answer).
    """
    from bench.scoring.evaluation import verdicts_of

    records = []
    for number, row in _json_objects(path, "a completion record as `bench run` wrote it"):
        try:
            verdicts = verdicts_of(row["completion"], row["gold"], row["gold_answer"])
        except (TypeError, KeyError, ValueError) as exc:
            raise UserError(f"{path}:{number}: not a completion record ({type(exc).__name__}: {exc}); "
                            "the file must be as `bench run` wrote it") from None
        records.append({**row, **verdicts})
    return records


def _needs(job: dict[str, Any]) -> list[str]:
    """Run ids of the stages a run read, from the paths in its run.json (``runs/<id>/...``)."""
    names = set()
    for key, value in (job.get("inputs") or {}).items():
        if value:
            path = Path(value)
            names.add(path.name if key == "warm_start_dir" else path.parent.name)
    return sorted(names)


def _inputs_hash(suite_dir: Path, needs: list[str]) -> str | None:
    """bench.execution.runner.inputs_hash for a run that read ``needs`` (what --resume compares)."""
    from bench.execution.runner import inputs_hash

    return inputs_hash(suite_dir, SimpleNamespace(needs=needs))


def _run_ids(suite_dir: Path) -> list[str]:
    """The suite's run ids in plan order (suite.json), then any other run folder, sorted."""
    try:
        planned = [str(r) for r in json.loads((suite_dir / SUITE_FILE).read_text(encoding="utf-8")).get("runs", [])]
    except (OSError, ValueError, AttributeError, TypeError, RecursionError):
        planned = []
    found = sorted(p.name for p in (suite_dir / "runs").glob("*") if (p / "result.json").is_file())
    return [r for r in planned if r in found] + [r for r in found if r not in planned]


def rescore_suite(suite_dir: Path, mode: str) -> list[tuple[str, str]]:
    """Re-score every run of ``suite_dir`` under every mode; returns one (run id, what happened) per run.

    For each ok run whose ``eval_file`` is completions.jsonl: the file's verdicts, ``accuracy.after`` (every
    mode), ``accuracy.format_rate`` / ``truncated_rate`` ``after`` are recomputed; ``before`` is taken from the
    re-scored warm start the run read (its run.json). Files are replaced atomically. A run that read a re-scored
    stage and was up to date for --resume stays so (its ``inputs_hash`` is recomputed: only scores changed, not
    the checkpoint). Writes ``report_settings.json`` = {"headline_mode": mode}. Raises UserError when a
    `bench run` holds the folder or a completions file is malformed.
    """
    from bench.report.load import REPORT_SETTINGS_FILE
    from bench.results import write_json_atomic
    from bench.execution.suite_folder import SuiteLock

    mode = _mode(mode)
    SuiteLock(suite_dir).refuse_if_held()
    results, jobs = _read_runs(suite_dir)
    old_hashes = {run_id: _inputs_hash(suite_dir, _needs(jobs[run_id])) for run_id in results}
    lines: dict[str, str] = {}
    records_of: dict[str, list[dict[str, Any]]] = {}
    for run_id, result in results.items():  # plan order: stages (the warm start) before the methods reading them
        lines[run_id] = _rescore_run(suite_dir / "runs" / run_id, result, jobs[run_id], mode, results, records_of)
    _write_rescored(suite_dir, results, jobs, old_hashes, records_of)
    write_json_atomic(suite_dir / REPORT_SETTINGS_FILE, {"headline_mode": mode})
    return [(run_id, lines[run_id]) for run_id in results]


def _read_runs(suite_dir: Path) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(run id -> result, run id -> its run.json ({} when unreadable)) for every run with a result, in plan order;
    UserError for a run folder that leads outside the suite folder (re-scoring writes into each)."""
    from bench.results import read_result

    runs_dir = suite_dir / "runs"
    results: dict[str, dict[str, Any]] = {}
    jobs: dict[str, dict[str, Any]] = {}
    for run_id in _run_ids(suite_dir):
        result = read_result(runs_dir / run_id)
        if result is not None:
            results[run_id] = result
            try:
                jobs[run_id] = json.loads((runs_dir / run_id / "run.json").read_text(encoding="utf-8"))
            except (OSError, ValueError, RecursionError):
                jobs[run_id] = {}
            if not isinstance(jobs[run_id], dict):
                jobs[run_id] = {}
            if not inside(runs_dir / run_id, suite_dir):  # a link out of the folder: its files are not ours to write
                raise UserError(f"'{shown(runs_dir / run_id)}' leads outside the suite folder (a symbolic link?); "
                                f"re-scoring writes into every run folder, so nothing was written")
    return results, jobs


def _rescore_run(run_dir: Path, result: dict[str, Any], job: dict[str, Any], mode: str,
                 results: dict[str, dict[str, Any]], records_of: dict[str, list[dict[str, Any]]]) -> str:
    """Re-score one run's completions into ``result`` (and its records into ``records_of``); the line saying what
    happened. ``before`` comes from the warm start it read when that was re-scored already (``records_of``)."""
    from bench.scoring.evaluation import summarize_records

    eval_file = result.get("eval_file")
    if result.get("status") != "ok" or not eval_file:
        return "not evaluated" if result.get("status") == "ok" else f"status {result.get('status')}"
    path = run_dir / eval_file
    if eval_file != COMPLETIONS_FILE or not path.is_file():
        return f"not re-scored: no {COMPLETIONS_FILE} (its {eval_file} holds verdicts without text)"
    records = rescore_records(path)
    records_of[run_dir.name] = records
    summary = summarize_records(records)
    accuracy = result.setdefault("accuracy", {})
    accuracy["after"] = summary["scores"]
    for rate in ("format_rate", "truncated_rate"):
        accuracy[rate] = {**(accuracy.get(rate) or {"before": None}), "after": summary[rate]}
    warm = Path((job.get("inputs") or {}).get("warm_start_dir") or "").name
    if warm in records_of:  # the warm start was re-scored above: its "after" is this run's "before"
        warm_accuracy = results[warm]["accuracy"]
        accuracy["before"] = warm_accuracy["after"]
        for rate in ("format_rate", "truncated_rate"):
            accuracy[rate]["before"] = warm_accuracy[rate]["after"]
    score = summary["scores"][mode]
    return (f"accuracy {score['accuracy']:.4f} ({score['correct']}/{score['total']}) "
            f"[{score['low']:.4f}, {score['high']:.4f}]")


def _write_rescored(suite_dir: Path, results: dict[str, dict[str, Any]], jobs: dict[str, dict[str, Any]],
                    old_hashes: dict[str, str | None], records_of: dict[str, list[dict[str, Any]]]) -> None:
    """Write every re-scored run's completions and result, and the result of a run whose inputs hash was up to
    date and changed only because a stage it read was re-scored (recomputed, so --resume keeps it)."""
    from bench.results import write_json_atomic

    runs_dir = suite_dir / "runs"
    # Stages first, so that the consumers' inputs hashes are computed from the stages' new result files.
    order = sorted(results, key=lambda run_id: results[run_id].get("kind") != "stage")
    for run_id in order:
        result = results[run_id]
        new_hash = _inputs_hash(suite_dir, _needs(jobs[run_id]))
        rehash = old_hashes[run_id] is not None and result.get("inputs_hash") == old_hashes[run_id] != new_hash
        if rehash:
            result["inputs_hash"] = new_hash
        if run_id in records_of:
            write_jsonl_atomic(runs_dir / run_id / COMPLETIONS_FILE, records_of[run_id])
        if run_id in records_of or rehash:
            write_json_atomic(runs_dir / run_id / "result.json", result)


def add_score_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `bench score`'s arguments to ``parser`` (the lead's CLI reuses this for its subcommand)."""
    parser.add_argument("file", type=Path, metavar="FILE_OR_SUITE_DIR",
                        help="JSON Lines file, one object per line; or a suite folder (with suite.json) to re-score")
    parser.add_argument("--completion-field", help="field holding the generated text (a file only; required)")
    parser.add_argument("--gold-field", help="field holding the gold number or a '#### N' answer (a file only; "
                                             "required)")
    parser.add_argument("--mode", choices=(*MODES, *MODE_ALIASES), default=HEADLINE_MODE,
                        help="; ".join(f"{m}: {d}" for m, d in MODE_DESCRIPTIONS.items())
                        + f" (default {HEADLINE_MODE}; strict and flexible are the suite modes' old names)")
    parser.add_argument("--verdicts", type=Path, default=None, help="write one JSON verdict per line here (a file only)")


def run_score(args: argparse.Namespace) -> int:
    """Run `bench score` from parsed arguments; returns 0.

    A file: prints ``accuracy: 0.xxxx (n/N) [mode]``. A suite folder: `rescore_suite`, then the report is rebuilt
    and one line per run is printed. Raises UserError for bad input (the CLI prints it on one line and exits
    with its code): a folder without suite.json, a file without --completion-field / --gold-field, ...
    """
    mode = _mode(args.mode)
    target = check_path(args.file, "file-or-dir", "FILE_OR_SUITE_DIR", missing="does not exist (file not found)",
                        hint="give a JSON Lines file of completions or a suite folder")
    if target.is_dir():
        if not (target / SUITE_FILE).is_file():
            raise UserError(f"'{shown(target)}' is a folder but not a suite folder (no {SUITE_FILE}); give a folder "
                            "written by `bench run` (e.g. reports/latest) or a JSON Lines file")
        check_suite_folder(target, "FILE_OR_SUITE_DIR")  # its suite.json has the shape `bench run` writes
        from bench.report import build_report, check_output_folder

        check_output_folder(target)  # nothing in it the report could not replace (before anything is re-scored)
        if args.verdicts is not None:
            raise UserError("--verdicts is for a file; a suite folder's verdicts are written into each run's "
                            f"{COMPLETIONS_FILE}")
        lines = rescore_suite(target, mode)
        index = build_report(target)
        width = max((len(run_id) for run_id, _ in lines), default=0)
        for run_id, line in lines:
            print(f"{run_id:<{width}}  {line}")
        print(f"headline mode {mode}; report: {index}")
        return 0
    missing = [flag for flag, value in (("--completion-field", args.completion_field),
                                        ("--gold-field", args.gold_field)) if not value]
    if missing:
        raise UserError(f"scoring a file needs {' and '.join(missing)} (the JSON fields holding the completion and "
                        "the gold answer)")
    correct, total = score_file(target, args.completion_field, args.gold_field, mode, args.verdicts)
    accuracy = correct / total if total else 0.0
    print(f"accuracy: {accuracy:.4f} ({correct}/{total}) [{mode}]")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m bench.execution.score ...``); prints user errors on one line, exit code 2."""
    parser = argparse.ArgumentParser(prog="bench score", description=__doc__.splitlines()[0])
    add_score_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_score(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
