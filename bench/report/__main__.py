"""``python -m bench.report SUITE_DIR``: rebuild a suite's report from its result files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.errors import UserError
from bench.report import build_report


def main(argv: list[str] | None = None) -> int:
    """Parse the folder argument, build the report and print where the page is."""
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    parser.add_argument("suite_dir", type=Path, help="a suite folder (the one holding suite.json and runs/)")
    args = parser.parse_args(argv)
    if not args.suite_dir.is_dir():
        print(f"error: {args.suite_dir} is not a folder; pass the suite folder that holds suite.json", file=sys.stderr)
        return 2
    try:
        print(build_report(args.suite_dir))
    except UserError as exc:  # e.g. a suite.json of the wrong shape: one line, nothing written
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
