"""The training-dynamics monitors on TRL's reward functions: each reward function the suite hands a TRL trainer is
wrapped (:func:`with_monitors`) so that every scored batch also logs the degenerate-output rates of
:mod:`bench.telemetry.monitors` (``monitors/<name>`` in TRL's log history), and :func:`monitor_problems` says
after training when those logs are missing."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable

# Not a timing seam: the text monitors of bench.telemetry.monitors, computed on the completions TRL's GRPO generates
# each step. Interface (the suite's own reward functions, as in bench.telemetry.trl_hooks, plus a documented TRL
# reward kwarg): the suite's own reward function is wrapped before the trainer is built, and the wrapper hands each
# monitor to the ``log_metric`` callable that trl 1.16 passes to every synchronous reward function
# (``GRPOTrainer._calculate_rewards``: "Allow reward functions to log additional scalar metrics"). TRL averages the
# values over processes and over the steps of a logging interval and logs them beside its own ("kl", "entropy"), so
# they land in ``trainer.state.log_history`` under ``MONITOR_PREFIX + name``: each logged value is the mean over the
# interval's generation batches (and processes) of that batch's monitor, e.g. a mean of per-batch p90s for
# ``completion_length_p90``. Nothing of TRL's is patched. Checked after training by :func:`monitor_problems`;
# ``tests/test_trl_seams.py`` runs a tiny GRPO and asserts every name is logged.
TRL_LOGS_ITSELF: dict[str, str] = {"completion_length": "completions/mean_length",
                                   "truncated_rate": "completions/clipped_ratio"}
"""Monitors TRL's GRPO already logs (same rule: tokens up to and including EOS; no EOS), by TRL's key: not
logged twice."""
MONITOR_SEAM = "monitors"
"""Name of the monitor seam in :func:`monitor_problems` lines."""
MONITOR_PREFIX = "monitors/"
"""Log-key prefix of the monitors in TRL's log_history (keeps them apart from TRL's own keys)."""


def _trl_monitor_names() -> tuple[str, ...]:
    from bench.telemetry.monitors import MONITOR_NAMES

    return tuple(name for name in MONITOR_NAMES if name not in TRL_LOGS_ITSELF)


def monitor_curve_names() -> dict[str, str]:
    """TRL log key -> canonical metric name for every monitor: ``monitors/<name>`` and TRL's own two.

    Merge into a GRPO recipe's CURVE_NAMES (``baselines/grpo.py``) so ``curves_from_log_history`` carries them.
    """
    return {**{MONITOR_PREFIX + name: name for name in _trl_monitor_names()},
            **{trl_key: name for name, trl_key in TRL_LOGS_ITSELF.items()}}


@dataclass
class MonitorState:
    """What a monitored reward function saw: calls, and calls where TRL passed a ``log_metric`` it could use."""

    calls: int = 0
    logged: int = 0


def with_monitors(reward_func: Callable[..., Any], *, gold_key: str = "answer",
                  phrases: tuple[str, ...] | None = None) -> Callable[..., Any]:
    """``reward_func`` unchanged in what it returns, plus the bench.telemetry.monitors of each batch sent to ``log_metric``.

    Wrap ONE of the suite's reward functions (the accuracy one: it needs the gold column too) before building the
    ``GRPOTrainer``. Per call: ``completion_monitors(completions, kwargs[gold_key], lengths=[len(ids) for ids
    in completion_ids], phrases=phrases)``, every name except :data:`TRL_LOGS_ITSELF` logged as
    ``MONITOR_PREFIX + name``. ``functools.wraps`` keeps ``__name__`` (TRL's ``rewards/<name>/mean``). The time
    the monitors take falls in the 'reward' phase when the telemetry seam wraps this wrapper (it does when the
    trainer is instrumented after construction, as ``run_trainer`` does). Raises TypeError for an async function
    (TRL runs those on its event-loop thread; wrap a synchronous one). Idempotent. The state is
    ``wrapper.bench_monitors`` (:class:`MonitorState`).
    """
    from bench.telemetry.monitors import DEFAULT_REFLECTION_PHRASES, completion_monitors

    if isinstance(getattr(reward_func, "bench_monitors", None), MonitorState):
        return reward_func
    if inspect.iscoroutinefunction(reward_func) or not callable(reward_func):
        raise TypeError("with_monitors needs a synchronous reward function")
    chosen = tuple(phrases) if phrases is not None else DEFAULT_REFLECTION_PHRASES
    names = _trl_monitor_names()
    state = MonitorState()

    @functools.wraps(reward_func)
    def monitored(*args: Any, **kwargs: Any) -> Any:
        rewards = reward_func(*args, **kwargs)
        state.calls += 1
        log_metric = kwargs.get("log_metric")
        completions = kwargs.get("completions", args[1] if len(args) > 1 else None)
        if not callable(log_metric) or completions is None:
            return rewards  # recorded: calls without logged; monitor_problems says so
        ids = kwargs.get("completion_ids")
        lengths = [len(row) for row in ids] if ids is not None and len(ids) == len(completions) else None
        golds = kwargs.get(gold_key)
        monitors = completion_monitors(completions, list(golds) if golds is not None else None, lengths=lengths,
                                       phrases=chosen)
        for name in names:
            if name in monitors:
                log_metric(MONITOR_PREFIX + name, float(monitors[name]))
        state.logged += 1
        return rewards

    monitored.bench_monitors = state  # type: ignore[attr-defined]
    return monitored


def monitor_problems(reward_funcs: Any, log_history: list[dict[str, Any]]) -> list[str]:
    """Why a TRL GRPO run's monitors are missing or partial, one line each; ``[]`` when all were logged.

    ``reward_funcs``: what the trainer holds (``trainer.reward_funcs``; telemetry may have wrapped the monitored
    function again, so ``__wrapped__`` chains are followed). Lines: no function was monitored; it was never
    called; TRL passed no ``log_metric`` (an upgrade dropped the kwarg); a monitor never reached the log (only
    judged when some logged step exists; ``format_only_rate`` needs the gold column, so its absence says so).
    """
    states = []
    for func in reward_funcs or ():
        while func is not None:
            state = getattr(func, "bench_monitors", None)
            if isinstance(state, MonitorState):
                states.append(state)
                break
            func = getattr(func, "__wrapped__", None)
    if not states:
        return [f"{MONITOR_SEAM}: no reward function was wrapped with with_monitors"]
    calls, logged = sum(s.calls for s in states), sum(s.logged for s in states)
    if calls == 0:
        return [f"{MONITOR_SEAM}: the monitored reward function was never called"]
    problems = []
    if logged < calls:
        problems.append(f"{MONITOR_SEAM}: TRL passed no log_metric (or no completions) in {calls - logged} of "
                        f"{calls} reward call(s)")
    points = [entry for entry in log_history if "step" in entry and "train_runtime" not in entry]
    if points:
        seen = {key for entry in points for key in entry}
        for name in _trl_monitor_names():
            if MONITOR_PREFIX + name not in seen:
                hint = " (the dataset has no gold column)" if name == "format_only_rate" else ""
                problems.append(f"{MONITOR_SEAM}: {name} never reached log_history{hint}")
    return problems
