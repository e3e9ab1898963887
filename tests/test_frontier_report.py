"""The report's side of GRPO's successors: the ablation ladder (numbers and Holm adjustment by hand), the claims
on the successors (each where it is false and where it is true) and the accuracy-against-cost Pareto figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from report_fixtures import N, write_suite

from bench.report import build_report, load_suite
from bench.report.ladder import FAMILY, NOT_RUN, ladder_table
from bench.report.summary import summary_markdown

AFTER = {  # method -> questions right (of 400) on seeds 0, 1, 2
    "grpo_engine": (156, 160, 164), "dr_grpo": (164, 172, 168), "dapo": (172, 172, 180),
    "gspo": (172, 172, 180), "rloo": (150, 160, 170),
}


def _score(correct: int) -> dict[str, Any]:
    return {"correct": correct, "total": N, "accuracy": correct / N, "low": None, "high": None}


def set_accuracy(after: dict[str, tuple[int, ...]]):
    """An ``edit`` for write_suite: the strict accuracy after of each listed method on each seed."""
    def edit(res: dict[str, Any]) -> None:
        if res["status"] == "ok" and res["method"] in after:
            correct = after[res["method"]][res["seed"]]
            res["accuracy"]["after"] = {"strict": _score(correct), "flexible": _score(correct + 10)}
    return edit


@pytest.fixture(scope="module")
def ladder_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_suite(tmp_path_factory.mktemp("ladder"), methods=tuple(AFTER), seeds=(0, 1, 2),
                       edit=set_accuracy(AFTER))


def test_ladder_numbers_and_holm(ladder_suite: Path) -> None:
    table = ladder_table(load_suite(ladder_suite))
    rows = {row[0]: row for row in table.rows}
    assert len(rows) == 7
    # Dr. GRPO − GRPO per seed: +8, +12, +4 of 400 = +2.0 ± 1.0 pp; t = 0.02 / (0.01 / √3) = 3.4641, df 2:
    # p = 1 − t / √(t² + 2) = 0.07418.
    dr = rows["GRPO (suite engine) → Dr. GRPO (suite engine)"]
    assert dr[1:5] == ["40.0%", "42.0%", "+2.0 ± 1.0 pp", "0, 1, 2"] and dr[5] == "0.0742"
    # DAPO − Dr. GRPO: +8, 0, +12 -> mean 1.667 pp, sd 1.528 pp, t = 1.8898, p = 1 − t / √(t² + 2) = 0.19936.
    dapo = rows["Dr. GRPO (suite engine) → DAPO (suite engine)"]
    assert dapo[3] == "+1.7 ± 1.5 pp" and dapo[5] == "0.199"
    # RLOO − GRPO: −6, 0, +6: mean 0, p = 1.
    rloo = rows["GRPO (suite engine) → RLOO (suite engine)"]
    assert rloo[3] == "+0.0 ± 1.5 pp" and rloo[5] == "1"
    # GSPO equals DAPO on every seed: zero spread, no p and out of the family.
    gspo = rows["DAPO (suite engine) → GSPO (suite engine)"]
    assert gspo[5] == gspo[6] == "undefined (zero spread)"
    # Holm over the 3 p-values: 3 × 0.07418 = 0.2225, max(0.2225, 2 × 0.19936) = 0.3987, max(0.3987, 1 × 1) = 1.
    assert (dr[6], dapo[6], rloo[6]) == ("0.223", "0.399", "1")
    # Methods the suite did not plan.
    for rung in ("GRPO (suite engine) → CISPO (suite engine)", "GRPO (suite engine) → SAPO (suite engine)",
                 "RLOO (suite engine) → REINFORCE++ (suite engine)"):
        assert NOT_RUN in rows[rung][3] and rows[rung][5] == "—"
    assert any(FAMILY in note and "the 3 rungs" in note for note in table.notes)
    assert any("paired t-test over seeds" in note for note in table.notes)


def test_ladder_on_the_page(ladder_suite: Path) -> None:
    build_report(ladder_suite)
    assert "## Ablation ladder (GRPO's successors)" in (ladder_suite / "summary.md").read_text(encoding="utf-8")
    page = (ladder_suite / "index.html").read_text(encoding="utf-8")
    assert "Ablation ladder (GRPO&#39;s successors)" in page or "Ablation ladder (GRPO's successors)" in page
    assert 'src="figures/pareto.png"' in page and (ladder_suite / "figures" / "pareto.png").is_file()


def test_ladder_states_the_updates_per_rollout_and_warns_at_one(tmp_path: Path) -> None:
    def updates(gspo: int):
        def edit(res: dict[str, Any]) -> None:
            set_accuracy(AFTER)(res)
            res["settings"]["optimizer_steps_per_rollout"] = gspo if res["method"] == "gspo" else 2
        return edit

    matched = ladder_table(load_suite(write_suite(tmp_path / "two", methods=tuple(AFTER), seeds=(0, 1, 2),
                                                  edit=updates(2))))
    assert "Every method of the ladder took 2 optimizer step(s) per rollout (ppo_epochs x minibatches)." in matched.notes
    assert matched.warnings == []
    one = ladder_table(load_suite(write_suite(tmp_path / "one", methods=tuple(AFTER), seeds=(0, 1, 2),
                                              edit=updates(1))))
    assert any(n.startswith("Optimizer steps per rollout differ between methods:") and "GSPO (suite engine): 1" in n
               for n in one.notes)
    assert len(one.warnings) == 1 and one.warnings[0].startswith("GSPO (suite engine) took one optimizer step")


def test_no_ladder_without_a_rung(tmp_path: Path) -> None:
    suite = write_suite(tmp_path)  # the default fixture: GRPO (suite engine) but none of its successors
    assert not ladder_table(load_suite(suite))
    assert "Ablation ladder" not in summary_markdown(load_suite(suite))


# --- claims on GRPO's successors --------------------------------------------------------------------------
def claim_verdicts(suite_dir: Path) -> dict[str, tuple[str, str]]:
    """Claim id -> (measured text, verdict) for the successors' claims."""
    from bench.report.claims import check, load_claims

    suite = load_suite(suite_dir)
    return {c["id"]: (lambda v: (v.measured, v.verdict))(check(suite, c)) for c in load_claims()}


