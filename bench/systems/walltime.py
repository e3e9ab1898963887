"""`bench estimate --time`: a wall-time PROJECTION of a preset's whole suite run on a GPU type, never a measurement.

    bench estimate --time --preset gsm8k-qwen0.5b --gpu-type h100 [--gpus 8] [--calibrate DIR ...] [--json]
                   [key.path=value ...]

For every run of the plan `bench run` makes (:func:`bench.execution.plan.make_plan`, handed in by bench.cli, which
sits above both: the shared stages, then each method x seed) and each of its phases (generation, reference, reward, critic, update, evaluation) it counts the
*work* from the preset's budget (train.steps, prompts_per_step, group_size, max_new_tokens, the evaluation's
questions, the warm start's steps, the sample pool, the reward model's epochs and pairs) and the model's shape
(:func:`bench.systems.memory_model.shape_fields_from_spec`, the memory estimate's reading of a config.json or a
shipped shape): tokens, FLOPs and bytes read. It divides that work by a *rate* that is

- **assumed**: decode steps are bandwidth-bound, so their time is the bytes they read (the weights the step
  multiplies by, and the KV cache of every sequence) over the GPU's datasheet HBM bandwidth x
  :data:`BANDWIDTH_EFFICIENCY` (or, where larger, their FLOPs over the compute rate: a roofline per step); every
  forward and backward (prefill, reference, critic, reward model, update) is its FLOPs over the datasheet dense bf16
  peak x :data:`MFU`; AdamW's step is the bytes it moves over the same bandwidth; the rule verifier scores
  :data:`VERIFIER_COMPLETIONS_PER_S` completions a second on the CPU; each run costs :data:`STARTUP_S` outside its
  phases (worker start, loading and saving networks, vLLM's engine start); or
- **measured**: from the phase timings of finished runs in a suite folder (``--calibrate``, e.g. the ``step1/``
  ``scripts/gpu_check.sh`` writes: ``runs/<run>/result.json`` with ``phases.<phase>.time_s`` and the run's whole
  resolved ``spec``). For each (run name, phase) it timed, the measured seconds over the seconds the assumed rates
  give that run's own work is the factor by which the measured rate is slower than the assumed one; that factor
  replaces the assumed rate for the same phase of the same run name here, and for no other phase or run name.
  Its start-up is the run's ``throughput.wall_s`` less its six phases.

The total is given for one GPU (every run one after another) and for ``--gpus`` N with the placement `bench run`
would use (:func:`bench.execution.devices.plan_devices`): the stages one at a time, then the method runs in plan
order, each on the first slot (GPU, or GPU group under a launcher) to come free, so the total is the stages plus the
list schedule's critical path, not the sum over N.

The assumed rates are a roofline: they leave out kernel-launch latency, Python, the sampler, elementwise work
(log-softmax over the vocabulary, the advantage) and communication, which at 0.5B parameters decide most of the
time, so an uncalibrated projection is a lower bound. Units: seconds, tokens, FLOPs, bytes, bytes/s, FLOP/s; hours
only in the totals.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from bench.errors import UserError


@dataclass(frozen=True)
class Gpu:
    """One GPU type's datasheet figures."""

    name: str
    bandwidth: float
    """HBM (L40S: GDDR6) bandwidth, bytes/s."""
    bf16_flops: float
    """Dense (no sparsity) bf16 tensor-core peak, FLOP/s."""
    memory_gb: int
    """Memory, GB (information only: whether a run fits is `bench estimate --model`'s question)."""
    source: str


GPUS: dict[str, Gpu] = {
    "h100": Gpu("NVIDIA H100 SXM5 80GB", 3.35e12, 989e12, 80,
                "NVIDIA H100 Tensor Core GPU datasheet (SXM): 3.35 TB/s HBM3, 989 TFLOP/s dense bf16 "
                "(1,979 with sparsity)"),
    "h200": Gpu("NVIDIA H200 SXM 141GB", 4.8e12, 989e12, 141,
                "NVIDIA H200 Tensor Core GPU datasheet (SXM): 4.8 TB/s HBM3e, 989 TFLOP/s dense bf16 "
                "(1,979 with sparsity)"),
    "a100-80gb": Gpu("NVIDIA A100 80GB SXM4", 2.039e12, 312e12, 80,
                     "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): 2,039 GB/s HBM2e, 312 TFLOP/s dense bf16 "
                     "(624 with sparsity)"),
    "l40s": Gpu("NVIDIA L40S 48GB", 0.864e12, 362e12, 48,
                "NVIDIA L40S datasheet: 864 GB/s GDDR6, 362 TFLOP/s dense bf16 (733 with sparsity)"),
}
"""--gpu-type -> the vendor's datasheet figures (peaks, not what a run sustains: see the efficiencies)."""

