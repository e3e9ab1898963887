"""Memory per rank of multi-process runs, and memory a run holds apart from training (vLLM's preallocation).

Two tables, both built from result files alone (no torch):

- :func:`rank_memory_table` ("Memory per rank"), for suites with any multi-process method run (``bench run
  --launcher accelerate --num-processes N``): per method run and memory source, each rank's own peak, their max
  (memory per device: what decides whether the run fits) and their sum (over every device), beside the layout
  (launcher, strategy, process count, backend). Read from ``memory.ranks`` / ``memory.peak_bytes_max`` /
  ``memory.peak_bytes_sum`` (bench.execution.launch.merge_rank_files) and ``settings.parallel`` (bench.execution.launch
  .parallel_settings); a one-process run of the same suite is rank 0 alone. Every number carries its
  source (cuda-allocated, nvml-process, cpu-rss, ...). A reading of 0 bytes, or a GPU reading of a run whose
  headline source is cpu-rss (a CPU run), is "not measured", never a 0.
- :func:`backend_table` ("Generation backend"), for suites where some method generated with vLLM
  (``settings.generation_backend``, baselines/grpo.py): per method, the backend and vLLM's preallocation
  (``gpu_memory_utilization`` x the GPU's total memory: configured, not measured) beside the measured peak. In
  colocate mode vLLM lives in the training process, so that process's readings include its preallocation.

:func:`rank_memory_rows` is the same data as raw numbers (bytes) for ``memory_per_rank.csv``.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from bench.report import fmt
from bench.report.load import Run, Suite

CPU_SOURCE = "cpu-rss"
"""The headline source of a CPU run (bench.telemetry.memory.primary_source)."""
SOURCE_ORDER = ("cuda-allocated", "cuda-reserved", "nvml-process", "nvml-device", "cpu-rss", "cpu-maxrss")
"""Sources in the order the table lists them (the headline source of each run first, then these)."""
CSV_FILE = "memory_per_rank.csv"
CSV_COLUMNS = ["run_id", "method", "label", "seed", "status", "launcher", "strategy", "processes", "backend",
               "source", "rank", "peak_bytes", "max_bytes", "sum_bytes"]
VLLM = "vllm"


# --- readings -----------------------------------------------------------------------------------------------
def _reading(value: Any, source: str, headline_source: str | None) -> int | None:
    """A peak in bytes, or None when it is not a measurement: missing, not a number, <= 0, or a GPU source in a
    run whose headline source is the CPU's (torch.cuda counters read 0 there; they measured nothing)."""
    b = fmt.num(value)
    if b is None or b <= 0:
        return None
    if headline_source == CPU_SOURCE and not source.startswith("cpu"):
        return None
    return int(b)


def _sources(records: list[dict[str, Any]], headline: str | None) -> list[str]:
    """Every source some rank read, the run's headline source first."""
    seen: dict[str, None] = {}
    if headline:
        seen[headline] = None
    for record in records:
        for source in (record.get("by_source") or {}):
            seen[str(source)] = None
        if record.get("source"):
            seen[str(record["source"])] = None
    order = {s: i for i, s in enumerate(SOURCE_ORDER)}
    rest = sorted((s for s in seen if s != headline), key=lambda s: (order.get(s, len(order)), s))
    return ([headline] if headline else []) + rest


def _rank_records(run: Run) -> list[dict[str, Any]]:
    """Each rank's memory record (``memory.ranks``); a one-process run is rank 0 with the run's own readings."""
    memory = run.result.get("memory") or {}
    ranks = [r for r in (memory.get("ranks") or []) if isinstance(r, dict)]
    if ranks:
        return sorted(ranks, key=lambda r: r.get("rank") if isinstance(r.get("rank"), int) else 0)
    return [{"rank": 0, "peak_bytes": memory.get("peak_bytes"), "source": memory.get("source"),
             "by_source": memory.get("by_source") or {}}]


def _rank_peak(record: dict[str, Any], source: str, headline: str | None) -> int | None:
    by_source = record.get("by_source") or {}
    value = by_source.get(source)
    if value is None and record.get("source") == source:
        value = record.get("peak_bytes")
    return _reading(value, source, headline)


