"""The house's layers: every import in bench/ and baselines/ goes down the layer table (bench.LAYERS) or stays
inside its own package, and no modules import each other in a circle.

The import graph is read with ``ast`` (no module is imported), including imports inside functions and under
``if TYPE_CHECKING:``: a lazy import that goes up a layer is still a dependency on a higher layer. The registry's
recipe paths are strings (``importlib``), which is how ``bench`` reaches ``baselines`` at all.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from bench import LAYERS
from bench.config.architectures import STAND_IN_TAG_COUNT
from bench.task.prompts import TAG_TOKENS

REPO = Path(__file__).resolve().parents[1]


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under bench/ and baselines/ (a package is its __init__)."""
    out: dict[str, Path] = {}
    for top in ("bench", "baselines"):
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module of this tree, line) for every import statement in ``path``, resolved to the deepest
    module that exists (``from bench.config import spec`` -> bench.config.spec)."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"{path}: relative import at line {node.lineno}; the house imports absolutely")
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, node.lineno))
    return found


def covers(entry: str, module: str) -> bool:
    """Whether layer entry ``entry`` is ``module`` or a package above it (``bench`` is the package file alone)."""
    return module == entry or (entry != "bench" and module.startswith(entry + "."))


def layer_of(module: str) -> int:
    """Index in bench.LAYERS of the longest entry that covers ``module``."""
    best, rank = -1, -1
    for index, entries in enumerate(LAYERS):
        for entry in entries:
            if covers(entry, module) and len(entry) > best:
                best, rank = len(entry), index
    if rank < 0:
        raise AssertionError(f"module {module} is in no layer of bench.LAYERS; add its package there")
    return rank


def package_of(module: str) -> str:
    """The layer entry a module belongs to (its package, or itself for a top-level module)."""
    return max((e for entries in LAYERS for e in entries if covers(e, module)), key=len)


def layer_problems(root: Path) -> list[str]:
    """Every import that goes up the table, or sideways into another package of the same layer."""
    modules = module_files(root)
    problems = []
    for name, path in modules.items():
        for target, line in imports_of(name, path, modules):
            if package_of(target) == package_of(name):
                continue  # inside one package: only circles are checked (cycle_problems)
            if layer_of(target) >= layer_of(name):
                where = path.relative_to(root)
                problems.append(f"{where}:{line}: {name} (layer {layer_of(name)}) imports {target} "
                                f"(layer {layer_of(target)}); a module imports only from layers below its own")
    return problems


def cycle_problems(root: Path) -> list[str]:
    """Every strongly connected group of more than one module in the import graph (Tarjan's algorithm)."""
    modules = module_files(root)
    edges = {name: sorted({t for t, _ in imports_of(name, path, modules)}) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for name in modules:
        if name not in index:
            visit(name)
    return [f"import circle: {' <-> '.join(group)}" for group in circles]


def test_no_import_goes_up_a_layer() -> None:
    problems = layer_problems(REPO)
    assert not problems, "\n".join(problems)


def test_no_import_circles() -> None:
    problems = cycle_problems(REPO)
    assert not problems, "\n".join(problems)


def test_every_module_has_a_layer() -> None:
    for name in module_files(REPO):
        layer_of(name)  # raises naming the module


def test_bench_top_level_holds_the_contracts_and_the_cli_only() -> None:
    top = sorted(p.name for p in (REPO / "bench").glob("*.py"))
    assert len(top) <= 8, top
    assert set(top) == {"__init__.py", "__main__.py", "cli.py", "errors.py", "results.py"}


def test_each_package_says_what_it_may_import() -> None:
    """Every bench package's docstring names its layer's job and what it may import."""
    for init in sorted((REPO / "bench").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "May import" in doc, f"{init.relative_to(REPO)}: the docstring says what the layer may import"


def test_the_stand_in_tag_count_matches_the_prompt_tags() -> None:
    """bench.config keeps the count of answer-format tags (it sits below bench.task, which owns them)."""
    assert STAND_IN_TAG_COUNT == len(TAG_TOKENS)


@pytest.mark.parametrize("planted, expected", [
    # an upward import: the task layer reaching up into execution
    ("bench/task/lengths.py", "bench.task.lengths (layer 2) imports bench.execution.plan (layer 8)"),
    # a sideways import between two packages of different layers, inside a function
    ("bench/config/registry.py", "bench.config.registry (layer 1) imports bench.execution.plan (layer 8)"),
])
def test_an_upward_import_is_caught_and_named(tmp_path: Path, planted: str, expected: str) -> None:
    """The checks can fail: plant one upward import in a copy of the tree and both checks name it."""
    for top in ("bench", "baselines"):
        shutil.copytree(REPO / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / planted
    target.write_text(target.read_text(encoding="utf-8") + "\n\ndef _planted():\n"
                      "    from bench.execution.plan import make_plan\n    return make_plan\n", encoding="utf-8")
    problems = layer_problems(tmp_path)
    assert any(expected in p for p in problems), problems
    assert layer_problems(REPO) == []


def test_a_planted_circle_is_caught(tmp_path: Path) -> None:
    for top in ("bench", "baselines"):
        shutil.copytree(REPO / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    fmt = tmp_path / "bench" / "report" / "fmt.py"
    fmt.write_text(fmt.read_text(encoding="utf-8") + "\n\ndef _planted():\n    from bench.report.load import Suite\n"
                   "    return Suite\n", encoding="utf-8")
    problems = cycle_problems(tmp_path)
    assert any("bench.report.fmt" in p and "bench.report.load" in p for p in problems), problems
