"""`bench tune` end to end: it picks the grid point with the higher validation score, never reads the test
split, and writes a tuned preset that reproduces the choice.

A stub method goes through the real path (the CLI, the per_method sweep, the runner, one worker subprocess per
point, the worker's evaluation and verifier): its "training" is one SGD step on a scalar ``skill`` with the
method's learning rate (skill = lr after the step), and its policy answers a question right when a hash of the
question falls under ``skill / FULL_SKILL_LR``. So the score is planted: learning rate 1e-3 answers every validation
question, 1e-4 about one in ten.

Workers are subprocesses, so the loader is audited from outside: a ``sitecustomize`` module on PYTHONPATH (imported
by every Python process at start-up, the runner and each worker alike) registers the stub and wraps
``bench.task.problems._problem_stream``, the one source of every synthetic split, to append each stream's seed
("1234/test", "1234/validation", ...) with the process id to an audit file. The tune must leave no test stream in
it; the tuned preset's real run (which evaluates on test) must, which shows the audit sees what workers load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from bench.config import registry
from bench.config.loading import load_spec
from bench.task.verifier import HEADLINE_MODE

REPO = Path(__file__).resolve().parents[1]
AUDIT_ENV = "BENCH_TEST_SPLIT_AUDIT"
LOW_LR, HIGH_LR = 1.0e-4, 1.0e-3
VALIDATION_SIZE = 24

STUB_RECIPE = '''"""A stub method for tests/test_tune_planted.py: its accuracy is planted by its learning rate."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from bench.execution.context import MethodConfig, TrainOutcome

LABEL = "Stub (planted score)"
ENGINE = "suite"
FULL_SKILL_LR = 1.0e-3
"""The learning rate at which the stub answers every question (skill = lr after one SGD step)."""


@dataclass
class Config(MethodConfig):
    """Only the fields every method has (enabled, learning_rate)."""


def networks(spec, cfg):
    return ("actor",)


def needs(spec, cfg):
    return ()


def validate(spec, cfg, key):
    return None


def describe(spec, cfg):
    return {"stub": "score planted by the learning rate"}


class StubPolicy(torch.nn.Module):
    """Answers a question right when sha256(question) % 1000 < 1000 * skill / FULL_SKILL_LR, else off by one."""

    def __init__(self, tokenizer, gold):
        super().__init__()
        self.skill = torch.nn.Parameter(torch.zeros(()))
        self.generation_config = SimpleNamespace(eos_token_id=None)
        self.tokenizer, self.gold = tokenizer, gold

    def knows(self, question):
        share = min(1.0, float(self.skill) / FULL_SKILL_LR)
        return int(hashlib.sha256(question.encode()).hexdigest(), 16) % 1000 < round(1000 * share)

    def generate(self, input_ids, attention_mask, generation_config):
        eos = generation_config.eos_token_id
        eos = eos[0] if isinstance(eos, (list, tuple)) else eos
        rows = []
        for ids in input_ids.tolist():
            prompt = self.tokenizer.decode(ids, skip_special_tokens=True)
            question = next(q for q in self.gold if q in prompt)
            answer = self.gold[question] if self.knows(question) else str(int(self.gold[question]) + 1)
            new = self.tokenizer(f"<answer>{answer}</answer>", add_special_tokens=False)["input_ids"] + [eos]
            rows.append(ids + new[: generation_config.max_new_tokens])
        width = max(len(r) for r in rows)
        pad = generation_config.pad_token_id
        return torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long)


def train(ctx):
    from bench.task.data import load_task, tokenizer_corpus
    from bench.model.loading import initial_model_source, load_tokenizer

    tokenizer = load_tokenizer(initial_model_source(ctx.spec, tokenizer_corpus(ctx.spec)))
    data = load_task(ctx.spec)  # the evaluated split, as the worker loaded it: the stub's answer key
    policy = StubPolicy(tokenizer, {p["question"].strip(): p["answer"].split("####")[-1].strip()
                                    for p in data.evaluated})
    lr = ctx.method_spec.resolved_learning_rate(ctx.spec)
    optimizer = torch.optim.SGD(policy.parameters(), lr=lr)
    ctx.telemetry.train_begin(policy)
    (-policy.skill).backward()  # d(-skill)/d(skill) = -1: one step moves skill from 0 to lr
    optimizer.step()
    ctx.telemetry.train_end(policy)
    ctx.progress(1, 1, {"reward": float(policy.skill)})
    return TrainOutcome(policy=policy, tokenizer=tokenizer, networks={"actor": policy},
                        optimizers={"actor": optimizer}, log_history=[{"step": 1, "reward": float(policy.skill)}],
                        steps=1, metrics={"worker_pid": os.getpid()})
'''

SITECUSTOMIZE = f'''"""Test hook of tests/test_tune_planted.py: the stub method, and an audit of every split stream."""

import os

