"""TRL seams (bench.telemetry.trl_hooks): every declared seam attaches to the installed TRL and feeds its phase.

Each trainer the suite uses is built tiny on the CPU, instrumented and trained one step. A TRL upgrade that
removes or bypasses a seam fails here instead of reading as zero seconds in a report. The missing-seam tests
check the other half: a seam that did not attach, or attached but was never called, is recorded as missing
and the report shows its phase as "not instrumented".
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from pathlib import Path
from typing import Any, Callable

import pytest

from bench.report import build_report
from bench.results import empty_result, write_json_atomic
from bench.telemetry import Telemetry, instrument_trl_trainer
from bench.telemetry.trl_hooks import SEAMS, seam_record, seams_for

WORDS = "what is one two three four five plus minus times answer the".split()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny random Qwen2 and a word-level tokenizer (TRL reloads the reference from this path)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {tok: i for i, tok in enumerate(["<pad>", "<unk>", "<eos>", *WORDS, *map(str, range(10))])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         pad_token_id=0, eos_token_id=2, bos_token_id=None, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    path = tmp_path_factory.mktemp("seams") / "tiny-qwen2"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _tokenizer(path: Path) -> Any:
    """The saved word-level tokenizer as it was built (AutoTokenizer would rebuild it as a Qwen2 BPE tokenizer
    that drops every word, leaving empty prompts)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(path)


def _common_args(out: Path) -> dict[str, Any]:
    return {"output_dir": str(out), "bf16": False, "use_cpu": True, "report_to": [], "max_steps": 1,
            "logging_steps": 1, "save_strategy": "no", "seed": 0}


def _pairs() -> dict[str, list[str]]:
    return {"prompt": ["what is one plus two", "what is three plus four"], "chosen": [" 3 <eos>", " 7 <eos>"],
            "rejected": [" 4 <eos>", " 5 <eos>"]}


def _lora() -> Any:
    from peft import LoraConfig

    return LoraConfig(r=2, lora_alpha=4, target_modules="all-linear", task_type="CAUSAL_LM")


def build_grpo(path: Path, out: Path, **extra: Any) -> Any:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    def length_reward(completions: list[str], **kwargs: object) -> list[float]:
        return [float(len(c)) / 10.0 for c in completions]

    args = GRPOConfig(**_common_args(out), loss_type="grpo", beta=0.04, num_generations=4,
                      per_device_train_batch_size=4, max_completion_length=6)
    return GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), reward_funcs=[length_reward], args=args,
                       train_dataset=Dataset.from_dict({"prompt": ["what is one plus two"] * 4}),
                       processing_class=_tokenizer(path), **extra)


def build_dpo(path: Path, out: Path, precompute: bool = False, **extra: Any) -> Any:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(**_common_args(out), per_device_train_batch_size=2, max_length=32,
                     precompute_ref_log_probs=precompute)
    return DPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), args=args,
                      train_dataset=Dataset.from_dict(_pairs()), processing_class=_tokenizer(path), **extra)


def build_sft(path: Path, out: Path) -> Any:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(**_common_args(out), per_device_train_batch_size=2, max_length=32, packing=False)
    rows = {"prompt": ["what is one plus two", "what is three plus four"], "completion": [" 3", " 7"]}
    return SFTTrainer(model=AutoModelForCausalLM.from_pretrained(path), args=args,
                      train_dataset=Dataset.from_dict(rows), processing_class=_tokenizer(path))


def build_reward(path: Path, out: Path) -> Any:
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    config = AutoConfig.from_pretrained(path)
    config.num_labels = 1
    model = AutoModelForSequenceClassification.from_pretrained(path, config=config)
    args = RewardConfig(**_common_args(out), per_device_train_batch_size=2, max_length=32,
                        gradient_checkpointing=False)
    return RewardTrainer(model=model, args=args, train_dataset=Dataset.from_dict(_pairs()),
                         processing_class=_tokenizer(path))


