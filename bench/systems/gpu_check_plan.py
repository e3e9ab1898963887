"""What ``scripts/gpu_check.sh`` runs after step 1: the size of step 2 and whether step 3 can run.

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

    python -m bench.systems.gpu_check_plan step2 --step1 DIR --seconds-left S [--gpu-memory auto|host|BYTES]
                                         [--write PLAN.json] [key=value ...]
        prints the plan to stderr and the step-2 overrides to stdout, one per line (nothing: step 2 is skipped)
    python -m bench.systems.gpu_check_plan step3
        exit 0 when step 3 can run; else prints "step 3 skipped: <why>" and exits 3

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
"""The methods step 2 runs (the issue's 'engine's GRPO, PPO (verifier) and DPO'); TRL's GRPO and PPO with a
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


def deepspeed_problem(importer: Callable[[str], Any] = importlib.import_module) -> str | None:
    """None when ``deepspeed`` imports, else why not (the exception's class and first line)."""
    try:
        importer("deepspeed")
        return None
    except Exception as exc:  # noqa: BLE001 - any failed import means no ZeRO run
        first = (str(exc).splitlines() or [""])[0][:120]
        return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def step3_skip_reason(gpus: int, deepspeed: Callable[[], str | None]) -> str | None:
    """Why step 3 (ZeRO-2, 2 processes) cannot run, in one line; None when it can. ``deepspeed`` is asked only when
    there are GPUs enough (importing it is slow)."""
    if gpus < 2:
        return f"step 3 skipped: {gpus} GPU{'' if gpus == 1 else 's'} visible; a ZeRO-2 two-process run needs 2 or more"
    problem = deepspeed()
    if problem is not None:
        return f"step 3 skipped: deepspeed does not import ({problem}); pip install '.[deepspeed]' to run it"
    return None


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
    args = parser.parse_args(argv)
    try:
        if args.command == "step3":
            reason = step3_skip_reason(gpu_count(), deepspeed_problem)
            if reason is not None:
                print(reason)
                return 3
            return 0
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
