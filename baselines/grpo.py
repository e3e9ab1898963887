"""GRPO with TRL's GRPOTrainer: the library reference implementation.

G completions per prompt are scored by the rule verifier (accuracy + format - length penalty); each
completion's advantage is its reward minus the group mean, divided by the group's std (TRL: unbiased std
via nanstd, + 1e-4; ``scale_rewards="group"``). No critic, no reward network. The KL term against a
frozen reference is on (``beta`` explicit: TRL's default is 0.0, which loads no reference at all), and
``loss_type="grpo"`` is set explicitly (TRL's default is "dapo").

Generation follows the suite-wide ``generation.backend``: transformers' ``model.generate`` by default; ``vllm``
hands it to vLLM inside the training process (TRL's ``use_vllm`` in ``colocate`` mode), as every other method's
generation is (bench.model.vllm_backend). vLLM is an optional extra and preallocates
``generation.vllm_gpu_memory_utilization`` of a GPU's memory up front (the report shows that apart from training
memory). TRL's colocated engine is started with the suite engine's settings (seed from the run seed, sleep mode,
batching, prefix caching, maximum length, dtype, eager or compiled) and samples with its ``SamplingParams``
(:func:`build_trainer`, bench.model.vllm_backend.trl_engine_matched), so GRPO (TRL) and GRPO (suite engine) differ in
the algorithm, not in the sampler; what still differs is recorded (settings.vllm.differences). TRL's
importance-sampling correction of vLLM's sampling log-probabilities is on only when
``generation.importance_sampling_cap`` is (token_truncate at that cap), as for the suite's engine.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from baselines.common import (check_micro_batching, curves_from_log_history, evaluable_policy, load_initial_policy,
                              lora_config, matched_kl_coef, matched_training_args, micro_batching, require_groups,
                              run_trainer, trainer_networks, trl_precision)
from bench.execution.context import MethodConfig, RunContext, TrainOutcome
from bench.task.data import prompts_for_steps
from bench.task.rewards import make_reward_functions
from bench.results import curve_names
from bench.telemetry.trl_monitors import monitor_curve_names, monitor_problems, with_monitors

if TYPE_CHECKING:
    from trl import GRPOConfig

LABEL = "GRPO (TRL)"
ENGINE = "trl"
DATA_PARALLEL = True
"""Under a launcher (bench.execution.launch) it runs as N processes: TRL takes the distributed state from the launcher and
each rank generates for prompts_per_step / N prompts of every step (see grpo_config)."""


@dataclass
class Config(MethodConfig):
    """GRPO's settings (TRL GRPOTrainer). Unset ones inherit the matched budget; the report lists differences."""

    beta: float | None = None
    """KL coefficient (>= 0; null: train.kl_beta). Set explicitly: TRL's default 0.0 loads no reference at all."""
    loss_type: Literal["grpo", "bnpo", "dapo", "dr_grpo"] = "grpo"
    """TRL's loss aggregation (its default is dapo): grpo = mean per sequence, then over sequences."""
    kl_bias_correction: bool = True
    """TRL's ``use_bias_correction_kl`` (its 1.16 default): the k3 term multiplied by the policy ratio."""


def beta(spec: Any, cfg: Config) -> float:
    """The method's KL coefficient, else the matched train.kl_beta."""
    return matched_kl_coef(spec, cfg.beta)


def networks(spec: Any, cfg: Config) -> tuple[str, ...]:
    """The actor, and the reference when beta > 0 (with LoRA, the base model with adapters off)."""
    return ("actor", "reference") if beta(spec, cfg) > 0 else ("actor",)


def needs(spec: Any, cfg: Config) -> tuple[str, ...]:
    """Only the shared starting checkpoint."""
    return ("warm_start",)


def validate(spec: Any, cfg: Config, key: str) -> None:
    """beta and learning_rate >= 0 (loss_type is a Literal, checked when the spec is built); G >= 2 (TRL's
    generation batch must divide by G: it does, as prompts x G); micro-batches that split the step evenly. The
    generation backend is the suite's (generation.backend, checked by bench.config.rules)."""
    from bench.config.rules import RATE, check_rules

    check_rules(cfg, {"learning_rate": RATE, "beta": RATE}, f"{key}.")
    require_groups(spec, key)
    check_micro_batching(spec.completions_per_step, spec.train.micro_batch_size, "completions")
    from bench.config.launcher import active

    processes = spec.launcher.num_processes if active(spec) else 1
    if processes > 1:  # each rank micro-batches its own share (bench.execution.launch checks that N divides the prompts)
        check_micro_batching(spec.completions_per_step // processes, spec.train.micro_batch_size,
                             f"completions per process ({processes} processes)")


