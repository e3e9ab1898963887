"""Claims check: the seed texts' quantitative claims (baselines/claims.yaml) beside what this run measured.

Every claim gets one of six verdicts, from a rule in :data:`CHECKS` applied to the result files:

- ``supported by measurement``: a measurement that could have come out otherwise agrees with the claim (within the
  range its entry states): a peak memory ratio, a phase's share of time, accuracy across group sizes;
- ``not supported by measurement``: such a measurement disagrees;
- ``true by construction`` / ``false by construction``: the claim follows from how the recipes are built, and the
  run only confirms the build: which networks a method keeps, that beta 0 drops the reference, that the critic
  costs its own weights + gradients + optimizer state, that GRPO has no critic phase. Such a verdict cannot fail
  unless the recipes change, so it is kept apart from the measured ones. The memory ratio shows both sides in one
  row (:func:`memory_ratio`): PPO's 16P + 16P + 4P + 4P accounted bytes over GRPO's 16P + 4P is 2.0 by
  arithmetic, and the measured peak (GPU, or ``cpu-rss`` on a CPU) decides the verdict wherever there is one;
- ``not separated by this run``: a comparison of two methods over seeds whose data cannot decide it either way (one
  common seed, seeds on both sides, or a paired t-test with p >= 0.05): the means and the test are shown, and the
  claim is neither supported nor refuted;
- ``not measured in this run``: the run has no reading that could decide it (no G sweep was run; the method did
  not finish; the precision policy never stores trained weights in bf16). Never a guess.

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

SUPPORTED = "supported by measurement"
NOT_SUPPORTED = "not supported by measurement"
BY_CONSTRUCTION = "true by construction"
NOT_BY_CONSTRUCTION = "false by construction"
NOT_MEASURED = "not measured in this run"
NOT_SEPARATED = "not separated by this run"
VERDICTS = (SUPPORTED, NOT_SUPPORTED, BY_CONSTRUCTION, NOT_BY_CONSTRUCTION, NOT_SEPARATED, NOT_MEASURED)
CSS_CLASS = {SUPPORTED: "supported", NOT_SUPPORTED: "not-supported", BY_CONSTRUCTION: "construction",
             NOT_BY_CONSTRUCTION: "not-supported", NOT_SEPARATED: "not-measured", NOT_MEASURED: "not-measured"}
"""The page's cell class per verdict (index.html colours measured, constructed and unmeasured verdicts apart)."""
ALPHA = 0.05
"""Significance level of the paired tests that decide the G-sweep claim and the seed comparisons."""
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


def _within(ratio: float, low: float, high: float, built: bool = False) -> str:
    if built:
        return BY_CONSTRUCTION if low <= ratio <= high else NOT_BY_CONSTRUCTION
    return SUPPORTED if low <= ratio <= high else NOT_SUPPORTED


def _built(ok: bool) -> str:
    return BY_CONSTRUCTION if ok else NOT_BY_CONSTRUCTION


def full_network(entry: Any) -> bool:
    """A network that counts as "full": weights of its own (weight_bytes > 0) shared with no other role (a LoRA
    reference is the actor's base with the adapters off: 0 bytes of its own, ``shared_with: ['actor']``)."""
    if not isinstance(entry, dict):
        return False
    return (fmt.num(entry.get("weight_bytes")) or 0) > 0 and not entry.get("shared_with") \
        and not (fmt.num(entry.get("shared_params")) or 0)


# --- rules ----------------------------------------------------------------------------------------------
def networks_present(suite: Suite, c: dict[str, Any]) -> Verdict:
    """The roles resident while training, each a full network (own weights, none shared): by construction."""
    run = _run(suite, c["method"])
    if run is None or not network_bytes(run):
        return Verdict(_why_missing(suite, c["method"]), NOT_MEASURED)
    entries = run.result.get("memory", {}).get("networks") or {}
    have, want = list(network_bytes(run)), _names(c["roles"])
    full = [role for role in have if full_network(entries.get(role))]

    def described(role: str) -> str:
        entry = entries.get(role)
        if full_network(entry):
            return role
        shared = ", ".join(entry.get("shared_with") or []) if isinstance(entry, dict) else ""
        why = f"shares the {shared} weights" if shared else "no weights of its own"
        return f"{role} (not a full network: {why})"

    verdict = _built(set(want) <= set(full))
    return Verdict(f"{run.label}: {len(full)} full network(s) of {len(have)} resident "
                   f"({', '.join(described(r) for r in have)})", verdict)