BUILDERS: dict[str, tuple[Callable[..., Any], set[str]]] = {
    # trainer class -> (builder, the seams this configuration must use). Spelled out, so a condition in the
    # table that silently stops applying (a renamed config field) fails too.
    "GRPOTrainer": (build_grpo, {"step_timer", "optimizer_step", "training_step", "compute_loss", "generate",
                                 "reward_functions", "ref_model_hooks"}),
    "DPOTrainer": (build_dpo, {"step_timer", "optimizer_step", "training_step", "compute_loss", "ref_model_hooks"}),
    "SFTTrainer": (build_sft, {"step_timer", "optimizer_step", "training_step", "compute_loss"}),
    "RewardTrainer": (build_reward, {"step_timer", "optimizer_step", "training_step", "compute_loss"}),
}


def test_every_trainer_the_suite_uses_has_a_seam_table() -> None:
    assert set(BUILDERS) == set(SEAMS)


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_declared_seams_attach_and_feed_their_phases(kind: str, tiny_dir: Path, tmp_path: Path) -> None:
    build, expected = BUILDERS[kind]
    trainer = build(tiny_dir, tmp_path / "out")
    assert {s.name for s in seams_for(trainer)} == expected

    with Telemetry("cpu", interval_s=0.05, warmup_steps=0) as tel:
        record = instrument_trl_trainer(trainer, tel)
        assert record["trainer"] == kind and record["missing"] == [], record["missing"]
        assert set(record["attached"]) == expected and tel.seams == record
        trainer.train()
    summary = tel.summary()

    checked = seam_record(tel)
    assert checked is not None and checked["missing"] == [], checked["missing"]
    assert summary["steps"] == 1
    for seam in seams_for(trainer):
        if seam.phase is not None:
            entry = summary["phases"].get(seam.phase)
            assert entry and entry["count"] > 0 and entry["time_s"] > 0, (seam.name, summary["phases"])
        for counter in seam.counters:
            value = summary["steps"] if counter == "steps" else summary["counters"].get(counter, 0)
            assert value > 0, (seam.name, counter, summary["counters"])


@pytest.mark.parametrize("kind", ["GRPOTrainer", "DPOTrainer"])
def test_lora_reference_is_timed_through_the_adapter_switch(kind: str, tiny_dir: Path, tmp_path: Path) -> None:
    """Under LoRA TRL keeps no reference copy: the reference is the policy with its adapter off."""
    trainer = BUILDERS[kind][0](tiny_dir, tmp_path / "out", peft_config=_lora())
    assert trainer.ref_model is None
    with Telemetry("cpu", interval_s=0.05, warmup_steps=0) as tel:
        record = instrument_trl_trainer(trainer, tel)
        assert "ref_adapter_switch" in record["attached"] and "ref_model_hooks" not in record["attached"]
        trainer.train()
    assert seam_record(tel)["missing"] == []
    reference = tel.summary()["phases"]["reference"]
    assert reference["count"] > 0 and reference["time_s"] > 0


def test_precomputed_dpo_reference_is_recorded_missing(tiny_dir: Path, tmp_path: Path) -> None:
    """precompute_ref_log_probs runs the reference inside DPOTrainer.__init__: not measurable, so missing."""
    trainer = build_dpo(tiny_dir, tmp_path / "out", precompute=True)
    with Telemetry("cpu", warmup_steps=0) as tel:
        record = instrument_trl_trainer(trainer, tel)
    assert [(m["seam"], m["phase"]) for m in record["missing"]] == [("ref_logps_precomputed", "reference")]
    assert "ref_model_hooks" not in record["attached"]


def test_seam_that_cannot_attach_is_recorded_missing(tiny_dir: Path, tmp_path: Path) -> None:
    """A DPO trainer whose reference model is gone (as if TRL moved it) records the reference seam missing."""
    trainer = build_dpo(tiny_dir, tmp_path / "out")
    trainer.ref_model = None
    with Telemetry("cpu", warmup_steps=0) as tel:
        record = instrument_trl_trainer(trainer, tel)
    assert [m["seam"] for m in record["missing"]] == ["ref_model_hooks"]
    assert record["missing"][0]["phase"] == "reference" and record["missing"][0]["reason"]
    assert "ref_model_hooks" not in record["attached"] and "training_step" in record["attached"]
    assert seam_record(tel)["missing"] == record["missing"]  # no step ran: nothing more to judge


