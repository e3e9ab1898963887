"""Findings, claims check, headline, citation and the text tables, rendered from fixture result files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from report_fixtures import RUN_COMMAND, run_without_torch, write_suite

from bench.report import build_report, load_suite
from bench.report.claims import (BY_CONSTRUCTION, NOT_BY_CONSTRUCTION, NOT_MEASURED, NOT_SUPPORTED, SUPPORTED,
                                 VERDICTS, claims_table, load_claims)
from bench.report.findings import findings

SECTION_IDS = ["findings", "claims", "headline", "cite", "results", "paired", "networks", "throughput",
               "phase_share", "phase_memory", "notes", "environment"]
MD_SECTIONS = ["## Findings", "## Claims check", "## Headline", "## Cite this run", "## Results per method",
               "## Paired tests (headline accuracy, same questions)", "## Networks resident while training",
               "## Throughput and time",
               "## Time per phase", "## Time per phase: shares", "## Peak memory per phase", "## Notes on sources"]


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    suite = write_suite(tmp_path_factory.mktemp("full"))
    build_report(suite)
    return suite


def md_rows(md: str, section: str) -> dict[str, list[str]]:
    """Rows of the first table under '## {section}', keyed by their first cell (header row under its name)."""
    body = md.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in re.split(r"(?<!\\) \| ", line.strip()[2:-2])] for line in body.splitlines()
            if line.startswith("| ")]
    return {r[0]: r for r in rows}


def test_every_section_is_in_the_page_and_the_markdown(full: Path) -> None:
    page = (full / "index.html").read_text(encoding="utf-8")
    for section in SECTION_IDS:
        assert f'id="{section}"' in page, section
    md = (full / "summary.md").read_text(encoding="utf-8")
    positions = [md.index(title + "\n") for title in MD_SECTIONS]
    assert positions[:4] == sorted(positions[:4]) and positions[0] < positions[4]  # findings first, then claims
    assert "http://" not in page and "https://" not in page  # self-contained: fetches nothing


def test_headline_numbers_equal_the_fixtures(full: Path) -> None:
    rows = md_rows((full / "summary.md").read_text(encoding="utf-8"), "Headline")
    header = rows["method"]
    ppo = dict(zip(header, rows["PPO (reward model)"]))
    assert ppo["networks resident"] == "actor, critic, reward, reference"
    assert ppo["static memory per network (MiB, accounting)"] == (
        "actor 16.00 + critic 16.00 + reward 1.00 + reference 1.00 = 34.00")
    assert ppo["peak memory (source)"] == "740.0 MiB (cpu-rss)"  # 700 + 10 per network
    assert ppo["completions/s of training"] == "120.00" and ppo["generated tokens/s of training"] == "2,400.0" and ppo["s/step (median)"] == "0.533 s"
    assert ppo["accuracy suite-strict before → after (95% CI)"].startswith("25.0% [") and "→ 15.0% [" in ppo[
        "accuracy suite-strict before → after (95% CI)"]
    assert ppo["n questions (independent units)"] == "400 (400 problems)"  # one question per problem
    assert ppo["seeds"] == "0" and ppo["status"] == "ok"
    # Bold only where a test separates the value: one seed has no test of its rates, and GRPO (TRL)'s 160 of 400 is
    # not significantly above the suite engine's 156, so nothing here is marked best.
    engine = dict(zip(header, rows["GRPO (suite engine)"]))
    assert engine["completions/s of training"] == "200.00" and not ppo["completions/s of training"].startswith("**")
    assert not dict(zip(header, rows["GRPO (TRL)"]))["accuracy suite-strict before → after (95% CI)"].startswith("**")
    assert dict(zip(header, rows["DPO (TRL, pool pairs)"]))["completions/s of training"] == "n/a (offline)"


def test_phase_and_phase_memory_tables(full: Path) -> None:
    md = (full / "summary.md").read_text(encoding="utf-8")
    shares = md_rows(md, "Time per phase: shares")
    ppo = dict(zip(shares["run"], shares["PPO (reward model)"]))
    # 20 + 2 + 15 + 1 + 3 (reference) + 9 (critic) = 50 s of phase time.
    assert ppo["generation (s, share)"] == "20.00 s (40%)" and ppo["critic (s, share)"] == "9.00 s (18%)"
    assert ppo["all phases (s)"] == "50.00 s"
    assert dict(zip(shares["run"], shares["GRPO (TRL)"]))["critic (s, share)"] == "—"
    memory = md_rows(md, "Peak memory per phase")
    row = dict(zip(memory["run"], memory["PPO (reward model)"]))
    assert row["source"] == "cpu-rss, Δ over post-load baseline 600.0 MiB"
    assert row["generation (MiB)"] == "+135.0" and row["update (MiB)"] == "+140.0"  # 735 and 740 over 600
    assert "minus the reading after the models were loaded" in md


def test_findings_say_only_what_the_fixtures_support(full: Path) -> None:
    found = [f.line() for f in findings(load_suite(full))]
    text = "\n".join(found)
    assert "PPO (reward model)'s static training memory is 2.00× GRPO (TRL)'s: 34.00 MiB vs 17.00 MiB" in text
    assert "The critic alone costs 16.00 MiB" in text
    # PPO with the learned reward model is 25 points below GRPO on the same 400 questions: significant.
    assert any("GRPO (TRL) vs PPO (reward model) (seed 0): +25.0 pp" in f and "significant" in f and "Holm" in f
               for f in found)
    # GRPO vs the suite engine's GRPO (160 vs 156 of 400) is not.
    assert re.search(r"3 are not significantly different, the largest such gap GRPO \(TRL\) vs GRPO \(suite engine\) "
                     r"\+1\.0 pp", text)
    # The control arm is a pipeline check (after equals start on every question), not a "noise floor" of accuracy.
    assert "Control (lr 0), the pipeline check: accuracy after equals its start exactly" in text
    assert "noise floor): 25.0%" not in text
    # Against the start (100 of 400): GRPO +15 pp is significant, PPO's -10 pp too; the control arm is no method
    # against its start (its check is the pipeline check above), so it is not in this family.
    start = next(f for f in found if f.startswith("Against the starting checkpoint"))
    assert "improved significantly: GRPO (TRL) +15.0 pp" in start and "declined significantly: PPO (reward model) " \
        "-10.0 pp" in start and "Control (lr 0)" not in start
    assert "GPU" not in text.replace("no GPU", "")  # a CPU run: no VRAM finding
    for f in findings(load_suite(full)):
        assert f.basis  # every finding says where its number comes from
    md = (full / "summary.md").read_text(encoding="utf-8")
    assert md.split("## Findings\n", 1)[1].split("\n## ")[0].count("\n1. ") == 1


def test_claims_verdicts(full: Path) -> None:
    table = claims_table(load_suite(full))
    verdicts = {row[0]: row[-1] for row in table.rows}
    claims = {c["id"]: c["claim"] for c in load_claims()}
    # What follows from how the recipes are built is "true by construction", apart from what a
    # measurement could have refuted.
    assert verdicts[claims["ppo-four-networks"]] == BY_CONSTRUCTION
    # Accounted (34 / 17 = 2.00, by construction) and measured side by side; the verdict follows
    # the measurement (cpu-rss, 740 / 720 MiB = 1.03x: not about double).
    memory = next(row for row in table.rows if row[0] == claims["ppo-doubles-memory"])
    assert memory[-1] == NOT_SUPPORTED and "accounted: " in memory[3] and "2.00×" in memory[3]
    assert "measured: " in memory[3] and "1.03×" in memory[3] and "cpu-rss" in memory[3]
    assert verdicts[claims["critic-saving"]] == BY_CONSTRUCTION  # 33 - 17 = 16 MiB = the critic's weights+grads+Adam
    assert verdicts[claims["grpo-no-reward-network"]] == BY_CONSTRUCTION
    assert verdicts[claims["critic-passes-gone"]] == BY_CONSTRUCTION
    assert verdicts[claims["group-size-4-8"]] == NOT_MEASURED  # one G
    assert verdicts[claims["advantage-negligible"]] == NOT_MEASURED  # no separate advantage phase
    bf16 = next(row for row in table.rows if row[0] == claims["bf16-rounds-updates"])
    assert bf16[-1] == NOT_MEASURED and "cannot be measured by a suite run" in bf16[3]
    assert set(verdicts.values()) <= set(VERDICTS)
    assert all(len(row) == 5 and row[1] and row[2] for row in table.rows)  # source and method for each
    assert "By construction" in table.notes[0] and "Measured: 0 supported" in table.notes[0]


def test_claims_verdict_follows_the_measurement(tmp_path: Path) -> None:
    """Without a measured peak the accounting decides: 'false by construction' when PPO's static memory is not
    about double GRPO's."""
    suite = write_suite(tmp_path, methods=("grpo", "ppo"))
    for run in ("grpo-s0", "ppo-s0"):
        path = suite / "runs" / run / "result.json"
        data = json.loads(path.read_text())
        data["memory"]["peak_bytes"] = None  # no reading: the accounted ratio is all there is
        if run == "ppo-s0":
            data["memory"]["networks"]["critic"]["optimizer_bytes"] = 200 * 1024**2  # a huge critic: 5x, not ~2x
        path.write_text(json.dumps(data))
    claims = {c["id"]: c for c in load_claims()}
    table = claims_table(load_suite(suite), [claims["ppo-doubles-memory"]])
    assert table.rows[0][-1] == NOT_BY_CONSTRUCTION and "×" in table.rows[0][3]


