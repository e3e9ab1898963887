"""The report's "Memory per rank" section and memory_per_rank.csv (bench.report.ranks), from fabricated
suite folders (tests/report_fixtures.py) with the per-rank fields bench.execution.launch.merge_rank_files writes."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from report_fixtures import MIB, write_suite

from bench.report import build_report, load_suite, ranks, tables

GIB = 1024**3


def _edit(suite: Path, run_id: str, change: Any) -> None:
    path = suite / "runs" / run_id / "result.json"
    result = json.loads(path.read_text())
    change(result)
    path.write_text(json.dumps(result))


def _launched(peaks: dict[str, list[int | None]], strategy: str = "ddp", backend: str = "gloo",
              config: dict[str, Any] | None = None) -> Any:
    """A change that makes a result look like a 2+-rank run: ``peaks`` = source -> each rank's peak (None: that
    rank has no reading of the source); the first source is the headline one."""
    def change(result: dict[str, Any]) -> None:
        sources = list(peaks)
        n = len(peaks[sources[0]])
        memory = result["memory"]
        memory["source"] = sources[0]
        memory["ranks"] = [{"rank": k, "peak_bytes": peaks[sources[0]][k], "source": sources[0],
                            "by_source": {s: peaks[s][k] for s in sources if peaks[s][k] is not None}}
                           for k in range(n)]
        measured = [p for p in peaks[sources[0]] if p is not None]
        memory["peak_bytes_max"], memory["peak_bytes_sum"] = max(measured), sum(measured)
        memory["peak_bytes"] = max(measured)
        result["settings"]["parallel"] = {"launcher": "accelerate", "processes": n, "backend": backend,
                                          "strategy": strategy, "config_strategy": strategy,  # as launch.py
                                          "prompts_per_rank_per_step": 8 // n}
        result["environment"]["launcher"] = {"name": "accelerate", "processes": n, "backend": backend,
                                             "config_file": "bench/config/accelerate/ddp.yaml",
                                             "config": config or {"distributed_type": "MULTI_GPU"}}
        result["throughput"]["processes"] = n
    return change


def _one_process(result: dict[str, Any]) -> None:
    result["settings"]["parallel"] = {"launcher": "none", "processes": 1, "backend": None,
                                      "note": "not mapped onto several processes (the matched budget would change): "
                                              "one process"}


def _cpu_suite(tmp_path: Path) -> Path:
    """GRPO (TRL) and the engine's GRPO on two gloo ranks (cpu-rss; torch.cuda read 0 on rank 1), DPO one process."""
    suite = write_suite(tmp_path, methods=("grpo", "grpo_engine", "dpo"))
    _edit(suite, "grpo-s0", _launched({"cpu-rss": [700 * MIB, 900 * MIB], "cuda-allocated": [None, 0]}))
    _edit(suite, "grpo_engine-s0", _launched({"cpu-rss": [600 * MIB, 650 * MIB]}))
    _edit(suite, "dpo-s0", _one_process)
    return suite


def test_each_rank_peak_with_its_source_the_max_and_the_sum(tmp_path: Path) -> None:
    suite = load_suite(_cpu_suite(tmp_path))
    table = ranks.rank_memory_table(suite)
    assert table.header == ["method", "layout (launcher · strategy · processes)", "rank 0 peak", "rank 1 peak",
                            "max over ranks (per device)", "sum over ranks"]
    rows = {row[0]: row for row in table.rows}
    assert rows["GRPO (TRL)"] == ["GRPO (TRL)", "accelerate · ddp · 2 processes (gloo)", "700.0 MiB (cpu-rss)",
                                  "900.0 MiB (cpu-rss)", "900.0 MiB (cpu-rss)", "1600.0 MiB (cpu-rss)"]
    assert rows["GRPO (suite engine)"][2:] == ["600.0 MiB (cpu-rss)", "650.0 MiB (cpu-rss)", "650.0 MiB (cpu-rss)",
                                               "1250.0 MiB (cpu-rss)"]
    # DPO ran as one process under the launcher: its rank 0 is the run's own peak (700 + 2 networks x 10 MiB)
    assert rows["DPO (TRL, pool pairs)"][1:] == ["one process (not data parallel)", "720.0 MiB (cpu-rss)", "—",
                                                 "720.0 MiB (cpu-rss)", "720.0 MiB (cpu-rss)"]
    # the 0 torch.cuda read on a CPU is no measurement: no cuda-allocated row, and no 0 anywhere
    assert len(table.rows) == 3
    assert not any("cuda" in cell or cell.startswith("0") for row in table.rows for cell in row)


def test_gpu_runs_get_a_row_per_source_and_a_missing_reading_is_not_measured(tmp_path: Path) -> None:
    suite_dir = write_suite(tmp_path, methods=("grpo", "ppo_verifier"))
    _edit(suite_dir, "grpo-s0", _launched({"cuda-allocated": [30 * GIB, 31 * GIB], "nvml-process": [34 * GIB, None]},
                                          strategy="deepspeed-zero3-offload", backend="nccl",
                                          config={"distributed_type": "DEEPSPEED",
                                                  "deepspeed_config": {"zero_stage": 3, "offload_param_device": "cpu",
                                                                       "offload_optimizer_device": "cpu"}}))
    _edit(suite_dir, "ppo_verifier-s0", _launched({"cuda-allocated": [40 * GIB, 40 * GIB]}, backend="nccl"))
    table = ranks.rank_memory_table(load_suite(suite_dir))
    grpo = [row for row in table.rows if row[0] == "GRPO (TRL)"]
    assert [row[2:] for row in grpo] == [
        ["30.00 GiB (cuda-allocated)", "31.00 GiB (cuda-allocated)", "31.00 GiB (cuda-allocated)",
         "61.00 GiB (cuda-allocated)"],
        ["34.00 GiB (nvml-process)", "not measured", "not measured", "not measured"]]
    assert grpo[0][1] == ("accelerate · deepspeed ZeRO-3 (offload optimizer to cpu, parameters to cpu) · "
                          "2 processes (nccl)")