BANDWIDTH_EFFICIENCY = 0.5
"""Assumed share of the datasheet bandwidth a decode step (and AdamW's step) sustains; not measured."""
MFU = 0.30
"""Assumed model FLOPs utilisation: the share of the dense bf16 peak a forward or backward sustains; not measured."""
VERIFIER_COMPLETIONS_PER_S = 10_000.0
"""Assumed completions a second the rule verifier (regular expressions on the CPU) scores; not measured."""
STARTUP_S = 60.0
"""Assumed seconds a run spends outside its phases (worker start and imports, loading and saving the networks,
vLLM's engine start, the 'advantage' and 'other' phases); not measured."""
ADAMW_BYTES_PER_PARAMETER = 28
"""Bytes AdamW moves per trained parameter per optimizer step: reads the float32 weight, gradient and both moments
(16), writes the weight and both moments (12)."""
PROMPT_TOKENS = 256
"""Assumed tokens per prompt: the memory model's padded prompt length (``bench.systems.memory_terms.Settings``; a
GSM8K question in a chat template is about 100-250)."""

PHASES = ("generation", "reference", "reward", "critic", "update", "evaluation")
"""The phases projected (bench.results.PHASES less 'advantage' and 'other', which fall in the start-up)."""
STARTUP = "start-up"
"""The per-run cost outside the phases, shown as a column of its own."""
WORK_ASSUMPTIONS = (
    f"prompts {PROMPT_TOKENS} tokens; every completion max_new_tokens long (an upper bound: a generate call lasts "
    f"until its longest completion anyway)",
    "the reward model trains on one pair per pool prompt (an upper bound: a verifier pair needs a right and a wrong "
    "sample of the prompt)",
    "causal attention reads half the sequence on average; with train.lora, adapters on every linear layer; a "
    "launched run's phases divide by its processes (no communication)",
    "DAPO's dynamic sampling at the matched batch: each extra round it draws (at most max_extra_rounds a step) adds "
    "generation and scoring not counted here, so its generation and reward are lower bounds, at most "
    "(1 + max_extra_rounds)x these",
)


# -- work ------------------------------------------------------------------------------------------------------
@dataclass
class Work:
    """What one phase of one run does, independent of any rate."""

    tokens: int = 0
    """Tokens through the networks (forwards, backwards); in generation and evaluation, the tokens generated."""
    flops: float = 0.0
    """Compute-bound FLOPs: forwards, backwards, recomputation, prefill."""
    decode: list[tuple[int, float, float]] = field(default_factory=list)
    """Decode steps as (steps, bytes read per step, FLOPs per step), one entry per size of generate call."""
    optimizer_bytes: float = 0.0
    """Bytes AdamW moves over all its steps (bandwidth-bound)."""
    completions: int = 0
    """Completions the rule verifier scores (CPU)."""

    @property
    def decode_steps(self) -> int:
        return sum(steps for steps, _, _ in self.decode)

    @property
    def total_flops(self) -> float:
        """FLOPs of the phase, the decode steps' included."""
        return self.flops + sum(steps * f for steps, _, f in self.decode)

    @property
    def total_bytes(self) -> float:
        """Bytes the bandwidth-bound parts read or write: the decode steps and AdamW."""
        return self.optimizer_bytes + sum(steps * b for steps, b, _ in self.decode)

    def to_json(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "flops": float(self.total_flops), "bytes": float(self.total_bytes),
                "decode_steps": self.decode_steps, "completions_scored": self.completions}


@dataclass(frozen=True)
class Rates:
    """The assumed rates of one GPU type."""

    bandwidth: float
    """Sustained bandwidth, bytes/s (datasheet x BANDWIDTH_EFFICIENCY)."""
    flops: float
    """Sustained FLOP/s (datasheet dense bf16 x MFU)."""
    verifier: float = VERIFIER_COMPLETIONS_PER_S
    """Completions scored per second."""
    startup_s: float = STARTUP_S
    """Seconds per run outside the phases."""

    @classmethod
    def of(cls, gpu: Gpu) -> "Rates":
        return cls(gpu.bandwidth * BANDWIDTH_EFFICIENCY, gpu.bf16_flops * MFU)

    def seconds(self, work: Work) -> float:
        """Seconds of ``work`` at these rates: FLOPs over the compute rate, each decode step the larger of its bytes
        over the bandwidth and its FLOPs over the compute rate (a roofline), AdamW's bytes over the bandwidth, the
        verifier's completions over its rate."""
        decode = sum(steps * max(b / self.bandwidth, f / self.flops) for steps, b, f in work.decode)
        return (work.flops / self.flops + decode + work.optimizer_bytes / self.bandwidth
                + work.completions / self.verifier)


