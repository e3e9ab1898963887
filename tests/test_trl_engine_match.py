"""TRL's colocated vLLM engine is built, and samples, like the suite's own.

No vLLM here: a recording stand-in takes the place of ``vllm.LLM`` (and of ``SamplingParams``) both where the
suite's engine imports it (a stand-in ``vllm`` module) and where TRL's ``trl.generation.vllm_generation`` calls it.
A real GRPOTrainer is built by baselines.grpo.build_trainer for a tiny random Qwen2, so every keyword TRL's engine
receives is the one TRL 1.16 passes after the suite's matching. What is checked:

- the keywords TRL's engine is started with equal the suite engine's for the same spec and seed, except the ones
  TRL keeps (bench.model.vllm_backend.TRL_KEPT); those GRPOConfig has fields for were already TRL's own ask;
- two run seeds give two different sampler seeds (TRL alone would seed every run with its process index, 0);
- TRL's ``SamplingParams`` equal the suite's for the same sampling settings (one request per completion in both);
- both engines record what they ran with, read back from the engine, and the records agree;
- with sleep mode (CUDA), TRL's sleep/wake cycle and the suite's sync work together: weights woken and loaded
  before every generation, and the suite's own generation after training wakes the whole engine first.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import torch

import baselines.grpo as grpo
from bench.config import rules
from bench.config.loading import load_spec
from bench.execution.context import RunContext
from bench.model import vllm_backend as vb

WORDS = "what is one two three four five plus minus times answer the".split()
LAUNCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What TRL's engine start sets in the environment (vLLM's external launcher reads them)."""
GRPO_CONFIG_FIELDS = ("gpu_memory_utilization", "enable_sleep_mode", "max_model_len", "tensor_parallel_size",
                      "model_impl")
"""LLM keywords TRL takes from GRPOConfig fields: trl_vllm_args / build_trainer set them, the wrap only confirms."""


class RecordingLLM:
    """A stand-in for ``vllm.LLM``: records its keywords and every call; its ``llm_engine.vllm_config`` is what it
    was given, with vLLM 0.32's CPU defaults where a keyword was None (4096 tokens and 256 sequences per step)."""

    hf_config: Any = None
    """The model's transformers config (set by the test: the engine's own would come from the model folder)."""

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.kwargs = {"model": model, **kwargs}
        self.calls: list[tuple[Any, ...]] = []

        def given(name: str, default: Any) -> Any:
            return default if kwargs.get(name) is None else kwargs[name]

        model_config = SimpleNamespace(
            seed=given("seed", 0), dtype=getattr(torch, given("dtype", "float32")),
            max_model_len=given("max_model_len", 128), enforce_eager=given("enforce_eager", False),
            enable_sleep_mode=given("enable_sleep_mode", False), logprobs_mode=given("logprobs_mode", "raw_logprobs"),
            generation_config=given("generation_config", "auto"), model_impl=given("model_impl", "auto"),
            hf_config=self.hf_config)
        cache = SimpleNamespace(gpu_memory_utilization=given("gpu_memory_utilization", 0.92),
                                kv_cache_memory_bytes=kwargs.get("kv_cache_memory_bytes"),
                                enable_prefix_caching=given("enable_prefix_caching", True), block_size=16,
                                num_gpu_blocks=8)
        scheduler = SimpleNamespace(max_num_batched_tokens=given("max_num_batched_tokens", 4096),
                                    max_num_seqs=given("max_num_seqs", 256))
        self.llm_engine = SimpleNamespace(vllm_config=SimpleNamespace(
            model_config=model_config, cache_config=cache, scheduler_config=scheduler,
            parallel_config=SimpleNamespace(tensor_parallel_size=given("tensor_parallel_size", 1),
                                            distributed_executor_backend=given("distributed_executor_backend", "uni")),
            load_config=SimpleNamespace(load_format=given("load_format", "auto"))))

    def collective_rpc(self, method: str, kwargs: dict[str, Any]) -> None:
        self.calls.append((method, len(list(kwargs["weights_iterator"]))))

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))

    def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tags))

    def generate(self, prompts: list[Any], sampling_params: Any, use_tqdm: bool = False) -> list[Any]:
        self.calls.append(("generate", len(prompts), sampling_params.kwargs))
        logprob = SimpleNamespace(logprob=-1.0, rank=1)
        sample = SimpleNamespace(token_ids=[3, 2], logprobs=[{3: logprob}, {2: logprob}])
        return [SimpleNamespace(prompt_token_ids=list(p["prompt_token_ids"]), outputs=[sample]) for p in prompts]


