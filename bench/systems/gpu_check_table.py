"""The GPU check's table: per run, status, peak memory by source, the memory model's prediction beside it with the
error in %, s/step, completions/s; then static accounting.

``python -m bench.systems.gpu_check_table FOLDER`` prints it from result files alone (``runs/*/result.json``, read through
:func:`bench.report.load.load_suite`), so it also works on a suite that was interrupted: runs that did not finish
show their status. FOLDER is a suite folder, or the folder ``scripts/gpu_check.sh`` writes: ``step1/`` and
``step2/`` (suite folders), ``step2-plan.json`` (:mod:`bench.systems.gpu_check_plan`: the size chosen and why the others
were skipped), ``telemetry-check.txt`` (:mod:`bench.systems.gpu_check_telemetry`), ``step3.txt`` (what became of step 3),
``step4.txt`` and ``step4/`` (the vLLM runs) and ``step5.txt`` / ``step5-sleep.json`` (the vLLM sleep/wake check);
each step gets its tables. Step 4 also gets its verdicts (:func:`vllm_verdicts`): the rollout-vs-trainer mismatch
after every weight sync against the plan's thresholds, the two engines' recorded settings side by side, and where
the runs were placed. The script prints it last. Exit status: 0 when every planned run is ``ok`` or out of
memory at a sweep point (an expected outcome), 1 when any is not (failed, interrupted, not run), 2 when FOLDER is
neither.

Predicted beside measured (``result["prediction"]``, stored by every sweep run; the steps of the GPU check are
one-point sweeps): on a GPU the cuda-allocated peak against the predicted peak; on a CPU the cpu-rss peak over the
post-load baseline against the predicted peak less the weights (resident at that baseline), labelled so; the error
is (predicted - measured) / measured, as in the report's scaling section (:mod:`bench.report.scaling`).

Memory is printed per source and each column is named by its source, because the sources measure different things
(README "Reading the numbers"): ``cuda-allocated`` is PyTorch's allocator peak (reset per phase),
``cuda-reserved`` what the allocator held (a high-water mark), ``nvml-process`` what the driver charged to the run's
process tree (allocator cache and CUDA context included). Without any GPU reading the table shows ``cpu-rss`` and
says so; it never shows a CUDA counter that had no reading. No torch import: it runs anywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.report.load import Run, Suite, load_suite

GIB = 1024**3
GPU_SOURCES = ("cuda-allocated", "cuda-reserved", "nvml-process")
"""Sources shown when the runs have GPU readings, in this order."""
CPU_SOURCE = "cpu-rss"
"""The source shown when no run has a GPU reading (a CPU rehearsal)."""
DASH = "-"
NETWORK_ORDER = ("actor", "critic", "reward", "reference")


def _number(value: Any) -> float | None:
    """A real number, or None (bools and text are not measurements)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def gib(value: Any) -> str:
    """Bytes as GiB with two decimals ('1.84'), or the dash when there is no reading."""
    b = _number(value)
    return DASH if b is None else f"{b / GIB:.2f}"


def decimal(value: Any, digits: int = 2) -> str:
    """A number to ``digits`` decimals, or the dash."""
    v = _number(value)
    return DASH if v is None else f"{v:,.{digits}f}"


def peaks_by_source(result: dict[str, Any]) -> dict[str, int]:
    """Whole-run peak bytes per memory source: ``memory.by_source``, else the maximum over the phases'
    ``by_source``, else the headline ``peak_bytes`` under its own ``source`` (results that predate by_source)."""
    memory = result.get("memory") or {}
    peaks = {s: int(b) for s, b in (memory.get("by_source") or {}).items() if _number(b) is not None}
    if peaks:
        return peaks
    for phase in (memory.get("phases") or {}).values():
        for source, value in ((phase or {}).get("by_source") or {}).items():
            if _number(value) is not None:
                peaks[source] = max(peaks.get(source, 0), int(value))
    if not peaks and _number(memory.get("peak_bytes")) is not None and memory.get("source"):
        peaks[str(memory["source"])] = int(memory["peak_bytes"])
    return peaks


def present_sources(runs: list[Run]) -> set[str]:
    """Every memory source at least one run has a reading from."""
    return {source for run in runs for source in peaks_by_source(run.result)}


