"""bench: the measuring machine of the PPO / DPO / GRPO benchmarking suite.

The packages are layers; each imports only from the layers below it (and from inside itself, without circles).
From the bottom:

- ``bench.errors``, ``bench.results``: the contracts (user errors; the result file's schema and I/O).
- ``bench.config``: the spec (dataclasses, value rules, loading presets and overrides), the registry of methods
  and stages, shipped architectures and launcher configs, sweep expansion.
- ``bench.task``: the problems (synthetic task, GSM8K), splits and rows, prompts, the verifier, rewards, lengths,
  the data export. Pure Python: no torch.
- ``bench.model``: loading and building models and tokenizers, the precision policy, generation settings.
- ``bench.scoring``: evaluation of a policy on the held-out split, and the statistics.
- ``bench.telemetry``: memory readings, timers, static accounting, TRL hooks, the training-dynamics monitors.
- ``bench.report``: the report, from result files alone (no torch, no transformers, no trl).
- ``bench.systems``: the memory model, ``bench estimate``, the GPU check's plan and table.
- ``bench.execution``: the plan, the runner, the worker, the launcher's processes, preflight, the run context, the
  sample-pool stage, tune, re-scoring.
- ``baselines``: one recipe per method; ``bench`` reaches them only through the registry's import paths.
- ``bench.cli`` (and ``python -m bench``): the command line on top.

``tests/test_layers.py`` reads the import graph and fails on an import that goes up this table or on a circle.
"""

__version__ = "0.1.0"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("bench.errors", "bench.results", "bench"),
    ("bench.config",),
    ("bench.task",),
    ("bench.model",),
    ("bench.scoring",),
    ("bench.telemetry",),
    ("bench.report",),
    ("bench.systems",),
    ("bench.execution",),
    ("baselines",),
    ("bench.cli",),
    ("bench.__main__",),
)
"""The layer table, bottom first: a module may import from layers before its own (tests/test_layers.py). An entry
names a package (and every module in it) or one module; ``bench`` is this file alone."""