def processes(run: Run) -> int:
    """How many processes the run had: ranks recorded, else settings.parallel / throughput.processes, else 1."""
    memory = run.result.get("memory") or {}
    ranks = memory.get("ranks")
    if isinstance(ranks, list) and ranks:
        return len(ranks)
    for value in (((run.result.get("settings") or {}).get("parallel") or {}).get("processes"),
                  (run.result.get("throughput") or {}).get("processes")):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return 1


def multi_process(suite: Suite) -> bool:
    """Whether any method run of the suite ran as several processes."""
    return any(processes(run) > 1 for run in suite.methods)


# --- layout -------------------------------------------------------------------------------------------------
def layout(run: Run) -> dict[str, Any]:
    """launcher, strategy (ddp / deepspeed ZeRO-k, with offload), processes and torch.distributed backend."""
    parallel = (run.result.get("settings") or {}).get("parallel") or {}
    launcher_env = (run.result.get("environment") or {}).get("launcher") or {}
    n = processes(run)
    strategy = ran = parallel.get("strategy")
    if isinstance(strategy, str) and strategy.startswith("deepspeed"):
        # bench.config.launcher.config_strategy names it deepspeed-zero<k>[-offload]; the config says what is offloaded.
        ds = ((launcher_env.get("config") or {}).get("deepspeed_config") or {})
        stage = ds.get("zero_stage")
        if stage is None and strategy.startswith("deepspeed-zero"):
            stage = strategy.removeprefix("deepspeed-zero").split("-")[0]
        if stage is not None:
            strategy = f"deepspeed ZeRO-{stage}"
        offload = [f"{what} to {ds[key]}" for what, key in (("optimizer", "offload_optimizer_device"),
                                                            ("parameters", "offload_param_device"))
                   if ds.get(key) not in (None, "none")]
        if offload:
            strategy += f" (offload {', '.join(offload)})"
    asked = parallel.get("config_strategy")
    if strategy and asked and asked != ran:  # e.g. the suite engine ran DDP under a ZeRO stage-0 config
        strategy += f" (config asks {asked})"
    return {"launcher": parallel.get("launcher") or launcher_env.get("name") or ("none" if n == 1 else None),
            "strategy": strategy, "processes": n,
            "backend": parallel.get("backend") or launcher_env.get("backend")}


def layout_text(run: Run) -> str:
    """'accelerate · ddp · 2 processes (gloo)'; 'one process (not data parallel)' for a one-process method run
    under a launcher; 'one process' without one."""
    lay = layout(run)
    if lay["processes"] == 1:
        note = ((run.result.get("settings") or {}).get("parallel") or {}).get("note")
        return "one process (not data parallel)" if note else "one process"
    parts = [lay["launcher"] or "launcher not recorded", lay["strategy"] or "strategy not recorded",
             f"{lay['processes']} processes" + (f" ({lay['backend']})" if lay["backend"] else "")]
    return " · ".join(parts)


# --- the table ----------------------------------------------------------------------------------------------
def rank_memory_rows(suite: Suite) -> list[dict[str, Any]]:
    """One row per (method run, memory source, rank), raw numbers (bytes; None: not measured), with the run's
    max and sum over its ranks for that source (None unless every rank has a reading). Empty unless some
    method run ran as several processes."""
    if not multi_process(suite):
        return []
    rows = []
    for run in suite.methods:
        headline = (run.result.get("memory") or {}).get("source")
        records = _rank_records(run)
        lay = layout(run)
        for source in _sources(records, headline):
            peaks = [_rank_peak(r, source, headline) for r in records]
            if all(p is None for p in peaks) and source != headline:
                continue  # a source no rank measured (e.g. a 0 from torch.cuda on a CPU): left out
            complete = all(p is not None for p in peaks)
            for record, peak in zip(records, peaks):
                rows.append({"run_id": run.run_id, "method": run.result.get("method"), "label": run.label,
                             "seed": run.result.get("seed"), "status": run.status, **lay, "source": source,
                             "rank": record.get("rank"), "peak_bytes": peak,
                             "max_bytes": max(peaks) if complete else None,
                             "sum_bytes": sum(peaks) if complete else None})
    return rows


