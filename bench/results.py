"""Result files: the one contract between the runs and the report.

Every run (a shared stage or a method) writes ``RUN_DIR/result.json`` atomically. The report reads
nothing else, so this docstring is the schema. All memory numbers are bytes, all times seconds.

```
{
  "schema_version": 1,
  "run_id": "grpo-s0",                 # stable id, also the run folder name
  "kind": "method" | "stage",          # stages: warm_start, sample_pool, reward_model
  "method": "grpo",                    # registry key (recipe name)
  "label": "GRPO (TRL)",               # human name shown in the report
  "engine": "trl" | "suite",           # which trainer implementation ran it
  "seed": 0,
  "status": "ok" | "failed" | "not_run",
  "error": null | {"type": "OutOfMemoryError", "message": "...", "memory_at_failure": "..."},
                                       # message: one line, at most 2,000 characters + "… (N more characters)"
                                       # (the whole text is in the run's traceback.txt / worker.log); type
                                       # "Interrupted": the suite was stopped (SIGINT / SIGTERM) during the run
  "inputs_hash": str | null,           # sha256 over the result.json of each stage the run read (null: none);
                                       # --resume re-runs a run whose stages' results changed since
  "started_at": "ISO-8601", "finished_at": "ISO-8601",
  "accuracy": {                        # evaluation on the held-out split (greedy)
    "n_questions": 1000,
    "before": {MODE: SCORE} | null,    # MODE: every entry of bench.task.verifier.MODES (suite-strict, suite-flexible,
    "after":  {MODE: SCORE} | null,    # lmeval-strict, lmeval-flexible); results before the rename: strict, flexible
    "format_rate": {"before": float | null, "after": float},     # share of completions suite-strict extracts from
    "truncated_rate": {"before": float | null, "after": float},  # share that hit max_new_tokens without EOS
    "prompt_style": "tags" | "cot" | "boxed"   # how the test questions were asked (bench.task.prompts)
  },                                   # SCORE = {"correct": int, "total": int, "accuracy": float,
                                       #          "low": float, "high": float}  (95% Wilson interval)
  "eval_file": "completions.jsonl" | null,  # every completion, one line per question in test order (same order
                                       # for every method): {index, id, prompt, completion, tokens, hit_max, gold,
                                       # gold_answer, extracted: {MODE: str | null}, correct: {MODE: bool}}
                                       # (bench.scoring.evaluation.completion_record; older runs: eval_after.jsonl, verdicts only)
  "samples": [{"question": str, "completion": str, "gold": str, "correct": bool}],  # a few, for the page
                                       # (correct: under the headline mode, suite-strict)
  "memory": {
    "peak_bytes": int | null,          # whole-run peak from `source`
    "source": "cpu-rss" | "cuda-allocated" | "cuda-reserved" | "nvml-process" | "nvml-device",
    "kind": str | null,                # what a per-phase reading of `source` is, see KIND below
    "baseline_bytes": int | null,      # reading after the models are loaded, before training (same source)
    "baseline_at": "on_train_begin (models loaded)"            # when it was read; the second only for a
                 | "recipe start (before models load)" | null, # recipe that fires no on_train_begin
    "phases": {PHASE: {"peak_bytes": int | null, "source": str, "kind": KIND,
                       "by_source": {SOURCE: int}, "kinds": {SOURCE: KIND}}},
                                       # KIND: "peak (reset per phase)" (cuda-allocated), "high-water mark"
                                       # (cuda-reserved, nvml-*: the allocator keeps its cache, so the figure
                                       # includes memory held since earlier phases), "sampled peak (reset per
                                       # phase)" (cpu-rss)
    "networks": {NET: {"params": int, "trainable_params": int, "weight_bytes": int, "buffer_bytes": int,
                       "grad_bytes": int, "grad_materialized": bool,      # False: some grads counted from shapes
                       "optimizer_bytes": int,
                       "optimizer_state_materialized": bool,  # False with 0 bytes: no step yet, size unknown
                       "partitioned_params": int,  # of params, counted by full shape (ds_numel): ZeRO-3 partitions
                       "shared_params": int,  # elements an earlier role already counted (not counted again)
                       "shared_with": [str]}}  # those earlier roles, e.g. ["actor"] for a LoRA reference (the
                                       # actor's base with adapters off: no weights of its own); NET: actor,
                                       # critic, reward, reference (bench.telemetry.accounting)
    # Several processes (bench.execution.launch.merge_rank_files), with peak_bytes then the max over the ranks:
    "ranks": [{"rank": int, "peak_bytes": int | null, "source": str, ...}],  # each rank's own readings
    "peak_bytes_max": int, "peak_bytes_sum": int,   # over the ranks (max: memory per device; sum: an upper bound)
    "peak_bytes_rank0": int | null, "peak_scope": str   # rank 0's own peak; what peak_bytes is a peak of
  },
  "throughput": {
    "wall_s": float,                   # the whole worker, load + train + eval
    "train_s": float | null,           # first on_train_begin -> last on_train_end (the rates divide by it)
    "setup_s": float | null,           # recipe start -> first on_train_begin (model loading, trainer set-up)
    "recipe_s": float | null,          # the whole recipe (setup + train + what follows on_train_end)
    "timing": "first on_train_begin to last on_train_end"    # the window train_s covers; a recipe that
            | "whole recipe (no on_train_begin fired)"       # fires no on_train_begin is timed whole
            | "on_train_begin to recipe end (no on_train_end fired)",
    "steps": int,
    "completions": int, "generated_tokens": int, "trained_tokens": int | null,
    "completions_per_s": float | null, "tokens_per_s": float | null,   # generated tokens per train second
    "trained_tokens_per_s": float | null,
    "step_s_median": float | null, "step_s_p90": float | null,
    "processes": int                   # several processes only: completions and tokens are summed over the ranks
  },
  "phases": {PHASE: {"time_s": float, "count": int}},   # PHASE: generation, reward, reference, critic,
                                                        # advantage (suite engine only), update, evaluation,
                                                        # other (see PHASES)
  "training_change": null | {          # method runs: did training move the trained weights? (param_change)
    "params_changed_fraction": float | null,   # share of trainable elements whose value changed (new != old)
    "update_to_weight_ratio": float | null,    # ||w_end - w_start|| / ||w_start||, L2 over trainable elements
    "trainable_params": int | null,            # requires_grad elements (LoRA: the adapters)
    "method": "exact" | "sampled (N elements)" | null,
    "reason": str,                             # only when not measured: why
    "weight_decay_floor": float,               # the ratio weight decay alone gives: 1 - (1 - lr wd)^steps
    "moved_beyond_floor": bool | null,         # update_to_weight_ratio above that floor (param_change)
    "verdict": str                             # param_change.VERDICTS: "moved", "no learning signal", "within the
  },                                           # weight-decay floor", "mostly rounded away", "unchanged (learning
                                               # rate 0)", "not moved", "not measured"
  "learning_signal": null | {          # method runs: did the reward ever tell a prompt's completions apart?
    "zero_std_groups_mean": float | null,      # share of groups whose G rewards were equal (null: no groups, DPO)
    "source": str,                             # where it was read (engine: every step; TRL: its logged points)
    "no_learning_signal": bool | null          # true: every group of every step had equal rewards (advantage 0)
  },
  "evaluation": {                      # runs that evaluated: the numerics the policy was scored in (bench.model.numerics)
    "precision": {"storage": str, "compute": "bfloat16 autocast, float32 residual stream" | "float32"},
    "before_precision": {...} | null,          # the warm start's (the 'before' score's); null: none read
    "same_numerics": bool | null               # before and after scored alike (false: a precision shift)
  },
  "generation": null | {str: value},   # the decoding settings of the evaluation (GenerationConfig fields)
  "data_checks": {                     # every run (stages too), recorded before training (bench.task.data.TaskData)
    "question_overlap": int,           # test problems whose question text is also a training question (0 expected)
    "working_overlap": int,            # synthetic task only: test problems sharing their working (operations,
                                       # operands, results) with a training problem (0 expected)
    "held_out_by": str                 # how the splits were kept apart (a hash of the working; GSM8K: its files)
  },                                   # (other keys ending in _overlap: counts of test problems too)
  "monitors": {                        # runs that evaluated (absent otherwise)
    "eval": {MONITOR: float}           # bench.telemetry.monitors.record_monitors of the completions in eval_file:
  },                                   # completion_length(_p90), truncated_rate, empty_answer_rate,
                                       # format_only_rate, repetition_rate, repeated_ngram_rate,
                                       # answer_in_think_rate, reflection_rate, reflection_count
  "trackers": {                        # runs whose telemetry.report_to is not [none] (bench.telemetry.trackers)
    "report_to": [str], "opened": [str],       # asked for; started (a tracker that could not start: a warning)
    "run_name": str,                           # "<suite folder>/<run id>", the run's name in every tracker
    "tensorboard_dir": "tensorboard",          # when TensorBoard opened: its event files, in the run's folder
    "warnings": [str]                          # a tracker that failed to start, log or close; the numbers stand
  },
  "curves": [{"step": int, METRIC: float, ...}],        # stable metric names, see METRIC_NAMES
  "metrics": {str: float | int | str,                   # method-specific scalars (e.g. reward-model pair acc;
                                                        # "monitor_problems": str, TRL GRPO only, present when
                                                        # its monitors were missing or partial, trl_hooks)
              "lengths": LENGTHS},                      # TRL trainers with a max_length: SFT warm start, DPO,
                                                        # reward model (bench.task.lengths.LengthBudget)
  "settings": {str: value,                              # method-specific settings ("what differs" table)
               "precision": {NET: {"storage": "float32" | "bfloat16",          # dtype the weights are kept in (LoRA: the base)
                                   "adapters": "float32",                      # LoRA only: the trained adapters
                                   "compute": "bfloat16 autocast" | "float32" | "bfloat16",  # frozen ones too
                                   "optimizer_state": "float32" | null,        # null: frozen (bench.model.precision)
                                   "shared_with": "actor"}},  # reference only, LoRA on the suite's engine: it
                                       # runs the actor's own weights (adapters off), so it has the actor's
                                       # storage and compute (bench.model.precision.with_shared_reference)
               "lora": {"r": int, "alpha": int, "target_modules": str, "dropout": 0.0,
                        "critic": bool},  # suite engine with train.lora on: the adapters (critic: PPO's critic
                                       # has its own adapters + a trained value head, else trains every weight)
               "reference": str,       # suite engine with LoRA: "the actor's base model with its adapters
                                       # disabled (shares the actor's weights)"
               "parallel": {"launcher": "none" | "accelerate", "processes": int, "backend": str | null,
                            "strategy": "ddp" | "deepspeed-zero<k>[-offload]",   # what ran
                            "config_strategy": str,  # what the accelerate config asked for (bench.execution.launch)
                            "note": str},            # e.g. the suite engine ran DDP under a ZeRO config
               "generation_backend": "transformers" | "vllm",   # TRL GRPO (baselines/grpo.py); absent: transformers
               "vllm": {"mode": "colocate", "gpu_memory_utilization": float, ...},   # with the vllm backend only
               "generation": {GenerationConfig field: value}},  # sampling settings (online methods, pool)
                                                        # LENGTHS = {"max_length": int (tokens), "examples": int,
                                                        #   "truncated": int, "dropped": int, "longest": int
                                                        #   (tokens), "cap": int | null, "unit": "examples" | "pairs"}
  "environment": {...},                                 # see bench.telemetry.environment
  "spec": {...}                                         # the fully resolved spec
}
```

Numbers: every number under ``accuracy``, ``memory``, ``throughput``, ``phases`` and ``training_change`` is a
measurement and finite (JSON has no NaN; Python's json writes and reads ``NaN`` and ``Infinity`` anyway): an ok
result holding a non-finite one there is malformed (:func:`result_problems`), so ``--resume`` re-runs it and the
report shows it failed with the keys named. ``curves``, ``metrics`` and ``monitors`` may hold NaN where a value is
undefined (``explained_variance`` when the returns do not vary); the report shows it as not measured, never as
``nan``.

The suite folder's ``suite.json`` (bench.execution.suite_folder writes it) is a JSON object with ``runs``, the
planned run ids in order (each one file name: no '/', not '.' or '..'; older folders and tests may list
``{"id": ...}`` objects), and, when present, ``preset`` and ``description`` (strings), ``spec``, ``commands`` and
``last_run`` (objects); :func:`suite_problems` says what is wrong with one, and ``bench report``, ``bench score``
and ``bench compare`` refuse a folder whose ``suite.json`` has problems before writing anything.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, TextIO

SCHEMA_VERSION = 1
RESULT_FILE = "result.json"
SUITE_FILE = "suite.json"
"""The suite folder's own file: preset, resolved spec, planned run ids (see the module docstring)."""

