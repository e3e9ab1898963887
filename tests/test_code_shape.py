"""The shape of the code: no function in bench/ or baselines/ is longer than a reader can hold at once, and no
comment or docstring sends the reader to an issue number instead of saying the reason (history belongs in git).

Read with ``ast`` and as text (nothing is imported): a function's length is its lines from ``def`` to its last
line, its docstring and any nested function included.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MAX_FUNCTION_LINES = 70
"""The longest a function in bench/ or baselines/ may be; one that grows past it is split into named helpers."""
ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? ?#?\d+")
"""A mention of an issue by its number: the word, singular or plural, then the number, with or without '#'."""


def source_files(*tops: str, suffixes: tuple[str, ...] = (".py",)) -> list[Path]:
    """Every file with one of ``suffixes`` under the given top-level folders of the repository."""
    return [path for top in tops for path in sorted((REPO / top).rglob("*"))
            if path.suffix in suffixes and path.is_file()]


def long_functions(source: str, limit: int) -> list[tuple[int, str, int]]:
    """(line, name, length) of every function or method in ``source`` longer than ``limit`` lines."""
    return [(node.lineno, node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit]


def test_no_function_is_longer_than_the_limit() -> None:
    files = source_files("bench", "baselines")
    assert files, "no Python files found under bench/ and baselines/"
    found = [f"{path.relative_to(REPO)}:{line} {name} ({length} lines)"
             for path in files for line, name, length in long_functions(path.read_text(encoding="utf-8"),
                                                                       MAX_FUNCTION_LINES)]
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines (split each into named helpers):\n" + "\n".join(found)


def test_the_length_check_counts_from_def_to_the_last_line() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    source = f"def long():\n{body}\n\n\nclass A:\n    async def short(self):\n        return 1\n"
    assert long_functions(source, MAX_FUNCTION_LINES) == [(1, "long", MAX_FUNCTION_LINES + 1)]
    short_at = MAX_FUNCTION_LINES + 5  # def, the body, two blank lines, the class
    assert long_functions(source, 1) == [(1, "long", MAX_FUNCTION_LINES + 1), (short_at, "short", 2)]


def issue_mentions(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line of ``text`` that names an issue by its number."""
    return [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1) if ISSUE_NUMBER.search(line)]


def test_no_comment_or_docstring_names_an_issue() -> None:
    files = source_files("bench", "baselines", "scripts", "tests", suffixes=(".py", ".sh"))
    assert files, "no source files found"
    found = [f"{path.relative_to(REPO)}:{number}: {line}"
             for path in files for number, line in issue_mentions(path.read_text(encoding="utf-8"))]
    assert not found, "say the reason, not the issue it came from:\n" + "\n".join(found)


def test_the_issue_check_sees_each_spelling() -> None:
    word = "iss" + "ue"  # spelled apart, so that this file passes its own check
    text = f"# {word} 21 item 3\n# {word.title()}s 7, 10\n# see {word} #9\n# the {word} tracker\n# tissue 5"
    assert [number for number, _ in issue_mentions(text)] == [1, 2, 3]
