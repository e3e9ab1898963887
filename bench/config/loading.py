"""Presets and overrides into a validated Spec: the shipped preset files, ``extends:`` chains, dotted
``key=value`` overrides from the command line, and :func:`load_spec` / :func:`load_spec_dict`, which build the
dataclasses (:mod:`bench.config.spec`) and validate them once (:mod:`bench.config.rules`).
"""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from bench.config.paths import check_path, read_text, shown
from bench.config.rules import validate
from bench.config.spec import Spec, _build, _did_you_mean
from bench.errors import SpecError, UserError

MAX_PRESET_BYTES = 1 << 20
"""Largest preset file read (1 MiB; the shipped ones are under 16 KB): a bigger one is refused unread."""
MAX_STRING = 4096
"""Characters of any one string in a preset or an override (PATH_MAX on Linux); a longer one is refused."""
MAX_DESCRIPTION = 1000
"""Characters of ``description`` ("one line on what the preset is for"; `bench run --dry-run` prints it)."""
MAX_DEPTH = 16
"""Nesting depth of a preset's data, the top-level mapping being 1 (the shipped tuned preset reaches 8)."""
MAX_NODES = 20_000
"""Values in a preset's data after ``extends:`` and the overrides, every mapping, list and scalar counted once
(the shipped tuned preset has about 650). With YAML aliases refused, this bounds what the suite builds and writes."""


MAX_INTEGER = 2**53 - 1
"""Largest integer a preset or an override may hold: the largest a float (and the report's JavaScript) holds exactly;
train.steps=10**30 passed the >= 1 rule, printed a plan and would have run until torch overflowed."""


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters other than tab and newline (an ESC would drive the terminal `bench run` prints to)."""


class _NoAliasLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses anchors' aliases (``*name``): an alias can repeat a subtree, and a few lines of
    nested aliases expand to billions of values ("billion laughs"). The shipped presets use none."""

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            mark = event.start_mark
            raise SpecError(f"{self.source_name}: line {mark.line + 1}: YAML alias '*{shown(event.anchor)}' is not "
                            f"allowed in a preset; write the values out")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        # YAML keeps the last of two equal keys without a word: a second `train:` block would silently replace
        # the first, and the run would not be the one the file seems to describe.
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise SpecError(f"{self.source_name}: line {key_node.start_mark.line + 1}: key '{shown(key)}' is "
                                f"given twice in one mapping; keep one (YAML would keep the last silently)")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _NotYaml(SpecError):
    """The text is not valid YAML (an override's value is then taken as the text itself)."""


def _yaml(text: str, source: str) -> Any:
    """YAML ``text`` as plain data with aliases refused; SpecError (one line) for bad syntax or absurd nesting."""
    loader = None
    try:
        loader = _NoAliasLoader(text)  # the reader refuses control characters here already
        loader.source_name = source  # type: ignore[attr-defined]
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise _NotYaml(f"{source} is not valid YAML{where} ({exc.__class__.__name__}); fix its syntax") from None
    except RecursionError:
        raise SpecError(f"{source} is nested too deeply (more than {MAX_DEPTH} levels are refused)") from None
    finally:
        if loader is not None:
            loader.dispose()


def check_bounds(data: Any, where: str = "the preset") -> None:
    """Refuse data larger than a preset can sensibly be: a string over MAX_STRING characters (``description`` over
    MAX_DESCRIPTION), an integer beyond MAX_INTEGER, nesting deeper than MAX_DEPTH, more than MAX_NODES values. One
    line naming the key."""
    count = 0
    stack: list[tuple[str, Any, int]] = [("", data, 1)]
    while stack:
        key, value, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise SpecError(f"{where} holds more than {MAX_NODES:,} values (keys, list items and scalars); "
                            f"a preset is a few hundred")
        if depth > MAX_DEPTH:
            raise SpecError(f"'{shown(key)[:200]}' in {where} is nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INTEGER:
            raise SpecError(f"'{shown(key)[:200]}' is {value:.3g}, beyond any count the suite runs (at most "
                            f"{MAX_INTEGER:,}); give a realistic value")
        if isinstance(value, str):
            limit = MAX_DESCRIPTION if key == "description" else MAX_STRING
            if len(value) > limit:
                raise SpecError(f"'{shown(key)[:200]}' is {len(value):,} characters long (at most {limit:,}); "
                                f"shorten it")
            bad = _CONTROL.search(value)
            if bad:
                raise SpecError(f"'{shown(key)[:200]}' holds a control character (0x{ord(bad.group()):02x}); a "
                                f"preset's text is printed on the console and the report: remove it")
        elif isinstance(value, dict):
            for k, v in value.items():
                if isinstance(k, str) and len(k) > 200:
                    raise SpecError(f"a key in {where} is {len(k):,} characters long (at most 200): "
                                    f"'{shown(k)[:60]}...'")
                stack.append((f"{key}.{k}" if key else str(k), v, depth + 1))
        elif isinstance(value, list):
            stack.extend((f"{key}[{i}]", v, depth + 1) for i, v in enumerate(value))


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
    data = _yaml(preset_text(name), f"preset '{name}'") or {}
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
    check_bounds(data)  # before anything is built, printed or written (suite.json holds the spec whole)
    spec = _build(Spec, data, "")
    validate(spec)
    return spec


def _preset_data(preset_str: str, depth: int) -> dict[str, Any]:
    """The plain data of a preset name or file, its ``extends:`` chain resolved."""
    path: Path | None = None
    if is_preset_file(preset_str):
        try:
            path = check_path(preset_str, "file", "preset file",
                              hint="give a YAML file or a name from `bench presets`")
            text = read_text(path, "preset file", MAX_PRESET_BYTES)
        except UserError as exc:  # a preset's problems are spec errors
            raise SpecError(str(exc)) from None
        source = f"preset file '{shown(path)}'"
    else:
        text = preset_text(preset_str)
        source = f"preset '{preset_str}'"
    data = _yaml(text, source) or {}
    if not isinstance(data, dict):
        raise SpecError(f"{source} must be a YAML mapping of keys to values")
    if "extends" not in data:
        return data
    base = data.pop("extends")
    if not isinstance(base, str) or not base.strip():
        raise SpecError(f"'extends' in preset '{preset_str}' must be a preset name or a YAML file, got {base!r}")
    if depth >= MAX_EXTENDS:
        raise SpecError(f"preset '{preset_str}': 'extends' goes more than {MAX_EXTENDS} presets deep (a loop?); "
                        f"extend a shipped preset directly")
    if is_preset_file(base) and path is not None and not Path(base).is_absolute():
        base = str(path.parent / base)  # relative to the extending file, not to the working directory
    return _merged(_preset_data(base, depth + 1), data)


def is_preset_file(preset: str) -> bool:
    """Whether a --preset value (or an ``extends:``) names a file rather than a shipped preset: it ends in .yaml or
    .yml, holds a '/', or is not a shipped name but something by that name exists (so ``--preset myfolder`` says
    what myfolder is instead of "unknown preset")."""
    if preset.endswith((".yaml", ".yml")) or "/" in preset:
        return True
    return preset not in preset_names() and os.path.lexists(preset)


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
        value = _yaml(raw, f"override '{shown(key)}'") if raw.strip() else None
    except _NotYaml:
        value = raw  # not YAML: the text itself (the spec's type check says whether a string is allowed)
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value
