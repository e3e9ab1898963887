"""The real GSM8K, shipped with the suite: ``task.source: gsm8k-bundled``, offline.

``gsm8k_data/`` holds the openai/grade-school-math train and test files unchanged (train 7,473 / test 1,319
problems, MIT licence), gzip-compressed, with ``LICENSE`` and ``PROVENANCE.md``. They are read by the same GSM8K
loader as any local file (`bench.task.problems.read_gsm8k`: the same column checks, gold-answer checks and
messages); `bench.task.problems` asks this module for the rows when the path is `BUNDLED_PATH`.

Pure Python (gzip from the standard library).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from bench.errors import UserError

SOURCE = "gsm8k-bundled"
"""The ``task.source`` that reads these files."""
BUNDLED_PATH = "gsm8k-bundled"
"""What `gsm8k_path` hands the GSM8K loader for them (``task.path`` is not read with this source)."""
DATA_DIR = Path(__file__).resolve().parent / "gsm8k_data"
"""Where the files are (package data of ``bench.task``)."""
EXPECTED: dict[str, tuple[int, str]] = {
    "train": (7473, "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"),
    "test": (1319, "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"),
}
"""split -> (problems, sha256 of the decompressed file), as PROVENANCE.md gives them."""


def gsm8k_path(task: Any) -> str:
    """The path the GSM8K loader reads for ``task`` (a TaskSpec): the bundled files for source gsm8k-bundled,
    else ``task.path``."""
    return BUNDLED_PATH if task.source == SOURCE else str(task.path)


def bundled_file(split: str) -> Path:
    """The compressed file of ``split`` (train or test); UserError for another split."""
    if split not in EXPECTED:
        raise UserError(f"the bundled GSM8K has the splits {', '.join(EXPECTED)}, not '{split}'")
    return DATA_DIR / f"{split}.jsonl.gz"


def bundled_text(split: str) -> str:
    """The decompressed file of ``split`` as text; UserError when the package was installed without it."""
    path = bundled_file(split)
    try:
        with gzip.open(path, "rb") as handle:
            return handle.read().decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read the bundled GSM8K ({type(exc).__name__}); reinstall the suite "
                        f"(pip install -e .) or use task.source=gsm8k with task.path=openai/gsm8k or local files"
                        ) from None


def bundled_rows(split: str) -> tuple[list[tuple[str, Any]], str]:
    """Every row of ``split`` with its location (``FILE:LINE``), and the file's name: what
    `bench.task.problems` reads from any JSON Lines file."""
    path = bundled_file(split)
    located = [(f"{path}:{number}", json.loads(line))
               for number, line in enumerate(bundled_text(split).splitlines(), start=1) if line.strip()]
    return located, str(path)
