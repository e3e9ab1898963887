"""The suite's own on-policy engine: the machinery that PPO (``baselines/ppo.py``) and GRPO
(``baselines/grpo_engine.py``) share. TRL removed its PPOTrainer after v1.12, so PPO runs here; GRPO runs on
the same code so that PPO vs GRPO differ by exactly the critic + GAE versus the group-relative advantage.

The recipes own the algorithm: each has a ``step`` function that reads top to bottom (rollout, advantage,
update). The engine is read in four places, one job each:

- ``baselines/engine_config.py``: ``EngineConfig``, the fields every engine method has (epochs, minibatches,
  clip range, ...), and their checks against the matched budget;
- ``baselines/engine_placement.py``: where the networks live (``Placement``: loading, precision, LoRA, one
  process, DDP or DeepSpeed ZeRO, the optimizers and schedules);
- ``baselines/engine_step.py``: what one step does (``StepPieces``: ``sample``, ``verify`` /
  ``reward_model_scores``, ``logprobs``, ``values``, ``optimise``), on the batch of ``baselines/engine_rollout.py``;
- this module: the loop over rollout steps and what it records (``Engine.run`` fires ``TrainerCallback`` hooks as
  the TRL trainers do, so the same telemetry and progress callbacks attach to both; ``Engine.outcome`` is the
  ``TrainOutcome`` the worker turns into the result, with every choice in its settings).

Sources for the choices: Huang et al. 2024 "The N+ Implementation Details of RLHF with PPO"; TRL's GRPOTrainer.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from baselines.engine_step import StepPieces
from bench.execution import launch
from bench.execution.context import RunContext, TrainOutcome
from bench.model import vllm_backend
from bench.model.precision import lora_roles, precision_policy, with_shared_reference


class Engine(StepPieces):
    """The networks (:class:`~baselines.engine_placement.Placement`), the pieces of a step
    (:class:`~baselines.engine_step.StepPieces`), the loop over steps and the record it leaves."""

    # -- the loop --------------------------------------------------------------------------------
    def run(self, step_fn: Callable[[int], dict[str, float]]) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
        """``train.steps`` calls of ``step_fn(step) -> metrics``, bracketed by TrainerCallback hooks.

        Returns (log_history: a point every train.log_every steps and at the last, per_step: every step).
        """
        t = self.spec.train
        events = CallbackEvents(self.ctx, t.steps)
        with self.gathered("actor"):  # ZeRO-3: the weight snapshot sees whole weights
            events.fire("on_train_begin", model=self.actor)
        log_history: list[dict[str, float]] = []
        per_step: list[dict[str, float]] = []
        for step in range(1, t.steps + 1):
            events.fire("on_step_begin")
            metrics = {"step": step, **step_fn(step)}
            if self.mismatch is not None:  # vLLM backend: the rollout-vs-trainer monitor of this step
                metrics.update(self.mismatch.metrics())
            if self.world_size > 1:  # every rank logs the mean over the ranks (their shards are equal)
                metrics = launch.mean_across_ranks(metrics)
            events.state.global_step = step
            events.fire("on_step_end")
            per_step.append(metrics)
            if step % t.log_every == 0 or step == t.steps:
                log_history.append(metrics)
                events.state.log_history.append(metrics)
                events.fire("on_log", logs=metrics)
        with self.gathered("actor"):
            events.fire("on_train_end", model=self.actor)
        return log_history, per_step

    def _lora_settings(self) -> dict[str, Any]:
        """What LoRA changed, for the result (nothing without LoRA)."""
        if not self.lora:
            return {}
        lora = self.spec.train.lora
        out: dict[str, Any] = {"lora": {"r": lora.r, "alpha": lora.alpha, "target_modules": lora.target_modules,
                                        "dropout": 0.0, "critic": self.critic is not None and lora.critic}}
        if self.shared_reference():
            out["reference"] = "the actor's base model with its adapters disabled (shares the actor's weights)"
        return out

    def _precision(self, roles: tuple[str, ...]) -> dict[str, dict[str, Any]]:
        """bench.model.precision's policy; a shared reference is held as the actor's base weights, not a copy."""
        policy = precision_policy(self.spec.model.dtype, roles, lora_roles=lora_roles(self.spec.train.lora))
        return with_shared_reference(policy) if self.shared_reference() else policy

    def _deepspeed_outcome(self, networks: dict[str, nn.Module], optimizers: dict[str, torch.optim.Optimizer]
                           ) -> tuple[dict[str, nn.Module], dict[str, torch.optim.Optimizer], dict[str, Any]]:
        """(networks, optimizers, record) for the result under ZeRO. The sharded optimizers are left out: their
        param groups hold DeepSpeed's flat fp32 partitions, not the modules' parameters, so the accounting (bench.
        telemetry.account_networks) counts what training needs from requires_grad instead, for whole networks. Under
        ZeRO-3 rank 0 gets whole copies of the trained networks (to evaluate and account; :meth:`whole_copy`)."""
        zero = self.zero
        if self.zero3:
            copies = {role: self.whole_copy(role) for role in self.deepspeed}  # every rank joins the gathers
            if self.rank == 0:
                networks = {**networks, **copies}
        record = {"zero_stage": zero["zero_stage"], "offload_optimizer_device": zero["offload_optimizer_device"],
                  "offload_param_device": zero["offload_param_device"], "sharded": sorted(self.deepspeed),
                  "frozen": "whole on every rank (replicated, not sharded)",
                  "config": self.deepspeed_config(),
                  "accounting": "whole networks (weights, gradients) without the sharded optimizer state; the "
                                "per-rank measured peaks show the sharding"}
        if self.zero3:
            record["generation"] = "inside a gather of the actor's partitions, DeepSpeed's hooks removed"
        return networks, {r: o for r, o in optimizers.items() if r not in self.deepspeed}, record

    def outcome(self, log_history: list[dict[str, float]], per_step: list[dict[str, float]],
                settings: dict[str, Any], metric_keys: tuple[str, ...]) -> TrainOutcome:
        """The trained actor, the resident networks, and first/last-fifth means of ``metric_keys``."""
        fifth = max(1, len(per_step) // 5)
        metrics: dict[str, Any] = {"rollout_steps": len(per_step), "optimizer_steps": self.optimizer_steps}
        for key in metric_keys:
            for name, points in (("first_fifth", per_step[:fifth]), ("last_fifth", per_step[-fifth:])):
                values = [p[key] for p in points if key in p]
                if values:
                    metrics[f"{key}_{name}"] = sum(values) / len(values)
        spreads = [p["zero_std_groups"] for p in per_step if "zero_std_groups" in p]
        if spreads:  # the mean over every step, not the logged ones: 1.0 means no step had a learning signal
            metrics["zero_std_groups_mean"] = sum(spreads) / len(spreads)
        roles = tuple(self.networks)
        settings = {**settings, **self._lora_settings(), "engine": "suite", "learning_rate": self.learning_rate,
                    "ppo_epochs": self.cfg.ppo_epochs, "minibatches": self.cfg.minibatches,
                    "optimizer_steps_per_rollout": self.cfg.ppo_epochs * self.cfg.minibatches,
                    "cliprange": self.cfg.cliprange, "missing_eos_penalty": self.cfg.missing_eos_penalty,
                    "micro_batch_size": self.micro_batch_size or "whole minibatch",
                    "logprob_temperature": self.spec.generation.temperature, "lr_schedule_unit": "rollout step",
                    "optimizers": f"AdamW ({self.adamw}) per network, grad clip per network",
                    "adamw_implementation": self.adamw,
                    "precision": self._precision(roles),
                    "generation": self.generation, **vllm_backend.backend_settings(self.actor, self.generation)}
        networks, optimizers = self.networks, dict(self.optimizers)
        counts = self.ctx.telemetry.counters  # sample() counts there, the one place counts are kept
        if self.deepspeed:
            networks, optimizers, settings["deepspeed"] = self._deepspeed_outcome(networks, optimizers)
        return TrainOutcome(
            policy=networks["actor"], tokenizer=self.tokenizer, networks=networks, optimizers=optimizers,
            log_history=log_history, steps=self.optimizer_steps,
            completions=counts["completions"], generated_tokens=counts["generated_tokens"],
            trained_tokens=self.trained_tokens, settings=settings, metrics=metrics,
        )


class CallbackEvents:
    """Calls ``transformers.TrainerCallback`` hooks in the Trainer's order, so that the same callbacks
    (telemetry's step timer and parameter snapshot, the progress reporter) attach to this engine as to TRL's.

    Hooks fired: on_train_begin (with model=), then per rollout step on_step_begin, on_step_end, on_log (every
    ``log_every`` steps), and on_train_end (with model=). The optimizer-step hooks are not fired: the engine
    reports its update phase itself.
    """

    def __init__(self, ctx: RunContext, total_steps: int) -> None:
        from transformers import TrainerControl, TrainerState, TrainingArguments

        from baselines.common import ProgressCallback

        self.args = TrainingArguments(output_dir=str(ctx.run_dir / "engine"), report_to=[], use_cpu=ctx.device == "cpu")
        self.state = TrainerState(max_steps=total_steps)
        self.control = TrainerControl()
        self.callbacks = [ctx.telemetry.trainer_callback(), ProgressCallback(ctx, total_steps)]

    def fire(self, event: str, **kwargs: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, event)(self.args, self.state, self.control, **kwargs)
