"""Scaling tables and figures for a sweep (bench.config.sweep): memory vs model size, time vs G and completion length,
and the memory model's prediction beside every measurement.

Reads only result files (``result["sweep"]``, ``result["prediction"]``, ``result["prediction_extrapolated"]``,
memory and throughput); imports no torch. A suite without sweep runs gets no table and no figure.

Memory sources are never mixed on one axis. The memory model predicts device memory; it is compared with three
measured quantities (the error is (predicted - measured) / measured):

- ``static accounting``: weights + gradients + optimizer state summed over the networks (exact by design);
- ``cuda-allocated peak``: PyTorch's allocator peak, against the predicted peak;
- ``cpu-rss delta``: the process's resident-memory peak minus its reading after the models were loaded, against
  the predicted peak minus the predicted weights (the weights are already resident at that baseline).

Which points a line joins: a figure over one axis (parameters, G, completion length) takes the points whose
other axes are at their first value, so that each line changes one thing.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bench.report import fmt
from bench.report.records import FigureInfo
from bench.report.load import Run, Suite

GIB = 1024**3
SOURCES = ("static accounting", "cuda-allocated peak", "cpu-rss delta")
"""The measured quantities the memory model is compared with (see the module docstring)."""
PPO_NAMES = ("ppo", "ppo_verifier")
GRPO_NAMES = ("grpo_engine", "grpo")
"""The ratio PPO / GRPO uses the first of each that ran (the engine's GRPO shares PPO's code)."""
MODEL_PREFIX = "model."
"""Axes that change the model (its size): the x of the memory-vs-parameters figure."""
TIME_AXES = {"generation.max_new_tokens": "completion length (new tokens)", "train.group_size": "group size G"}
DPI = 110
GPU_LINE = 80 * GIB
"""A reference line on the extrapolation: one 80 GiB GPU."""


@dataclass
class Point:
    """One sweep run, as the scaling report reads it."""

    run: Run
    point: str
    values: dict[str, Any]
    prediction: dict[str, Any] | None
    extrapolated: dict[str, Any] = field(default_factory=dict)

    @property
    def method(self) -> str:
        return str(self.run.result.get("method") or "")

    @property
    def ok(self) -> bool:
        return self.run.status == "ok"

    @property
    def error(self) -> dict[str, Any]:
        error = self.run.result.get("error")
        return error if isinstance(error, dict) else {}

    @property
    def oom(self) -> bool:
        return self.error.get("type") == "OutOfMemory"

    def status_text(self) -> str:
        if self.ok:
            return "ok"
        if self.oom:
            return f"OOM in {self.error.get('phase') or 'unknown phase'}"
        return f"failed: {self.error.get('type') or self.run.status}"

    def parameters(self) -> float | None:
        """The actor's parameter count: measured (accounting) when the run finished, else predicted."""
        actor = (self.run.result.get("memory", {}).get("networks") or {}).get("actor") or {}
        return fmt.num(actor.get("params")) or fmt.num((self.prediction or {}).get("parameters"))

    def measured(self, source: str) -> float | None:
        """The measured quantity compared with the prediction under ``source`` (SOURCES); None if not measured."""
        if not self.ok:
            return None
        memory = self.run.result.get("memory") or {}
        if source == "static accounting":
            nets = memory.get("networks") or {}
            total = sum((fmt.num(n.get(k)) or 0) for n in nets.values() if isinstance(n, dict)
                        for k in ("weight_bytes", "grad_bytes", "optimizer_bytes"))
            return total or None
        peaks, base = memory.get("by_source") or {}, memory.get("baseline_by_source") or {}
        if source == "cuda-allocated peak":
            return fmt.num(peaks.get("cuda-allocated"))
        peak, start = fmt.num(peaks.get("cpu-rss")), fmt.num(base.get("cpu-rss"))
        return peak - start if peak is not None and start is not None else None

    def predicted(self, source: str) -> float | None:
        """The prediction of the same quantity (see the module docstring)."""
        p = self.prediction or {}
        nets = [n for n in (p.get("networks") or {}).values() if isinstance(n, dict)]
        peak = fmt.num(p.get("peak_bytes"))
        if source == "static accounting":
            total = sum((fmt.num(n.get(k)) or 0) for n in nets for k in ("weights_bytes", "gradients_bytes",
                                                                         "optimizer_bytes"))
            return total or None
        if source == "cuda-allocated peak":
            return peak
        weights = sum((fmt.num(n.get("weights_bytes")) or 0) for n in nets)
        return peak - weights if peak is not None else None

    def throughput(self, key: str) -> float | None:
        return fmt.num((self.run.result.get("throughput") or {}).get(key)) if self.ok else None