PHASES = ("generation", "reward", "reference", "critic", "advantage", "update", "evaluation", "other")
"""Phase names, in the order the report stacks them (``advantage``: the suite engine's group-relative advantage
or GAE + whitening, timed on its own; TRL's trainers compute it inside another phase)."""


@dataclass(frozen=True)
class Metric:
    """One stable curve metric: what it measures (and who logs it) and its unit."""

    meaning: str
    unit: str


_SHARE = "share in [0, 1]"
_REWARD = "reward units (accuracy_weight + format_weight scale)"

METRIC_NAMES: dict[str, Metric] = {
    # -- the rollout: what the policy produced and what it scored (suite engine: Engine.verify; TRL GRPO) --
    "reward": Metric("mean verifier reward of the step's completions: accuracy + format - length penalty", _REWARD),
    "reward_std": Metric("standard deviation of the step's verifier rewards over its completions", _REWARD),
    "accuracy_reward": Metric("mean accuracy reward (1 when the strict answer is right, else 0)", _SHARE),
    "format_reward": Metric("mean format reward (1 for exactly <think>...</think><answer>...</answer>, else 0)",
                            _SHARE),
    "completion_length": Metric("mean completion length, up to and including the first EOS "
                                "(bench.model.generation.completion_length)", "tokens"),
    "completion_length_p90": Metric("90th percentile of the step's completion lengths (bench.scoring.stats.percentile, "
                                    "linear; bench.telemetry.monitors)", "tokens"),
    "eos_rate": Metric("share of completions that emitted EOS within generation.max_new_tokens", _SHARE),
    "truncated_rate": Metric("share of completions that hit max_new_tokens without EOS (TRL: "
                             "completions/clipped_ratio; bench.telemetry.monitors)", _SHARE),
    "empty_answer_rate": Metric("share of completions with no answer a strict extraction finds "
                                "(bench.task.rewards.degenerate_stats)", _SHARE),
    "repetition_rate": Metric("share of completions with a back-to-back repetition loop "
                              "(bench.task.rewards.has_repetition)", _SHARE),
    "format_only_rate": Metric("share of completions with the right format but a wrong answer (reward hacking "
                               "monitor, bench.task.rewards.degenerate_stats)", _SHARE),
    "repeated_ngram_rate": Metric("share of completions in which some 4-word n-gram occurs 3+ times anywhere "
                                  "(reward hacking monitor, bench.telemetry.monitors)", _SHARE),
    "answer_in_think_rate": Metric("share of completions whose strict answer also appears as a number inside "
                                   "the <think> block (bench.telemetry.monitors)", _SHARE),
    "reflection_rate": Metric("share of completions with at least one reflection phrase ('wait', 'let me "
                              "check', 'verify', ...; the 'aha' monitor, bench.telemetry.monitors)", _SHARE),
    "reflection_count": Metric("mean number of reflection phrases per completion (the 'aha' monitor, "
                               "bench.telemetry.monitors)", "phrases per completion"),
    "length_penalty_reward": Metric("mean length-penalty term of the reward, -length_penalty x max(0, tokens - "
                                    "length_threshold) (<= 0; TRL: rewards/length_penalty/mean)", _REWARD),
    "missing_eos_penalty_reward": Metric("mean missing-EOS term of the score, -missing_eos_penalty for a "
                                         "completion without EOS (<= 0; score = source + this)", _REWARD),
    "score": Metric("mean score the advantage is computed from: the reward source (verifier or reward model) "
                    "after the missing-EOS penalty", "reward units of the source"),
    "rm_score": Metric("mean raw reward-model score (PPO with reward: model), before the missing-EOS penalty",
                       "reward-model logit"),
    "zero_std_groups": Metric("share of prompt groups whose G scores were identical (zero advantage, no signal)",
                              _SHARE),
    "dynamic_sampling_rounds": Metric("DAPO's extra generation rounds this step (new prompts in place of groups "
                                      "whose G rewards were equal; at most its max_extra_rounds)", "rounds"),
    "dynamic_sampling_completions": Metric("completions DAPO generated this step beyond the matched batch (counted "
                                           "against it in generated completions and tokens)", "completions"),
    "dynamic_sampling_filled": Metric("share of the trained batch's groups that had no signal, kept to fill the batch "
                                      "when the extra rounds ran out", _SHARE),
    "overlong_penalty_reward": Metric("mean of DAPO's soft overlong penalty added to the reward (0 to -1)", _REWARD),
    # -- against the reference -------------------------------------------------------------------------------
    "kl": Metric("mean KL(policy || reference) estimate per completion token (PPO: its kl_estimator at rollout; "
                 "GRPO: k3 in the loss; 0 without a reference)", "nats per token"),
    "non_score_reward": Metric("PPO's KL penalty -kl_coef x KL summed over a completion's tokens, mean over "
                               "completions", _REWARD),
    # -- the sampler against the trainer (generation.backend vllm: vLLM samples, the trainer scores) -------------
    "sampler_logprob_abs_diff": Metric("mean |log-prob of the trainer before the update - vLLM's own log-prob| over "
                                       "the step's completion tokens (suite engine; 0 when both agree)",
                                       "nats per token"),
    "sampler_kl": Metric("KL(vLLM sampler || trainer) per completion token, k3 estimate over the tokens vLLM "
                         "sampled (suite engine)", "nats per token"),
    # -- the critic (PPO) --------------------------------------------------------------------------------------
    "explained_variance": Metric("1 - Var(returns - values) / Var(returns) over real tokens, at rollout "
                                 "(1: the critic predicts the returns; <= 0: no better than their mean)", "ratio"),
    "value_mean": Metric("mean critic value over real tokens at rollout", _REWARD),
    "value_loss": Metric("PPO's clipped value loss 0.5 x max((V - R)^2, (V_clipped - R)^2), aggregated as "
                         "the loss", "squared reward units"),
    "vf_clipfrac": Metric("share of tokens where the clipped value error was the larger", _SHARE),
    # -- the update ------------------------------------------------------------------------------------------
    "loss": Metric("training loss the optimizer step minimised (suite PPO: policy_loss + vf_coef x value_loss)",
                   "the method's loss units"),
    "policy_loss": Metric("suite PPO: the clipped policy-gradient term of the loss", "the method's loss units"),
    "entropy": Metric("mean entropy of the policy's next-token distribution over completion tokens",
                      "nats per token"),
    "clipfrac": Metric("share of tokens where the clipped surrogate was active (PPO; TRL GRPO: "
                       "clip_ratio/region_mean)", _SHARE),
    "approx_kl": Metric("mean 0.5 x (log p - log p_old)^2 per token: how far the update moved the policy from "
                        "the rollout policy", "nats per token"),
    "ratio": Metric("mean policy ratio exp(log p - log p_old) per token (1: the rollout policy)", "ratio"),
    "ratio_std": Metric("spread (population std) of the importance ratios the update's losses saw, under the loss's "
                        "token weights, pooled over the step's optimizer steps (GSPO: its sequence ratio on each "
                        "token; 0 with one update per rollout)", "ratio"),
    "learning_rate": Metric("the actor's learning rate at the step", "per optimizer step (AdamW lr)"),
    "grad_norm": Metric("L2 norm of the actor's gradient before clipping at train.max_grad_norm (TRL and the "
                        "engine: the value clip_grad_norm_ returns)", "gradient L2 norm"),
    # -- preference pairs (DPO, the reward-model stage) and supervised warm start -----------------------------
    "pair_accuracy": Metric("share of (chosen, rejected) pairs scored chosen above rejected (DPO: implicit "
                            "reward; reward model: its score)", _SHARE),
    "heldout_pair_accuracy": Metric("reward-model stage: share of held-out pairs (one per held-out question, no "
                                    "question shared with training) its score ranks chosen above rejected",
                                    _SHARE),
    "train_pair_accuracy": Metric("reward-model stage: the same share on a fixed sample of its training pairs "
                                  "(one per training question), beside the held-out one to show over-fitting",
                                  _SHARE),
    "margin": Metric("mean score of chosen minus rejected (DPO: implicit reward beta x log-ratio; reward model: "
                     "its score)", "reward units of the scorer"),
    "chosen_reward": Metric("DPO's mean implicit reward of the chosen completion, beta x log(pi / pi_ref)",
                            "beta x nats"),
    "rejected_reward": Metric("DPO's mean implicit reward of the rejected completion, beta x log(pi / pi_ref)",
                              "beta x nats"),
    "token_accuracy": Metric("share of target tokens the model's argmax predicts (SFT warm start)", _SHARE),
}
"""Every curve metric any method writes (``result["curves"]`` keys besides ``step``), with its meaning and unit.

The one table: recipes map TRL's log keys onto these names (:func:`curve_names`), the suite engine logs them
directly, the report's figures draw a subset, and ``tests/test_metrics.py`` checks all three. Adding a metric
means adding it here first; a name missing from this table fails at import (recipes) or in that test (engine).
"""


