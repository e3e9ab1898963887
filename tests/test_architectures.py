"""Shipped real architectures: shape files, analytic parameter counts, scaled CPU variants, the spec keys and
the `model.source: architecture` folder (random weights + stand-in tokenizer, no download)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.config.architectures import (
    architecture_config,
    architecture_fields,
    architecture_names,
    build_random_model,
    parameter_count,
    scaled_fields,
)
from bench.errors import SpecError, UserError
from bench.config.spec import ScaleSpec
from bench.config.loading import load_spec

# Published totals (billions). Qwen2.5: the "Number of Parameters" line of each Qwen/Qwen2.5-*-Instruct model
# card and the Qwen2.5 technical report (arXiv:2412.15115, table 1); 0.5B also 0.36B non-embedding.
# Llama-3.1: the safetensors parameter totals shown on the meta-llama/Llama-3.1-{8B,70B}-Instruct hub pages.
PUBLISHED_BILLIONS = {
    "qwen2.5-0.5b": 0.49,
    "qwen2.5-1.5b": 1.54,
    "qwen2.5-3b": 3.09,
    "qwen2.5-7b": 7.61,
    "qwen2.5-14b": 14.7,
    "qwen2.5-32b": 32.5,
    "qwen2.5-72b": 72.7,
    "llama-3.1-8b": 8.03,
    "llama-3.1-70b": 70.6,
}
SHAPE_KEYS = {"model_type", "architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "vocab_size", "tie_word_embeddings",
              "max_position_embeddings", "rms_norm_eps", "rope_theta", "hidden_act", "source"}
SMALL_QWEN = ScaleSpec(num_layers=2, width_divisor=8)  # real vocabulary: 151,936 rows


def numel(model) -> int:
    """Distinct parameters (tied embedding and LM head counted once), as the model holds them."""
    return sum(p.numel() for p in model.parameters())


def test_every_shipped_file_loads_with_its_shape_fields():
    assert architecture_names() == sorted(PUBLISHED_BILLIONS)
    for name in architecture_names():
        fields = architecture_fields(name)
        assert SHAPE_KEYS <= set(fields), f"{name} lacks {SHAPE_KEYS - set(fields)}"
        assert "/" in fields["source"] and "Instruct" in fields["source"]
        config = architecture_config(name)
        assert config.model_type == fields["model_type"]
        assert config.num_hidden_layers == fields["num_hidden_layers"]
        assert config.vocab_size == fields["vocab_size"]
        assert config.tie_word_embeddings == fields["tie_word_embeddings"]


@pytest.mark.parametrize("name", sorted(PUBLISHED_BILLIONS))
def test_parameter_count_is_within_one_percent_of_the_published_count(name):
    published = PUBLISHED_BILLIONS[name] * 1e9
    assert abs(parameter_count(name) - published) / published < 0.01


def test_qwen_05b_counts_split_into_embedding_and_the_rest_as_published():
    fields = architecture_fields("qwen2.5-0.5b")
    non_embedding = parameter_count("qwen2.5-0.5b") - fields["vocab_size"] * fields["hidden_size"]
    assert abs(non_embedding - 0.36e9) / 0.36e9 < 0.01


def test_full_qwen_05b_on_the_meta_device_has_exactly_the_analytic_count():
    model = build_random_model(architecture_config("qwen2.5-0.5b"), "float32", seed=0, device="meta")
    assert numel(model) == parameter_count("qwen2.5-0.5b") == 494_032_768
    assert parameter_count(model.config) == parameter_count("qwen2.5-0.5b")


def test_scaled_qwen_05b_builds_on_cpu_with_the_analytic_count_and_real_vocab_logits():
    import torch

    config = architecture_config("qwen2.5-0.5b", SMALL_QWEN)
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (2, 112, 608)
    # 14 query / 2 KV heads of 64: the KV factor 2 goes to the head count, the remaining 4 to head_dim
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (7, 1, 16)
    model = build_random_model(config, "float32", seed=0)
    assert numel(model) == parameter_count(config)
    ids = torch.tensor([[1, 2, 3, 151_935]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, 4, 151_936)
    assert torch.isfinite(logits).all()


def test_scaled_llama_without_biases_matches_the_analytic_count():
    config = architecture_config("llama-3.1-8b", ScaleSpec(num_layers=1, width_divisor=64, vocab_size=2048))
    model = build_random_model(config, "float32", seed=0)
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())
    assert numel(model) == parameter_count(config)
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight  # untied


def test_the_same_seed_gives_the_same_weights_and_another_seed_does_not():
    import torch

    config = architecture_config("qwen2.5-0.5b", ScaleSpec(num_layers=1, width_divisor=64, vocab_size=2048))
    a, b, c = (build_random_model(config, "float32", seed=s).state_dict() for s in (3, 3, 4))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_scaling_keeps_the_gqa_ratio_and_rejects_divisors_that_do_not_fit():
    for name in architecture_names():
        full = architecture_fields(name)
        small = scaled_fields(name, ScaleSpec(width_divisor=8))
        assert (full["num_attention_heads"] // full["num_key_value_heads"]
                == small["num_attention_heads"] // small["num_key_value_heads"])
        assert small["hidden_size"] == small["num_attention_heads"] * small["head_dim"]
    with pytest.raises(SpecError, match=r"'model.scale.width_divisor' 3 does not fit .*valid divisors: 1, 2, 4"):
        scaled_fields("qwen2.5-0.5b", ScaleSpec(width_divisor=3))


def test_an_unknown_name_lists_the_known_ones_with_a_suggestion():
    with pytest.raises(UserError, match=r"unknown architecture 'qwen2.5-7B'.*did you mean 'qwen2.5-7b'.*llama-3.1-8b"):
        architecture_config("qwen2.5-7B")


def test_names_do_not_import_torch():
    code = "import sys, bench.config.architectures as a; a.architecture_names(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# ------------------------------------------------------------------------------------------------ spec keys

ARCH = ["model.source=architecture"]


@pytest.mark.parametrize("overrides, key, words", [
    (ARCH + ["model.architecture=qwen2.5-0.5"], "'model.architecture'", "did you mean 'qwen2.5-0.5b'"),
    (ARCH, "'model.architecture'", "is required"),
    (ARCH + ["model.architecture=qwen2.5-0.5b", "model.scale.width_divisor=3"], "'model.scale.width_divisor'",
     "valid divisors"),
    (ARCH + ["model.architecture=qwen2.5-0.5b", "model.scale.width_divisor=0"], "'model.scale.width_divisor'",
     ">= 1"),
    (ARCH + ["model.architecture=qwen2.5-0.5b", "model.scale.num_layers=25"], "'model.scale.num_layers'",
     "1..24"),
    (ARCH + ["model.architecture=qwen2.5-0.5b", "model.scale.vocab_size=100"], "'model.scale.vocab_size'",
     "stand-in tokenizer"),
    (["model.architecture=qwen2.5-0.5b"], "'model.architecture'", "model.source=architecture"),
])
def test_spec_errors_are_one_line_and_name_the_key(overrides, key, words):
    with pytest.raises(SpecError) as info:
        load_spec("cpu-tiny", overrides)
    message = str(info.value)
    assert "\n" not in message
    assert key in message and words in message


def test_a_valid_architecture_spec_loads():
    spec = load_spec("cpu-tiny", ARCH + ["model.architecture=llama-3.1-70b", "model.scale.num_layers=2",
                                         "model.scale.width_divisor=128"])
    assert spec.model.architecture == "llama-3.1-70b"
    assert spec.model.scale == ScaleSpec(num_layers=2, width_divisor=128, vocab_size=None)


# ---------------------------------------------------------------------------------- model.source=architecture


def test_initial_model_source_builds_a_loadable_folder_with_the_real_vocab(tmp_path, monkeypatch):
    from bench.task.data import tokenizer_corpus
    from bench.model.loading import initial_model_source, load_causal_lm, load_tokenizer

    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path))
    spec = load_spec("cpu-tiny", ARCH + ["model.architecture=qwen2.5-0.5b", "model.scale.num_layers=1",
                                         "model.scale.width_divisor=16"])
    corpus = tokenizer_corpus(spec)
    folder = initial_model_source(spec, corpus)
    assert Path(folder).parent.parent == tmp_path
    assert initial_model_source(spec, []) == folder  # an empty corpus means the task's own: the same cache entry
    model = load_causal_lm(folder, spec.model, "cpu")
    tokenizer = load_tokenizer(folder)
    config = model.config
    assert config.vocab_size == 151_936 and config.num_hidden_layers == 1
    assert model.get_input_embeddings().weight.shape == (151_936, 56)
    # padded with placeholders up to the real vocabulary (AutoTokenizer may add an unused unk token after it)
    assert tokenizer.convert_tokens_to_ids("<|v151935|>") == config.vocab_size - 1
    sampled = [5, 2000, 151_935]  # any id a random model samples decodes to one token and re-encodes to it
    assert tokenizer(tokenizer.decode(sampled[1:]), add_special_tokens=False)["input_ids"] == sampled[1:]
    ids = tokenizer(corpus[:50])["input_ids"]
    assert max(max(row) for row in ids) < config.vocab_size
    assert (config.pad_token_id, config.eos_token_id) == (tokenizer.pad_token_id, tokenizer.eos_token_id)
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert tokenizer.decode(tokenizer(corpus[0])["input_ids"]) == corpus[0]
    assert not list(tmp_path.glob("architectures/*.tmp*"))  # published atomically, nothing left behind


def test_gsm8k_tokenizer_corpus_is_the_training_split(tmp_path):
    from bench.task.data import tokenizer_corpus

    rows = {
        "train": [{"question": f"Tom has {n} apples. How many?", "answer": f"He has {n}.\n#### {n}"} for n in range(12)],
        "test": [{"question": "Secret test question?", "answer": "It is 7.\n#### 7"}],
    }
    for split, items in rows.items():
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    spec = load_spec("cpu-tiny", ARCH + ["model.architecture=qwen2.5-0.5b", "task.source=gsm8k",
                                         f"task.path={tmp_path}", "task.train_size=10", "task.test_size=1",
                                         "train.prompts_per_step=2"])
    corpus = tokenizer_corpus(spec)
    assert len(corpus) == 10
    assert all("Tom has" in text and "<answer>" in text for text in corpus)
    assert not any("Secret" in text for text in corpus)
