"""What measuring costs: the same method with telemetry off and fully on, alternately, several times.

    python -m bench.execution.overhead --preset cpu-quick --method grpo --repeats 5 [key.path=value ...]

Runs the shared stages once (a normal suite run of just that method), then re-runs the method's worker
``repeats`` times in each mode, alternating off/on so that machine noise hits both alike, and prints the
median training time of each mode and their ratio. The goal is full telemetry within 3% of wall time.
This is a benchmark, not a test: shared machines are noisy, so read the ratio of medians, not one pair.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.errors import UserError
from bench.results import read_result, write_json_atomic
from bench.execution.runner import run_suite
from bench.config.registry import METHODS
from bench.config.loading import load_spec
from bench.execution.worker import RUN_FILE


def _time_once(template: dict, run_dir: Path, enabled: bool) -> float:
    job = copy.deepcopy(template)
    job["spec"]["telemetry"]["enabled"] = enabled
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / RUN_FILE, job)
    with open(run_dir / "worker.log", "w", encoding="utf-8") as log:
        subprocess.run([sys.executable, "-m", "bench.execution.worker", str(run_dir)], stdout=log, stderr=log, check=False)
    result = read_result(run_dir)
    if result is None or result["status"] != "ok":
        error = (result or {}).get("error") or {}
        raise RuntimeError(f"the {'on' if enabled else 'off'} run failed: {error.get('message', 'no result')}; "
                           f"see {run_dir / 'worker.log'}")
    return float(result["throughput"]["train_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.execution.overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="cpu-quick", help="preset to measure with (default: cpu-quick)")
    parser.add_argument("--method", default="grpo", choices=list(METHODS), help="method to time (default: grpo)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per mode (default: 5)")
    parser.add_argument("--out", help="folder for the runs (default: a temporary folder)")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value")
    args = parser.parse_args(argv)
    try:
        if args.repeats < 1:
            raise UserError(f"--repeats must be >= 1, got {args.repeats}")
        others = [f"methods.{m}.enabled=false" for m in METHODS if m != args.method]
        spec = load_spec(args.preset, [f"methods.{args.method}.enabled=true", *others, *args.overrides])
    except UserError as exc:
        print(f"bench.execution.overhead: error: {exc}", file=sys.stderr)
        return 2
    root = Path(args.out or tempfile.mkdtemp(prefix="bench-overhead-"))
    suite = root / "suite"
    run_suite(spec, suite)
    run_id = f"{args.method}-s{spec.seeds[0]}"
    template = json.loads((suite / "runs" / run_id / RUN_FILE).read_text(encoding="utf-8"))
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(args.repeats):
        for enabled in (False, True):
            seconds = _time_once(template, root / f"{'on' if enabled else 'off'}-{i}", enabled)
            times[enabled].append(seconds)
            print(f"repeat {i + 1}/{args.repeats} telemetry {'on ' if enabled else 'off'}: {seconds:.2f} s",
                  flush=True)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"{args.method} on {args.preset}: median training time off {off:.2f} s, on {on:.2f} s, "
          f"ratio on/off {on / off:.3f} ({(on / off - 1) * 100:+.1f}%) over {args.repeats} alternating pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
