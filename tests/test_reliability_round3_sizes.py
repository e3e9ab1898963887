"""Every size the spec takes has an upper bound, and the tokens one step generates a limit: an absurd size is one
line at load time (dry run included) with the estimate and the limit, not a run that sits at its first step."""

from __future__ import annotations

import inspect

import pytest

from bench.config import rules
from bench.config.loading import load_spec
from bench.errors import SpecError


@pytest.mark.parametrize("key", sorted(rules.SIZE_LIMITS))
def test_every_size_has_an_upper_bound(key: str) -> None:
    # The three sizes of a step's rollouts meet the per-step token limit first: its estimate and limit.
    bound = (r"one training step would generate up to [0-9,]+ tokens .* over the limit of 134,217,728"
             if key in ("train.group_size", "train.prompts_per_step", "generation.max_new_tokens")
             else rf"'{key}' must be <= [0-9,]+, got 1000000000 \(as set, one training step")
    with pytest.raises(SpecError, match=bound):
        load_spec("cpu-quick", [f"{key}=1000000000"])


def test_the_group_size_of_the_probe_is_refused_with_the_estimate() -> None:
    with pytest.raises(SpecError, match=r"'train.group_size' must be <= 1,024, got 1000000 \(as set, one training "
                                        r"step generates up to [0-9,]+ tokens\)"):
        load_spec("cpu-quick", ["train.group_size=1000000"])


def test_a_step_that_generates_too_many_tokens_is_refused_with_the_estimate_and_the_limit() -> None:
    with pytest.raises(SpecError, match=r"one training step would generate up to 4,294,967,296 tokens .* over the "
                                        r"limit of 134,217,728"):
        load_spec("cpu-quick", ["train.prompts_per_step=65536", "train.group_size=512", "generation.max_new_tokens=128",
                                "task.train_size=100000"])


def test_every_shipped_preset_is_within_the_bounds() -> None:
    from bench.config.loading import preset_names

    for name in preset_names():
        load_spec(name, [])


@pytest.mark.parametrize("function", [rules.validate, "build_parser"])
def test_the_long_functions_are_split(function: object) -> None:
    if function == "build_parser":
        from bench import cli

        function = cli.build_parser
    assert len(inspect.getsource(function).splitlines()) <= 70  # type: ignore[arg-type]


def test_an_evaluation_that_generates_too_many_tokens_is_refused_with_the_estimate_and_the_limit() -> None:
    """eval.max_new_tokens is a token budget like the rollouts': a run once sat in its first evaluation with no ETA
    at eval.max_new_tokens=100000000; within each key's bound the product with the test split still has a limit."""
    with pytest.raises(SpecError, match=r"one evaluation would generate up to 5,000,000,000 tokens \(task.test_size "
                                        r"50,000 x eval.max_new_tokens 100,000\), over the limit of 2,147,483,648"):
        load_spec("cpu-quick", ["task.test_size=50000", "eval.max_new_tokens=100000"])
    load_spec("cpu-quick", ["task.test_size=50000", "eval.max_new_tokens=100000", "eval.enabled=false"])
