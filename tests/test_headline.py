"""The headline block that opens summary.md and index.html (bench.report.headline): the set-up in
one line, each contestant's mean accuracy over seeds with its interval, its tested change from the start and its
peak memory with the source, and one sentence on PPO's four networks; nothing in it says more than its test.

Built on tests/test_report.py's hand-counted stats suite: GRPO right on 14 and 12 of 20 questions (seeds 0, 1),
PPO (reward model) on 8 and 10, the start on 8, every run's peak 500 MiB (cpu-rss).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.report import build_report, load_suite
from bench.report.headline import headline_block, mean_interval, reward_model_line
from bench.results import write_json_atomic
from test_report import _stats_suite, _with_reward_model


def _edit(suite: Path, run_id: str, **fields) -> None:
    path = suite / "runs" / run_id / "result.json"
    res = json.loads(path.read_text())
    for key, value in fields.items():
        section, _, name = key.partition("__")
        if name:
            res.setdefault(section, {})[name] = value
        else:
            res[key] = value
    write_json_atomic(path, res)


@pytest.fixture()
def suite(tmp_path: Path) -> Path:
    return _stats_suite(tmp_path)


def test_the_block_opens_the_summary_and_the_page(suite: Path) -> None:
    build_report(suite)
    md = (suite / "summary.md").read_text(encoding="utf-8")
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[0] == "## At a glance" and sections[1] == "## Findings"
    html = (suite / "index.html").read_text(encoding="utf-8")
    assert html.index('id="at-a-glance"') < html.index('id="findings"')
    for line in headline_block(load_suite(suite)):
        assert f"- {line}" in md


def test_each_method_line_has_its_interval_its_tested_change_and_its_peak_with_the_source(suite: Path) -> None:
    lines = headline_block(load_suite(suite))
    grpo = next(line for line in lines if line.startswith("GRPO:"))
    # 70% and 60%: mean 65%, sd 7.07 pp, t(0.975, 1) = 12.706: half-width 63.5 pp, clipped to [0, 100].
    assert grpo.startswith("GRPO: 65.0% [1.5, 100.0] (95% t interval over 2 seeds, clipped to [0, 100]);")
    # Against the start (8 of 20): +30 and +20 pp; seed 0: 6 gained, 0 lost, exact McNemar p = 2/64, Holm x 4
    # (GRPO and PPO x 2 seeds; the control arm is not in the family) = 0.125: not below 0.05.
    assert "+25.0 pp from the start (40.0%); McNemar against the start, Holm over its family of 4: p_holm < 0.05 " \
           "in 0 of 2 seed(s)" in grpo
    assert grpo.endswith("peak 500.0 MiB (cpu-rss, mean over 2 seeds).")
    assert not any(line.startswith("Control") for line in lines)  # a pipeline check, not a contestant


def test_the_ppo_sentence_follows_the_measured_ratio_and_the_seed_test(suite: Path) -> None:
    for seed in (0, 1):
        _edit(suite, f"ppo-s{seed}", memory__peak_bytes=800 * 2 ** 20)
    sentence = headline_block(load_suite(suite))[-1]
    assert sentence.startswith("PPO's four networks (actor, critic, reward model, reference) cost 1.60x GRPO's peak "
                               "memory (800.0 MiB against 500.0 MiB, cpu-rss, mean over seeds 0, 1)")
    # PPO - GRPO: 40 - 70 and 50 - 60: -30 and -10 pp; the paired t-test over 2 seeds cannot tell -20 pp from zero.
    assert "an accuracy difference of -20.0 pp that the seeds cannot tell from zero (paired t-test over 2 seeds" \
           in sentence


def test_no_ratio_across_memory_sources(suite: Path) -> None:
    _edit(suite, "ppo-s0", memory__source="cuda-allocated")  # seed 1 still has both on cpu-rss: its ratio alone
    assert "(500.0 MiB against 500.0 MiB, cpu-rss, seed 1)" in headline_block(load_suite(suite))[-1]
    _edit(suite, "ppo-s1", memory__source="cuda-allocated")
    assert "a peak memory not measured on one source for both" in headline_block(load_suite(suite))[-1]


def test_an_unlearned_reward_model_flags_ppo_in_the_block(suite: Path) -> None:
    lines = headline_block(load_suite(_with_reward_model(suite, 0.52)))
    assert any(line.startswith("PPO (reward model) [reward model did not learn]: ") for line in lines)
    assert "against GRPO" in lines[-1]
    # The cost-and-buy sentence carries the flag too: it is PPO against that reward model, not against the task.
    assert lines[-1].endswith("[reward model did not learn: this is PPO against a reward model whose held-out pair "
                              "accuracy is not above both chance and its untrained head (the reward model's line), not "
                              "PPO against the task.]"), lines[-1]


def test_the_ppo_ratio_uses_only_the_seeds_both_methods_measured(suite: Path) -> None:
    """PPO 800 MiB on seed 0 only (seed 1 has no reading): the ratio is seed 0's, not PPO's seed 0 over GRPO's
    mean over two seeds; each method's own line is the mean of its peaks."""
    _edit(suite, "ppo-s0", memory__peak_bytes=800 * 2 ** 20)
    _edit(suite, "ppo-s1", memory__peak_bytes=None)
    _edit(suite, "grpo-s1", memory__peak_bytes=700 * 2 ** 20)
    lines = headline_block(load_suite(suite))
    assert "cost 1.60x GRPO's peak memory (800.0 MiB against 500.0 MiB, cpu-rss, seed 0)" in lines[-1], lines[-1]
    grpo = next(line for line in lines if line.startswith("GRPO:"))
    assert grpo.endswith("peak 600.0 MiB (cpu-rss, mean over 2 seeds).")