def shown_sources(runs: list[Run]) -> tuple[str, ...]:
    """All of :data:`GPU_SOURCES` when any run has a reading from one of them (a source without readings then
    shows dashes and the note says so, rather than its column silently vanishing), else ``cpu-rss``."""
    present = present_sources(runs)
    return GPU_SOURCES if any(s in present for s in GPU_SOURCES) else (CPU_SOURCE,)


def peak_phase(result: dict[str, Any]) -> str:
    """The phase with the highest per-phase peak of the run's primary source, or the dash."""
    phases = (result.get("memory") or {}).get("phases") or {}
    readings = {name: _number((p or {}).get("peak_bytes")) for name, p in phases.items()}
    readings = {name: b for name, b in readings.items() if b is not None}
    return max(readings, key=lambda name: readings[name]) if readings else DASH


def tokens_per_completion(result: dict[str, Any]) -> str:
    """Generated tokens / completions: equals max_new_tokens for every online method under fixed-length
    generation (min_new_tokens = max_new_tokens); the dash for offline runs."""
    throughput = result.get("throughput") or {}
    completions, tokens = _number(throughput.get("completions")), _number(throughput.get("generated_tokens"))
    return DASH if not completions or tokens is None else f"{tokens / completions:g}"


def status_of(run: Run) -> str:
    """'ok', 'failed: Type: message', or why there is no result."""
    if run.note:
        return run.note
    error = run.result.get("error")
    if run.status == "failed" and isinstance(error, dict):
        return f"failed: {error.get('type') or 'Error'}: {error.get('message') or ''}"[:120]
    return run.status


