"""The documentation: the site builds with `mkdocs build --strict` (a broken link, a missing page or anchor fails it),
the generated reference pages name every preset and every key of the spec and of each method's Config, and the README
stays one or two screens long with every relative link resolving."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
README_MAX_LINES = 250
HAS_MKDOCS = importlib.util.find_spec("mkdocs") is not None and importlib.util.find_spec("material") is not None


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_docs"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return _gen_docs().generate(REPO)


def _spec_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key of a spec dataclass, nested sections included (read from the classes themselves, not from the
    generator's reading of the source)."""
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        keys.append(key)
        if dataclasses.is_dataclass(hints[f.name]):
            keys += _spec_keys(hints[f.name], key + ".")
    return keys


@pytest.mark.skipif(not HAS_MKDOCS, reason="mkdocs / mkdocs-material are not installed (pip install -e '.[docs]'; "
                                           "the test extra installs them)")
def test_site_builds_strict(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    site = tmp_path / "site"
    for page in ("index.html", "reference/presets/index.html", "reference/configuration/index.html",
                 "methods/ppo/index.html", "results/index.html"):
        assert (site / page).is_file(), page
    # The generated pages come from the hook, not from files on disk (a fresh clone has none).
    assert "cpu-tiny" in (site / "reference/presets/index.html").read_text(encoding="utf-8")


def test_presets_page_names_every_preset_with_its_header(pages: dict[str, str]) -> None:
    text = pages["reference/presets.md"]
    files = sorted((REPO / "bench/config/presets").glob("*.yaml"))
    assert files
    for path in files:
        assert f"## {path.stem}\n" in text, path.stem
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("#") and first[2:] in text, f"{path.stem}: its header's first line is not on the page"


def test_configuration_page_names_every_spec_key(pages: dict[str, str]) -> None:
    from bench.config.spec import Spec

    text = pages["reference/configuration.md"]
    missing = [key for key in _spec_keys(Spec) if f"| `{key}` |" not in text]
    assert not missing, f"spec keys missing from the configuration page: {missing}"


def test_configuration_page_names_every_method_key(pages: dict[str, str]) -> None:
    from bench.config.registry import METHODS

    text = pages["reference/configuration.md"]
    missing = []
    for name, entry in METHODS.items():
        config = entry.load().Config
        missing += [f"methods.{name}.{f.name}" for f in dataclasses.fields(config)
                    if f"| `methods.{name}.{f.name}` |" not in text]
    assert not missing, f"method keys missing from the configuration page: {missing}"


def test_generator_writes_both_pages(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_docs.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "reference/presets.md").read_text(encoding="utf-8").startswith("# Presets")
    assert (tmp_path / "reference/configuration.md").read_text(encoding="utf-8").startswith("# Configuration")


def test_readme_fits_and_its_links_resolve() -> None:
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    assert "./run_all.sh --test" in text and "./run_all.sh " in text
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'src="([^"]+)"', text)
    relative = [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:|^#", t)]
    assert relative, "the README links into the docs"
    broken = [t for t in relative if not (REPO / t.split("#")[0]).exists()]
    assert not broken, f"README links that do not resolve: {broken}"