def test_a_lora_reference_that_shares_the_actors_weights_is_not_a_full_network(tmp_path: Path) -> None:
    # "Four full networks resident" must not read true when the reference is the actor's base
    # with the adapters off (0 weight bytes of its own, shared_with ['actor']).
    suite = write_suite(tmp_path, methods=("grpo", "ppo"))
    path = suite / "runs" / "ppo-s0" / "result.json"
    data = json.loads(path.read_text())
    data["memory"]["networks"]["reference"].update(weight_bytes=0, shared_params=500_000, shared_with=["actor"])
    path.write_text(json.dumps(data))
    claims = {c["id"]: c for c in load_claims()}
    row = claims_table(load_suite(suite), [claims["ppo-four-networks"]]).rows[0]
    assert row[-1] == NOT_BY_CONSTRUCTION, row
    assert "3 full network(s) of 4" in row[3] and "reference (not a full network: shares the actor weights)" in row[3]


def _g_sweep_suite(tmp_path: Path, scores: dict[tuple[str, int, int], int], extra: dict | None = None) -> Path:
    """A suite of sweep runs over train.group_size: (method, G, seed) -> correct of N."""
    from report_fixtures import _score, method_result
    from bench.results import write_json_atomic

    import shutil

    suite_dir = write_suite(tmp_path, methods=("grpo",))
    plan = json.loads((suite_dir / "suite.json").read_text())
    plan["runs"] = [r for r in plan["runs"] if not r.startswith("grpo")]
    shutil.rmtree(suite_dir / "runs" / "grpo-s0")  # the fixture's one GRPO run (G = 8, no sweep)
    for (method, g, seed), correct in scores.items():
        run_id = f"{method}-s{seed}@g{g}"
        res = method_result(method, seed=seed)
        res["run_id"] = run_id
        res["settings"]["group_size"] = g
        res["sweep"] = {"point": f"g{g}", "values": {"train.group_size": g, **(extra or {})}}
        res["accuracy"]["after"] = {"strict": _score(correct), "flexible": _score(correct)}
        write_json_atomic(suite_dir / "runs" / run_id / "result.json", res)
        plan["runs"].append(run_id)
    write_json_atomic(suite_dir / "suite.json", plan)
    return suite_dir


