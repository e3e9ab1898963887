"""The headline block that opens summary.md and the page: a few lines a reader can quote as they stand.

One line for the set-up (model, task, budget); one per contestant method (its mean accuracy over seeds with a 95%
interval, its change from the start with the McNemar test against the start, Holm-adjusted in that family, and its
peak memory with the reading's source); where PPO trained against the learned reward model, one line on what that
reward model is (its held-out pair accuracy beside its untrained head's) and in how many seeds PPO over-optimised
it; and one sentence on what PPO's four networks cost and bought against GRPO on the same engine. Every number comes from a table further down the page, and no sentence says more than its
test: a difference the test cannot tell from zero reads as "not distinguishable".
"""

from __future__ import annotations

import math
from typing import Any

from bench.report import dynamics, fmt, reward_check, seeds, tables
from bench.report.findings import accuracy, headline_mode
from bench.report.load import Run, Suite
from bench.scoring import stats

ALPHA = 0.05
"""The significance level the block's words use (on Holm-adjusted p-values)."""

PPO_METHOD = "ppo"
GRPO_REFERENCES = ("grpo_engine", "grpo")
"""PPO's comparison, in order of preference: GRPO on the suite's own engine (the same sampler and update code as
PPO, so the difference is the algorithm and its networks), else TRL's GRPO."""


def setup_line(suite: Suite) -> str:
    """'Model tiny on the synthetic task, 5,000 test questions; 200 steps x 8 prompts x G 8 = 64 completions per
    step, up to 32 new tokens each; 3 seed(s) planned per method; accuracy suite-strict, greedy.'"""
    spec = suite.spec or {}
    model, task, train = spec.get("model") or {}, spec.get("task") or {}, spec.get("train") or {}
    name = model.get("name_or_path") if model.get("source") in ("hub", "fetched", "local") else None
    model_text = f"{model.get('source', 'unknown')}" + (f" ({name})" if name else "")
    questions = next((a.get("total") for r in suite.methods if r.status == "ok"
                      for a in [accuracy(r, "after", headline_mode(suite))] if a), None)
    n_seeds = len(spec.get("seeds") or []) or len({r.result.get("seed") for r in suite.methods})
    steps, prompts, group = train.get("steps"), train.get("prompts_per_step"), train.get("group_size")
    budget = (f"{steps} steps x {prompts} prompts x G {group} = {prompts * group} completions per step"
              if all(isinstance(v, int) for v in (steps, prompts, group)) else "training budget not recorded")
    new_tokens = (spec.get("generation") or {}).get("max_new_tokens")
    budget += f", up to {new_tokens} new tokens each" if isinstance(new_tokens, int) else ""
    questions_text = f", {fmt.int_text(questions)} test questions" if questions else ""
    return (f"Model {model_text} on the {task.get('source', 'unrecorded')} task{questions_text}; {budget}; "
            f"{n_seeds} seed(s) planned per method; accuracy {headline_mode(suite)}, greedy{start_text(suite)}.")


def start_text(suite: Suite) -> str:
    """'; every method starts from the source weights saved in bfloat16 (largest element change 3.91e-03 from the
    source)' when the start is a changed copy of the source (the warm start's ``start_*`` metrics, baselines/sft.py);
    '' otherwise."""
    start = next((r for r in suite.stages if r.status == "ok" and r.result.get("method") == "warm_start"), None)
    metrics = (start.result.get("metrics") or {}) if start else {}
    change = fmt.num(metrics.get("start_max_abs_change"))
    if metrics.get("start_from") != "source weights" or not change:
        return ""
    share = fmt.num(metrics.get("start_changed_share"))
    share_text = f", {fmt.pct(share)} of elements" if share is not None else ""
    return (f"; every method starts from the source weights saved in {metrics.get('start_dtype')} (largest element "
            f"change {change:.3g} from the source{share_text}), not the source weights themselves"
            f"{_source_accuracy_text(start, headline_mode(suite))}")


def _source_accuracy_text(start: Run, mode: str) -> str:
    """' (the start's accuracy: 9.5% as saved, 12.0% from the source weights)' when the warm start scored both
    (bench.execution.run_evaluation.source_start_scores), '' otherwise."""
    copy = accuracy(start, "after", mode)
    source = ((start.result.get("accuracy") or {}).get("source_weights") or {}).get(mode)
    if not copy or not isinstance(source, dict) or fmt.num(source.get("accuracy")) is None:
        return ""
    same = " (the same)" if source.get("correct") == copy.get("correct") else ""
    return (f" (the start's accuracy: {fmt.pct(copy.get('accuracy'))} as saved, {fmt.pct(source['accuracy'])} "
            f"from the source weights{same})")


def _contestants(suite: Suite) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in suite.methods:
        if run.status == "ok" and not fmt.is_control(run):
            groups.setdefault(run.label, []).append(run)
    return groups


