"""seed_scope: what a seed varies. method: only the method stage, the shared stages run once
with the first seed; pipeline: every seed re-runs the warm start, sample pool and reward model, and the tiny model
is initialised with that seed, so the spread over seeds is the whole pipeline's."""

from __future__ import annotations

from spec_errors import spec_error

from bench.config.loading import load_spec
from bench.execution.plan import describe_plan, make_plan
from bench.execution.runner import run_inputs
from bench.execution.sweep import job_spec


def test_method_scope_is_the_default_and_shares_the_stages() -> None:
    spec = load_spec("cpu-tiny")
    assert spec.seed_scope == "method"
    runs = make_plan(spec)
    stages = [r.run_id for r in runs if r.kind == "stage"]
    assert stages == ["warm_start", "sample_pool", "reward_model"]
    assert {r.seed for r in runs if r.kind == "stage"} == {0}
    assert all(need in stages for r in runs if r.kind == "method" for need in r.needs)
    assert job_spec(spec, runs[-1])["seeds"] == [0, 1, 2]
    assert "the warm start, sample pool and reward model run once with seed 0 and are shared" in \
        describe_plan(spec, runs)


def test_pipeline_scope_runs_the_stages_once_per_seed(tmp_path) -> None:
    spec = load_spec("cpu-tiny", ["seed_scope=pipeline"])
    runs = make_plan(spec)
    stages = [r for r in runs if r.kind == "stage"]
    assert [r.run_id for r in stages] == [f"{s}@s{seed}" for seed in (0, 1, 2)
                                          for s in ("warm_start", "sample_pool", "reward_model")]
    assert all(r.seed == int(r.run_id.rsplit("@s", 1)[1]) for r in stages)
    by_id = {r.run_id: r for r in runs}
    assert by_id["reward_model@s1"].needs == ("warm_start@s1", "sample_pool@s1")
    ppo = by_id["ppo-s2"]
    assert ppo.needs == ("warm_start@s2", "sample_pool@s2", "reward_model@s2")
    # The runner finds each stage's folder by the name before '@', as for a sweep's stages.
    inputs = run_inputs(tmp_path, ppo)
    assert inputs["init_model_dir"] == str(tmp_path / "runs" / "warm_start@s2" / "model")
    assert inputs["reward_model_dir"] == str(tmp_path / "runs" / "reward_model@s2" / "model")
    # Each run's spec names its own seed first: the tiny model's initialisation (bench.model.loading) reads it.
    assert job_spec(spec, by_id["warm_start@s1"])["seeds"] == [1, 0, 2]
    assert job_spec(spec, ppo)["seeds"] == [2, 0, 1]
    assert "re-runs the shared stages" in describe_plan(spec, runs)


def test_pipeline_scope_with_a_sweep_is_refused() -> None:
    error = spec_error(["seed_scope=pipeline", "sweep.axes={train.group_size: [4, 8]}"])
    assert error.startswith("'seed_scope' is 'pipeline' but the spec has a sweep"), error
    assert "one of 'method', 'pipeline'" in spec_error(["seed_scope=everything"])


def test_a_gold_pool_is_labelled_gold_in_the_plan() -> None:
    # Under sample_pool.pairs: gold the pool's pairs are the gold solution against a sample.
    runs = make_plan(load_spec("cpu-tiny", ["sample_pool.pairs=gold"]))
    assert next(r.label for r in runs if r.name == "sample_pool") == "Sample pool (gold-labelled)"
    assert next(r.label for r in make_plan(load_spec("cpu-tiny")) if r.name == "sample_pool") == \
        "Sample pool (verifier-labelled)"


def test_a_warm_start_that_is_off_is_labelled_the_start_model_in_the_plan() -> None:
    # An instruct model's presets turn the warm start off: the stage trains nothing, so it must not read "SFT".
    off = make_plan(load_spec("cpu-tiny", ["warm_start.enabled=false"]))
    on = make_plan(load_spec("cpu-tiny"))
    assert next(r.label for r in off if r.name == "warm_start") == "Start model (no warm start: the loaded weights, evaluated)"
    assert next(r.label for r in on if r.name == "warm_start") == "Warm start (SFT, TRL)"