def test_group_size_claim_is_grpo_only_paired_over_seeds(tmp_path: Path) -> None:
    # A G-sweep claim that pooled every method and compared overlapping intervals said too much: GRPO only, at
    # equal other settings, seeds averaged, a paired test. G = 4 (160, 150 of 400) against G = 16 (170, 164):
    # differences -10 and -14 of 400, mean -3.0 pp, sd 0.71 pp: t = -8.5 with 1 df, p = 0.075: not
    # significantly below, so supported.
    claims = {c["id"]: c for c in load_claims()}
    scores = {("grpo", 4, 0): 160, ("grpo", 4, 1): 150, ("grpo", 16, 0): 170, ("grpo", 16, 1): 164}
    suite = load_suite(_g_sweep_suite(tmp_path / "a", scores))
    row = claims_table(suite, [claims["group-size-4-8"]]).rows[0]
    assert row[-1] == SUPPORTED and "paired t-test over 2 seeds" in row[3] and "G=4 − G=16: -3.0 pp" in row[3], row
    # An unrelated DPO point with another G and a far higher score cannot flip it: only GRPO's points count.
    with_dpo = {**scores, ("dpo", 32, 0): 390, ("dpo", 32, 1): 395}
    suite = load_suite(_g_sweep_suite(tmp_path / "b", with_dpo))
    assert claims_table(suite, [claims["group-size-4-8"]]).rows[0][-1] == SUPPORTED
    # Significantly below on every seed (differences -40 and -44 of 400, spread 1 pp): not supported.
    worse = {("grpo", 4, 0): 130, ("grpo", 4, 1): 120, ("grpo", 16, 0): 170, ("grpo", 16, 1): 164}
    row = claims_table(load_suite(_g_sweep_suite(tmp_path / "c", worse)), [claims["group-size-4-8"]]).rows[0]
    assert row[-1] == NOT_SUPPORTED, row


