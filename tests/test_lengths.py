"""Max lengths derived from the data: long prompts keep their answers (DPO) and their pairs (reward model).

The old recipes passed max_length=256 to TRL; a long prompt then lost the answer (DPO truncates the end)
or the whole pair (RewardTrainer drops it). These tests build long prompts themselves (the repo's data
has none) and check the derived budget against TRL's own collator and RewardTrainer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.errors import UserError
from bench.task.lengths import LengthBudget, check_loss, pair_budget, sft_budget, token_lengths
from bench.model.loading import build_tiny_tokenizer

CORPUS = [
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many in May. "
    "How many clips did she sell altogether? <think>48 / 2 = 24, 48 + 24 = 72</think><answer>72</answer>",
    "Question: Weng earns 12 an hour for babysitting. Yesterday she did 50 minutes. How much did she earn? "
    "<think>12 / 60 * 50 = 10</think><answer>10</answer>",
] * 20

OLD_MAX_LENGTH = 256
"""What the recipes hard-coded before lengths were derived (tokens)."""


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer(CORPUS, 384)


def digits(n: int) -> str:
    """A prompt of exactly ``n`` tokens: the tiny tokenizer splits digits one per token."""
    return "7" * n


def sequence_tokens(tokenizer, prompt: str, completion: str) -> int:
    """Tokens TRL trains on for one example: prompt + completion + EOS, tokenised as TRL does."""
    return len(tokenizer(prompt + completion + tokenizer.eos_token)["input_ids"])


def long_pairs(count: int) -> list[dict[str, str]]:
    """GSM8K-like pairs whose prompts are far longer than 256 tokens."""
    story = "Question: A farmer has 17 cows and buys 23 more each week for 9 weeks; each cow eats 3 bales. "
    return [{"prompt": story * (4 + i % 3) + f"Case {i}. Answer:",
             "chosen": f" <think>17 + 23 * 9 = 224</think><answer>{224 + i}</answer>",
             "rejected": f" <think>17 + 23 = 40</think><answer>{40 + i}</answer>"} for i in range(count)]


def test_digits_are_one_token_each(tokenizer) -> None:
    assert token_lengths(tokenizer, [digits(1), digits(97), digits(300)]) == [1, 97, 300]
    assert token_lengths(tokenizer, []) == []


@pytest.mark.parametrize("drops", [False, True])
def test_derived_pair_length_covers_long_prompts(tokenizer, drops: bool) -> None:
    pairs = long_pairs(6)
    prompt_tokens = token_lengths(tokenizer, [p["prompt"] for p in pairs])
    assert min(prompt_tokens) > OLD_MAX_LENGTH  # the data this test is about
    budget = pair_budget(tokenizer, pairs, max_new_tokens=8, drops=drops)
    sequences = [sequence_tokens(tokenizer, p["prompt"], p[key]) for p in pairs for key in ("chosen", "rejected")]
    assert budget.max_length >= max(sequences)
    assert budget.longest == max(sequences)
    assert (budget.examples, budget.truncated, budget.dropped, budget.cap) == (6, 0, 0, None)


def test_max_new_tokens_reserves_room_for_any_generation(tokenizer) -> None:
    pairs = [{"prompt": digits(300), "chosen": " 1", "rejected": " 2"}]
    budget = pair_budget(tokenizer, pairs, max_new_tokens=512, drops=True)
    assert budget.max_length == 300 + 512 + 1  # longest prompt + max_new_tokens + EOS
    assert budget.to_dict()["max_length"] == 813 and budget.to_dict()["unit"] == "pairs"


def cap_pairs() -> list[dict[str, str]]:
    """Prompts of 40, 60, 97 and 300 tokens with short answers, for a cap of 100 tokens."""
    return [{"prompt": digits(n), "chosen": " The answer is 5.", "rejected": " The answer is 6."}
            for n in (40, 60, 97, 300)]


def test_cap_counts_what_dpo_truncates_and_drops(tokenizer) -> None:
    completion = sequence_tokens(tokenizer, "", " The answer is 5.")
    assert 4 <= completion <= 40  # so 97 + it is over the cap and 60 + it is not
    budget = pair_budget(tokenizer, cap_pairs(), max_new_tokens=8, drops=False, cap=100)
    assert budget.max_length == 100 and budget.cap == 100
    # DPO keeps the start: 97 + answer is cut, the 300-token prompt fills max_length and TRL drops the pair.
    assert (budget.truncated, budget.dropped) == (1, 1)


def test_cap_counts_what_the_reward_trainer_drops(tokenizer) -> None:
    budget = pair_budget(tokenizer, cap_pairs(), max_new_tokens=8, drops=True, cap=100)
    assert (budget.truncated, budget.dropped) == (0, 2)
    with pytest.raises(UserError) as error:
        check_loss(budget, "reward_model", "lower generation.max_new_tokens")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("reward_model would drop 50.0% of its 4 pairs")
    assert "100 tokens, the model's context" in message and "generation.max_new_tokens" in message


def test_sft_budget_derives_and_counts(tokenizer) -> None:
    rows = [{"prompt": digits(n), "completion": " <answer>12</answer>"} for n in (30, 280, 120)]
    full = max(sequence_tokens(tokenizer, r["prompt"], r["completion"]) for r in rows)
    budget = sft_budget(tokenizer, rows, max_new_tokens=4)
    assert budget.max_length >= full and (budget.truncated, budget.dropped) == (0, 0)
    capped = sft_budget(tokenizer, rows, max_new_tokens=4, cap=125)
    assert (capped.max_length, capped.truncated, capped.dropped) == (125, 1, 1)


def budget_losing(lost: int, examples: int) -> LengthBudget:
    return LengthBudget(max_length=100, examples=examples, truncated=lost, dropped=0, longest=300, cap=100)


def test_check_loss_allows_five_percent_and_stops_above() -> None:
    check_loss(budget_losing(5, 100), "dpo", "lower generation.max_new_tokens")
    check_loss(budget_losing(1, 20), "dpo", "lower generation.max_new_tokens")
    check_loss(budget_losing(0, 0), "dpo", "lower generation.max_new_tokens")
    with pytest.raises(UserError, match=r"^dpo would truncate 6\.0% .*lower generation\.max_new_tokens"):
        check_loss(budget_losing(6, 100), "dpo", "lower generation.max_new_tokens")


def trl_tokenize(tokenizer, pair: dict[str, str]) -> dict[str, list[int]]:
    """Tokenise a pair exactly as TRL 1.16's DPOTrainer does for plain-text data."""
    eos = tokenizer.eos_token
    prompt_ids = tokenizer(pair["prompt"])["input_ids"]
    chosen = tokenizer(pair["prompt"] + pair["chosen"] + eos)["input_ids"]
    rejected = tokenizer(pair["prompt"] + pair["rejected"] + eos)["input_ids"]
    assert chosen[:len(prompt_ids)] == prompt_ids and rejected[:len(prompt_ids)] == prompt_ids
    return {"prompt_ids": prompt_ids, "chosen_ids": chosen[len(prompt_ids):],
            "rejected_ids": rejected[len(prompt_ids):]}


