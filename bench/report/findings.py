"""Findings first: a short list of what the run measured, generated from the result files.

Each finding carries its number, its uncertainty (or why it has none: an exact count, one reading) and its
source, and is worded by what the statistics support: a difference between methods is "significant" only
when its Holm-adjusted McNemar p-value is below :data:`ALPHA`, otherwise it reads "not significant". A finding
is never written without a measurement behind it: a method with no reading simply contributes none.

The measurement helpers here (static bytes per method, accuracy in the headline mode) are shared with the
claims check (bench.report.claims), so a claim's verdict and the finding beside it read the same number; and
which headline cell is bold (:func:`best_labels`) is decided here, by the same tests the findings word.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.scoring import stats
from bench.report import dynamics, fmt, seeds, tables, throughput
from bench.report.load import Run, Suite

ALPHA = 0.05
"""Significance level of the paired tests, after Holm's adjustment over every pair on the page."""
SAME_MEMORY = 0.05
"""Two static totals within 5% of each other are "the same" (no finding)."""
MAX_PAIR_FINDINGS = 3
"""Significant pairs listed one by one; the rest are counted, so the list stays short."""
MAX_FLAG_FINDINGS = 3
"""Monitor flags quoted in the findings; the rest are counted (all are listed under Results per method)."""
CRITIC = "critic"


@dataclass
class Finding:
    """One generated statement: ``text`` (the claim with its number) and ``basis`` (uncertainty and source)."""

    text: str
    basis: str

    def line(self) -> str:
        return f"{self.text} ({self.basis})"


# --- measurements shared with claims.py ---------------------------------------------------------------
def headline_mode(suite: Suite | None = None) -> str:
    """The scoring mode findings quote: the folder's headline mode (report_settings.json, else the verifier's)."""
    return str((suite.headline_mode if suite is not None else None) or fmt.HEADLINE_MODE)


def accuracy(run: Run, when: str, mode: str | None = None, suite: Suite | None = None) -> dict[str, Any] | None:
    """``fmt.score`` in ``mode`` (default: the verifier's headline mode); old 'strict' keys are read too.

    With ``suite``, a method's "before" is its starting checkpoint's own evaluation (the warm start of its seed,
    tables' start run), whose per-question verdicts give the interval its clusters (fmt.score: cluster-adjusted
    where questions share a working); the method's recorded "before" is the same score copied, without them.
    """
    mode = mode or fmt.HEADLINE_MODE
    if when == "before" and suite is not None and run.kind == "method" and not run.result.get("sweep"):
        start = tables.start_run(suite, run.result.get("seed"))
        if start is not None:
            found = fmt.score(start, "after", mode)
            if found is not None:
                return found
    return fmt.score(run, when, mode)


def network_bytes(run: Run) -> dict[str, float]:
    """Role -> weights + gradients + optimizer state bytes (static accounting).

    Empty when any part is unknown (a missing count, or an optimizer that had not stepped when it was counted:
    ``optimizer_state_materialized: False``), because a partial sum would understate the total."""
    out = {}
    for role, entry in (run.result.get("memory", {}).get("networks") or {}).items():
        if not isinstance(entry, dict):
            continue
        parts = [fmt.num(entry.get(k)) for k in ("weight_bytes", "grad_bytes", "optimizer_bytes")]
        if None in parts or entry.get("optimizer_state_materialized") is False:
            return {}
        out[str(role)] = float(sum(parts))
    return out


def static_by_label(suite: Suite) -> dict[str, tuple[Run, float]]:
    """Label -> (run, total static bytes) for the first ok run per label with a complete network count."""
    runs = fmt.first_per_label(ok_methods(suite), lambda r: bool(network_bytes(r)))
    return {r.label: (r, sum(network_bytes(r).values())) for r in runs}


def ok_methods(suite: Suite) -> list[Run]:
    return [r for r in suite.methods if r.status == "ok"]


def mib(value: float) -> str:
    return f"{value / fmt.MIB:,.2f} MiB" if value < 4 * fmt.GIB else f"{value / fmt.GIB:,.2f} GiB"