def test_citation_block(full: Path) -> None:
    rows = md_rows((full / "summary.md").read_text(encoding="utf-8"), "Cite this run")
    assert rows["commit"][1] == "0123456789abcdef0123456789abcdef01234567 (dirty: uncommitted changes)"
    assert rows["suite"][1] == "rlft-bench 0.1.0 at commit 0123456789ab; cite the suite with its CITATION.cff"
    assert rows["command (reproduce)"][1] == f"`{RUN_COMMAND}`"
    assert "--resume" in rows["command (continue this folder)"][1]
    assert rows["hardware"][1].startswith("no GPU; Test Xeon, 2 logical cores")
    assert "trl 1.16.0" in rows["packages"][1] and rows["preset"][1] == "cpu-tiny"
    assert "GRPO (TRL): n = 400 questions (one per problem), seed 0" in rows["accuracy n and seeds"][1]


def test_one_method_failed_cells_and_missing_methods_render(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, methods=("grpo",))
    build_report(suite)
    md = (suite / "summary.md").read_text(encoding="utf-8")
    assert "## Paired tests" not in md and "## Findings" in md and "## Claims check" in md
    assert "ppo not in this run" in md  # the claims say why they are not measured
    failed = write_suite(tmp_path, methods=("grpo", "ppo", "dpo"), failed=("ppo",), name="failed")
    meta = json.loads((failed / "suite.json").read_text())
    meta["runs"].append("ppo_verifier-s0")  # planned, never ran
    (failed / "suite.json").write_text(json.dumps(meta))
    build_report(failed)
    md = (failed / "summary.md").read_text(encoding="utf-8")
    page = (failed / "index.html").read_text(encoding="utf-8")
    assert "OutOfMemoryError: CUDA out of memory" in md and "OutOfMemoryError: CUDA out of memory" in page
    assert "2 of 4 method runs have no result: PPO (reward model) (failed), ppo_verifier (not run yet)" in md


