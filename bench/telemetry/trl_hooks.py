"""Attach telemetry phases to a TRL trainer from outside: no edits to TRL, no subclassing.

Every place where telemetry attaches is a declared *seam* (:data:`SEAMS`, one table per trainer class the
suite uses). :func:`instrument_trl_trainer` attaches the seams that apply to the trainer's configuration and
records which attached and which are missing; :func:`seam_record` re-checks them after training (a seam that
attached but was never called in a completed step is missing too: TRL kept the attribute but stopped using
it). A phase whose seam is missing is reported as "not instrumented", never as zero seconds. Why: the seams
lean on how trl 1.16 does its work, and an upgrade that moves the work elsewhere must be visible, not a
silent zero. ``tests/test_trl_seams.py`` builds each trainer and fails when a declared seam does not attach
or its phase stays at zero.

Interfaces, preferred in this order (each seam names its own, see :data:`INTERFACES`):

- TrainerCallback hooks (public): optimizer steps and the step timer.
- torch forward hooks (public) on the reference model and on reward-model modules.
- the suite's own reward functions (``trainer.reward_funcs`` holds the callables the suite passed in), each
  wrapped so it times itself; ``functools.wraps`` keeps ``__name__``, which TRL fixed in ``reward_func_names``
  at ``__init__`` anyway, so metric names stay ``rewards/<name>/mean``.
- public methods wrapped on the instance, where no callback fires at that point: ``Trainer.training_step``
  (forward + backward) and ``Trainer.compute_loss`` (the batch, for trained tokens) are the documented
  override points of transformers' Trainer.
- public methods of a model that TRL reaches through its own call path, where neither a callback nor a hook
  can tell the work apart: ``generate`` (a forward hook cannot tell sampling from a training forward) and,
  under LoRA without a reference copy, PEFT's ``disable_adapter`` / ``set_adapter``. These depend on trl
  1.16's internals (``unwrap_model_for_generation`` yields ``accelerator.unwrap_model(trainer.model)``;
  ``trl.trainer.utils.use_adapter``), which is what the post-run "never called" check guards.

Beside the timing seams, :func:`with_monitors` (end of this module) carries the training-dynamics monitors of
``bench.telemetry.monitors`` out of TRL's GRPO through the ``log_metric`` callable TRL passes to reward functions.

No private TRL attribute is patched (the ``_calculate_rewards`` patch is gone: the suite's reward functions
time themselves; TRL's own bookkeeping around them falls in the enclosing 'update' phase).

Where the time goes, per trainer, in trl 1.16:

- update: ``training_step`` (forward + backward; GRPO's generation, reward and reference work nested in its
  ``_prepare_inputs`` are excluded by the exclusive-time rule) and the optimizer step (callback). Gradient
  clipping and the LR scheduler fall in 'other'.
- generation (GRPO): ``generate`` on the unwrapped policy, which also counts completions and generated
  tokens. The vLLM path (``trainer.vllm_generation.generate``, generation.backend vllm) is timed and counted
  from the token ids it returns; the continuous-batching path (``generate_batch``) is timed but its tokens are
  not counted.
- reward (GRPO): each reward function (modules: forward hooks). Async functions run on TRL's event-loop
  thread, where phases cannot be driven: the reward seam is then missing.
- reference (GRPO with ``beta != 0``; DPO): forward hooks on ``trainer.ref_model``; with PEFT and no ref
  model, the adapter switches. DPO with ``precompute_ref_log_probs=True`` computes the reference log-probs
  inside ``DPOTrainer.__init__``, before any seam exists: the reference seam is recorded as missing.
- evaluation: not a TRL seam. The suite never calls ``trainer.evaluate``; the worker runs its own
  evaluation inside ``telemetry.phase("evaluation")``. Generation inside an open 'evaluation' phase is
  neither timed as 'generation' nor counted.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from bench.model.generation import completion_length
from bench.telemetry.tracker import OTHER, Telemetry

_MARK = "_bench_telemetry_wrapped"
_STATE = "_bench_seam_state"

CALLBACK = "TrainerCallback (public)"
FORWARD_HOOKS = "torch forward hooks (public)"
SUITE_FUNCTIONS = "the suite's own reward functions"
PUBLIC_METHOD = "patch: public Trainer method wrapped on the instance (no callback at that point)"
TRL_CALL_PATH = "patch: public model method wrapped, reached through TRL's internal call path"
NOT_ATTACHABLE = "none: the work happens before instrumentation can attach"
INTERFACES = (CALLBACK, FORWARD_HOOKS, SUITE_FUNCTIONS, PUBLIC_METHOD, TRL_CALL_PATH, NOT_ATTACHABLE)
"""How a seam attaches, most supported first."""


# ------------------------------------------------------------------------------------ seam bookkeeping
@dataclass
class _SeamState:
    """Per-telemetry record: the trainer class, what attached, what is missing and why, and call counts."""

    trainer: str = ""
    attached: dict[str, "Seam"] = field(default_factory=dict)
    missing: list[dict[str, Any]] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)

    def counter(self, seam: str) -> Callable[[], None]:
        """A no-argument function that counts one call of ``seam`` (wrappers call it)."""

        def count() -> None:
            self.calls[seam] = self.calls.get(seam, 0) + 1

        return count


Attach = Callable[[Any, Telemetry, _SeamState], "str | None"]
"""Attach a seam to (trainer, telemetry, state); returns None when attached, else why it could not."""


@dataclass(frozen=True)
class Seam:
    """One declared place where telemetry attaches to a TRL trainer."""

    name: str
    """Stable id, the one recorded in ``result["seams"]``."""
    target: str
    """What is wrapped, hooked or registered."""
    interface: str
    """One of :data:`INTERFACES`."""
    phase: str | None
    """The phase the seam times (None: it only feeds counters)."""
    counters: tuple[str, ...]
    """``telemetry.counters`` keys (or 'steps') the seam fills."""
    attach: Attach
    applies: Callable[[Any], bool] = lambda trainer: True
    """Whether this trainer's configuration needs the seam (e.g. a reference only when ``beta != 0``)."""

    def __post_init__(self) -> None:
        """A seam must name one of :data:`INTERFACES`: the record says how each missing seam would attach."""
        if self.interface not in INTERFACES:
            raise ValueError(f"seam {self.name!r}: interface {self.interface!r} is not one of INTERFACES")