def seeds_text(runs: list[Run]) -> str:
    seeds = sorted({r.result.get("seed") for r in runs if r.result.get("seed") is not None})
    return f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} ({', '.join(map(str, seeds))})" if seeds else "seed n/a"


def paired_with_holm(suite: Suite) -> list[dict[str, Any]]:
    """tables.paired_tests with a Holm-adjusted p-value per pair (``p_holm``), over every pair on the page."""
    tests = tables.paired_tests(suite)
    if tests and "p_holm" not in tests[0]:
        for t, p in zip(tests, stats.holm_adjust([t["p_value"] for t in tests])):
            t["p_holm"] = p
    return tests


# --- the findings ---------------------------------------------------------------------------------------
def _memory_findings(suite: Suite) -> list[Finding]:
    """Static memory of each method against the smallest one (accounting: exact byte counts, no spread)."""
    static = static_by_label(suite)
    if len(static) < 2:
        return []
    base_label, (base_run, base) = min(static.items(), key=lambda kv: kv[1][1])
    out = []
    top_label, (top_run, top) = max(static.items(), key=lambda kv: kv[1][1])
    for label, (run, total) in [(top_label, (top_run, top))]:  # the widest gap; the headline has the rest
        if label == base_label or not base or abs(total / base - 1) < SAME_MEMORY:
            continue
        roles = ", ".join(network_bytes(run))
        out.append(Finding(
            f"{label}'s static training memory is {total / base:.2f}× {base_label}'s: {mib(total)} vs {mib(base)} "
            f"(networks: {roles})",
            "accounting of weights + gradients + optimizer state, exact byte counts"))
    critic = [(lbl, network_bytes(r)[CRITIC]) for lbl, (r, _) in static.items() if CRITIC in network_bytes(r)]
    if critic:
        lbl, b = critic[0]
        out.append(Finding(f"The critic alone costs {mib(b)} in {lbl} (weights + gradients + optimizer state)",
                           "accounting, exact"))
    return out


def _peak_findings(suite: Suite) -> list[Finding]:
    """Highest and lowest measured peak per memory source (one reading per run: no interval)."""
    by_source: dict[str, list[tuple[str, float]]] = {}
    names = fmt.display_names(suite.methods)
    for run in ok_methods(suite):
        memory = run.result.get("memory", {})
        peak = fmt.num(memory.get("peak_bytes"))
        if peak is not None and memory.get("source"):
            by_source.setdefault(str(memory["source"]), []).append((names[run.run_id], peak))
    out = []
    for source, readings in by_source.items():
        if len(readings) < 2:
            continue
        (lo_name, lo), (hi_name, hi) = min(readings, key=lambda x: x[1]), max(readings, key=lambda x: x[1])
        gpu = source.startswith(("cuda", "nvml"))
        what = "peak GPU memory" if gpu else "peak resident memory of the process (includes the Python runtime)"
        out.append(Finding(f"Measured {what}: highest {hi_name} {mib(hi)}, lowest {lo_name} {mib(lo)} "
                           f"({hi / lo:.2f}×)", f"{source}, one reading per run"))
    return out


def method_means(suite: Suite, mode: str | None = None) -> list[dict[str, Any]]:
    """Per method label (the control arm left out): the mean accuracy after over its ok seeds, the lowest and
    highest seed, the seeds, the mean accuracy before, n and the clusters of the first run; highest mean first."""
    mode = mode or headline_mode(suite)
    groups: dict[str, list[tuple[Run, dict[str, Any], dict[str, Any] | None]]] = {}
    for run in ok_methods(suite):
        after = accuracy(run, "after", mode)
        if after is not None and run.result.get("method") != tables.CONTROL_METHOD:
            groups.setdefault(run.label, []).append((run, after, accuracy(run, "before", mode)))
    out = []
    for label, scored in groups.items():
        values = [a["accuracy"] for _, a, _ in scored]
        befores = [b["accuracy"] for _, _, b in scored if b]
        first = scored[0][1]
        out.append({"label": label, "mean": sum(values) / len(values), "low": min(values), "high": max(values),
                    "seeds": len(values), "before": sum(befores) / len(befores) if befores else None,
                    "n": first.get("total"), "clusters": first.get("clusters"), "unit": fmt.cluster_unit(scored[0][0])})
    return sorted(out, key=lambda m: -m["mean"])


