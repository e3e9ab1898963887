"""Fabricated suite folders for the report tests (findings, compare, browser check): no training, known numbers.

``write_suite(root, ...)`` writes a cpu-tiny-like folder: the three shared stages and five methods plus an lr-0
control, each with a result.json in the bench.results schema and per-question verdicts, so every table and
figure has something to show. The numbers are chosen so the tests can name what the report must say:

- static memory: actor and critic 4 MiB weights + 4 MiB grads + 8 MiB AdamW state (16 MiB each), frozen
  reference and reward model 1 MiB each, so PPO (4 networks) is 34 MiB, GRPO 17 MiB: exactly 2.0x;
- accuracy on 400 questions from 100 right: GRPO 160, GRPO engine 156, PPO verifier 158 (not significantly
  different from each other), PPO with the reward model 60 (significantly worse), DPO 110, control 100;
- training curves and the final evaluation's monitors (:func:`curves`, :data:`EVAL_MONITORS`): PPO with the reward
  model over-optimises (reward-model score up, verifier reward down) on a chance-level reward model (52% of 200
  held-out pairs) and crosses two monitor thresholds (truncated 30% in training, no answer 60% at evaluation).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from bench.results import empty_result, result_problems, write_json_atomic
from bench.scoring.stats import wilson_interval

REPO = Path(__file__).resolve().parents[1]
MIB = 1024**2
N = 400
BEFORE = 100
TRAINED = {"weight_bytes": 4 * MIB, "grad_bytes": 4 * MIB, "optimizer_bytes": 8 * MIB, "params": 1_000_000,
           "trainable_params": 1_000_000}
FROZEN = {"weight_bytes": 1 * MIB, "grad_bytes": 0, "optimizer_bytes": 0, "params": 500_000, "trainable_params": 0}
METHODS: dict[str, dict[str, Any]] = {
    "grpo": {"label": "GRPO (TRL)", "engine": "trl", "nets": ("actor", "reference"), "after": 160, "cps": 160.0},
    "grpo_engine": {"label": "GRPO (suite engine)", "engine": "suite", "nets": ("actor", "reference"),
                    "after": 156, "cps": 200.0},
    "ppo": {"label": "PPO (reward model)", "engine": "suite", "nets": ("actor", "critic", "reward", "reference"),
            "after": 60, "cps": 120.0},
    "ppo_verifier": {"label": "PPO (verifier reward)", "engine": "suite", "nets": ("actor", "critic", "reference"),
                     "after": 158, "cps": 125.0},
    "dpo": {"label": "DPO (TRL, pool pairs)", "engine": "trl", "nets": ("actor", "reference"), "after": 110,
            "cps": None},
    "control": {"label": "Control (lr 0)", "engine": "suite", "nets": ("actor", "reference"), "after": 100,
                "cps": 190.0},
}
FRONTIER: dict[str, dict[str, Any]] = {
    name: {"label": f"{label} (suite engine)", "engine": "suite", "nets": ("actor", "reference"), "after": after,
           "cps": 200.0}
    for name, label, after in (("dr_grpo", "Dr. GRPO", 164), ("dapo", "DAPO", 172), ("gspo", "GSPO", 168),
                               ("cispo", "CISPO", 150), ("sapo", "SAPO", 160), ("rloo", "RLOO", 152),
                               ("reinforce_pp", "REINFORCE++", 148))
}
"""GRPO's successors on the suite engine (for the ablation ladder and their claims); in no default fixture."""
INFO = {**METHODS, **FRONTIER}
ENVIRONMENT = {"time_utc": "2026-11-30T12:00:00+00:00", "os": "Linux", "python": "3.11.7",
               "cpu_model": "Test Xeon", "cpu_count_logical": 2, "ram_bytes": 8 * 1024**3, "gpu_count": 0,
               "gpus": [], "packages": {"torch": "2.13.0", "transformers": "5.24.0", "trl": "1.16.0"},
               "suite_version": "0.1.0", "git_commit": "0123456789abcdef0123456789abcdef01234567", "git_dirty": True}
RUN_COMMAND = "bench run --preset cpu-tiny train.steps=10"


def _score(correct: int, total: int = N) -> dict[str, Any]:
    low, high = wilson_interval(correct, total)
    return {"correct": correct, "total": total, "accuracy": correct / total, "low": low, "high": high}