# ------------------------------------------------------------------------------------ wrappers
def _wrap_in_phase(fn: Callable[..., Any], telemetry: Telemetry, name: str,
                   on_call: Callable[[], None] | None = None) -> Callable[..., Any]:
    """``fn`` run inside ``telemetry.phase(name)``; keeps name, docstring and signature. Idempotent."""
    if getattr(fn, _MARK, False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if on_call is not None:
            on_call()
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

    Rule: the suite's one EOS-length rule, :func:`bench.model.generation.completion_length` (the same as TRL's
    completion mask and ``rl_math.truncate_after_eos``): the new tokens of a row are those after the
    prompt, up to and including the first EOS; what ``generate`` writes after it (pad tokens of finished
    rows in a batch) is not generated work. A row without EOS counts every new position. Only when no EOS
    id is known at all does the pad id stand in: every new token that is not the pad id counts.

    Args:
        sequences: LongTensor (rows, prompt_length + new), prompt included.
        prompt_length: width of the (left-padded) prompt batch.
        eos_ids: EOS token ids; pad_id: padding token id or None.

    Returns:
        (completions, generated_tokens).
    """
    rows = int(sequences.shape[0])
    new = sequences[:, prompt_length:]
    if rows == 0 or int(new.shape[1]) == 0:
        return rows, 0
    if eos_ids:
        return rows, sum(completion_length(row, eos_ids) for row in new.tolist())
    if pad_id is not None:
        return rows, int((new != pad_id).sum().item())
    return rows, int(new.numel())


def _wrap_generate(model: Any, telemetry: Telemetry, on_call: Callable[[], None]) -> None:
    """Replace ``model.generate`` (instance attribute) with a timing and counting wrapper.

    A patch because no public interface marks "TRL is sampling": a forward hook fires for training
    forwards too, and TRL's ``profiling_context`` only reports to wandb/mlflow/trackio.
    """
    original = model.generate
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def generate(*args: Any, **kwargs: Any) -> Any:
        if "evaluation" in telemetry.active_phases():
            return original(*args, **kwargs)  # evaluation's tokens are not training throughput
        on_call()
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


def _hook_module(module: Any, telemetry: Telemetry, name: str, on_call: Callable[[], None]) -> None:
    """Time every forward of ``module`` as phase ``name`` (hooks; ``always_call`` closes on errors)."""
    if getattr(module, _MARK + "_" + name, False):
        return

    def pre_hook(_module: Any, _args: Any) -> None:
        on_call()
        telemetry.begin_phase(name)

    module.register_forward_pre_hook(pre_hook)
    module.register_forward_hook(lambda _m, _a, _o: telemetry.end_phase(name), always_call=True)
    setattr(module, _MARK + "_" + name, True)


def _wrap_adapter_switches(peft_model: Any, telemetry: Telemetry, on_call: Callable[[], None]) -> None:
    """Under LoRA without a ref model, time the adapter-disabled (reference) forwards.

    trl's ``use_adapter(model, None)`` enters ``model.disable_adapter()``; ``use_adapter(model,
    "ref")`` calls ``set_adapter("ref")`` and later ``set_adapter(previous)``. A patch: PEFT offers no
    hook for "the adapter is off".
    """
    disable = getattr(peft_model, "disable_adapter", None)
    if disable is not None and not getattr(disable, _MARK, False):

        @functools.wraps(disable)
        @contextlib.contextmanager
        def disable_adapter(*args: Any, **kwargs: Any) -> Any:
            on_call()
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
                on_call()
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


def _count_trained_tokens(compute_loss: Callable[..., Any], telemetry: Telemetry,
                          on_call: Callable[[], None]) -> Callable[..., Any]:
    """Wrap ``trainer.compute_loss(model, inputs, ...)`` to add each batch's tokens to counters['trained_tokens']."""

    @functools.wraps(compute_loss)
    def wrapper(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        on_call()
        counters = telemetry.counters
        counters["trained_tokens"] = counters.get("trained_tokens", 0) + trained_tokens_in(inputs)
        return compute_loss(model, inputs, *args, **kwargs)

    wrapper._bench_counts_tokens = True  # type: ignore[attr-defined]
    return wrapper


# ------------------------------------------------------------------------------------ attach functions
def _step_callbacks(trainer: Any, telemetry: Telemetry, state: _SeamState) -> str | None:
    """Register the telemetry callback (steps, optimizer step) and a call counter, once per trainer."""
    if not callable(getattr(trainer, "add_callback", None)):
        return f"{type(trainer).__name__}.add_callback not found"
    if not getattr(trainer, _MARK, False):
        trainer.add_callback(telemetry.trainer_callback())
        trainer.add_callback(_counting_callback(state))
        setattr(trainer, _MARK, True)
    return None


def _counting_callback(state: _SeamState) -> Any:
    """A TrainerCallback counting completed steps and optimizer steps (the callback seams' calls)."""
    from transformers import TrainerCallback

    steps, optimizer_steps = state.counter("step_timer"), state.counter("optimizer_step")

    class SeamCallCounter(TrainerCallback):
        """Counts on_step_end and on_optimizer_step: proof that the callback seams fired."""

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            optimizer_steps()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            steps()

    return SeamCallCounter()


def _training_step(trainer: Any, telemetry: Telemetry, state: _SeamState) -> str | None:
    fn = getattr(trainer, "training_step", None)
    if not callable(fn):
        return f"{type(trainer).__name__}.training_step not found"
    trainer.training_step = _wrap_in_phase(fn, telemetry, "update", state.counter("training_step"))
    return None


def _compute_loss(trainer: Any, telemetry: Telemetry, state: _SeamState) -> str | None:
    fn = getattr(trainer, "compute_loss", None)
    if not callable(fn):
        return f"{type(trainer).__name__}.compute_loss not found"
    if not getattr(fn, "_bench_counts_tokens", False):
        trainer.compute_loss = _count_trained_tokens(fn, telemetry, state.counter("compute_loss"))
    return None


def _generate(trainer: Any, telemetry: Telemetry, state: _SeamState) -> str | None:
    policy = _unwrapped_policy(trainer)
    if policy is None or not callable(getattr(policy, "generate", None)):
        return "the unwrapped policy has no generate method"
    _wrap_generate(policy, telemetry, state.counter("generate"))
    return None


def _generate_batch(trainer: Any, telemetry: Telemetry, state: _SeamState) -> str | None:
    policy = _unwrapped_policy(trainer)
    fn = getattr(policy, "generate_batch", None)
    if not callable(fn):
        return "the unwrapped policy has no generate_batch method"
    policy.generate_batch = _wrap_in_phase(fn, telemetry, "generation", state.counter("generate_batch"))
    return None


def _vllm_generate(trainer: Any, telemetry: Telemetry, state: _SeamState) -> str | None:
    vllm = getattr(trainer, "vllm_generation", None)
    if vllm is None or not callable(getattr(vllm, "generate", None)):
        return "trainer.vllm_generation.generate not found"
    if not getattr(vllm.generate, _MARK, False):
        vllm.generate = _counting_vllm_generate(vllm.generate, telemetry, state.counter("vllm_generate"))
    return None


def vllm_output_counts(output: Any) -> tuple[int, int]:
    """(completions, generated tokens) of one ``VLLMGeneration.generate`` return value (trl 1.16: a tuple
    ``(prompt_ids, completion_ids, logprobs, logprob_token_ids)``). vLLM's completion ids end at the stop token
    (included), with no padding, so each one's length is its generated tokens. An unknown layout counts (0, 0)."""
    if not isinstance(output, (tuple, list)) or len(output) < 2 or not isinstance(output[1], list):
        return 0, 0
    completions = output[1]
    return len(completions), sum(len(ids) for ids in completions)


def _counting_vllm_generate(fn: Callable[..., Any], telemetry: Telemetry,
                            on_call: Callable[[], None]) -> Callable[..., Any]:
    """``fn`` timed as phase 'generation' with its completions and tokens added to the counters, like the
    transformers ``generate`` seam; TRL's vLLM returns token ids, so they are counted from what it returned."""

    @functools.wraps(fn)
    def generate(*args: Any, **kwargs: Any) -> Any:
        if "evaluation" in telemetry.active_phases():
            return fn(*args, **kwargs)
        on_call()
        with telemetry.phase("generation"):
            output = fn(*args, **kwargs)
        if telemetry.enabled:
            completions, tokens = vllm_output_counts(output)
            telemetry.counters["completions"] = telemetry.counters.get("completions", 0) + completions
            telemetry.counters["generated_tokens"] = telemetry.counters.get("generated_tokens", 0) + tokens
        return output

    setattr(generate, _MARK, True)
    return generate


def _reward_functions(trainer: Any, telemetry: Telemetry, state: _SeamState) -> str | None:
    """Wrap each sync reward function in place (modules get forward hooks); async ones cannot be timed."""
    import torch

    funcs = getattr(trainer, "reward_funcs", None)
    if not isinstance(funcs, list) or not funcs:
        return "trainer.reward_funcs is not a non-empty list"
    on_call = state.counter("reward_functions")
    untimed = []
    for i, func in enumerate(funcs):
        if isinstance(func, torch.nn.Module):
            _hook_module(func, telemetry, "reward", on_call)
        elif inspect.iscoroutinefunction(func):
            untimed.append(getattr(func, "__name__", repr(func)))  # runs on trl's event-loop thread
        elif callable(func):
            funcs[i] = _wrap_in_phase(func, telemetry, "reward", on_call)
        else:
            untimed.append(repr(func))
    if untimed:
        return "reward function(s) not timed (async, on TRL's event-loop thread): " + ", ".join(untimed)
    return None


def _ref_model_hooks(trainer: Any, telemetry: Telemetry, state: _SeamState) -> str | None:
    ref_model = getattr(trainer, "ref_model", None)
    if ref_model is None or not callable(getattr(ref_model, "register_forward_pre_hook", None)):
        return "trainer.ref_model is None or not a torch module"
    _hook_module(ref_model, telemetry, "reference", state.counter("ref_model_hooks"))
    return None


def _adapter_switches(trainer: Any, telemetry: Telemetry, state: _SeamState) -> str | None:
    policy = _unwrapped_policy(trainer)
    if not (callable(getattr(policy, "disable_adapter", None)) and callable(getattr(policy, "set_adapter", None))):
        return "the unwrapped policy has no disable_adapter/set_adapter (not a PeftModel)"
    _wrap_adapter_switches(policy, telemetry, state.counter("ref_adapter_switch"))
    return None


def _precomputed_reference(trainer: Any, telemetry: Telemetry, state: _SeamState) -> str | None:
    return "reference log-probs were precomputed inside DPOTrainer.__init__, before instrumentation"


# ------------------------------------------------------------------------------------ when a seam applies
def _args(trainer: Any, key: str, default: Any = None) -> Any:
    return getattr(getattr(trainer, "args", None), key, default)


def _is_peft(trainer: Any) -> bool:
    return hasattr(_unwrapped_policy(trainer), "peft_config")


def _grpo_plain_generate(trainer: Any) -> bool:
    return not _args(trainer, "use_vllm", False) and not _args(trainer, "use_transformers_continuous_batching", False)


def _grpo_reference(trainer: Any) -> bool:
    return _args(trainer, "beta", None) != 0.0  # unknown (renamed) -> assume needed: missing, not silent


def _dpo_reference(trainer: Any) -> bool:
    return not _args(trainer, "precompute_ref_log_probs", False)


def _by_ref_model(needed: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """The reference runs through ``trainer.ref_model``: needed, and not the PEFT adapter-off path."""
    return lambda trainer: needed(trainer) and (getattr(trainer, "ref_model", None) is not None or not _is_peft(trainer))


def _by_adapter(needed: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """The reference is the policy with its adapter off: needed, PEFT, and no separate ref_model."""
    return lambda trainer: needed(trainer) and getattr(trainer, "ref_model", None) is None and _is_peft(trainer)


# ------------------------------------------------------------------------------------ the table
_COMMON = (
    Seam("step_timer", "trainer.add_callback: on_step_begin / on_step_end", CALLBACK, OTHER, ("steps",),
         _step_callbacks),
    Seam("optimizer_step", "trainer.add_callback: on_pre_optimizer_step / on_optimizer_step", CALLBACK, "update",
         (), _step_callbacks),
    Seam("training_step", "Trainer.training_step (forward + backward)", PUBLIC_METHOD, "update", (), _training_step),
    Seam("compute_loss", "Trainer.compute_loss (sees each training batch)", PUBLIC_METHOD, None,
         ("trained_tokens",), _compute_loss),
)


def _reference_seams(needed: Callable[[Any], bool]) -> tuple[Seam, ...]:
    return (
        Seam("ref_model_hooks", "trainer.ref_model forward pre-hook / forward hook", FORWARD_HOOKS, "reference", (),
             _ref_model_hooks, _by_ref_model(needed)),
        Seam("ref_adapter_switch", "PeftModel.disable_adapter / set_adapter('ref') via trl use_adapter",
             TRL_CALL_PATH, "reference", (), _adapter_switches, _by_adapter(needed)),
    )


SEAMS: dict[str, tuple[Seam, ...]] = {
    "GRPOTrainer": _COMMON + (
        Seam("generate", "accelerator.unwrap_model(trainer.model).generate", TRL_CALL_PATH, "generation",
             ("completions", "generated_tokens"), _generate, _grpo_plain_generate),
        Seam("generate_batch", "accelerator.unwrap_model(trainer.model).generate_batch (continuous batching)",
             TRL_CALL_PATH, "generation", (), _generate_batch,
             lambda t: bool(_args(t, "use_transformers_continuous_batching", False))),
        Seam("vllm_generate", "trainer.vllm_generation.generate", TRL_CALL_PATH, "generation", (), _vllm_generate,
             lambda t: bool(_args(t, "use_vllm", False))),
        Seam("reward_functions", "each function in trainer.reward_funcs (the suite's own)", SUITE_FUNCTIONS,
             "reward", (), _reward_functions),
    ) + _reference_seams(_grpo_reference),
    "DPOTrainer": _COMMON + _reference_seams(_dpo_reference) + (
        Seam("ref_logps_precomputed", "DPOConfig.precompute_ref_log_probs=True", NOT_ATTACHABLE, "reference", (),
             _precomputed_reference, lambda t: bool(_args(t, "precompute_ref_log_probs", False))),
    ),
    "SFTTrainer": _COMMON,
    "RewardTrainer": _COMMON,
}
"""Seams per TRL trainer class (trl 1.16, pinned in pyproject.toml). The phases they feed are the report's."""


def trainer_kind(trainer: Any) -> str | None:
    """The :data:`SEAMS` key ``trainer`` is an instance of (subclasses included), or None."""
    import trl

    for name in SEAMS:
        cls = getattr(trl, name, None)
        if isinstance(cls, type) and isinstance(trainer, cls):
            return name
    return None


def seams_for(trainer: Any) -> tuple[Seam, ...]:
    """The declared seams that apply to this trainer's configuration (the common ones for an unknown class)."""
    kind = trainer_kind(trainer)
    return tuple(s for s in SEAMS.get(kind or "", _COMMON) if s.applies(trainer))


# ------------------------------------------------------------------------------------ entry points
def _missing(seam: Seam, reason: str) -> dict[str, Any]:
    return {"seam": seam.name, "phase": seam.phase, "counters": list(seam.counters), "target": seam.target,
            "interface": seam.interface, "reason": reason}


def _record(state: _SeamState, missing: list[dict[str, Any]]) -> dict[str, Any]:
    names = {m["seam"] for m in missing}
    return {"trainer": state.trainer, "attached": [n for n in state.attached if n not in names], "missing": missing}


def instrument_trl_trainer(trainer: Any, telemetry: Telemetry) -> dict[str, Any]:
    """Attach ``telemetry`` to a constructed TRL trainer through its declared seams; record what attached.

    Call after the trainer is built and before ``trainer.train()``; calling twice is harmless. Returns (and
    stores as ``telemetry.seams``) ``{"trainer", "attached": [seam names], "missing": [{"seam", "phase",
    "counters", "target", "interface", "reason"}]}``. After training, :func:`seam_record` gives the checked
    record.
    Generated tokens and completions are added to ``telemetry.counters`` by the ``generate`` wrapper (rule:
    :func:`count_generated_tokens`).
    """
    state: _SeamState = getattr(telemetry, _STATE, None) or _SeamState()
    setattr(telemetry, _STATE, state)
    kind = trainer_kind(trainer)
    state.trainer = kind or type(trainer).__name__
    if kind is None and not any(m["seam"] == "seam_table" for m in state.missing):
        state.missing.append({"seam": "seam_table", "phase": None, "counters": [], "target": type(trainer).__name__,
                              "reason": f"no seam table for {type(trainer).__name__}; only the common seams attach"})
    for seam in seams_for(trainer):
        if seam.name in state.attached or any(m["seam"] == seam.name for m in state.missing):
            continue
        reason = seam.attach(trainer, telemetry, state)
        if reason is None:
            state.attached[seam.name] = seam
        else:
            state.missing.append(_missing(seam, reason))
    record = _record(state, list(state.missing))
    telemetry.seams = record  # type: ignore[attr-defined]
    return record


def seam_record(telemetry: Telemetry) -> dict[str, Any] | None:
    """The checked seam record after training, for ``result["seams"]``; None when no TRL trainer was instrumented.

    A seam that attached but was never called while at least one step completed is moved to ``missing``:
    TRL kept the attribute but no longer does that work there, and its phase would otherwise read as zero.
    With no completed step nothing can be judged, and the record is the one taken at instrumentation.
    """
    state: _SeamState | None = getattr(telemetry, _STATE, None)
    if state is None:
        return None
    missing = list(state.missing)
    steps = state.calls.get("step_timer", 0)
    if steps > 0:
        missing += [_missing(seam, f"attached but never called in {steps} completed step(s)")
                    for name, seam in state.attached.items() if state.calls.get(name, 0) == 0]
    record = _record(state, missing)
    telemetry.seams = record  # type: ignore[attr-defined]
    return record
