"""The control arm (baselines/control.py): the engine's GRPO loop at learning rate 0 leaves the policy exactly
where it started, so its greedy evaluation equals the starting checkpoint's on every question.

Runs on the tiny engine models of tests/test_rollout_engine.py (smaller than cpu-quick's), with the real
telemetry's parameter-change tracking.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from baselines import control
from bench.errors import SpecError
from bench.config.loading import load_spec
from test_rollout_engine import _context, _rows, model_dirs  # noqa: F401 (model_dirs is a pytest fixture)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The stored bit patterns (so -0.0 and 0.0, or two NaNs, compare as what they are)."""
    return tensor.detach().contiguous().view(torch.int32 if tensor.element_size() == 4 else torch.int16)


def _greedy(model, tokenizer, rows, spec) -> tuple[list[str], list[dict[str, bool]]]:
    """The evaluation's greedy completions (bench.scoring.evaluation.generate_greedy, the spec's decoding) and the verdict
    of every scoring mode on each question."""
    from bench.scoring.evaluation import generate_greedy
    from bench.model.generation import eos_token_ids, sampling_settings
    from bench.task.verifier import MODES, is_correct

    settings = sampling_settings(spec, tokenizer, eos_token_ids(model, tokenizer), greedy=True)
    texts, _ = generate_greedy(model, tokenizer, [r["prompt"] for r in rows], settings, batch_size=8)
    verdicts = [{mode: is_correct(text, row["answer"], mode) for mode in MODES} for row, text in zip(rows, texts)]
    return texts, verdicts


def _warm_started(policy_dir: Path, out: Path) -> Path:
    """A checkpoint that answers some questions: the tiny random policy after a few supervised steps on the
    tests' arithmetic rows (a random one greedily prints blanks, and every verdict would be False)."""
    from transformers import AutoModelForCausalLM

    from bench.model.loading import load_tokenizer

    tokenizer = load_tokenizer(policy_dir)
    model = AutoModelForCausalLM.from_pretrained(policy_dir)
    texts = [r["prompt"] + r["answer"] + tokenizer.eos_token for r in _rows(64)]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    for _ in range(30):
        loss = model(**enc, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_control_leaves_every_weight_and_every_verdict_unchanged(tmp_path, model_dirs):  # noqa: F811
    from transformers import AutoModelForCausalLM

    from bench.model.loading import load_tokenizer
    from bench.telemetry import Telemetry

    cfg = control.Config(enabled=True, missing_eos_penalty=1.0)  # scores differ within a group: non-zero gradients
    ctx = _context(tmp_path, model_dirs, "control", cfg)
    ctx.init_model_dir = _warm_started(model_dirs[0], tmp_path / "start")
    spec = ctx.spec
    spec.train.weight_decay = 0.1  # decoupled decay is lr x wd: must vanish with lr 0 too
    spec.train.lr_scheduler, spec.train.warmup_steps = "cosine", 1
    spec.eval.max_new_tokens = 8
    ctx.telemetry = Telemetry("cpu", enabled=False, track_training_change=True)
    start = AutoModelForCausalLM.from_pretrained(ctx.init_model_dir)
    tokenizer = load_tokenizer(ctx.init_model_dir)
    # Gold answers chosen so that the starting checkpoint gets some right (the last number of its greedy
    # completion): the verdicts compared below are then not all False.
    rows = _rows(16)
    texts, _ = _greedy(start, tokenizer, rows, spec)
    for row, text in zip(rows[::2], texts[::2]):
        numbers = re.findall(r"\d+", text)
        row["answer"] = numbers[-1] if numbers else row["answer"]
    before = _greedy(start, tokenizer, rows, spec)

    with ctx.telemetry:
        outcome = control.train(ctx)

    assert outcome.steps == spec.train.steps and outcome.completions > 0
    assert outcome.settings["mode"] == "control" and outcome.settings["learning_rate"] == 0
    assert all(math.isfinite(p["reward"]) for p in outcome.log_history)  # the reward curve, logged as GRPO's
    # Gradients flowed and AdamW stepped (its moments are non-zero), yet nothing moved: bit for bit.
    assert any(state["exp_avg"].abs().sum() > 0 for state in outcome.optimizers["actor"].state.values())
    trained = dict(outcome.policy.named_parameters())
    for name, weight in start.named_parameters():
        assert torch.equal(_bits(trained[name]), _bits(weight)), name
    change = ctx.telemetry.training_change()
    assert change["params_changed_fraction"] == 0.0 and change["update_to_weight_ratio"] == 0.0
    after = _greedy(outcome.policy, outcome.tokenizer, rows, spec)
    assert after[0] == before[0]  # the same completion, token for token, on every question
    assert after[1] == before[1]  # so the same verdict under every mode
    assert any(any(v.values()) for v in before[1])


def test_control_is_registered_off_by_default_and_refuses_a_learning_rate() -> None:
    from bench.config.registry import label

    assert label("control") == "Control (lr 0)"
    assert "control" not in load_spec("cpu-quick").enabled_methods()
    spec = load_spec("cpu-quick", ["methods.control.enabled=true"])
    assert "control" in spec.enabled_methods() and spec.methods["control"].learning_rate == 0.0
    with pytest.raises(SpecError, match=r"^'methods.control.learning_rate' must be 0 .*got 0.001"):
        load_spec("cpu-quick", ["methods.control.enabled=true", "methods.control.learning_rate=1e-3"])
    with pytest.raises(SpecError, match=r"^'methods.control.learning_rate' must be >= 0, got -1.0$"):
        load_spec("cpu-quick", ["methods.control.enabled=true", "methods.control.learning_rate=-1"])