def sweep_points(suite: Suite) -> list[Point]:
    """The suite's method runs that belong to a sweep, in suite order."""
    points = []
    for run in suite.methods:
        sweep = run.result.get("sweep")
        if not isinstance(sweep, dict):
            continue
        prediction = run.result.get("prediction")
        extra = run.result.get("prediction_extrapolated")
        points.append(Point(run, str(sweep.get("point") or run.run_id), dict(sweep.get("values") or {}),
                            prediction if isinstance(prediction, dict) else None,
                            extra if isinstance(extra, dict) else {}))
    return points


def _axes(suite: Suite, points: list[Point]) -> dict[str, list[Any]]:
    """Axis -> values in sweep order (from the suite's spec; else in the order the runs show them)."""
    axes = ((suite.spec or {}).get("sweep") or {}).get("axes")
    if isinstance(axes, dict) and axes:
        return {k: list(v) for k, v in axes.items()}
    found: dict[str, list[Any]] = {}
    for p in points:
        for key, value in p.values.items():
            if value not in found.setdefault(key, []):
                found[key].append(value)
    return found


def _line(points: list[Point], axes: dict[str, list[Any]], varying: Any) -> list[Point]:
    """Points whose axes other than ``varying`` (a predicate on the key) are at their first value."""
    return [p for p in points
            if all(p.values.get(k) == v[0] for k, v in axes.items() if not varying(k) and k in p.values)]


def _names(points: list[Point]) -> dict[str, str]:
    return {p.method: p.run.label for p in points}


def _methods(points: list[Point]) -> list[str]:
    return list(dict.fromkeys(p.method for p in points))


def _first(points: list[Point], names: tuple[str, ...]) -> str | None:
    present = {p.method for p in points}
    return next((n for n in names if n in present), None)