def unknown_metrics(names: Iterable[str]) -> list[str]:
    """The names that are not in :data:`METRIC_NAMES` (``step``, the x-axis, is not a metric), in order."""
    return [name for name in names if name not in METRIC_NAMES]


def curve_names(mapping: dict[str, str]) -> dict[str, str]:
    """``mapping`` (a trainer's log key -> a suite metric name), checked: every target is in :data:`METRIC_NAMES`.

    Raises ValueError naming the unknown targets and the closest known names, so a typo in a recipe's table
    fails when the recipe is imported instead of silently dropping a curve from the report.
    """
    unknown = unknown_metrics(mapping.values())
    if unknown:
        hints = [f"{name!r}" + (f" (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(
            name, METRIC_NAMES, n=1)) else "") for name in unknown]
        raise ValueError(f"curve metric name(s) {', '.join(hints)} not in bench.results.METRIC_NAMES; "
                         f"add them there with their meaning and unit")
    return mapping


def write_atomic(path: Path, write: Callable[[TextIO], None]) -> Path:
    """Write a text file so that a reader (or a crash, or a full disk) sees the old file or the new one, never a
    half-written one: ``write(handle)`` fills a temporary file beside ``path``, which is fsynced and renamed over it.

    The new file keeps the mode of the one it replaces, else gets the user's usual mode (0666 less the umask, which
    ``os.open`` applies; ``tempfile.mkstemp`` would make every result and report private, 0600). Raises OSError when
    the folder cannot be written; a failure removes the temporary file and leaves an earlier ``path`` as it was.
    """
    path = Path(path)
    mode = path.stat().st_mode & 0o777 if path.exists() else None
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically (:func:`write_atomic`), making the folder first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda handle: json.dump(data, handle, indent=2, sort_keys=False, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def read_result(run_dir: Path) -> dict[str, Any] | None:
    """The run's result, or None when it is missing, unreadable or of another schema version."""
    data = _load_json(Path(run_dir) / RESULT_FILE)
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        return None
    return data


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested thousands of levels deep
        return None


STATUSES = ("ok", "failed", "not_run")
KINDS = ("method", "stage")

_NUMBER = (int, float)
_REQUIRED: dict[str, tuple[type, ...]] = {
    "schema_version": (int,), "run_id": (str,), "kind": (str,), "method": (str,), "label": (str,), "engine": (str,),
    "seed": (int,), "status": (str,),
}
"""Top-level keys every result has, with their types (the docstring above is the full schema)."""

_REQUIRED_OK: dict[str, tuple[type, ...]] = {
    "started_at": (str,), "finished_at": (str,), "accuracy": (dict,), "samples": (list,), "memory": (dict,),
    "throughput": (dict,), "phases": (dict,), "curves": (list,), "metrics": (dict,), "settings": (dict,),
    "environment": (dict,), "spec": (dict,),
}
"""Further keys an ``ok`` result has: what the report reads from a finished run."""


def result_problems(data: Any) -> list[str]:
    """Why ``data`` is not a well-formed result (empty when it is): missing keys, wrong types, bad values.

    ``--resume`` reuses only an ok result with no problems, so a truncated, hand-edited or foreign file is re-run
    rather than shown as a finished run. The checks cover the shape the report relies on, not every number.
    """
    if not isinstance(data, dict):
        return [f"not a JSON object ({type(data).__name__})"]
    problems = _type_problems(data, _REQUIRED)
    if data.get("schema_version") != SCHEMA_VERSION:
        problems.append(f"schema_version {data.get('schema_version')!r}, expected {SCHEMA_VERSION}")
    if data.get("status") not in STATUSES:
        problems.append(f"status {data.get('status')!r} is not one of {', '.join(STATUSES)}")
    if data.get("kind") not in KINDS:
        problems.append(f"kind {data.get('kind')!r} is not one of {', '.join(KINDS)}")
    if data.get("status") == "ok":
        problems += _ok_problems(data)
    return problems


def _type_problems(data: dict[str, Any], required: dict[str, tuple[type, ...]]) -> list[str]:
    problems = []
    for key, types in required.items():
        if key not in data:
            problems.append(f"missing '{key}'")
        elif not isinstance(data[key], types) or (isinstance(data[key], bool) and bool not in types):
            problems.append(f"'{key}' is {type(data[key]).__name__}, expected {' or '.join(t.__name__ for t in types)}")
    return problems


def _ok_problems(data: dict[str, Any]) -> list[str]:
    """The parts of an ok result the report and the consumers of a stage read."""
    problems = _type_problems(data, _REQUIRED_OK)
    if data.get("error") is not None:
        problems.append("status ok with an error")
    throughput = data.get("throughput")
    if isinstance(throughput, dict) and not isinstance(throughput.get("wall_s"), _NUMBER):
        problems.append("'throughput.wall_s' missing or not a number")
    accuracy = data.get("accuracy")
    if isinstance(accuracy, dict):
        for when in ("before", "after"):
            if not isinstance(accuracy.get(when), (dict, type(None))):
                problems.append(f"'accuracy.{when}' is {type(accuracy.get(when)).__name__}, expected dict or null")
    memory = data.get("memory")
    if isinstance(memory, dict) and not isinstance(memory.get("networks", {}), dict):
        problems.append("'memory.networks' is not a dict")
    bad = [key for section in MEASURED for key in nonfinite_keys(data.get(section), section)]
    if bad:
        problems.append(f"non-finite number(s) where a measurement belongs: {', '.join(bad[:5])}"
                        + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""))
    words = [key for section in MEASURED for key in text_keys(data.get(section), section)]
    if words:
        problems.append(f"text where a measurement belongs: {', '.join(words[:5])}"
                        + (f" and {len(words) - 5} more" if len(words) > 5 else ""))
    return problems