def mean_interval(values: list[float], single: dict[str, Any] | None) -> tuple[float, float, float, str]:
    """(mean, low, high, what the interval is) of a method's accuracies over seeds: the 95% t interval of the
    mean over seeds (n >= 2), or the one run's own 95% interval (n = 1)."""
    if len(values) == 1:
        low, high = fmt.num((single or {}).get("low")), fmt.num((single or {}).get("high"))
        return values[0], low if low is not None else math.nan, high if high is not None else math.nan, "95% CI"
    mean, sd = stats.mean_sd(values)
    half = stats.student_t_quantile(0.975, len(values) - 1) * (sd or 0.0) / math.sqrt(len(values))
    low, high = max(0.0, mean - half), min(1.0, mean + half)
    clipped = ", clipped to [0, 100]" if (low, high) != (mean - half, mean + half) else ""
    return mean, low, high, f"95% t interval over {len(values)} seeds{clipped}"


def start_change_text(tests: list[dict[str, Any]]) -> str:
    """'+10.9 pp from the start (29.7%); McNemar against the start, Holm over its family of 15: p_holm < 0.05
    in 3 of 3 seeds' for one method's start tests (tables.start_tests)."""
    if not tests:
        return "change from the start not tested"
    change = sum(t["after"] - t["before"] for t in tests) / len(tests)
    before = sum(t["before"] for t in tests) / len(tests)
    significant = sum(1 for t in tests if t.get("p_holm") is not None and t["p_holm"] < ALPHA)
    family = tests[0].get("family_size")
    return (f"{100 * change:+.1f} pp from the start ({fmt.pct(before)}); McNemar against the start, Holm over its "
            f"family of {family}: p_holm < {ALPHA:g} in {significant} of {len(tests)} seed(s)")


def size_text(value: float) -> str:
    """'852.0 MiB' / '1.23 GiB': a reading without its source (the caller names it)."""
    unit, scale = fmt.byte_unit(value)
    return f"{value / scale:.2f} {unit}" if unit == "GiB" else f"{value / scale:.1f} {unit}"


def peak_text(runs: list[Run]) -> str:
    """'peak 852.0 MiB (cpu-rss, mean over 3 seeds)': the mean of the runs' whole-run peaks, with its source (the
    statistic the PPO sentence's ratio uses, so one method has one peak on the page's headline)."""
    readings = [(fmt.num(r.result.get("memory", {}).get("peak_bytes")), r.result.get("memory", {}).get("source"))
                for r in runs]
    readings = [(b, s) for b, s in readings if b is not None]
    if not readings:
        return f"peak memory {fmt.NOT_MEASURED}"
    sources = {s or "source unknown" for _, s in readings}
    peak = sum(b for b, _ in readings) / len(readings)
    source = sources.pop() if len(sources) == 1 else "mixed sources"
    over = f", mean over {len(readings)} seeds" if len(readings) > 1 else ""
    return f"peak {size_text(peak)} ({source}{over})"


def method_lines(suite: Suite) -> list[str]:
    """One line per contestant method (seeds pooled), in the suite's order."""
    mode = headline_mode(suite)
    by_run = {t["run_id"]: t for t in tables.start_tests(suite)}
    lines = []
    for label, runs in _contestants(suite).items():
        scores = [a for a in (accuracy(r, "after", mode) for r in runs) if a and fmt.num(a.get("accuracy")) is not None]
        if not scores:
            lines.append(f"{label}: not evaluated; {peak_text(runs)}.")
            continue
        mean, low, high, what = mean_interval([float(a["accuracy"]) for a in scores], scores[0])
        interval = "" if math.isnan(low) else f" [{100 * low:.1f}, {100 * high:.1f}] ({what})"
        start = start_change_text([by_run[r.run_id] for r in runs if r.run_id in by_run])
        lines.append(f"{label}: {fmt.pct(mean)}{interval}; {start}; {peak_text(runs)}.")
    return lines


def _by_method(suite: Suite, method: str) -> list[Run]:
    return [r for r in suite.methods if r.status == "ok" and r.result.get("method") == method]


def _matched_peaks(a: list[Run], b: list[Run]) -> tuple[float, float, str, list[Any]] | None:
    """Both methods' mean whole-run peak over the seeds where both recorded one on the same source:
    (a bytes, b bytes, source, seeds), or None when no seed has both on one source."""
    def by_seed(runs: list[Run]) -> dict[Any, tuple[float, Any]]:
        return {r.result.get("seed"): (peak, r.result.get("memory", {}).get("source")) for r in runs
                if (peak := fmt.num(r.result.get("memory", {}).get("peak_bytes"))) is not None}

    pa, pb = by_seed(a), by_seed(b)
    seeds = [s for s in pa if s in pb and pa[s][1] == pb[s][1]]
    sources = {pa[s][1] for s in seeds}
    if not seeds or len(sources) != 1:
        return None
    return (sum(pa[s][0] for s in seeds) / len(seeds), sum(pb[s][0] for s in seeds) / len(seeds),
            str(sources.pop() or "source unknown"), seeds)