def networks_absent(suite: Suite, c: dict[str, Any]) -> Verdict:
    runs = [r for name in _names(c["method"]) for r in ok_methods(suite)
            if r.result.get("method") == name and network_bytes(r)]
    runs = list({r.label: r for r in runs}.values())
    if not runs:
        return Verdict(_why_missing(suite, c["method"]), NOT_MEASURED)
    unwanted = set(_names(c["roles"]))
    texts = [f"{r.label}: {', '.join(network_bytes(r))}" for r in runs]
    return Verdict("; ".join(texts), _built(not any(unwanted & set(network_bytes(r)) for r in runs)))


def beta_zero_reference(suite: Suite, c: dict[str, Any]) -> Verdict:
    runs = [r for name in _names(c["method"]) for r in ok_methods(suite)
            if r.result.get("method") == name and fmt.num((r.result.get("settings") or {}).get("beta")) == 0]
    if not runs:
        return Verdict("no GRPO run with beta = 0 in this run", NOT_MEASURED)
    run = runs[0]
    has_ref = "reference" in network_bytes(run)
    return Verdict(f"{run.label} (beta 0): {', '.join(network_bytes(run)) or 'no network count'}",
                   _built(not has_ref))


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
    if source == "static accounting":  # the accounting of how each recipe is built, at every point
        return Verdict(text, _built(ok))
    return Verdict(text, SUPPORTED if ok else NOT_SUPPORTED)


SOURCE_WORDS = {"cpu-rss": "resident set of the worker process tree, Python runtime included; a CPU run, not VRAM",
                "cpu-rss delta": "resident set over the post-load baseline; a CPU run, not VRAM",
                "cuda-allocated": "PyTorch's allocated GPU memory", "cuda-allocated peak": "PyTorch's allocated GPU "
                "memory", "nvml-process": "GPU memory of the process tree, NVML"}
"""What each measured memory source is, said beside its ratio (a CPU reading is never called VRAM)."""


def memory_ratio(suite: Suite, c: dict[str, Any]) -> Verdict:
    """PPO (``a``) over GRPO (``b``) memory, accounted and measured side by side in one row.

    Accounted: the static accounting (weights + gradients + optimizer state of every resident network), exact and
    fixed by the recipes. Measured: the whole run's peak from the first source in ``sources`` that both methods
    recorded, mean over the seeds both ran with that source (same source, same seeds). The verdict follows the
    measurement when there is one ("almost double" read as ``low``-``high``x); with none, the accounting decides it
    and the verdict says "by construction". A sweep compares every sweep point instead.
    """
    accounted, measured = _sweep_ratio(suite, c, "static accounting"), None
    for source in ("cuda-allocated peak", "cpu-rss delta"):
        measured = measured or _sweep_ratio(suite, c, source)
    if accounted is None and measured is None:
        accounted, measured = _accounted_ratio(suite, c), _measured_ratio(suite, c)
    parts = [f"accounted: {accounted.measured}" if accounted else "accounted: no network accounting",
             f"measured: {measured.measured}" if measured else "measured: no memory reading of both methods"]
    verdict = measured or accounted
    if verdict is None:
        missing = next((m for m in (c["a"], c["b"]) if _run(suite, m) is None), None)
        return Verdict(_why_missing(suite, missing) if missing else "; ".join(parts), NOT_MEASURED)
    return Verdict("; ".join(parts) + ("; the verdict follows the measurement" if measured and accounted else ""),
                   verdict.verdict)


