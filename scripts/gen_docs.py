"""Generate the documentation's reference pages from the code, so that they cannot drift from it.

- ``reference/presets.md``: every shipped preset (``bench/config/presets/*.yaml``) with its own header comment,
  verbatim, and the file itself;
- ``reference/configuration.md``: every key of the spec, from the dataclasses in ``bench/config/spec.py`` (field,
  type, default and the field's docstring), and every method's own keys (``methods.<name>.*``) from the ``Config``
  dataclass of its recipe in ``baselines/`` (reached through ``bench/config/registry.py``), bases included.

The code is read with ``ast``, never imported: no torch, no project install, well under a second.

Two ways to run it:
- ``python scripts/gen_docs.py [--out DIR]`` writes both pages (default: ``docs/``, into ``docs/reference/``; the
  generated files are git-ignored there);
- MkDocs runs it as a hook (``hooks:`` in ``mkdocs.yml``): ``on_files`` adds both pages to the site at build time,
  replacing any copy on disk, so ``mkdocs build`` always documents the code it is built from.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESETS_DIR = Path("bench/config/presets")
SPEC_FILE = Path("bench/config/spec.py")
REGISTRY_FILE = Path("bench/config/registry.py")
PAGES = {"reference/presets.md": "presets", "reference/configuration.md": "configuration"}
"""Generated page (relative to the docs folder) -> the generator's name for it."""

LABEL = re.compile(r"^[A-Z][\w ()-]*:\s")
"""A header line that starts a labelled part ('What:', 'Cost:', 'Run:')."""

FIRST_PRESETS = ("cpu-tiny", "cpu-quick", "gsm8k-qwen0.5b")
"""Shown first, in this order (the two defaults and the smoke test); the rest follow by name."""


# ----------------------------------------------------------------------------------------------------------------
# Markdown helpers