def test_the_setup_line_names_model_task_and_budget(suite: Path) -> None:
    meta = json.loads((suite / "suite.json").read_text())
    meta["spec"].update(task={"source": "synthetic"}, train={"steps": 200, "prompts_per_step": 8, "group_size": 8},
                        generation={"max_new_tokens": 32}, seeds=[0, 1])
    write_json_atomic(suite / "suite.json", meta)
    assert headline_block(load_suite(suite))[0] == (
        "Model hub (Qwen/Qwen2.5-0.5B-Instruct) on the synthetic task, 20 test questions; 200 steps x 8 prompts x "
        "G 8 = 64 completions per step, up to 32 new tokens each; 2 seed(s) planned per method; accuracy suite-strict, "
        "greedy.")


def test_one_seed_uses_the_runs_own_interval() -> None:
    assert mean_interval([0.4], {"low": 0.35, "high": 0.45})[1:] == (0.35, 0.45, "95% CI")
    mean, low, high, what = mean_interval([0.40, 0.42, 0.44], None)
    # mean 42%, sd 2 pp, t(0.975, 2) = 4.303: half 4.303 x 2 / sqrt(3) = 4.97 pp
    assert (mean, what) == (pytest.approx(0.42), "95% t interval over 3 seeds")
    assert (low, high) == (pytest.approx(0.42 - 0.04969, abs=1e-4), pytest.approx(0.42 + 0.04969, abs=1e-4))


def test_the_reward_model_curve_figure_draws_the_recorded_points(suite: Path) -> None:
    from bench.report import figures

    curve = [{"step": 0, "heldout_pair_accuracy": 0.5, "train_pair_accuracy": 0.51},
             {"step": 10, "loss": 0.6}, {"step": 20, "heldout_pair_accuracy": 0.62, "train_pair_accuracy": 0.74}]
    _edit(suite, "reward_model", curves=curve)
    loaded = load_suite(suite)
    assert figures.reward_model_points(loaded) == [(0, 0.5, 0.51), (20, 0.62, 0.74)]
    (suite / "figures").mkdir(exist_ok=True)
    info = figures.reward_model_figure(loaded, suite / "figures")
    assert info is not None and (suite / "figures" / info.name).stat().st_size > 0
    assert "62.0% [55.1, 68.4] on 200 held-out pairs (untrained head: 50.0%)" in info.caption
    assert "it learned" in info.caption


def test_the_weight_snapshot_is_noted_as_the_instrument(suite: Path) -> None:
    from bench.report.tables import notes

    assert not any(n.startswith("Instrument:") for n in notes(load_suite(suite)))
    _edit(suite, "grpo-s0", memory__instrument={"param_snapshot_bytes": 513 * 2 ** 20, "where": "host",
                                               "excluded_from": ["cpu-rss"], "with_instrument": {"cpu-rss": 1}})
    note = next(n for n in notes(load_suite(suite)) if n.startswith("Instrument:"))
    assert "up to 513.0 MiB per run" in note and "taken out of every host-memory reading" in note