def test_seam_attached_but_never_called_is_missing_after_training(tiny_dir: Path, tmp_path: Path) -> None:
    """A seam TRL stopped calling (simulated: the wrapper is taken off again) is missing once a step completed."""
    trainer = build_sft(tiny_dir, tmp_path / "out")
    with Telemetry("cpu", interval_s=0.05, warmup_steps=0) as tel:
        assert instrument_trl_trainer(trainer, tel)["missing"] == []
        trainer.compute_loss = trainer.compute_loss.__wrapped__  # TRL "no longer calls" the wrapped method
        trainer.train()
    record = seam_record(tel)
    assert record is not None
    assert [(m["seam"], m["phase"], m["counters"]) for m in record["missing"]] == [
        ("compute_loss", None, ["trained_tokens"])]
    assert "never called" in record["missing"][0]["reason"]
    assert "compute_loss" not in record["attached"] and "training_step" in record["attached"]
    assert "trained_tokens" not in tel.summary()["counters"]


def test_suite_engine_run_has_no_seam_record() -> None:
    assert seam_record(Telemetry("cpu")) is None


def _result(run_id: str, method: str, label: str, engine: str, phases: dict[str, float],
            seams: dict[str, Any] | None) -> dict[str, Any]:
    res = empty_result(run_id, "method", method, label, engine, 0)
    res["status"] = "ok"
    res["phases"] = {p: {"time_s": t, "count": 2} for p, t in phases.items()}
    if seams is not None:
        res["seams"] = seams
    return res


