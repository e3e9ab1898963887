"""Phase timers, step timers and per-phase memory peaks for one run.

Time is exclusive: at any moment exactly one owner is charged — the innermost open phase, else
"other" while inside an optimizer step, else nobody (data loading between steps, logging). A nested
phase therefore pauses its parent's clock, and the phase times add up to the time they cover without
double counting. Memory peaks follow the same owner rule: a reading taken while ``generation`` is the
innermost phase belongs to ``generation``, not also to the ``update`` that contains it.

On CUDA every boundary synchronises the device (so that kernels are charged to the phase that queued
them) and reads and resets torch's peak counters. That costs time; the overhead benchmark measures
it by running the same work with ``enabled=False``.

Phases and steps are driven from the training thread only (the memory sampler is the only other
thread); they are not meant to be opened from worker threads.

Training window: the trainer callback's ``on_train_begin`` / ``on_train_end`` mark where training starts
and ends, so that model loading and trainer construction (``setup_s``) are not charged to throughput
(``train_s``). At ``on_train_begin`` the models are loaded: the memory baseline is read there, and (when
asked) the trainable weights are snapshotted to show at ``on_train_end`` that training moved them
(:mod:`bench.telemetry.param_change`).
"""

from __future__ import annotations

import contextlib
import statistics
import time
import weakref
from typing import Any, Iterator

from bench.telemetry.memory import (
    CPU_MAXRSS,
    HOST_SOURCES,
    SOURCES,
    MemorySampler,
    SampledReaders,
    TorchCudaCounters,
    _fold,
    max_rss_bytes,
    primary_source,
    reading_kind,
)
from bench.telemetry.param_change import ParamSnapshot

OTHER = "other"
"""Time inside an optimizer step that no phase claimed (clipping, scheduler, callbacks)."""

_NULL = contextlib.nullcontext()

BASELINE_AFTER_LOAD = "on_train_begin (models loaded)"
BASELINE_BEFORE_LOAD = "recipe start (before models load)"
TIMING_TRAIN_WINDOW = "first on_train_begin to last on_train_end"
TIMING_WHOLE_RECIPE = "whole recipe (no on_train_begin fired)"
TIMING_NO_END = "on_train_begin to recipe end (no on_train_end fired)"