def test_hostile_and_huge_completions_are_escaped_and_capped(tmp_path: Path) -> None:
    hostile = write_suite(tmp_path, completion="<script>alert(1)</script> 4", name="hostile")
    build_report(hostile)
    page = (hostile / "index.html").read_text(encoding="utf-8")
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    huge = write_suite(tmp_path, completion="x" * 1_000_000, name="huge")
    build_report(huge)
    page = (huge / "index.html").read_text(encoding="utf-8")
    assert len(page) < 300_000 and "x" * 2001 not in page and "more characters" in page


def test_bench_report_runs_where_torch_cannot_be_imported(tmp_path: Path) -> None:
    suite = write_suite(tmp_path)
    proc = run_without_torch(tmp_path, "report", str(suite))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (suite / "index.html").is_file() and "## Findings" in (suite / "summary.md").read_text()


def test_a_gpu_run_gets_a_vram_verdict_and_gpu_wording(tmp_path: Path) -> None:
    """With cuda-allocated readings the VRAM claim is decided (fixture: 740 vs 720 MiB, far from double)."""
    suite = load_suite(write_suite(tmp_path, methods=("grpo", "ppo"), source="cuda-allocated"))
    claims = {c["id"]: c for c in load_claims()}
    row = claims_table(suite, [claims["ppo-doubles-memory"]]).rows[0]
    assert row[-1] == NOT_SUPPORTED and "peak cuda-allocated" in row[3] and "1.03×" in row[3]
    assert any("peak GPU memory" in f.text for f in findings(suite))


def test_the_runner_records_the_run_and_resume_commands(tmp_path: Path) -> None:
    """suite.json 'commands': the resume line as the CLI builds it, and the same without --out FOLDER --resume."""
    from bench.execution.suite_folder import prepare_suite_dir
    from bench.config.loading import load_spec

    spec = load_spec("cpu-quick", [])
    resume = f"bench run --preset cpu-quick --out '{tmp_path / 'a b'}' --resume train.steps=2 'seeds=[0,1]'"
    prepare_suite_dir(spec, tmp_path / "a b", [], resume=False, resume_command=resume)
    commands = json.loads((tmp_path / "a b" / "suite.json").read_text())["commands"]
    assert commands == {"run": "bench run --preset cpu-quick train.steps=2 'seeds=[0,1]'", "resume": resume}


# --- what training did: dynamics, monitors, flags, over-optimisation, figures ----------------------
def test_training_dynamics_table_is_the_last_fifth_mean(full: Path) -> None:
    md = (full / "summary.md").read_text(encoding="utf-8")
    rows = md_rows(md, "Training dynamics")
    header = rows["method"]
    ppo = dict(zip(header, rows["PPO (reward model)"]))
    # Last fifth = points 16..19 of 20: entropy 1 - 0.01 i -> 0.825; length 20 + i -> 37.5; reward 0.40 + 0.002
    # x steps 81..96 -> 0.577; KL 0.001 x step -> 0.0885.
    assert ppo["logged steps"] == "20" and ppo["seeds"] == "1"
    assert ppo["policy entropy (nats per token)"] == "0.825" and ppo["completion length (tokens)"] == "37.5"
    assert ppo["mean reward (reward units)"] == "0.577" and ppo["KL(policy ‖ reference) (nats per token)"] == "0.0885"
    assert ppo["zero-variance groups (%)"] == "25.0%" and ppo["clip fraction (%)"] == "10.0%"
    assert ppo["gradient norm before clipping (gradient L2 norm)"] == "0.5"
    assert ppo["value loss (squared reward units)"] == "0.2" and ppo["explained variance (ratio)"] == "0.5"
    grpo = dict(zip(header, rows["GRPO (TRL)"]))
    assert grpo["value loss (squared reward units)"] == "—"  # no critic: not logged, not zero
    dpo = dict(zip(header, rows["DPO (TRL, pool pairs)"]))
    assert dpo["mean reward (reward units)"] == "—" and dpo["gradient norm before clipping (gradient L2 norm)"] == "2"
    assert 'id="dynamics"' in (full / "index.html").read_text(encoding="utf-8")