NUMBER_SUFFIXES = ("_bytes", "_s", "_per_s", "_rate", "_fraction", "_ratio", "_params", "_tokens", "_pairs")
NUMBER_KEYS = frozenset({"steps", "completions", "count", "accuracy", "correct", "total", "low", "high",
                         "n_questions", "processes", "rank", "params", "floor", "weight_decay_floor", "prompts"})
"""Keys of the measured sections (:data:`MEASURED`) that hold a number by the schema (peak_bytes, tokens_per_s,
time_s, the scores): text under one (``tokens_per_s: "fast"``) is not a measurement. Other keys (a memory source, the
timing window, a verdict, a list of sources) hold words by design and are left alone."""


def _is_number_key(key: Any) -> bool:
    return isinstance(key, str) and (key in NUMBER_KEYS or key.endswith(NUMBER_SUFFIXES))


def text_keys(value: Any, prefix: str = "", depth: int = 0) -> list[str]:
    """Dotted keys of the strings in ``value`` held under a number's key (:func:`_is_number_key`; nested dicts and
    lists, 32 levels at most)."""
    if depth >= 32:
        return []
    if isinstance(value, dict):
        out = []
        for key, item in value.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(item, str) and _is_number_key(key):
                out.append(name)
            elif isinstance(item, (dict, list)):
                out += text_keys(item, name, depth + 1)
        return out
    if isinstance(value, list):
        return [k for i, item in enumerate(value) for k in text_keys(item, f"{prefix}[{i}]", depth + 1)]
    return []
    if isinstance(value, dict):
        return [k for key, item in value.items() if key not in TEXT_FIELDS
                for k in text_keys(item, f"{prefix}.{key}" if prefix else str(key), depth + 1)]
    if isinstance(value, list):
        return [k for i, item in enumerate(value) for k in text_keys(item, f"{prefix}[{i}]", depth + 1)]
    return []


