"""A model the suite built into its cache (the tiny model) carries a manifest of hashes, as a fetched one does: a
truncated model.safetensors or tokenizer.json is found and built again, never trusted forever."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.config.loading import load_spec
from bench.model import loading
from bench.task.data import tokenizer_corpus


@pytest.fixture()
def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, object, list[str]]:
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    spec = load_spec("cpu-quick", [])
    corpus = tokenizer_corpus(spec)
    return loading.tiny_model_dir(spec, corpus), spec, corpus


def test_the_tiny_model_has_a_manifest_of_its_files(built: tuple[Path, object, list[str]]) -> None:
    folder, _, _ = built
    manifest = json.loads((folder / loading.BUILD_MANIFEST).read_text())
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(manifest["files"])
    assert loading.build_problem(folder) is None


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json"])
def test_a_truncated_file_is_found_and_built_again(built: tuple[Path, object, list[str]], name: str,
                                                   capsys: pytest.CaptureFixture) -> None:
    folder, spec, corpus = built
    good = (folder / name).read_bytes()
    (folder / name).write_bytes(good[: len(good) // 2])
    assert name in (loading.build_problem(folder) or "")
    assert loading.tiny_model_dir(spec, corpus) == folder
    assert (folder / name).read_bytes() == good  # the same settings build the same files
    assert "not usable" in capsys.readouterr().err and loading.build_problem(folder) is None


def test_a_same_size_corruption_fails_the_hash(built: tuple[Path, object, list[str]]) -> None:
    folder, spec, corpus = built
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (folder / "model.safetensors").write_bytes(bytes(data))
    assert "sha256" in (loading.build_problem(folder) or "")
    loading.tiny_model_dir(spec, corpus)
    assert loading.build_problem(folder) is None


def test_an_older_cache_without_a_manifest_is_built_again(built: tuple[Path, object, list[str]]) -> None:
    folder, spec, corpus = built
    (folder / loading.BUILD_MANIFEST).unlink()
    loading.tiny_model_dir(spec, corpus)
    assert (folder / loading.BUILD_MANIFEST).is_file()