def test_reward_hacking_monitors_table_and_flags(full: Path) -> None:
    md = (full / "summary.md").read_text(encoding="utf-8")
    rows = md_rows(md, "Reward-hacking monitors (final evaluation)")
    header = rows["method"]
    assert dict(zip(header, rows["PPO (reward model)"]))["empty answer (%)"] == "60.0%"
    grpo = dict(zip(header, rows["GRPO (TRL)"]))
    assert grpo["empty answer (%)"] == "5.0%" and grpo["answer in think block (%)"] == "30.0%"
    assert grpo["reflection phrases (phrases per completion)"] == "0.2"
    start = dict(zip(header, rows["start: Warm start (SFT)"]))  # first row: what every method began from
    assert list(rows)[1] == "start: Warm start (SFT)" and start["reflection (any phrase) (%)"] == "2.0%"
    assert start["completion length (tokens)"] == "18"
    # Flags: one warning line per crossing under the per-run results, and one finding naming the run.
    results = md.split("## Results per method\n", 1)[1].split("\n## ", 1)[0]
    assert ("> **Warning:** PPO (reward model): truncated_rate 30.0% > 20.0%" in results
            and "(mean of the last 4 of 20 logged points)" in results)
    assert "> **Warning:** PPO (reward model): final evaluation: empty_answer_rate 60.0% > 50.0%" in results
    assert "GRPO (TRL): truncated_rate" not in md and "GRPO (TRL): final evaluation" not in md  # below thresholds
    texts = [f.text for f in findings(load_suite(full))]
    flagged = [t for t in texts if t.startswith("Training monitors flagged 1 run(s)")]
    assert len(flagged) == 1 and "empty_answer_rate 60.0%" in flagged[0]
    assert 'id="monitors"' in (full / "index.html").read_text(encoding="utf-8")


def test_no_flag_finding_without_a_crossing(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, methods=("grpo", "ppo_verifier"))
    assert not any(f.text.startswith("Training monitors") for f in findings(load_suite(suite)))


def test_monitor_problems_are_noted_under_the_dynamics_table(tmp_path: Path) -> None:
    from bench.report.dynamics import dynamics_table

    suite = write_suite(tmp_path, methods=("grpo",))
    path = suite / "runs" / "grpo-s0" / "result.json"
    data = json.loads(path.read_text())
    data["metrics"] = {"monitor_problems": "no completion lengths at 3 of 20 steps"}
    path.write_text(json.dumps(data))
    notes = dynamics_table(load_suite(suite)).notes
    assert "GRPO (TRL): monitors incomplete: no completion lengths at 3 of 20 steps" in notes


def test_reward_overoptimisation_table_warning_and_finding(full: Path) -> None:
    md = (full / "summary.md").read_text(encoding="utf-8")
    rows = md_rows(md, "Reward over-optimisation (PPO, reward model)")
    # rm_score 1.0 + 0.01 i: first fifth 1.015, last 1.175; accuracy reward 0.40 - 0.005 i: 39.25% -> 31.25%.
    assert rows["PPO (reward model)"][1:] == ["1.015", "1.175", "39.2%", "31.2%"]
    assert list(rows) == ["run", "PPO (reward model)"]  # only the run trained against the reward model
    texts = [f.text for f in findings(load_suite(full))]
    # Its reward model learned (66% of 200 held-out pairs, above chance and its untrained head's 50%): a rising
    # proxy with a falling verifier reward is reward over-optimisation, and no run carries the unlearned flag.
    assert any("reward over-optimisation:" in t and "rose (+0.16" in t and "(-8.0 pp" in t for t in texts), texts
    assert "[reward model did not learn]" not in md and "The reward model did not learn" not in md