def test_the_report_and_the_csv_carry_the_section(tmp_path: Path) -> None:
    suite_dir = _cpu_suite(tmp_path)
    build_report(suite_dir)
    page = (suite_dir / "index.html").read_text()
    assert '<h2 id="memory_per_rank">Memory per rank</h2>' in page and 'href="#memory_per_rank"' in page
    assert page.index('id="phase_memory"') < page.index('id="memory_per_rank"')  # beside the other memory tables
    assert "900.0 MiB (cpu-rss)" in page and "1600.0 MiB (cpu-rss)" in page
    summary = (suite_dir / "summary.md").read_text()
    assert "## Memory per rank" in summary
    assert "| GRPO (TRL) | accelerate · ddp · 2 processes (gloo) | 700.0 MiB (cpu-rss) | 900.0 MiB (cpu-rss) |" \
        in summary
    rows = list(csv.DictReader((suite_dir / ranks.CSV_FILE).open()))
    grpo = [r for r in rows if r["run_id"] == "grpo-s0"]
    assert [(r["rank"], r["source"], r["peak_bytes"]) for r in grpo] == [("0", "cpu-rss", str(700 * MIB)),
                                                                        ("1", "cpu-rss", str(900 * MIB))]
    assert {r["max_bytes"] for r in grpo} == {str(900 * MIB)} and {r["sum_bytes"] for r in grpo} == {str(1600 * MIB)}
    assert {(r["launcher"], r["strategy"], r["processes"]) for r in grpo} == {("accelerate", "ddp", "2")}
    dpo = [r for r in rows if r["run_id"] == "dpo-s0"]
    assert len(dpo) == 1 and dpo[0]["processes"] == "1" and dpo[0]["strategy"] == ""


def test_a_one_process_suite_has_no_section_and_no_csv(tmp_path: Path) -> None:
    suite_dir = write_suite(tmp_path, methods=("grpo", "dpo"))
    (suite_dir / ranks.CSV_FILE).write_text("stale")  # from an earlier build: not left behind
    build_report(suite_dir)
    assert 'id="memory_per_rank"' not in (suite_dir / "index.html").read_text()
    assert "Memory per rank" not in (suite_dir / "summary.md").read_text()
    assert not (suite_dir / ranks.CSV_FILE).exists()


def test_what_differs_shows_a_method_with_another_parallel_layout(tmp_path: Path) -> None:
    """DPO ran as one process beside two-rank GRPOs: the layout rows are among the differences, listed first."""
    header, rows = tables.what_differs(load_suite(_cpu_suite(tmp_path)))
    assert header == ["setting", "GRPO (TRL)", "GRPO (suite engine)", "DPO (TRL, pool pairs)"]
    by_key = {row[0]: row[1:] for row in rows}
    assert by_key["parallel.processes"] == ["2", "2", "1"]
    assert by_key["parallel.launcher"] == ["accelerate", "accelerate", "none"]
    assert by_key["parallel.strategy"] == ["ddp", "ddp", "n/a"]
    same = [row[0] for row in rows].index("beta")  # recorded alike by every method: after the differences
    assert [row[0] for row in rows].index("parallel.processes") < same


@pytest.mark.parametrize("n", [2, 3])
def test_rank_columns_follow_the_widest_run(tmp_path: Path, n: int) -> None:
    suite_dir = write_suite(tmp_path, methods=("grpo", "grpo_engine"))
    _edit(suite_dir, "grpo-s0", _launched({"cpu-rss": [100 * MIB] * n}))
    _edit(suite_dir, "grpo_engine-s0", _launched({"cpu-rss": [100 * MIB, 100 * MIB]}))
    table = ranks.rank_memory_table(load_suite(suite_dir))
    assert table.header[2:2 + n] == [f"rank {k} peak" for k in range(n)]
    engine = next(row for row in table.rows if row[0] == "GRPO (suite engine)")
    assert engine[2 + 2:2 + n] == ["—"] * (n - 2)  # its missing third rank: a dash, not a reading
    assert engine[-1] == "200.0 MiB (cpu-rss)"


def test_the_engine_under_a_zero_config_says_what_ran_and_what_was_asked(tmp_path: Path) -> None:
    suite_dir = write_suite(tmp_path, methods=("grpo_engine",))

    def asked_zero3(result: dict[str, Any]) -> None:
        _launched({"cuda-allocated": [GIB, GIB]}, backend="nccl")(result)
        result["settings"]["parallel"]["config_strategy"] = "deepspeed-zero3"

    _edit(suite_dir, "grpo_engine-s0", asked_zero3)
    row = ranks.rank_memory_table(load_suite(suite_dir)).rows[0]
    assert row[1] == "accelerate · ddp (config asks deepspeed-zero3) · 2 processes (nccl)"