def test_old_max_length_cut_the_dpo_answer_and_the_derived_one_keeps_it(tokenizer) -> None:
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    pair = {"prompt": digits(250), "chosen": " <think>3 + 4 = 7</think><answer>7</answer>",
            "rejected": " <think>3 + 4 = 8</think><answer>8</answer>"}
    example = trl_tokenize(tokenizer, pair)
    answer_tokens = len(example["chosen_ids"])

    def kept_chosen_tokens(max_length: int) -> int:
        batch = DataCollatorForPreference(pad_token_id=tokenizer.pad_token_id, max_length=max_length)([example])
        return int(batch["completion_mask"][0].sum())  # row 0 is prompt + chosen

    old = pair_budget(tokenizer, [pair], max_new_tokens=32, drops=False, cap=OLD_MAX_LENGTH)
    assert old.truncated == 1
    assert kept_chosen_tokens(OLD_MAX_LENGTH) < answer_tokens  # the answer at the end was lost
    derived = pair_budget(tokenizer, [pair], max_new_tokens=32, drops=False)
    assert derived.truncated == 0 and derived.dropped == 0
    assert kept_chosen_tokens(derived.max_length) == answer_tokens
    # A 300-token prompt alone fills 256 tokens: TRL drops such a pair; the budget counts it as dropped.
    longer = dict(pair, prompt=digits(300))
    assert pair_budget(tokenizer, [longer], max_new_tokens=32, drops=False, cap=OLD_MAX_LENGTH).dropped == 1


def test_reward_model_stage_keeps_every_long_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end on CPU (a few seconds): RewardTrainer sees every pair although each is over 256 tokens."""
    import baselines.reward_model as reward_model
    from bench.execution.context import RunContext
    from bench.task.data import tokenizer_corpus
    from bench.model.loading import load_tokenizer, tiny_model_dir
    from bench.config.loading import load_spec
    from bench.telemetry import Telemetry

    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    spec = load_spec("cpu-quick", ["reward_model.epochs=1", "reward_model.batch_size=8"])
    model_dir = tiny_model_dir(spec, tokenizer_corpus(spec))
    prompt = "Question: what is 3 + 4 + 5 + 6 + 7 + 8 + 9? " * 12
    pool = [{"prompt": prompt + f"Case {i}.", "answer": "42", "question": f"q{i}",
             "completions": ["<think>3+4+5+6+7+8+9=42</think><answer>42</answer>", f"<answer>{i}</answer>"],
             "correct": [True, False]} for i in range(10)]
    pool_path = tmp_path / "pool.jsonl"
    pool_path.write_text("".join(json.dumps(entry) + "\n" for entry in pool), encoding="utf-8")
    tokenizer = load_tokenizer(model_dir)
    assert min(token_lengths(tokenizer, [e["prompt"] for e in pool])) > OLD_MAX_LENGTH

    seen: list[int] = []

    class RecordingRewardTrainer(reward_model.RewardTrainer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            seen.append(len(self.train_dataset))  # after TRL's length filter

    monkeypatch.setattr(reward_model, "RewardTrainer", RecordingRewardTrainer)
    ctx = RunContext(spec=spec, method="reward_model", method_spec=None, seed=0, run_dir=tmp_path / "run",
                     device="cpu", init_model_dir=model_dir, train_rows=[], telemetry=Telemetry("cpu", enabled=False),
                     progress=lambda *a: None, pool_path=pool_path, tokenizer=load_tokenizer(model_dir))
    outcome = reward_model.train(ctx)
    lengths = outcome.metrics["lengths"]
    assert lengths["dropped"] == 0 and lengths["truncated"] == 0
    # ten questions, split by question: the held-out ones leave the rest, every one of them kept despite its length
    held_out = outcome.metrics["heldout_pairs"]
    assert held_out >= 1
    assert lengths["max_length"] > OLD_MAX_LENGTH
    assert lengths["examples"] == outcome.metrics["train_pairs"] == 10 - held_out
    assert seen == [9]
    pairs = [{"prompt": e["prompt"], "chosen": e["completions"][0], "rejected": e["completions"][1]} for e in pool]
    assert pair_budget(tokenizer, pairs, 16, drops=True, cap=OLD_MAX_LENGTH).dropped == 10  # what 256 did