MEASURED = ("accuracy", "memory", "throughput", "phases", "training_change")
"""The sections of a result whose every number is a measurement and must be finite (see the module docstring)."""


def nonfinite_keys(value: Any, prefix: str = "", depth: int = 0) -> list[str]:
    """Dotted keys of the NaN and infinite floats in ``value`` (nested dicts and lists, 32 levels at most)."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [prefix or "(the value)"]
    if depth >= 32:
        return []
    if isinstance(value, dict):
        return [k for key, item in value.items() for k in nonfinite_keys(item, f"{prefix}.{key}" if prefix else
                                                                          str(key), depth + 1)]
    if isinstance(value, list):
        return [k for i, item in enumerate(value) for k in nonfinite_keys(item, f"{prefix}[{i}]", depth + 1)]
    return []


MAX_RUNS = 10_000
"""Most runs one suite plans (bench.execution.plan.make_plan refuses more): a sweep's 256 points times a few methods
and seeds. A suite.json listing more was not written by `bench run`, and reading it would take the report hours."""


def is_run_id(value: Any) -> bool:
    """One file name: a run folder under runs/ (no '/', no NUL, not '.' or '..', at most 255 bytes)."""
    return (isinstance(value, str) and bool(value) and value not in (".", "..") and "/" not in value
            and "\\" not in value and "\0" not in value and len(value.encode("utf-8", "surrogatepass")) <= 255)


def suite_problems(data: Any) -> list[str]:
    """Why ``data`` (a parsed suite.json) is not one `bench run` writes (empty when it is); see the module docstring.

    What the report, `bench score` and `bench compare` need before they write into (or beside) a folder: an object,
    ``runs`` a list of run ids that each name one folder under runs/, and the optional keys of their types.
    """
    if not isinstance(data, dict):
        return [f"not a JSON object ({type(data).__name__})"]
    problems = []
    runs = data.get("runs")
    if not isinstance(runs, list):
        problems.append("missing 'runs' (the planned run ids)" if runs is None
                        else f"'runs' is {type(runs).__name__}, expected a list of run ids")
    elif len(runs) > MAX_RUNS:
        problems.append(f"'runs' lists {len(runs):,} run ids; a suite plans at most {MAX_RUNS:,}")
    else:
        for i, entry in enumerate(runs):
            run_id = (entry.get("id") or entry.get("run_id")) if isinstance(entry, dict) else entry
            if not is_run_id(run_id):
                problems.append(f"'runs[{i}]' is not a run id (one folder name under runs/): "
                                f"{cap_text(repr(run_id), 80)}")
                break
    for key, types in (("preset", (str,)), ("description", (str,)), ("created_at", (str,)), ("spec", (dict,)),
                       ("commands", (dict,)), ("last_run", (dict,))):
        if data.get(key) is not None and not isinstance(data[key], types):
            problems.append(f"'{key}' is {type(data[key]).__name__}, expected {types[0].__name__}")
    return problems


def read_suite_file(suite_dir: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """(suite.json's data, []) or (None, why it cannot be used): missing, unreadable, not JSON, or
    :func:`suite_problems`."""
    path = Path(suite_dir) / SUITE_FILE
    if not path.is_file():
        return None, [f"no {SUITE_FILE}"]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        return None, [f"{SUITE_FILE} is not UTF-8 text"]
    except (OSError, ValueError, RecursionError) as exc:
        return None, [f"{SUITE_FILE} is not readable JSON ({type(exc).__name__})"]
    problems = suite_problems(data)
    return (None, problems) if problems else (data, [])


def incomplete_reason(run_dir: Path, inputs_hash: str | None = None) -> str | None:
    """Why the run in ``run_dir`` cannot be reused by ``--resume`` (None when it can).

    Reusable means: an ok result of this schema, with the shape :func:`result_problems` checks, written for this
    run id, and (when ``inputs_hash`` is given) from the same inputs: a run that read a shared stage's output
    records that output's hash, so re-running the stage makes its consumers stale.
    """
    path = Path(run_dir) / RESULT_FILE
    if not path.exists():
        return "no result"
    data = _load_json(path)
    if data is None:
        return "result.json unreadable"
    problems = result_problems(data)
    if problems:
        return f"invalid result ({'; '.join(problems[:3])}{'; ...' if len(problems) > 3 else ''})"
    if data["status"] != "ok":
        return f"status {data['status']}"
    if data["run_id"] != Path(run_dir).name:
        return f"invalid result (run_id {data['run_id']!r} in the folder of {Path(run_dir).name!r})"
    if inputs_hash is not None and data.get("inputs_hash") != inputs_hash:
        return "its inputs changed (a stage it reads was re-run)"
    return None


def is_complete(run_dir: Path, inputs_hash: str | None = None) -> bool:
    """True when the run finished successfully and its result can be reused by ``--resume``
    (see :func:`incomplete_reason`)."""
    return incomplete_reason(run_dir, inputs_hash) is None


def file_hash(path: Path) -> str | None:
    """sha256 of a file's bytes (None when it cannot be read): how a run names the stage output it consumed."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


MESSAGE_LIMIT = 2000
"""Characters of a failure message kept in result.json (the whole text goes to traceback.txt)."""


_CAPPED = re.compile(r"… \((\d[\d,]*) more characters\)\Z")


def cap_text(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with "… (N more characters)" appended when it was longer.

    Failure reasons can embed whole logs; the full text stays in the run's worker.log / traceback.txt. Capping
    again is exact: a text already cut to at most ``limit`` is returned as it is, one cut to more is cut further
    with N counting from the original text (the report caps what it loads, then what it shows).
    """
    text = str(text)
    if len(text) <= limit:
        return text
    body, more = text, 0
    capped = _CAPPED.search(text)
    if capped:
        if capped.start() <= limit:
            return text
        body, more = text[:capped.start()], int(capped.group(1).replace(",", ""))
    return f"{body[:limit]}… ({len(body) - limit + more:,} more characters)"


def empty_result(run_id: str, kind: str, method: str, label: str, engine: str, seed: int) -> dict[str, Any]:
    """A result skeleton with every top-level key present, status ``not_run``."""
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "kind": kind,
        "method": method,
        "label": label,
        "engine": engine,
        "seed": seed,
        "status": "not_run",
        "error": None,
        "started_at": None,
        "finished_at": None,
        "accuracy": {"n_questions": 0, "before": None, "after": None},
        "eval_file": None,
        "samples": [],
        "memory": {"peak_bytes": None, "source": None, "baseline_bytes": None, "phases": {}, "networks": {}},
        "throughput": {},
        "phases": {},
        "training_change": None,
        "learning_signal": None,
        "generation": None,
        "curves": [],
        "metrics": {},
        "settings": {},
        "environment": {},
        "spec": {},
    }
