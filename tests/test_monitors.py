"""Training-dynamics monitors (bench.telemetry.monitors) against hand-made completions and hand-worked values."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench.telemetry.monitors import (DEFAULT_REFLECTION_PHRASES, MONITOR_NAMES, THRESHOLDS, answer_in_think,
                            completion_monitors, curve_flags, flags, group_monitors, numbers_in, record_monitors,
                            reflection_count, repeated_ngram, run_flags, strict_mode, think_block)
from bench.results import METRIC_NAMES
from test_rollout_engine import _context, model_dirs  # noqa: F401 (model_dirs is a pytest fixture)

RIGHT = "<think>3 + 4 = 7</think> <answer>7</answer>"          # right format, right answer, 7 in the think block
WRONG = "<think>Wait, 3 + 4 = 8</think> <answer>8</answer>"    # right format, wrong answer, one reflection phrase
EMPTY = "<think>I am not sure</think> <answer>seven</answer>"  # right format, no number: no strict answer
LOOP = "the sum is big the sum is big the sum is big"          # no answer; "the sum is big" three times
BARE = "The answer is 7. Let me check: verify, double-check. Recheck!"  # no tags; four phrases, strict answer 7


def test_every_monitor_name_is_a_canonical_metric() -> None:
    assert set(MONITOR_NAMES) <= set(METRIC_NAMES)
    assert set(THRESHOLDS) <= set(METRIC_NAMES)
    assert strict_mode() == "suite-strict"


def test_completion_monitors_on_a_hand_made_batch() -> None:
    texts = [RIGHT, WRONG, EMPTY, LOOP, BARE]
    golds = ["7", "7", "7", "7", "7"]
    got = completion_monitors(texts, golds, lengths=[10, 20, 30, 40, 50], hit_max=[False, False, False, True, False])
    assert set(got) == set(MONITOR_NAMES)
    # lengths: mean 150 / 5 = 30; p90 at position 0.9 x 4 = 3.6 -> 40 + 0.6 x 10 = 46
    assert got["completion_length"] == 30.0 and got["completion_length_p90"] == pytest.approx(46.0)
    assert got["truncated_rate"] == pytest.approx(1 / 5)
    # no strict answer: EMPTY (a word in the block), LOOP (no marker at all)
    assert got["empty_answer_rate"] == pytest.approx(2 / 5)
    # right format, wrong answer: WRONG (8) and EMPTY (no answer is not the right one); RIGHT is right, BARE
    # has no tags
    assert got["format_only_rate"] == pytest.approx(2 / 5)
    assert got["repeated_ngram_rate"] == pytest.approx(1 / 5)  # LOOP only
    assert got["repetition_rate"] == pytest.approx(1 / 5)      # LOOP is also back to back
    # answer in the think block: RIGHT (7 in "3 + 4 = 7") and WRONG (8 in "3 + 4 = 8"); BARE has no think block
    assert got["answer_in_think_rate"] == pytest.approx(2 / 5)
    # reflection phrases: WRONG 1 ("Wait"), BARE 4 ("Let me check", "verify", "double-check", "Recheck")
    assert got["reflection_rate"] == pytest.approx(2 / 5)
    assert got["reflection_count"] == pytest.approx(5 / 5)


def test_optional_inputs_leave_their_monitors_out() -> None:
    got = completion_monitors([RIGHT, LOOP], None)
    assert set(got) == set(MONITOR_NAMES) - {"completion_length", "completion_length_p90", "truncated_rate",
                                             "format_only_rate"}
    assert got["empty_answer_rate"] == 0.5
    assert completion_monitors([], None) == {}
    with pytest.raises(ValueError, match="2 completions but 1 golds"):
        completion_monitors([RIGHT, LOOP], ["7"])
    with pytest.raises(ValueError, match="lengths"):
        completion_monitors([RIGHT], ["7"], lengths=[1, 2])


def test_chat_message_completions_are_read_as_text() -> None:
    got = completion_monitors([[{"role": "assistant", "content": WRONG}]], ["7"])
    assert got["format_only_rate"] == 1.0 and got["reflection_count"] == 1.0


def test_repeated_ngram_counts_scattered_and_overlapping_repeats() -> None:
    # scattered: "he has five apples" at three places, other words between
    assert repeated_ngram("He has five apples so he has five apples and then he has five apples")
    # punctuation is part of a word: "apples." is not "apples", so this one repeats only twice
    assert not repeated_ngram("He has five apples. so he has five apples and then he has five apples")
    assert not repeated_ngram("he has five apples and he has five apples")  # only twice
    assert repeated_ngram("a a a a a a")  # positions 0, 1, 2: overlapping occurrences count
    assert not repeated_ngram("a a a a a")  # positions 0, 1 only
    assert not repeated_ngram("x y z")  # shorter than one n-gram
    assert repeated_ngram("1 2 3", n=1, repeats=1)


def test_reflection_phrases_are_case_insensitive_and_word_bounded() -> None:
    assert reflection_count("WAIT. wait, Wait!") == 3
    assert reflection_count("awaited the waiting list; verified; rechecking") == 0
    assert reflection_count("let   me\ncheck") == 1  # any whitespace between a phrase's words
    assert reflection_count("re-check and recheck and double-check") == 3
    assert reflection_count("hmm, hold on", phrases=["hold on", "hmm"]) == 2
    assert "wait" in DEFAULT_REFLECTION_PHRASES


def test_answer_in_think_block() -> None:
    assert think_block("x <think>a 1</think> <answer>1</answer>") == "a 1"
    assert think_block("<think>a 1 <answer>1</answer>") == "a 1 "  # no </think>: up to <answer>
    assert think_block("no block") is None
    assert numbers_in("cost $1,000 and 5.0 then 16-3, x2 2.") == {"1000", "5", "16", "3", "2"}
    assert answer_in_think("<think>total 1,000</think><answer>1000</answer>")  # compared canonically
    assert not answer_in_think("<think>total 999</think><answer>1000</answer>")
    assert not answer_in_think("<think>total 1000</think><answer>none</answer>")  # no strict answer
    assert not answer_in_think("1000 #### 1000")  # no think block
    assert not answer_in_think("<think>1000</think>")  # a think block but no answer


def test_group_monitors_share_of_zero_variance_groups() -> None:
    # groups of 3: [1, 1, 1] flat, [0, 1, 0] not, [0.5, 0.5, 0.5 + 1e-9] flat within tolerance, [0, 0, 0] flat
    rewards = [1, 1, 1, 0, 1, 0, 0.5, 0.5, 0.5 + 1e-9, 0, 0, 0]
    assert group_monitors(rewards, 3) == {"zero_std_groups": 0.75}
    assert group_monitors([1.0, 2.0], 1) == {"zero_std_groups": 1.0}  # one completion per group: always flat
    assert group_monitors([], 4) == {}
    with pytest.raises(ValueError, match="groups of 4"):
        group_monitors([1.0, 2.0, 3.0], 4)
    with pytest.raises(ValueError, match="group_size"):
        group_monitors([1.0], 0)


def test_flags_name_every_crossed_threshold_in_table_order() -> None:
    lines = flags({"repeated_ngram_rate": 0.25, "empty_answer_rate": 0.62, "format_only_rate": 0.5,
                   "zero_std_groups": math.nan, "reflection_rate": 0.9, "truncated_rate": None})
    assert lines == [
        "empty_answer_rate 62.0% > 50.0%: " + THRESHOLDS["empty_answer_rate"][2],
        "repeated_ngram_rate 25.0% > 20.0%: " + THRESHOLDS["repeated_ngram_rate"][2],
    ]  # format_only_rate is judged by its rise, not its level; NaN, None and unthresholded names are skipped
    assert flags({}) == []


@pytest.mark.parametrize("name", sorted(THRESHOLDS))
def test_each_threshold_flags_just_past_its_value(name: str) -> None:
    comparison, value, why = THRESHOLDS[name]
    past = value + 0.01 if comparison == ">" else value - 0.01
    assert flags({name: value}) == [] and why
    assert len(flags({name: past})) == 1 and flags({name: past})[0].startswith(name + " ")


def test_curve_flags_judge_the_last_fifth() -> None:
    # 10 points: the window is the last 2. Early empty answers (step 1-8 at 90%) do not flag; a late rise does.
    points = [{"step": s, "empty_answer_rate": 0.9} for s in range(1, 9)]
    calm = points + [{"step": 9, "empty_answer_rate": 0.1}, {"step": 10, "empty_answer_rate": 0.3}]
    assert curve_flags(calm) == []  # mean of 0.1 and 0.3 is 20%
    late = points[:8] + [{"step": 9, "truncated_rate": 0.3}, {"step": 10, "truncated_rate": 0.2}]
    assert curve_flags(late) == ["truncated_rate 25.0% > 20.0%: " + THRESHOLDS["truncated_rate"][2]
                                 + " (mean of the last 2 of 10 logged points)"]
    assert curve_flags([{"step": 1, "zero_std_groups": 0.9}]) == [
        "zero_std_groups 90.0% > 80.0%: " + THRESHOLDS["zero_std_groups"][2] + " (mean of the last 1 of 1 logged "
        "points)"]
    assert curve_flags([]) == []


def test_record_monitors_read_evaluation_records() -> None:
    records = [{"completion": RIGHT, "gold": "7", "tokens": 12, "hit_max": False},
               {"completion": LOOP, "gold": "7", "tokens": 64, "hit_max": True}]
    got = record_monitors(records)
    # the completion monitors, plus the format rate (the share in the tag format: RIGHT is, LOOP is not), which the
    # format-farming flag compares with the format-only rate
    format_rate = got.pop("format_reward")
    assert got == completion_monitors([RIGHT, LOOP], ["7", "7"], lengths=[12, 64], hit_max=[False, True])
    assert got["truncated_rate"] == 0.5 and got["completion_length"] == 38.0 and format_rate == 0.5


def test_run_flags_join_training_and_final_evaluation() -> None:
    curves = [{"step": 1, "repeated_ngram_rate": 0.5}]
    assert run_flags(curves, {"empty_answer_rate": 0.75}) == [
        "repeated_ngram_rate 50.0% > 20.0%: " + THRESHOLDS["repeated_ngram_rate"][2]
        + " (mean of the last 1 of 1 logged points)",
        "final evaluation: empty_answer_rate 75.0% > 50.0%: " + THRESHOLDS["empty_answer_rate"][2]]
    assert run_flags([], None) == []


def test_format_only_completions_flag_by_how_far_they_rose() -> None:
    # A weak model is mostly "right format, wrong answer" from the start: 55% then 60% is a rise of 5 pp (no
    # flag); 40% then 62% is 22 pp > 15 pp (flag). Over training the first and last fifth of points are compared.
    from bench.telemetry.monitors import RISES, rise_flags, run_flags

    assert rise_flags({"format_only_rate": 0.55}, {"format_only_rate": 0.60}) == []
    assert rise_flags({"format_only_rate": 0.40}, {"format_only_rate": 0.62}) == [
        "format_only_rate rose 40.0% -> 62.0% (+22.0 pp > 15.0 pp): " + RISES["format_only_rate"][1]]
    curves = [{"format_only_rate": v} for v in (0.3, 0.3, 0.3, 0.3, 0.3, 0.5, 0.5, 0.5, 0.5, 0.6)]
    lines = run_flags(curves, {"format_only_rate": 0.7}, start={"format_only_rate": 0.5})
    assert lines == [
        "format_only_rate rose 30.0% -> 55.0% (+25.0 pp > 15.0 pp): " + RISES["format_only_rate"][1]
        + " (first vs last 2 of 10 logged points)",
        "final evaluation: format_only_rate rose 50.0% -> 70.0% (+20.0 pp > 15.0 pp): " + RISES["format_only_rate"][1]]
    assert run_flags(curves[:5], {"format_only_rate": 0.9}) == []  # flat curve, no start: no flag


def _noisy_format_curve(first: float, last: float, jitter: float = 0.08) -> list[dict[str, float]]:
    """20 points: the first four around ``first``, the last four around ``last`` (+-jitter, a batch's noise)."""
    values = [first + jitter * (-1) ** i for i in range(4)] + [first] * 12 + [last + jitter * (-1) ** i
                                                                              for i in range(4)]
    return [{"step": i, "format_only_rate": v} for i, v in enumerate(values)]


def test_the_control_arm_never_flags_itself() -> None:
    # The lr-0 control cannot learn, yet on cpu-tiny's default run it went 46.9% -> 68.8% in format-only
    # completions between its first and last logged windows: a rise that alone would flag format farming.
    control = _noisy_format_curve(0.469, 0.688)
    assert [line for line in curve_flags(control) if "format_only_rate" in line]  # alone, the rise flags
    assert run_flags(control, {"format_only_rate": 0.7}, start={"format_only_rate": 0.5}, control=control,
                     control_evaluation={"format_only_rate": 0.7}, n=5000) == []
    # A method that rose as much as the control did is not flagged either: the control shows the same noise.
    method = _noisy_format_curve(0.47, 0.72)
    assert curve_flags(method, control) == []
    # One that rose far beyond the control (and beyond both windows' noise) is.
    farming = _noisy_format_curve(0.30, 0.95, jitter=0.02)
    flagged = curve_flags(farming, control)
    assert len(flagged) == 1 and "format_only_rate rose 30.0% -> 95.0%" in flagged[0]
    assert "control arm +21.9 pp" in flagged[0]


def test_level_flags_must_exceed_the_control_arm() -> None:
    # Both at about 30% truncated in their last window: the shared budget, not the method, cuts them off.
    method = [{"step": i, "truncated_rate": 0.30 + 0.01 * (i % 2)} for i in range(10)]
    control = [{"step": i, "truncated_rate": 0.29 + 0.01 * (i % 2)} for i in range(10)]
    assert curve_flags(method) and curve_flags(method, control) == []
    clean = [{"step": i, "truncated_rate": 0.02} for i in range(10)]
    assert curve_flags(method, clean)[0].endswith("control arm 2.0%")
    # The final evaluation: 62% empty answers against the control's 61% on 5,000 questions is within noise.
    from bench.telemetry.monitors import eval_flags

    assert eval_flags({"empty_answer_rate": 0.62}, None, {"empty_answer_rate": 0.61}, n=5000) == []
    assert eval_flags({"empty_answer_rate": 0.62}, None, {"empty_answer_rate": 0.10}, n=5000)


# --- every online method's curves carry the canonical names ---------------------------------------------------
ONLINE_RUNS = {  # run name -> (recipe module, its config): every online method, TRL's GRPO included
    "grpo": ("grpo", {}),
    "grpo_engine": ("grpo_engine", {"missing_eos_penalty": 1.0}),
    "ppo": ("ppo", {"reward": "model"}),
    "ppo_verifier": ("ppo", {"reward": "verifier"}),
    "control": ("control", {"enabled": True}),
    **{name: ("grpo_family", {"enabled": True}) for name in
       ("rloo", "reinforce_pp", "dr_grpo", "dapo", "gspo", "cispo", "sapo")},
}


@pytest.fixture(scope="module")
def online_curves(tmp_path_factory: pytest.TempPathFactory, model_dirs: Any) -> dict[str, list[dict]]:  # noqa: F811
    """Run name -> the curves one training step of that recipe returned (the tiny models of test_rollout_engine)."""
    import importlib

    from bench.config import registry
    from bench.telemetry import Telemetry

    out = {}
    for name, (module, overrides) in ONLINE_RUNS.items():
        recipe = importlib.import_module(f"baselines.{module}")
        config = recipe.Config(**{**registry.METHODS[name].defaults, **overrides})
        ctx = _context(tmp_path_factory.mktemp(name), model_dirs, name, config)
        ctx.spec.train.steps = 1
        ctx.telemetry = Telemetry("cpu", enabled=False)  # the worker's telemetry: TRL's seams attach to it
        with ctx.telemetry:
            out[name] = recipe.train(ctx).log_history
    return out


def test_every_online_method_logs_the_canonical_curves(online_curves: dict[str, list[dict]]) -> None:
    from bench.config.registry import METHODS
    from bench.report.dynamics import ONLINE_CURVES, PPO_DYNAMICS

    assert set(ONLINE_CURVES) | set(PPO_DYNAMICS) <= set(METRIC_NAMES)  # one table of names
    assert set(MONITOR_NAMES) - {"repetition_rate", "truncated_rate"} <= set(ONLINE_CURVES)
    assert set(online_curves) == set(METHODS) - {"dpo"}  # every online method in the registry is run here
    for name, curves in online_curves.items():
        assert curves, name
        required = set(ONLINE_CURVES)
        required |= set(PPO_DYNAMICS) if ONLINE_RUNS[name][0] == "ppo" else set()
        required |= {"rm_score"} if name == "ppo" else set()
        required |= {"missing_eos_penalty_reward"} if ONLINE_RUNS[name][1].get("missing_eos_penalty") else set()
        for point in curves:
            logged = {key for key, value in point.items() if isinstance(value, (int, float))}
            missing, unknown = sorted(required - logged), sorted(set(point) - set(METRIC_NAMES) - {"step"})
            assert not missing, f"{name} does not log {missing}"
            assert not unknown, f"{name} logs names outside METRIC_NAMES: {unknown}"