def _accounted_ratio(suite: Suite, c: dict[str, Any]) -> Verdict | None:
    """The static accounting's a / b (by construction), or None without accounting for both."""
    a, b = _run(suite, c["a"]), _run(suite, c["b"])
    if a is None or b is None or not network_bytes(a) or not network_bytes(b):
        return None
    ta, tb = sum(network_bytes(a).values()), sum(network_bytes(b).values())
    return Verdict(f"{a.label} {mib(ta)} / {b.label} {mib(tb)} = {ta / tb:.2f}× (static accounting: weights + "
                   f"gradients + optimizer state of the networks each recipe keeps, exact, fixed by the recipes)",
                   _within(ta / tb, c["low"], c["high"], built=True))


def _measured_ratio(suite: Suite, c: dict[str, Any]) -> Verdict | None:
    """The measured peak's a / b: the first of ``c["sources"]`` both methods recorded on common seeds, each side
    the mean over those seeds (bytes); None when no source has a reading of both on one seed."""
    def by_seed(methods: Any) -> dict[Any, Run]:  # the first listed method that ran ok, one run per seed
        name = next((m for m in _names(methods) if any(r.result.get("method") == m for r in ok_methods(suite))),
                    None)
        return {r.result.get("seed"): r for r in ok_methods(suite) if r.result.get("method") == name}

    runs_a, runs_b = by_seed(c["a"]), by_seed(c["b"])
    for source in _names(c["sources"]):
        seeds = [s for s in runs_a if s in runs_b and _peak(runs_a[s], source) and _peak(runs_b[s], source)]
        if not seeds:
            continue
        pa = sum(_peak(runs_a[s], source) for s in seeds) / len(seeds)
        pb = sum(_peak(runs_b[s], source) for s in seeds) / len(seeds)
        label_a, label_b = runs_a[seeds[0]].label, runs_b[seeds[0]].label
        return Verdict(f"{label_a} {mib(pa)} / {label_b} {mib(pb)} = {pa / pb:.2f}× (peak {source}: "
                       f"{SOURCE_WORDS.get(source, source)}; mean over seed{'s' if len(seeds) > 1 else ''} "
                       f"{', '.join(map(str, seeds))})", _within(pa / pb, c["low"], c["high"]))
    return None


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
    return Verdict(text, _built(same and grads > 0 and optim > 0))


def critic_time(suite: Suite, c: dict[str, Any]) -> Verdict:
    a, b = _run(suite, c["a"]), _run(suite, c["b"])
    if a is None or b is None:
        return Verdict(_why_missing(suite, c["a"] if a is None else c["b"]), NOT_MEASURED)
    ta, tb = _phase_time(a, "critic"), _phase_time(b, "critic")
    if ta is None:
        return Verdict(f"{a.label} recorded no critic phase", NOT_MEASURED)
    share = ta / (_total_time(a) or ta)
    return Verdict(f"critic phase: {a.label} {ta:,.2f} s ({share:.0%} of its phase time); "
                   f"{b.label} {'none' if not tb else f'{tb:,.2f} s'} (the engine runs a critic phase only when "
                   f"the method has a critic)", _built(ta > 0 and not tb))


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


GROUP_SIZE_KEY = "train.group_size"


def _group_size(run: Run) -> int | None:
    g = fmt.num((run.result.get("settings") or {}).get("group_size"))
    if g is None:
        g = fmt.num(((run.result.get("spec") or {}).get("train") or {}).get("group_size"))
    return None if g is None else int(g)


def _other_settings(run: Run) -> tuple[tuple[str, str], ...]:
    """The run's sweep values other than G: only runs equal in everything else are compared across G."""
    values = (run.result.get("sweep") or {}).get("values") or {}
    return tuple(sorted((str(k), repr(v)) for k, v in values.items() if k != GROUP_SIZE_KEY))