class Counter:
    """Tokens, FLOPs and bytes of one spec's runs, from its budget and its model's shape."""

    def __init__(self, spec: Any, prompt_tokens: int = PROMPT_TOKENS) -> None:
        from bench.systems.memory_model import shape_fields_from_spec
        from bench.systems.memory_terms import Shape

        self.spec = spec
        self.model_name, fields = shape_fields_from_spec(spec)
        self.shape = Shape.from_fields(fields)
        self.prompt = prompt_tokens
        self.new = spec.generation.max_new_tokens
        self.length = self.prompt + self.new
        """Tokens of a prompt and its completion (every sequence trained or scored)."""

    # networks
    def linear(self, lm_head: bool) -> int:
        """Weights a token multiplies by: every linear layer's, and the LM head's (else the 1-wide value or score
        head's)."""
        return self.shape.linear_weights(lm_head) + (0 if lm_head else self.shape.hidden)

    def forward(self, tokens: int, length: int, lm_head: bool = True) -> float:
        """FLOPs of a forward over ``tokens`` tokens of causal sequences ``length`` long: 2 per weight per token,
        plus attention's QK^T and AV, 2 x 2 x q_width x layers per token over length / 2 positions on average."""
        return tokens * (2 * self.linear(lm_head) + 2 * self.shape.q_width * self.shape.layers * length)

    def train(self, tokens: int, lm_head: bool = True, full: bool = True) -> float:
        """FLOPs of a forward and backward over ``tokens`` tokens of full sequences: the forward (x1), the
        activation gradients (x1), the weight gradients when every weight trains (x1 more: 6N per token in all), and
        the recomputed forward under gradient checkpointing (x1)."""
        passes = 1 + (2 if full else 1) + (1 if self.spec.train.gradient_checkpointing else 0)
        return passes * self.forward(tokens, self.length, lm_head)

    def full(self, role: str) -> bool:
        """Every weight of ``role`` trains (its backward computes weight gradients): without LoRA, the reward-model
        stage's classifier, and PPO's critic unless train.lora.critic gives it adapters."""
        lora = self.spec.train.lora
        return role == "reward" or not lora.enabled or (role == "critic" and not lora.critic)

    def trainable(self, role: str, full: bool | None = None) -> int:
        """Parameters AdamW updates for ``role`` (actor, critic, reward); ``full`` overrides :meth:`full` (the warm
        start trains every weight of the actor, LoRA or not)."""
        sh = self.shape
        head = [sh.hidden, 1] if role == "critic" else [sh.hidden] if role == "reward" else []
        if self.full(role) if full is None else full:
            return sum(sh.lm_tensors() if role == "actor" else sh.backbone_tensors() + head)
        return sh.lora_parameters(self.spec.train.lora.r)[0] + sum(head)

    def adamw(self, role: str, steps: int, full: bool | None = None) -> float:
        """Bytes AdamW moves for ``role`` over ``steps`` optimizer steps."""
        return float(steps * self.trainable(role, full) * ADAMW_BYTES_PER_PARAMETER)

    # generation
    def weight_bytes(self, stored_fp32: bool) -> int:
        """Bytes read per weight per decode step: vLLM its own copy in model.dtype; HF generate of a float32-stored
        network under bf16 autocast 8 (the float32 read, its bf16 cast written and read again), in float32 4; a
        bf16-stored network 2."""
        from bench.systems.memory_terms import DTYPE_BYTES

        dtype = self.spec.model.dtype
        if self.spec.generation.backend == "vllm" or not stored_fp32:
            return DTYPE_BYTES[dtype]
        return 4 if dtype == "float32" else 8

    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token: vLLM in model.dtype, HF's cache in float32 (the one compute
        numerics; bench.systems.memory_terms.kv_cache_bytes)."""
        from bench.systems.memory_terms import DTYPE_BYTES, kv_cache_bytes

        vllm = self.spec.generation.backend == "vllm"
        return kv_cache_bytes(self.shape, 1, 1, DTYPE_BYTES[self.spec.model.dtype] if vllm else 4)

    def generate(self, calls: dict[int, int], new: int, stored_fp32: bool = True) -> Work:
        """Generate calls of ``calls`` {sequences per call: number of calls}, ``new`` tokens each: the prompts'
        prefill (compute-bound), then ``new`` decode steps per call, each reading the weights and every sequence's
        KV cache at the mean context (prompt + new / 2)."""
        work, sh = Work(), self.shape
        context = self.prompt + new / 2
        for sequences, count in sorted(calls.items()):
            if not count or not sequences:
                continue
            work.flops += count * self.forward(sequences * self.prompt, self.prompt)
            step_bytes = (self.linear(True) * self.weight_bytes(stored_fp32)
                          + sequences * context * self.kv_bytes_per_token())
            step_flops = sequences * (2 * self.linear(True) + 4 * sh.q_width * sh.layers * context)
            work.decode.append((count * new, float(step_bytes), float(step_flops)))
            work.tokens += count * sequences * new
        return work

    def evaluation(self) -> Work:
        """The greedy evaluation: the split's questions in generate calls of eval.batch_size, each scored."""
        spec = self.spec
        if not spec.eval.enabled:
            return Work()
        questions = spec.task.validation_size if spec.eval.split == "validation" else spec.task.test_size
        work = self.generate(batches(questions, spec.eval.batch_size), spec.eval.max_new_tokens)
        work.completions = questions
        return work


def batches(items: int, size: int, per_item: int = 1) -> dict[int, int]:
    """{sequences per call: calls} of ``items`` in calls of ``size`` items (the last call smaller), each item
    ``per_item`` sequences."""
    full, rest = divmod(items, size)
    out = {size * per_item: full}
    if rest:
        out[rest * per_item] = out.get(rest * per_item, 0) + 1
    return out


def merged(*parts: Work) -> Work:
    """The sum of several works of one phase."""
    out = Work()
    for w in parts:
        out.tokens += w.tokens
        out.flops += w.flops
        out.decode += w.decode
        out.optimizer_bytes += w.optimizer_bytes
        out.completions += w.completions
    return out


