"""Model and tokenizer loading: the tiny offline model, hub models, local folders, random-init architectures.

The tiny model is what makes the CPU presets possible without a network: a byte-level BPE tokenizer
trained on the synthetic task's own text (digits split one per token, the four tag strings as single
tokens) and a small random-init Qwen2 decoder. Both are cached on disk, keyed by their settings.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from bench.errors import UserError
from bench.config.spec import ModelSpec, Spec
from bench.task.data import tokenizer_corpus
from bench.task.prompts import TAG_TOKENS

PAD, EOS = "<pad>", "<eos>"


def cache_root() -> Path:
    """Where built artefacts are cached: $BENCH_CACHE_DIR, else $XDG_CACHE_HOME/rlft-bench, else ~/.cache/rlft-bench."""
    if os.environ.get("BENCH_CACHE_DIR"):
        return Path(os.environ["BENCH_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "rlft-bench"


BUILD_MANIFEST = "manifest.json"
"""In every model folder the suite builds into its cache (tiny, architecture, random-init): each file's size and
sha256, written last, as bench.model.fetch writes for a fetched model."""


def write_build_manifest(folder: Path) -> None:
    """``folder/manifest.json``: every file's size and sha256 (bench.model.fetch.sha256_file), written last."""
    from bench.model.fetch import sha256_file

    files = {path.name: {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
             for path in sorted(Path(folder).iterdir()) if path.is_file() and path.name != BUILD_MANIFEST}
    (Path(folder) / BUILD_MANIFEST).write_text(json.dumps({"built_by": "bench", "files": files}, indent=1) + "\n",
                                               encoding="utf-8")


def build_problem(folder: Path) -> str | None:
    """What is wrong with a cached build (None: it matches its manifest, sizes and hashes)."""
    from bench.model.fetch import check_folder

    try:
        return check_folder(folder, hashes=True, version=None)
    except OSError as exc:  # a file that cannot be read is as unusable as a truncated one
        return f"unreadable ({exc.strerror or type(exc).__name__})"


def cached_build(folder: Path) -> bool:
    """Whether ``folder`` holds a cached build matching its manifest. A folder that does not (a truncated
    model.safetensors or tokenizer.json, no manifest: an older suite's or a half-removed copy) is removed, to be
    built again; one that cannot be removed is a UserError naming it and the fix."""
    folder = Path(folder)
    if not os.path.lexists(folder):
        return False
    problem = build_problem(folder)
    if problem is None:
        return True
    import shutil
    import sys

    print(f"bench: note: the cached model at {folder} is not usable ({problem}); building it again",
          file=sys.stderr, flush=True)
    try:
        if folder.is_symlink() or not folder.is_dir():
            folder.unlink()
        else:
            shutil.rmtree(folder)
    except OSError as exc:
        raise UserError(f"the cached model at {folder} is not usable ({problem}) and cannot be removed "
                        f"({exc.strerror}); delete that folder, or set BENCH_CACHE_DIR to another folder") from None
    return False


def settings_key(*parts: Any) -> str:
    """A short stable hash of JSON-able settings (cache folder names)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def resolve_device(spec: Spec) -> str:
    """'cuda' or 'cpu' from spec.device ('auto' picks cuda when available)."""
    import torch

    if spec.device == "cuda" and not torch.cuda.is_available():
        raise UserError("device 'cuda' was asked for but torch sees no CUDA GPU; set device=cpu or device=auto")
    if spec.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return spec.device


def build_tiny_tokenizer(corpus: list[str], vocab_size: int) -> Any:
    """Byte-level BPE trained on ``corpus``; digits are kept one per token so arithmetic stays learnable."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS)
    fast.add_tokens(TAG_TOKENS)  # ordinary (not special) tokens: they survive skip_special_tokens decoding
    fast.padding_side = "left"
    return fast


def tiny_model_dir(spec: Spec, corpus: list[str]) -> Path:
    """Build (or reuse from the cache) the tiny tokenizer + random-init Qwen2 decoder; returns its folder."""
    tiny = spec.model.tiny
    # The corpus by content, not length: a corpus of the same size from other problems is another tokenizer.
    key = settings_key("tiny-v2", vars(tiny), vars(spec.task.synthetic), spec.seeds[0], settings_key(corpus))
    folder = cache_root() / "tiny-models" / key
    if cached_build(folder):
        return folder
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tiny_tokenizer(corpus, tiny.vocab_size)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=tiny.hidden_size,
        num_hidden_layers=tiny.num_layers,
        num_attention_heads=tiny.num_heads,
        num_key_value_heads=tiny.num_heads,
        intermediate_size=tiny.intermediate_size,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(spec.seeds[0])
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    write_build_manifest(tmp)
    folder.parent.mkdir(parents=True, exist_ok=True)
    if folder.exists():  # another process won the race; theirs is as good as ours
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, folder)
    return folder