class RecordingSamplingParams:
    """A stand-in for ``vllm.SamplingParams``: keeps its keywords."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


@pytest.fixture
def stand_in_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The stand-ins in place of vLLM for the suite's engine and for TRL's, and an environment left as found."""
    import trl.generation.vllm_generation as trl_vllm

    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams, module.__version__ = RecordingLLM, RecordingSamplingParams, "stand-in"
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = SimpleNamespace(is_sleep_mode_available=lambda: True)  # a CUDA build's answer
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    for name, value in (("vllm", module), ("vllm.platforms", platforms), ("vllm.inputs", inputs)):
        monkeypatch.setitem(sys.modules, name, value)
    monkeypatch.setattr(trl_vllm, "LLM", RecordingLLM, raising=False)
    monkeypatch.setattr(trl_vllm, "SamplingParams", RecordingSamplingParams, raising=False)
    monkeypatch.setattr(trl_vllm, "is_vllm_available", lambda *a, **k: True)
    monkeypatch.setattr(rules, "vllm_installed", lambda: True)
    for name in (*LAUNCH_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS",
                 "VLLM_CPU_KVCACHE_SPACE"):
        monkeypatch.setenv(name, "")  # recorded, so the test leaves the environment as it found it
        monkeypatch.delenv(name)
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # no process group left behind for later tests
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny random Qwen2 (head size 32, one vLLM's CPU build has) and a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {tok: i for i, tok in enumerate(["<pad>", "<unk>", "<eos>", *WORDS, *map(str, range(10))])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(vocab), hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=96,
                         pad_token_id=0, eos_token_id=2, bos_token_id=None, tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("trl-engine") / "tiny-qwen2"
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _spec() -> Any:
    return load_spec("cpu-quick", ["generation.backend=vllm", "generation.vllm_cpu_kv_cache_gib=0.25",
                                   "generation.min_new_tokens=2", "train.kl_beta=0"])  # no reference to load


def _ctx(spec: Any, seed: int, run_dir: Path) -> RunContext:
    return RunContext(spec=spec, method="grpo", method_spec=spec.methods["grpo"], seed=seed, run_dir=run_dir,
                      device="cpu", init_model_dir=None, train_rows=[], telemetry=None, progress=lambda *a: None)


def _trl_engine(tiny_dir: Path, seed: int, run_dir: Path) -> tuple[Any, Any, Any]:
    """(the trainer, its engine stand-in, the policy) of baselines.grpo.build_trainer for run seed ``seed``."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    import os

    for name in LAUNCH_ENV:  # set by the previous trainer's engine start: accelerate would take them for a launch
        os.environ.pop(name, None)
    spec = _spec()
    ctx = _ctx(spec, seed, run_dir)
    policy = AutoModelForCausalLM.from_pretrained(tiny_dir)
    RecordingLLM.hf_config = policy.config
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny_dir)

    def reward(completions: list[str], **kwargs: object) -> list[float]:
        return [0.0 for _ in completions]

    prompts = spec.train.prompts_per_step * spec.train.steps
    dataset = Dataset.from_dict({"prompt": ["what is one plus two"] * prompts, "answer": ["3"] * prompts})
    trainer = grpo.build_trainer(ctx, grpo.grpo_config(ctx), policy, tokenizer, [reward], dataset)
    return trainer, trainer.vllm_generation.llm, trainer.model


def _suite_engine(tiny_dir: Path, seed: int) -> tuple[Any, Any]:
    """(the suite's own engine for the same spec and seed, the model it holds)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    RecordingLLM.hf_config = model.config
    return vb.VllmGenerator(model, _settings(_spec(), tiny_dir, model)["vllm"], seed=seed), model


def _settings(spec: Any, tiny_dir: Path, model: Any) -> dict[str, Any]:
    from transformers import PreTrainedTokenizerFast

    from bench.model.generation import eos_token_ids, sampling_settings

    tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny_dir)
    return sampling_settings(spec, tokenizer, eos_token_ids(model, tokenizer), greedy=False)


def test_trls_engine_is_started_with_the_suite_engines_arguments(stand_in_vllm: None, tiny_dir: Path,
                                                                  tmp_path: Path) -> None:
    trainer, trl_llm, _ = _trl_engine(tiny_dir, 5, tmp_path)
    suite, _ = _suite_engine(tiny_dir, 5)
    suite_kwargs = {k: v for k, v in suite.llm.kwargs.items() if k != "model"}
    trl_kwargs = {k: v for k, v in trl_llm.kwargs.items() if k not in vb.TRL_KEPT}
    assert trl_kwargs == suite_kwargs
    assert set(trl_llm.kwargs) - set(suite_kwargs) <= set(vb.TRL_KEPT)
    assert trl_llm.kwargs["distributed_executor_backend"] == "external_launcher"  # kept: TRL's, said so
    # What GRPOConfig has a field for was already TRL's own ask: the wrap does not hide a config left unmatched.
    generator = vb.attached(trainer.model)
    asked = generator.trl_build.asked
    assert {k: asked[k] for k in GRPO_CONFIG_FIELDS} == {k: suite_kwargs[k] for k in GRPO_CONFIG_FIELDS}
    # What TRL would have chosen itself, and the record says was replaced
    record = generator.record()
    assert record["trl_asked"]["seed"] == 0 and record["trl_asked"]["max_num_batched_tokens"] == 4096
    assert "enable_prefix_caching" not in asked  # vLLM's default (on) where TRL passes nothing
    assert record["trl_kept"] == sorted(vb.TRL_KEPT)


def test_two_run_seeds_give_two_sampler_seeds(stand_in_vllm: None, tiny_dir: Path, tmp_path: Path) -> None:
    seeds = []
    for seed in (3, 4):
        _, trl_llm, _ = _trl_engine(tiny_dir, seed, tmp_path / str(seed))
        suite, _ = _suite_engine(tiny_dir, seed)
        assert trl_llm.kwargs["seed"] == suite.llm.kwargs["seed"] == seed
        seeds.append(trl_llm.llm_engine.vllm_config.model_config.seed)
    assert seeds == [3, 4]


def test_both_engines_record_what_they_ran_with_and_agree(stand_in_vllm: None, tiny_dir: Path,
                                                          tmp_path: Path) -> None:
    trainer, _, _ = _trl_engine(tiny_dir, 1, tmp_path)
    suite, _ = _suite_engine(tiny_dir, 1)
    trl_record, suite_record = vb.attached(trainer.model).record(), suite.record()
    kept = {"executor"}  # TRL's external_launcher (TRL_KEPT): every rank joins the launcher's process group
    assert {k: v for k, v in trl_record["engine"].items() if k not in kept} == {
        k: v for k, v in suite_record["engine"].items() if k not in kept}
    assert (trl_record["engine"]["executor"], suite_record["engine"]["executor"]) == ("external_launcher", "uni")
    engine = suite_record["engine"]
    assert (engine["seed"], engine["prefix_caching"], engine["load_format"], engine["enforce_eager"]) == (
        1, False, "dummy", True)
    assert (engine["max_num_batched_tokens"], engine["max_num_seqs"]) == (4096, 256)  # vLLM's defaults, both
    assert engine["kv_cache_memory_bytes"] == int(0.25 * 2**30) and engine["max_model_len"] == 96
    assert trl_record["sleep_mode"] == suite_record["sleep_mode"]  # a CPU: neither sleeps
    assert trl_record["differences"] == {}  # on a CPU nothing is left to differ
    assert vb.trl_differences(sleeps=True)["sleep_schedule"].startswith("TRL: level 2")


def test_trls_sampling_params_are_the_suites(stand_in_vllm: None, tiny_dir: Path, tmp_path: Path) -> None:
    trainer, trl_llm, policy = _trl_engine(tiny_dir, 0, tmp_path)
    prompts = [[5, 6, 7], [5, 6, 7]]  # one prompt, G = 2: TRL repeats it, one request per completion
    trainer.vllm_generation.sync_weights()  # what GRPOTrainer calls before its first generation (step 0)
    trainer.vllm_generation.generate(prompts, None, num_generations=2)
    trl_params = next(call for call in trl_llm.calls if call[0] == "generate")[2]
    suite, model = _suite_engine(tiny_dir, 0)
    suite.generate(prompts, _settings(_spec(), tiny_dir, model), n=1)
    suite_params = next(call for call in suite.llm.calls if call[0] == "generate")[2]
    assert trl_params == suite_params
    assert suite.record()["requests"] == vb.attached(trainer.model).record()["requests"] == "one per completion (n=1)"
    assert trl_params["n"] == 1 and trl_params["stop_token_ids"] == [2] and trl_params["min_tokens"] == 2
    assert [c[0] for c in trl_llm.calls][:2] == ["reload_weights", "reset_prefix_cache"]  # dummy start: loaded first


def test_trls_sleep_cycle_loads_the_weights_before_every_generation() -> None:
    """TRL (sleep mode, CUDA) sleeps level 2 after every generation and calls sync_weights before the next; the
    suite's replacement wakes the weights and loads them whatever the versions say (level 2 discarded them); the
    suite's own generation afterwards (evaluation) wakes the whole engine and loads first."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl.generation.vllm_generation import VLLMGeneration

    config = Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = Qwen2ForCausalLM(config)
    RecordingLLM.hf_config = config
    llm = RecordingLLM("checkpoint", load_format="dummy", enable_sleep_mode=True)
    generation = VLLMGeneration.__new__(VLLMGeneration)  # as TRL leaves it after _init_vllm with sleep mode
    generation.__dict__.update(
        model=model, mode="colocate", llm=llm, enable_sleep_mode=True, _llm_weights_sleeping=True,
        tensor_parallel_size=1, structured_outputs_regex=None, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0,
        repetition_penalty=1.0, max_completion_length=2, logprobs=0, generation_kwargs={},
        accelerator=SimpleNamespace(process_index=0, num_processes=1))
    import trl.generation.vllm_generation as trl_vllm

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trl_vllm, "SamplingParams", RecordingSamplingParams, raising=False)
        vb.adopt_trl_engine(SimpleNamespace(model=model, vllm_generation=generation), {})
        for _ in range(2):  # no weight change in between: loaded again all the same
            generation.generate([[1, 2]], None, num_generations=1)
    names = [call[0] if call[0] != "wake_up" else f"wake_up{call[1]}" for call in llm.calls]
    one = ["wake_up['weights']", "reload_weights", "reset_prefix_cache", "wake_up['kv_cache']", "generate", "sleep"]
    assert names == [*one, *one]
    generator = vb.attached(model)
    llm.calls.clear()
    generator.sync(model)  # the suite's evaluation after training
    assert [c[0] for c in llm.calls] == ["wake_up", "reload_weights", "reset_prefix_cache"]
    assert llm.calls[0] == ("wake_up", None) and generation._llm_weights_sleeping is False
    generator.sleep()  # the rollout engine's call; an engine TRL owns sleeps on TRL's schedule only
    assert llm.calls[-1][0] != "sleep"
