"""What a citation of the run needs, as (field, value) pairs for the page and summary.md.

Date, the model that ran with its parameter count and the task (from the spec, never the preset's description:
a synthetic arithmetic task is not GSM8K), commit (and whether the tree had uncommitted changes), hardware,
package versions, preset, the exact command lines that reproduce and continue the run (recorded by the runner in
suite.json ``commands``), and n and seeds for every accuracy. A value the run did not record reads "not
recorded", never a guess. :func:`run_title` and :func:`run_description` head the page and summary.md.
"""

from __future__ import annotations

import json
from typing import Any

from bench.report import fmt
from bench.report.findings import accuracy, headline_mode
from bench.report.load import SUITE_FILE, Suite

NOT_RECORDED = "not recorded"


def suite_meta(suite: Suite) -> dict[str, Any]:
    """suite.json as a dict ({} when missing or unreadable; load.py already reported that as a problem), as load.py
    read it (strings capped) when it did."""
    if suite.meta:
        return suite.meta
    try:
        data = json.loads((suite.suite_dir / SUITE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def environment(suite: Suite) -> dict[str, Any]:
    """The environment of the first ok run (else any run) that recorded one."""
    for run in sorted(suite.runs, key=lambda r: r.status != "ok"):
        env = run.result.get("environment")
        if isinstance(env, dict) and env:
            return env
    return {}


def _hardware(env: dict[str, Any]) -> str:
    if not env:
        return NOT_RECORDED
    gpus = [g for g in env.get("gpus") or [] if isinstance(g, dict)]
    if gpus:
        names = sorted({str(g.get("name")) for g in gpus})
        mem = fmt.num(gpus[0].get("memory_bytes"))
        gpu = f"{len(gpus)}× {', '.join(names)}" + (f" ({mem / fmt.GIB:,.0f} GiB)" if mem else "")
        extra = [f"driver {env['driver_version']}" if env.get("driver_version") else "",
                 f"CUDA {env['cuda_version']}" if env.get("cuda_version") else ""]
        gpu += "".join(f", {e}" for e in extra if e)
    else:
        gpu = "no GPU"
    cpu = env.get("cpu_model") or "CPU"
    cores = env.get("cpu_count_logical")
    ram = fmt.num(env.get("ram_bytes"))
    parts = [gpu, f"{cpu}" + (f", {cores} logical cores" if cores else ""),
             f"{ram / fmt.GIB:,.0f} GiB RAM" if ram else ""]
    return "; ".join(p for p in parts if p)


def _packages(env: dict[str, Any]) -> str:
    packages = env.get("packages") if isinstance(env.get("packages"), dict) else {}
    listed = [f"{k} {v}" for k, v in packages.items() if v]
    python = [f"python {env['python']}"] if env.get("python") else []
    return ", ".join(python + listed) or NOT_RECORDED


def _commit(env: dict[str, Any]) -> str:
    commit = env.get("git_commit")
    if not commit:
        return NOT_RECORDED
    dirty = env.get("git_dirty")
    state = {True: "dirty: uncommitted changes", False: "clean", None: "dirty flag not recorded"}.get(dirty)
    return f"{commit} ({state})"


def _suite(env: dict[str, Any]) -> str:
    """'rlft-bench 0.1.0 at commit abc123 (clean); cite the suite with its CITATION.cff' — the tool that made the
    numbers, which a writeup cites beside the run."""
    version = env.get("suite_version")
    commit = env.get("git_commit")
    if not version and not commit:
        return NOT_RECORDED
    name = f"rlft-bench {version}" if version else "rlft-bench (version not recorded)"
    at = f" at commit {str(commit)[:12]}" if commit else ""
    return f"{name}{at}; cite the suite with its CITATION.cff"


def _accuracy_n(suite: Suite) -> str:
    """'GRPO (TRL): n = 5,000, seeds 0, 1; ...' for every method with an accuracy after (with its clusters:
    '5,000 questions (5,000 workings: one question each)' where the run knows them)."""
    per_label: dict[str, tuple[set[str], set[str]]] = {}
    for run in suite.methods:
        after = accuracy(run, "after", headline_mode(suite)) if run.status == "ok" else None
        if after is None:
            continue
        ns, seeds = per_label.setdefault(run.label, (set(), set()))
        ns.add(fmt.int_text(after.get("total")) if after.get("clusters") is None else
               fmt.n_text(after.get("total"), after.get("clusters"), fmt.cluster_unit(run)))
        seeds.add(str(run.result.get("seed")))
    if not per_label:
        return "no accuracy measured"
    return "; ".join(f"{label}: n = {'/'.join(sorted(ns))}, seed{'s' if len(seeds) > 1 else ''} "
                     f"{', '.join(sorted(seeds))}" for label, (ns, seeds) in per_label.items())


# --- what ran: the model and the task, from the spec and the results (never the preset's description) --------
def _spec(suite: Suite) -> dict[str, Any]:
    """The suite's resolved spec, else the first run's (a folder whose suite.json lacks it)."""
    if suite.spec:
        return suite.spec
    return next((r.result["spec"] for r in suite.runs if isinstance(r.result.get("spec"), dict)), {})


def parameter_count(suite: Suite) -> int | None:
    """Parameters of the trained network every method starts from (the actor's static accounting of the first
    run that counted one; LoRA's base included), or None when no run recorded it."""
    for run in sorted(suite.runs, key=lambda r: (r.status != "ok", r.kind != "method")):
        actor = ((run.result.get("memory") or {}).get("networks") or {}).get("actor")
        params = fmt.num(actor.get("params")) if isinstance(actor, dict) else None
        if params:
            return int(params)
    return None


def model_name(suite: Suite) -> str:
    """The model that ran, as a reader would name it: the hub id or folder, a shipped architecture's name with
    'random weights', or the tiny model's shape."""
    model = _spec(suite).get("model") or {}
    source = model.get("source")
    if not source:
        return NOT_RECORDED
    if source == "tiny":
        tiny = model.get("tiny") or {}
        shape = ", ".join(f"{v} {k}" for k, v in (("hidden", tiny.get("hidden_size")),
                                                   ("layers", tiny.get("num_layers"))) if v)
        return f"tiny Qwen2-shaped decoder (random init{', ' + shape if shape else ''})"
    if source == "architecture":
        return f"{model.get('architecture') or 'a shipped architecture'} shape with random weights"
    if source == "config":
        return f"{model.get('name_or_path') or 'a hub config'} architecture with random weights"
    name = str(model.get("name_or_path") or "unnamed model")
    return name if source in ("hub", "fetched") else f"{name} (local copy)"


def task_name(suite: Suite) -> str:
    """The task that ran: synthetic arithmetic is said to be synthetic (it is not GSM8K), GSM8K says where from."""
    task = _spec(suite).get("task") or {}
    source = task.get("source")
    if source == "synthetic":
        syn = task.get("synthetic") or {}
        steps = syn.get("max_steps", "?")
        extent = "one step" if steps == 1 else f"up to {steps} steps"
        return f"synthetic GSM8K-format arithmetic (operands up to {syn.get('max_operand', '?')}, {extent}; not GSM8K)"
    if source == "gsm8k-bundled":
        return "GSM8K (the copy bundled with the suite)"
    if source == "gsm8k":
        return f"GSM8K ({task.get('path') or 'path not recorded'})"
    return str(source or "task not recorded")


def run_title(suite: Suite) -> str:
    """'<model> on <task>' for the page's title: what ran, whatever the preset's description says."""
    task = _spec(suite).get("task") or {}
    short_task = {"synthetic": "synthetic arithmetic", "gsm8k": "GSM8K", "gsm8k-bundled": "GSM8K (bundled)"}.get(
        str(task.get("source")), str(task.get("source") or "unknown task"))
    model = _spec(suite).get("model") or {}
    short_model = ("tiny model" if model.get("source") == "tiny" else
                   str(model.get("architecture") or model.get("name_or_path") or "unknown model").rstrip("/")
                   .rsplit("/", 1)[-1])
    return f"{short_model} on {short_task}"


def run_description(suite: Suite) -> str:
    """One line on what ran: the model with its parameter count, the task, the methods and seeds."""
    params = parameter_count(suite)
    spec = _spec(suite)
    methods = sorted({r.label for r in suite.methods})
    seeds = spec.get("seeds") or sorted({r.result.get("seed") for r in suite.methods if r.result.get("seed") is not None})
    parts = [model_name(suite) + (f", {params:,} parameters" if params else ""), f"on {task_name(suite)}"]
    line = " ".join(parts)
    if methods:
        line += f"; {len(methods)} method(s): {', '.join(methods)}"
    if seeds:
        line += f"; seed(s) {', '.join(str(s) for s in seeds)}"
    return line


def citation(suite: Suite) -> list[tuple[str, str]]:
    """(field, value) pairs: everything a citation of this run needs."""
    from bench.report import datachecks

    meta, env = suite_meta(suite), environment(suite)
    commands = meta.get("commands") if isinstance(meta.get("commands"), dict) else {}
    params = parameter_count(suite)
    return [
        ("date", str(suite.created_at or env.get("time_utc") or NOT_RECORDED)),
        ("model", model_name(suite)),
        ("parameters", f"{params:,} (the actor, static accounting)" if params else NOT_RECORDED),
        ("task", task_name(suite)),
        ("suite", _suite(env)),
        ("commit", _commit(env)),
        ("hardware", _hardware(env)),
        ("packages", _packages(env)),
        ("preset", suite.preset or NOT_RECORDED),
        ("command (reproduce)", fmt.cap_text(str(commands.get("run") or NOT_RECORDED))),
        ("command (continue this folder)", fmt.cap_text(str(commands.get("resume") or NOT_RECORDED))),
        ("accuracy scoring", f"{headline_mode(suite)}, greedy decoding, {datachecks.split_text(suite)}"),
        ("accuracy n and seeds", _accuracy_n(suite)),
    ]