class Telemetry:
    """Phase/step timers and memory sampler; use as a context manager around the run.

    Args:
        device: 'cpu', 'cuda' or 'cuda:N' — picks the headline source (:func:`primary_source`).
        interval_s: memory polling interval (seconds).
        enabled: False makes ``phase``/``step_*`` near-free no-ops; only the wall time and the
            process's lifetime peak RSS are recorded (to measure the telemetry's own overhead).
        warmup_steps: the first steps left out of ``step_s_median`` / ``step_s_p90`` (compilation,
            allocator growth, first-call caches).
        track_training_change: snapshot the trainable weights at ``on_train_begin`` and compare them at
            ``on_train_end`` (host memory: see :mod:`bench.telemetry.param_change`). Independent of
            ``enabled``: the snapshot is taken outside the training window, so it costs no training time.
    """

    def __init__(self, device: str, interval_s: float = 0.05, enabled: bool = True, warmup_steps: int = 2,
                 track_training_change: bool = False) -> None:
        self.device = str(device)
        self.interval_s = float(interval_s)
        self.enabled = bool(enabled)
        self.warmup_steps = int(warmup_steps)
        self.counters: dict[str, int] = {"completions": 0, "generated_tokens": 0}
        """Counts filled by instrumentation (e.g. the generate wrapper)."""
        self.prompt_ids: list[int] = []
        """Under a launcher (bench.execution.launch): positions, in the matched prompt order, of the prompts this rank trained
        on (filled by the engine's sampler and TRL GRPO's reward wrapper; written to the rank's file)."""
        self.source = primary_source(self.device)
        self._t_start: float | None = None
        self._t_end: float | None = None
        # exclusive-time bookkeeping
        self._stack: list[tuple[str, bool]] = []  # (name, pass-through)
        self._in_step = False
        self._t_last = 0.0
        self._times: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._step_start = 0.0
        self._step_times: list[float] = []
        # memory
        self._cuda: TorchCudaCounters | None = None
        self._readers: SampledReaders | None = None
        self._sampler: MemorySampler | None = None
        self._phase_peaks: dict[str, dict[str, int]] = {}
        self._run_peak: dict[str, int] = {}
        self._baseline: dict[str, int] = {}
        self._maxrss_end: int | None = None
        self._sources: list[str] = []
        self._baseline_at: str | None = None
        # training window (perf_counter seconds)
        self._t_recipe_start: float | None = None
        self._t_recipe_end: float | None = None
        self._t_train_begin: float | None = None
        self._t_train_end: float | None = None
        # evidence that training moved the weights
        self.track_training_change = bool(track_training_change)
        self._snapshot: ParamSnapshot | None = None
        self._snapshot_model: Any = None  # weakref to the model snapshotted, for an on_train_end without one
        self._training_change: dict[str, Any] | None = None
        self._training_change_reason = "on_train_begin did not fire"
        self.trackers: Any = None
        """The run's live-curve trackers (bench.telemetry.trackers.Trackers), set by the worker; the trainer callback's
        ``on_log`` hands them each log point."""

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> "Telemetry":
        """Start the wall clock (and, when enabled, the memory sampler). Idempotent."""
        if self._t_start is not None:
            return self
        if self.enabled:
            self._cuda = TorchCudaCounters(self.device)
            self._readers = SampledReaders(self.device)
            self._sampler = MemorySampler(self._readers, self.interval_s)
            available = set(self._cuda.sources) | set(self._readers.sources)
            self._sources = [s for s in SOURCES if s in available]  # fixed now: close() drops NVML
            if self._cuda.available:
                self._cuda.take_peaks()  # start the first window clean
            self._sampler.start()
        self._t_start = time.perf_counter()
        self._t_last = self._t_start
        return self

    def stop(self) -> None:
        """Close open phases/steps, stop the sampler and the wall clock. Idempotent."""
        if self._t_start is None or self._t_end is not None:
            return
        if self.enabled:
            if self._stack:  # phases left open (an exception): close them all
                self._transition()
                self._stack.clear()
            if self._in_step:
                self.step_end()
            self._transition()  # last window's memory goes to the run peak
            assert self._sampler is not None and self._readers is not None
            self._sampler.stop()
            self._readers.close()
        self._maxrss_end = max_rss_bytes()
        self._t_end = time.perf_counter()

    def __enter__(self) -> "Telemetry":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def sources(self) -> list[str]:
        """Sources with readings in this run (an unavailable source is absent, never 0)."""
        return list(self._sources)

    # -- the clock -------------------------------------------------------------------------------
    def _owner(self) -> str | None:
        if self._stack:
            return self._stack[-1][0]
        return OTHER if self._in_step else None

    def _transition(self) -> None:
        """Charge the time and memory since the last boundary to the current owner."""
        cuda = self._cuda
        if cuda is not None and cuda.available:
            cuda.synchronize()  # kernels queued by the owner finish on the owner's clock
        now = time.perf_counter()
        owner = self._owner()
        if owner is not None:
            self._times[owner] = self._times.get(owner, 0.0) + (now - self._t_last)
        self._t_last = now
        peaks: dict[str, int] = {}
        if cuda is not None and cuda.available:
            peaks.update(cuda.take_peaks())
        if self._sampler is not None:
            self._sampler.sample_now()  # every window gets at least one reading
            _fold(peaks, self._sampler.reset_peak())
        _fold(self._run_peak, peaks)
        if owner is not None:
            _fold(self._phase_peaks.setdefault(owner, {}), peaks)

    # -- phases ----------------------------------------------------------------------------------
    def begin_phase(self, name: str) -> None:
        """Open phase ``name`` (pauses the enclosing phase's clock).

        Re-opening the phase that is already innermost (a wrapped ``forward`` inside a wrapped
        ``generate`` of the same phase) is a pass-through: it neither counts again nor splits the time.
        """
        if not self.enabled or self._t_start is None or self._t_end is not None:
            return
        if self._stack and self._stack[-1][0] == name:
            self._stack.append((name, True))  # pass-through: keeps begin/end balanced, owner unchanged
            return
        self._transition()
        self._stack.append((name, False))
        self._counts[name] = self._counts.get(name, 0) + 1

    def end_phase(self, name: str) -> None:
        """Close phase ``name``; also closes inner phases an exception left open."""
        if not self.enabled or not self._stack:
            return
        index = next((i for i in range(len(self._stack) - 1, -1, -1) if self._stack[i][0] == name), None)
        if index is None:
            return
        if index == len(self._stack) - 1 and self._stack[index][1]:
            self._stack.pop()  # closing a pass-through: no boundary
            return
        self._transition()
        del self._stack[index:]

    @contextlib.contextmanager
    def _phase_cm(self, name: str) -> Iterator[None]:
        self.begin_phase(name)
        try:
            yield
        finally:
            self.end_phase(name)

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Context manager timing ``name`` exclusively (see the module docstring)."""
        if not self.enabled:
            return _NULL
        return self._phase_cm(name)

    def active_phases(self) -> tuple[str, ...]:
        """Open phases, outermost first."""
        return tuple(name for name, _ in self._stack)

    # -- steps -----------------------------------------------------------------------------------
    def step_begin(self) -> None:
        """An optimizer step starts; unclaimed time until ``step_end`` goes to phase 'other'."""
        if not self.enabled or self._t_start is None or self._t_end is not None:
            return
        if self._in_step:  # a missed step_end (exception): close it first
            self.step_end()
        self._transition()
        self._in_step = True
        self._step_start = self._t_last
        self._counts[OTHER] = self._counts.get(OTHER, 0) + 1

    def step_end(self) -> None:
        """The optimizer step ends; its wall time is recorded."""
        if not self.enabled or not self._in_step:
            return
        self._transition()
        self._in_step = False
        self._step_times.append(self._t_last - self._step_start)

    # -- readings --------------------------------------------------------------------------------
    def mark_baseline(self, at: str = BASELINE_AFTER_LOAD) -> dict[str, int]:
        """Record current memory per source (bytes) as the baseline, labelled with when it was read.

        The baseline means "after the models are loaded, before training": :meth:`train_begin` reads it at
        ``on_train_begin``. A caller may read one earlier (``at=BASELINE_BEFORE_LOAD``) as the fallback for
        a recipe that never fires ``on_train_begin``; the later reading replaces it.
        """
        if not self.enabled:
            return {}
        if self._t_start is None:
            self.start()
        readings: dict[str, int] = {}
        if self._cuda is not None and self._cuda.available:
            self._cuda.synchronize()
            readings.update(self._cuda.current())
        if self._sampler is not None:
            readings.update(self._sampler.sample_now())
        self._baseline = readings
        self._baseline_at = at
        return dict(readings)

    # -- the training window ---------------------------------------------------------------------
    def mark_recipe_start(self) -> None:
        """The recipe is called (models not loaded yet): ``setup_s`` counts from here."""
        self._t_recipe_start = time.perf_counter()

    def mark_recipe_end(self) -> None:
        """The recipe returned."""
        self._t_recipe_end = time.perf_counter()

    def train_begin(self, model: Any = None) -> None:
        """Training starts (``on_train_begin``): baseline, weight snapshot, then the training clock.

        Only the first call counts (a recipe that runs several trainers is timed from the first one's
        start). The baseline and snapshot come before the clock starts, so their cost is not training time.
        """
        if self._t_train_begin is not None:
            return
        self.mark_baseline(BASELINE_AFTER_LOAD)
        if self.track_training_change:
            self._take_snapshot(model)
        self._t_train_begin = time.perf_counter()

    def train_end(self, model: Any = None) -> None:
        """Training ends (``on_train_end``): stop the training clock, then compare the weights.

        Every call moves the end (the last trainer's end counts) and redoes the comparison against the
        first snapshot. ``model`` defaults to the model snapshotted at ``on_train_begin``.
        """
        self._t_train_end = time.perf_counter()
        if self._snapshot is None:
            return
        if model is None and self._snapshot_model is not None:
            model = self._snapshot_model()
        if model is None:
            self._training_change_reason = "the model snapshotted at on_train_begin was gone at on_train_end"
            return
        self._training_change = self._snapshot.compare(model)

    def _take_snapshot(self, model: Any) -> None:
        if model is None:
            self._training_change_reason = "on_train_begin carried no model (kwargs['model'])"
            return
        self._snapshot = ParamSnapshot.take(model)
        try:
            self._snapshot_model = weakref.ref(model)
        except TypeError:  # not weak-referenceable: on_train_end must pass the model
            self._snapshot_model = None
        self._training_change_reason = "on_train_end did not fire"

    def _without_instrument(self, phases_mem: dict[str, dict[str, Any]]) -> tuple[dict[str, int], dict[str, Any] | None]:
        """(run peak by source, the instrument's record): the weight snapshot's host bytes taken out of every host
        reading made after it (the run's peak and each phase's), since a plain run of the method holds no such
        copy; None as the record when no snapshot was taken. ``phases_mem`` is edited in place.

        The snapshot is taken after the baseline and before the first training phase, so every training-phase
        reading and the run's peak include it; device readings (CUDA, NVML) never do (it lives on the host).
        The raw readings are kept under ``with_instrument`` in the record. A reading never drops below the
        baseline (models loaded, before the snapshot): the allocator may place the snapshot in memory the process
        already held, so its bytes are an upper bound on what it added to the resident set.
        """
        run_peak = dict(self._run_peak)
        if self._snapshot is None:
            return run_peak, None
        size = self._snapshot.host_bytes
        host = [s for s in run_peak if s in HOST_SOURCES]
        record = {"param_snapshot_bytes": size, "where": "host", "excluded_from": host,
                  "with_instrument": {s: run_peak[s] for s in host}}
        def without(source: str, reading: int) -> int:
            return max(self._baseline.get(source) or 0, reading - size)

        for s in host:
            run_peak[s] = without(s, run_peak[s])
        for entry in phases_mem.values():
            for s in host:
                if entry["by_source"].get(s) is not None:
                    entry["by_source"][s] = without(s, entry["by_source"][s])
            if entry["source"] in host and entry["peak_bytes"] is not None:
                entry["peak_bytes"] = entry["by_source"][entry["source"]]
        return run_peak, record

    def timing(self) -> dict[str, Any]:
        """Setup and training time (seconds), and which window ``train_s`` covers (``timing``).

        ``setup_s``: recipe start -> first ``on_train_begin`` (model loading, trainer construction);
        ``train_s``: first ``on_train_begin`` -> last ``on_train_end``; ``recipe_s``: the whole recipe.
        A recipe that fires no ``on_train_begin`` is timed whole: ``train_s`` = ``recipe_s``, ``setup_s`` None.
        """
        recipe_s = _span(self._t_recipe_start, self._t_recipe_end)
        begin, end = self._t_train_begin, self._t_train_end
        if begin is None:
            return {"setup_s": None, "train_s": recipe_s, "recipe_s": recipe_s, "timing": TIMING_WHOLE_RECIPE}
        if end is None or end < begin:
            label, end = TIMING_NO_END, self._t_recipe_end
        else:
            label = TIMING_TRAIN_WINDOW
        return {"setup_s": _span(self._t_recipe_start, begin), "train_s": _span(begin, end),
                "recipe_s": recipe_s, "timing": label}

    def train_elapsed_s(self) -> float | None:
        """Seconds since the first ``on_train_begin`` (to the last ``on_train_end`` once one fired); None before."""
        if self._t_train_begin is None:
            return None
        end = self._t_train_end if self._t_train_end is not None else time.perf_counter()
        return max(0.0, end - self._t_train_begin)

    def training_change(self) -> dict[str, Any]:
        """The weight comparison (see :meth:`ParamSnapshot.compare`), or why there is none.

        Without a comparison every figure is None and ``reason`` says what was missing.
        """
        if self._training_change is not None:
            return dict(self._training_change)
        reason = self._training_change_reason if self.track_training_change else "not tracked for this run"
        return {"params_changed_fraction": None, "update_to_weight_ratio": None, "trainable_params": None,
                "method": None, "reason": reason}

    def wall_s(self) -> float | None:
        """Seconds from start to stop (to now while running); None before start."""
        if self._t_start is None:
            return None
        end = self._t_end if self._t_end is not None else time.perf_counter()
        return end - self._t_start

    def summary(self) -> dict[str, Any]:
        """Everything measured, in the shapes of the result file's sections (bytes, seconds).

        ``memory.peak_bytes`` / ``baseline_bytes`` / per-phase ``peak_bytes`` come from ``source``
        (the primary source); ``by_source`` has every source that had a reading; ``kind`` / ``kinds`` say
        whether a per-phase reading is a peak of that phase or a high-water mark
        (:data:`bench.telemetry.memory.READING_KINDS`). Step statistics leave out the first
        ``warmup_steps`` steps unless no other step exists. ``timing`` is :meth:`timing`.
        """
        if not self.enabled:
            maxrss = self._maxrss_end if self._maxrss_end is not None else max_rss_bytes()
            return {
                "enabled": False,
                "wall_s": self.wall_s(),
                "timing": self.timing(),
                "memory": {"peak_bytes": maxrss, "source": CPU_MAXRSS, "kind": reading_kind(CPU_MAXRSS),
                           "baseline_bytes": None, "baseline_at": None, "phases": {}, "sources": [CPU_MAXRSS]},
                "phases": {},
                "step_s_median": None,
                "step_s_p90": None,
                "steps": 0,
                "step_times_s": [],
                "warmup_steps": self.warmup_steps,
                "counters": dict(self.counters),
            }
        if self._t_start is not None and self._t_end is None:
            self._transition()  # bring the running clocks up to date
        source = self.source
        phases_mem = {
            name: {"peak_bytes": peaks.get(source), "source": source, "kind": reading_kind(source),
                   "by_source": dict(peaks), "kinds": {s: reading_kind(s) for s in peaks}}
            for name, peaks in self._phase_peaks.items()
        }
        counted = self._step_times[self.warmup_steps:] or self._step_times
        run_peak, instrument = self._without_instrument(phases_mem)
        return {
            "enabled": True,
            "wall_s": self.wall_s(),
            "timing": self.timing(),
            "memory": {
                "peak_bytes": run_peak.get(source),
                "source": source,
                "kind": reading_kind(source),
                "baseline_bytes": self._baseline.get(source),
                "baseline_at": self._baseline_at,
                "phases": phases_mem,
                "sources": self.sources,
                "by_source": run_peak,
                "instrument": instrument,
                "baseline_by_source": dict(self._baseline),
            },
            "phases": {
                name: {"time_s": self._times.get(name, 0.0), "count": self._counts.get(name, 0)}
                for name in sorted(set(self._times) | set(self._counts), key=_phase_order)
            },
            "step_s_median": statistics.median(counted) if counted else None,
            "step_s_p90": _percentile(counted, 90.0) if counted else None,
            "steps": len(self._step_times),
            "step_times_s": list(self._step_times),
            "warmup_steps": self.warmup_steps,
            "counters": dict(self.counters),
        }

    # -- transformers ----------------------------------------------------------------------------
    def trainer_callback(self) -> Any:
        """A ``transformers.TrainerCallback`` driving the training window, steps and the 'update' phase, and handing
        each log point to the live-curve trackers (:attr:`trackers`).

        ``on_train_begin`` / ``on_train_end`` call :meth:`train_begin` / :meth:`train_end` with
        ``kwargs["model"]`` (the Trainer passes the model it trains; the suite's engine passes the actor).
        """
        from transformers import TrainerCallback

        telemetry = self

        class TelemetryCallback(TrainerCallback):
            """on_train_begin/end -> training window; on_step_begin/end -> step timer; optimizer.step() -> 'update'."""

            def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                telemetry.train_begin(kwargs.get("model"))

            def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                telemetry.train_end(kwargs.get("model"))

            def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                telemetry.step_begin()

            def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                telemetry.begin_phase("update")

            def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                telemetry.end_phase("update")

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                telemetry.step_end()

            def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
                if telemetry.trackers is not None and logs:  # live curves (bench.telemetry.trackers)
                    telemetry.trackers.on_log(state.global_step, logs, telemetry)

        return TelemetryCallback()


def _span(start: float | None, end: float | None) -> float | None:
    """end - start in seconds, or None when either is missing."""
    return None if start is None or end is None else end - start


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


_ORDER = ("generation", "reward", "reference", "critic", "advantage", "update", "evaluation", "other")


def _phase_order(name: str) -> tuple[int, str]:
    return (_ORDER.index(name) if name in _ORDER else len(_ORDER), name)