def method_result(method: str, seed: int = 0, status: str = "ok", source: str = "cpu-rss",
                  peak_mib: float = 700.0) -> dict[str, Any]:
    """A well-formed result for one of :data:`METHODS` (``status='failed'`` carries an OOM error)."""
    info = INFO[method]
    res = empty_result(f"{method}-s{seed}", "method", method, info["label"], info["engine"], seed)
    res.update(status=status, started_at="2026-11-30T12:00:00+00:00", finished_at="2026-11-30T12:01:00+00:00")
    res["environment"] = dict(ENVIRONMENT)
    res["spec"] = {"preset": "cpu-tiny", "train": {"group_size": 8}}
    res["settings"] = {"learning_rate": 0.0 if method == "control" else 1e-4, "beta": 0.04}
    nets = {n: dict(TRAINED if n in ("actor", "critic") else FROZEN) for n in info["nets"]}
    peak = int((peak_mib + 10 * len(nets)) * MIB)
    res["memory"] = {"peak_bytes": peak, "source": source, "kind": "high-water mark", "baseline_bytes": 600 * MIB,
                     "phases": {"generation": {"peak_bytes": peak - 5 * MIB, "source": source},
                                "update": {"peak_bytes": peak, "source": source}},
                     "networks": nets}
    if status != "ok":
        res["error"] = {"type": "OutOfMemoryError", "message": "CUDA out of memory. Tried to allocate 2.00 GiB",
                        "memory_at_failure": "74.2 GiB"}
        return res
    res["accuracy"] = {"n_questions": N, "before": {"strict": _score(BEFORE), "flexible": _score(BEFORE + 10)},
                       "after": {"strict": _score(info["after"]), "flexible": _score(info["after"] + 10)}}
    cps = info["cps"]
    res["throughput"] = {"wall_s": 60.0, "setup_s": 5.0, "train_s": 50.0, "steps": 100,
                         "completions": 0 if cps is None else int(cps * 50),
                         "generated_tokens": 0 if cps is None else int(cps * 50 * 20),
                         "completions_per_s": cps, "tokens_per_s": None if cps is None else cps * 20,
                         "step_s_median": 0.5 if cps is None else 64 / cps, "step_s_p90": 0.6}
    phases = {"generation": 20.0, "reward": 2.0, "update": 15.0, "other": 1.0}
    if "reference" in nets:
        phases["reference"] = 3.0
    if "critic" in nets:
        phases["critic"] = 9.0
    if cps is None:
        phases = {"update": 40.0, "other": 2.0}
    res["phases"] = {p: {"time_s": t, "count": 100} for p, t in phases.items()}
    res["curves"] = curves(method)
    res["monitors"] = {"eval": eval_monitors(method)}
    res["training_change"] = {"params_changed_fraction": 0.0 if method == "control" else 1.0,
                              "trainable_params": 1_000_000, "method": "exact"}
    res["samples"] = [{"question": "What is 2 + 2?", "completion": "<think>2+2</think> <answer>4</answer>",
                       "gold": "4", "correct": True}]
    return res


def curves(method: str) -> list[dict[str, float]]:
    """20 logged points (steps 1, 6, ..., 96) in the canonical names; the last fifth is points 16-19.

    Every online method: entropy 1.0 - 0.01 i, grad norm 0.5, clip fraction 0.1, zero-variance groups 0.25,
    completion length 20 + i, reflection rate 0.005 i (last fifth: entropy 0.825, length 37.5, reflection 8.75%).
    PPO adds value loss 0.2 and explained variance 0.5; PPO (reward model) logs a reward-model score rising
    1.0 + 0.01 i while its verifier accuracy reward falls 0.40 - 0.005 i (first fifth 1.015 / 39.25%, last fifth
    1.175 / 31.25%: over-optimisation) and 30% truncated completions (a monitor flag). The lr-0 control's reward
    wanders by chance and it never reflects. DPO logs only its offline pair metrics (loss, pair accuracy, margin)
    and a gradient norm of 2.0.
    """
    if method == "dpo":  # offline: DPO logs its pair metrics, none of the online dynamics
        return [{"step": step, "loss": 0.69 - 0.001 * step, "pair_accuracy": 0.6, "margin": 0.1, "grad_norm": 2.0}
                for step in range(1, 101, 5)]
    points = []
    for i, step in enumerate(range(1, 101, 5)):
        control = method == "control"
        p: dict[str, float] = {"step": step, "reward": 0.42 + 0.01 * (step % 3) if control else 0.40 + 0.002 * step,
                               "kl": 0.001 * step, "completion_length": 20.0 + i, "entropy": 1.0 - 0.01 * i,
                               "grad_norm": 0.5, "clipfrac": 0.1, "zero_std_groups": 0.25,
                               "reflection_rate": 0.0 if control else 0.005 * i}
        if method in ("ppo", "ppo_verifier"):
            p.update(value_loss=0.2, explained_variance=0.5)
        if method == "ppo":
            p.update(rm_score=1.0 + 0.01 * i, accuracy_reward=0.40 - 0.005 * i, truncated_rate=0.3)
        points.append(p)
    return points


EVAL_MONITORS = {"empty_answer_rate": 0.05, "format_only_rate": 0.1, "repeated_ngram_rate": 0.02,
                 "answer_in_think_rate": 0.3, "truncated_rate": 0.01, "reflection_rate": 0.1,
                 "reflection_count": 0.2, "completion_length": 25.0}
