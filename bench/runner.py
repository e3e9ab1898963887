"""The runner: executes a plan, one worker subprocess per run, and builds the report at the end.

Layout of a suite run folder:
```
SUITE_DIR/suite.json                 preset, resolved spec, ordered run ids, creation time
SUITE_DIR/runs/<run_id>/run.json     what the worker is asked to do
SUITE_DIR/runs/<run_id>/result.json  what it did (bench.results)
SUITE_DIR/runs/<run_id>/worker.log   everything the worker printed
SUITE_DIR/index.html, summary.md, results.csv, figures/
```
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, TextIO

from bench.errors import UserError
from bench.plan import PlannedRun, make_plan
from bench.results import empty_result, is_complete, read_result, write_json_atomic
from bench.spec import Spec
from bench.worker import PROGRESS_PREFIX, RUN_FILE

SUITE_FILE = "suite.json"


def default_out_dir(spec: Spec, reports_dir: Path) -> Path:
    """reports/<preset>-<UTC timestamp>."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return reports_dir / f"{spec.name}-{stamp}"


def run_inputs(suite_dir: Path, run: PlannedRun) -> dict[str, str | None]:
    """Paths from earlier stages that this run reads."""
    runs = suite_dir / "runs"
    inputs: dict[str, str | None] = {}
    if "warm_start" in run.needs:
        inputs["init_model_dir"] = str(runs / "warm_start" / "model")
        inputs["warm_start_dir"] = str(runs / "warm_start")
    if "sample_pool" in run.needs:
        inputs["pool_path"] = str(runs / "sample_pool" / "pool.jsonl")
    if "reward_model" in run.needs:
        inputs["reward_model_dir"] = str(runs / "reward_model" / "model")
    return inputs


class Progress:
    """Progress lines for one run: which run of how many, step of how many, elapsed and ETA.

    With ``inplace`` (a terminal, one run at a time) the line is rewritten in place; otherwise (a log, CI,
    or several runs at once) a line is printed every 10% or 30 s. ``lock`` is shared by concurrent runs.
    """

    def __init__(self, stream: TextIO, lock: threading.Lock, inplace: bool, index: int, total: int,
                 run: PlannedRun) -> None:
        self.stream, self.lock, self.inplace = stream, lock, inplace
        self.prefix = f"[{index}/{total}] {run.run_id}"
        self.started = time.monotonic()
        self.last_print, self.last_fraction = 0.0, -1.0
        self._write(f"{self.prefix}: {run.label} ...", final=not inplace)

    def update(self, step: int, total: int, metrics: dict[str, float]) -> None:
        elapsed = time.monotonic() - self.started
        fraction = step / total if total else 0.0
        eta = f"{elapsed / fraction - elapsed:4.0f}s" if fraction > 0 else "?"
        shown = " ".join(f"{k} {v:.3f}" for k, v in metrics.items())
        line = f"{self.prefix}: step {step}/{total} ({fraction:4.0%}) {shown} | {elapsed:5.0f}s elapsed, ETA {eta}"
        now = time.monotonic()
        if self.inplace:
            if now - self.last_print > 0.2 or step == total:
                self._write(line, final=False)
                self.last_print = now
        elif fraction - self.last_fraction >= 0.1 or now - self.last_print > 30:
            self._write(line, final=True)
            self.last_print, self.last_fraction = now, fraction

    def finish(self, message: str) -> None:
        self._write(f"{self.prefix}: {message} ({time.monotonic() - self.started:.0f}s)", final=True)

    def _write(self, line: str, final: bool) -> None:
        with self.lock:
            if self.inplace:
                self.stream.write("\r\033[K" + line + ("\n" if final else ""))
            else:
                self.stream.write(line + "\n")
            self.stream.flush()