def describe(spec: Any, cfg: Config) -> dict[str, str]:
    """Dry-run lines: updates per rollout, the loss type and who generates."""
    gen = spec.generation
    # What vLLM reserves depends on the device: a share of each GPU, or a fixed KV-cache space on a CPU. The
    # dry run imports no torch, so device auto names both.
    on_gpu = f"preallocates {gen.vllm_gpu_memory_utilization:g} of each GPU's memory"
    on_cpu = f"reserves {gen.vllm_cpu_kv_cache_gib:g} GiB of KV cache in host memory"
    reservation = {"cuda": on_gpu, "cpu": on_cpu}.get(spec.device, f"{on_gpu} on a GPU; {on_cpu} on a CPU")
    backend = (f"vllm (colocate, {reservation})" if gen.backend == "vllm" else "transformers (model.generate)")
    return {"updates per rollout": "1 (num_iterations 1, one optimizer step per generation batch)",
            "micro-batch": "{} completions per forward/backward, {} accumulation step(s)".format(
                *micro_batching(spec.completions_per_step, spec.train.micro_batch_size)),
            "loss": cfg.loss_type, "generation": backend}


CURVE_NAMES = curve_names({
    "reward": "reward", "reward_std": "reward_std", "rewards/accuracy/mean": "accuracy_reward",
    "rewards/format/mean": "format_reward", "rewards/length_penalty/mean": "length_penalty_reward",
    "kl": "kl", "loss": "loss", "entropy": "entropy", "frac_reward_zero_std": "zero_std_groups",
    "clip_ratio/region_mean": "clipfrac", "grad_norm": "grad_norm", "learning_rate": "learning_rate",
    **monitor_curve_names(),  # bench.telemetry.monitors via with_monitors, and TRL's completions/mean_length, clipped_ratio
})
"""TRL GRPOTrainer log key -> the suite's curve metric name (bench.results.METRIC_NAMES)."""


