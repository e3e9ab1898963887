"""Memory readers, each number labelled with its source, and a background sampler.

Sources (all bytes):

- ``cuda-allocated`` / ``cuda-reserved``: torch's allocator peaks (``max_memory_allocated`` /
  ``max_memory_reserved``), reset at every phase boundary. Only when ``torch.cuda.is_available()``;
  on a CPU machine torch returns 0 for these, which is not a measurement and is never reported.
  The reset isolates a phase only for ``cuda-allocated``: the caching allocator keeps what it reserved,
  so per-phase ``cuda-reserved`` (like NVML) is a high-water mark (:data:`READING_KINDS`).
- ``nvml-device``: memory used on the whole GPU (every process, the driver's own context included).
- ``nvml-process``: the sum of ``usedGpuMemory`` of the GPU's processes whose PID is this process or
  one of its children. Inside a container NVML may list host PIDs that match none of ours: then there
  is no reading (absent), not a 0.
- ``cpu-rss``: resident set size of this process and its children (psutil).

As in optimum-benchmark, device-wide memory is kept apart from this process's memory and from the
allocator's counters, and NVML/RSS are polled from a thread so that a peak inside a long kernel or
a long ``generate`` is seen. When ``pynvml`` is missing or ``nvmlInit`` fails (no driver, e.g.
``NVMLError_LibraryNotFound``) there are simply no NVML sources.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

import psutil

CUDA_ALLOCATED = "cuda-allocated"
CUDA_RESERVED = "cuda-reserved"
NVML_DEVICE = "nvml-device"
NVML_PROCESS = "nvml-process"
CPU_RSS = "cpu-rss"
CPU_MAXRSS = "cpu-maxrss"
"""Lifetime high-water mark of this process's RSS (getrusage); used only when telemetry is disabled."""

SOURCES = (CUDA_ALLOCATED, CUDA_RESERVED, NVML_DEVICE, NVML_PROCESS, CPU_RSS)
HOST_SOURCES = (CPU_RSS, CPU_MAXRSS)
"""Sources that read host memory: what the suite's own host-side instruments (the weight snapshot) add to."""

PEAK_RESET_PER_PHASE = "peak (reset per phase)"
HIGH_WATER_MARK = "high-water mark"
SAMPLED_PEAK = "sampled peak (reset per phase)"
READING_KINDS = {
    CUDA_ALLOCATED: PEAK_RESET_PER_PHASE,
    # reset_peak_memory_stats sets the reserved peak to what is reserved *now*, and the caching allocator
    # keeps what it reserved until empty_cache(): a phase's figure includes memory cached by earlier phases.
    CUDA_RESERVED: HIGH_WATER_MARK,
    # NVML sees the allocator's cache too (and, for the device, every other process).
    NVML_DEVICE: HIGH_WATER_MARK,
    NVML_PROCESS: HIGH_WATER_MARK,
    # Polled RSS, peak kept per phase window; RSS falls when memory is returned to the OS.
    CPU_RSS: SAMPLED_PEAK,
    CPU_MAXRSS: "lifetime high-water mark",
}
"""What a per-phase reading of each source means. A high-water mark can only rise from phase to phase, so
it says how much the run held by then, not what that phase needed; only ``cuda-allocated`` isolates a phase."""


def reading_kind(source: str | None) -> str | None:
    """The kind of a reading from ``source`` (see :data:`READING_KINDS`); None for an unknown source."""
    return READING_KINDS.get(source) if source else None


def primary_source(device: str) -> str:
    """The source of headline numbers: ``cuda-allocated`` on a CUDA device, ``cpu-rss`` otherwise."""
    return CUDA_ALLOCATED if str(device).startswith("cuda") else CPU_RSS


def _cuda_index(device: str) -> int:
    """The device index of 'cuda' / 'cuda:N' (the current device for a bare 'cuda')."""
    text = str(device)
    if ":" in text:
        return int(text.split(":", 1)[1])
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - telemetry must never break a run
        pass
    return 0