def _pct(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured <= 0:
        return None
    return (predicted - measured) / measured * 100.0


def _pct_text(value: float | None) -> str:
    return fmt.MISSING if value is None else f"{value:+.1f}%"


def _bytes(value: float | None) -> str:
    """Bytes as text without a source (the table's header or row names it)."""
    if value is None:
        return fmt.MISSING
    unit, scale = fmt.byte_unit(abs(value))
    return f"{value / scale:.2f} {unit}" if unit == "GiB" else f"{value / scale:.1f} {unit}"


def _count(value: float | None) -> str:
    if value is None:
        return fmt.MISSING
    return f"{value / 1e9:.2f}B" if value >= 1e9 else f"{value / 1e6:.2f}M"


# -- tables ---------------------------------------------------------------------------------------------------
def scaling_tables(suite: Suite) -> list[fmt.Table]:
    """Every point; predicted vs measured per point and source; the error per source; PPO / GRPO; extrapolation.

    Empty when the suite has no sweep runs. :func:`titled_scaling_tables` gives the same tables with titles.
    """
    return list(titled_scaling_tables(suite).values())


def titled_scaling_tables(suite: Suite) -> dict[str, fmt.Table]:
    """Title -> table, in page order, leaving out empty ones (see :func:`scaling_tables`)."""
    points = sweep_points(suite)
    if not points:
        return {}
    tables = {
        "Sweep: every point": _points_table(points),
        "Memory model: predicted vs measured": _error_table(points),
        "Memory model error per source": _error_summary(points),
        "PPO / GRPO memory at each point": _ratio_table(points),
        "Predicted at full size (not measured)": _extrapolation_table(points),
    }
    return {title: table for title, table in tables.items() if table}


def _primary_source(points: list[Point]) -> str:
    return "cuda-allocated peak" if any(p.measured("cuda-allocated peak") for p in points) else "cpu-rss delta"


def _points_table(points: list[Point]) -> fmt.Table:
    source = _primary_source(points)
    rows = []
    for p in points:
        pred = p.prediction or {}
        rows.append([p.point, p.run.label, p.status_text(), _count(p.parameters()), _bytes(p.measured(source)),
                     _bytes(p.predicted(source)), _pct_text(_pct(p.predicted(source), p.measured(source))),
                     str(pred.get("peak_phase") or fmt.MISSING), fmt.float_text(p.throughput("step_s_median"), 3),
                     fmt.float_text(p.throughput("tokens_per_s"), 1)])
    notes = [f"memory: {source} (see 'memory model error' for every source); predicted: bench.systems.memory_model; "
             "error = (predicted - measured) / measured",
             "s/step: median over the measured steps (the warm-up step left out); tokens/s: generated tokens per "
             "training second"]
    oom = [f"{p.run.run_id} ({p.error.get('phase') or 'unknown phase'})" for p in points if p.oom]
    if oom:
        notes.append(f"out of memory (an expected outcome of a sweep): {', '.join(oom)}")
    missing = sorted({str((p.run.result.get('sweep') or {}).get('prediction_note')) for p in points
                      if p.prediction is None and (p.run.result.get('sweep') or {}).get('prediction_note')})
    warnings = [f"no prediction: {fmt.cap_text(m, 300)}" for m in missing]
    return fmt.Table(["point", "method", "status", "parameters", f"measured ({source})", "predicted",
                      "error", "predicted peak phase", "s/step", "tokens/s"], rows, notes, warnings)


def _error_table(points: list[Point]) -> fmt.Table:
    rows = []
    for p in points:
        for source in SOURCES:
            measured, predicted = p.measured(source), p.predicted(source)
            if measured is None or predicted is None:
                continue
            rows.append([p.point, p.run.label, source, _bytes(predicted), _bytes(measured),
                         _pct_text(_pct(predicted, measured))])
    return fmt.Table(["point", "method", "source", "predicted", "measured", "error"], rows,
                     ["static accounting: weights + gradients + optimizer state over the networks; cuda-allocated "
                      "peak: against the predicted peak; cpu-rss delta: resident-memory peak minus the reading after "
                      "the models loaded, against the predicted peak minus the predicted weights"])


def error_by_source(points: list[Point]) -> dict[str, list[float]]:
    """Source -> the memory model's errors (%) over the points where both numbers exist."""
    out: dict[str, list[float]] = {}
    for p in points:
        for source in SOURCES:
            error = _pct(p.predicted(source), p.measured(source))
            if error is not None:
                out.setdefault(source, []).append(error)
    return out


def _error_summary(points: list[Point]) -> fmt.Table:
    rows = []
    for source, errors in error_by_source(points).items():
        rows.append([source, str(len(errors)), _pct_text(statistics.median(errors)),
                     f"{statistics.median(abs(e) for e in errors):.1f}%", f"{max(abs(e) for e in errors):.1f}%"])
    return fmt.Table(["source", "points", "median error", "median |error|", "max |error|"], rows,
                     ["the memory model's error per measured source over every finished sweep run"])


def _ratio_table(points: list[Point]) -> fmt.Table:
    ppo, grpo = _first(points, PPO_NAMES), _first(points, GRPO_NAMES)
    if not ppo or not grpo:
        return fmt.Table([], [])
    by = {(p.point, p.method): p for p in points}
    source = _primary_source(points)
    rows = []
    for point in dict.fromkeys(p.point for p in points):
        a, b = by.get((point, ppo)), by.get((point, grpo))
        if a is None or b is None:
            continue
        rows.append([point, _ratio_text(a.measured(source), b.measured(source)),
                     _ratio_text(a.measured("static accounting"), b.measured("static accounting")),
                     _ratio_text(fmt.num((a.prediction or {}).get("peak_bytes")),
                                 fmt.num((b.prediction or {}).get("peak_bytes")))])
    names = _names(points)
    return fmt.Table(["point", f"measured ({source})", "static accounting", "predicted peak"], rows,
                     [f"{names[ppo]} / {names[grpo]} at each point"])


def _ratio_text(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else fmt.MISSING


def _extrapolation(points: list[Point]) -> dict[str, dict[str, dict[str, Any]]]:
    """Method -> architecture -> prediction at full size, from the first run of each method that has them."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for p in points:
        if p.extrapolated and p.method not in out:
            out[p.method] = {k: v for k, v in p.extrapolated.items() if isinstance(v, dict)}
    return out


def _extrapolation_table(points: list[Point]) -> fmt.Table:
    names = _names(points)
    rows = []
    for method, by_arch in _extrapolation(points).items():
        for arch, pred in by_arch.items():
            rows.append([arch, names.get(method, method), _count(fmt.num(pred.get("parameters"))),
                         _bytes(fmt.num(pred.get("static_bytes"))), _bytes(fmt.num(pred.get("peak_bytes"))),
                         str(pred.get("peak_phase") or fmt.MISSING),
                         {True: "yes", False: "no"}.get(pred.get("fits"), fmt.MISSING)])
    return fmt.Table(["architecture (full size)", "method", "parameters", "static (predicted)",
                      "peak (predicted)", "peak phase", "fits one GPU"], rows,
                     ["predicted, not measured: bench.systems.memory_model at the sweep's first point's settings with the "
                      "full-size architecture; 'fits' against the memory model's GPU size"])


# -- figures --------------------------------------------------------------------------------------------------
def _new(width: float, height: float, ncols: int = 1) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def scaling_figures(suite: Suite, out_dir: Path) -> list[FigureInfo]:
    """Memory vs parameters (measured, predicted, extrapolated), time vs completion length and vs G, and
    predicted vs measured; written as PNGs into ``out_dir``. Empty when the suite has no sweep runs."""
    points = sweep_points(suite)
    if not points:
        return []
    out_dir = Path(out_dir)
    axes = _axes(suite, points)
    figures = [_memory_figure(points, axes, out_dir)]
    figures += [_time_figure(points, axes, key, out_dir) for key in TIME_AXES if len(axes.get(key, [])) > 1]
    figures.append(_predicted_vs_measured_figure(points, out_dir))
    return [f for f in figures if f is not None]


def _ppo_grpo_ratios(points: list[Point], value: Any) -> dict[float, float]:
    """x (parameters) -> PPO / GRPO ratio of ``value(point)`` where both methods have a value."""
    ppo, grpo = _first(points, PPO_NAMES), _first(points, GRPO_NAMES)
    if not ppo or not grpo:
        return {}
    by = {(p.point, p.method): p for p in points}
    out = {}
    for point in dict.fromkeys(p.point for p in points):
        a, b = by.get((point, ppo)), by.get((point, grpo))
        if a is None or b is None:
            continue
        x, va, vb = a.parameters(), value(a), value(b)
        if x is not None and va is not None and vb:
            out[x] = va / vb
    return out


def _memory_figure(points: list[Point], axes: dict[str, list[Any]], out_dir: Path) -> FigureInfo | None:
    line = _line(points, axes, lambda k: k.startswith(MODEL_PREFIX))
    source = _primary_source(points)
    extrapolated = _extrapolation(line or points)
    names = _names(points)
    if not any(p.measured(source) for p in line) and not extrapolated:
        return None
    fig, (left, right) = _new(12.5, 4.8, ncols=2)
    colors: dict[str, Any] = {}
    unit, scale = fmt.byte_unit(max([p.measured(source) or p.predicted(source) or 0 for p in line] or [0]))
    for method in _methods(line):
        mine = sorted([p for p in line if p.method == method and p.parameters()], key=lambda p: p.parameters())
        measured = [(p.parameters(), p.measured(source)) for p in mine if p.measured(source)]
        predicted = [(p.parameters(), p.predicted(source)) for p in mine if p.predicted(source)]
        if measured:
            drawn = left.plot([x for x, _ in measured], [y / scale for _, y in measured], marker="o",
                              label=f"{names[method]} (measured)")
            colors[method] = drawn[0].get_color()
        if predicted:
            left.plot([x for x, _ in predicted], [y / scale for _, y in predicted], linestyle="--", marker=".",
                      alpha=0.7, color=colors.get(method), label=f"{names[method]} (predicted)")
        for p in mine:
            if p.oom and p.predicted(source):
                left.plot([p.parameters()], [p.predicted(source) / scale], marker="x", markersize=10,
                          color=colors.get(method, "red"), linestyle="none")
    for x, ratio in _ppo_grpo_ratios(line, lambda p: p.measured(source)).items():
        top = max((p.measured(source) or 0) for p in line if p.parameters() == x)
        left.annotate(f"PPO/GRPO {ratio:.2f}x", (x, top / scale), textcoords="offset points", xytext=(0, 8),
                      ha="center", fontsize=8)
    left.set_xscale("log")
    left.set_xlabel("parameters (actor)")
    left.set_ylabel(f"{unit} ({source})")
    left.set_title(f"measured {source} vs parameters")
    if left.has_data():
        left.legend(fontsize=7)
    for method, by_arch in extrapolated.items():
        series = sorted(((fmt.num(v.get("parameters")), fmt.num(v.get("peak_bytes"))) for v in by_arch.values()),
                        key=lambda xy: xy[0] or 0)
        own = sorted([(p.parameters(), fmt.num((p.prediction or {}).get("peak_bytes")))
                      for p in line if p.method == method], key=lambda xy: xy[0] or 0)
        series = [(x, y) for x, y in own + series if x and y]
        if series:
            right.plot([x for x, _ in series], [y / GIB for _, y in series], linestyle="--", marker="o",
                       color=colors.get(method), label=f"{names.get(method, method)} (predicted)")
    full = {arch: pred for by_arch in extrapolated.values() for arch, pred in by_arch.items()}
    for arch, pred in full.items():
        ppo, grpo = _first_pred(extrapolated, PPO_NAMES, arch), _first_pred(extrapolated, GRPO_NAMES, arch)
        x = fmt.num(pred.get("parameters"))
        if ppo and grpo and x:
            right.annotate(f"{arch}\nPPO/GRPO {ppo / grpo:.2f}x", (x, ppo / GIB), textcoords="offset points",
                           xytext=(0, 8), ha="center", fontsize=7)
    if right.has_data():
        right.axhline(GPU_LINE / GIB, color="grey", linewidth=0.8, linestyle=":")
        right.text(right.get_xlim()[0], GPU_LINE / GIB, " 80 GiB", va="bottom", fontsize=7, color="grey")
        right.set_xscale("log")
        right.set_yscale("log")
        right.legend(fontsize=7)
    right.set_xlabel("parameters (actor)")
    right.set_ylabel("GiB (predicted peak, device)")
    right.set_title("predicted peak, extrapolated to 14B-72B (dashed: predicted)")
    name = "scaling_memory.png"
    fig.savefig(out_dir / name, format="png")
    oom = [p.run.run_id for p in points if p.oom]
    caption = (f"Left: measured {source} per method vs the actor's parameters (solid), the memory model's prediction "
               f"of the same quantity (dashed), and the PPO / GRPO ratio at each size. Right: the predicted peak "
               f"at the measured sizes and at full-size 14B-72B architectures (predicted, not measured).")
    if oom:
        caption += f" Out of memory (x, drawn at the prediction): {', '.join(oom)}."
    return FigureInfo(name, caption)


def _first_pred(extrapolated: dict[str, dict[str, dict[str, Any]]], names: tuple[str, ...], arch: str) -> float | None:
    for name in names:
        value = fmt.num((extrapolated.get(name, {}).get(arch) or {}).get("peak_bytes"))
        if value:
            return value
    return None


def _time_figure(points: list[Point], axes: dict[str, list[Any]], key: str, out_dir: Path) -> FigureInfo | None:
    line = [p for p in _line(points, axes, lambda k: k == key) if p.ok and key in p.values]
    if not line:
        return None
    fig, (left, right) = _new(11, 4.2, ncols=2)
    names = _names(points)
    for method in _methods(line):
        mine = sorted([p for p in line if p.method == method], key=lambda p: p.values[key])
        for ax, metric in ((left, "step_s_median"), (right, "tokens_per_s")):
            xy = [(p.values[key], p.throughput(metric)) for p in mine if p.throughput(metric) is not None]
            if xy:
                ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=names[method])
    label = TIME_AXES[key]
    left.set_title(f"seconds per step vs {label}")
    left.set_ylabel("s / step (median, warm-up left out)")
    right.set_title(f"generated tokens/s vs {label}")
    right.set_ylabel("tokens / s")
    values = sorted({p.values[key] for p in line})
    for ax in (left, right):
        ax.set_xlabel(label)
        ax.set_xticks(values)  # the swept values only: G 2.5 was not run
        if ax.has_data():
            ax.legend(fontsize=7)
    name = f"scaling_time_{key.rsplit('.', 1)[-1]}.png"
    fig.savefig(out_dir / name, format="png")
    fixed = ", ".join(f"{k}={v[0]}" for k, v in axes.items() if k != key)
    return FigureInfo(name, f"Seconds per optimizer step and generated tokens/s vs {label}"
                            + (f" (other axes at {fixed})" if fixed else "") + "; offline methods generate nothing.")


def _predicted_vs_measured_figure(points: list[Point], out_dir: Path) -> FigureInfo | None:
    sources = [s for s in SOURCES if any(p.measured(s) and p.predicted(s) for p in points)]
    if not sources:
        return None
    fig, panels = _new(4.4 * len(sources), 4.2, ncols=len(sources))
    names = _names(points)
    summary = error_by_source(points)
    for ax, source in zip(panels, sources):
        low, high = None, None
        for method in _methods(points):
            xy = [(p.measured(source), p.predicted(source)) for p in points
                  if p.method == method and p.measured(source) and p.predicted(source)]
            if not xy:
                continue
            ax.scatter([x / GIB for x, _ in xy], [y / GIB for _, y in xy], label=names[method], s=18)
            values = [v for pair in xy for v in pair]
            low = min(values) if low is None else min(low, *values)
            high = max(values) if high is None else max(high, *values)
        if low is not None and high is not None:
            ax.plot([low / GIB, high / GIB], [low / GIB, high / GIB], color="grey", linewidth=0.8, linestyle=":")
        errors = summary.get(source, [])
        median = f"median |error| {statistics.median(abs(e) for e in errors):.1f}%" if errors else ""
        ax.set_title(f"{source}\n{median}", fontsize=9)
        ax.set_xlabel("measured (GiB)")
        ax.set_ylabel("predicted (GiB)")
        ax.legend(fontsize=7)
    name = "scaling_predicted_vs_measured.png"
    fig.savefig(out_dir / name, format="png")
    return FigureInfo(name, "The memory model's prediction against the measurement for every finished sweep run, "
                            "one panel per measured source (dotted: predicted = measured); the error per point is "
                            "in the table 'memory model: predicted vs measured'.")