def _accuracy_findings(suite: Suite) -> list[Finding]:
    """Every method's mean accuracy after over its seeds with the range (highest first; not the best single run),
    and the lr-0 control's pipeline check when present."""
    mode = headline_mode(suite)
    means = method_means(suite, mode)
    out = []
    if means:
        def one(m: dict[str, Any]) -> str:
            spread = f" (range {100 * m['low']:.1f}–{100 * m['high']:.1f}%)" if m["seeds"] > 1 else ""
            return f"{m['label']} {fmt.pct(m['mean'])}{spread}"

        top = means[0]
        start = f"; the start scored {fmt.pct(top['before'])}" if top["before"] is not None else ""
        seeds_ = sorted({m["seeds"] for m in means})
        over = ("one seed" if seeds_ == [1] else f"mean over {seeds_[0]} seeds" if len(seeds_) == 1
                else "mean over each method's ok seeds")
        out.append(Finding(f"Accuracy after training ({over}): " + ", ".join(one(m) for m in means) + start,
                           f"{mode}, n = {fmt.n_text(top['n'], top['clusters'], top['unit'])} per run; each seed's "
                           f"95% interval under Results per method; differences under Paired tests and Seed-level "
                           f"tests"))
    for check in tables.control_checks(suite)[:1]:
        runs = tables.control_checks(suite)
        passed = [c for c in runs if c["passed"]]
        failed = [c for c in runs if c["passed"] is False]
        if failed:
            text = (f"Control (lr 0), the pipeline check: FAILED on {len(failed)} of {len(runs)} seed(s): accuracy "
                    f"after differs from its start, so something other than training moves the scores")
        elif passed:
            text = (f"Control (lr 0), the pipeline check: accuracy after equals its start exactly, on every "
                    f"question, in {modes_checked(check)}, on {len(passed)} of {len(runs)} seed(s)")
        else:
            continue
        out.append(Finding(text, f"question by question ({check['basis'] or 'recorded counts'}) in "
                                 f"{', '.join(check['modes']) or 'the recorded modes'}; a check of the "
                                 f"pipeline, not a noise floor of greedy accuracy (it has no spread there); its "
                                 f"training-reward curve is the sampling noise floor"))
    return out


def modes_checked(check: dict[str, Any]) -> str:
    """The modes a control check confirms, said as such: 'the 3 scoring modes that can score the task (lmeval-strict
    cannot: ...)'. A mode that scores nothing before and after confirms nothing, so it is never counted."""
    modes, skipped = check.get("modes") or [], check.get("not_applicable") or {}
    if not skipped:
        return "every scoring mode" if len(modes) != 1 else f"its one scoring mode ({modes[0]})"
    said = "the scoring mode" if len(modes) == 1 else f"the {len(modes)} scoring modes"
    return (f"{said} that can score the task ({', '.join(modes)}; not applicable: "
            + "; ".join(f"{m}: {why}" for m, why in skipped.items()) + ")")