def successors_edit(shorter: bool, higher: bool, fewer: bool, spread: bool | None = None):
    """Dr. GRPO's incorrect completions 30 tokens against GRPO's 50 (or the other way round), DAPO's entropy
    0.2 above GRPO's (or below), RLOO holding two networks (or a critic besides: three); ``spread``: log a
    'ratio_std' curve, GSPO's 0.1 against GRPO's 0.3 (or the other way round)."""
    def edit(res: dict[str, Any]) -> None:
        method, correct = res["method"], res["accuracy"]["after"]["strict"]["correct"]
        lengths = {"dr_grpo": 30 if shorter else 50, "grpo_engine": 50 if shorter else 30}
        if method in lengths:  # right answers 10 tokens; wrong ones the length under test
            res["_records"] = [{"tokens": 10 if i < correct else lengths[method]} for i in range(N)]
        for point in res["curves"]:
            if method == "dapo":
                point["entropy"] += 0.2 if higher else -0.2
            if spread is not None and method in ("gspo", "grpo_engine"):
                point["ratio_std"] = 0.1 if (method == "gspo") == spread else 0.3
        if method == "rloo" and not fewer:
            res["memory"]["networks"]["critic"] = dict(res["memory"]["networks"]["actor"])
    return edit


SUCCESSORS = ("grpo_engine", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp")


def test_successor_claims_true(tmp_path: Path) -> None:
    from bench.report.claims import BY_CONSTRUCTION, SUPPORTED

    found = claim_verdicts(write_suite(tmp_path, methods=SUCCESSORS, seeds=(0, 1),
                                       edit=successors_edit(True, True, True, spread=True)))
    text, verdict = found["dr-grpo-shorter-incorrect"]
    assert verdict == SUPPORTED and "Dr. GRPO (suite engine) 30.0 (seeds 0, 1)" in text and "50.0 tokens" in text
    assert "below on 2 of 2 common seed(s)" in text and "zero spread" in text
    text, verdict = found["dapo-entropy-higher"]
    assert verdict == SUPPORTED and "DAPO (suite engine) 1.025" in text and "0.825" in text  # last fifth: 0.825
    text, verdict = found["gspo-ratio-spread"]
    assert verdict == SUPPORTED and "GSPO (suite engine) 0.100" in text and "0.300" in text
    text, verdict = found["critic-free-successors-networks"]
    assert verdict == BY_CONSTRUCTION and "RLOO (suite engine): 2 (actor, reference)" in text
    assert "REINFORCE++ (suite engine): 2" in text


def test_dynamics_shows_the_ratio_spread_only_where_the_policy_moved(tmp_path: Path) -> None:
    from bench.report.dynamics import dynamics_table

    moved = dynamics_table(load_suite(write_suite(tmp_path / "moved", methods=SUCCESSORS, seeds=(0, 1),
                                                  edit=successors_edit(True, True, True, spread=True))))
    column = "importance-ratio spread (ratio)"
    rows = {r[0]: dict(zip(moved.header, r)) for r in moved.rows}
    assert rows["GSPO (suite engine)"][column] == "0.1" and rows["GRPO (suite engine)"][column] == "0.3"
    assert rows["RLOO (suite engine)"][column] == "—"  # logged no spread in this fixture: a dash, not a zero

    def still(res: dict[str, Any]) -> None:  # one update per rollout: every spread 0 -> no column
        for point in res["curves"]:
            point["ratio_std"] = 0.0
    assert column not in dynamics_table(load_suite(write_suite(tmp_path / "still", methods=SUCCESSORS,
                                                               edit=still))).header


def test_successor_claims_false(tmp_path: Path) -> None:
    from bench.report.claims import NOT_BY_CONSTRUCTION, NOT_SUPPORTED

    found = claim_verdicts(write_suite(tmp_path, methods=SUCCESSORS, seeds=(0, 1),
                                       edit=successors_edit(False, False, False, spread=False)))
    text, verdict = found["dr-grpo-shorter-incorrect"]
    assert verdict == NOT_SUPPORTED and "Dr. GRPO (suite engine) 50.0" in text and "30.0 tokens" in text
    assert "below on 0 of 2" in text
    text, verdict = found["dapo-entropy-higher"]
    assert verdict == NOT_SUPPORTED and "DAPO (suite engine) 0.625" in text
    text, verdict = found["gspo-ratio-spread"]
    assert verdict == NOT_SUPPORTED and "GSPO (suite engine) 0.300" in text
    text, verdict = found["critic-free-successors-networks"]
    assert verdict == NOT_BY_CONSTRUCTION and "RLOO (suite engine): 3 (actor, reference, critic)" in text


def test_successor_claims_the_seeds_do_not_separate(tmp_path: Path) -> None:
    """DAPO's entropy 0.2 above GRPO's on seed 0 and 0.1 below on seed 1: the mean is above, the seeds disagree,
    so the claim is neither supported nor refuted; with one seed nothing can separate the methods."""
    from bench.report.claims import NOT_SEPARATED

    def edit(res: dict[str, Any]) -> None:
        if res["method"] == "dapo":
            for point in res["curves"]:
                point["entropy"] += 0.2 if res["seed"] == 0 else -0.1
    found = claim_verdicts(write_suite(tmp_path / "two", methods=SUCCESSORS, seeds=(0, 1), edit=edit))
    text, verdict = found["dapo-entropy-higher"]
    assert verdict == NOT_SEPARATED and "above on 1 of 2 common seed(s)" in text
    assert "the seeds do not separate them at p < 0.05" in text
    one = claim_verdicts(write_suite(tmp_path / "one", methods=SUCCESSORS, seeds=(0,),
                                     edit=successors_edit(True, True, True, spread=True)))
    assert {one[c][1] for c in ("dr-grpo-shorter-incorrect", "dapo-entropy-higher", "gspo-ratio-spread")} == {
        NOT_SEPARATED}


def test_successor_claims_not_measured(tmp_path: Path) -> None:
    from bench.report.claims import NOT_MEASURED

    found = claim_verdicts(write_suite(tmp_path))  # the default fixture: none of the successors
    for claim in ("dr-grpo-shorter-incorrect", "dapo-entropy-higher", "gspo-ratio-spread",
                  "critic-free-successors-networks"):
        assert found[claim][1] == NOT_MEASURED and "not in this run" in found[claim][0]
    # Dr. GRPO ran, but its per-question file has no token counts (eval_after.jsonl): not measured, with why.
    found = claim_verdicts(write_suite(tmp_path, methods=("grpo_engine", "dr_grpo"), name="no-tokens"))
    text, verdict = found["dr-grpo-shorter-incorrect"]
    assert verdict == NOT_MEASURED and "no token counts" in text
    # GSPO ran, but no curve holds the ratios' spread (a run from before the engine logged it): never a guess.
    found = claim_verdicts(write_suite(tmp_path, methods=("grpo_engine", "gspo"), name="no-spread"))
    text, verdict = found["gspo-ratio-spread"]
    assert verdict == NOT_MEASURED and "no ratio_std curve" in text


# --- accuracy for what it cost, and DAPO's extra generation ------------------------------------------------
def _spending(res: dict[str, Any]) -> None:
    """GRPO: 12,800 completions of 20 tokens in 50 s; DAPO: 640 more on seed 0, 1,280 on seed 1 (2 and 4 rounds)."""
    extra = {"dapo": 640 * (1 + res["seed"])}.get(res["method"], 0)
    res["throughput"].update(completions=12_800 + extra, generated_tokens=20 * (12_800 + extra), train_s=50.0,
                             steps=100)
    if extra:
        res["metrics"].update(extra_generation_rounds=2 * (1 + res["seed"]), extra_completions=extra)


@pytest.fixture(scope="module")
def spending_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    after = {"grpo_engine": (156, 160), "dapo": (172, 172)}

    def edit(res: dict[str, Any]) -> None:
        set_accuracy(after)(res)
        if res["status"] == "ok" and res["method"] != "dpo":
            _spending(res)
    return write_suite(tmp_path_factory.mktemp("spending"), methods=("grpo_engine", "dapo", "dpo", "control"),
                       seeds=(0, 1), edit=edit)


def test_gain_per_step_token_and_hour(spending_suite: Path) -> None:
    from bench.report.efficiency import efficiency_table

    table = efficiency_table(load_suite(spending_suite))
    rows = {r[0]: r for r in table.rows}
    assert set(rows) == {"GRPO (suite engine)", "DAPO (suite engine)"}  # DPO generates nothing; control: a check
    grpo, dapo = rows["GRPO (suite engine)"], rows["DAPO (suite engine)"]
    # GRPO: (158 - 100) / 400 = +14.5 pp over 100 steps, 256,000 tokens, 50 s.
    assert grpo[1:] == ["0, 1", "+14.5", "100", "12,800", "256,000", "50", "+14.5", "+56.6", "+1,044"]
    # DAPO: +18.0 pp; its extra rounds count: (13,440 + 14,080) / 2 = 13,760 completions, 275,200 tokens.
    assert dapo[1:] == ["0, 1", "+18.0", "100", "13,760", "275,200", "50", "+18.0", "+65.4", "+1,296"]
    assert any("ratio of means" in n for n in table.notes)


def test_extra_generation_is_the_first_difference(spending_suite: Path) -> None:
    from bench.report.tables import EXTRA_GENERATION, NOT_RECORDED, what_differs

    header, rows = what_differs(load_suite(spending_suite))
    assert rows[0][0] == EXTRA_GENERATION
    drawn = dict(zip(header[1:], rows[0][1:]))
    assert drawn["DAPO (suite engine)"] == ("seed 0: 2 rounds, +640 completions (+5.0% over the matched batch); "
                                           "seed 1: 4 rounds, +1,280 completions (+10.0% over the matched batch)")
    assert drawn["GRPO (suite engine)"] == NOT_RECORDED
    markdown = summary_markdown(load_suite(spending_suite))
    assert "## Accuracy for what it cost" in markdown and EXTRA_GENERATION in markdown


def test_no_cost_table_with_one_online_method(tmp_path: Path) -> None:
    from bench.report.efficiency import efficiency_table
    from bench.report.tables import EXTRA_GENERATION, what_differs

    suite = load_suite(write_suite(tmp_path, methods=("grpo_engine", "dpo")))
    assert efficiency_table(suite).rows == []
    assert all(row[0] != EXTRA_GENERATION for row in what_differs(suite)[1])


# --- the Pareto figure ------------------------------------------------------------------------------------
def test_pareto_figure_drawn(ladder_suite: Path, tmp_path: Path, drawn: dict[str, Any]) -> None:
    from bench.report.figures import method_colors
    from bench.report.figures import pareto_figure

    suite = load_suite(ladder_suite)
    info = pareto_figure(suite, tmp_path / "figures")
    assert info is not None and info.name == "pareto.png" and (tmp_path / "figures" / "pareto.png").is_file()
    assert "MiB, source cpu-rss" in info.caption and "wall time (s" in info.caption and "15 on the memory" in info.caption
    memory_ax, time_ax = drawn["pareto.png"].axes[:2]
    assert memory_ax.get_xlabel() == "peak memory (MiB, source: cpu-rss)"
    assert time_ax.get_xlabel() == "wall time of the run (s)" and "accuracy after training (%" in time_ax.get_ylabel()
    # Per method: one collection of its seeds (3 points), one of its mean (1 diamond), in the method's colour.
    colors = method_colors(suite)
    seeds, means = memory_ax.collections[0::2], memory_ax.collections[1::2]
    assert len(seeds) == len(means) == 5 and all(len(c.get_offsets()) == 3 for c in seeds)
    grpo_mean = means[0].get_offsets()[0]
    assert abs(grpo_mean[1] - 40.0) < 1e-9 and abs(grpo_mean[0] - 720.0) < 1e-9  # (156+160+164)/3 of 400; 700+20 MiB
    assert tuple(means[0].get_facecolor()[0][:3]) == pytest.approx(
        tuple(int(colors["GRPO (suite engine)"][i:i + 2], 16) / 255 for i in (1, 3, 5)))


def test_no_pareto_figure_for_one_method(tmp_path: Path) -> None:
    from bench.report.figures import pareto_figure

    suite = load_suite(write_suite(tmp_path, methods=("grpo_engine", "control")))  # the control arm is no trade-off
    assert pareto_figure(suite, tmp_path / "figures") is None