def group_size_sweep(suite: Suite, c: dict[str, Any]) -> Verdict:
    """G in [low, high] against the best larger G, per GRPO method at equal other settings, seeds averaged.

    Only the methods the claim names (GRPO's, by default) count, and only runs that agree on every other sweep
    value, so another method's or another setting's point cannot decide it. Per group, the G in range and the
    larger G with the highest mean accuracy over seeds are compared by a paired test: a paired t-test over the
    seeds both ran (two or more, with a spread), else McNemar on the same questions of one seed (clustered where
    questions share a working). Supported when the G in range is not significantly below (p >= 0.05 or a
    difference >= 0) in every group; not supported when it is significantly below in some group.
    """
    from bench.report import tables
    from bench.scoring import stats

    mode = headline_mode(suite)
    methods = _names(c.get("methods") or ["grpo", "grpo_engine"])
    groups: dict[tuple[Any, ...], dict[int, list[Run]]] = {}
    for run in ok_methods(suite):
        g = _group_size(run)
        if run.result.get("method") in methods and g is not None and accuracy(run, "after", mode):
            key = (run.label, _other_settings(run))
            groups.setdefault(key, {}).setdefault(g, []).append(run)
    swept = {k: v for k, v in groups.items() if len(v) > 1}
    if not swept:
        sizes = sorted({g for v in groups.values() for g in v})
        return Verdict(f"no G sweep of {' / '.join(methods)} at equal other settings in this run (G = "
                       f"{', '.join(map(str, sizes)) or 'none recorded'})", NOT_MEASURED)
    texts, verdicts = [], []

    def mean_acc(runs: list[Run]) -> float:
        return sum(accuracy(r, "after", mode)["accuracy"] for r in runs) / len(runs)

    for (label, others), by_g in swept.items():
        inside = {g: runs for g, runs in by_g.items() if c["low"] <= g <= c["high"]}
        larger = {g: runs for g, runs in by_g.items() if g > c["high"]}
        where = label + (f" at {', '.join(f'{k}={v}' for k, v in others)}" if others else "")
        listed = "; ".join(f"G={g}: {fmt.pct(mean_acc(runs))} (mean of {len(runs)} seed(s))"
                           for g, runs in sorted(by_g.items()))
        if not inside or not larger:
            texts.append(f"{where}: {listed} (no G on both sides of the range)")
            continue
        g_in = max(inside, key=lambda g: mean_acc(inside[g]))
        g_out = max(larger, key=lambda g: mean_acc(larger[g]))
        a = {r.result.get("seed"): r for r in inside[g_in]}
        b = {r.result.get("seed"): r for r in larger[g_out]}
        common = sorted(set(a) & set(b), key=str)
        diff = mean_acc(inside[g_in]) - mean_acc(larger[g_out])
        p, how = None, "no seed in common: no paired test"
        if len(common) >= 2:
            test = stats.paired_t_test([accuracy(a[s], "after", mode)["accuracy"] for s in common],
                                       [accuracy(b[s], "after", mode)["accuracy"] for s in common])
            p, how = test["p_value"], f"paired t-test over {len(common)} seeds"
            if test["undefined"]:
                how += f" undefined ({test['undefined']})"
        if p is None and common:
            seed = common[0]
            va, vb = tables.verdict_map(a[seed], mode), tables.verdict_map(b[seed], mode)
            pair = tables._paired(va, vb)
            if pair is not None:
                test = tables.compare(*pair, tables._clusters(a[seed], b[seed], va, vb))
                p, how = test["p_value"], f"{test['test']} on {test['n']:,} questions of seed {seed}"
        below = p is not None and p < ALPHA and diff < 0
        texts.append(f"{where}: {listed}; G={g_in} − G={g_out}: {100 * diff:+.1f} pp ({how}"
                     + (f", p = {fmt.p_value_text(p)}" if p is not None else "") + ")")
        verdicts.append(None if p is None else (NOT_SUPPORTED if below else SUPPORTED))
    text = " | ".join(texts)
    if not verdicts or (None in verdicts and NOT_SUPPORTED not in verdicts):
        return Verdict(text, NOT_MEASURED)
    return Verdict(text, NOT_SUPPORTED if NOT_SUPPORTED in verdicts else SUPPORTED)