def _paired_findings(suite: Suite) -> list[Finding]:
    """Differences between methods on the same questions, worded by the Holm-adjusted McNemar p-value."""
    tests = paired_with_holm(suite)
    significant = [t for t in tests if t["p_holm"] is not None and t["p_holm"] < ALPHA]
    out = []
    # Listed by the size of the difference, which is what "the largest" below says (not by p-value).
    for t in sorted(significant, key=lambda t: -abs(t["diff"]))[:MAX_PAIR_FINDINGS]:
        out.append(Finding(
            f"{t['a']} vs {t['b']} (seed {t['seed']}): {100 * t['diff']:+.1f} pp "
            f"[{100 * t['diff_low']:+.1f}, {100 * t['diff_high']:+.1f}],"
            f" significant", f"{headline_mode(suite)}, {t['test']} on the same "
            f"{fmt.n_text(t['n'], t['clusters'], t['unit'])}, Holm-adjusted {p_equals(t['p_holm'])}; "
            f"95% paired-bootstrap interval, not adjusted for multiple comparisons"))
    quiet = [t for t in tests if t not in significant]
    summary = (f"Of {len(tests)} per-seed comparison{'s' if len(tests) != 1 else ''} ({tables.family_text(tests)}), "
               f"{len(significant)} differ significantly")
    summary += (f" (the {len(out)} largest differences, by absolute size, above)" if out and len(significant) > len(out)
                else "")
    family = f' (family "{tests[0]["family"]}")' if tests else ""
    basis = (f"{headline_mode(suite)}, {tables.tests_used(tests)}, Holm-adjusted over {len(tests)} comparisons"
             f"{family}, α = {ALPHA}; every comparison under Paired tests")
    if quiet:
        t = max(quiet, key=lambda t: abs(t["diff"]))
        p = p_equals(t["p_holm"]) if t["p_holm"] is not None else "p n/a"
        summary += (f"; {len(quiet)} are not significantly different, the largest such gap {t['a']} vs {t['b']} "
                    f"{100 * t['diff']:+.1f} pp [{100 * t['diff_low']:+.1f}, {100 * t['diff_high']:+.1f}] "
                    f"(Holm-adjusted {p})")
    if tests:
        out.append(Finding(summary, basis))
    return out


def p_equals(p: float) -> str:
    """``"p = 0.0127"``, or ``"p < 1e-300"`` for a p-value that underflowed (fmt.p_value_text's bound)."""
    text = fmt.p_value_text(p)
    return f"p {text}" if text.startswith("<") else f"p = {text}"


def _seed_findings(suite: Suite) -> list[Finding]:
    """Method differences over seeds (paired t-test, Holm-adjusted): the claim a writeup ranks methods by. A pair
    whose seeds all differ by the same amount (zero spread) has no test: it is reported as undefined, never as
    significant."""
    every = seeds.seed_tests(suite)
    undefined = [t for t in every if t.get("undefined") == stats.ZERO_SPREAD]
    tests = [t for t in every if t.get("p_holm") is not None]
    out = []
    if undefined:
        listed = "; ".join(f"{t['a']} vs {t['b']} {100 * t['mean_diff']:+.2f} pp on every seed"
                           for t in undefined[:MAX_PAIR_FINDINGS])
        more = f"; and {len(undefined) - MAX_PAIR_FINDINGS} more" if len(undefined) > MAX_PAIR_FINDINGS else ""
        out.append(Finding(f"Over seeds, {len(undefined)} method pair(s) have no seed-to-seed spread at all, so the "
                           f"t-test is undefined (not significant, not a p-value): {listed}{more}",
                           "paired t-test over seeds: every paired difference is the same, so its standard error is "
                           "0; the per-question tests under Paired tests still apply"))
    if not tests:
        return out
    for t in sorted(tests, key=lambda t: -abs(t["mean_diff"]))[:MAX_PAIR_FINDINGS]:
        verdict = "significant" if t["p_holm"] < ALPHA else "not significant"
        ci = "" if t.get("low") is None else f" [{100 * t['low']:+.1f}, {100 * t['high']:+.1f}]"
        out.append(Finding(f"Over seeds, {t['a']} vs {t['b']}: {100 * t['mean_diff']:+.1f} pp{ci}, {verdict}",
                           f"{headline_mode(suite)}, paired t-test over {len(t['seeds'])} seeds, Holm-adjusted "
                           f"{p_equals(t['p_holm'])} in the family \"{t['family']}\" of {t['family_size']} "
                           f"test{'s' if t['family_size'] != 1 else ''}; 95% t interval"))
    shown = sorted(tests, key=lambda t: -abs(t["mean_diff"]))[:MAX_PAIR_FINDINGS]
    quiet = [t for t in tests if t["p_holm"] >= ALPHA]
    unshown = [t for t in quiet if t not in shown]
    if quiet:
        t = max(unshown or quiet, key=lambda t: abs(t["mean_diff"]))
        n_seeds = len(t["seeds"])
        out.append(Finding(f"Over seeds, {len(quiet)} of {len(tests)} method pairs are not significantly different; "
                           f"the largest such gap{' not listed above' if unshown else ''}: {t['a']} vs {t['b']} "
                           f"{100 * t['mean_diff']:+.1f} pp",
                           f"paired t-test over seeds, Holm-adjusted {p_equals(t['p_holm'])}; with {n_seeds} "
                           f"seed{'s' if n_seeds != 1 else ''} the test has little power"))
    return out