def ppo_sentence(suite: Suite) -> str | None:
    """What PPO's four networks cost and bought here against GRPO on the same engine: the measured peak-memory
    ratio (one source, both methods' mean over seeds) and the accuracy difference with its seed-level paired
    t-test (Holm over the between-method family); None without PPO and a GRPO to compare with."""
    ppo = _by_method(suite, PPO_METHOD)
    reference = next((runs for m in GRPO_REFERENCES if (runs := _by_method(suite, m))), [])
    if not ppo or not reference:
        return None
    a, b = ppo[0].label, reference[0].label
    matched = _matched_peaks(ppo, reference)
    if matched and matched[0] and matched[1]:
        ppo_peak, ref_peak, source, both = matched
        over = f"seed {both[0]}" if len(both) == 1 else f"mean over seeds {', '.join(map(str, both))}"
        cost = (f"{ppo_peak / ref_peak:.2f}x {b}'s peak memory ({size_text(ppo_peak)} against "
                f"{size_text(ref_peak)}, {source}, {over})")
    else:
        cost = "a peak memory not measured on one source for both"
    test = next((t for t in seeds.seed_tests(suite) if {t["a"], t["b"]} == {a, b}), None)
    mode = headline_mode(suite)
    accs = {label: [float(x["accuracy"]) for r in runs if (x := accuracy(r, "after", mode))]
            for label, runs in ((a, ppo), (b, reference))}
    if test is None or test.get("p_holm") is None:
        if not accs[a] or not accs[b]:
            return f"PPO's four networks (actor, critic, reward model, reference) cost {cost} here."
        diff = sum(accs[a]) / len(accs[a]) - sum(accs[b]) / len(accs[b])
        bought = (f"a {100 * diff:+.1f} pp accuracy difference that is not tested here (fewer than two paired "
                  f"seeds)")
    else:
        sign = 1 if test["a"] == a else -1
        diff = sign * test["mean_diff"]
        p = fmt.p_value_text(test["p_holm"])
        if test["p_holm"] < ALPHA:
            bought = f"{100 * diff:+.1f} pp accuracy (paired t-test over {len(test['seeds'])} seeds, p_holm = {p})"
        else:
            bought = (f"an accuracy difference of {100 * diff:+.1f} pp that the seeds cannot tell from zero (paired "
                      f"t-test over {len(test['seeds'])} seeds, p_holm = {p})")
    sentence = (f"PPO's four networks (actor, critic, reward model, reference) cost {cost} and bought {bought} "
                f"against {b}.")
    if ppo[0].flag:  # what PPO bought is then bounded by a reward model that ranks pairs no better than untrained
        sentence += (f" [{ppo[0].flag}: this is PPO against a reward model whose held-out pair accuracy is not "
                     f"above both chance and its untrained head (the reward model's line), not PPO against the task.]")
    return sentence


def reward_model_line(suite: Suite) -> str | None:
    """What the PPO arm trained against: the reward model's held-out pair accuracy (95% Wilson, n pairs, beside
    its untrained head) and the seeds in which its score rose while the verifier's reward fell (the
    over-optimisation table's warnings); None without an ok run trained against a reward model or without the
    stage's check. A reader quoting PPO (reward model)'s accuracy quotes PPO against this reward model."""
    check = reward_check.reward_model_check(suite.runs)
    runs = [r for r in suite.methods if r.status == "ok" and reward_check.uses_reward_model(r)]
    if check is None or not runs:
        return None
    names = fmt.display_names(suite.methods)
    warnings = dynamics.overoptimisation_table(suite).warnings
    hacked = [r for r in runs if any(w.startswith(f"{names[r.run_id]}: reward over-optimisation:") for w in warnings)]
    name = runs[0].label.removesuffix(f" [{runs[0].flag}]") if runs[0].flag else runs[0].label
    learned = "learned" if check["learned"] else "did not learn"
    line = (f"{name}'s reward model {learned}: it ranks held-out pairs {reward_check.interval_text(check)} right")
    if not check["learned"]:
        return line + f", so that arm is marked '{reward_check.FLAG}'."
    return (line + f"; PPO over-optimised it in {len(hacked)} of {len(runs)} seed(s) (its reward-model score rose "
            f"while the verifier's accuracy reward fell, beyond their noise: Reward over-optimisation), so that "
            f"arm's accuracy measures PPO against this reward model; PPO (verifier reward) is PPO against the "
            f"task's own reward.")


def headline_block(suite: Suite) -> list[str]:
    """The block's lines in order (plain text; the writers add the markup), or [] without an ok method run."""
    if not _contestants(suite):
        return []
    lines = [setup_line(suite), *method_lines(suite)]
    reward_line = reward_model_line(suite)
    if reward_line:
        lines.append(reward_line)
    sentence = ppo_sentence(suite)
    if sentence:
        lines.append(sentence)
    return lines