def rank_memory_table(suite: Suite) -> fmt.Table:
    """'Memory per rank': one row per method run and memory source; a column per rank, then the max and sum.

    Every cell names its source (``bytes_text``); a rank without a reading is "not measured", and then the max
    and sum are too (a max over some ranks would understate the run).
    """
    rows_raw = rank_memory_rows(suite)
    if not rows_raw:
        return fmt.Table([], [])
    names = fmt.display_names(suite.methods)
    width = max(processes(run) for run in suite.methods)
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows_raw:
        grouped.setdefault((row["run_id"], row["source"]), []).append(row)
    by_id = {run.run_id: run for run in suite.methods}
    rows = []
    for (run_id, source), items in grouped.items():
        run = by_id[run_id]
        cells = [fmt.bytes_text(i["peak_bytes"], source) for i in items]
        cells += [fmt.MISSING] * (width - len(cells))
        first = items[0]
        name = names[run_id] + ("" if run.status == "ok" else f" ({fmt.status_text(run)})")
        rows.append([name, layout_text(run), *cells, fmt.bytes_text(first["max_bytes"], source),
                     fmt.bytes_text(first["sum_bytes"], source)])
    header = ["method", "layout (launcher · strategy · processes)", *(f"rank {k} peak" for k in range(width)),
              "max over ranks (per device)", "sum over ranks"]
    notes = ["Each rank's own whole-run peak, read by that rank's memory tracker (bench.telemetry) and written to "
             "its rank file; one row per memory source the ranks read, each number labelled with its source "
             "(readings of different sources are not comparable). Max over ranks: memory per device, what decides "
             "whether the run fits (the run's headline peak). Sum over ranks: the peaks added up over every "
             "device; ranks need not peak at the same moment, so it is an upper bound on the simultaneous total.",
             "A one-process run (a method whose recipe does not map the matched budget onto several processes) "
             "is its rank 0 alone. 'not measured': no reading (a GPU counter of a CPU run is "
             "never shown as 0); the max and sum are then not measured either."]
    if any(r["source"] == CPU_SOURCE for r in rows_raw):
        notes.append("cpu-rss: each rank's resident set (its own process tree, the Python runtime included); ranks "
                     "on one machine share its RAM, so their sum bounds what the machine held for the run.")
    if vllm_runs(suite):
        notes.append("Runs that generated with vLLM (colocate mode): every reading of the training process "
                     "includes vLLM's preallocation; see Generation backend.")
    return fmt.Table(header, rows, notes)


def csv_text(suite: Suite) -> str:
    """memory_per_rank.csv: :func:`rank_memory_rows` with empty cells for readings not taken (never 0)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rank_memory_rows(suite):
        writer.writerow({k: "" if row.get(k) is None else fmt.csv_cell(row[k]) for k in CSV_COLUMNS})
    return out.getvalue()


def write_rank_csv(suite: Suite, path: Path) -> Path | None:
    """Write memory_per_rank.csv atomically when the suite has a multi-process run; else remove a stale one
    and return None."""
    if not multi_process(suite):
        Path(path).unlink(missing_ok=True)
        return None
    return fmt.write_text_atomic(path, csv_text(suite))


# --- the generation backend ---------------------------------------------------------------------------------
def _method_spec(run: Run) -> dict[str, Any]:
    """The run's own method settings in its resolved spec (``spec.methods.<method>``), {} when absent."""
    methods = (run.result.get("spec") or {}).get("methods") or {}
    found = methods.get(run.result.get("method")) if isinstance(methods, dict) else None
    return found if isinstance(found, dict) else {}


def backend(run: Run) -> str | None:
    """The generation backend: ``settings.generation_backend`` as the run recorded it, else the one its spec
    asked for (a run that failed before recording settings), None when neither says."""
    value = (run.result.get("settings") or {}).get("generation_backend") or _method_spec(run).get(
        "generation_backend")
    return str(value) if value else None