def _start_findings(suite: Suite) -> list[Finding]:
    """Each method against its starting checkpoint on the same questions (tables.start_tests, Holm-adjusted)."""
    tests = tables.start_tests(suite)
    if not tests:
        return []
    up = [t for t in tests if t["p_holm"] < ALPHA and t["diff"] > 0]
    down = [t for t in tests if t["p_holm"] < ALPHA and t["diff"] < 0]
    flat = [t for t in tests if t["p_holm"] >= ALPHA]

    def names(group: list[dict[str, Any]]) -> str:
        return ", ".join(f"{t['method']} {100 * t['diff']:+.1f} pp" for t in group)

    parts = [f"improved significantly: {names(up)}" if up else "",
             f"declined significantly: {names(down)}" if down else "",
             f"not significantly changed: {names(flat)}" if flat else ""]
    return [Finding("Against the starting checkpoint, " + "; ".join(p for p in parts if p),
                    f"{headline_mode(suite)}, {tables.tests_used(tests)} on the same "
                    f"{fmt.n_text(tests[0]['n'], tests[0]['clusters'], tests[0]['unit'])}, Holm-adjusted over "
                    f"{len(tests)} run{'s' if len(tests) != 1 else ''} (family \"{tests[0]['family']}\"), "
                    f"α = {ALPHA}")]


SPEED_REFERENCES = ("grpo", "grpo_engine")
"""Method keys of the run every generation rate is compared with, in order of preference: GRPO (TRL), else the suite
engine's GRPO; without either, the first method with a rate. A named reference, not the fastest against the
slowest: a ratio of extremes grows with every method added and says nothing about any one of them."""
RATES = {"training": ("Completions per second of training", "throughput.completions / train_s: every phase of a "
                                                               "step (generation, reward, critic, update)"),
         "generation": ("Completions per second of the generation phase", "throughput.completions / "
                                                                            "phases.generation.time_s: decoding "
                                                                            "alone")}
"""The two generation rates the findings quote: (what the number is, how it is computed)."""


def contestants(suite: Suite) -> dict[str, list[Run]]:
    """Label -> ok method runs, the control arm left out: it runs GRPO's loop at lr 0 as a pipeline check, so it
    is never ranked, compared for speed or marked best."""
    groups: dict[str, list[Run]] = {}
    for run in ok_methods(suite):
        if not fmt.is_control(run):
            groups.setdefault(run.label, []).append(run)
    return groups