def run_work(spec: Any, name: str, prompt_tokens: int = PROMPT_TOKENS) -> dict[str, Work]:
    """Phase -> work of one run of ``spec`` named ``name`` (a shared stage or a method; every phase present)."""
    c = Counter(spec, prompt_tokens)
    phases = {phase: Work() for phase in PHASES}
    phases.update(_stage_work(c, name) if name in ("warm_start", "sample_pool", "reward_model") else
                  _method_work(c, name))
    return phases


def _stage_work(c: Counter, name: str) -> dict[str, Work]:
    spec = c.spec
    if name == "warm_start":  # SFT of every weight (no LoRA in the warm start), then the evaluation
        ws = spec.warm_start
        if not ws.enabled:
            return {"evaluation": c.evaluation()}
        tokens = ws.steps * ws.batch_size * c.length
        return {"update": Work(tokens, c.train(tokens, full=True), optimizer_bytes=c.adamw("actor", ws.steps, True)),
                "evaluation": c.evaluation()}
    if name == "sample_pool":  # the frozen start (model.dtype) samples; the verifier labels every completion
        pool = spec.sample_pool
        prompts = min(pool.prompts, spec.task.train_size)
        generation = c.generate(batches(prompts, pool.batch_size, pool.samples_per_prompt), c.new, stored_fp32=False)
        return {"generation": generation, "reward": Work(completions=prompts * pool.samples_per_prompt)}
    rm = spec.reward_model  # reward_model: a sequence classifier trained on the pool's pairs, then its accuracy
    pairs = min(spec.sample_pool.prompts, spec.task.train_size)
    held_out = max(1, int(pairs * rm.eval_fraction))
    steps = max(1, rm.epochs * (pairs - held_out) // rm.batch_size)
    tokens = steps * rm.batch_size * 2 * c.length
    return {"update": Work(tokens, c.train(tokens, lm_head=False), optimizer_bytes=c.adamw("reward", steps)),
            "evaluation": Work(2 * held_out * c.length, c.forward(2 * held_out * c.length, c.length, lm_head=False))}


def _method_work(c: Counter, name: str) -> dict[str, Work]:
    from bench.config import registry
    from bench.systems.memory_model import modelled_as
    from bench.systems.memory_terms import METHOD_ROLES

    spec = c.spec
    cfg = spec.methods[name]
    like = name if name in METHOD_ROLES else modelled_as(spec, name)
    roles = tuple(registry.recipe(name).networks(spec, cfg))
    steps, t = spec.train.steps, spec.train
    full = c.full("actor")
    if like == "dpo":  # offline: prompts_per_step pairs a step, chosen and rejected, the reference scoring both
        tokens = steps * t.prompts_per_step * 2 * c.length
        return {"reference": Work(tokens, c.forward(tokens, c.length)),
                "update": Work(tokens, c.train(tokens, full=full), optimizer_bytes=c.adamw("actor", steps)),
                "evaluation": c.evaluation()}
    sequences = t.prompts_per_step * t.group_size
    tokens = steps * sequences * c.length
    epochs, minibatches = getattr(cfg, "ppo_epochs", 1), getattr(cfg, "minibatches", 1)
    optimizer_steps = steps * epochs * minibatches
    out = {"generation": c.generate({sequences: steps}, c.new),
           "reward": Work(completions=steps * sequences),
           "evaluation": c.evaluation()}
    if "reward" in roles:  # PPO with the reward model: its forward over every completion
        out["reward"] = merged(out["reward"], Work(tokens, c.forward(tokens, c.length, lm_head=False)))
    if "reference" in roles:
        out["reference"] = Work(tokens, c.forward(tokens, c.length))
    update = [Work(epochs * tokens, epochs * c.train(tokens, full=full),
                   optimizer_bytes=c.adamw("actor", optimizer_steps))]
    # The engine's rollout log-probs: a no-grad actor forward unless one update per rollout lets it skip it (GRPO).
    if like in ("ppo", "ppo_verifier") or (like == "grpo_engine" and epochs * minibatches > 1):
        update.append(Work(tokens, c.forward(tokens, c.length)))
    if "critic" in roles:
        out["critic"] = Work(tokens, c.forward(tokens, c.length, lm_head=False))
        update.append(Work(epochs * tokens, epochs * c.train(tokens, lm_head=False, full=c.full("critic")),
                           optimizer_bytes=c.adamw("critic", optimizer_steps)))
    out["update"] = merged(*update)
    return out


# -- calibration ------------------------------------------------------------------------------------------------
@dataclass
class Measured:
    """What a calibration measured for one (run name, phase): seconds against the assumed seconds of its work."""

    seconds: float
    """Measured seconds, summed over the runs of that name."""
    assumed_seconds: float
    """Seconds the assumed rates give those runs' own work."""
    runs: list[str] = field(default_factory=list)
    """Where it was measured: folder/run id."""

    @property
    def factor(self) -> float:
        """Measured seconds per assumed second: the assumed rate divided by the measured one."""
        return self.seconds / self.assumed_seconds


@dataclass
class Calibration:
    """The measured rates of a --calibrate folder (or several)."""

    folders: list[str]
    phases: dict[tuple[str, str], Measured] = field(default_factory=dict)
    """(run name, phase or STARTUP) -> what was measured (STARTUP: assumed_seconds 1 per run, so the factor is the
    mean measured seconds)."""
    gpu_names: list[str] = field(default_factory=list)
    """The GPUs the runs recorded (environment.gpu_name)."""
    notes: list[str] = field(default_factory=list)
    """Runs or phases not used, and why."""


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else None


def calibrate(folders: list[str], rates: Rates) -> Calibration:
    """The measured rates of the finished runs (status ok) in ``folders`` (suite folders: ``runs/*/result.json``);
    UserError (one line) for a folder that is not a suite folder or holds no finished run with phase timings."""
    from bench.config import registry
    from bench.config.loading import load_spec_dict
    from bench.config.paths import check_suite_folder, shown
    from bench.results import read_result

    cal = Calibration([str(f) for f in folders])
    for folder in folders:
        path = check_suite_folder(folder, "--calibrate")
        used = 0
        for result_file in sorted(path.glob("runs/*/result.json")):
            result = read_result(result_file.parent)
            where = f"{shown(path)}/{result_file.parent.name}"
            if result is None or result.get("status") != "ok" or not isinstance(result.get("phases"), dict):
                continue
            name = str(result.get("method"))
            if name not in registry.STAGES and name not in registry.METHODS:
                cal.notes.append(f"{where}: '{name}' is no stage or method of this suite; not used")
                continue
            try:
                spec = load_spec_dict(result["spec"])
                prompt = (result.get("sweep") or {}).get("prompt_tokens")
                prompt = prompt if isinstance(prompt, int) and prompt > 0 else PROMPT_TOKENS
                work = run_work(spec, name, prompt)
            except (UserError, KeyError, TypeError, ValueError) as exc:
                cal.notes.append(f"{where}: its spec gives no work to compare with ({exc}); not used")
                continue
            processes = _processes(spec, name)
            timed = {}
            for phase in PHASES:
                seconds = _number((result["phases"].get(phase) or {}).get("time_s"))
                if seconds is None:
                    continue
                timed[phase] = seconds
                assumed = rates.seconds(work[phase]) / processes
                if assumed <= 0:
                    cal.notes.append(f"{where}: phase {phase} timed {seconds:.1f} s where the model counts no work; "
                                     f"not used")
                    continue
                m = cal.phases.setdefault((name, phase), Measured(0.0, 0.0))
                m.seconds, m.assumed_seconds = m.seconds + seconds, m.assumed_seconds + assumed
                m.runs.append(where)
            wall = _number((result.get("throughput") or {}).get("wall_s"))
            if wall is not None:
                m = cal.phases.setdefault((name, STARTUP), Measured(0.0, 0.0))
                m.seconds, m.assumed_seconds = m.seconds + max(0.0, wall - sum(timed.values())), m.assumed_seconds + 1
                m.runs.append(where)
            gpu = (result.get("environment") or {}).get("gpu_name") or f"no GPU recorded (device {spec.device})"
            if gpu not in cal.gpu_names:
                cal.gpu_names.append(str(gpu))
            used += 1
        if not used:
            raise UserError(f"--calibrate '{shown(path)}' holds no finished run with phase timings (runs/*/result.json "
                            f"with status ok and its spec); give a suite folder whose runs finished, e.g. the step1/ "
                            f"that scripts/gpu_check.sh writes")
    return cal


# -- the projection ---------------------------------------------------------------------------------------------
@dataclass
class PhaseTime:
    """One phase of one projected run."""

    work: Work
    seconds: float
    rate: str
    """'assumed' or 'measured'."""


@dataclass
class RunTime:
    """One projected run of the plan."""

    run_id: str
    name: str
    kind: str
    phases: dict[str, PhaseTime]
    """Every phase of PHASES and STARTUP."""

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases.values())


