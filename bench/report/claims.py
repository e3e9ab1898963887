"""Claims check: the seed texts' quantitative claims (baselines/claims.yaml) beside what this run measured.

Every claim gets one of three verdicts, from a rule in :data:`CHECKS` applied to the result files:

- ``supported``: the measurement agrees with the claim (within the range its entry states);
- ``not supported``: the measurement disagrees;
- ``not measured in this run``: the run has no reading that could decide it (a CPU run has no VRAM; no G sweep
  was run; the method did not finish). Never a guess.

A rule returns the measured text and the verdict; the claim, its source and how it is measured come from the
YAML, so adding a claim with an existing rule is one YAML entry.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from bench.report import fmt
from bench.report.findings import accuracy, headline_mode, mib, network_bytes, ok_methods
from bench.report.load import Run, Suite

SUPPORTED = "supported"
NOT_SUPPORTED = "not supported"
NOT_MEASURED = "not measured in this run"
VERDICTS = (SUPPORTED, NOT_SUPPORTED, NOT_MEASURED)
HEADER = ["claim", "source", "how it is measured", "measured in this run", "verdict"]


def claims_path() -> Path:
    """baselines/claims.yaml, found without importing ``baselines`` (its recipes import torch)."""
    spec = importlib.util.find_spec("baselines")
    roots = list(spec.submodule_search_locations or []) if spec else []
    if roots:
        return Path(roots[0]) / "claims.yaml"
    return Path(__file__).resolve().parents[2] / "baselines" / "claims.yaml"


def load_claims(path: Path | None = None) -> list[dict[str, Any]]:
    """The claim entries; [] when the file is missing (a report still builds without it)."""
    path = path or claims_path()
    if not path.is_file():
        return []
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    return [c for c in data if isinstance(c, dict) and c.get("claim")]


@dataclass
class Verdict:
    """What the rule found: the measured text and one of :data:`VERDICTS`."""

    measured: str
    verdict: str


# --- helpers --------------------------------------------------------------------------------------------
def _names(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else [str(v) for v in value or []]


def _run(suite: Suite, methods: Any) -> Run | None:
    """The first ok run of the first listed method that has one."""
    for name in _names(methods):
        for run in ok_methods(suite):
            if run.result.get("method") == name:
                return run
    return None


def _why_missing(suite: Suite, methods: Any) -> str:
    names = _names(methods)
    ran = [r for r in suite.methods if r.result.get("method") in names]
    if not ran:
        return f"{' / '.join(names)} not in this run"
    return f"{' / '.join(names)} did not finish ok ({fmt.status_text(ran[0])})"


def _within(ratio: float, low: float, high: float) -> str:
    return SUPPORTED if low <= ratio <= high else NOT_SUPPORTED


# --- rules ----------------------------------------------------------------------------------------------
def networks_present(suite: Suite, c: dict[str, Any]) -> Verdict:
    run = _run(suite, c["method"])
    if run is None or not network_bytes(run):
        return Verdict(_why_missing(suite, c["method"]), NOT_MEASURED)
    have, want = list(network_bytes(run)), _names(c["roles"])
    verdict = SUPPORTED if set(want) <= set(have) else NOT_SUPPORTED
    return Verdict(f"{run.label}: {len(have)} networks resident ({', '.join(have)})", verdict)


def networks_absent(suite: Suite, c: dict[str, Any]) -> Verdict:
    runs = [r for name in _names(c["method"]) for r in ok_methods(suite)
            if r.result.get("method") == name and network_bytes(r)]
    runs = list({r.label: r for r in runs}.values())
    if not runs:
        return Verdict(_why_missing(suite, c["method"]), NOT_MEASURED)
    unwanted = set(_names(c["roles"]))
    texts = [f"{r.label}: {', '.join(network_bytes(r))}" for r in runs]
    verdict = NOT_SUPPORTED if any(unwanted & set(network_bytes(r)) for r in runs) else SUPPORTED
    return Verdict("; ".join(texts), verdict)


def beta_zero_reference(suite: Suite, c: dict[str, Any]) -> Verdict:
    runs = [r for name in _names(c["method"]) for r in ok_methods(suite)
            if r.result.get("method") == name and fmt.num((r.result.get("settings") or {}).get("beta")) == 0]
    if not runs:
        return Verdict("no GRPO run with beta = 0 in this run", NOT_MEASURED)
    run = runs[0]
    has_ref = "reference" in network_bytes(run)
    return Verdict(f"{run.label} (beta 0): {', '.join(network_bytes(run)) or 'no network count'}",
                   NOT_SUPPORTED if has_ref else SUPPORTED)


def _sweep_ratio(suite: Suite, c: dict[str, Any], source: str) -> Verdict | None:
    """With a sweep (several model sizes, G, lengths): the ratio a / b at every point that ran both, supported only
    when every point is within range; None when the suite has no sweep points with both methods."""
    from bench.report import scaling  # imported here: scaling imports figures, which the claims never need

    points = scaling.sweep_points(suite)
    if not points:
        return None
    by = {(p.point, p.method): p for p in points}
    ratios = []
    for point in dict.fromkeys(p.point for p in points):
        a = next((by[(point, m)] for m in _names(c["a"]) if (point, m) in by), None)
        b = next((by[(point, m)] for m in _names(c["b"]) if (point, m) in by), None)
        if a and b and a.measured(source) and b.measured(source):
            ratios.append((point, a.measured(source) / b.measured(source)))
    if not ratios:
        return None
    text = "; ".join(f"{point}: {r:.2f}×" for point, r in ratios) + f" ({source}, every sweep point)"
    ok = all(c["low"] <= r <= c["high"] for _, r in ratios)
    return Verdict(text, SUPPORTED if ok else NOT_SUPPORTED)


def static_ratio(suite: Suite, c: dict[str, Any]) -> Verdict:
    swept = _sweep_ratio(suite, c, "static accounting")
    if swept:
        return swept
    a, b = _run(suite, c["a"]), _run(suite, c["b"])
    if a is None or b is None or not network_bytes(a) or not network_bytes(b):
        return Verdict(_why_missing(suite, c["a"] if a is None else c["b"]), NOT_MEASURED)
    ta, tb = sum(network_bytes(a).values()), sum(network_bytes(b).values())
    ratio = ta / tb
    return Verdict(f"{a.label} {mib(ta)} / {b.label} {mib(tb)} = {ratio:.2f}× (accounting, exact)",
                   _within(ratio, c["low"], c["high"]))


def peak_ratio(suite: Suite, c: dict[str, Any]) -> Verdict:
    swept = _sweep_ratio(suite, c, "cuda-allocated peak")
    if swept:
        return swept
    a, b = _run(suite, c["a"]), _run(suite, c["b"])
    if a is None or b is None:
        return Verdict(_why_missing(suite, c["a"] if a is None else c["b"]), NOT_MEASURED)
    for source in _names(c["sources"]):
        pa, pb = _peak(a, source), _peak(b, source)
        if pa and pb:
            ratio = pa / pb
            return Verdict(f"{a.label} {mib(pa)} / {b.label} {mib(pb)} = {ratio:.2f}× ({source})",
                           _within(ratio, c["low"], c["high"]))
    source = a.result.get("memory", {}).get("source") or "none"
    return Verdict(f"no GPU memory reading (this run's memory source: {source})", NOT_MEASURED)


def _peak(run: Run, source: str) -> float | None:
    memory = run.result.get("memory", {})
    if memory.get("source") == source:
        return fmt.num(memory.get("peak_bytes"))
    by_source = memory.get("by_source") if isinstance(memory.get("by_source"), dict) else {}
    return fmt.num(by_source.get(source))


def critic_saving(suite: Suite, c: dict[str, Any]) -> Verdict:
    a, b = _run(suite, c["a"]), _run(suite, c["b"])
    if a is None or b is None or not network_bytes(a) or not network_bytes(b):
        return Verdict(_why_missing(suite, c["a"] if a is None else c["b"]), NOT_MEASURED)
    entry = (a.result.get("memory", {}).get("networks") or {}).get("critic")
    if not isinstance(entry, dict):
        return Verdict(f"{a.label} recorded no critic", NOT_MEASURED)
    diff = sum(network_bytes(a).values()) - sum(network_bytes(b).values())
    critic = network_bytes(a)["critic"]
    grads, optim = fmt.num(entry.get("grad_bytes")) or 0, fmt.num(entry.get("optimizer_bytes")) or 0
    text = (f"{a.label} − {b.label} = {mib(diff)}; critic = {mib(critic)} (weights "
            f"{mib(fmt.num(entry.get('weight_bytes')) or 0)} + grads {mib(grads)} + optimizer {mib(optim)})")
    same = abs(diff - critic) <= 0.01 * max(critic, 1)
    return Verdict(text, SUPPORTED if same and grads > 0 and optim > 0 else NOT_SUPPORTED)


def critic_time(suite: Suite, c: dict[str, Any]) -> Verdict:
    a, b = _run(suite, c["a"]), _run(suite, c["b"])
    if a is None or b is None:
        return Verdict(_why_missing(suite, c["a"] if a is None else c["b"]), NOT_MEASURED)
    ta, tb = _phase_time(a, "critic"), _phase_time(b, "critic")
    if ta is None:
        return Verdict(f"{a.label} recorded no critic phase", NOT_MEASURED)
    share = ta / (_total_time(a) or ta)
    verdict = SUPPORTED if ta > 0 and not tb else NOT_SUPPORTED
    return Verdict(f"critic phase: {a.label} {ta:,.2f} s ({share:.0%} of its phase time); "
                   f"{b.label} {'none' if not tb else f'{tb:,.2f} s'}", verdict)


def _phase_time(run: Run, phase: str) -> float | None:
    entry = (run.result.get("phases") or {}).get(phase)
    return fmt.num(entry.get("time_s")) if isinstance(entry, dict) else None


def _total_time(run: Run) -> float:
    return sum(_phase_time(run, p) or 0 for p in (run.result.get("phases") or {}))


def phase_share_below(suite: Suite, c: dict[str, Any]) -> Verdict:
    run = _run(suite, c["method"])
    if run is None:
        return Verdict(_why_missing(suite, c["method"]), NOT_MEASURED)
    t = _phase_time(run, c["phase"])
    if t is None:
        return Verdict(f"{run.label} has no '{c['phase']}' phase: it is timed inside another phase (update), "
                       f"so its share is not isolated", NOT_MEASURED)
    share = t / (_total_time(run) or 1)
    return Verdict(f"{run.label}: {t:,.3f} s, {share:.2%} of phase time",
                   SUPPORTED if share < c["below"] else NOT_SUPPORTED)


def group_size_sweep(suite: Suite, c: dict[str, Any]) -> Verdict:
    by_g: dict[int, list[Run]] = {}
    for run in ok_methods(suite):
        g = fmt.num((run.result.get("settings") or {}).get("group_size"))
        if g is None:
            g = fmt.num(((run.result.get("spec") or {}).get("train") or {}).get("group_size"))
        if g is not None and accuracy(run, "after", headline_mode(suite)):
            by_g.setdefault(int(g), []).append(run)
    if len(by_g) < 2:
        sizes = ", ".join(map(str, sorted(by_g))) or "none recorded"
        return Verdict(f"one group size only (G = {sizes}); no G sweep in this run", NOT_MEASURED)
    mode = headline_mode(suite)
    best = {g: max((accuracy(r, "after", mode) for r in runs), key=lambda s: s["accuracy"]) for g, runs in by_g.items()}
    text = "; ".join(f"G={g}: {fmt.score_text(s)}" for g, s in sorted(best.items()))
    inside = [s for g, s in best.items() if c["low"] <= g <= c["high"]]
    larger = [s for g, s in best.items() if g > c["high"]]
    if not inside or not larger:
        return Verdict(text + " (no G on both sides of the range)", NOT_MEASURED)
    top_in = max(inside, key=lambda s: s["accuracy"])
    top_out = max(larger, key=lambda s: s["accuracy"])
    ok = top_in["high"] is not None and top_out["low"] is not None and top_in["high"] >= top_out["low"]
    return Verdict(text, SUPPORTED if ok else NOT_SUPPORTED)


def bf16_updates(suite: Suite, c: dict[str, Any]) -> Verdict:
    for run in ok_methods(suite):
        policy = ((run.result.get("settings") or {}).get("precision") or {}).get("actor") or {}
        share = fmt.changed_fraction(run)
        if isinstance(policy, dict) and policy.get("storage") == "bfloat16" and share is not None:
            return Verdict(f"{run.label}: {fmt.pct(share)} of trained weights changed (bf16 storage)",
                           SUPPORTED if share < c["below"] else NOT_SUPPORTED)
    return Verdict("no run stored its trained weights in bfloat16 (the suite keeps fp32 master weights)",
                   NOT_MEASURED)


CHECKS: dict[str, Callable[[Suite, dict[str, Any]], Verdict]] = {
    f.__name__: f for f in (networks_present, networks_absent, beta_zero_reference, static_ratio, peak_ratio,
                            critic_saving, critic_time, phase_share_below, group_size_sweep, bf16_updates)
}


def check(suite: Suite, claim: dict[str, Any]) -> Verdict:
    """One claim's verdict; an unknown rule or a malformed entry reads 'not measured' with the reason."""
    rule = CHECKS.get(str(claim.get("check")))
    if rule is None:
        return Verdict(f"no rule '{claim.get('check')}' in bench.report.claims", NOT_MEASURED)
    try:
        return rule(suite, claim)
    except (KeyError, TypeError, ZeroDivisionError) as exc:  # a malformed entry or reading, not a report crash
        return Verdict(f"could not evaluate ({type(exc).__name__}: {exc})", NOT_MEASURED)


def claims_table(suite: Suite, claims: list[dict[str, Any]] | None = None) -> fmt.Table:
    """The claims check as a table: claim, source, how measured, what this run measured, verdict."""
    claims = load_claims() if claims is None else claims
    rows = []
    for claim in claims:
        v = check(suite, claim)
        rows.append([str(claim["claim"]), str(claim.get("source", fmt.MISSING)),
                     str(claim.get("measured", fmt.MISSING)), v.measured, v.verdict])
    counts = {k: sum(r[-1] == k for r in rows) for k in VERDICTS}
    notes = [f"{counts[SUPPORTED]} supported, {counts[NOT_SUPPORTED]} not supported, "
             f"{counts[NOT_MEASURED]} not measured in this run. Claims and rules: baselines/claims.yaml, "
             f"bench/report/claims.py."] if rows else []
    return fmt.Table(HEADER, rows, notes=notes)
