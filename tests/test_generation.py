"""One explicit generation configuration: a checkpoint's generation_config.json must not change decoding.

The fixture saves the same random tiny Qwen2 twice, once with a plain generation config and once with the kind
of sampling defaults hub instruct models ship (repetition_penalty, top_k, do_sample, temperature) plus fields
whose "off" value is None in transformers (suppress_tokens) or that only a length rule covers (min_new_tokens).
Control assertions show each leak really changes a naive ``model.generate`` call, so the equality tests cannot
pass vacuously.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.execution.context import RunContext
from bench.model.generation import (completion_length, decoding_settings, eos_token_ids, generate, generation_config,
                              greedy_settings, sampling_settings)
from bench.config.spec import SpecError
from bench.config.loading import load_spec

WORDS = [f"w{i}" for i in range(40)] + [str(d) for d in range(10)] + ["what", "is", "plus", "answer"]
PROMPTS = ["what is 3 plus 4", "w1 w2 w3", "answer is 7 w9 w12 w30", "5"]
MAX_NEW = 12
LEAKY = {"repetition_penalty": 1.3, "top_k": 3, "do_sample": True, "temperature": 0.7}


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(["<pad>", "<unk>", "<eos>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    tokenizer.padding_side = "left"
    return tokenizer


def _save(model: Any, tokenizer: Any, folder: Path, extra: dict[str, Any]) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    path = folder / "generation_config.json"
    config = json.loads(path.read_text())
    config.update(extra)
    path.write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{'plain', 'leaky'}: the same weights; 'leaky' ships hub-style sampling defaults and more."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    root = tmp_path_factory.mktemp("gen-models")
    tokenizer = _tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                         initializer_range=0.5, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    plain = _save(model, tokenizer, root / "plain", {})
    # The token plain greedy decoding emits first for the first prompt: suppressing it must change the output.
    enc = tokenizer(PROMPTS[:1], return_tensors="pt", add_special_tokens=False)
    first = int(model.generate(**enc, do_sample=False, max_new_tokens=1)[0, -1])
    leaky = _save(model, tokenizer, root / "leaky",
                  {**LEAKY, "suppress_tokens": [first], "min_new_tokens": MAX_NEW})
    return {"plain": plain, "leaky": leaky}


def _load(folder: Path) -> tuple[Any, Any]:
    from bench.model.loading import load_causal_lm, load_tokenizer

    spec = load_spec("cpu-tiny", [])
    return load_causal_lm(folder, spec.model, "cpu").eval(), load_tokenizer(folder)


def _encode(tokenizer: Any) -> Any:
    return tokenizer(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)


def _spec(overrides: list[str] | None = None) -> Any:
    return load_spec("cpu-tiny", [f"generation.max_new_tokens={MAX_NEW}", f"eval.max_new_tokens={MAX_NEW}",
                                  "generation.temperature=0.9", *(overrides or [])])


def test_leaky_generation_config_is_loaded(folders: dict[str, Path]) -> None:
    model, _ = _load(folders["leaky"])
    for key, value in LEAKY.items():
        assert getattr(model.generation_config, key) == value, key


def test_greedy_is_identical_with_and_without_the_model_generation_config(folders: dict[str, Path]) -> None:
    from bench.scoring.evaluation import evaluate

    outputs, raw, explicit_only, texts = {}, {}, {}, {}
    rows = [{"prompt": p, "answer": "7", "question": p} for p in PROMPTS]
    for name, folder in folders.items():
        model, tokenizer = _load(folder)
        enc = _encode(tokenizer)
        settings = sampling_settings(_spec(), tokenizer, eos_token_ids(model, tokenizer), greedy=True)
        with torch.inference_mode():
            outputs[name] = generate(model, enc["input_ids"], enc["attention_mask"], settings)
            # the old call: only a few kwargs, everything else from the checkpoint
            raw[name] = model.generate(**enc, do_sample=False, max_new_tokens=MAX_NEW,
                                       pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            # a complete explicit config without the swap: None-valued fields (suppress_tokens) still leak
            explicit_only[name] = model.generate(**enc, generation_config=generation_config(settings))
        result = evaluate(model, tokenizer, rows, MAX_NEW, 3, samples_in_report=len(rows), settings=settings)
        assert result["generation"] == settings
        assert evaluate(model, tokenizer, rows, MAX_NEW, 3)["generation"] == settings  # the worker's old call
        texts[name] = [s["completion"] for s in result["samples"]]
        assert model.generation_config.repetition_penalty == (1.3 if name == "leaky" else None)  # restored
    assert not torch.equal(raw["plain"], raw["leaky"]), "control: the fixture must change a naive greedy call"
    assert not torch.equal(explicit_only["plain"], explicit_only["leaky"]), "control: None-valued fields leak"
    assert torch.equal(outputs["plain"], outputs["leaky"])
    assert texts["plain"] == texts["leaky"]
    assert torch.equal(outputs["plain"], raw["plain"])  # on a clean checkpoint nothing changes


def test_sampling_is_identical_with_and_without_the_model_generation_config(folders: dict[str, Path]) -> None:
    from bench.execution.sample_pool import sample

    outputs, raw, texts = {}, {}, {}
    for name, folder in folders.items():
        model, tokenizer = _load(folder)
        enc = _encode(tokenizer)
        settings = sampling_settings(_spec(), tokenizer, eos_token_ids(model, tokenizer), greedy=False)
        with torch.inference_mode():
            torch.manual_seed(1)
            outputs[name] = generate(model, enc["input_ids"], enc["attention_mask"], settings)
            torch.manual_seed(1)
            raw[name] = model.generate(**enc, do_sample=True, temperature=0.9, max_new_tokens=MAX_NEW,
                                       pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        torch.manual_seed(2)
        texts[name] = sample(model, tokenizer, PROMPTS, 3, settings)
    assert not torch.equal(raw["plain"], raw["leaky"]), "control: the fixture must change a naive sampling call"
    assert torch.equal(outputs["plain"], outputs["leaky"])
    assert texts["plain"] == texts["leaky"]
    completions, tokens = texts["plain"]
    assert [len(group) for group in completions] == [3] * len(PROMPTS) and tokens >= 3 * len(PROMPTS)


def test_sample_pool_records_its_generation_settings(folders: dict[str, Path], tmp_path: Path) -> None:
    from bench.execution import sample_pool
    from bench.model.loading import load_tokenizer
    from bench.telemetry import Telemetry

    spec = _spec(["sample_pool.prompts=2", "sample_pool.samples_per_prompt=2", "sample_pool.batch_size=2",
                  "generation.top_k=5", "generation.repetition_penalty=1.1"])
    rows = [{"prompt": p, "answer": "7", "question": p} for p in PROMPTS[:2]]
    with Telemetry("cpu", interval_s=0.05, warmup_steps=0) as tel:
        ctx = RunContext(spec=spec, method="sample_pool", method_spec=None, seed=0, run_dir=tmp_path, device="cpu",
                         init_model_dir=folders["leaky"], train_rows=rows, telemetry=tel,
                         progress=lambda *a: None, tokenizer=load_tokenizer(folders["leaky"]))
        outcome = sample_pool.train(ctx)
    recorded = outcome.settings["generation"]
    assert recorded == sampling_settings(spec, outcome.tokenizer, eos_token_ids(outcome.policy, outcome.tokenizer),
                                         greedy=False)
    assert recorded["top_k"] == 5 and recorded["repetition_penalty"] == pytest.approx(1.1)
    assert recorded["min_new_tokens"] == 0 and recorded["do_sample"] is True
    json.dumps(outcome.settings)  # plain and JSON-able
    assert outcome.completions == 4 and 4 <= outcome.generated_tokens <= 4 * MAX_NEW


def test_sampling_settings_record_every_field() -> None:
    tokenizer = _tokenizer()
    spec = _spec(["generation.top_k=7", "generation.repetition_penalty=1.2", "generation.min_new_tokens=4",
                  "generation.top_p=0.8", "eval.max_new_tokens=9"])
    sampled = sampling_settings(spec, tokenizer, [2, 5], greedy=False)
    assert sampled["do_sample"] is True
    assert sampled["temperature"] == pytest.approx(0.9) and sampled["top_p"] == pytest.approx(0.8)
    assert sampled["top_k"] == 7 and sampled["repetition_penalty"] == pytest.approx(1.2)
    assert sampled["min_new_tokens"] == 4 and sampled["max_new_tokens"] == MAX_NEW
    assert sampled["pad_token_id"] == tokenizer.pad_token_id and sampled["eos_token_id"] == [2, 5]
    assert sampled["num_beams"] == 1 and sampled["no_repeat_ngram_size"] == 0
    assert json.loads(json.dumps(sampled)) == sampled

    greedy = sampling_settings(spec, tokenizer, greedy=True)
    assert greedy["do_sample"] is False and greedy["max_new_tokens"] == 9
    assert (greedy["temperature"], greedy["top_p"], greedy["top_k"]) == (1.0, 1.0, 0)
    assert greedy["repetition_penalty"] == 1.0 and greedy["min_new_tokens"] == 0
    assert greedy["eos_token_id"] == [tokenizer.eos_token_id]
    assert set(greedy) == set(sampled)
    assert sampling_settings(spec, tokenizer, greedy=False, max_new_tokens=3)["min_new_tokens"] == 3  # clamped


def test_generation_config_is_built_from_the_settings_alone() -> None:
    tokenizer = _tokenizer()
    spec = _spec(["generation.top_k=0", "generation.min_new_tokens=2"])
    sampled = generation_config(sampling_settings(spec, tokenizer, [2], greedy=False))
    assert sampled.top_k == 0  # explicit: unset would mean transformers' default of 50
    assert sampled.min_new_tokens == 2 and sampled.eos_token_id == [2] and sampled.do_sample is True
    sampled.validate(strict=True)  # no warnings either
    greedy = generation_config(greedy_settings(tokenizer, [2], 5))
    assert greedy.do_sample is False and greedy.max_new_tokens == 5 and greedy.repetition_penalty == 1.0
    assert greedy.top_k is None and greedy.temperature is None  # sampling-only fields stay out of greedy
    greedy.validate(strict=True)


def test_completion_length_edge_cases() -> None:
    assert completion_length([5, 6, 7], [2]) == 3  # no EOS: the whole row
    assert completion_length([], [2]) == 0
    assert completion_length([2, 5, 2], [2]) == 1  # EOS first
    assert completion_length([5, 9, 2, 0, 0], [2, 9]) == 2  # the first of several EOS ids
    assert completion_length([5, 6, 2, 9], [9, 2]) == 3
    assert completion_length([5, 2, 2], 2) == 2  # a single id works too
    assert completion_length([5, 2], None) == 2


def test_eos_token_ids_merge_tokenizer_and_model() -> None:
    class Model:
        class generation_config:  # noqa: N801 - stands in for the attribute
            eos_token_id: Any = [7, 2]

    tokenizer = _tokenizer()
    assert tokenizer.eos_token_id == 2
    assert eos_token_ids(Model(), tokenizer) == [7, 2]  # already declared: kept once, in the model's order
    Model.generation_config.eos_token_id = 9
    assert eos_token_ids(Model(), tokenizer) == [2, 9]  # the tokenizer's EOS first
    Model.generation_config.eos_token_id = None
    assert eos_token_ids(Model(), tokenizer) == [2]


def test_spec_validates_the_new_generation_fields() -> None:
    for bad in ("generation.top_k=-1", "generation.repetition_penalty=0", "generation.min_new_tokens=-1",
                f"generation.min_new_tokens={MAX_NEW + 1}"):
        with pytest.raises(SpecError):
            _spec([bad])
    assert _spec([f"generation.min_new_tokens={MAX_NEW}"]).generation.min_new_tokens == MAX_NEW


def test_grpo_config_carries_the_sampling_settings(tmp_path: Path) -> None:
    from baselines.grpo import grpo_config

    spec = _spec(["generation.top_k=6", "generation.repetition_penalty=1.15", "generation.min_new_tokens=3"])
    ctx = RunContext(spec=spec, method="grpo", method_spec=spec.methods["grpo"], seed=0, run_dir=tmp_path,
                     device="cpu", init_model_dir=None, train_rows=[], telemetry=None, progress=lambda *a: None)
    config = grpo_config(ctx)
    assert config.top_k == 6 and config.repetition_penalty == pytest.approx(1.15)
    assert config.temperature == pytest.approx(0.9) and config.max_completion_length == MAX_NEW
    decoding = decoding_settings(spec.generation)
    assert config.generation_kwargs["min_new_tokens"] == 3
    for key, value in config.generation_kwargs.items():
        assert decoding[key] == value, key


def test_trl_generation_config_does_not_take_the_model_defaults(folders: dict[str, Path], tmp_path: Path) -> None:
    """GRPOTrainer builds its own GenerationConfig; transformers' merge must find nothing left to fill from the model.

    The merge is GenerationMixin._prepare_generation_config, the step model.generate runs first.
    """
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    from baselines.grpo import grpo_config

    spec = _spec(["generation.top_k=0", "train.group_size=2", "train.prompts_per_step=2", "train.steps=1"])
    ctx = RunContext(spec=spec, method="grpo", method_spec=spec.methods["grpo"], seed=0, run_dir=tmp_path,
                     device="cpu", init_model_dir=None, train_rows=[], telemetry=None, progress=lambda *a: None)
    _, tokenizer = _load(folders["leaky"])
    model = AutoModelForCausalLM.from_pretrained(folders["leaky"])  # from a path, so TRL can load the reference
    assert model.generation_config.top_k == 3
    trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                          args=grpo_config(ctx), train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                          processing_class=tokenizer)
    merged, _ = model._prepare_generation_config(trainer.generation_config)
    assert merged.top_k == 0 and merged.repetition_penalty == 1.0  # not the file's 3 and 1.3
    assert merged.temperature == pytest.approx(0.9) and merged.do_sample is True
    assert merged.min_new_tokens == 0  # not the file's MAX_NEW