def test_control_arm_zero_change_is_not_a_warning(full: Path) -> None:
    md = (full / "summary.md").read_text(encoding="utf-8")
    assert "Control (lr 0): training moved only" not in md  # lr 0 moves nothing by design
    assert "| Control (lr 0) | 0 | yes (0 differing questions) |" in md  # its after == before check stays
    row = md_rows(md, "Results per method")["Control (lr 0)"]
    assert row[-1] == "0.0% (lr 0: by design)"
    assert any(f.text.startswith("Control (lr 0), the pipeline check") for f in findings(load_suite(full)))


def test_headline_numbers_say_their_scoring_mode(full: Path) -> None:
    md = (full / "summary.md").read_text(encoding="utf-8")
    assert "accuracy suite-strict before → after (95% CI)" in md_rows(md, "Headline")["method"]
    header = md_rows(md, "Results per method")["method"]
    assert header[3] == "accuracy suite-strict (headline; before → after, 95% CI)"
    for f in findings(load_suite(full)):
        if "pp" in f.text or "accuracy" in f.text.lower():
            assert "suite-strict" in f.basis or "pairs" in f.basis or "rm_score" in f.basis, f


def test_headline_mode_from_report_settings_reaches_tables_and_figures(tmp_path: Path) -> None:
    suite = write_suite(tmp_path)
    (suite / "report_settings.json").write_text(json.dumps({"headline_mode": "suite-flexible"}), encoding="utf-8")
    build_report(suite)
    md = (suite / "summary.md").read_text(encoding="utf-8")
    header = md_rows(md, "Results per method")["method"]
    assert header[3] == "accuracy suite-flexible (headline; before → after, 95% CI)"
    assert header[4] == "accuracy suite-strict (before → after, 95% CI)"
    # GRPO (TRL): 160 + 10 of 400 right under suite-flexible.
    # 170 vs the suite engine's 166 of 400 is not significant: the highest accuracy is not bold.
    assert md_rows(md, "Headline")["GRPO (TRL)"][7] == "27.5% [23.4–32.1] → 42.5% [37.7–47.4]"
    assert (suite / "figures" / "accuracy_suite-flexible.png").exists()
    page = (suite / "index.html").read_text(encoding="utf-8")
    assert page.index("accuracy_suite-flexible.png") < page.index("accuracy_suite-strict.png")  # headline first
    assert "<th>accuracy after (suite-flexible)</th>" in page  # the shared stages' column too