def test_a_start_that_is_a_changed_copy_of_the_source_says_so(suite: Path) -> None:
    assert "starts from the source weights" not in headline_block(load_suite(suite))[0]
    _edit(suite, "warm_start", metrics={"start_from": "source weights", "start_dtype": "bfloat16",
                                        "start_max_abs_change": 0.0039, "start_changed_share": 0.97})
    assert headline_block(load_suite(suite))[0].endswith(
        "greedy; every method starts from the source weights saved in bfloat16 (largest element change 0.0039 from "
        "the source, 97.0% of elements), not the source weights themselves.")
    # The warm start also scored the source weights themselves: both starts' accuracy, side by side.
    result = json.loads((suite / "runs" / "warm_start" / "result.json").read_text())
    after = result["accuracy"]["after"]["suite-strict"]
    result["accuracy"]["source_weights"] = {"suite-strict": {"correct": after["correct"] + 2, "total": after["total"],
                                                             "accuracy": (after["correct"] + 2) / after["total"]}}
    write_json_atomic(suite / "runs" / "warm_start" / "result.json", result)
    assert headline_block(load_suite(suite))[0].endswith(
        "not the source weights themselves (the start's accuracy: 40.0% as saved, 50.0% from the source weights).")


def test_a_start_that_is_a_changed_copy_is_also_scored_from_the_source_weights(monkeypatch, tmp_path: Path) -> None:
    """The warm start scores the source weights in float32 beside the saved copy, through the same evaluation, only
    when the copy differs from them."""
    from types import SimpleNamespace

    from bench.config.loading import load_spec
    from bench.execution import run_evaluation

    loaded: list[tuple] = []
    monkeypatch.setattr("bench.model.loading.load_causal_lm",
                        lambda source, model, device, trained: loaded.append((source, device, trained)) or "src")
    monkeypatch.setattr(run_evaluation, "evaluate_policy",
                        lambda spec, outcome, rows, telemetry, threads: {"scores": {"policy": outcome.policy}})
    spec = load_spec("cpu-quick")
    changed = SimpleNamespace(metrics={"start_from": "source weights", "start_max_abs_change": 0.0039},
                              settings={"source": tmp_path}, tokenizer=None)
    assert run_evaluation.source_start_scores(spec, changed, [], None, "cpu", 1) == {"policy": "src"}
    assert loaded == [(tmp_path, "cpu", True)]  # trained=True: the float32 values, as every actor loads them
    for metrics in ({"start_from": "source weights", "start_max_abs_change": 0.0}, {"start_from": "warm start"}):
        same = SimpleNamespace(metrics=metrics, settings={"source": tmp_path}, tokenizer=None)
        assert run_evaluation.source_start_scores(spec, same, [], None, "cpu", 1) is None
    assert len(loaded) == 1


def test_the_start_record_measures_the_bf16_copy_against_the_source(tmp_path: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from baselines.sft import start_record
    from bench.config.spec import Spec

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=2, intermediate_size=32))
    model.save_pretrained(tmp_path / "source")
    spec = Spec()
    spec.model.dtype = "bfloat16"
    copy = model.to(torch.bfloat16)
    record = start_record(copy, tmp_path / "source", spec)
    assert record["from"] == "source weights" and record["dtype"] == "bfloat16"
    assert 0 < record["max_abs_change"] < 0.01 and 0.5 < record["changed_share"] <= 1
    assert start_record(copy, None, spec) == {"from": "warm start", "dtype": "bfloat16"}


def test_the_reward_model_line_says_what_ppo_trained_against_and_whether_it_over_optimised(tmp_path: Path) -> None:
    """The fixture's reward model learned (66% of 200 held-out pairs against its untrained head's 50%) and its
    PPO run's reward-model score rose while the verifier's reward fell: the block says both, so a reader does
    not quote PPO (reward model)'s accuracy as PPO's against the task."""
    from report_fixtures import write_suite

    suite = load_suite(write_suite(tmp_path))
    line = reward_model_line(suite)
    assert line is not None and line.startswith("PPO (reward model)'s reward model learned: it ranks held-out pairs "
                                                "66.0% [")
    assert "on 200 held-out pairs (untrained head: 50.0%) right" in line
    assert "PPO over-optimised it in 1 of 1 seed(s)" in line
    lines = headline_block(suite)
    assert lines[-2] == line and lines[-1].startswith("PPO's four networks")


def test_the_reward_model_line_of_an_unlearned_reward_model_says_so(suite: Path) -> None:
    line = reward_model_line(load_suite(_with_reward_model(suite, 0.52)))
    assert line is not None and line.startswith("PPO (reward model)'s reward model did not learn: it ranks held-out "
                                                "pairs 52.0% [")
    assert line.endswith("so that arm is marked 'reward model did not learn'.")
    assert "over-optimised" not in line