def test_report_shows_a_missing_seam_as_not_instrumented(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    write_json_atomic(suite / "suite.json", {"preset": "cpu-tiny", "description": "seams", "runs": ["grpo-s0",
                                                                                                    "ppo-s0"]})
    missing = [{"seam": "ref_model_hooks", "phase": "reference", "counters": [], "reason": "trainer.ref_model is None"}]
    write_json_atomic(suite / "runs" / "grpo-s0" / "result.json", _result(
        "grpo-s0", "grpo", "GRPO (TRL)", "trl", {"generation": 3.0, "reward": 0.5, "reference": 0.0, "update": 2.0},
        {"trainer": "GRPOTrainer", "attached": ["generate", "reward_functions"], "missing": missing}))
    write_json_atomic(suite / "runs" / "ppo-s0" / "result.json", _result(
        "ppo-s0", "ppo", "PPO (suite engine)", "suite", {"generation": 4.0, "reference": 1.25, "update": 3.0}, None))
    build_report(suite)

    summary = (suite / "summary.md").read_text(encoding="utf-8")
    table = summary.split("## Time per phase", 1)[1].split("\n## ", 1)[0]
    header = next(line for line in table.splitlines() if line.startswith("| run"))
    grpo = next(line for line in table.splitlines() if line.startswith("| GRPO (TRL)"))
    ppo = next(line for line in table.splitlines() if line.startswith("| PPO (suite engine)"))
    column = [c.strip() for c in header.split("|")].index("reference")
    assert [c.strip() for c in grpo.split("|")][column] == "not instrumented"
    assert [c.strip() for c in ppo.split("|")][column] == "1.25 s"  # suite engine: measured directly
    assert "0.00 s" not in grpo
    assert "phase 'reference' not instrumented" in table and "ref_model_hooks" in table

    html = (suite / "index.html").read_text(encoding="utf-8")
    assert "<td>not instrumented</td>" in html
    assert "Not instrumented, so left out (not zero): GRPO (TRL): reference." in html  # the figure's caption


def test_time_figure_leaves_out_uninstrumented_phases() -> None:
    from bench.report.load import Run
    from bench.report.phases import measured_times

    seams = {"attached": [], "missing": [{"seam": "generate", "phase": "generation"}]}
    run = Run("grpo-s0", _result("grpo-s0", "grpo", "GRPO (TRL)", "trl", {"generation": 0.7, "update": 2.0}, seams))
    assert measured_times(run) == {"update": 2.0}
    suite_run = Run("ppo-s0", _result("ppo-s0", "ppo", "PPO", "suite", {"generation": 0.7, "critic": 0.0}, None))
    assert measured_times(suite_run) == {"generation": 0.7}  # an unused phase at 0 s is simply not drawn


# ------------------------------------------------------------------------------------ training-dynamics monitors
def test_with_monitors_logs_hand_worked_values_and_keeps_the_reward() -> None:
    from bench.telemetry.trl_monitors import MONITOR_PREFIX, with_monitors

    def accuracy(prompts: list[str], completions: list[str], answer: list[str], **kwargs: object) -> list[float]:
        return [0.5] * len(completions)

    logged: dict[str, float] = {}
    monitored = with_monitors(accuracy)
    assert monitored.__name__ == "accuracy" and with_monitors(monitored) is monitored
    right, loop = "<think>3 + 4 = 7</think> <answer>7</answer>", "the sum is big the sum is big the sum is big"
    rewards = monitored(prompts=["p", "p"], completions=[right, loop], completion_ids=[[1, 2, 3], [1] * 5],
                        answer=["7", "7"], log_metric=lambda name, value: logged.__setitem__(name, value))
    assert rewards == [0.5, 0.5]
    # p90 of lengths [3, 5]: 3 + 0.9 x 2 = 4.8; LOOP has no answer and repeats; RIGHT is right, its 7 in the think
    assert logged == pytest.approx({MONITOR_PREFIX + k: v for k, v in {
        "completion_length_p90": 4.8, "empty_answer_rate": 0.5, "format_only_rate": 0.0, "repetition_rate": 0.5,
        "repeated_ngram_rate": 0.5, "answer_in_think_rate": 0.5, "reflection_rate": 0.0,
        "reflection_count": 0.0}.items()})
    assert monitored.bench_monitors.calls == 1 and monitored.bench_monitors.logged == 1

    monitored(prompts=["p"], completions=[right], answer=["7"])  # no log_metric: TRL dropped the kwarg
    from bench.telemetry.trl_monitors import monitor_problems

    assert monitor_problems([monitored], []) == ["monitors: TRL passed no log_metric (or no completions) in 1 of 2 "
                                                 "reward call(s)"]
    assert monitor_problems([accuracy], []) == ["monitors: no reward function was wrapped with with_monitors"]
    with pytest.raises(TypeError):
        async def scored(**kwargs: object) -> list[float]:
            return []
        with_monitors(scored)


def test_tiny_grpo_logs_every_monitor_under_canonical_names(tiny_dir: Path, tmp_path: Path) -> None:
    """A two-step TRL GRPO whose accuracy reward is monitored logs every monitor each step, beside TRL's keys."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from baselines.common import curves_from_log_history
    from bench.telemetry.monitors import MONITOR_NAMES
    from bench.task.rewards import make_reward_functions
    from bench.telemetry.trl_monitors import MONITOR_PREFIX, monitor_curve_names, monitor_problems, with_monitors

    funcs, weights = make_reward_functions(1.0, 0.5, 4, 0.01, lambda text: len(text.split()))
    funcs[0] = with_monitors(funcs[0])
    args = GRPOConfig(**{**_common_args(tmp_path / "out"), "max_steps": 2}, loss_type="grpo", beta=0.04,
                      num_generations=4, per_device_train_batch_size=4, max_completion_length=6,
                      reward_weights=weights)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_dir), reward_funcs=funcs, args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["what is one plus two"] * 8,
                                                           "answer": ["3"] * 8}),
                          processing_class=_tokenizer(tiny_dir))
    with Telemetry("cpu", interval_s=0.05, warmup_steps=0) as tel:
        assert instrument_trl_trainer(trainer, tel)["missing"] == []  # telemetry wraps the monitored function
        trainer.train()
    assert seam_record(tel)["missing"] == []
    history = trainer.state.log_history
    assert monitor_problems(trainer.reward_funcs, history) == []
    points = [e for e in history if "train_runtime" not in e]
    assert len(points) == 2
    key_of = {name: key for key, name in monitor_curve_names().items()}  # TRL logs two of them itself
    for entry in points:
        for name in MONITOR_NAMES:
            key = key_of[name]
            assert key in entry, (name, sorted(entry))
            assert entry[key] >= 0.0
        assert entry[MONITOR_PREFIX + "empty_answer_rate"] <= 1.0
        assert "rewards/accuracy/mean" in entry  # TRL's own names for the wrapped function are unchanged
    curves = curves_from_log_history(history, monitor_curve_names())
    assert [p["step"] for p in curves] == [1, 2]
    assert all(set(MONITOR_NAMES) <= set(p) for p in curves)