def _mean(values: list[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def generation_rates(suite: Suite) -> dict[str, dict[str, float]]:
    """Quantity ("training", "generation") -> label -> completions per second (1/s), the mean over the label's ok
    seeds, for contestants that generated while training; labels in suite order."""
    out: dict[str, dict[str, float]] = {"training": {}, "generation": {}}
    for label, runs in contestants(suite).items():
        for key, value in (("training", _mean([fmt.throughput(r, "completions_per_s") for r in runs])),
                           ("generation", _mean([throughput.generation_rate(r) for r in runs]))):
            if value:
                out[key][label] = value
    return out


def speed_reference(suite: Suite, labels: list[str]) -> str | None:
    """The label of :data:`SPEED_REFERENCES`' first method among ``labels``, else the first of ``labels``."""
    by_method = {r.result.get("method"): r.label for r in ok_methods(suite) if r.label in labels}
    return next((by_method[m] for m in SPEED_REFERENCES if m in by_method), labels[0] if labels else None)


def _speed_findings(suite: Suite) -> list[Finding]:
    """Completions per second of training and per second of the generation phase, each method against one named
    reference (:func:`speed_reference`); the lr-0 control runs GRPO's loop and is no contestant."""
    parallel, device = throughput.concurrency(suite)
    caveat = ("" if parallel == 1 else "; runs ran side by side, each on its own GPU" if device == "cuda"
              else "; runs shared the machine, so approximate")
    several = any(len(runs) > 1 for runs in contestants(suite).values())
    over = "mean over each method's ok seeds" if several else "one run each"
    out = []
    for key, rates in generation_rates(suite).items():
        ref = speed_reference(suite, list(rates))
        if ref is None or len(rates) < 2:
            continue
        others = "; ".join(f"{label} {rate:,.1f} ({rate / rates[ref]:.2f}×)" for label, rate in rates.items()
                           if label != ref)
        what, how = RATES[key]
        out.append(Finding(f"{what}: {ref} {rates[ref]:,.1f} (the reference); {others}",
                           f"{how}; × is each method's rate over {ref}'s; {over}{caveat}"))
    return out


def best_labels(suite: Suite) -> dict[str, str]:
    """Quantity -> the one contestant a test separates from every other contestant on it (the headline's bold).

    Quantities: "static" (bytes, exact accounting: a strict minimum needs no test), "peak" (bytes, readings of the
    most common source only), "step" (s), "tokens" and "completions" (per second of training), "accuracy" (headline
    mode). Contestants are the ok methods without the control arm; step time and rates compare only methods that
    generate while training (an offline method's step holds no generation). A measured quantity is separated by
    Welch's t-test over seeds against each other contestant, p < :data:`ALPHA` (one seed: no test, no mark);
    accuracy by the seed-level t-test, else every same-seed McNemar test, Holm-adjusted, p < :data:`ALPHA`. The best
    must beat every other contestant (an intersection-union test), so these tests need no further adjustment.
    """
    groups = contestants(suite)
    online = {lbl: runs for lbl, runs in groups.items()
              if all(fmt.num(r.result.get("throughput", {}).get("completions")) for r in runs)}
    sources = [r.result.get("memory", {}).get("source") for runs in groups.values() for r in runs]
    source = max(dict.fromkeys(s for s in sources if s), key=sources.count, default=None)  # first on a tie

    def readings(among: dict[str, list[Run]], value: Any) -> dict[str, list[float]]:
        found = {lbl: [v for v in map(value, runs) if v is not None] for lbl, runs in among.items()}
        return {lbl: vs for lbl, vs in found.items() if vs}

    def peak(run: Run) -> float | None:
        memory = run.result.get("memory", {})
        return fmt.num(memory.get("peak_bytes")) if memory.get("source") == source else None

    measured = {"peak": (readings(groups, peak), True),
                "step": (readings(online, lambda r: fmt.throughput(r, "step_s_median")), True),
                "tokens": (readings(online, lambda r: fmt.throughput(r, "tokens_per_s")), False),
                "completions": (readings(online, lambda r: fmt.throughput(r, "completions_per_s")), False)}
    out = {key: label for key, (values, lower) in measured.items()
           if (label := _welch_best(values, lower)) is not None}
    static = {lbl: total for lbl, (_, total) in static_by_label(suite).items() if lbl in groups}
    low = sorted(static.values())
    if len(low) > 1 and low[0] < low[1]:  # exact counts: a strict minimum is separated, a tie is not
        out["static"] = min(static, key=static.get)
    best = _accuracy_best(suite, list(groups))
    if best is not None:
        out["accuracy"] = best
    return out


def _welch_best(values: dict[str, list[float]], lower: bool) -> str | None:
    """The label with the best mean when Welch's t-test separates it from every other label at :data:`ALPHA`."""
    if len(values) < 2:
        return None
    sign = -1.0 if lower else 1.0
    best = max(values, key=lambda lbl: sign * sum(values[lbl]) / len(values[lbl]))
    for other in values:
        test = stats.welch_t_test(values[best], values[other]) if other != best else None
        if test is not None and (test["p_value"] is None or test["p_value"] >= ALPHA or sign * test["mean_diff"] <= 0):
            return None
    return best


def _accuracy_best(suite: Suite, labels: list[str]) -> str | None:
    """The contestant with the highest mean accuracy when the page's tests put it ahead of every other one: the
    seed-level t-test where the two share seeds and it is defined, else each same-seed McNemar (Holm-adjusted)."""
    means = {m["label"]: m["mean"] for m in method_means(suite) if m["label"] in labels}
    if len(means) < 2:
        return None
    best = max(means, key=means.get)
    over_seeds = {frozenset((t["a"], t["b"])): t for t in seeds.seed_tests(suite) if t["p_holm"] is not None}
    per_seed = paired_with_holm(suite)
    for other in means:
        if other == best:
            continue
        test = over_seeds.get(frozenset((best, other)))
        if test is not None:
            ahead = [(test["mean_diff"] if test["a"] == best else -test["mean_diff"], test["p_holm"])]
        else:
            ahead = [(t["diff"] if t["pair"][0] == best else -t["diff"], t["p_holm"]) for t in per_seed
                     if set(t["pair"]) == {best, other}]
        if not ahead or not all(diff > 0 and p is not None and p < ALPHA for diff, p in ahead):
            return None
    return best


BOLD_NOTE = ("Bold marks a value a test separates from every other contestant's (the control arm, a pipeline "
             "check, is none): accuracy by the seed-level t-test, else the same-seed McNemar tests, Holm-adjusted "
             f"p < {ALPHA}; peak memory, s/step and rates by Welch's t-test over seeds, p < {ALPHA} against each "
             "other contestant (one seed: no test, so no bold); static memory, an exact count, when it is strictly "
             "the lowest. s/step and rates compare only methods that generate while training; peak memory only "
             "readings of the most common source.")
"""The headline's note on its bold cells (:func:`best_labels`)."""


def _reward_model_findings(suite: Suite) -> list[Finding]:
    """Beside PPO (reward model)'s accuracy: a chance-level reward model, and reward over-optimisation."""
    out = [Finding(w, "reward-model stage, held-out pairs, 95% Wilson interval")
           for w in tables.reward_model_warnings(suite)]
    out += [Finding(w, "rm_score and accuracy_reward on the same rollouts, first vs last fifth of logged steps, "
                       "each change beyond 2 standard errors of the windows' points; one run")
            for w in dynamics.overoptimisation_table(suite).warnings]
    return out


def _monitor_findings(suite: Suite) -> list[Finding]:
    """One line when some run's training monitors crossed a declared threshold (bench.telemetry.monitors.run_flags)."""
    lines = dynamics.flag_lines(suite)
    if not lines:
        return []
    runs = list(dict.fromkeys(line.split(": ", 1)[0] for line in lines))
    return [Finding(f"Training monitors flagged {len(runs)} run(s): " + "; ".join(lines[:MAX_FLAG_FINDINGS])
                    + (f"; and {len(lines) - MAX_FLAG_FINDINGS} more" if len(lines) > MAX_FLAG_FINDINGS else ""),
                    "bench.telemetry.monitors thresholds; every flag under Results per method")]


def _failure_findings(suite: Suite) -> list[Finding]:
    bad = [r for r in suite.methods if r.status != "ok"]
    if not bad:
        return []
    names = fmt.display_names(suite.methods)
    listed = ", ".join(f"{names[r.run_id]} ({fmt.status_text(r)})" for r in bad)
    return [Finding(f"{len(bad)} of {len(suite.methods)} method runs have no result: {listed}",
                    "run status; their numbers are missing from every table")]


def findings(suite: Suite) -> list[Finding]:
    """The findings, most important first: failures, memory, accuracy differences, accuracy, speed."""
    return (_failure_findings(suite) + _memory_findings(suite) + _peak_findings(suite) + _seed_findings(suite)
            + _paired_findings(suite)
            + _start_findings(suite) + _accuracy_findings(suite) + _reward_model_findings(suite)
            + _monitor_findings(suite) + _speed_findings(suite))