def md_text(text: str) -> str:
    """Docstring prose as Markdown: code spans kept, and outside them the characters that Markdown would read as
    markup (``<tag>``, ``*``, a table's ``|``) escaped."""
    parts = re.split(r"(``[^`]+``|`[^`]+`)", text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # a code span: Markdown shows it as written (a double-backtick span is one too)
            out.append(part)
        else:
            out.append(part.replace("\\", "\\\\").replace("*", "\\*").replace("<", "&lt;").replace(">", "&gt;")
                       .replace("|", "\\|").replace("_", "\\_"))
    return "".join(out)


def prose(doc: str | None) -> str:
    """A docstring as one Markdown cell: its lines joined into paragraphs (a table cell holds no line break)."""
    if not doc:
        return ""
    paragraphs = [" ".join(line.strip() for line in block.splitlines()) for block in inspect.cleandoc(doc).split("\n\n")]
    return "<br><br>".join(md_text(p) for p in paragraphs if p)


def code(text: str) -> str:
    """Inline code that survives a table cell (its ``|`` escaped)."""
    return "`" + text.replace("|", "\\|") + "`"


# ----------------------------------------------------------------------------------------------------------------
# The presets page


@dataclass
class Preset:
    name: str
    header: list[str]
    """The leading comment block, without the '# ' prefixes."""
    body: str
    """The rest of the file (the settings)."""

    @property
    def summary(self) -> str:
        """The header's first sentence, after 'name —' (it may run over a line break)."""
        lines = []
        for line in self.header:
            if lines and (LABEL.match(line) or line.startswith(" ")):
                break
            lines.append(line.strip())
            if line.rstrip().endswith((".", "?")):
                break
        first = " ".join(lines) or self.name
        return first.split("—", 1)[1].strip() if "—" in first else first

    @property
    def run(self) -> str:
        for line in self.header:
            if line.startswith("Run:"):
                return line[len("Run:"):].strip().split("   ")[0].strip()
        return f"bench run --preset {self.name}"


def read_preset(path: Path) -> Preset:
    lines = path.read_text(encoding="utf-8").splitlines()
    header = []
    for i, line in enumerate(lines):
        if not line.startswith("#"):
            break
        header.append(line[2:] if line.startswith("# ") else line[1:])
    else:
        i = len(lines)
    return Preset(path.stem, header, "\n".join(lines[i:]).strip("\n"))


def presets(root: Path = ROOT) -> list[Preset]:
    found = {p.stem: read_preset(p) for p in sorted((root / PRESETS_DIR).glob("*.yaml"))}
    order = [n for n in FIRST_PRESETS if n in found] + [n for n in sorted(found) if n not in FIRST_PRESETS]
    return [found[n] for n in order]


def presets_page(root: Path = ROOT) -> str:
    items = presets(root)
    out = ["# Presets", "",
           "<!-- Generated by scripts/gen_docs.py from bench/config/presets/*.yaml; edit the preset files. -->", "",
           "A preset is a YAML file of spec keys (see [Configuration](configuration.md)). Each shipped one starts "
           "with a comment saying what it is for, what it costs and how to run it: that comment is shown below as "
           "written, so this page cannot disagree with the files. `bench presets` lists them; "
           "`bench run --preset NAME key=value ...` runs one with overrides, and `--dry-run` validates it and prints "
           "the plan without running anything.", "",
           "| preset | what it is | run |", "|---|---|---|"]
    for p in items:
        out.append(f"| [`{p.name}`](#{p.name.replace('.', '')}) | {md_text(p.summary)} | {code(p.run)} |")
    for p in items:
        out += ["", f"## {p.name}", "", f"`bench/config/presets/{p.name}.yaml`", "", "```text", *p.header, "```", "",
                f'??? note "The settings ({p.name}.yaml)"', "", "    ```yaml",
                *[("    " + line).rstrip() for line in p.body.splitlines()], "    ```"]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------------------------------------
# The configuration page: dataclasses read with ast


@dataclass
class Field:
    name: str
    annotation: str
    default: str
    doc: str | None
    nested: str | None = None
    """The name of the dataclass this field holds (a section of its own), if any."""


@dataclass
class ClassInfo:
    name: str
    module: str
    doc: str | None
    bases: list[ast.expr]
    fields: list[Field] = field(default_factory=list)


class Module:
    """One source file: its dataclasses, the names it imports and its module-level ``Name = Literal[...]`` aliases."""

    def __init__(self, root: Path, dotted: str):
        self.dotted = dotted
        path = root / (dotted.replace(".", "/") + ".py")
        if not path.exists():
            path = root / dotted.replace(".", "/") / "__init__.py"
        self.tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        self.imports: dict[str, tuple[str, str | None]] = {}
        """Local name -> (module, attribute or None for a module)."""
        self.aliases: dict[str, ast.expr] = {}
        self.classes: dict[str, ClassInfo] = {}
        for node in self.tree.body:
            if isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    self.imports[a.asname or a.name] = (node.module, a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    self.imports[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0], None)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.aliases[node.targets[0].id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self.aliases[node.target.id] = node.value
            elif isinstance(node, ast.ClassDef) and any(_is_dataclass_decorator(d) for d in node.decorator_list):
                self.classes[node.name] = self._class(node)

    def _class(self, node: ast.ClassDef) -> ClassInfo:
        info = ClassInfo(node.name, self.dotted, ast.get_docstring(node), list(node.bases))
        body = node.body
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                doc = None
                if i + 1 < len(body) and isinstance(body[i + 1], ast.Expr) and isinstance(body[i + 1].value, ast.Constant) \
                        and isinstance(body[i + 1].value.value, str):
                    doc = body[i + 1].value.value
                info.fields.append(Field(stmt.target.id, ast.unparse(stmt.annotation), _default(stmt.value), doc))
        return info


def _is_dataclass_decorator(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return (isinstance(target, ast.Name) and target.id == "dataclass") or \
        (isinstance(target, ast.Attribute) and target.attr == "dataclass")


def _default(value: ast.expr | None) -> str:
    """The default as the reader would write it in a preset (``None`` -> null)."""
    if value is None:
        return "(required)"
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "field":
        for kw in value.keywords:
            if kw.arg == "default":
                return _default(kw.value)
            if kw.arg == "default_factory":
                factory = kw.value
                if isinstance(factory, ast.Lambda):
                    return _literal(factory.body)
                if isinstance(factory, ast.Name) and factory.id in ("dict", "list"):
                    return "{}" if factory.id == "dict" else "[]"
                return f"({ast.unparse(factory)})"
    return _literal(value)


def _literal(node: ast.expr) -> str:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)
    return _yaml(value)


def _yaml(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    return repr(value)


class Source:
    """The project's modules, parsed on demand; resolves a class or type alias named in one module."""

    def __init__(self, root: Path):
        self.root = root
        self.modules: dict[str, Module] = {}

    def module(self, dotted: str) -> Module:
        if dotted not in self.modules:
            self.modules[dotted] = Module(self.root, dotted)
        return self.modules[dotted]

    def exists(self, dotted: str) -> bool:
        base = self.root / dotted.replace(".", "/")
        return base.with_suffix(".py").exists() or (base / "__init__.py").exists()

    def resolve(self, mod: Module, expr: ast.expr) -> tuple[Module, str] | None:
        """(module, name) that ``expr`` (a Name or ``alias.Name``) refers to, inside the project; None outside it."""
        if isinstance(expr, ast.Name):
            if expr.id in mod.classes or expr.id in mod.aliases:
                return mod, expr.id
            if expr.id in mod.imports:
                source, attr = mod.imports[expr.id]
                if attr is not None and self.exists(source):
                    return self.resolve(self.module(source), ast.Name(attr))
                if attr is not None and self.exists(f"{source}.{attr}"):
                    return None  # a module, not a class
            return None
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id in mod.imports:
            source, attr = mod.imports[expr.value.id]
            dotted = source if attr is None else f"{source}.{attr}"
            if self.exists(dotted):
                return self.resolve(self.module(dotted), ast.Name(expr.attr))
        return None

    def fields(self, mod: Module, name: str) -> list[Field]:
        """A dataclass's fields in dataclass order: the bases' first, a redefined field keeping its place."""
        info = mod.classes[name]
        ordered: dict[str, Field] = {}
        for base in info.bases:
            found = self.resolve(mod, base)
            if found is None or found[1] not in found[0].classes:
                raise SystemExit(f"gen_docs: cannot find the dataclass base {ast.unparse(base)!r} of {name} "
                                 f"({mod.dotted})")
            for f in self.fields(*found):
                ordered[f.name] = f
        for f in info.fields:
            ordered[f.name] = f
        return [self._typed(mod, f) for f in ordered.values()]

    def _typed(self, mod: Module, f: Field) -> Field:
        """Resolve a type alias to what it stands for, and mark a field that holds a nested dataclass."""
        annotation = ast.parse(f.annotation, mode="eval").body
        found = self.resolve(mod, annotation)
        if found is not None:
            where, name = found
            if name in where.classes:
                return Field(f.name, f.annotation, f.default, f.doc, nested=f"{where.dotted}:{name}")
            return Field(f.name, ast.unparse(where.aliases[name]), f.default, f.doc)
        return f

    def info(self, ref: str) -> tuple[Module, ClassInfo]:
        dotted, name = ref.split(":")
        mod = self.module(dotted)
        return mod, mod.classes[name]


def type_text(annotation: str) -> str:
    """A field's type in the reader's words."""
    node = ast.parse(annotation, mode="eval").body
    return _type_words(node)


def _type_words(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("Literal", "typing.Literal"):
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return "one of " + ", ".join(code(str(ast.literal_eval(i))) for i in items)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _type_words(node.left) + " or " + _type_words(node.right)
    if isinstance(node, ast.Constant) and node.value is None:
        return "null"
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "list":
        return "list of " + _type_words(node.slice)
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "dict":
        return "mapping"
    words = {"int": "integer", "float": "number", "str": "string", "bool": "true / false", "Any": "any"}
    text = ast.unparse(node)
    return words.get(text, code(text))


@dataclass
class Section:
    key: str
    """Dotted prefix of its keys ('' for the top level)."""
    title: str
    doc: str | None
    fields: list[Field]
    overrides: dict[str, str] = field(default_factory=dict)
    """Field -> a default that replaces the dataclass's (a registered run's own defaults)."""
    source: str = ""


def spec_sections(src: Source) -> list[Section]:
    """The spec's dataclasses, from ``Spec`` down, one section per dataclass (depth first, in field order)."""
    mod = src.module("bench.config.spec")
    sections: list[Section] = []

    def walk(ref: str, key: str) -> None:
        where, info = src.info(ref)
        fields = src.fields(where, info.name)
        title = f"`{key}`" if key else "Top level"
        sections.append(Section(key, title, info.doc, fields, source=f"{SPEC_FILE.as_posix()}: `{info.name}`"))
        for f in fields:
            if f.nested:
                walk(f.nested, f"{key}.{f.name}" if key else f.name)

    walk(f"{mod.dotted}:Spec", "")
    return sections


def registry_methods(src: Source) -> list[tuple[str, str, str | None, dict[str, str]]]:
    """(run name, recipe module, label or None, the run's own defaults) from the registry's METHODS table."""
    mod = src.module("bench.config.registry")
    table = mod.aliases.get("METHODS")
    if not isinstance(table, ast.Dict):
        raise SystemExit("gen_docs: bench/config/registry.py has no METHODS = {...} table")
    runs = []
    for key, value in zip(table.keys, table.values):
        if not (isinstance(value, ast.Call) and value.args):
            raise SystemExit(f"gen_docs: cannot read the registry entry {ast.unparse(value)!r}")
        label, defaults = None, {}
        for kw in value.keywords:
            if kw.arg == "label":
                label = ast.literal_eval(kw.value)
            elif kw.arg == "defaults":
                defaults = {k: _yaml(v) for k, v in ast.literal_eval(kw.value).items()}
        runs.append((ast.literal_eval(key), ast.literal_eval(value.args[0]), label, defaults))
    return runs


def method_sections(src: Source) -> list[Section]:
    sections = []
    for run, module, label, defaults in registry_methods(src):
        mod = src.module(module)
        if "Config" not in mod.classes:
            raise SystemExit(f"gen_docs: the recipe {module} has no Config dataclass")
        fields = src.fields(mod, "Config")
        label = label or _module_label(mod) or run
        sections.append(Section(f"methods.{run}", f"`methods.{run}`: {label}", mod.classes["Config"].doc, fields,
                                overrides=defaults, source=f"{module.replace('.', '/')}.py: `Config`"))
    return sections


def _module_label(mod: Module) -> str | None:
    value = mod.aliases.get("LABEL")
    return ast.literal_eval(value) if isinstance(value, ast.Constant) else None


def section_markdown(section: Section, nested_docs: dict[str, str | None]) -> list[str]:
    out = ["", f"## {section.title}", ""]
    if section.doc:
        out += [prose(section.doc).replace("<br><br>", "\n\n"), ""]
    out += [f"Defined in {section.source}.", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    for f in section.fields:
        key = f"{section.key}.{f.name}" if section.key else f.name
        doc = f.doc
        if f.nested:
            kind, default = "section", f"see [`{key}`](#{anchor(key)})"
            doc = doc or nested_docs.get(f.nested)
        elif key == "methods":
            kind, default = "mapping", "every registered method (see [Method settings](#method-settings))"
        else:
            kind, default = type_text(f.annotation), code(section.overrides.get(f.name, f.default))
        out.append(f"| {code(key)} | {kind} | {default} | {prose(doc)} |")
    return out


def anchor(key: str) -> str:
    """The id MkDocs' toc extension gives the heading '`key`' (dots dropped, lower case)."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", key).strip().lower())


def configuration_page(root: Path = ROOT) -> str:
    src = Source(root)
    spec = spec_sections(src)
    methods = method_sections(src)
    out = ["# Configuration reference", "",
           "<!-- Generated by scripts/gen_docs.py from bench/config/spec.py and the recipes' Config dataclasses; "
           "edit the docstrings there. -->", "",
           "Every key a preset or a command-line override can set. A preset's YAML mirrors these sections "
           "(`train: {steps: 200}`); an override uses the dotted key (`bench run --preset cpu-tiny train.steps=200`). "
           "An unknown key, a value of the wrong type or out of its range stops `bench run` before anything runs, "
           "with one line naming the key and the fix (exit status 2). Types: *one of* lists the allowed values; "
           "`null` is YAML's empty value.", "",
           "This page is generated from the dataclasses' fields and docstrings (`bench/config/spec.py`) and, for "
           "`methods.<name>`, from each recipe's `Config` in `baselines/`, bases included, with the registered run's "
           "own defaults (`bench/config/registry.py`).", "",
           "Sections: " + ", ".join(f"[{s.title}](#{anchor(s.key or 'top level')})" for s in spec) + ".", "",
           "Methods: " + ", ".join(f"[`{s.key}`](#{anchor(s.title)})" for s in methods) + "."]
    nested_docs = {f"{m.dotted}:{name}": info.doc for m in src.modules.values() for name, info in m.classes.items()}
    for section in spec:
        out += section_markdown(section, nested_docs)
    out += ["", "## Method settings", "",
            "`methods.<name>` holds each registered run's own settings: only the fields that method has. A key left "
            "unset takes the default shown here; `null` for a rate or coefficient means the matched budget's value "
            "(`train.learning_rate`, `train.kl_beta`), and anything a method sets differently from the budget is "
            "listed in the report's \"what differs\" table. `methods.<name>=false` switches a method off."]
    for section in methods:
        out += section_markdown(section, nested_docs)
    return "\n".join(out) + "\n"


GENERATORS = {"presets": presets_page, "configuration": configuration_page}


def generate(root: Path = ROOT) -> dict[str, str]:
    """Generated page (relative to the docs folder) -> its Markdown."""
    return {page: GENERATORS[name](root) for page, name in PAGES.items()}


# ----------------------------------------------------------------------------------------------------------------
# MkDocs hook


def on_files(files, config):  # noqa: ANN001, ANN201 (MkDocs' hook signature)
    """Add the generated pages to the site (replacing a copy that ``python scripts/gen_docs.py`` left on disk)."""
    from mkdocs.structure.files import File

    root = Path(config["config_file_path"]).resolve().parent
    for page, text in generate(root).items():
        existing = files.get_file_from_path(page)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, page, content=text))
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the generated reference pages of the documentation.")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="the docs folder (default: docs/)")
    args = parser.parse_args(argv)
    for page, text in generate(ROOT).items():
        path = args.out / page
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