def test_aha_and_overoptimisation_figures(full: Path) -> None:
    from bench.report import figures

    suite = load_suite(full)
    out = full / "figures"
    aha = figures.aha_figure(suite, out)
    over = figures.overoptimisation_figure(suite, out)
    assert aha is not None and over is not None
    assert "reflection" in aha.caption.lower() and "completion length" in aha.caption
    assert "66.0% of 200 held-out pairs" in over.caption  # the reward model's held-out accuracy beside it
    for name in ("aha.png", "overoptimisation.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
    page = (full / "index.html").read_text(encoding="utf-8")
    assert 'src="figures/aha.png"' in page and 'src="figures/overoptimisation.png"' in page
    # A folder without reflection or reward-model curves draws neither.
    bare = load_suite(write_suite(full.parent / "bare", methods=("dpo",)))
    assert figures.aha_figure(bare, out) is None and figures.overoptimisation_figure(bare, out) is None


def test_headline_accuracy_of_several_seeds_carries_their_spread(tmp_path: Path) -> None:
    """Two GRPO seeds at 150 and 170 of N correct: the headline cell gives the mean and the sd over seeds."""
    from report_fixtures import N, _score, method_result
    from bench.report.overview import headline_table
    from bench.results import write_json_atomic

    suite_dir = write_suite(tmp_path, methods=("grpo",))
    second = method_result("grpo", seed=1)
    second["accuracy"]["after"] = {"strict": _score(170), "flexible": _score(180)}
    write_json_atomic(suite_dir / "runs" / "grpo-s1" / "result.json", second)
    first = json.loads((suite_dir / "runs" / "grpo-s0" / "result.json").read_text())
    first["accuracy"]["after"] = {"strict": _score(150), "flexible": _score(160)}
    write_json_atomic(suite_dir / "runs" / "grpo-s0" / "result.json", first)
    plan = json.loads((suite_dir / "suite.json").read_text())
    plan["runs"].append("grpo-s1")
    write_json_atomic(suite_dir / "suite.json", plan)
    table = headline_table(load_suite(suite_dir))
    cell = next(c for row in table.rows if row[0].startswith("GRPO") for c in row if "→" in str(c))
    mean, sd = (150 + 170) / 2 / N, (2 * 10**2) ** 0.5 / N  # sample sd of two values 20 apart: 20 / sqrt(2)
    assert f"{100 * mean:.1f}% ± {100 * sd:.1f} pp (mean ± sd of 2 seeds" in cell, cell


def test_seed_level_finding_worded_by_the_holm_adjusted_t_test(tmp_path: Path) -> None:
    """GRPO at 150, 170 and DPO at 110, 110 of N over seeds 0, 1: differences 0.10 and 0.15, mean 0.125, sd
    0.0354, t = 0.125 / (0.0354 / sqrt 2) = 5.0 with 1 df; p = 1 - (2/pi) atan 5 = 0.126 (one pair: Holm = p)."""
    import math

    from report_fixtures import N, _score, method_result
    from bench.results import write_json_atomic

    suite_dir = write_suite(tmp_path, methods=("grpo", "dpo"))
    plan = json.loads((suite_dir / "suite.json").read_text())
    for method, correct in (("grpo", (150, 170)), ("dpo", (110, 110))):
        for seed, value in enumerate(correct):
            res = method_result(method, seed=seed)
            res["accuracy"]["after"] = {"strict": _score(value), "flexible": _score(value)}
            write_json_atomic(suite_dir / "runs" / f"{method}-s{seed}" / "result.json", res)
        plan["runs"].append(f"{method}-s1")
    write_json_atomic(suite_dir / "suite.json", plan)
    lines = [f.text for f in findings(load_suite(suite_dir))]
    seed_lines = [line for line in lines if line.startswith("Over seeds, GRPO (TRL) vs DPO")]
    assert seed_lines and "+12.5 pp" in seed_lines[0] and seed_lines[0].endswith("not significant"), lines
    p = 1 - 2 / math.pi * math.atan(5.0)
    basis = next(f.basis for f in findings(load_suite(suite_dir)) if f.text == seed_lines[0])
    assert f"Holm-adjusted p = {p:.3g}" in basis, basis


def test_headline_says_which_methods_were_tuned_on_validation(tmp_path: Path) -> None:
    from report_fixtures import method_result
    from bench.report.overview import headline_table
    from bench.results import write_json_atomic

    suite_dir = write_suite(tmp_path, methods=("grpo", "dpo", "control"))
    res = method_result("dpo")
    res["spec"]["tuning"] = {"methods": {"dpo": {"chosen": {"learning_rate": 3e-5}, "score": {"mean": 0.5},
                                                 "points": [{}, {}, {}], "n_questions": 500, "seeds": [0, 1]}}}
    write_json_atomic(suite_dir / "runs" / "dpo-s0" / "result.json", res)
    note = next(n for n in headline_table(load_suite(suite_dir)).notes if n.startswith("Hyperparameters"))
    assert "DPO (TRL, pool pairs): tuned on validation (3 grid points, n = 500, seeds [0, 1]" in note, note
    assert "validation 50.0%" in note and "untuned defaults: GRPO (TRL)" in note, note
    assert "chosen learning_rate = 3e-05," in note, note
    assert "never tuned (learning rate 0 by design): Control (lr 0)" in note and "GRPO (TRL), Control" not in note