def load_tokenizer(name_or_path: str | Path) -> Any:
    """Tokenizer with a pad token and left padding (batched generation)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(name_or_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_causal_lm(name_or_path: str | Path, model_spec: ModelSpec, device: str, *, trained: bool = False) -> Any:
    """A causal LM from a folder or hub id on ``device``, stored as the precision policy says.

    ``trained``: an optimizer will update it, so it is stored in float32 (fp32 master weights, bench.model.precision);
    otherwise it is stored in the spec's dtype (a frozen network, or one that only generates).
    """
    from transformers import AutoModelForCausalLM

    from bench.model.precision import storage_dtype

    dtype = torch_dtype(storage_dtype(model_spec.dtype, trained))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=dtype)
    except OSError as exc:
        raise UserError(f"could not load model '{name_or_path}' ({exc.__class__.__name__}); check the name, or "
                        f"download it and set model.source=path model.name_or_path=/local/folder") from None
    return model.to(device)


def initial_model_source(spec: Spec, corpus: list[str]) -> str:
    """Folder or hub id of the network every method starts from (before any warm start).

    ``corpus`` is the stand-in tokenizer's training text (`bench.task.data.tokenizer_corpus`) for the tiny model
    and shipped architectures; for an architecture an empty one is replaced by that function's output.
    """
    source = spec.model.source
    if source == "tiny":
        return str(tiny_model_dir(spec, corpus))
    if source == "architecture":
        if not corpus:
            corpus = tokenizer_corpus(spec)
        return str(architecture_model_dir(spec, corpus))
    if source == "config":
        return str(random_init_dir(spec))
    if source == "fetched":  # the model cache's converted folder (bench.model.fetch)
        from bench.model.fetch import fetched_model_dir

        return str(fetched_model_dir(str(spec.model.name_or_path)))
    return str(spec.model.name_or_path)


def architecture_model_dir(spec: Spec, corpus: list[str]) -> Path:
    """Build (or reuse from the cache) a shipped architecture with random weights and a stand-in tokenizer.

    The network is `model.architecture` scaled by `model.scale`, in `model.dtype`, initialised from
    ``seeds[0]``. The tokenizer is the tiny byte-level BPE trained on ``corpus`` (the task's own text); the
    config keeps the architecture's real vocab_size, so embedding, logits and LM head have their real sizes
    while every token id is far below it. pad/eos/bos are the stand-in tokenizer's. The cache key covers the
    architecture, scale, seed, dtype and a hash of the corpus (another task needs another tokenizer).

    The tokenizer is padded with placeholder tokens ``<|vN|>`` up to the real vocabulary, so that every id a
    random model samples decodes to one token and re-encodes to one token: text lengths (the sample pool's pairs,
    DPO and the reward model's sequences, the length penalty) then match the generated token counts, as with the
    real tokenizer.
    """
    from bench.config.architectures import STAND_IN_VOCAB, architecture_config, build_random_model

    model_spec = spec.model
    corpus_hash = hashlib.sha256("\n".join(corpus).encode()).hexdigest()
    key = settings_key("architecture-v2", model_spec.architecture, vars(model_spec.scale), spec.seeds[0],
                       model_spec.dtype, corpus_hash)
    folder = cache_root() / "architectures" / f"{model_spec.architecture}-{key}"
    if cached_build(folder):
        return folder
    tokenizer = build_tiny_tokenizer(corpus, STAND_IN_VOCAB)
    config = architecture_config(str(model_spec.architecture), model_spec.scale)
    if len(tokenizer) > config.vocab_size:
        raise UserError(f"the stand-in tokenizer has {len(tokenizer)} tokens but model.scale.vocab_size is "
                        f"{config.vocab_size}; raise model.scale.vocab_size or set it to null (the real vocabulary)")
    tokenizer.add_tokens([f"<|v{i}|>" for i in range(len(tokenizer), config.vocab_size)])
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
           "bos_token_id": tokenizer.eos_token_id}
    for name, value in ids.items():
        setattr(config, name, value)
    model = build_random_model(config, model_spec.dtype, spec.seeds[0])
    for name, value in ids.items():
        setattr(model.generation_config, name, value)
    _publish(folder, model, tokenizer)
    return folder


def _publish(folder: Path, model: Any, tokenizer: Any) -> None:
    """Save ``model`` and ``tokenizer`` into ``folder`` atomically (a temporary sibling, then a rename).

    A reader never sees a half-written folder; when another process published first, its copy is kept.
    """
    import shutil

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    write_build_manifest(tmp)
    try:
        os.replace(tmp, folder)
    except OSError:  # the folder exists (another process won the race): theirs is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)


def random_init_dir(spec: Spec) -> Path:
    """A real architecture (its config and tokenizer from the hub or a folder) with random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    key = settings_key("config-v1", spec.model.name_or_path, spec.model.dtype, spec.seeds[0])
    folder = cache_root() / "random-init" / key
    if cached_build(folder):
        return folder
    import torch

    try:
        config = AutoConfig.from_pretrained(spec.model.name_or_path)
        tokenizer = load_tokenizer(spec.model.name_or_path)
    except OSError as exc:
        raise UserError(f"could not read the config of '{spec.model.name_or_path}' ({exc.__class__.__name__}); "
                        f"give a reachable hub id or a local folder with config.json") from None
    torch.manual_seed(spec.seeds[0])
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(spec.model.dtype))
    _publish(folder, model, tokenizer)
    return folder


def reward_read_positions(input_ids: "torch.Tensor", last_real: "torch.Tensor",
                          pad_token_id: int | None) -> "torch.Tensor":
    """Where a sequence-classification reward model reads its score: (b, L) ids, (b,) last real index -> (b,).

    transformers' own rule (``GenericForSequenceClassification``) reads the rightmost token that is not the pad
    token. TRL's RewardTrainer appends EOS to every text it trains on, so where pad == EOS (SmolLM2, Qwen) that rule
    skips the EOS and the score head is trained on the token *before* it; where pad != EOS it is trained on the EOS.
    Applied to the real tokens only (a rollout is also padded on the left and after its EOS): the last real token,
    or the one before it when that token is the pad token. Every reader of a reward model (its pair accuracy, PPO's
    rollout scores) uses this, so the head is read where it was trained.
    """
    import torch

    index = last_real.clone()
    if pad_token_id is None:
        return index
    rows = torch.arange(len(index), device=index.device)
    return torch.where((input_ids[rows, index] == pad_token_id) & (index > 0), index - 1, index)


def load_sequence_classifier(path: str | Path, model_dtype: str, device: str, *, trained: bool = False) -> Any:
    """A one-output sequence classifier (the reward model) from ``path``, stored as the precision policy says.

    ``trained``: stored in float32 (it is being optimised) and left trainable; otherwise stored in
    ``model_dtype`` and frozen (eval mode, no gradients). transformers 5.x rejects ``num_labels`` next to a
    config, so the label count is set on a config copy.
    """
    import copy

    from transformers import AutoConfig, AutoModelForSequenceClassification

    from bench.model.precision import storage_dtype

    config = copy.deepcopy(AutoConfig.from_pretrained(str(path)))
    config.num_labels = 1
    dtype = torch_dtype(storage_dtype(model_dtype, trained))
    model = AutoModelForSequenceClassification.from_pretrained(str(path), config=config, dtype=dtype).to(device)
    if not trained:
        model.eval()
        model.requires_grad_(False)
    return model