def max_rss_bytes() -> int:
    """This process's lifetime peak RSS (bytes), from getrusage; cheap, no sampling needed."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # Linux reports KiB


class TorchCudaCounters:
    """torch's allocator peaks for one CUDA device; inert (``available`` False) without CUDA."""

    def __init__(self, device: str) -> None:
        self.available = False
        self._torch: Any = None
        self._index = 0
        if not str(device).startswith("cuda"):
            return
        try:
            import torch

            if torch.cuda.is_available():
                self._torch = torch
                self._index = _cuda_index(device)
                self.available = True
        except Exception:  # noqa: BLE001
            self.available = False

    @property
    def sources(self) -> list[str]:
        """The sources this reader provides (empty without CUDA)."""
        return [CUDA_ALLOCATED, CUDA_RESERVED] if self.available else []

    def synchronize(self) -> None:
        """Wait for queued kernels, so that time and peaks land in the phase that caused them."""
        if self.available:
            self._torch.cuda.synchronize(self._index)

    def current(self) -> dict[str, int]:
        """Memory allocated / reserved now (bytes)."""
        if not self.available:
            return {}
        cuda = self._torch.cuda
        return {CUDA_ALLOCATED: int(cuda.memory_allocated(self._index)),
                CUDA_RESERVED: int(cuda.memory_reserved(self._index))}

    def take_peaks(self) -> dict[str, int]:
        """Peaks since the last call (bytes), then reset the counters for the next window."""
        if not self.available:
            return {}
        cuda = self._torch.cuda
        peaks = {CUDA_ALLOCATED: int(cuda.max_memory_allocated(self._index)),
                 CUDA_RESERVED: int(cuda.max_memory_reserved(self._index))}
        cuda.reset_peak_memory_stats(self._index)
        return peaks


class SampledReaders:
    """The sources read by polling: NVML device / process-tree memory and process-tree RSS.

    Args:
        device: 'cpu', 'cuda' or 'cuda:N'.
        nvml: read NVML; None (default) means only on a CUDA device (on a CPU run GPU memory is not
            this run's memory). True also needs pynvml and a driver, else no NVML sources.
        children_refresh_s: how often the list of child processes is refreshed (seconds); walking
            /proc for children is the expensive part of an RSS reading, so it is cached.
    """

    def __init__(self, device: str, nvml: bool | None = None, children_refresh_s: float = 1.0) -> None:
        self._process = psutil.Process(os.getpid())
        self._children: list[psutil.Process] = []
        self._children_at = -1e9
        self._children_refresh_s = children_refresh_s
        self._lock = threading.Lock()
        self._nvml: Any = None
        self._handle: Any = None
        self.nvml_error: str | None = None
        """Why NVML is not used (None when it is, or when it was not asked for)."""
        want_nvml = str(device).startswith("cuda") if nvml is None else nvml
        if want_nvml:
            self._init_nvml(device)

    # -- NVML ------------------------------------------------------------------------------------
    def _init_nvml(self, device: str) -> None:
        try:
            import pynvml  # nvidia-ml-py; imported lazily so that tests can substitute a fake
        except Exception as exc:  # noqa: BLE001 - ImportError or a broken install
            self.nvml_error = f"pynvml import failed: {type(exc).__name__}"
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.nvml_error = f"nvmlInit failed: {type(exc).__name__}"
            return
        try:
            self._handle = self._nvml_handle(pynvml, device)
        except Exception as exc:  # noqa: BLE001
            self.nvml_error = f"no NVML handle for {device}: {type(exc).__name__}"
            _quiet(pynvml.nvmlShutdown)
            return
        self._nvml = pynvml

    @staticmethod
    def _nvml_handle(pynvml: Any, device: str) -> Any:
        """The NVML handle of the GPU torch calls ``device``.

        NVML numbers GPUs ignoring CUDA_VISIBLE_DEVICES, so the UUID that torch reports is tried
        first; then the index mapped through CUDA_VISIBLE_DEVICES; then the plain index.
        """
        index = _cuda_index(device) if str(device).startswith("cuda") else 0
        try:
            import torch

            if torch.cuda.is_available():
                uuid = str(torch.cuda.get_device_properties(index).uuid)
                uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
                return pynvml.nvmlDeviceGetHandleByUUID(uuid)
        except Exception:  # noqa: BLE001 - fall back to indices
            pass
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if index < len(entries) and entries[index].isdigit():
            index = int(entries[index])
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    @property
    def sources(self) -> list[str]:
        """The sources this reader provides, in report order."""
        return ([NVML_DEVICE, NVML_PROCESS] if self._nvml is not None else []) + [CPU_RSS]

    def _tree(self) -> list[psutil.Process]:
        """This process and its (cached) children."""
        now = time.monotonic()
        with self._lock:
            if now - self._children_at >= self._children_refresh_s:
                try:
                    self._children = self._process.children(recursive=True)
                except psutil.Error:
                    self._children = []
                self._children_at = now
            return [self._process, *self._children]

    def tree_pids(self) -> set[int]:
        """PIDs of this process tree (this process and its children)."""
        return {proc.pid for proc in self._tree()}

    def read(self) -> dict[str, int]:
        """One reading of every available source (bytes); a source without a reading is absent."""
        readings: dict[str, int] = {}
        tree = self._tree()
        rss = 0
        for proc in tree:
            try:
                rss += int(proc.memory_info().rss)
            except psutil.Error:  # a child that just exited
                continue
        readings[CPU_RSS] = rss
        if self._nvml is not None:
            readings.update(self._read_nvml({proc.pid for proc in tree}))
        return readings

    def _read_nvml(self, pids: set[int]) -> dict[str, int]:
        nvml, handle = self._nvml, self._handle
        out: dict[str, int] = {}
        try:
            out[NVML_DEVICE] = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception:  # noqa: BLE001 - a failed reading is absent, not 0
            pass
        used = 0
        matched = False
        seen: set[int] = set()
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            fn: Callable[[Any], Any] | None = getattr(nvml, getter, None)
            if fn is None:
                continue
            try:
                procs = fn(handle)
            except Exception:  # noqa: BLE001
                continue
            for proc in procs:
                pid = int(proc.pid)
                # A process with both a compute and a graphics context appears in both lists.
                if pid not in pids or pid in seen:
                    continue
                seen.add(pid)
                mem = getattr(proc, "usedGpuMemory", None)
                if mem is None:  # NVML_VALUE_NOT_AVAILABLE (e.g. restricted drivers)
                    continue
                used += int(mem)
                matched = True
        if matched:
            out[NVML_PROCESS] = used
        return out

    def close(self) -> None:
        """Release NVML (idempotent)."""
        if self._nvml is not None:
            _quiet(self._nvml.nvmlShutdown)
            self._nvml = None