def _processes(spec: Any, name: str) -> int:
    """Processes a run of ``name`` is started as (launcher.num_processes for method runs under a launcher)."""
    from bench.config import registry
    from bench.config.launcher import active

    return spec.launcher.num_processes if active(spec) and name in registry.METHODS else 1


def project_runs(spec: Any, plan: list[Any], rates: Rates, calibration: Calibration | None = None,
                 prompt_tokens: int = PROMPT_TOKENS) -> list[RunTime]:
    """Every run of ``plan`` (``bench.execution.plan.make_plan(spec)``'s planned runs; a sweep's runs at their
    point's spec) with its phases' work and seconds: the assumed rates' seconds, times the measured factor where the
    calibration timed that run name's phase."""
    from bench.config.rules import point_spec

    measured = calibration.phases if calibration else {}
    out = []
    cache: dict[tuple[str, str | None], tuple[dict[str, Work], int]] = {}
    for run in plan:
        key = (run.name, run.point)
        if key not in cache:
            run_spec = spec if run.point is None else point_spec(spec, dict(run.values))
            cache[key] = run_work(run_spec, run.name, prompt_tokens), _processes(run_spec, run.name)
        works, processes = cache[key]
        phases = {}
        for phase in PHASES:
            seconds, m = rates.seconds(works[phase]) / processes, measured.get((run.name, phase))
            phases[phase] = (PhaseTime(works[phase], seconds * m.factor, "measured") if m
                             else PhaseTime(works[phase], seconds, "assumed"))
        m = measured.get((run.name, STARTUP))
        phases[STARTUP] = (PhaseTime(Work(), m.factor, "measured") if m
                           else PhaseTime(Work(), rates.startup_s, "assumed"))
        out.append(RunTime(run.run_id, run.name, run.kind, phases))
    return out


