"""`bench score`: score a JSON Lines file of completions against gold answers with the suite's verifier.

    bench score FILE.jsonl --completion-field F --gold-field G [--mode strict|flexible] [--verdicts OUT.jsonl]

The gold field may be a bare number (``"18"``, ``"1,000"``) or a GSM8K worked answer ending in ``#### N``.
Prints ``accuracy: 0.xxxx (n/N) [mode]``. Useful to score another harness's generations exactly the way the
suite scores its own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.errors import UserError
from bench.tasks import gold_number
from bench.verifier import HEADLINE_MODE, MODE_ALIASES, MODES, judge, normalize_number, resolve_mode


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


def score_file(path: Path, completion_field: str, gold_field: str, mode: str,
               verdicts_out: Path | None) -> tuple[int, int]:
    """Score every line of ``path``; returns ``(correct, total)``.

    Each non-blank line is one JSON object holding ``completion_field`` (the text) and ``gold_field``.
    Blank lines are skipped. ``verdicts_out``, if given, receives one JSON line per scored line:
    ``{"line": i, "extracted": str | None, "gold": str, "correct": bool}`` with ``i`` the 1-based line
    number in ``path``. Raises UserError (one line, with the line number) for a missing file, a line that is
    not a JSON object, a missing field, a gold that is not a number, or an unknown ``mode``.
    """
    try:
        mode = resolve_mode(mode)
    except ValueError:
        raise UserError(f"unknown --mode '{mode}'; use one of {', '.join(MODES)}") from None
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found; give a JSON Lines file of completions")
    verdicts: list[dict] = []
    correct = total = 0
    with path.open(encoding="utf-8") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{number}: not valid JSON ({exc.msg}); "
                                "each line must be one JSON object") from None
            if not isinstance(row, dict):
                raise UserError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
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
    if verdicts_out is not None:
        # Written only after the whole input has been read, so a bad line never leaves half a verdicts file.
        verdicts_out = Path(verdicts_out)
        verdicts_out.parent.mkdir(parents=True, exist_ok=True)
        with verdicts_out.open("w", encoding="utf-8") as out:
            for verdict in verdicts:
                out.write(json.dumps(verdict) + "\n")
    return correct, total


def add_score_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `bench score`'s arguments to ``parser`` (the lead's CLI reuses this for its subcommand)."""
    parser.add_argument("file", type=Path, help="JSON Lines file, one object per line")
    parser.add_argument("--completion-field", required=True, help="field holding the generated text")
    parser.add_argument("--gold-field", required=True, help="field holding the gold number or a '#### N' answer")
    parser.add_argument("--mode", choices=(*MODES, *MODE_ALIASES), default=HEADLINE_MODE,
                        help="strict: answer tags / #### / 'The answer is' / \\boxed only; "
                             "flexible: also the last number")
    parser.add_argument("--verdicts", type=Path, default=None, help="write one JSON verdict per line here")


def run_score(args: argparse.Namespace) -> int:
    """Run `bench score` from parsed arguments; prints ``accuracy: 0.xxxx (n/N) [mode]``, returns 0.

    Raises UserError for bad input (the CLI prints it on one line and exits with its code)."""
    correct, total = score_file(args.file, args.completion_field, args.gold_field, args.mode, args.verdicts)
    accuracy = correct / total if total else 0.0
    print(f"accuracy: {accuracy:.4f} ({correct}/{total}) [{args.mode}]")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m bench.score ...``); prints user errors on one line, exit code 2."""
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
