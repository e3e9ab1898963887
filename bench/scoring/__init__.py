"""Scoring: a policy's greedy completions on the held-out split judged in every scoring mode, and the statistics.

- ``evaluation``: generate, extract, judge, summarise (per-question verdicts, every mode);
- ``stats``: Wilson intervals, McNemar's exact test, paired bootstrap, Holm, Student-t. Pure Python.

May import: ``bench.model``, ``bench.task``, ``bench.config`` and the contracts.
"""