@dataclass
class Schedule:
    """How `bench run` would place the runs on ``gpus`` GPUs, and the wall time that gives."""

    gpus: int
    parallel_runs: int
    """Method runs at once (parallel_runs resolved by bench.execution.devices.plan_devices)."""
    slots: list[list[str]]
    """Each slot's GPUs (CUDA_VISIBLE_DEVICES entries)."""
    stages_s: float
    """The shared stages, one after another (seconds)."""
    placement: list[list[str]]
    """Run ids of the method runs each slot runs, in order."""
    slot_s: list[float]
    """Seconds each slot is busy with method runs."""
    note: str = ""
    """How the placement departs from the spec's own (a CPU preset placed on GPUs)."""

    @property
    def seconds(self) -> float:
        """The stages, then the longest slot (the critical path of the list schedule)."""
        return self.stages_s + max(self.slot_s, default=0.0)


def schedule(spec: Any, runs: list[RunTime], gpus: int, plan_devices: Callable[..., Any]) -> Schedule:
    """List-schedule ``runs`` on ``gpus`` GPUs as the runner does (bench.execution.runner._run_all): the stages one at
    a time, then the method runs in plan order, each on the lowest-numbered slot free first. ``plan_devices`` is
    :func:`bench.execution.devices.plan_devices` (the runner's own placement: slots and parallel_runs resolved).
    UserError (one line) when the spec's parallel_runs asks for more runs at once than the GPUs hold."""
    # The box asked about, not this machine: --gpus GPUs, whatever spec.gpus lists. A CPU preset's parallel_runs
    # shares cores; on GPUs it is placed as device auto would place it, one run per GPU.
    cpu = spec.device == "cpu"
    probe = dataclasses.replace(spec, device="cuda", gpus=[], parallel_runs="auto" if cpu else spec.parallel_runs)
    try:
        devices = plan_devices(probe, {}, count=lambda: gpus)
    except UserError as exc:
        raise UserError(f"--gpus {gpus}: bench run would refuse this spec: {exc}") from None
    busy = [0.0] * devices.parallel_runs
    placement: list[list[str]] = [[] for _ in busy]
    for run in runs:
        if run.kind == "stage":
            continue
        slot = min(range(len(busy)), key=lambda i: (busy[i], i))
        busy[slot] += run.seconds
        placement[slot].append(run.run_id)
    note = (f"the preset runs on the CPU (device: cpu, parallel_runs {spec.parallel_runs}); placed here as on GPUs "
            f"with parallel_runs auto" if cpu else "")
    return Schedule(gpus, devices.parallel_runs, [list(s) for s in devices.slots],
                    sum(r.seconds for r in runs if r.kind == "stage"), placement, busy, note)


# -- the command ------------------------------------------------------------------------------------------------
MEMORY_ONLY = (("model", None, "--model"), ("method", None, "--method"), ("zero_stage", None, "--zero-stage"),
               ("offload", "none", "--offload"), ("what_if", False, "--what-if"), ("backend", None, "--backend"),
               ("vllm_gpu_memory_utilization", None, "--vllm-gpu-memory-utilization"),
               ("gpu_memory", "80GiB", "--gpu-memory"))
"""(argument, default, flag) of the memory estimate's own options: refused beside --time."""


