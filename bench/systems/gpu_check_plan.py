"""What ``scripts/gpu_check.sh`` runs after step 1: the size of step 2 and whether step 3 can run.

Step 2 is "the largest size that fits": of the shipped Qwen2.5 1.5B, 3B and 7B shapes (the rehearsal's scaled
versions of them), the largest that

- the memory model (:mod:`bench.systems.memory_model`, no torch) predicts fits the GPU's memory for each of the step-2
  methods (the engine's GRPO, PPO with the verifier reward, DPO), keeping :data:`HEADROOM` of it back for what
  the model leaves out (CUDA context, allocator cache, fragmentation); and
- step 1's measured times say can finish in the time left: each step-2 run (the stages, then the methods) takes
  a fixed start-up (:data:`START_S`) plus the wall time its step-1 counterpart took, scaled by the ratio of
  parameters (generation, forwards and backwards all grow with the weights; at 0.5B a GPU is under-used, so
  this over-estimates rather than under), times :data:`TIME_MARGIN`.

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
"""Share of GPU memory kept back from the prediction: the CUDA context (~0.5 GiB), the allocator's cache and
fragmentation, which the memory model does not model."""
START_S = 20.0
"""Seconds a worker takes before its run's clock starts (interpreter, torch / transformers / trl imports)."""
TIME_MARGIN = 1.25
"""An estimate must fit the time left by this factor (the guard kills what overruns)."""
SWEEP_STEPS = ("sweep.steps=2", "sweep.warmup_steps=1")
"""Both steps: one warm-up step, then 2 measured (systems-qwen0.5b's 3 steps, telemetry.warmup_steps 1)."""
DEFAULT_PROMPT_TOKENS = 256


def point_overrides(architecture: str) -> list[str]:
    """Overrides that make a run one sweep point at ``architecture`` (its runs store the memory model's prediction
    beside the measurement, and an out-of-memory there is recorded with its phase, not a failure)."""
    return [f"sweep.axes={{model.architecture: [{architecture}]}}", *SWEEP_STEPS]


def step2_method_overrides() -> list[str]:
    """Disable every method but :data:`STEP2_METHODS`."""
    return [f"methods.{m}.enabled={'true' if m in STEP2_METHODS else 'false'}" for m in ALL_METHODS]


# -- the choice ---------------------------------------------------------------------------------------------
@dataclass
class Candidate:
    """One size step 2 could run, and why it was or was not chosen."""

    architecture: str
    parameters: int
    predicted_peak_bytes: dict[str, int]
    """Method -> the memory model's predicted peak (bytes)."""
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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The plan in words: the budget, then one line per size."""
        out = [f"step 2 budget: {gib(self.gpu_memory_bytes)} GiB ({self.memory_source}), {HEADROOM:.0%} kept back -> "
               f"{gib(self.usable_bytes)} GiB for the predicted peak; {self.seconds_left:.0f} s left"]
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


def estimate_seconds(step1_wall_s: dict[str, float], ratio: float) -> float | None:
    """Seconds step 2 takes: per run START_S plus its step-1 wall time x ``ratio`` (parameters at the candidate /
    at step 1); None when a run step 2 needs has no step-1 time."""
    needed = [*STEP2_STAGES, *STEP2_METHODS]
    if any(step1_wall_s.get(name) is None for name in needed):
        return None
    return sum(START_S + step1_wall_s[name] * ratio for name in needed)


def step1_times(step1_dir: Path) -> tuple[dict[str, float], int | None, int | None]:
    """(run name -> wall seconds of its step-1 run, parameters of step 1's actor, the longest prompt in tokens), from
    the step-1 suite's result files (ok runs only: a failed run's time says nothing about a finished one)."""
    from bench.report.load import load_suite

    times: dict[str, float] = {}
    params = prompt_tokens = None
    for run in load_suite(step1_dir).runs:
        result = run.result
        if run.status != "ok":
            continue
        name = str(result.get("method") or run.run_id.split("@")[0].split("-s")[0])
        wall = (result.get("throughput") or {}).get("wall_s")
        if isinstance(wall, (int, float)) and not isinstance(wall, bool):
            times[name] = float(wall)
        actor = ((result.get("memory") or {}).get("networks") or {}).get("actor") or {}
        if params is None and isinstance(actor.get("params"), int):
            params = int(actor["params"])
        tokens = (result.get("sweep") or {}).get("prompt_tokens")
        if prompt_tokens is None and isinstance(tokens, int):
            prompt_tokens = tokens
    return times, params, prompt_tokens


def candidates_for(preset: str, overrides: list[str], gpu_memory_bytes: int, step1_wall_s: dict[str, float],
                   step1_params: int | None, prompt_tokens: int | None) -> list[Candidate]:
    """Each size of CANDIDATES under ``preset`` + ``overrides`` (the rehearsal's scale included): its parameters,
    predicted peak per step-2 method, and estimated seconds."""
    from bench.systems.memory_model import predict_for_spec
    from bench.config.loading import load_spec

    out = []
    for architecture in CANDIDATES:
        spec = load_spec(preset, [*overrides, f"model.architecture={architecture}"])
        peaks, params = {}, 0
        for method in STEP2_METHODS:
            p = predict_for_spec(spec, method, gpu_memory_bytes, prompt_tokens or DEFAULT_PROMPT_TOKENS)
            peaks[method], params = p.peak_bytes, p.parameters
        ratio = params / step1_params if step1_params else None
        estimate = estimate_seconds(step1_wall_s, ratio) if ratio else None
        out.append(Candidate(architecture, params, peaks, estimate))
    return out


def plan_step2(preset: str, overrides: list[str], step1_dir: Path, seconds_left: float, gpu_memory_bytes: int,
               memory_source: str) -> Step2Plan:
    """The whole step-2 decision (see the module docstring)."""
    times, params, prompt_tokens = step1_times(step1_dir)
    plan = choose(candidates_for(preset, overrides, gpu_memory_bytes, times, params, prompt_tokens),
                  gpu_memory_bytes, seconds_left, memory_source)
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
    two.add_argument("--seconds-left", required=True, type=float)
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