def _quiet(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001
        pass


def _fold(into: dict[str, int], readings: dict[str, int]) -> None:
    """Keep the maximum per source."""
    for source, value in readings.items():
        if value > into.get(source, -1):
            into[source] = value


class MemorySampler:
    """Polls ``readers`` from a daemon thread and keeps a running peak per source.

    The peak covers the readings since the last :meth:`reset_peak` (a phase boundary), plus any
    reading taken synchronously with :meth:`sample_now`, so that a phase shorter than the interval
    still gets at least one reading.

    Args:
        readers: what to read (usually :class:`SampledReaders`).
        interval_s: seconds between polls (default 0.05 s). Each poll costs an RSS read of the
            process tree, plus two NVML calls on a GPU.
    """

    def __init__(self, readers: SampledReaders, interval_s: float = 0.05) -> None:
        self.readers = readers
        self.interval_s = float(interval_s)
        self._lock = threading.Lock()
        self._peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0
        """Readings taken so far (thread and synchronous)."""

    def start(self) -> "MemorySampler":
        """Start polling (idempotent)."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="bench-memory-sampler", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_now()
            self._stop.wait(self.interval_s)

    def sample_now(self) -> dict[str, int]:
        """Take one reading now, fold it into the peak and return it (bytes)."""
        try:
            readings = self.readers.read()
        except Exception:  # noqa: BLE001 - a sampler must never kill the run
            return {}
        with self._lock:
            _fold(self._peak, readings)
            self.samples += 1
        return readings

    def peak(self) -> dict[str, int]:
        """Peak per source since the last reset (bytes)."""
        with self._lock:
            return dict(self._peak)

    def reset_peak(self) -> dict[str, int]:
        """Return the peak since the last reset and start a new window."""
        with self._lock:
            peak, self._peak = self._peak, {}
        return peak

    def stop(self) -> None:
        """Stop polling and wait for the thread (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, 5 * self.interval_s))
            self._thread = None

    def __enter__(self) -> "MemorySampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
