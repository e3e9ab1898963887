"""Presets and overrides into a validated Spec: the shipped preset files, ``extends:`` chains, dotted
``key=value`` overrides from the command line, and :func:`load_spec` / :func:`load_spec_dict`, which build the
dataclasses (:mod:`bench.config.spec`) and validate them once (:mod:`bench.config.rules`).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from bench.config.rules import validate
from bench.config.spec import Spec, _build, _convert, _did_you_mean
from bench.errors import SpecError


def preset_names() -> list[str]:
    """Names of the presets shipped inside the package."""
    folder = resources.files("bench.config") / "presets"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def preset_text(name: str) -> str:
    """Raw YAML of a shipped preset (raises SpecError naming the known presets)."""
    path = resources.files("bench.config") / "presets" / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(preset_names())
        hint = _did_you_mean(name, preset_names())
        raise SpecError(f"unknown preset '{name}'{hint}; known presets: {known} (list them with `bench presets`)")
    return path.read_text(encoding="utf-8")


def preset_summary(name: str) -> str:
    """The preset's one-line description."""
    data = yaml.safe_load(preset_text(name)) or {}
    return str(data.get("description", "")).strip()


MAX_EXTENDS = 8
"""How deep a chain of ``extends:`` may go (a tuned preset extends a shipped one: depth 1); deeper is a loop."""


def load_spec(preset: str | Path, overrides: list[str] | None = None) -> Spec:
    """Preset name or YAML file, plus ``key.path=value`` overrides -> a validated Spec.

    A preset file may start from another preset: ``extends: cpu-tiny`` (a shipped name, or a YAML file, relative
    to the extending file's folder) takes that preset's keys and lays this file's over them, mappings merged key
    by key (how `bench tune`'s tuned presets are written). Overrides apply last.
    """
    data = _preset_data(str(preset), 0)
    for item in overrides or []:
        _apply_override(data, item)
    spec = _build(Spec, data, "")
    validate(spec)
    return spec


def _preset_data(preset_str: str, depth: int) -> dict[str, Any]:
    """The plain data of a preset name or file, its ``extends:`` chain resolved."""
    path: Path | None = None
    if preset_str.endswith((".yaml", ".yml")) or "/" in preset_str:
        path = Path(preset_str)
        if not path.is_file():
            raise SpecError(f"preset file '{path}' does not exist; give an existing YAML file or a name from `bench presets`")
        text = path.read_text(encoding="utf-8")
    else:
        text = preset_text(preset_str)
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise SpecError(f"preset '{preset_str}' is not valid YAML ({exc.__class__.__name__}); fix the file's syntax") from None
    if not isinstance(data, dict):
        raise SpecError(f"preset '{preset_str}' must be a YAML mapping of keys to values")
    if "extends" not in data:
        return data
    base = data.pop("extends")
    if not isinstance(base, str) or not base.strip():
        raise SpecError(f"'extends' in preset '{preset_str}' must be a preset name or a YAML file, got {base!r}")
    if depth >= MAX_EXTENDS:
        raise SpecError(f"preset '{preset_str}': 'extends' goes more than {MAX_EXTENDS} presets deep (a loop?); "
                        f"extend a shipped preset directly")
    is_file = base.endswith((".yaml", ".yml")) or "/" in base
    if is_file and path is not None and not Path(base).is_absolute():
        base = str(path.parent / base)  # relative to the extending file, not to the working directory
    return _merged(_preset_data(base, depth + 1), data)


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` laid over ``base``: mappings merged key by key, any other value replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = (_merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict)
                    else value)
    return out


def load_spec_dict(data: dict[str, Any]) -> Spec:
    """A Spec from plain data (e.g. the resolved spec stored in run.json or result.json), validated."""
    spec = _build(Spec, data, "")
    validate(spec)
    return spec


def _apply_override(data: dict[str, Any], item: str) -> None:
    if "=" not in item:
        raise SpecError(f"override '{item}' has no '='; write it as key.path=value, e.g. train.steps=200")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise SpecError(f"override '{item}' has an empty key; write it as key.path=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value