if os.environ.get("{AUDIT_ENV}"):
    from bench.config import registry
    from bench.task import problems as tasks

    registry.METHODS["stub"] = registry.Entry("stub_recipe")
    _real_stream = tasks._problem_stream

    def _audited_stream(seed, *args, **kwargs):
        with open(os.environ["{AUDIT_ENV}"], "a", encoding="utf-8") as log:
            log.write(f"{{os.getpid()}} {{seed}}\\n")
        return _real_stream(seed, *args, **kwargs)

    tasks._problem_stream = _audited_stream
'''


@pytest.fixture
def hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The stub recipe and the audit hook in a folder on PYTHONPATH; the stub registered in this process too, so
    the tuned preset loads here. Returns the environment for `bench` subprocesses."""
    folder = tmp_path / "hooks"
    folder.mkdir()
    (folder / "stub_recipe.py").write_text(STUB_RECIPE, encoding="utf-8")
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setitem(registry.METHODS, "stub", registry.Entry("stub_recipe"))
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, BENCH_CACHE_DIR=str(tmp_path / "cache"),
                **{AUDIT_ENV: str(tmp_path / "audit.log")})


def _bench(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def _streams(env: dict[str, str]) -> list[tuple[int, str]]:
    """(process id, split stream seed) per audited stream, in order."""
    path = Path(env[AUDIT_ENV])
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return [(int(pid), seed) for pid, seed in (line.split(" ", 1) for line in lines)]


def test_a_tune_picks_the_planted_best_never_reads_test_and_its_preset_reproduces_it(
        tmp_path: Path, hooks: dict[str, str]) -> None:
    grid = tmp_path / "grid.yaml"
    # The preset's own rate (1e-4) first, as the shipped grids do: a pick by grid order alone would be wrong.
    grid.write_text(yaml.safe_dump({"cpu-quick": {"validation_size": VALIDATION_SIZE, "methods": {
        "stub": {"axes": {"methods.stub.learning_rate": [LOW_LR, HIGH_LR]}}}}}), encoding="utf-8")
    out = tmp_path / "tune"
    proc = _bench(hooks, "tune", "--preset", "cpu-quick", "--methods", "stub", "--seeds", "1", "--grid", str(grid),
                  "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]

    # Every point was a worker that evaluated the validation split, and the planted score came through.
    scores, workers = {}, set()
    for point in ("base", "lr0.001"):
        result = json.loads((out / "runs" / f"stub-s0@{point}" / "result.json").read_text(encoding="utf-8"))
        workers.add(result["metrics"]["worker_pid"])
        assert result["status"] == "ok" and result["spec"]["eval"]["split"] == "validation"
        assert result["data_checks"]["eval_split"] == "validation" and result["data_checks"]["working_overlap"] == 0
        assert result["accuracy"]["n_questions"] == VALIDATION_SIZE
        scores[point] = result["accuracy"]["after"][HEADLINE_MODE]["accuracy"]
    assert scores["lr0.001"] == 1.0 and scores["base"] < 0.5

    # The test split was never generated, in the runner or in any worker; each worker's validation stream shows the
    # hook was active in that very process.
    streams = _streams(hooks)
    assert not [s for s in streams if s[1].endswith("/test")], streams
    assert len(workers) == 2 and workers <= {pid for pid, seed in streams if seed.endswith("/validation")}

    # The tuned preset holds the higher-scoring value and reproduces it on load.
    path = out / "tuned-cpu-quick.yaml"
    tuned = load_spec(path)
    assert tuned.methods["stub"].learning_rate == pytest.approx(HIGH_LR)
    record = tuned.tuning.methods["stub"]
    assert record["chosen"] == {"methods.stub.learning_rate": HIGH_LR} and record["point"] == "lr0.001"
    assert record["score"]["mean"] == pytest.approx(1.0) and record["default_point"] == "base"
    assert tuned.eval.split == "test" and tuned.task.validation_size == 0

    # Running the tuned preset (`bench run --preset tuned-cpu-quick.yaml`, the line the tune prints) trains at the
    # chosen rate and evaluates on test, which the audit now records: the absence of test streams above is the
    # hook's finding, not its blindness.
    before = len(streams)
    run_dir = tmp_path / "run"
    others = [f"methods.{m}.enabled=false" for m in registry.METHODS if m not in ("stub", "control")]
    proc = _bench(hooks, "run", "--preset", str(path), "--out", str(run_dir), *others)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((run_dir / "runs" / "stub-s0" / "result.json").read_text(encoding="utf-8"))
    assert result["spec"]["methods"]["stub"]["learning_rate"] == pytest.approx(HIGH_LR)
    assert result["spec"]["eval"]["split"] == "test" and result["accuracy"]["n_questions"] == tuned.task.test_size
    assert result["accuracy"]["after"][HEADLINE_MODE]["accuracy"] == 1.0
    assert [s for s in _streams(hooks)[before:] if s[1].endswith("/test")]
    # The report says the method ran at tuned values, with the grid's size, n questions and seeds.
    summary = (run_dir / "summary.md").read_text(encoding="utf-8")
    assert (f"Stub (planted score): tuned on validation (2 grid points, n = {VALIDATION_SIZE}, seeds [0]; "
            f"chosen learning_rate = 0.001, validation 100.0%)") in summary, summary