def gpu_of(name: str) -> Gpu:
    """The Gpu of a --gpu-type (case-insensitive); UserError naming the known types."""
    key = name.strip().lower()
    if key not in GPUS:
        close = difflib.get_close_matches(key, list(GPUS), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UserError(f"unknown --gpu-type '{name}'{hint}; give one of {', '.join(GPUS)}")
    return GPUS[key]


def check_time_arguments(args: Any) -> Gpu:
    """The --time command line's own checks (before the spec loads): UserError (one line) for a missing --preset or
    --gpu-type, an unknown GPU type, a bad --gpus, or a memory-estimate option beside --time."""
    from bench.systems.memory_model import MAX_GPUS

    for attr, default, flag in MEMORY_ONLY:
        if getattr(args, attr, default) != default:
            raise UserError(f"{flag} is the memory estimate's; --time projects the preset's own model and methods: "
                            f"drop {flag}, or drop --time")
    if not args.preset or not args.gpu_type:
        raise UserError(f"--time needs --preset PRESET and --gpu-type TYPE ({', '.join(GPUS)}), e.g. bench estimate "
                        f"--time --preset gsm8k-qwen0.5b --gpu-type h100")
    gpu = gpu_of(args.gpu_type)
    if args.gpus is not None and not 1 <= args.gpus <= MAX_GPUS:
        raise UserError(f"--gpus must be between 1 and {MAX_GPUS}, got {args.gpus}; give the GPUs of the box, e.g. "
                        f"--gpus 8")
    return gpu


def run_time_estimate(args: Any, make_plan: Callable[[Any], list[Any]], plan_devices: Callable[..., Any]) -> int:
    """`bench estimate --time`: check, project, print (table or JSON); UserError (one line, exit 2) for bad input.

    ``make_plan`` and ``plan_devices`` are :func:`bench.execution.plan.make_plan` and
    :func:`bench.execution.devices.plan_devices`, handed in by bench.cli: the plan and the placement are `bench
    run`'s own, and bench.systems sits below bench.execution in the layers (bench.LAYERS)."""
    gpu = check_time_arguments(args)
    gpus = args.gpus or 1
    rates = Rates.of(gpu)
    calibration = calibrate(args.calibrate, rates) if args.calibrate else None
    from bench.config.loading import load_spec

    spec = load_spec(args.preset, list(args.settings))
    runs = project_runs(spec, make_plan(spec), rates, calibration)
    data = projection_json(spec, args.gpu_type.strip().lower(), gpu, rates, runs,
                           schedule(spec, runs, gpus, plan_devices), calibration)
    print(json.dumps(data, indent=2) if args.json else format_projection(data))
    return 0


def _basis(runs: list[RunTime]) -> str:
    rates = {p.rate for r in runs for p in r.phases.values()}
    return "measured and assumed rates" if rates == {"measured", "assumed"} else f"{rates.pop()} rates only"


def projection_json(spec: Any, key: str, gpu: Gpu, rates: Rates, runs: list[RunTime], many: Schedule,
                    calibration: Calibration | None) -> dict[str, Any]:
    """The projection as plain data (what --json prints; the table is drawn from it)."""
    c = Counter(spec)
    sh = c.shape
    hours = 3600.0
    phases = {}
    for phase in (*PHASES, STARTUP):
        works = [r.phases[phase] for r in runs]
        total = merged(*[p.work for p in works])
        used = sorted({p.rate for p in works if p.seconds or p.rate == "measured"})
        phases[phase] = {**total.to_json(), "seconds": sum(p.seconds for p in works), "rate": used or ["assumed"]}
    serial = sum(r.seconds for r in runs)
    measured = calibration.phases if calibration else {}
    return {
        "what": "a PROJECTION of wall time, not a measurement: work counted from the preset's budget and the model's "
                "shape, divided by assumed rates (datasheet peak x a stated efficiency) or rates measured in a "
                "--calibrate folder; nothing was timed for it",
        "basis": _basis(runs),
        "preset": spec.name,
        "model": {"name": c.model_name, "parameters": sh.parameters(), "layers": sh.layers, "hidden": sh.hidden,
                  "vocab": sh.vocab, "dtype": spec.model.dtype, "generation_backend": spec.generation.backend},
        "gpu": {"type": key, "name": gpu.name, "bandwidth_bytes_per_s": gpu.bandwidth,
                "bf16_dense_flops_per_s": gpu.bf16_flops, "memory_gb": gpu.memory_gb, "source": gpu.source},
        "assumed_rates": {
            "decode_bandwidth_bytes_per_s": rates.bandwidth, "bandwidth_efficiency": BANDWIDTH_EFFICIENCY,
            "compute_flops_per_s": rates.flops, "mfu": MFU, "adamw_bytes_per_parameter": ADAMW_BYTES_PER_PARAMETER,
            "verifier_completions_per_s": rates.verifier, "startup_s_per_run": rates.startup_s,
            "source": f"{gpu.source}; efficiencies assumed, not measured"},
        "work_assumptions": list(WORK_ASSUMPTIONS),
        "calibration": None if calibration is None else {
            "folders": calibration.folders, "gpu_names": calibration.gpu_names, "notes": calibration.notes,
            "measured": [{"run": name, "phase": phase, "measured_s": m.seconds, "assumed_s": m.assumed_seconds,
                          "rate_vs_assumed": (1 / m.factor if m.factor else None) if phase != STARTUP else None,
                          "from": m.runs} for (name, phase), m in sorted(measured.items())]},
        "runs": [{"run_id": r.run_id, "name": r.name, "kind": r.kind, "seconds": r.seconds,
                  "phases": {phase: {**p.work.to_json(), "seconds": p.seconds, "rate": p.rate}
                             for phase, p in r.phases.items()}} for r in runs],
        "phases": phases,
        "total_1_gpu": {"gpus": 1, "seconds": serial, "hours": serial / hours,
                        "placement": "every run one after another"},
        "total_n_gpus": {"gpus": many.gpus, "seconds": many.seconds, "hours": many.seconds / hours,
                         "parallel_runs": many.parallel_runs, "stages_s": many.stages_s,
                         "slots": [{"gpus": gpus, "runs": placed, "seconds": busy}
                                   for gpus, placed, busy in zip(many.slots, many.placement, many.slot_s)],
                         "placement": "stages one at a time, then each method run on the first slot free, in plan "
                                      "order (bench run's placement): the stages plus the longest slot",
                         "note": many.note},
    }


def _si(value: float, unit: str) -> str:
    """1.23e15 FLOP as '1.23 P' + unit."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:,.2f} {prefix}{unit}"
    return f"{value:,.0f} {unit}"


def format_projection(d: dict[str, Any]) -> str:
    """The table of :func:`projection_json`'s data."""
    m, g, a = d["model"], d["gpu"], d["assumed_rates"]
    lines = [f"WALL-TIME PROJECTION, not a measurement ({d['basis']}): preset {d['preset']} on {d['gpu']['type']} "
             f"({g['name']})",
             "  work = tokens, FLOPs and bytes counted from the preset's budget and the model's shape; "
             "seconds = work / rate; nothing was timed for this",
             f"model: {m['name']} shape, {m['parameters'] / 1e6:,.1f}M parameters, {m['layers']} layers, hidden "
             f"{m['hidden']}, vocabulary {m['vocab']:,}; {m['dtype']}; generation backend {m['generation_backend']}",
             f"assumed rates, from the datasheet: {g['source']}",
             f"  decode steps (generation, evaluation) and AdamW: {g['bandwidth_bytes_per_s'] / 1e12:.3g} TB/s x "
             f"{a['bandwidth_efficiency']:.0%} assumed bandwidth efficiency = "
             f"{a['decode_bandwidth_bytes_per_s'] / 1e12:.3g} TB/s; a decode step reads the weights it multiplies "
             f"by and every sequence's KV cache (or, when larger, "
             f"its FLOPs at the compute rate); AdamW moves {a['adamw_bytes_per_parameter']} B per trained parameter",
             f"  forward and backward (prefill, reference, critic, reward model, update): "
             f"{g['bf16_dense_flops_per_s'] / 1e12:.0f} TFLOP/s dense bf16 x {a['mfu']:.0%} assumed MFU = "
             f"{a['compute_flops_per_s'] / 1e12:.0f} TFLOP/s",
             f"  rule verifier (reward): {a['verifier_completions_per_s']:,.0f} completions/s on the CPU (assumed); "
             f"{STARTUP}: {a['startup_s_per_run']:.0f} s per run outside its phases (assumed)",
             "  a roofline: kernel launches, Python, the sampler and elementwise work are left out, so assumed rates "
             "give a lower bound (--calibrate DIR replaces them with measured ones)",
             f"work assumptions: {'; '.join(d['work_assumptions'])}"]
    cal = d["calibration"]
    if cal:
        lines.append(f"measured rates from {', '.join(cal['folders'])}, on {'; '.join(cal['gpu_names'])} (taken as "
                     f"they are, not rescaled to {g['type']}):")
        for e in cal["measured"]:
            if e["phase"] == STARTUP:
                lines.append(f"  {e['run']} {STARTUP}: {e['measured_s'] / e['assumed_s']:.1f} s per run measured "
                             f"(wall time less its phases; {len(e['from'])} run(s))")
            else:
                ratio = "unbounded" if e["rate_vs_assumed"] is None else f"{e['rate_vs_assumed']:.3g} x"
                lines.append(f"  {e['run']} {e['phase']}: {e['measured_s']:.1f} s measured for work the assumed rates "
                             f"put at {e['assumed_s']:.2f} s: the measured rate is {ratio} the "
                             f"assumed ({len(e['from'])} run(s): {', '.join(e['from'][:2])}"
                             f"{', ...' if len(e['from']) > 2 else ''})")
        lines += [f"  note: {n}" for n in cal["notes"]]
    columns = [*PHASES, STARTUP]
    header = ["run", *columns, "total s"]
    rows = [[r["run_id"], *[(_cell(r["phases"][p])) for p in columns], f"{r['seconds']:,.0f}"] for r in d["runs"]]
    lines += ["", "per run, seconds by phase (a: assumed rate, m: measured rate, -: no work):",
              *_render(rows, header)]
    prows = [[p, f"{v['tokens']:,}", _si(v["flops"], "FLOP"), _si(v["bytes"], "B"), f"{v['seconds']:,.0f}",
              "+".join(v["rate"])] for p, v in d["phases"].items()]
    lines += ["", "per phase, over every run (tokens: through the networks; generation and evaluation: generated):",
              *_render(prows, ["phase", "tokens", "FLOPs", "bytes (decode, AdamW)", "seconds", "rate"])]
    one, many = d["total_1_gpu"], d["total_n_gpus"]
    lines += ["", f"PROJECTED total on 1 GPU: {one['hours']:.2f} h ({one['placement']})"]
    if many["gpus"] > 1:
        lines.append(f"PROJECTED total on {many['gpus']} GPUs: {many['hours']:.2f} h = stages "
                     f"{many['stages_s'] / 3600:.2f} h one at a time + method runs "
                     f"{(many['seconds'] - many['stages_s']) / 3600:.2f} h on "
                     f"{many['parallel_runs']} slot(s) at once (the longest slot; bench run's placement)")
        if many["note"]:
            lines.append(f"  note: {many['note']}")
        for i, slot in enumerate(many["slots"]):
            lines.append(f"  slot {i} (GPU {','.join(slot['gpus']) or '?'}): {slot['seconds'] / 3600:.2f} h: "
                         f"{', '.join(slot['runs']) or '(idle)'}")
    lines.append("a projection from " + d["basis"] + ", not a measurement: time a run (scripts/gpu_check.sh) and pass "
                 "its step folders with --calibrate to replace assumed rates by measured ones")
    return "\n".join(lines)


def _cell(p: dict[str, Any]) -> str:
    if p["rate"] == "assumed" and not p["seconds"]:
        return "-"
    return f"{p['seconds']:,.1f} {p['rate'][0]}"


def _render(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return ["  " + "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
            .rstrip() for row in [header, *rows]]


__all__ = ["GPUS", "Rates", "Work", "Counter", "run_work", "calibrate", "project_runs", "schedule",
           "run_time_estimate", "projection_json"]