def bf16_updates(suite: Suite, c: dict[str, Any]) -> Verdict:
    """Needs a run whose trained actor is stored in bf16, which the suite's precision policy never makes (it keeps
    fp32 master weights for every trained network: bench/model/precision.py). So a suite run cannot reach a
    verdict; the claim is measured by tests/test_precision.py instead, and the text says so."""
    for run in ok_methods(suite):
        policy = ((run.result.get("settings") or {}).get("precision") or {}).get("actor") or {}
        share = fmt.changed_fraction(run)
        if isinstance(policy, dict) and policy.get("storage") == "bfloat16" and share is not None:
            return Verdict(f"{run.label}: {fmt.pct(share)} of trained weights changed (bf16 storage)",
                           SUPPORTED if share < c["below"] else NOT_SUPPORTED)
    return Verdict("cannot be measured by a suite run: the precision policy stores every trained network in fp32 "
                   "(master weights, bench/model/precision.py), so no run trains bf16-stored weights; "
                   "tests/test_precision.py measures it directly (20 steps at lr 1e-6 on bf16-stored weights moved "
                   "about 2.5% of them, with fp32 masters over 90%)", NOT_MEASURED)


# --- GRPO's successors: one value per seed, a method against GRPO ------------------------------------------
def _seed_values(suite: Suite, methods: Any, value: Callable[[Run], float | None]
                 ) -> tuple[str, dict[Any, float]] | None:
    """(label, {seed: value}) of the first listed method with an ok run that has a value; None when none has."""
    for name in _names(methods):
        runs = [r for r in ok_methods(suite) if r.result.get("method") == name]
        values = {r.result.get("seed"): value(r) for r in runs}
        values = {s: v for s, v in values.items() if v is not None}
        if values:
            return runs[0].label, values
    return None


def _seed_list(values: dict[Any, float]) -> str:
    return f"seed{'s' if len(values) > 1 else ''} {', '.join(map(str, values))}"


def _compare_seeds(suite: Suite, c: dict[str, Any], value: Callable[[Run], float | None], what: str,
                   unit: str) -> Verdict:
    """Method ``a`` against ``b`` (each the first listed with a value) on ``value`` per seed, on the side
    ``c["relation"]`` ('below' / 'above'). The seeds decide only when they separate the methods (:func:`separated`):
    supported when a's mean over its ok seeds lies on the claimed side, not supported when on the other; otherwise
    not separated by this run. The means, the seed-by-seed count and the paired t-test p are shown either way."""
    from bench.scoring import stats

    sides = {}
    for key in ("a", "b"):
        found = _seed_values(suite, c[key], value)
        if found is None:
            ran = _run(suite, c[key])
            why = _why_missing(suite, c[key]) if ran is None else f"{ran.label} recorded no {what}"
            return Verdict(why + (f" ({c['absent']})" if ran is not None and c.get("absent") else ""), NOT_MEASURED)
        sides[key] = found
    (la, va), (lb, vb) = sides["a"], sides["b"]
    ma, mb = sum(va.values()) / len(va), sum(vb.values()) / len(vb)
    below = c["relation"] == "below"
    holds = ma < mb if below else ma > mb
    text = (f"{what}: {la} {ma:,.{c.get('digits', 3)}f} ({_seed_list(va)}) against {lb} "
            f"{mb:,.{c.get('digits', 3)}f}{unit} ({_seed_list(vb)}), mean over each method's ok seeds")
    common = [s for s in va if s in vb]
    test = None
    if common:
        side = sum((va[s] < vb[s]) if below else (va[s] > vb[s]) for s in common)
        text += f"; {c['relation']} on {side} of {len(common)} common seed(s)"
    if len(common) >= 2:
        test = stats.paired_t_test([va[s] for s in common], [vb[s] for s in common])
        p = test["p_value"]
        text += "; paired t-test over seeds " + (f"p = {fmt.p_value_text(p)}" if p is not None else
                                                  f"undefined ({test['undefined']})")
    if not separated(test, [va[s] - vb[s] for s in common]):
        return Verdict(text + f" (the seeds do not separate them at p < {ALPHA})", NOT_SEPARATED)
    return Verdict(text, SUPPORTED if holds else NOT_SUPPORTED)


