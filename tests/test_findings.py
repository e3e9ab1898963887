"""Findings, claims check, headline, citation and the text tables, rendered from fixture result files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from report_fixtures import RUN_COMMAND, run_without_torch, write_suite

from bench.report import build_report, load_suite
from bench.report.claims import NOT_MEASURED, NOT_SUPPORTED, SUPPORTED, claims_table, load_claims
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
    assert ppo["completions/s"] == "120.00" and ppo["tokens/s"] == "2,400.0" and ppo["s/step (median)"] == "0.533 s"
    assert ppo["accuracy suite-strict before → after (95% CI)"].startswith("25.0% [") and "→ 15.0% [" in ppo[
        "accuracy suite-strict before → after (95% CI)"]
    assert ppo["n questions"] == "400" and ppo["seeds"] == "0" and ppo["status"] == "ok"
    # The best value of a column is marked: fastest generation is the suite engine's GRPO, best accuracy TRL's.
    engine = dict(zip(header, rows["GRPO (suite engine)"]))
    assert engine["completions/s"] == "**200.00**" and not ppo["completions/s"].startswith("**")
    assert dict(zip(header, rows["GRPO (TRL)"]))["accuracy suite-strict before → after (95% CI)"].startswith("**")
    assert dict(zip(header, rows["DPO (TRL, pool pairs)"]))["completions/s"] == "n/a (offline)"


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
    assert any("GRPO (TRL) vs PPO (reward model): +25.0 pp" in f and "significant" in f and "Holm" in f
               for f in found)
    # GRPO vs the suite engine's GRPO (160 vs 156 of 400) is not.
    assert re.search(r"3 are not significantly different, the largest such gap GRPO \(TRL\) vs GRPO \(suite engine\) "
                     r"\+1\.0 pp", text)
    assert "Control (lr 0, the noise floor): 25.0%" in text
    # Against the start (100 of 400): GRPO +15 pp is significant, PPO's -10 pp too, the control's 0 is not.
    start = next(f for f in found if f.startswith("Against the starting checkpoint"))
    assert "improved significantly: GRPO (TRL) +15.0 pp" in start and "declined significantly: PPO (reward model) " \
        "-10.0 pp" in start and "not significantly changed: " in start and "Control (lr 0) +0.0 pp" in start
    assert "GPU" not in text.replace("no GPU", "")  # a CPU run: no VRAM finding
    for f in findings(load_suite(full)):
        assert f.basis  # every finding says where its number comes from
    md = (full / "summary.md").read_text(encoding="utf-8")
    assert md.split("## Findings\n", 1)[1].split("\n## ")[0].count("\n1. ") == 1


def test_claims_verdicts(full: Path) -> None:
    table = claims_table(load_suite(full))
    verdicts = {row[0]: row[-1] for row in table.rows}
    claims = {c["id"]: c["claim"] for c in load_claims()}
    assert verdicts[claims["ppo-four-networks"]] == SUPPORTED
    assert verdicts[claims["ppo-doubles-static"]] == SUPPORTED  # 34 / 17 = 2.00
    assert verdicts[claims["critic-saving"]] == SUPPORTED  # 33 - 17 = 16 MiB = the critic's weights+grads+Adam
    assert verdicts[claims["ppo-doubles-vram"]] == NOT_MEASURED  # cpu-rss only: never a VRAM verdict
    assert verdicts[claims["group-size-4-8"]] == NOT_MEASURED  # one G
    assert verdicts[claims["advantage-negligible"]] == NOT_MEASURED  # no separate advantage phase
    assert set(verdicts.values()) <= {SUPPORTED, NOT_SUPPORTED, NOT_MEASURED}
    assert all(len(row) == 5 and row[1] and row[2] for row in table.rows)  # source and method for each


def test_claims_verdict_follows_the_measurement(tmp_path: Path) -> None:
    """The same claim is 'not supported' when PPO's static memory is not about double GRPO's."""
    suite = write_suite(tmp_path, methods=("grpo", "ppo"))
    path = suite / "runs" / "ppo-s0" / "result.json"
    data = json.loads(path.read_text())
    data["memory"]["networks"]["critic"]["optimizer_bytes"] = 200 * 1024**2  # a huge critic: 5x, not ~2x
    path.write_text(json.dumps(data))
    claims = {c["id"]: c for c in load_claims()}
    table = claims_table(load_suite(suite), [claims["ppo-doubles-static"]])
    assert table.rows[0][-1] == NOT_SUPPORTED and "×" in table.rows[0][3]


def test_citation_block(full: Path) -> None:
    rows = md_rows((full / "summary.md").read_text(encoding="utf-8"), "Cite this run")
    assert rows["commit"][1] == "0123456789abcdef0123456789abcdef01234567 (dirty: uncommitted changes)"
    assert rows["command (reproduce)"][1] == f"`{RUN_COMMAND}`"
    assert "--resume" in rows["command (continue this folder)"][1]
    assert rows["hardware"][1].startswith("no GPU; Test Xeon, 2 logical cores")
    assert "trl 1.16.0" in rows["packages"][1] and rows["preset"][1] == "cpu-tiny"
    assert "GRPO (TRL): n = 400, seed 0" in rows["accuracy n and seeds"][1]


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
    row = claims_table(suite, [claims["ppo-doubles-vram"]]).rows[0]
    assert row[-1] == NOT_SUPPORTED and "(cuda-allocated)" in row[3] and "1.03×" in row[3]
    assert any("peak GPU memory" in f.text for f in findings(suite))


def test_the_runner_records_the_run_and_resume_commands(tmp_path: Path) -> None:
    """suite.json 'commands': the resume line as the CLI builds it, and the same without --out FOLDER --resume."""
    from bench.runner import prepare_suite_dir
    from bench.spec import load_spec

    spec = load_spec("cpu-quick", [])
    resume = f"bench run --preset cpu-quick --out '{tmp_path / 'a b'}' --resume train.steps=2 'seeds=[0,1]'"
    prepare_suite_dir(spec, tmp_path / "a b", [], resume=False, resume_command=resume)
    commands = json.loads((tmp_path / "a b" / "suite.json").read_text())["commands"]
    assert commands == {"run": "bench run --preset cpu-quick train.steps=2 'seeds=[0,1]'", "resume": resume}
