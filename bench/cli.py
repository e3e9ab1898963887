"""The `bench` command: run a preset, rebuild a report, score a file of completions, list presets."""

from __future__ import annotations

import argparse
import errno
import sys
from pathlib import Path

from bench.errors import UserError
from bench.execution.commands import resume_command


def _cmd_presets(args: argparse.Namespace) -> int:
    from bench.config.loading import preset_names, preset_summary

    for name in preset_names():
        print(f"{name:<16} {preset_summary(name)}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from bench.execution.plan import describe_plan, make_plan
    from bench.config.loading import load_spec

    args.overrides = [*args.overrides, *launcher_overrides(args)]  # so the --resume command repeats them
    spec = load_spec(args.preset, args.overrides)
    if args.dry_run:
        print(describe_plan(spec, make_plan(spec)))
        return 0
    from bench.execution.runner import run_suite
    from bench.execution.suite_folder import SuiteLock, check_suite_dir, default_out_dir

    reports_dir = Path(args.reports_dir)
    if args.out:
        suite_dir = Path(args.out)
    elif args.resume:
        latest = reports_dir / "latest"
        if not latest.exists():
            raise UserError(f"--resume without --out continues {latest}, which does not exist; pass --out FOLDER")
        suite_dir = latest.resolve()
    else:
        suite_dir = default_out_dir(spec, reports_dir)
    check_suite_dir(spec, suite_dir.resolve(), args.resume)  # a busy or wrong folder: one line, before the plan
    SuiteLock(suite_dir.resolve()).refuse_if_held()
    print(describe_plan(spec, make_plan(spec)), file=sys.stderr)
    from bench.execution.preflight import preflight

    preflight(spec, suite_dir)  # seconds now rather than a failed stage after minutes of loading
    print(f"writing to {suite_dir}", file=sys.stderr)
    resume = resume_command(args.preset, suite_dir, args.overrides)
    try:
        outcome = run_suite(spec, suite_dir, resume=args.resume, repo_dir=Path.cwd(), resume_command=resume)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # Results are written atomically, so every finished run is intact; say what to do, not a traceback.
        print(f"bench: error: no space left on the disk holding {suite_dir} ({exc.strerror}); finished results "
              f"are kept; free space there and resume with: {resume}", file=sys.stderr)
        return 1
    return outcome.exit_code


def launcher_overrides(args: argparse.Namespace) -> list[str]:
    """--launcher / --num-processes / --accelerate-config as spec overrides (launcher.*; bench.execution.launch), the config
    file made absolute (workers and --resume may run from another folder). The spec checks them (one line, exit 2)."""
    out = []
    if args.launcher is not None:
        out.append(f"launcher.name={args.launcher}")
    if args.num_processes is not None:
        out.append(f"launcher.num_processes={args.num_processes}")
    if args.accelerate_config is not None:
        out.append(f"launcher.config_file={Path(args.accelerate_config).expanduser().resolve()}")
    return out


def _cmd_report(args: argparse.Namespace) -> int:
    from bench.report import build_report

    folder = Path(args.run_dir)
    if not (folder / "suite.json").is_file():
        raise UserError(f"'{folder}' is not a suite run folder (no suite.json); give a folder written by `bench run`, "
                        f"e.g. reports/latest")
    print(build_report(folder))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from bench.report.compare import compare

    print(compare([Path(f) for f in args.run_dirs], Path(args.out)))
    return 0


def _cmd_score(args: argparse.Namespace) -> int:
    from bench.execution.score import run_score

    return run_score(args)


def _cmd_data(args: argparse.Namespace) -> int:
    from bench.task.export import run_data

    return run_data(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench", description="Matched PPO / DPO / GRPO benchmarks: memory, "
                                     "throughput and GSM8K accuracy.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a preset and write its report",
                         description="Run every stage and method of a preset, one subprocess each, then write the "
                                     "report (index.html, summary.md, results.csv, figures/). Exit status: 0 every "
                                     "run ok, 1 some run failed or was skipped (the report is written), 2 a usage "
                                     "or spec error (nothing run), 130 interrupted (the --resume command is "
                                     "printed).")
    run.add_argument("--preset", required=True, help="preset name (see `bench presets`) or a YAML file")
    run.add_argument("--out", help="suite folder to write (default: REPORTS_DIR/<preset>-<time>)")
    run.add_argument("--reports-dir", default="reports", help="where suite folders go (default: reports)")
    run.add_argument("--resume", action="store_true",
                     help="continue --out (default: REPORTS_DIR/latest), skipping runs already complete")
    run.add_argument("--dry-run", action="store_true", help="validate the spec and print the plan; run nothing")
    run.add_argument("--launcher", choices=["none", "accelerate"], default=None,
                     help="start each method run as several processes through `accelerate launch` (the suite "
                          "engine's methods and TRL's GRPO; stages and DPO stay one process); spec: launcher.name")
    run.add_argument("--num-processes", type=int, default=None, metavar="N",
                     help="processes per method run with --launcher accelerate (>= 1; train.prompts_per_step must "
                          "divide by it); spec: launcher.num_processes")
    run.add_argument("--accelerate-config", default=None, metavar="FILE",
                     help="accelerate config file (default: bench/config/accelerate/ddp.yaml; shipped: ddp, zero2, zero3, "
                          "zero3_offload, DeepSpeed ones need GPUs); spec: launcher.config_file")
    run.add_argument("overrides", nargs="*", metavar="key.path=value", help="spec overrides, e.g. train.steps=200")
    run.set_defaults(func=_cmd_run)

    report = sub.add_parser("report", help="rebuild the report of a suite folder from its result files",
                            description="Rebuild index.html, summary.md, results.csv and figures/ from result.json "
                                        "files alone (no torch needed).")
    report.add_argument("run_dir", metavar="RUN_DIR", help="suite folder, e.g. reports/latest")
    report.set_defaults(func=_cmd_report)

    compare = sub.add_parser("compare", help="put two or more suite folders side by side",
                             description="Write one self-contained page (index.html) and compare.md comparing suite "
                                         "folders (e.g. two GPUs, two TRL versions): environment differences first, "
                                         "then every headline number and its difference from the first folder. "
                                         "No torch needed. A folder that is not a suite folder: one line, exit 2.")
    compare.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="two or more suite folders")
    compare.add_argument("--out", required=True, help="folder to write index.html and compare.md into")
    compare.set_defaults(func=_cmd_compare)

    estimate = sub.add_parser("estimate", help="predict a method's GPU memory from the model's shape (no GPU, no torch)",
                              description="Per network weights, gradients and optimizer state under the precision "
                                          "policy; per phase activations, KV cache and logits; the peak and its "
                                          "phase; whether it fits, the largest micro-batch that does and the GPUs "
                                          "needed (data parallel, ZeRO-3). Exit status 2 for bad input.")
    from bench.systems.estimate import add_estimate_arguments, run_estimate

    add_estimate_arguments(estimate)
    estimate.set_defaults(func=run_estimate)

    score = sub.add_parser("score", help="score a JSONL of completions with the suite's verifier",
                           description="Score completions against gold answers and print the accuracy.")
    from bench.execution.score import add_score_arguments

    add_score_arguments(score)
    score.set_defaults(func=_cmd_score)

    data = sub.add_parser("data", help="show or export the exact train, validation and test splits a preset uses",
                          description="Print each split's size and the train/test overlap checks; with --export DIR "
                                      "write DIR/train.jsonl, DIR/test.jsonl and, when the task carves one, "
                                      "DIR/validation.jsonl (GSM8K columns question, answer).")
    from bench.task.export import add_data_arguments

    add_data_arguments(data)
    data.set_defaults(func=_cmd_data)

    tune = sub.add_parser("tune", help="choose each method's settings on a validation split (never the test split)",
                          description="Sweep each method's declared grid (bench/config/tuning_grids.yaml) with a few seeds, "
                                      "every evaluation on a validation split carved from the training split; pick "
                                      "each method's best by mean validation accuracy and write DIR/tuned-<preset>"
                                      ".yaml, a preset that extends the base (run it with bench run --preset FILE). "
                                      "Exit status as bench run.")
    from bench.execution.tune import add_tune_arguments, run_tune

    add_tune_arguments(tune)
    tune.set_defaults(func=run_tune)

    presets = sub.add_parser("presets", help="list the shipped presets", description="List presets, one line each.")
    presets.set_defaults(func=_cmd_presets)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `bench` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `bench run --dry-run | head`: the reader left, nothing is wrong
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