def worker_env(spec: Spec, base_env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a worker: ``base_env`` with the worker pinned to one GPU unless device is cpu.

    TRL trainers refuse to run when they see several GPUs without a distributed launcher, and a suite
    measures one process on one device, so each worker sees exactly one: ``spec.gpus[0]``, else the first
    entry of an inherited ``CUDA_VISIBLE_DEVICES`` ("3,5" -> "3"), else "0". Indices in ``spec.gpus`` are the
    ones nvidia-smi prints, so CUDA_DEVICE_ORDER defaults to PCI_BUS_ID with them (CUDA's own default order,
    fastest first, can differ on a mixed box). A cpu run's environment is left alone.
    """
    env = dict(base_env)
    if spec.device == "cpu":
        return env
    if spec.gpus:
        env["CUDA_VISIBLE_DEVICES"] = str(spec.gpus[0])
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    elif "CUDA_VISIBLE_DEVICES" in env:
        # An empty value hides every GPU on purpose; keep it empty rather than unhide device 0.
        env["CUDA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"].split(",")[0].strip()
    else:
        env["CUDA_VISIBLE_DEVICES"] = "0"
    return env


def launch_worker(run_dir: Path, progress: Progress, env: Mapping[str, str] | None = None) -> int:
    """Run ``python -m bench.worker RUN_DIR`` in ``env`` (default: this process's environment); stream its
    progress; its other output goes to worker.log."""
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    with open(run_dir / "worker.log", "w", encoding="utf-8") as log:
        process = subprocess.Popen([sys.executable, "-m", "bench.worker", str(run_dir)], stdout=subprocess.PIPE,
                                   stderr=log, text=True, env=env)
        assert process.stdout is not None
        try:
            for line in process.stdout:
                if line.startswith(PROGRESS_PREFIX):
                    try:
                        data = json.loads(line[len(PROGRESS_PREFIX):])
                        progress.update(data["step"], data["total"], data.get("metrics", {}))
                    except (ValueError, KeyError):
                        log.write(line)
                else:
                    log.write(line)
            return process.wait()
        except KeyboardInterrupt:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
            raise


def record_failure(run_dir: Path, run: PlannedRun, spec: Spec, error_type: str, message: str) -> None:
    """A failed result for a run that could not write its own (killed, or a prerequisite failed)."""
    result = empty_result(run.run_id, run.kind, run.name, run.label, run.engine, run.seed)
    result["status"] = "failed"
    result["error"] = {"type": error_type, "message": message, "memory_at_failure": None}
    result["spec"] = spec.to_dict()
    write_json_atomic(run_dir / "result.json", result)


def _log_tail(run_dir: Path, lines: int = 3) -> str:
    try:
        text = (run_dir / "worker.log").read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


def prepare_suite_dir(spec: Spec, suite_dir: Path, runs: list[PlannedRun], resume: bool) -> None:
    """Create the folder and suite.json; on --resume, refuse a folder made with a different spec."""
    suite_file = suite_dir / SUITE_FILE
    if resume:
        if not suite_file.is_file():
            raise UserError(f"--resume: '{suite_dir}' is not a suite run folder (no {SUITE_FILE}); "
                            f"give --out a folder written by `bench run`, or drop --resume")
        old = json.loads(suite_file.read_text(encoding="utf-8"))
        if old.get("spec") != spec.to_dict():
            changed = sorted(_changed_keys(old.get("spec", {}), spec.to_dict()))
            raise UserError(f"--resume: the spec differs from the one '{suite_dir}' was run with "
                            f"({', '.join(changed[:5]) or 'unknown keys'}); use the same preset and overrides, "
                            f"or a new --out folder")
    elif suite_dir.exists() and any(suite_dir.iterdir()):
        raise UserError(f"output folder '{suite_dir}' already exists and is not empty; pass --resume to continue it "
                        f"or choose another --out")
    suite_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(suite_file, {
        "preset": spec.name,
        "description": spec.description,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "runs": [r.run_id for r in runs],
        "spec": spec.to_dict(),
    })


def _changed_keys(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        keys = set(a) | set(b)
        return [k for key in keys for k in _changed_keys(a.get(key), b.get(key), f"{prefix}{key}.")]
    return [prefix.rstrip(".")] if a != b else []


def run_suite(spec: Spec, suite_dir: Path, resume: bool = False, repo_dir: Path | None = None,
              stream: TextIO = sys.stderr) -> Path:
    """Run every planned run and build the report. Returns the suite folder.

    Stages run one at a time, in order; then the method runs, ``spec.parallel_runs`` at a time.
    """
    suite_dir = suite_dir.resolve()  # workers get absolute paths, whatever their working directory
    runs = make_plan(spec)
    prepare_suite_dir(spec, suite_dir, runs, resume)
    lock = threading.Lock()
    inplace = stream.isatty() and spec.parallel_runs == 1
    env = worker_env(spec, os.environ)
    suite_start = time.monotonic()

    def execute(index: int, run: PlannedRun) -> None:
        run_dir = suite_dir / "runs" / run.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        progress = Progress(stream, lock, inplace, index, len(runs), run)
        if resume and is_complete(run_dir):
            progress.finish("already complete, skipped (--resume)")
            return
        (run_dir / "result.json").unlink(missing_ok=True)
        unmet = [need for need in run.needs if not is_complete(suite_dir / "runs" / need)]
        if unmet:
            record_failure(run_dir, run, spec, "PrerequisiteFailed", f"stage {', '.join(unmet)} did not finish")
            progress.finish(f"skipped: stage {', '.join(unmet)} did not finish")
            return
        write_json_atomic(run_dir / RUN_FILE, {
            "run_id": run.run_id, "kind": run.kind, "name": run.name, "label": run.label, "engine": run.engine,
            "seed": run.seed, "spec": spec.to_dict(), "inputs": run_inputs(suite_dir, run),
            "repo_dir": str(repo_dir) if repo_dir else None,
        })
        status = launch_worker(run_dir, progress, env)
        result = read_result(run_dir)
        if result is None:
            record_failure(run_dir, run, spec, "WorkerDied",
                           f"the worker exited with status {status} without a result (killed, or out of memory?); "
                           f"log: {_log_tail(run_dir)}")
            result = read_result(run_dir)
        progress.finish(_outcome_line(result))

    try:
        numbered = list(enumerate(runs, 1))
        for index, run in numbered:
            if run.kind == "stage":
                execute(index, run)
        methods = [(index, run) for index, run in numbered if run.kind != "stage"]
        with ThreadPoolExecutor(max_workers=spec.parallel_runs) as pool:
            for future in [pool.submit(execute, index, run) for index, run in methods]:
                future.result()
    except KeyboardInterrupt:
        stream.write("\ninterrupted: building the report from the runs that finished\n")
    finally:
        from bench.report import build_report

        index_html = build_report(suite_dir)
        _point_latest(suite_dir)
    stream.write(f"suite finished in {time.monotonic() - suite_start:.0f}s; report: {index_html}\n")
    return suite_dir


def _outcome_line(result: dict[str, Any] | None) -> str:
    if result is None or result["status"] != "ok":
        error = (result or {}).get("error") or {}
        return f"FAILED {error.get('type', '')}: {error.get('message', '')}"
    parts = ["ok"]
    after = (result.get("accuracy") or {}).get("after")
    if after:
        strict = after["strict"]
        parts.append(f"accuracy {strict['accuracy']:.1%} [{strict['low']:.1%}, {strict['high']:.1%}] (strict)")
    memory = result.get("memory") or {}
    if memory.get("peak_bytes"):
        parts.append(f"peak {memory['peak_bytes'] / 2**20:.0f} MiB ({memory['source']})")
    return ", ".join(parts)


def _point_latest(suite_dir: Path) -> None:
    """<parent>/latest -> this suite folder (a relative symlink, replaced atomically)."""
    link = suite_dir.parent / "latest"
    tmp = suite_dir.parent / f".latest.{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(suite_dir.name)
        os.replace(tmp, link)
    except OSError:
        tmp.unlink(missing_ok=True)


__all__ = ["run_suite", "default_out_dir"]