def render(rows: list[list[str]], header: list[str]) -> list[str]:
    """Left-aligned plain-text columns (two spaces apart)."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]


def compared_source(suite: Suite) -> str:
    """What a prediction is set against: the cuda-allocated peak when any run has one, else the cpu-rss delta."""
    return "cuda-allocated peak" if "cuda-allocated" in present_sources(suite.runs) else "cpu-rss delta"


def prediction_cells(run: Run, source: str) -> list[str]:
    """[measured GiB, predicted GiB, error %] of ``source`` (bench.report.scaling's quantities); dashes without a
    prediction (stages, runs outside a sweep) or a measurement (a run that did not finish)."""
    from bench.report.scaling import Point

    prediction = run.result.get("prediction")
    point = Point(run, "", {}, prediction if isinstance(prediction, dict) else None)
    measured, predicted = point.measured(source), point.predicted(source)
    error = DASH if not measured or predicted is None else f"{(predicted - measured) / measured:+.0%}"
    return [gib(measured), gib(predicted), error]


def run_table(suite: Suite) -> list[str]:
    """One line per run (stages, then methods): status, peak per shown source, the prediction beside the compared
    measurement with its error, peak phase, s/step, rates."""
    sources = shown_sources(suite.runs)
    compared = compared_source(suite)
    header = ["run", "kind", "status", *[f"peak {s} GiB" for s in sources], f"{compared} GiB", "predicted GiB",
              "error %", "peak phase", "s/step (median)", "completions/s", "tokens/completion"]
    rows = []
    for run in suite.runs:
        peaks = peaks_by_source(run.result)
        throughput = run.result.get("throughput") or {}
        rows.append([run.run_id, run.kind, status_of(run), *[gib(peaks.get(s)) for s in sources],
                     *prediction_cells(run, compared), peak_phase(run.result),
                     decimal(throughput.get("step_s_median"), 3), decimal(throughput.get("completions_per_s")),
                     tokens_per_completion(run.result)])
    return render(rows, header)


def accounting_table(suite: Suite) -> list[str]:
    """Static accounting per network (weights, gradients, optimizer state, counted from the live modules)."""
    header = ["run", "network", "params", "weights GiB", "grads GiB", "optimizer GiB", "total GiB"]
    rows = []
    for run in suite.runs:
        networks = (run.result.get("memory") or {}).get("networks") or {}
        ordered = sorted(networks, key=lambda n: (NETWORK_ORDER.index(n) if n in NETWORK_ORDER else 99, n))
        for name in ordered:
            net = networks[name] or {}
            parts = [_number(net.get(k)) for k in ("weight_bytes", "grad_bytes", "optimizer_bytes")]
            total = sum(p for p in parts if p is not None) if any(p is not None for p in parts) else None
            params = _number(net.get("params"))
            rows.append([run.run_id, name, DASH if params is None else f"{int(params):,}",
                         *[gib(p) for p in parts], gib(total)])
    return render(rows, header) if rows else ["(no run recorded its networks)"]


def source_note(suite: Suite) -> str:
    """One line saying which sources the table shows and why."""
    sources = shown_sources(suite.runs)
    if sources == (CPU_SOURCE,):
        return ("memory source: cpu-rss (resident memory of the run's process tree); no run had a GPU reading, so "
                "no cuda-*/nvml-* column is shown")
    missing = [s for s in sources if s not in present_sources(suite.runs)]
    note = (f"; no run had a {' or '.join(missing)} reading (NVML missing, or it does not see this process tree: "
            f"see each result's memory.sources)") if missing else ""
    return (f"memory sources: {', '.join(sources)} (cuda-allocated: allocator peak; cuda-reserved and nvml-process: "
            f"high-water marks, allocator cache and CUDA context included){note}")


def environment_line(suite: Suite) -> str:
    """GPU, driver and package versions as the first run that recorded them saw them
    (``bench.telemetry.environment.capture_environment``)."""
    for run in suite.runs:
        env = run.result.get("environment") or {}
        if env:
            packages = env.get("packages") or {}
            versions = ", ".join(f"{name} {packages[name]}" for name in ("torch", "transformers", "trl")
                                 if packages.get(name))
            gpu = env.get("gpu_name") or "no GPU"
            driver = f", driver {env['driver_version']}" if env.get("driver_version") else ""
            cuda = f", CUDA {env['cuda_version']}" if env.get("cuda_version") else ""
            return f"environment: {gpu}{driver}{cuda}; {versions or 'package versions not recorded'}"
    return "environment: not recorded"


def prediction_note(suite: Suite) -> str:
    """What the predicted and error columns compare."""
    if compared_source(suite) == "cuda-allocated peak":
        return ("predicted: the memory model's peak (bench.systems.memory_model) beside the cuda-allocated peak; error = "
                "(predicted - measured) / measured")
    return ("predicted: the memory model's peak less the weights, beside the cpu-rss peak over the post-load baseline "
            "(no GPU: host memory, not VRAM); error = (predicted - measured) / measured")


def format_tables(suite: Suite, title: str = "GPU check table") -> str:
    """The tables of one suite."""
    lines = [f"{title}: preset {suite.preset}, {suite.suite_dir}", environment_line(suite),
             source_note(suite), prediction_note(suite), "", *run_table(suite), "",
             "static accounting (bytes counted from the live modules and the optimizer's state tensors):",
             *accounting_table(suite)]
    return "\n".join(lines)


def is_oom_at_point(run: Run) -> bool:
    """An out-of-memory at a sweep point: a finding (where a method stops fitting), not a failure."""
    error = run.result.get("error")
    return (isinstance(error, dict) and error.get("type") == "OutOfMemory"
            and isinstance(run.result.get("sweep"), dict))


def all_ok(suite: Suite) -> bool:
    """Every planned run finished with status ok or ran out of memory at a sweep point (and there was one)."""
    return bool(suite.runs) and all(run.status == "ok" or is_oom_at_point(run) for run in suite.runs)


STEPS = ("step1", "step2")
"""The suite folders of a GPU-check folder, in order."""


def _text(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").strip().splitlines()
    except OSError:
        return []


def plan_lines(folder: Path) -> list[str]:
    """Step 2's choice in words (bench.systems.gpu_check_plan), from ``step2-plan.json``."""
    try:
        plan = json.loads((folder / "step2-plan.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ["step 2: no plan written (step 1 did not leave time, or the plan failed: see the log)"]
    from bench.systems.gpu_check_plan import Candidate, Step2Plan

    fields = {k: v for k, v in plan.items() if k != "candidates"}
    return Step2Plan(**fields, candidates=[Candidate(**c) for c in plan.get("candidates") or []]).lines()


def _curve_values(result: dict[str, Any], metric: str) -> list[float]:
    """``metric``'s value at every step that logged it (result["curves"]), in step order."""
    points = [(row.get("step", 0), _number(row.get(metric))) for row in result.get("curves") or []
              if isinstance(row, dict)]
    return [value for _, value in sorted(points, key=lambda p: p[0]) if value is not None]


def sampler_verdict(run: Run) -> tuple[str, bool]:
    """(line, passed): the suite engine's rollout-vs-trainer mismatch at every step (each step's rollout follows a
    weight sync: the first load, then one after every optimizer step) against the plan's thresholds."""
    from bench.systems.gpu_check_plan import SAMPLER_ABS_DIFF_MAX, SAMPLER_KL_MAX

    kl, diff = _curve_values(run.result, "sampler_kl"), _curve_values(run.result, "sampler_logprob_abs_diff")
    if not kl or not diff:
        return f"  {run.run_id}: no sampler_kl / sampler_logprob_abs_diff logged (no vLLM rollout?) -> WRONG", False
    ok = max(kl) <= SAMPLER_KL_MAX and max(diff) <= SAMPLER_ABS_DIFF_MAX
    shown = ", ".join(f"{k:.4f}" for k in kl), ", ".join(f"{d:.4f}" for d in diff)
    return (f"  {run.run_id}: sampler_kl per step {shown[0]} (max {SAMPLER_KL_MAX:g}); sampler_logprob_abs_diff "
            f"{shown[1]} (max {SAMPLER_ABS_DIFF_MAX:g}) nats/token -> {'ok' if ok else 'WRONG'}"), ok


def engine_verdict(trl: Run, suite_engine: Run) -> tuple[list[str], bool]:
    """(lines, passed): TRL's engine and the suite's as each recorded itself after it was built
    (``settings.vllm.engine``, bench.model.vllm_backend.engine_settings): every key that differs, passed when those
    are only the ones TRL keeps (the plan's ENGINE_KEYS_ALLOWED_TO_DIFFER); and TRL's record of what still differs."""
    from bench.systems.gpu_check_plan import ENGINE_KEYS_ALLOWED_TO_DIFFER

    records = [((run.result.get("settings") or {}).get("vllm") or {}) for run in (trl, suite_engine)]
    engines = [record.get("engine") or {} for record in records]
    if not all(engines):
        return [f"  engines: {trl.run_id} or {suite_engine.run_id} recorded no engine settings -> WRONG"], False
    keys = list(dict.fromkeys([*engines[0], *engines[1]]))
    differ = [k for k in keys if engines[0].get(k) != engines[1].get(k)]
    unexpected = [k for k in differ if k not in ENGINE_KEYS_ALLOWED_TO_DIFFER]
    same = ", ".join(f"{k} {engines[0].get(k)}" for k in keys if k not in differ)
    shown = "; ".join(f"{k}: {engines[0].get(k)} (TRL) / {engines[1].get(k)} (suite)"
                      + ("" if k in unexpected else ", kept by TRL") for k in differ) or "nothing"
    lines = [f"  engines, as read back from each after it was built: the same {same}",
             f"  engines differ in: {shown} -> {'WRONG' if unexpected else 'ok'}"]
    for name, why in (records[0].get("differences") or {}).items():
        lines.append(f"  still differs (TRL offers no switch): {name}: {why}")
    return lines, not unexpected


def placement_verdict(runs: list[Run]) -> tuple[str, bool]:
    """(line, passed): where step 4's method runs ran; with two at once (2 GPUs), each on a GPU of its own."""
    placed = {run.run_id: (run.result.get("placement") or {}) for run in runs}
    where = ", ".join(f"{rid} on GPU {','.join(map(str, p.get('gpus') or [])) or '-'}" for rid, p in placed.items())
    at_once = max((int(p.get("parallel_runs") or 1) for p in placed.values()), default=1)
    if at_once < 2 or any(p.get("device") == "cpu" for p in placed.values()):
        return f"  placement: {where or 'not recorded'} (one at a time, or a CPU: no per-GPU placement to check)", True
    gpus = [tuple(p.get("gpus") or []) for p in placed.values()]
    ok = all(gpus) and len(set(gpus)) == len(gpus)
    return f"  placement: {where}, {at_once} at once -> {'ok (one per GPU)' if ok else 'WRONG (a GPU shared)'}", ok


def vllm_verdicts(suite: Suite) -> tuple[list[str], bool]:
    """Step 4's verdicts (see the module docstring); passed when each passed."""
    by_method = {str(run.result.get("method") or run.run_id.split("-s")[0]): run for run in suite.methods}
    lines, ok = ["step 4 verdicts:"], True
    engine_run, trl_run = by_method.get("grpo_engine"), by_method.get("grpo")
    if engine_run is not None and engine_run.status == "ok":
        line, passed = sampler_verdict(engine_run)
        lines.append(line)
        ok = ok and passed
    if engine_run is not None and trl_run is not None and engine_run.status == trl_run.status == "ok":
        more, passed = engine_verdict(trl_run, engine_run)
        lines += more
        ok = ok and passed
    line, passed = placement_verdict(list(suite.methods))
    return [*lines, line], ok and passed


def step5_lines(folder: Path) -> tuple[list[str], bool]:
    """Step 5's lines from ``step5-sleep.json`` (bench.systems.gpu_check_plan sleep-wake), else ``step5.txt`` (its
    skip line or how it ended); passed unless it ran and failed."""
    try:
        record = json.loads((folder / "step5-sleep.json").read_text(encoding="utf-8"))
        return [str(line) for line in record.get("lines") or []], bool(record.get("passed"))
    except (OSError, ValueError):
        text = _text(folder / "step5.txt")
        return text or ["step 5: not reached"], not any("finished with status" in line for line in text)


def check_folder(folder: Path) -> tuple[str, bool]:
    """(the whole printout of a GPU-check folder, every step's runs ok)."""
    parts = ["GPU check", *_text(folder / "telemetry-check.txt"), ""]
    ok = True
    for step in STEPS:
        if step == "step2":  # the vLLM steps ran between steps 1 and 2
            step4 = _text(folder / "step4.txt")
            parts += step4
            if (folder / "step4" / "suite.json").is_file() or (folder / "step4" / "runs").is_dir():
                suite = load_suite(folder / "step4")
                verdicts, passed = vllm_verdicts(suite)
                parts += [format_tables(suite, "step4 table (vLLM)"), *verdicts]
                ok = ok and all_ok(suite) and passed
            elif any("finished with status" in line for line in step4):  # started, but wrote no suite
                parts.append("step4: no suite folder (it did not start)")
                ok = False
            lines, passed = step5_lines(folder)
            parts += [*lines, "", *plan_lines(folder), ""]
            ok = ok and passed
        if (folder / step / "suite.json").is_file():
            suite = load_suite(folder / step)
            parts += [format_tables(suite, f"{step} table"), ""]
            ok = ok and all_ok(suite)
        elif step == "step1":
            parts += ["step1: no suite folder (it did not start)", ""]
            ok = False
    parts += _text(folder / "step3.txt") or ["step 3: not reached"]
    if (folder / "step3" / "suite.json").is_file():
        suite = load_suite(folder / "step3")
        parts += ["", format_tables(suite, "step3 table")]
        ok = ok and all_ok(suite)
    return "\n".join(parts), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.systems.gpu_check_table",
                                     description="Per-run memory and speed table of a suite folder.")
    parser.add_argument("suite_dir", metavar="FOLDER",
                        help="a folder written by `bench run`, or by scripts/gpu_check.sh (step1/, step2/, ...)")
    args = parser.parse_args(argv)
    folder = Path(args.suite_dir)
    if (folder / "step1").is_dir() or (folder / "telemetry-check.txt").is_file():
        text, ok = check_folder(folder)
        print(text)
        return 0 if ok else 1
    if not (folder / "suite.json").is_file() and not (folder / "runs").is_dir():
        print(f"gpu_check_table: error: '{folder}' is not a suite folder (no suite.json, no runs/)", file=sys.stderr)
        return 2
    suite = load_suite(folder)
    print(format_tables(suite))
    return 0 if all_ok(suite) else 1


if __name__ == "__main__":
    sys.exit(main())
