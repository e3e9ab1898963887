"""Execution: a validated spec turned into runs, each in its own process, and their results.

- ``plan``: ordered runs with stable ids (shared stages first, then method x seed; a sweep's points);
- ``runner``: schedules the runs, starts and watches each worker process, handles signals, writes ``suite.json``
  and the report; ``commands``: the command lines a user reruns;
- ``worker``: one run (``python -m bench.execution.worker RUN_DIR``): loads the model and the task once into the
  run context (``context``), calls the recipe, evaluates, writes ``result.json``; beside it ``worker_signals`` (how
  a worker stops), ``cpu_threads`` (torch's CPU threads), ``run_evaluation`` (the policy's evaluation),
  ``run_failure`` and ``run_result`` (what a failed and a finished run record);
- ``launch``: several processes per run through accelerate (ranks, rank files); ``preflight``: the checks before
  a suite starts; ``sweep``: a sweep run's own work; ``sample_pool``: the shared sample-pool stage;
- ``tune``: ``bench tune``; ``score``: ``bench score`` (re-scoring); ``overhead``: the telemetry's own cost.

May import: every layer below (``bench.systems`` down to the contracts). Recipes in ``baselines`` are reached only
through ``bench.config.registry``.
"""
