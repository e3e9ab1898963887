"""End-to-end runs of the suite engine (PPO with a reward model, PPO with the verifier, GRPO) on a tiny model.

Everything is built in a temporary folder: a byte-level BPE tokenizer trained on a few arithmetic strings, a
random Qwen2 causal LM (hidden 32, 2 layers) and a random one-label Qwen2 reward model. No network access.
"""

from __future__ import annotations

import contextlib
import math
import random
from pathlib import Path

import pytest
import torch

from bench.model.loading import load_tokenizer
from baselines import grpo_engine, ppo
from bench.execution.context import RunContext
from bench.config.spec import Spec

STEPS, PROMPTS, G, NEW_TOKENS = 3, 2, 4, 8


class FakeTelemetry:
    """The members the engine uses: phase(), step_begin/end(), counters."""

    def __init__(self) -> None:
        self.counters: dict[str, int] = {"completions": 0, "generated_tokens": 0}
        self.phases: list[str] = []
        self.steps_begun = 0
        self.steps_ended = 0

    @contextlib.contextmanager
    def phase(self, name: str):
        self.phases.append(name)
        yield

    def step_begin(self) -> None:
        self.steps_begun += 1

    def step_end(self) -> None:
        self.steps_ended += 1

    def trainer_callback(self):
        """Like the real telemetry callback (steps from on_step_begin/end), recording every hook it sees."""
        from transformers import TrainerCallback

        fake = self
        fake.events = []

        class Recorder(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                fake.events.append("on_train_begin")

            def on_step_begin(self, args, state, control, **kwargs):
                fake.events.append("on_step_begin")
                fake.step_begin()

            def on_step_end(self, args, state, control, **kwargs):
                fake.events.append("on_step_end")
                fake.step_end()

            def on_log(self, args, state, control, logs=None, **kwargs):
                fake.events.append("on_log")

            def on_train_end(self, args, state, control, **kwargs):
                fake.events.append("on_train_end")

        return Recorder()


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread


def _rows(n: int) -> list[dict[str, str]]:
    rng = random.Random(0)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        rows.append({"prompt": f"Question: What is {a} + {b}?\nAnswer: ", "answer": str(a + b),
                     "question": f"What is {a} + {b}?"})
    return rows


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> tuple[Path, Path]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (AutoConfig, AutoModelForSequenceClassification, PreTrainedTokenizerFast, Qwen2Config,
                              Qwen2ForCausalLM)

    root = tmp_path_factory.mktemp("engine_models")
    corpus = [r["prompt"] + f"<think>{r['answer']}</think> <answer>{r['answer']}</answer>" for r in _rows(200)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=200, special_tokens=["<pad>", "<eos>", "<bos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    policy = Qwen2ForCausalLM(config)
    policy.generation_config.pad_token_id = tokenizer.pad_token_id
    policy.generation_config.eos_token_id = tokenizer.eos_token_id
    policy_dir = root / "policy"
    policy.save_pretrained(policy_dir)
    tokenizer.save_pretrained(policy_dir)

    rm_config = AutoConfig.from_pretrained(policy_dir)
    rm_config.num_labels = 1  # transformers 5.x: set on a config copy, not as a from_config keyword
    rm_config.pad_token_id = tokenizer.pad_token_id
    reward_model = AutoModelForSequenceClassification.from_config(rm_config)
    rm_dir = root / "reward_model"
    reward_model.save_pretrained(rm_dir)
    tokenizer.save_pretrained(rm_dir)
    return policy_dir, rm_dir


def _context(tmp_path: Path, model_dirs: tuple[Path, Path], method: str, method_spec) -> RunContext:
    policy_dir, rm_dir = model_dirs
    spec = Spec()
    spec.train.steps = STEPS
    spec.train.prompts_per_step = PROMPTS
    spec.train.group_size = G
    spec.train.log_every = 1
    spec.train.learning_rate = 1e-3  # large enough that every weight visibly moves in three steps
    spec.generation.max_new_tokens = NEW_TOKENS
    spec.methods[method] = method_spec
    progress: list[tuple[int, int]] = []
    ctx = RunContext(
        spec=spec, method=method, method_spec=method_spec, seed=0, run_dir=tmp_path, device="cpu",
        init_model_dir=policy_dir, train_rows=_rows(5), telemetry=FakeTelemetry(), tokenizer=load_tokenizer(policy_dir),
        progress=lambda step, total, metrics: progress.append((step, total)),
        reward_model_dir=rm_dir if getattr(method_spec, "reward", None) == "model" else None,
    )
    ctx.stage_outputs["progress"] = progress
    return ctx


def _initial_weights(policy_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(policy_dir).state_dict().items()}


def _check_common(ctx: RunContext, outcome, initial: dict[str, torch.Tensor], roles: set[str]) -> None:
    tel = ctx.telemetry
    assert set(outcome.networks) == roles
    assert outcome.completions == STEPS * PROMPTS * G
    assert tel.counters["completions"] == STEPS * PROMPTS * G
    assert 0 < outcome.generated_tokens <= STEPS * PROMPTS * G * NEW_TOKENS
    assert tel.steps_begun == tel.steps_ended == STEPS
    # The engine fires TrainerCallback hooks in the Trainer's order, so telemetry attaches as for TRL.
    assert tel.events == ["on_train_begin"] + ["on_step_begin", "on_step_end", "on_log"] * STEPS + ["on_train_end"]
    assert ctx.stage_outputs["progress"] == [(s, STEPS) for s in range(1, STEPS + 1)]
    m = ctx.method_spec
    assert outcome.steps == STEPS * m.ppo_epochs * m.minibatches
    assert outcome.trained_tokens and outcome.trained_tokens > 0
    assert [p["step"] for p in outcome.log_history] == list(range(1, STEPS + 1))
    for point in outcome.log_history:
        for key in ("reward", "reward_std", "accuracy_reward", "format_reward", "kl", "loss", "clipfrac",
                    "approx_kl", "entropy", "completion_length", "eos_rate", "learning_rate"):
            assert math.isfinite(point[key]), (key, point)
    # the actor moved, the reference did not
    actor = outcome.networks["actor"].state_dict()
    assert any(not torch.equal(actor[k], initial[k]) for k in initial)
    if "reference" in outcome.networks:
        reference = outcome.networks["reference"].state_dict()
        assert all(torch.equal(reference[k], initial[k]) for k in initial)
        assert not any(p.requires_grad for p in outcome.networks["reference"].parameters())
    assert outcome.policy is outcome.networks["actor"]
    assert hasattr(outcome.policy, "generate")


def test_ppo_with_reward_model(tmp_path, model_dirs):
    ctx = _context(tmp_path, model_dirs, "ppo", ppo.Config(reward="model", ppo_epochs=2, minibatches=2))
    initial = _initial_weights(model_dirs[0])
    outcome = ppo.train(ctx)
    _check_common(ctx, outcome, initial, {"actor", "critic", "reward", "reference"})
    assert set(outcome.optimizers) == {"actor", "critic"}
    assert not any(p.requires_grad for p in outcome.networks["reward"].parameters())
    for point in outcome.log_history:
        for key in ("value_loss", "vf_clipfrac", "non_score_reward", "rm_score", "explained_variance"):
            assert key in point
        assert math.isfinite(point["value_loss"])
    assert set(ctx.telemetry.phases) == {"generation", "reward", "reference", "critic", "advantage", "update"}
    assert outcome.settings["reward_source"] == "model" and outcome.settings["critic_init"] == "policy"
    assert ppo.networks(ctx.spec, ctx.method_spec) == ("actor", "critic", "reward", "reference")
    assert outcome.settings["critic_learning_rate"] == pytest.approx(10 * ctx.spec.train.learning_rate)
    assert outcome.optimizers["critic"].param_groups[0]["lr"] == pytest.approx(10 * ctx.spec.train.learning_rate)


def test_ppo_with_verifier_and_reward_model_critic(tmp_path, model_dirs):
    # critic_init=reward_model with the verifier reward: the critic starts from the reward model, which itself
    # is not kept resident (no 'reward' role).
    ctx = _context(tmp_path, model_dirs, "ppo_verifier", ppo.Config(reward="verifier", critic_init="reward_model"))
    ctx.reward_model_dir = model_dirs[1]
    initial = _initial_weights(model_dirs[0])
    outcome = ppo.train(ctx)
    _check_common(ctx, outcome, initial, {"actor", "critic", "reference"})
    assert outcome.settings["reward_source"] == "verifier"
    assert ppo.networks(ctx.spec, ctx.method_spec) == ("actor", "critic", "reference")
    assert ppo.needs(ctx.spec, ctx.method_spec) == ("warm_start", "sample_pool", "reward_model")


def test_grpo_engine(tmp_path, model_dirs):
    # A random model scores 0 on every completion; the missing-EOS penalty makes the scores in a group differ,
    # so the group advantages are non-zero and the actor must move. Seeded: whether some group has both ended and
    # unended completions depends on the sampling RNG, which earlier tests in the module would otherwise advance.
    torch.manual_seed(3)
    ctx = _context(tmp_path, model_dirs, "grpo_engine",
                   grpo_engine.Config(ppo_epochs=1, minibatches=2, missing_eos_penalty=1.0))
    initial = _initial_weights(model_dirs[0])
    outcome = grpo_engine.train(ctx)
    _check_common(ctx, outcome, initial, {"actor", "reference"})
    assert set(outcome.optimizers) == {"actor"}
    assert "critic" not in ctx.telemetry.phases
    # the group-relative advantage is timed as its own phase (the claims check 'advantage-negligible' reads it)
    assert ctx.telemetry.phases.count("advantage") == STEPS
    for point in outcome.log_history:
        assert 0.0 <= point["zero_std_groups"] <= 1.0
        assert point["kl"] >= 0.0  # k3
    assert outcome.settings["kl_placement"] == "loss term beta * k3 x ratio"  # TRL 1.16 use_bias_correction_kl


def test_grpo_engine_single_update_reuses_logp_and_beta_zero_drops_reference(tmp_path, model_dirs, monkeypatch):
    from baselines.rollout_engine import Engine

    ctx = _context(tmp_path, model_dirs, "grpo_engine", grpo_engine.Config(beta=0.0))
    ctx.spec.train.steps = 1
    forwards = []
    original = Engine.rollout_logprobs
    monkeypatch.setattr(Engine, "rollout_logprobs",
                        lambda self, model, batch: forwards.append(model) or original(self, model, batch))
    outcome = grpo_engine.train(ctx)
    assert set(outcome.networks) == {"actor"}
    assert "reference" not in ctx.telemetry.phases
    assert forwards == []  # one update per rollout: no separate rollout forward of the actor (nor a reference)
    assert outcome.log_history[0]["clipfrac"] == 0.0 and outcome.log_history[0]["kl"] == 0.0

    forwards.clear()
    ctx = _context(tmp_path, model_dirs, "grpo_engine", grpo_engine.Config(beta=0.0, minibatches=2))
    ctx.spec.train.steps = 1
    grpo_engine.train(ctx)
    assert len(forwards) == 1  # two updates per rollout: the rollout log-probs are computed once, before them


def test_engine_settings_are_validated_by_the_spec():
    from bench.errors import SpecError
    from bench.config.loading import load_spec

    with pytest.raises(SpecError, match="minibatches"):
        load_spec("cpu-quick", ["methods.ppo_verifier.minibatches=3"])
    with pytest.raises(SpecError, match="ppo_epochs"):
        load_spec("cpu-quick", ["methods.grpo_engine.ppo_epochs=0"])
    with pytest.raises(SpecError, match="unknown key 'methods.dpo.gamma'"):
        load_spec("cpu-quick", ["methods.dpo.gamma=0.9"])  # DPO has no GAE settings


def test_logprobs_match_the_sampling_distribution(tmp_path, model_dirs):
    """old_logp must be the log-prob under the distribution that sampled the token: same positions with left
    padding, logits / temperature, and the same value from the training-mode minibatch forward."""
    from baselines import rl_math as M
    from baselines.engine_rollout import Rollout, sequence_inputs
    from baselines.rollout_engine import Engine

    ctx = _context(tmp_path, model_dirs, "ppo_verifier", ppo.Config(reward="verifier"))
    ctx.spec.generation.temperature = 0.7
    engine = Engine(ctx, ctx.method_spec, kl_coef=0.0)
    actor, tok = engine.actor, engine.tokenizer
    prompts = ["Question: What is 1 + 2?\nAnswer: ", "Question: What is 13 + 17?\nAnswer: 3"]  # unequal lengths
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert (enc["attention_mask"][:, 0] == 0).any()  # some left padding is exercised
    torch.manual_seed(0)
    out = actor.generate(**enc, do_sample=True, max_new_tokens=NEW_TOKENS, temperature=0.7, top_p=1.0, top_k=0,
                         pad_token_id=tok.pad_token_id, eos_token_id=engine.eos_ids, output_logits=True,
                         return_dict_in_generate=True)
    completion, mask = M.truncate_after_eos(out.sequences[:, enc["input_ids"].shape[1]:], engine.eos_ids,
                                            tok.pad_token_id)
    raw_logits = torch.stack(out.logits, dim=1)  # (b, T, V) unprocessed logits of each sampling step
    sampled = M.logprobs_from_logits(raw_logits / 0.7, completion)
    inputs = sequence_inputs(enc["input_ids"], enc["attention_mask"], completion, mask)
    batch = Rollout([{}, {}], *inputs, completion, mask, torch.ones(2, dtype=torch.bool), ["", ""])
    logp = engine.rollout_logprobs(actor, batch)
    actor.train()
    with torch.no_grad():
        logp_train, _ = engine.logprobs(actor, batch, torch.tensor([1, 0]))
    order = torch.tensor([1, 0])
    assert torch.allclose(logp[mask], sampled[mask], atol=1e-4)
    assert torch.allclose(logp_train[mask[order]], logp[order][mask[order]], atol=1e-5)


def test_micro_batches_give_the_minibatch_gradient(tmp_path, model_dirs):
    """Gradient accumulation over micro-batches of 1 or 4 gives the gradient of the whole minibatch (the loss is
    normalised by the minibatch's token count, not the micro-batch's), for the actor and the critic."""
    from baselines import rl_math as M
    from baselines.rollout_engine import Engine

    ctx = _context(tmp_path, model_dirs, "ppo_verifier", ppo.Config(reward="verifier"))
    engine = Engine(ctx, ctx.method_spec, kl_coef=0.0, critic_init="policy")
    torch.manual_seed(0)
    batch = engine.sample(1)
    lengths = torch.tensor([1, 8, 3, 5, 2, 8, 7, 4])  # ragged, as after EOS truncation
    batch.mask = torch.arange(batch.mask.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    advantages = torch.randn(batch.mask.shape)
    returns = torch.randn(batch.mask.shape)
    old_logp = engine.rollout_logprobs(engine.actor, batch)
    old_values = engine.rollout_values(batch)
    engine.actor.train()
    engine.critic.train()

    def loss_fn(rows, weights):
        logp, _ = engine.logprobs(engine.actor, batch, rows)
        pg, _ = M.clipped_policy_loss(logp, old_logp[rows], advantages[rows], 0.2)
        vf, _ = M.clipped_value_loss(engine.values(batch, rows), old_values[rows], returns[rows], 0.2)
        loss = (pg * weights).sum() + 0.1 * (vf * weights).sum()
        return loss, {"loss": loss}

    grads, losses = {}, {}
    for micro in (0, 1, 4):
        engine.micro_batch_size = micro
        for net in (engine.actor, engine.critic):
            net.zero_grad(set_to_none=True)
        rows = torch.arange(len(batch))
        stats = engine.accumulate(loss_fn, rows, M.loss_weights(batch.mask, "token_mean"))
        losses[micro] = stats["loss"].item()
        grads[micro] = torch.cat([p.grad.flatten() for net in (engine.actor, engine.critic)
                                  for p in net.parameters() if p.grad is not None])
    assert grads[0].abs().sum() > 0
    for micro in (1, 4):
        assert torch.allclose(grads[micro], grads[0], atol=1e-5), micro
        assert losses[micro] == pytest.approx(losses[0], abs=1e-6)
    # The naive alternative (each micro-batch normalised by its own tokens, averaged) is a different gradient here.
    for net in (engine.actor, engine.critic):
        net.zero_grad(set_to_none=True)
    for rows in torch.arange(len(batch)).split(4):
        loss, _ = loss_fn(rows, M.loss_weights(batch.mask[rows], "token_mean") / 2)
        loss.backward()
    naive = torch.cat([p.grad.flatten() for net in (engine.actor, engine.critic)
                       for p in net.parameters() if p.grad is not None])
    assert not torch.allclose(naive, grads[0], atol=1e-5)


def test_sampling_autocast_keeps_no_weight_cache(tmp_path, model_dirs, monkeypatch):
    """Under a bfloat16 spec the actor (fp32, requires_grad) generates under bf16 autocast with the weight cache
    off: a cached bf16 copy of every trained weight would stay resident for the whole generate call (13 GiB at
    7B). Training forwards keep the cache (their backward reuses the cast)."""
    from baselines import engine_step, rollout_engine

    ctx = _context(tmp_path, model_dirs, "grpo_engine", grpo_engine.Config(beta=0.0))
    ctx.spec.model.dtype = "bfloat16"
    engine = rollout_engine.Engine(ctx, ctx.method_spec, kl_coef=0.0)
    assert any(p.dtype == torch.float32 and p.requires_grad for p in engine.actor.parameters())
    seen: list[tuple[bool, bool]] = []
    original = engine_step.generate_with_logprobs

    def recording(*args, **kwargs):
        seen.append((torch.is_autocast_enabled("cpu"), torch.is_autocast_cache_enabled()))
        return original(*args, **kwargs)

    monkeypatch.setattr(engine_step, "generate_with_logprobs", recording)
    batch = engine.sample(1)
    assert len(batch) == PROMPTS * G
    assert seen == [(True, False)]  # bf16 autocast on, its weight cache off
    with engine.autocast():
        assert torch.is_autocast_cache_enabled()  # training forwards: unchanged
    assert torch.is_autocast_cache_enabled()  # the global flag is restored after sampling