"""The final evaluation's monitors of every ok method; PPO (reward model) gives no answer on 60% (a flag)."""


def eval_monitors(method: str) -> dict[str, float]:
    return {**EVAL_MONITORS, "empty_answer_rate": 0.6} if method == "ppo" else dict(EVAL_MONITORS)


def stage_result(name: str, label: str) -> dict[str, Any]:
    res = empty_result(f"{name}-s0", "stage", name, label, "trl", 0)
    res.update(status="ok", started_at="2026-11-30T11:00:00+00:00", finished_at="2026-11-30T11:01:00+00:00",
               environment=dict(ENVIRONMENT), spec={"preset": "cpu-tiny"})
    res["throughput"] = {"wall_s": 30.0}
    if name == "warm_start":  # the start's own evaluation monitors: what every method began from
        res["monitors"] = {"eval": {**EVAL_MONITORS, "reflection_rate": 0.02, "completion_length": 18.0}}
    # 132 of 200 held-out pairs right: 66.0% [59.2, 72.2], above chance and its untrained head's 50.0% (a reward
    # model that learned; tests of one that did not set its accuracy themselves)
    res["metrics"] = ({"pair_accuracy": 0.546, "heldout_pairs": 200, "heldout_pair_accuracy": 0.66,
                       "heldout_pair_accuracy_untrained": 0.5}
                      if name == "reward_model" else {})
    return res


def _verdicts(run_dir: Path, correct: int, records: list[dict[str, Any]] | None = None) -> None:
    # Question i is right for every method when i < min(correct): methods differ only on the questions above.
    lines = [json.dumps({"index": i, "correct_strict": i < correct, "correct_flexible": i < correct,
                         **(records[i] if records else {})})
             for i in range(N)]
    (run_dir / "eval_after.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_suite(root: Path, methods: tuple[str, ...] = tuple(METHODS), failed: tuple[str, ...] = (),
                source: str = "cpu-rss", peak_mib: float = 700.0, completion: str | None = None,
                name: str = "suite", seeds: tuple[int, ...] = (0,),
                edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """Write a suite folder under ``root``; ``failed`` methods fail with an OOM; ``completion`` replaces the first
    method's sample completion (hostile or huge text); every method runs once per seed in ``seeds``; ``edit``
    changes each method's result in place before it is written (its per-question file follows the edited strict
    score and may carry the result's ``_records``: one dict per question merged into its line). Returns the
    folder."""
    suite = root / name
    stages = [("warm_start", "Warm start (SFT)"), ("sample_pool", "Sample pool"), ("reward_model", "Reward model")]
    runs = [f"{s}-s0" for s, _ in stages] + [f"{m}-s{seed}" for seed in seeds for m in methods]
    write_json_atomic(suite / "suite.json", {
        "preset": "cpu-tiny", "description": "fabricated suite for the report tests",
        "created_at": "2026-11-30T12:00:00+00:00", "runs": runs,
        "spec": {"preset": "cpu-tiny", "parallel_runs": 1, "train": {"steps": 100, "group_size": 8}},
        "commands": {"run": RUN_COMMAND, "resume": f"bench run --preset cpu-tiny --out {suite} --resume "
                                                   f"train.steps=10"},
    })
    for stage, label in stages:
        write_json_atomic(suite / "runs" / f"{stage}-s0" / "result.json", stage_result(stage, label))
        if stage == "warm_start":  # the start every method is tested against, question by question
            _verdicts(suite / "runs" / f"{stage}-s0", BEFORE)
    for i, (seed, method) in enumerate((seed, m) for seed in seeds for m in methods):
        res = method_result(method, seed, status="failed" if method in failed else "ok", source=source,
                            peak_mib=peak_mib)
        if completion is not None and i == 0:
            res["samples"] = [{"question": "Q?", "completion": completion, "gold": "4", "correct": False}]
        if edit is not None:
            edit(res)
        records = res.pop("_records", None)
        assert res["status"] != "ok" or not result_problems(res), result_problems(res)
        run_dir = suite / "runs" / res["run_id"]
        write_json_atomic(run_dir / "result.json", res)
        if res["status"] == "ok":
            _verdicts(run_dir, res["accuracy"]["after"]["strict"]["correct"], records)
    return suite


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "trl", "peft", "datasets"):
            raise ImportError(f"{name} is blocked: the report must build without it")
        return None
sys.meta_path.insert(0, Block())
"""


def run_without_torch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`bench ARGS` in a subprocess in which importing torch (or transformers, trl, ...) raises."""
    site = tmp_path / "blocker"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    code = "import sys; from bench.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {"PYTHONPATH": f"{site}:{REPO}", "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg", "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd=tmp_path)
