"""What a recipe is given and what it gives back: the interface between bench/ and baselines/.

A method recipe in ``baselines/`` is one module that declares:

- ``LABEL: str`` and ``ENGINE: str`` ('trl' or 'suite');
- ``Config``: a dataclass derived from ``MethodConfig`` with only that method's fields, each documented with
  its default and constraint (the spec builds ``methods.<name>`` from it; unknown keys are rejected);
- ``networks(spec, config) -> tuple[str, ...]``: roles resident while it trains ('actor', 'critic', 'reward',
  'reference');
- ``needs(spec, config) -> tuple[str, ...]``: shared stages it reads ('warm_start', 'sample_pool',
  'reward_model'), derived from its config;
- ``validate(spec, config, key) -> None``: raises ``SpecError`` naming ``key`` + the field and the fix;
- ``describe(spec, config) -> dict[str, str]``: what the dry run prints for it (updates per rollout, ...);
- ``train(ctx: RunContext) -> TrainOutcome``.

Shared stages (warm start, sample pool, reward model) are recipes too, with ``LABEL``, ``ENGINE`` and ``train``.
The worker resolves everything a run reads once — the device, the model source, the tokenizer, the matched rows —
into the context, calls ``train`` and then evaluates and records the outcome. Recipes take those from the context
and never resolve a setting again, so a run's data moves one way: worker -> context -> recipe. Recipes never time themselves: telemetry is attached from outside
(``ctx.telemetry``), except the suite's own engine, which reports its phases directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # keep this module import-light; torch is imported by the worker
    import torch

    from bench.config.spec import Spec
    from bench.telemetry import Telemetry

@dataclass
class MethodConfig:
    """Fields every method has. A recipe's ``Config`` derives from it and adds its own."""

    enabled: bool = True
    """Run this method."""
    learning_rate: float | None = None
    """Own learning rate (a declared difference, listed in the report); null: train.learning_rate."""

    def resolved_learning_rate(self, spec: "Spec") -> float:
        """The method's own learning rate when declared, else the matched one."""
        return spec.train.learning_rate if self.learning_rate is None else self.learning_rate


ProgressFn = Callable[[int, int, dict[str, float]], None]
"""progress(step, total_steps, latest_metrics): called by recipes after each optimizer step."""


@dataclass
class RunContext:
    """Everything a recipe needs. Paths are folders written by earlier stages of the same suite run."""

    spec: "Spec"
    """The resolved, validated spec (the matched budget)."""
    method: str
    """Registry key of this run (e.g. 'grpo', 'ppo_verifier')."""
    method_spec: MethodConfig | None
    """This method's own settings (spec.methods[method], the recipe's Config); None for a shared stage."""
    seed: int
    """Seed of this run; the worker has already seeded torch / random / numpy with it."""
    run_dir: Path
    """This run's own folder (checkpoints, logs)."""
    device: str
    """'cpu' or 'cuda'."""
    init_model_dir: Path | None
    """Checkpoint every method starts from (policy weights + tokenizer), saved with save_pretrained."""
    train_rows: list[dict[str, str]]
    """Training prompts in the matched order: {'prompt': str, 'answer': gold number as str, 'question': str}."""
    telemetry: "Telemetry"
    """Phase timers, step timers and memory sampler for this run."""
    progress: ProgressFn
    """Report progress after each optimizer step."""
    pool_path: Path | None = None
    """Sample pool JSONL (one line per prompt: prompt, answer, completions, correct flags)."""
    reward_model_dir: Path | None = None
    """Trained reward model (sequence classification, num_labels = 1), when the stage ran."""
    stage_outputs: dict[str, Any] = field(default_factory=dict)
    """Extra outputs of earlier stages, by stage name."""
    tokenizer: Any = None
    """The starting checkpoint's tokenizer (left padding), loaded once by the worker; None only where a recipe
    never tokenizes (config-mapping tests)."""
    model_source: str | Path | None = None
    """Where the policy's starting weights are: ``init_model_dir`` for a method, the initial model (a tiny model's
    or a shipped architecture's folder, a hub id, a local folder) for the warm start; resolved once by the worker."""

    def starting_tokenizer(self) -> Any:
        """``tokenizer``, or a one-line error naming the missing set-up (a context built without one)."""
        if self.tokenizer is None:
            raise RuntimeError(f"{self.method}: the run context has no tokenizer; the worker loads it once "
                               f"(bench.execution.worker.resolve_model) and passes it in")
        return self.tokenizer


@dataclass
class TrainOutcome:
    """What a recipe hands back for evaluation and accounting."""

    policy: "torch.nn.Module"
    """The trained policy (a causal LM with ``generate``), LoRA merged or wrapped."""
    tokenizer: Any
    """Its tokenizer (left padding is set by the evaluator)."""
    networks: dict[str, "torch.nn.Module"]
    """Networks resident during training, by role: 'actor', 'critic', 'reward', 'reference'."""
    optimizers: dict[str, "torch.optim.Optimizer"] = field(default_factory=dict)
    """Optimizers by the role of the network they update (for optimizer-state accounting)."""
    log_history: list[dict[str, float]] = field(default_factory=list)
    """Curve points: {'step': int, 'reward': ..., 'kl': ..., ...} with bench.results.METRIC_NAMES keys."""
    steps: int = 0
    """Optimizer steps taken."""
    completions: int = 0
    """Completions sampled during training (0 for offline methods)."""
    generated_tokens: int = 0
    """Tokens generated during training."""
    trained_tokens: int | None = None
    """Tokens that went through a training forward/backward pass."""
    settings: dict[str, Any] = field(default_factory=dict)
    """Method-specific settings that differ from the matched budget (the report's 'what differs' table)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """Method-specific scalars (e.g. reward-model pair accuracy)."""
    save_dir: Path | None = None
    """Where the recipe saved a model other stages use (warm start, reward model)."""
