"""Attach telemetry phases to a TRL trainer from outside: no edits to TRL, no subclassing.

Where trl 1.16 does each piece of work, and what is wrapped (instance attributes and module hooks
only, so the class and every other trainer stay untouched):

- generation (GRPOTrainer, RLOOTrainer): ``_generate_single_turn`` runs
  ``unwrap_model_for_generation(self.model_wrapped, accelerator)``, which yields
  ``accelerator.unwrap_model(model)`` — the same object as ``accelerator.unwrap_model(trainer.model)``
  (a ``PeftModel`` under LoRA) — and calls ``.generate`` on it. That object's ``generate`` is
  replaced by a timing/counting wrapper. The vLLM path (``trainer.vllm_generation.generate``) and the
  continuous-batching path (``generate_batch``) are timed but their tokens are not counted.
- reward: ``trainer._calculate_rewards`` (all reward functions of a batch, sync, async and model
  ones, with their tokenisation) and each plain sync function in ``trainer.reward_funcs``
  (``functools.wraps`` keeps ``__name__``; TRL fixed ``reward_func_names`` in ``__init__`` anyway,
  so metric names stay ``rewards/<name>/mean``). Nested same-phase calls merge (counted once).
- reference: with ``trainer.ref_model`` (GRPO with ``beta != 0``; DPO without PEFT and without
  ``precompute_ref_log_probs``) a forward pre-hook / forward hook pair on it. With PEFT and no
  ref_model both trainers get the reference by disabling the adapter (``use_adapter`` ->
  ``model.disable_adapter()``, or ``set_adapter("ref")``): those two methods of the unwrapped
  PeftModel are wrapped. DPO with ``precompute_ref_log_probs=True`` computes the reference
  log-probs inside ``DPOTrainer.__init__``, before this function can run: that cost is not in
  the phases (time the trainer construction separately if it matters).
- update: ``trainer.training_step`` (forward + backward; the generation/reward/reference nested in
  GRPO's ``_prepare_inputs`` are excluded by the exclusive-time rule) and, via the callback,
  ``optimizer.step()``. Gradient clipping and the LR scheduler fall in 'other'.
- evaluation: ``trainer.evaluate``. Generation inside an open 'evaluation' phase is neither timed as
  'generation' nor counted, so the worker's own evaluation should run inside
  ``telemetry.phase("evaluation")`` too.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, Callable

from bench.telemetry.tracker import Telemetry

_MARK = "_bench_telemetry_wrapped"


def _wrap_in_phase(fn: Callable[..., Any], telemetry: Telemetry, name: str) -> Callable[..., Any]:
    """``fn`` run inside ``telemetry.phase(name)``; keeps name, docstring and signature."""
    if getattr(fn, _MARK, False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with telemetry.phase(name):
            return fn(*args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper


def _eos_and_pad(model: Any, kwargs: dict[str, Any]) -> tuple[list[int], int | None]:
    """EOS ids and pad id that ``generate`` used (explicit kwargs, then the generation config)."""
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    eos = kwargs.get("eos_token_id", getattr(config, "eos_token_id", None))
    pad = kwargs.get("pad_token_id", getattr(config, "pad_token_id", None))
    if eos is None:
        eos_ids: list[int] = []
    elif isinstance(eos, (list, tuple)):
        eos_ids = [int(e) for e in eos]
    else:
        eos_ids = [int(eos)]
    return eos_ids, (int(pad) if isinstance(pad, int) else None)


def count_generated_tokens(sequences: Any, prompt_length: int, eos_ids: list[int], pad_id: int | None) -> tuple[int, int]:
    """Completions and generated tokens in a decoder-only ``generate`` output.

    Rule (the same as TRL's completion mask): the new tokens of a row are those after the prompt, up
    to and including the first EOS; what ``generate`` writes after it (pad tokens of finished rows in
    a batch) is not generated work. A row without EOS counts every new position. Without any EOS id,
    every new token that is not the pad id counts.

    Args:
        sequences: LongTensor (rows, prompt_length + new), prompt included.
        prompt_length: width of the (left-padded) prompt batch.
        eos_ids: EOS token ids; pad_id: padding token id or None.

    Returns:
        (completions, generated_tokens).
    """
    import torch

    rows = int(sequences.shape[0])
    new = sequences[:, prompt_length:]
    width = int(new.shape[1])
    if rows == 0 or width == 0:
        return rows, 0
    if eos_ids:
        is_eos = torch.isin(new, torch.tensor(eos_ids, device=new.device))
        has_eos = is_eos.any(dim=1)
        first = is_eos.int().argmax(dim=1)
        lengths = torch.where(has_eos, first + 1, torch.full_like(first, width))
        return rows, int(lengths.sum().item())
    if pad_id is not None:
        return rows, int((new != pad_id).sum().item())
    return rows, rows * width


def _wrap_generate(model: Any, telemetry: Telemetry) -> None:
    """Replace ``model.generate`` (instance attribute) with a timing and counting wrapper."""
    original = getattr(model, "generate", None)
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def generate(*args: Any, **kwargs: Any) -> Any:
        if "evaluation" in telemetry.active_phases():
            return original(*args, **kwargs)  # evaluation's tokens are not training throughput
        with telemetry.phase("generation"):
            output = original(*args, **kwargs)
            if telemetry.enabled:
                _count_into(telemetry, model, output, args, kwargs)
        return output

    setattr(generate, _MARK, True)
    model.generate = generate  # instance attribute shadows the class method


def _count_into(telemetry: Telemetry, model: Any, output: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Add the completions and generated tokens of one ``generate`` call to ``telemetry.counters``."""
    try:
        import torch

        sequences = output if isinstance(output, torch.Tensor) else getattr(output, "sequences", None)
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if sequences is None or not isinstance(input_ids, torch.Tensor) or sequences.dim() != 2:
            return
        config = getattr(model, "config", None)
        # Encoder-decoder outputs hold no prompt, only a start token before the new ones.
        prompt_length = 1 if getattr(config, "is_encoder_decoder", False) else int(input_ids.shape[1])
        eos_ids, pad_id = _eos_and_pad(model, kwargs)
        completions, tokens = count_generated_tokens(sequences, prompt_length, eos_ids, pad_id)
    except Exception:  # noqa: BLE001 - counting must never break generation
        return
    telemetry.counters["completions"] = telemetry.counters.get("completions", 0) + completions
    telemetry.counters["generated_tokens"] = telemetry.counters.get("generated_tokens", 0) + tokens


def _hook_module(module: Any, telemetry: Telemetry, name: str) -> None:
    """Time every forward of ``module`` as phase ``name`` (hooks; ``always_call`` closes on errors)."""
    if getattr(module, _MARK + "_" + name, False):
        return
    module.register_forward_pre_hook(lambda _m, _a: telemetry.begin_phase(name))
    module.register_forward_hook(lambda _m, _a, _o: telemetry.end_phase(name), always_call=True)
    setattr(module, _MARK + "_" + name, True)


def _wrap_adapter_switches(peft_model: Any, telemetry: Telemetry) -> None:
    """Under LoRA without a ref model, time the adapter-disabled (reference) forwards.

    trl's ``use_adapter(model, None)`` enters ``model.disable_adapter()``; ``use_adapter(model,
    "ref")`` calls ``set_adapter("ref")`` and later ``set_adapter(previous)``.
    """
    disable = getattr(peft_model, "disable_adapter", None)
    if disable is not None and not getattr(disable, _MARK, False):

        @functools.wraps(disable)
        @contextlib.contextmanager
        def disable_adapter(*args: Any, **kwargs: Any) -> Any:
            with telemetry.phase("reference"), disable(*args, **kwargs):
                yield

        setattr(disable_adapter, _MARK, True)
        peft_model.disable_adapter = disable_adapter

    set_adapter = getattr(peft_model, "set_adapter", None)
    if set_adapter is not None and not getattr(set_adapter, _MARK, False):
        state = {"open": False}

        @functools.wraps(set_adapter)
        def set_adapter_wrapped(adapter_name: Any, *args: Any, **kwargs: Any) -> Any:
            result = set_adapter(adapter_name, *args, **kwargs)
            if adapter_name == "ref" and not state["open"]:
                telemetry.begin_phase("reference")
                state["open"] = True
            elif adapter_name != "ref" and state["open"]:
                telemetry.end_phase("reference")
                state["open"] = False
            return result

        setattr(set_adapter_wrapped, _MARK, True)
        peft_model.set_adapter = set_adapter_wrapped


def _unwrapped_policy(trainer: Any) -> Any:
    """The object trl calls ``generate`` on: ``accelerator.unwrap_model(trainer.model)``."""
    model = getattr(trainer, "model", None)
    accelerator = getattr(trainer, "accelerator", None)
    if model is None:
        return None
    if accelerator is not None:
        try:
            return accelerator.unwrap_model(model)
        except Exception:  # noqa: BLE001
            pass
    return model


def trained_tokens_in(inputs: Any) -> int:
    """Tokens a training forward/backward processes in one batch (prompt and completion, padding excluded).

    The batch layouts of trl 1.16: SFT, DPO and Reward carry one ``attention_mask`` over whole sequences
    (DPO and Reward: chosen and rejected stacked); GRPO/RLOO carry ``prompt_mask`` and ``completion_mask``.
    An unknown layout counts 0 rather than guessing.
    """
    if not isinstance(inputs, dict):
        return 0
    if inputs.get("attention_mask") is not None:
        return int(inputs["attention_mask"].sum())
    if inputs.get("prompt_mask") is not None and inputs.get("completion_mask") is not None:
        return int(inputs["prompt_mask"].sum()) + int(inputs["completion_mask"].sum())
    return 0


def _count_trained_tokens(compute_loss: Callable[..., Any], telemetry: Telemetry) -> Callable[..., Any]:
    """Wrap ``trainer.compute_loss(model, inputs, ...)`` to add each batch's tokens to counters['trained_tokens']."""

    @functools.wraps(compute_loss)
    def wrapper(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        counters = telemetry.counters
        counters["trained_tokens"] = counters.get("trained_tokens", 0) + trained_tokens_in(inputs)
        return compute_loss(model, inputs, *args, **kwargs)

    wrapper._bench_counts_tokens = True  # type: ignore[attr-defined]
    return wrapper


def instrument_trl_trainer(trainer: Any, telemetry: Telemetry) -> None:
    """Attach ``telemetry`` phases to a constructed TRL trainer (GRPO, RLOO, DPO, SFT, Reward).

    Call after the trainer is built and before ``trainer.train()``; calling twice is harmless.
    See the module docstring for what is wrapped where. Generated tokens and completions are added
    to ``telemetry.counters`` by the ``generate`` wrapper (rule: :func:`count_generated_tokens`).
    """
    if not getattr(trainer, _MARK, False):
        trainer.add_callback(telemetry.trainer_callback())
        setattr(trainer, _MARK, True)

    # update: forward + backward (the optimizer step is phased by the callback)
    trainer.training_step = _wrap_in_phase(trainer.training_step, telemetry, "update")
    if hasattr(trainer, "compute_loss") and not hasattr(trainer.compute_loss, "_bench_counts_tokens"):
        trainer.compute_loss = _count_trained_tokens(trainer.compute_loss, telemetry)
    if hasattr(trainer, "evaluate"):
        trainer.evaluate = _wrap_in_phase(trainer.evaluate, telemetry, "evaluation")

    policy = _unwrapped_policy(trainer)
    if policy is not None:
        _wrap_generate(policy, telemetry)
        if hasattr(policy, "generate_batch"):  # transformers continuous batching path
            policy.generate_batch = _wrap_in_phase(policy.generate_batch, telemetry, "generation")
    vllm = getattr(trainer, "vllm_generation", None)
    if vllm is not None and hasattr(vllm, "generate"):
        vllm.generate = _wrap_in_phase(vllm.generate, telemetry, "generation")

    # reward
    if hasattr(trainer, "_calculate_rewards"):
        trainer._calculate_rewards = _wrap_in_phase(trainer._calculate_rewards, telemetry, "reward")
    reward_funcs = getattr(trainer, "reward_funcs", None)
    if isinstance(reward_funcs, list):
        import torch

        for i, func in enumerate(reward_funcs):
            if isinstance(func, torch.nn.Module):
                _hook_module(func, telemetry, "reward")
            elif callable(func) and not inspect.iscoroutinefunction(func):
                # async functions run on trl's event-loop thread: they stay inside the
                # _calculate_rewards phase instead (phases are driven from one thread).
                reward_funcs[i] = _wrap_in_phase(func, telemetry, "reward")

    # reference
    ref_model = getattr(trainer, "ref_model", None)
    if ref_model is not None:
        _hook_module(ref_model, telemetry, "reference")
    elif policy is not None and hasattr(policy, "peft_config"):
        _wrap_adapter_switches(policy, telemetry)
