"""What a citation of the run needs, as (field, value) pairs for the page and summary.md.

Date, commit (and whether the tree had uncommitted changes), hardware, package versions, preset, the exact
command lines that reproduce and continue the run (recorded by the runner in suite.json ``commands``), and
n and seeds for every accuracy. A value the run did not record reads "not recorded", never a guess.
"""

from __future__ import annotations

import json
from typing import Any

from bench.report import fmt
from bench.report.findings import accuracy, headline_mode
from bench.report.load import SUITE_FILE, Suite

NOT_RECORDED = "not recorded"


def suite_meta(suite: Suite) -> dict[str, Any]:
    """suite.json as a dict ({} when missing or unreadable; load.py already reported that as a problem)."""
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


def _accuracy_n(suite: Suite) -> str:
    """'GRPO (TRL): n = 5,000, seeds 0, 1; ...' for every method with an accuracy after."""
    per_label: dict[str, tuple[set[str], set[str]]] = {}
    for run in suite.methods:
        after = accuracy(run, "after", headline_mode(suite)) if run.status == "ok" else None
        if after is None:
            continue
        ns, seeds = per_label.setdefault(run.label, (set(), set()))
        ns.add(fmt.int_text(after.get("total")))
        seeds.add(str(run.result.get("seed")))
    if not per_label:
        return "no accuracy measured"
    return "; ".join(f"{label}: n = {'/'.join(sorted(ns))}, seed{'s' if len(seeds) > 1 else ''} "
                     f"{', '.join(sorted(seeds))}" for label, (ns, seeds) in per_label.items())


def citation(suite: Suite) -> list[tuple[str, str]]:
    """(field, value) pairs: everything a citation of this run needs."""
    meta, env = suite_meta(suite), environment(suite)
    commands = meta.get("commands") if isinstance(meta.get("commands"), dict) else {}
    return [
        ("date", str(suite.created_at or env.get("time_utc") or NOT_RECORDED)),
        ("commit", _commit(env)),
        ("hardware", _hardware(env)),
        ("packages", _packages(env)),
        ("preset", suite.preset or NOT_RECORDED),
        ("command (reproduce)", fmt.cap_text(str(commands.get("run") or NOT_RECORDED))),
        ("command (continue this folder)", fmt.cap_text(str(commands.get("resume") or NOT_RECORDED))),
        ("accuracy scoring", f"{headline_mode(suite)}, greedy decoding, held-out split"),
        ("accuracy n and seeds", _accuracy_n(suite)),
    ]
