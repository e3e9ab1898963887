"""Tables: results.csv and the row data summary.md (bench.report.summary) and the HTML page share.

``results.csv`` is for spreadsheets and scripts (raw numbers: accuracies as fractions, bytes, seconds);
``summary.md`` is for pasting into a writeup (formatted, every memory number with its source).

The statistics a reviewer asks for live here too, each as a :class:`fmt.Table` (``detail_tables`` collects them):
between methods on the same questions (:func:`paired_tests_table`: exact McNemar, paired bootstrap, Holm), every
method against the checkpoint it started from (:func:`start_tests_table`), the reward model's held-out pair
accuracy with its Wilson interval (:func:`reward_model_table`, and :func:`reward_model_warnings` for the line
beside PPO (reward model)), and the control arm's pipeline check (:func:`control_table`). Every test uses the
suite's headline mode unless told otherwise, and each family of tests is Holm-adjusted on its own. Where questions
share a cluster (a synthetic working asked under several names: fmt.cluster_labels) the per-question tests become
their clustered counterparts (:func:`compare`: Durkalski's clustered McNemar, a bootstrap over clusters); with one
question per cluster they are the per-question tests exactly.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from bench.scoring import stats
from bench.report import (anchors, datachecks, dynamics, efficiency, fmt, ladder, networks, ranks, reward_check, seeds,
                          settings, throughput)
from bench.report.load import Run, Suite, results_frame
from bench.report.records import label_as_run

LOW_CHANGE = 0.5
"""A method run whose training changed less than this share of its trained weights is flagged: most of its
updates were lost (e.g. rounded away in bfloat16 weights) or never applied."""


def write_csv(suite: Suite, path: Path) -> Path:
    """Write results.csv: the results frame, one row per method run (stages are on the page, not in the CSV).

    A value that was not measured is an empty cell, never 0. Beside it, for a suite with a multi-process run,
    memory_per_rank.csv (bench.report.ranks: one row per run, memory source and rank, in bytes).
    """
    # Text cells a spreadsheet would run as formulas (a label '=HYPERLINK(...)') are written as text: fmt.csv_cell.
    text = fmt.csv_frame(results_frame(suite)).to_csv(index=False, na_rep="", lineterminator="\n")
    ranks.write_rank_csv(suite, Path(path).parent / ranks.CSV_FILE)
    return fmt.write_text_atomic(path, text)  # never a half-written (or 0-byte) results.csv


def run_warnings(suite: Suite) -> list[str]:
    """Warning lines under the per-run results: lost weight updates, a chance-level reward model (beside PPO
    (reward model)'s row) and the training monitors' flags (bench.telemetry.monitors.run_flags per run)."""
    return weight_change_warnings(suite) + reward_model_warnings(suite) + dynamics.flag_lines(suite)


def weight_change_warnings(suite: Suite) -> list[str]:
    """One warning per ok method run whose training changed under :data:`LOW_CHANGE` of its trained weights.

    The control arm (learning rate 0) is left out: its 0% is the point of it, not a lost update.
    """
    names = fmt.display_names(suite.methods)
    out = []
    for run in suite.methods:
        share = fmt.changed_fraction(run)
        if run.status != "ok" or share is None or share >= LOW_CHANGE:
            continue
        if run.result.get("method") == CONTROL_METHOD:
            continue  # lr 0 moves nothing by design; its check is control_table (after must equal before)
        how = fmt.training_change(run, "method") or "not recorded"
        total = fmt.num(fmt.training_change(run, "trainable_params"))
        count = f"; {int(total):,} trainable elements" if total is not None else ""
        out.append(f"{names[run.run_id]}: training moved only {fmt.pct(share)} of the trained weights "
                   f"(comparison: {how}{count}); most updates did not change a stored value.")
    return out


NOT_RECORDED = "n/a"
"""A setting the method does not have (not recorded), as opposed to a recorded empty value (the dash)."""


UNRECORDED_MEANS = {"generation_backend": "transformers"}
"""Settings only some recipes record, whose value for the others is known: a method that records no generation
backend (DPO trains without generating) decodes whatever it does generate (its evaluation) with the suite's
``generation.backend`` (:func:`suite_backend`; this default for a suite whose spec is not recorded). A method that
overrides the suite's backend is then a difference that "what differs" puts first."""


def suite_backend(suite: Suite) -> str:
    """The suite's ``generation.backend`` (one backend for every generation), from its recorded spec."""
    generation = (suite.spec or {}).get("generation") or {}
    return str(generation.get("backend") or UNRECORDED_MEANS["generation_backend"])


def what_differs(suite: Suite) -> tuple[list[str], list[list[str]]]:
    """The per-method settings as (header, rows): one row per setting key, one column per method label.

    Seeds of one method share their settings, so columns are labels, taken from the first run that recorded
    any. Keys whose value is the same for every method that records them are kept (they are what the preset
    declared) but sorted after the keys that really differ, so the eye lands on the differences first; a method
    without the key shows "n/a". The parallel layout of a launched suite (``parallel.processes``,
    ``parallel.strategy``, ...: bench.execution.launch.parallel_settings) and the generation backend are settings like
    any other, so a method that ran as one process, or generated with vLLM, is listed among the differences.
    ``precision`` and ``generation`` have tables of their own and are left out; any other nested setting is
    opened up into dotted keys (``optim.betas``), so no cell is a JSON blob.
    """
    per_label: dict[str, dict[str, Any]] = {}
    for run in suite.methods:
        recorded = dict(fmt.flat_items(run.result.get("settings") or {}, skip=settings.OWN_TABLE_SETTINGS))
        if run.label not in per_label or (not per_label[run.label] and recorded):
            per_label[run.label] = recorded
    labels = [lbl for lbl, s in per_label.items() if s]
    if not labels:
        return [], []
    keys = list(dict.fromkeys(k for lbl in labels for k in per_label[lbl]))
    unrecorded = {**UNRECORDED_MEANS, "generation_backend": suite_backend(suite)}

    def cell(label: str, key: str) -> str:
        return fmt.cell_text(per_label[label][key]) if key in per_label[label] else NOT_RECORDED

    def differs(key: str) -> bool:
        # A method that does not record a setting has no value to differ with (TRL's GRPO has no ppo_epochs):
        # only the methods that recorded it are compared, except for a key whose unrecorded value is known.
        if key in unrecorded:
            return len({cell(lbl, key) if key in per_label[lbl] else unrecorded[key] for lbl in labels}) > 1
        return len({cell(lbl, key) for lbl in labels if key in per_label[lbl]}) > 1

    keys.sort(key=lambda k: not differs(k))  # stable: keeps recorded order within each group
    rows = [[key] + [cell(lbl, key) for lbl in labels] for key in keys]
    drawn = extra_generation(suite)
    if drawn:  # measured, not set: first, since it is what the matched budget did not match
        rows.insert(0, [EXTRA_GENERATION] + [drawn.get(lbl, NOT_RECORDED) for lbl in labels])
    return ["setting", *labels], rows


EXTRA_GENERATION = "extra generation drawn (measured, per seed)"
"""The "what differs" row of DAPO's dynamic sampling: what it generated beyond the matched batch."""


def extra_generation(suite: Suite) -> dict[str, str]:
    """Label -> 'seed 0: 12 rounds, +768 completions (+6.0%); seed 1: ...' for each method whose runs recorded
    extra generation rounds (result.json metrics: DAPO's dynamic sampling); empty when none did."""
    out: dict[str, list[str]] = {}
    for run in suite.methods:
        metrics = run.result.get("metrics") or {}
        rounds, extra = fmt.num(metrics.get("extra_generation_rounds")), fmt.num(metrics.get("extra_completions"))
        if rounds is None:
            continue
        total = fmt.throughput(run, "completions")
        share = f" (+{100 * extra / (total - extra):.1f}% over the matched batch)" if (
            extra is not None and total and total > extra) else ""
        text = f"{int(rounds):,} rounds" + ("" if extra is None else f", +{int(extra):,} completions{share}")
        out.setdefault(run.label, []).append(f"seed {run.result.get('seed')}: {text}")
    return {label: "; ".join(parts) for label, parts in out.items()}


def verdict_map(run: Run, mode: str) -> dict[Any, bool]:
    """Question key -> verdict under ``mode`` for one run's per-question lines (questions without one left out).

    The key is the question ``id`` (a hash of the question text) when every line has one, else the ``index``:
    matching by id keeps a pairing honest even if two evaluations listed the questions in another order.
    """
    rows = run.verdicts or []
    by_id = bool(rows) and all(isinstance(r.get("id"), str) and r["id"] for r in rows)
    out: dict[Any, bool] = {}
    for row in rows:
        v = fmt.verdict(row, mode)
        if v is not None:
            out[row["id"] if by_id else int(row["index"])] = v
    return out


def _paired(va: dict[Any, bool], vb: dict[Any, bool]) -> tuple[list[bool], list[bool]] | None:
    """The two runs' verdicts on the questions both judged (same key order), or None when they share none."""
    common = sorted(set(va) & set(vb), key=str)
    if not common:
        return None
    return [va[k] for k in common], [vb[k] for k in common]


def _clusters(a: Run, b: Run, va: dict[Any, bool], vb: dict[Any, bool]) -> list[str]:
    """The cluster label of every question both runs judged (in `_paired`'s order): one working of the synthetic
    task, else the question itself (fmt.cluster_labels). Both runs scored the same questions, so either run's
    labels serve; a question only one of them labelled is its own cluster."""
    la, lb = fmt.cluster_labels(a), fmt.cluster_labels(b)
    return [la.get(k) or lb.get(k) or f"q:{k}" for k in sorted(set(va) & set(vb), key=str)]


def compare(xa: list[bool], xb: list[bool], clusters: list[str]) -> dict[str, Any]:
    """The paired comparison of two runs' verdicts: `stats.clustered_mcnemar` (exact McNemar when every cluster
    holds one question) and `stats.cluster_bootstrap` of the difference (clusters resampled when there are any)."""
    mc = stats.clustered_mcnemar(xa, xb, clusters)
    boot = stats.cluster_bootstrap(xa, xb, clusters)
    return {"n": mc["n"], "clusters": mc["clusters"], "test": mc["test"], "a_only": mc["a_only"],
            "b_only": mc["b_only"], "p_value": mc["p_value"], "diff": boot["mean_diff"], "diff_low": boot["low"],
            "diff_high": boot["high"]}


def tests_used(tests: list[dict[str, Any]]) -> str:
    """'McNemar (exact)', or both names when some comparisons had clusters and some did not."""
    return " / ".join(dict.fromkeys(t["test"] for t in tests)) or stats.EXACT_MCNEMAR


def clusters_note(tests: list[dict[str, Any]]) -> str:
    """What the statistics treated as independent: questions (one per cluster) or clusters of questions."""
    if all(t["clusters"] == t["n"] for t in tests):
        return ("Every question is its own cluster here (one question per synthetic working, one per GSM8K "
                "problem), so the tests treat the questions as independent.")
    return ("Some questions share a cluster (the same synthetic working asked under other names, whose verdicts "
            "agree): the p-value is Durkalski's clustered McNemar (each cluster one unit) and the bootstrap "
            "resamples clusters, so copies of one working count once.")


def paired_tests(suite: Suite, mode: str | None = None) -> list[dict[str, Any]]:
    """McNemar (exact) and a paired bootstrap between ok method runs of the same seed, on ``mode`` verdicts.

    ``mode`` defaults to the suite's headline mode. Only runs of the same seed are paired (seed s of GRPO against
    seed s of PPO), which keeps the table to methods x methods per seed rather than every run against every run.
    Questions are matched by id (else index); only questions both runs judged are compared.

    ``p_holm`` is Holm-adjusted over the family of every test in this list (all method pairs, all seeds, one
    mode): the family a reader scans when looking for "a significant difference somewhere".
    """
    mode = mode or suite.headline_mode
    # The control arm is its start on every question: control vs X is X vs start, in start_tests' family already.
    ok = [r for r in suite.methods if r.status == "ok" and r.verdicts and not fmt.is_control(r)]
    names = fmt.display_names(suite.methods)
    maps = {r.run_id: verdict_map(r, mode) for r in ok}
    out = []
    for a, b in itertools.combinations(ok, 2):
        if a.result.get("seed") != b.result.get("seed"):
            continue
        pair = _paired(maps[a.run_id], maps[b.run_id])
        if pair is None:
            continue
        xa, xb = pair
        out.append({"a": names[a.run_id], "b": names[b.run_id], "pair": (a.label, b.label),
                    "seed": a.result.get("seed"), "mode": mode,
                    "unit": fmt.cluster_unit(a), **compare(xa, xb, _clusters(a, b, maps[a.run_id], maps[b.run_id]))})
    return stats.holm_family(out, PAIRED_FAMILY)


PAIRED_FAMILY = "between methods, same questions, per seed"
START_FAMILY = "each method against its start, same questions"
"""The Holm families of :func:`paired_tests` and :func:`start_tests` (the control arm is in neither)."""


def family_text(tests: list[dict[str, Any]]) -> str:
    """'15 method pairs × 3 seeds': what a family of per-seed paired tests is made of. Pairs are counted by the
    methods' labels: the names ``a`` and ``b`` carry the seed when a method has several (``GRPO (TRL) s1``)."""
    pairs = len({t["pair"] for t in tests})
    seeds = len({t["seed"] for t in tests})
    return f"{pairs} method pair{'s' if pairs != 1 else ''} × {seeds} seed{'s' if seeds != 1 else ''}"


def _diff_text(diff: float, low: float | None, high: float | None) -> str:
    """'+6.0 pp [+1.2, +10.5]': a difference of fractions in percentage points with its interval."""
    text = f"{100 * diff:+.1f} pp"
    if low is not None and high is not None:
        text += f" [{100 * low:+.1f}, {100 * high:+.1f}]"
    return text


def _seed_text(seed: Any) -> str:
    return fmt.MISSING if seed is None else str(seed)


ALPHA = 0.05
"""The level the tables' 'significant' wording uses (Holm-adjusted p below it)."""


def paired_tests_table(suite: Suite, mode: str | None = None) -> fmt.Table:
    """Between methods, per seed, on the same questions: McNemar p, Holm-adjusted p, and the bootstrap difference."""
    mode = mode or suite.headline_mode
    tests = paired_tests(suite, mode)
    if not tests:
        return fmt.Table([], [])
    rows = [[_seed_text(t["seed"]), t["a"], t["b"], _questions_text(t), fmt.int_text(t["a_only"]),
             fmt.int_text(t["b_only"]), fmt.p_value_text(t["p_value"]), fmt.p_value_text(t["p_holm"]),
             _diff_text(t["diff"], t["diff_low"], t["diff_high"])] for t in tests]
    notes = [f"Scoring mode: {fmt.mode_note(mode)}.",
             f"Test: {tests_used(tests)}; McNemar is the exact two-sided binomial test on the questions exactly one "
             f"of the two runs got right. A − B: difference in accuracy with a 95% paired bootstrap interval (2,000 "
             f"resamples); the interval is not adjusted for multiple comparisons, the Holm-adjusted p beside it is.",
             clusters_note(tests),
             f"Holm-adjusted p: Holm's step-down correction over the family of all {len(tests)} between-method "
             f"comparisons in this table ({family_text(tests)}, this mode). The control arm is left out: it "
             f"equals its start, so a method against it is the method against its start, tested under Against the "
             f"starting checkpoint. {fmt.family_note(tests)} A difference is "
             f"called significant when its adjusted p is below {ALPHA}. These tests see only question-to-question "
             f"noise; the seed-level comparison shows the seed-to-seed spread."]
    return fmt.Table(["seed", "A", "B", "questions (clusters)", "A only right", "B only right", "McNemar p",
                      "Holm-adjusted p", "A − B (95% bootstrap CI, unadjusted)"], rows, notes)


def _questions_text(t: dict[str, Any]) -> str:
    """'5,000' when every question is its own cluster, else '5,000 (2,099)'."""
    n, k = fmt.int_text(t["n"]), t.get("clusters")
    return n if k is None or k == t["n"] else f"{n} ({int(k):,})"


START_STAGE = "warm_start"
"""The stage every method starts from; its evaluation is every method's 'before'."""


def start_run(suite: Suite, seed: Any) -> Run | None:
    """The starting checkpoint's run for ``seed`` (the warm start of that seed, else the one every seed shares)
    with per-question verdicts; None without one."""
    starts = [r for r in suite.stages if (r.result.get("method") or "").startswith(START_STAGE)
              or r.run_id.startswith(START_STAGE)]
    starts = [r for r in starts if r.status == "ok" and r.verdicts]
    same_seed = [r for r in starts if r.result.get("seed") == seed]
    return (same_seed or starts or [None])[0]


def start_tests(suite: Suite, mode: str | None = None) -> list[dict[str, Any]]:
    """McNemar of every ok method run (the control arm left out) against its starting checkpoint, same questions.

    The start's verdicts are the warm start's own evaluation (the checkpoint every method loads; one per seed
    when the suite has several, else the one shared by all seeds). ``p_holm`` is Holm-adjusted over this family
    (every method run against the start, one mode), separately from the between-method family.
    """
    mode = mode or suite.headline_mode
    names = fmt.display_names(suite.methods)
    out = []
    for run in suite.methods:
        # The control arm's test against its start has nothing discordant by design: control_table checks it.
        if run.status != "ok" or not run.verdicts or fmt.is_control(run):
            continue
        start = start_run(suite, run.result.get("seed"))
        if start is None:
            continue
        pair = _paired(verdict_map(start, mode), verdict_map(run, mode))
        if pair is None:
            continue
        before, after = pair
        vs, vr = verdict_map(start, mode), verdict_map(run, mode)
        test = compare(after, before, _clusters(run, start, vr, vs))
        n = len(before)
        out.append({"run_id": run.run_id, "method": names[run.run_id], "seed": run.result.get("seed"),
                    "start": start.run_id, "mode": mode, "before": sum(before) / n, "after": sum(after) / n,
                    "unit": fmt.cluster_unit(run),
                    "gained": test["a_only"], "lost": test["b_only"], **test})
    return stats.holm_family(out, START_FAMILY)


def start_tests_table(suite: Suite, mode: str | None = None) -> fmt.Table:
    """Every method against its starting checkpoint: before, after, questions gained and lost, McNemar and Holm."""
    mode = mode or suite.headline_mode
    tests = start_tests(suite, mode)
    if not tests:
        return fmt.Table([], [])
    rows = [[t["method"], _seed_text(t["seed"]), _questions_text(t), fmt.pct(t["before"]), fmt.pct(t["after"]),
             fmt.int_text(t["gained"]), fmt.int_text(t["lost"]), fmt.p_value_text(t["p_value"]),
             fmt.p_value_text(t["p_holm"]), _diff_text(t["diff"], t["diff_low"], t["diff_high"])] for t in tests]
    notes = [f"Scoring mode: {fmt.mode_note(mode)}.",
             "Start: the warm start's own evaluation of the checkpoint every method begins from, on the same "
             "questions (matched by question id, else position). Gained: right after training, wrong at the start; "
             f"lost: the reverse. Test: {tests_used(tests)} on gained vs lost; after − before has a 95% paired "
             "bootstrap interval, not adjusted for multiple comparisons (the Holm-adjusted p beside it is).",
             clusters_note(tests),
             f"Holm-adjusted p: over the family of all {len(tests)} method-against-start test(s) in this table "
             f"(the control arm's own check is under Control arm). {fmt.family_note(tests)}"]
    return fmt.Table(["method", "seed", "questions (clusters)", "start", "after", "gained", "lost",
                      "McNemar p", "Holm-adjusted p", "after − start (95% bootstrap CI, unadjusted)"],
                     rows, notes)


def stage_label(suite: Suite, run: Run) -> str:
    """A stage's label as the spec ran it (`records.label_as_run`): the run's own spec, else the suite's."""
    spec = run.result.get("spec") if isinstance(run.result.get("spec"), dict) else suite.spec or {}
    return label_as_run(run.result.get("method"), run.label, spec or {})


def stage_rows(suite: Suite) -> list[dict[str, Any]]:
    """Shared stages: status, accuracy after in the headline mode (the warm start's), wall time and their metrics.

    ``metrics["lengths"]`` is left out (the max-lengths table shows it); other nested metrics are opened up.
    """
    rows = []
    for run in suite.stages:
        metrics = run.result.get("metrics") or {}
        rows.append({
            "stage": stage_label(suite, run),
            "run_id": run.run_id,
            "status": fmt.status_text(run),
            "accuracy": fmt.score_text(fmt.score(run, "after", suite.headline_mode)),
            "wall": fmt.float_text(fmt.throughput(run, "wall_s"), 1, " s"),
            "metrics": [(k, fmt.cell_text(v)) for k, v in fmt.flat_items(metrics, skip=settings.OWN_TABLE_METRICS)],
            "error": fmt.error_text(run),
        })
    return rows


# --- checks a reviewer asks for: the reward model's signal, the control arm ----------------------------------
def reward_model_warnings(suite: Suite) -> list[str]:
    """The plain sentence on a reward model that did not learn (shown beside PPO (reward model) in the results,
    and at the top of the reward model's section); [] when it learned."""
    check = reward_check.reward_model_check(suite.runs)
    if check is None or check["learned"]:
        return []
    return [reward_check.verdict_sentence(check)]


MIN_HELDOUT_PAIRS = 400
"""Held-out pairs below which the reward model's section warns: at 400 a 95% Wilson interval is about +-5 points at
60%, so a model 10 points above chance is told from it; fewer pairs can hide a reward model that learned nothing."""


def few_pairs_warning(check: dict[str, Any]) -> list[str]:
    """The warning for fewer than MIN_HELDOUT_PAIRS held-out pairs, with the interval's width and the fix; []."""
    if check["n"] >= MIN_HELDOUT_PAIRS:
        return []
    width = 100 * (check["high"] - check["low"])
    return [f"Only {check['n']:,} held-out pairs: the interval is {width:.1f} points wide, too few to tell a reward "
            f"model that learned a little from one that learned nothing (the suite aims at {MIN_HELDOUT_PAIRS} or "
            f"more: raise sample_pool.prompts or reward_model.eval_fraction)."]


def reward_model_table(suite: Suite) -> fmt.Table:
    """The reward model's held-out pair accuracy (n, 95% Wilson interval) beside its untrained head's and its
    training pairs', and the verdict; the plain sentence as a warning when it did not learn."""
    check = reward_check.reward_model_check(suite.runs)
    if check is None:
        return fmt.Table([], [])
    interval = f"{fmt.pct(check['accuracy'])} [{100 * check['low']:.1f}, {100 * check['high']:.1f}]"
    if check["chance_inside"]:
        interval += f" (not distinguishable from chance, n = {check['n']:,})"
    row = [check["label"], fmt.int_text(check["n"]), interval, fmt.pct(check["untrained"]),
           fmt.pct(check["train_accuracy"]), "yes" if check["learned"] else "no"]
    notes = ["Held-out pairs: one (chosen, rejected) pair per held-out question of the sample pool; no held-out "
             "question is trained on. Right = the chosen completion scored higher. Interval: 95% Wilson over the n "
             "pairs. Untrained head: the same pairs scored before training. Training pairs: as many pairs, one per "
             "training question, scored after training (a gap to held-out is over-fitting; the curve is under "
             "Figures). Learned: the interval's lower bound is above 50% and above the untrained head."]
    return fmt.Table(["stage", "held-out pairs", "held-out pair accuracy [95% CI]", "untrained head",
                      "training pairs", "learned"], [row], notes,
                     reward_model_warnings(suite) + few_pairs_warning(check))


CONTROL_METHOD = "control"
"""The control arm: the online loop with learning rate 0; greedy accuracy after must equal before exactly."""


def control_checks(suite: Suite) -> list[dict[str, Any]]:
    """For every ``control`` run: does accuracy after equal accuracy before exactly, in every mode?

    Per question when both the run's and the start's per-question files exist (a question differs when its
    verdict differs in any mode); else from the recorded correct counts per mode. ``passed`` is None when
    neither can be compared (the run failed or recorded no accuracy) or no mode can score the task.

    ``modes``: the modes that confirm the check; ``not_applicable``: mode -> why it cannot (:func:`_cannot_score`),
    e.g. lm-eval strict on answers without ``####``: 0 right before and after, so their equality checks nothing.
    """
    names = fmt.display_names(suite.methods)
    out = []
    for run in suite.methods:
        if run.result.get("method") != CONTROL_METHOD:
            continue
        check: dict[str, Any] = {"run_id": run.run_id, "name": names[run.run_id], "seed": run.result.get("seed"),
                                 "passed": None, "differing": None, "basis": None, "modes": [],
                                 "not_applicable": {}}
        start = start_run(suite, run.result.get("seed"))
        if run.status == "ok" and run.verdicts and start is not None:
            after, before = _keyed_rows(run), _keyed_rows(start)
            common = set(after) & set(before)
            modes = [m for m in fmt.MODES if any(fmt.verdict(r, m) is not None for r in after.values())]
            differing = sum(1 for k in common if any(fmt.verdict(after[k], m) != fmt.verdict(before[k], m)
                                                     for m in modes))
            missing = len(set(after) ^ set(before))
            counts = {m: [(sum(fmt.verdict(r, m) is True for r in rows.values()),
                           sum(fmt.verdict(r, m) is not None for r in rows.values())) for rows in (before, after)]
                      for m in modes}
            check.update(differing=differing + missing, basis=f"{len(common):,} questions",
                         **_applicable(modes, counts, passed=differing + missing == 0))
        elif run.status == "ok":
            modes = [m for m in fmt.MODES if fmt.score(run, "after", m) and fmt.score(run, "before", m)]
            if modes:
                counts = {m: [(fmt.score(run, when, m)["correct"], fmt.score(run, when, m)["total"])
                              for when in ("before", "after")] for m in modes}
                check.update(basis="correct counts (no per-question files)",
                             **_applicable(modes, counts, passed=all(a == b for a, b in counts.values())))
        out.append(check)
    return out


def _cannot_score(before: tuple[Any, Any], after: tuple[Any, Any]) -> str | None:
    """Why a mode cannot test the pipeline from its (correct, total) before and after, or None when it can.

    A mode that scores no question right on either side (lm-eval strict on answers without ``####``), or scores
    none at all, would show 'after equals before' whatever the pipeline did to the model: no confirmation."""
    if not before[1] or not after[1]:
        return "no question scored"
    if before[0] == 0 and after[0] == 0:
        return f"0 of {after[1]:,} right before and after: the mode cannot score this task"
    return None


def _applicable(modes: list[str], counts: dict[str, list[tuple[Any, Any]]], passed: bool) -> dict[str, Any]:
    """The check's ``modes`` (those that can confirm it), ``not_applicable`` (mode -> why) and ``passed`` (None
    when no mode can score the task: an equality that checks nothing is not a pass)."""
    why = {m: _cannot_score(*counts[m]) for m in modes}
    confirming = [m for m in modes if why[m] is None]
    return {"modes": confirming, "not_applicable": {m: w for m, w in why.items() if w},
            "passed": passed if confirming or not passed else None}


def _keyed_rows(run: Run) -> dict[Any, dict[str, Any]]:
    rows = run.verdicts or []
    by_id = bool(rows) and all(isinstance(r.get("id"), str) and r["id"] for r in rows)
    return {(r["id"] if by_id else int(r["index"])): r for r in rows}


def control_table(suite: Suite) -> fmt.Table:
    """The control arm's pipeline check: 'accuracy after equals before exactly: yes/no (n differing questions)'.

    A failure is a warning naming a pipeline problem: with learning rate 0 and greedy decoding nothing may move.
    A mode that cannot score the task (:func:`_cannot_score`) is listed as not applicable, never as a confirmation.
    """
    checks = control_checks(suite)
    if not checks:
        return fmt.Table([], [])
    rows, warnings = [], []
    for c in checks:
        if c["passed"] is None:
            result = ("not checked (no scoring mode can score this task)" if c["not_applicable"]
                      else "not checked (no accuracy recorded)")
        elif c["differing"] is None:
            result = "yes" if c["passed"] else "no"
        else:
            result = f"{'yes' if c['passed'] else 'no'} ({c['differing']:,} differing questions)"
        rows.append([c["name"], _seed_text(c["seed"]), result, c["basis"] or fmt.MISSING,
                     ", ".join(c["modes"]) or fmt.MISSING,
                     "; ".join(f"{m} ({why})" for m, why in c["not_applicable"].items()) or fmt.MISSING])
        if c["passed"] is False:
            warnings.append(f"Pipeline problem: {c['name']} trained with learning rate 0 yet its accuracy after "
                            f"differs from before ({c['differing'] if c['differing'] is not None else 'some'} "
                            f"question(s)); something other than training changes the model or the evaluation "
                            f"(weights, decoding, data order or scoring), so every method's gain is suspect.")
    notes = ["Control (lr 0): the online training loop with learning rate 0 (same sampling, steps and evaluation). "
             "Under greedy decoding its accuracy after must equal its start's exactly, question by question, in "
             "every scoring mode; its training-reward curve is the noise floor of the other methods' curves.",
             "A mode that scores no question right before or after (lm-eval strict on answers without '####') "
             "would show equality whatever happened to the model, so it is listed as not applicable and confirms "
             "nothing; 'modes' lists only the modes that confirm the check."]
    return fmt.Table(["run", "seed", "accuracy after equals before exactly", "compared on", "modes",
                      "not applicable (why)"], rows, notes, warnings)


def memory_sources(suite: Suite) -> list[str]:
    """Every memory source named by a reading in the suite, in first-seen order."""
    seen: dict[str, None] = {}
    for run in suite.runs:
        memory = run.result.get("memory", {})
        if memory.get("source") and fmt.num(memory.get("peak_bytes")) is not None:
            seen[memory["source"]] = None
        for phase in (memory.get("phases") or {}).values():
            if isinstance(phase, dict) and phase.get("source") and fmt.num(phase.get("peak_bytes")) is not None:
                seen[phase["source"]] = None
    return list(seen)


SOURCE_NOTES = {
    "cpu-rss": "resident set size of the worker process tree (CPU run; includes the Python runtime); "
               "per-phase figures are the highest reading sampled during that phase",
    "cuda-allocated": "torch.cuda.max_memory_allocated: tensors alive in PyTorch's caching allocator; "
                      "per-phase figures are peaks of that phase (the counter is reset per phase)",
    "cuda-reserved": "torch.cuda.max_memory_reserved: memory the caching allocator holds (>= allocated); "
                     "per-phase figures are high-water marks: the allocator keeps its cache, so a phase's figure "
                     "includes memory reserved by earlier phases",
    "nvml-process": "NVML: device memory used by this process tree (includes CUDA context); per-phase figures "
                    "are high-water marks (the caching allocator keeps what it reserved)",
    "nvml-device": "NVML: device-wide used memory (includes other processes); per-phase figures are high-water "
                   "marks (the caching allocator keeps what it reserved)",
}


def instrument_note(suite: Suite) -> str:
    """The suite's own instrument in the memory numbers: each method run's weight snapshot (one host copy of its
    trainable weights, to check that training moved them), taken out of its host readings; '' when none."""
    sizes = [fmt.num(((r.result.get("memory") or {}).get("instrument") or {}).get("param_snapshot_bytes"))
             for r in suite.methods if r.status == "ok"]
    sizes = [b for b in sizes if b is not None]
    if not sizes:
        return ""
    return (f"Instrument: every method run holds the suite's exact snapshot of its trainable weights on the host "
            f"(up to {fmt.bytes_text(max(sizes), 'host').replace(' (host)', '')} per run), which a plain run of the "
            f"method does not; it is taken out of every host-memory reading (cpu-rss) made after it, so memory "
            f"ratios compare the methods. Device readings (CUDA, NVML) never held it; the raw readings are in each "
            f"result's memory.instrument.")


def notes(suite: Suite) -> list[str]:
    """Plain-language notes on how every number was obtained, for the page and the Markdown."""
    out = [
        f"Accuracy: greedy decoding on {datachecks.split_text(suite)}; headline numbers (results.csv's "
        f"accuracy_before / accuracy_after, the across-seeds and statistics tables) use the mode "
        f"`{suite.headline_mode}`"
        + (" (chosen in report_settings.json)" if suite.headline_mode != fmt.HEADLINE_MODE else "")
        + f". Brackets are 95% {datachecks.interval_text(suite)}.",
        "Scoring modes: " + "; ".join(f"`{m}`: {fmt.MODE_DESCRIPTIONS.get(m, 'no description')}" for m in fmt.MODES)
        + ". Results written before the modes were renamed stored suite-strict as 'strict' and suite-flexible as "
          "'flexible'; the report reads them under the new names.",
        "Significance: each family of tests (between methods per seed, each method against its start, methods "
        "over seeds, each method against the control arm over seeds) is Holm-adjusted on its own and no test is "
        "in two; the control arm (its start on every question) is compared with the methods only as their start. "
        f"A difference is called significant when its adjusted p is below {ALPHA}.",
        "Throughput: completions/s and tokens/s are generated completions and tokens per second of training time "
        "(train_s, every phase); 'Throughput and time' adds them per second of the generation phase alone, the "
        "timing basis, set-up and wall time.",
        "Trained weights changed: the share of trainable elements (requires_grad; LoRA: the adapters) whose "
        f"stored value differs after training; below {LOW_CHANGE:.0%} the run is flagged.",
        "Memory readings from different sources are not comparable and are never charted together.",
        f"Generation: every generation of the suite (rollouts, sample pool, evaluation) decoded with "
        f"`{suite_backend(suite)}` (generation.backend: one backend for every method"
        + ("; vLLM's preallocated memory is under 'Generation backend')." if suite_backend(suite) == "vllm"
           else ", HF generate)."),
    ]
    parallel, device = throughput.concurrency(suite)
    if parallel > 1 and device == "cuda":
        out.append(f"Concurrency: method runs ran {parallel} at a time, each on GPUs of its own (never a shared "
                   f"device, so each memory reading is its run's own; the GPU column says which); they shared the "
                   f"host's CPU cores, memory and PCIe, so throughput and time may carry a little of each other's "
                   f"load; set parallel_runs=1 for runs one after another.")
    elif parallel > 1:
        threads = (suite.spec or {}).get("threads") or "default"
        out.append(f"Concurrency: method runs shared this machine, {parallel} at a time ({threads} torch thread(s) "
                   f"each), so their throughput and time figures carry each other's load and compare only "
                   f"approximately; set parallel_runs=1 for clean timings.")
    for source in memory_sources(suite):
        out.append(f"Memory source `{source}`: {SOURCE_NOTES.get(source, 'see the run environment')}.")
    instrument = instrument_note(suite)
    if instrument:
        out.append(instrument)
    out.append("A reading shown as 'not measured' was not taken; it is not zero.")
    return out


INTROS = {
    "seeds": "Mean and spread over each method's ok seeds (shown because some method has more than one).",
    "networks": "Every network a method keeps in memory while it trains, how it is stored and computed, and what "
                "its weights, gradients and optimizer state cost (static accounting, MiB).",
    "throughput": "Seconds and rates per run; set-up is shown beside training because the rates leave it out.",
    "lengths": "The max_length each TRL stage or method trained with (tokens) and what it cost in data.",
    "generation": "Decoding settings, once for the suite: one column per distinct sampling configuration "
                  "(matched methods share one), then the greedy evaluation.",
    "per_seed": "Each seed's accuracy after training, per method, with the mean and standard deviation over seeds.",
    "seed_tests": "Methods compared at the seed level (paired t-test over seeds), beside the per-question tests.",
    "ladder": "GRPO's successors as an ablation ladder: each rung's accuracy change against the rung before it "
              "(paired t-test over seeds, Holm-adjusted over the ladder's rungs).",
    "efficiency": "Each method's accuracy gain for what it spent: per optimizer step, per generated token and per "
                  "hour of training (DAPO's extra generation counted against it).",
    "start_tests": "Every method against the checkpoint it started from, on the same questions (McNemar, Holm).",
    "reward_model": "How well the learned reward model ranks held-out pairs: the signal PPO (reward model) trains on.",
    "control": "The control arm (learning rate 0): a check on the pipeline itself.",
    "overoptimisation": "PPO against the learned reward model: the proxy it optimised (reward-model score) beside "
                        "the verifier's reward on the same completions. A rising proxy with a falling verifier "
                        "reward is reward over-optimisation.",
    "dynamics": "What training did, per method: the last fifth of its logged steps (reward, KL to the reference, "
                "entropy, completion length, zero-variance groups, clip fraction, gradient norm; PPO's critic).",
    "monitors": "Reward-hacking and 'aha' monitors on the final evaluation's completions, per method.",
    "anchors": "Published numbers for this model, measured elsewhere under other conditions (external).",
    "data_checks": "What the evaluated split shares with the training split, by question, by whole working and by "
                   "step, and how many independent units (clusters) it has: the report calls the split held out "
                   "only where an overlap is 0.",
    "memory_per_rank": "Runs started as several processes (accelerate): each rank's own peak memory by source, "
                       "the max over ranks (memory per device) and the sum, beside each run's parallel layout "
                       "(memory_per_rank.csv has the same numbers in bytes).",
    "generation_backend": "Who generated each method's completions during training; vLLM's preallocated memory "
                          "(a setting) apart from the measured training memory.",
}
"""One line under each section title, shared by summary.md and index.html."""


def detail_tables(suite: Suite) -> dict[str, fmt.Table]:
    """Every detail table by section key (see :data:`INTROS`); empty ones included (a page leaves them out).

    After the first five (across seeds, networks, throughput, lengths, generation) come the statistics tables:
    per-seed values, the seed-level t-tests, the ablation ladder and what each gain cost, each method against its
    start, the reward model's held-out accuracy, the control arm's check and the published anchors; then what
    training did (bench.report.dynamics: reward over-optimisation, training dynamics, the final evaluation's
    monitors). The between-method McNemar table is
    :func:`paired_tests_table` (placed by the page beside these). Memory per rank and the generation backend
    (bench.report.ranks; empty without a multi-process run / without vLLM) are placed by the page beside the
    per-phase memory.
    """
    return {
        "seeds": seeds.across_seeds(suite),
        "networks": networks.network_table(suite),
        "throughput": throughput.throughput_table(suite),
        "lengths": settings.length_table(suite),
        "generation": settings.generation_table(suite),
        "per_seed": seeds.per_seed_table(suite),
        "seed_tests": seeds.seed_tests_table(suite),
        "ladder": ladder.ladder_table(suite),
        "efficiency": efficiency.efficiency_table(suite),
        "start_tests": start_tests_table(suite),
        "reward_model": reward_model_table(suite),
        "overoptimisation": dynamics.overoptimisation_table(suite),
        "control": control_table(suite),
        "dynamics": dynamics.dynamics_table(suite),
        "monitors": dynamics.monitors_table(suite),
        "anchors": anchors.anchor_table(suite),
        "data_checks": datachecks.data_checks_table(suite),
        "memory_per_rank": ranks.rank_memory_table(suite),
        "generation_backend": ranks.backend_table(suite),
    }