def vllm_runs(suite: Suite) -> list[Run]:
    return [run for run in suite.methods if backend(run) == VLLM]


def gpu_total_bytes(run: Run) -> int | None:
    """The total memory of the run's first GPU (environment.gpus[0].memory_bytes; each worker or rank sees its
    own GPU first), None without one."""
    gpus = (run.result.get("environment") or {}).get("gpus") or []
    total = fmt.num(gpus[0].get("memory_bytes")) if gpus and isinstance(gpus[0], dict) else None
    return int(total) if total else None


def vllm_preallocation(run: Run) -> tuple[float | None, int | None]:
    """(gpu_memory_utilization, bytes vLLM preallocates per GPU = utilization x the GPU's total memory); None
    where not recorded. Configured, not measured."""
    util = fmt.num(((run.result.get("settings") or {}).get("vllm") or {}).get("gpu_memory_utilization"))
    if util is None:
        util = fmt.num(_method_spec(run).get("vllm_gpu_memory_utilization"))
    total = gpu_total_bytes(run)
    return util, (int(util * total) if util is not None and total else None)


def backend_table(suite: Suite) -> fmt.Table:
    """'Generation backend': per method (first run of each label), who generated, and for vLLM its configured
    preallocation beside the measured peak; empty unless some method generated with vLLM."""
    if not vllm_runs(suite):
        return fmt.Table([], [])
    rows = []
    for run in fmt.first_per_label(suite.methods, lambda r: True):  # the first ok run of each label
        memory = run.result.get("memory") or {}
        source, peak = memory.get("source"), fmt.num(memory.get("peak_bytes"))
        name = backend(run)
        if name != VLLM:
            rows.append([run.label, name or _unrecorded_backend(run), fmt.MISSING, fmt.MISSING,
                         fmt.bytes_text(peak, source), fmt.MISSING])
            continue
        util, prealloc = vllm_preallocation(run)
        mode = ((run.result.get("settings") or {}).get("vllm") or {}).get("mode") or "colocate"
        total = gpu_total_bytes(run)
        prealloc_text = (f"{fmt.bytes_text(prealloc, 'vLLM preallocation, configured')} = {util:g} x "
                         f"{fmt.bytes_text(total, 'GPU total')}" if prealloc is not None else
                         f"{util:g} of the GPU's memory (GPU total not recorded)" if util is not None
                         else fmt.NOT_MEASURED)
        rest = peak - prealloc if peak is not None and prealloc is not None and peak > prealloc else None
        rest_text = (fmt.bytes_text(rest, f"{source} minus the preallocation, approximate")
                     if rest is not None and source != CPU_SOURCE else fmt.MISSING)
        rows.append([run.label, f"vllm ({mode})", f"{util:g}" if util is not None else fmt.MISSING,
                     prealloc_text, fmt.bytes_text(peak, source), rest_text])
    header = ["method", "generation backend", "vLLM gpu_memory_utilization",
              "vLLM preallocation per GPU (configured, not measured)", "measured peak per device (source)",
              "measured peak minus vLLM's preallocation"]
    notes = ["vLLM's preallocation is a setting, not a measurement: in colocate mode vLLM reserves "
             "gpu_memory_utilization x the GPU's total memory up front (its copy of the weights, KV cache and "
             "activations) inside the training process, whether generation needs it or not. The measured peaks "
             "of that process (cuda-allocated, nvml-process) include it, so they are not the training memory; "
             "the last column takes it out (approximate: vLLM may hold less than it was allowed).",
             "transformers: completions sampled with model.generate in the training process (every method "
             "without vLLM). n/a: the run did not record a backend."]
    return fmt.Table(header, rows, notes)


def _unrecorded_backend(run: Run) -> str:
    """The backend cell of a run that recorded none: the suite's engine samples with transformers; a method that
    sampled nothing while training (DPO: offline pairs) has none."""
    if run.result.get("engine") == "suite":
        return "transformers (suite engine)"
    if fmt.num((run.result.get("throughput") or {}).get("completions")) == 0:
        return "none (no generation while training)"
    return "n/a (not recorded)"