def separated(test: dict[str, Any] | None, differences: list[float]) -> bool:
    """Whether paired seeds tell two methods apart: a paired t-test over two or more common seeds with p < ALPHA,
    or every difference the same and non-zero (zero spread: the standard error is 0, so no p, and no doubt)."""
    from bench.scoring import stats

    if test is None:
        return False
    if test["p_value"] is not None:
        return test["p_value"] < ALPHA
    return test["undefined"] == stats.ZERO_SPREAD and bool(differences) and differences[0] != 0


def incorrect_length(run: Run, mode: str) -> float | None:
    """Mean generated tokens of the final evaluation's incorrect completions under ``mode`` (completions.jsonl's
    ``tokens`` and verdicts); None without per-question token counts or without an incorrect completion."""
    lengths = [fmt.num(row.get("tokens")) for row in run.verdicts or [] if fmt.verdict(row, mode) is False]
    lengths = [v for v in lengths if v is not None]
    return sum(lengths) / len(lengths) if lengths else None


def incorrect_length_compare(suite: Suite, c: dict[str, Any]) -> Verdict:
    """Mean length (tokens) of incorrect final-evaluation completions, headline mode: ``a`` against ``b``."""
    mode = headline_mode(suite)
    return _compare_seeds(suite, {"digits": 1, **c}, lambda run: incorrect_length(run, mode),
                          f"mean length of incorrect completions (final evaluation, {mode})", " tokens")


def curve_end_compare(suite: Suite, c: dict[str, Any]) -> Verdict:
    """The last-fifth mean of training curve ``c["curve"]`` (the dynamics table's window): ``a`` against ``b``.
    A curve no run logs reads 'not measured' with ``c["absent"]``, the reason."""
    from bench.report import dynamics

    return _compare_seeds(suite, c, lambda run: dynamics.window_mean(dynamics._points(run), c["curve"]),
                          f"'{c['curve']}' over the last fifth of training", "")


def networks_at_most(suite: Suite, c: dict[str, Any]) -> Verdict:
    """Each of ``methods`` holds no more full networks (:func:`full_network`, static accounting of
    ``result["memory"]["networks"]``) than ``than`` (the first listed with an ok run): by construction."""
    base = _run(suite, c["than"])
    base = base if base is not None and network_bytes(base) else None
    runs = [r for r in (_run(suite, m) for m in _names(c["methods"])) if r is not None and network_bytes(r)]
    if base is None or not runs:
        return Verdict(_why_missing(suite, c["than"] if base is None else c["methods"]), NOT_MEASURED)

    def full(run: Run) -> list[str]:
        entries = run.result.get("memory", {}).get("networks") or {}
        return [role for role in network_bytes(run) if full_network(entries.get(role))]

    limit = len(full(base))
    texts = [f"{r.label}: {len(full(r))} ({', '.join(full(r)) or 'none'})" for r in [base, *runs]]
    missing = [m for m in _names(c["methods"]) if _run(suite, m) is None]
    note = f"; {', '.join(missing)} not in this run or not ok" if missing else ""
    return Verdict("full networks (static accounting): " + "; ".join(texts) + note,
                   _built(all(len(full(r)) <= limit for r in runs)))


CHECKS: dict[str, Callable[[Suite, dict[str, Any]], Verdict]] = {
    f.__name__: f for f in (networks_present, networks_absent, beta_zero_reference, memory_ratio,
                            critic_saving, critic_time, phase_share_below, group_size_sweep, bf16_updates,
                            incorrect_length_compare, curve_end_compare, networks_at_most)
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
    notes = [f"Measured: {counts[SUPPORTED]} supported, {counts[NOT_SUPPORTED]} not supported. By construction "
             f"(follows from how the recipes are built; the run confirms the build, it could not refute the "
             f"claim): {counts[BY_CONSTRUCTION]} true, {counts[NOT_BY_CONSTRUCTION]} false. "
             f"{counts[NOT_MEASURED]} not measured in this run. Claims and rules: baselines/claims.yaml, "
             f"bench/report/claims.py."] if rows else []
    return fmt.Table(HEADER, rows, notes=notes)
