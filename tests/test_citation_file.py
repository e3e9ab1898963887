"""The repository's licence and citation files: present, and saying the version the package carries."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from bench import __version__

ROOT = Path(__file__).resolve().parents[1]


def test_citation_cff_names_the_package_version_and_licence() -> None:
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert str(cff["version"]) == project["version"] == __version__
    assert cff["license"] == "Apache-2.0" and cff["authors"] and cff["title"] and cff["message"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(cff["date-released"]))


def test_licence_is_apache_2_and_the_bundled_gsm8k_keeps_its_mit_notice() -> None:
    licence = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    gsm8k = (ROOT / "bench" / "task" / "gsm8k_data" / "LICENSE").read_text(encoding="utf-8")
    assert "MIT License" in gsm8k