def grpo_config(ctx: RunContext) -> "GRPOConfig":
    """The matched budget as a GRPOConfig: one optimizer step per batch of prompts_per_step x G completions
    (over all ranks under a launcher)."""
    from trl import GRPOConfig

    from bench.execution.launch import world_size

    from bench.model.generation import decoding_settings
    from bench.model.precision import storage_dtype

    spec, t, cfg = ctx.spec, ctx.spec.train, ctx.method_spec
    decoding = decoding_settings(spec.generation)  # the same settings the sample pool and the engine sample with
    # TRL counts completions, not prompts; with micro-batches it accumulates over them and still generates
    # the whole step's batch at once (steps_per_generation defaults to gradient_accumulation_steps).
    # Under a launcher TRL's batch is per device: per_device x accumulation x N = prompts_per_step x G, so each of
    # the N ranks generates and trains on prompts_per_step / N prompts' G completions of every step.
    per_device, accumulation = micro_batching(spec.completions_per_step // world_size(), t.micro_batch_size)
    args = matched_training_args(spec, ctx, max_steps=t.steps, learning_rate=cfg.resolved_learning_rate(spec),
                                 batch_size=per_device)
    args["gradient_accumulation_steps"] = accumulation
    native = {"max_completion_length": decoding["max_new_tokens"], "temperature": decoding["temperature"],
              "top_p": decoding["top_p"], "top_k": decoding["top_k"],
              "repetition_penalty": decoding["repetition_penalty"]}
    # TRL builds its own GenerationConfig from the fields above plus pad/bos/eos, do_sample=True and
    # generation_kwargs (merged last), and passes it to model.generate. Under transformers 5 every field it leaves
    # None is still filled from the model's generation_config.json (TRL's own override context is a no-op there),
    # so the fields GRPOConfig has no argument for (min_new_tokens, the neutral pins) go in explicitly here.
    # Fields whose "off" value is None (min_p, suppress_tokens, bad_words_ids, ...) cannot be pinned this way.
    covered = {"max_new_tokens", "do_sample", "temperature", "top_p", "top_k", "repetition_penalty"}
    args.update(
        num_generations=t.group_size,
        **native,
        generation_kwargs={k: v for k, v in decoding.items() if k not in covered},
        loss_type=cfg.loss_type,
        beta=beta(spec, cfg),
        use_bias_correction_kl=cfg.kl_bias_correction,
        # TRL builds the reference from the checkpoint in this dtype: frozen, so stored as bench.model.precision says.
        model_init_kwargs={"dtype": storage_dtype(spec.model.dtype, trained=False)},
        num_iterations=1,
        scale_rewards="group",
        shuffle_dataset=False,  # the suite fixes the prompt order so every method sees the same one
        reward_weights=None,  # set below with the functions
    )
    args.update(backend_args(spec, decoding, ctx.device))  # vLLM: its own sampling extras replace the transformers pins
    return GRPOConfig(**args)


def backend_args(spec: Any, decoding: dict[str, Any], device: str = "cpu") -> dict[str, Any]:
    """GRPOConfig fields of the suite's generation backend: nothing for transformers; for vllm ``use_vllm``,
    ``vllm_mode="colocate"``, the suite engine's memory share and sleep mode on ``device``, vLLM's own sampling
    extras and the importance-sampling correction (bench.model.vllm_backend.trl_vllm_args).

    TRL passes ``generation_kwargs`` to vLLM's ``SamplingParams`` in this mode, which has none of transformers'
    neutral pins (beam search, n-gram blocking, ... are off in vLLM by default) and spells the minimum length
    ``min_tokens``; TRL sets temperature, top_p, top_k, repetition_penalty and max_tokens itself.
    """
    if spec.generation.backend != "vllm":
        return {}
    from bench.model.vllm_backend import trl_vllm_args

    return trl_vllm_args(spec, decoding, device)


def backend_settings(config: "GRPOConfig", policy: Any = None) -> dict[str, Any]:
    """settings["generation_backend"] (and settings["vllm"] with vLLM): what the report marks per method, lists
    in "what differs" and uses to show vLLM's preallocation apart from training memory; with the policy's adopted
    engine (bench.model.vllm_backend.adopt_trl_engine) also its record (KV cache, weight syncs)."""
    if not config.use_vllm:
        return {"generation_backend": "transformers"}
    from bench.model.vllm_backend import attached

    engine = attached(policy) if policy is not None else None
    return {"generation_backend": "vllm",
            "vllm": {**(engine.record() if engine is not None else {}),
                     "mode": config.vllm_mode, "gpu_memory_utilization": config.vllm_gpu_memory_utilization,
                     "importance_sampling_correction": config.vllm_importance_sampling_correction,
                     "importance_sampling_mode": config.vllm_importance_sampling_mode}}


def recording_prompt_ids(reward_func: Any, seen: list[int]) -> Any:
    """``reward_func`` unchanged, plus the ``prompt_id`` column of each batch (one per prompt, not per completion)
    appended to ``seen``: the prompts this rank generated for."""
    import functools

    @functools.wraps(reward_func)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        ids = kwargs.get("prompt_id") or []
        seen.extend(i for n, i in enumerate(ids) if n == 0 or ids[n - 1] != i)
        return reward_func(*args, **kwargs)

    return recorded


def build_trainer(ctx: RunContext, config: "GRPOConfig", policy: Any, tokenizer: Any, reward_funcs: list[Any],
                  dataset: Any) -> Any:
    """The GRPOTrainer of ``config``; with vLLM its colocated engine is started as the suite's own would be.

    The engine settings GRPOConfig has fields for but that need the policy or its tokenizer are set here: the
    maximum length (the model's) and the sampling extras of the suite's ``SamplingParams`` (minimum length, stop
    ids, no detokenizing: bench.model.vllm_backend.trl_generation_kwargs). The rest TRL has no field for (seed from
    the run seed, batching, prefix caching, dtype, eager or compiled, KV-cache size on a CPU, dummy start) is given
    while the trainer starts its engine (trl_engine_matched); in one process the engine is then adopted: synced by
    the suite and recorded as it runs (bench.model.vllm_backend.adopt_trl_engine).
    """
    from trl import GRPOTrainer

    from bench.execution.launch import world_size
    from bench.model.generation import eos_token_ids, sampling_settings

    spec = ctx.spec
    engine_setup: Any = contextlib.nullcontext()
    settings = sampling_settings(spec, tokenizer, eos_token_ids(policy, tokenizer), greedy=False)
    options = settings.get("vllm") or {}
    if config.use_vllm:
        from bench.model.vllm_backend import (max_model_len, prepare_trl_environment, trl_engine_matched,
                                              trl_generation_kwargs)

        config.vllm_max_model_length = max_model_len(policy.config)
        config.generation_kwargs = {**(config.generation_kwargs or {}), **trl_generation_kwargs(settings)}
        prepare_trl_environment(options, ctx.device)
        engine_setup = trl_engine_matched(options, ctx.device, seed=ctx.seed, model_config=policy.config)
    with engine_setup as build:
        trainer = GRPOTrainer(model=policy, reward_funcs=reward_funcs, args=config, train_dataset=dataset,
                              processing_class=tokenizer, peft_config=lora_config(spec))
    if config.use_vllm and world_size() == 1:  # TRL's colocated vLLM, synced and reused as the suite's own engine
        from bench.model.vllm_backend import adopt_trl_engine

        adopt_trl_engine(trainer, options, build)
    return trainer


def train(ctx: RunContext) -> TrainOutcome:
    """Train with GRPOTrainer on the matched prompts; return the policy and its reference."""
    from datasets import Dataset

    from bench.model.generation import decoding_settings, eos_token_ids, generation_config, sampling_settings
    from bench.execution.launch import world_size

    spec, t, r = ctx.spec, ctx.spec.train, ctx.spec.reward
    policy, tokenizer = load_initial_policy(ctx)

    def count_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    reward_funcs, weights = make_reward_functions(r.accuracy_weight, r.format_weight, r.length_threshold,
                                                  r.length_penalty, count_tokens)
    # The training-dynamics monitors ride on the accuracy function (it gets the gold column): TRL hands it
    # log_metric, and the monitors land in log_history as monitors/<name> (bench.telemetry.trl_hooks).
    if world_size() > 1:  # which prompts this rank trained on, for its rank file (bench.execution.launch)
        reward_funcs[0] = recording_prompt_ids(reward_funcs[0], ctx.telemetry.prompt_ids)
    reward_funcs[0] = with_monitors(reward_funcs[0])
    config = grpo_config(ctx)
    config.reward_weights = weights
    # TRL merges the policy's own generation_config into its sampling config (fields left None, e.g. min_p or
    # suppress_tokens, come from the checkpoint's file); replace it with the suite's explicit one.
    policy.generation_config = generation_config(
        sampling_settings(spec, tokenizer, eos_token_ids(policy, tokenizer), greedy=False))
    rows = prompts_for_steps(ctx.train_rows, t.steps, t.prompts_per_step)
    dataset = Dataset.from_list([{"prompt": row["prompt"], "answer": row["answer"]} for row in rows])
    if world_size() > 1:  # the position of each prompt in the matched order, passed on to the reward functions
        dataset = dataset.add_column("prompt_id", list(range(len(rows))))
    trainer = build_trainer(ctx, config, policy, tokenizer, reward_funcs, dataset)
    run_trainer(ctx, trainer, t.steps)
    problems = monitor_problems(trainer.reward_funcs, trainer.state.log_history)
    counters = ctx.telemetry.counters
    resident = trainer_networks(trainer, uses_reference=config.beta != 0)
    return TrainOutcome(
        policy=evaluable_policy(ctx, trainer), tokenizer=tokenizer, networks=resident,
        optimizers={"actor": trainer.optimizer},
        log_history=curves_from_log_history(trainer.state.log_history, CURVE_NAMES),
        steps=trainer.state.global_step,
        completions=int(counters.get("completions", 0)), generated_tokens=int(counters.get("generated_tokens", 0)),
        settings={"loss_type": config.loss_type, "beta": config.beta, "scale_rewards": config.scale_rewards,
                  "advantage_std": "unbiased (nanstd) + 1e-4", "learning_rate": config.learning_rate,
                  "reward_weights": weights, "optimizer_steps_per_rollout": 1,
                  "loss_aggregation": "sequence_mean" if config.loss_type == "grpo" else config.loss_type,
                  "kl_bias_correction": config.use_bias_correction_kl,
                  "generation": decoding_settings(spec.generation),
                  **backend_settings(config, trainer.model),
                  "precision": trl_precision(spec, resident)},
        metrics={"monitor_problems": "; ".join(problems)} if problems else {},
    )
