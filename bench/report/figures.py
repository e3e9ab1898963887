"""Figures (PNG) for the report, drawn with matplotlib's object API on an Agg canvas.

No ``pyplot`` and no ``matplotlib.use``: figures are built as ``Figure`` objects attached to a
``FigureCanvasAgg``, so building a report never changes the caller's backend or leaves figures open in a
global registry (a notebook that calls ``build_report`` keeps its own plotting state).

Every builder returns None when there is nothing to draw, so the page simply leaves that figure out.

Print quality: 200 dpi PNG; one colour per method in every figure (:func:`method_colors`, the Okabe–Ito palette,
which stays distinguishable with the common colour-vision deficiencies; the lr-0 control is grey); units in
every axis label. Where a figure's marks are phases rather than methods (time per phase), the phases take a
separate sequential palette and each method's tick label keeps the method's colour.
Memory readings are charted one source per chart: cpu-rss, cuda-allocated and nvml numbers measure
different things and a shared axis would invite a false comparison.

One job, one file (about 650 lines): every figure of the report, each builder a short function over the same
colour, axis and saving helpers; splitting it would spread one palette and one set of conventions over modules.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import hsv_to_rgb, to_hex
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from bench.report import dynamics, fmt, pareto, reward_check, tables
from bench.report import phases as phase_times
from bench.report.labels import metric_label
from bench.report.load import Suite
from bench.report.records import FigureInfo, Run
from bench.results import METRIC_NAMES, PHASES

NETWORKS = ("actor", "critic", "reward", "reference")
COMPONENTS = (("weight_bytes", "weights", ""), ("grad_bytes", "gradients", "//"), ("optimizer_bytes", "optimizer", ".."))
CURVE_METRICS = ("reward", "kl", "accuracy_reward", "format_reward", "completion_length", "zero_std_groups")
DPI = 200
"""Print quality (200 dpi or more); figures stay about 1,400-2,400 px wide."""
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442", "#000000")
"""Okabe & Ito's colour-blind-safe palette (blue, orange, green, purple, vermillion, sky blue, yellow, black)."""
CONTROL_COLOR = "#888888"
CONTROL_METHOD = "control"
NOISE_FLOOR = "noise floor (lr 0)"
SOURCE_WORDS = {"cpu-rss": "resident set of the worker processes, not VRAM",
                "cuda-allocated": "PyTorch allocated GPU memory", "cuda-reserved": "PyTorch reserved GPU memory",
                "nvml-process": "GPU memory of the process tree", "nvml-device": "GPU memory of the whole device"}
"""What a measured memory source is, in a chart title (a CPU's resident set is never called VRAM)."""
PHASE_COLORS = ("#08306b", "#2171b5", "#6baed6", "#9ecae1", "#fdae6b", "#e6550d", "#a63603", "#cccccc")
"""Phases (not methods) in a sequential blue-to-orange ramp, so they never read as a method's colour."""


TOL_MUTED = ("#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677", "#882255", "#AA4499")
"""Paul Tol's muted palette, also colour-blind-safe: the colours after Okabe–Ito's eight."""


def _extra_color(i: int) -> str:
    """The ``i``-th colour past both palettes: hues a golden-ratio turn apart, so no two methods ever share one."""
    return to_hex(hsv_to_rgb(((0.13 + 0.618034 * i) % 1.0, 0.75, 0.8)))


def method_colors(suite: Suite) -> dict[str, str]:
    """Label -> colour, in the suite's method order: the same method has the same colour in every figure, and
    no two methods share one (Okabe–Ito, then Tol's muted palette, then distinct hues; the control grey)."""
    colors: dict[str, str] = {}
    palette = iter(OKABE_ITO + TOL_MUTED)
    extra = 0
    for run in suite.methods:
        if run.label in colors:
            continue
        if run.result.get("method") == CONTROL_METHOD:
            colors[run.label] = CONTROL_COLOR
            continue
        color = next(palette, None)
        if color is None:
            color, extra = _extra_color(extra), extra + 1
        colors[run.label] = color
    return colors


def _colors_of(runs: list[Run]) -> dict[str, str]:
    """:func:`method_colors` for a bare list of runs (callers without the suite)."""
    return method_colors(Suite(Path("."), "", "", None, {}, runs=list(runs)))


def _color_ticks(ax: Any, runs: list[Run], colors: dict[str, str], axis: str = "x") -> None:
    labels = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    for label, run in zip(labels, runs):
        label.set_color(colors.get(run.label, "#222222"))


def _axis_label(metric: str) -> str:
    """'mean reward (reward units)': the metric's name (bench.report.labels) with its unit from
    bench.results.METRIC_NAMES."""
    unit = METRIC_NAMES[metric].unit.split(" (")[0] if metric in METRIC_NAMES else ""  # the unit, not its gloss
    name = metric_label(metric)
    return f"{name} ({unit})" if unit and unit not in name else name


def _new(width: float, height: float, ncols: int = 1, nrows: int = 1) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)  # attaches itself as fig.canvas; no global backend involved
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def _save(fig: Figure, out_dir: Path, name: str) -> str:
    fig.savefig(out_dir / name, format="png")
    return name


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "unknown"


def accuracy_figure(suite: Suite, out_dir: Path, mode: str | None = None) -> FigureInfo | None:
    """Accuracy before / after per method run with 95% Wilson intervals as error bars, in ``mode`` (default:
    the folder's headline mode); the file is ``accuracy_<mode>.png`` and the caption names the mode."""
    mode = mode or suite.headline_mode
    runs = [r for r in suite.methods if fmt.score(r, "before", mode) or fmt.score(r, "after", mode)]
    if not runs:
        return None
    names = fmt.display_names(suite.methods)
    colors = method_colors(suite)
    fig, axes = _new(max(6.5, 1.2 * len(runs) + 3), 4.2)
    ax = axes[0][0]
    width = 0.38
    for offset, when, alpha in ((-width / 2, "before", 0.35), (width / 2, "after", 1.0)):
        xs, heights, err_lo, err_hi, color = [], [], [], [], []
        for i, run in enumerate(runs):
            s = fmt.score(run, when, mode)
            if s is None:
                continue
            xs.append(i + offset)
            color.append(colors[run.label])
            heights.append(100 * s["accuracy"])
            # max(0, ...): at 0% or 100% the interval bound differs from the rate by float rounding only
            err_lo.append(max(0.0, 100 * (s["accuracy"] - s["low"])) if s["low"] is not None else 0.0)
            err_hi.append(max(0.0, 100 * (s["high"] - s["accuracy"])) if s["high"] is not None else 0.0)
        if xs:
            ax.bar(xs, heights, width, color=color, alpha=alpha, edgecolor=color, label=f"{when} training",
                   yerr=[err_lo, err_hi], capsize=3, error_kw={"elinewidth": 1, "alpha": 1.0})
    ax.set_xticks(range(len(runs)), [names[r.run_id] for r in runs], rotation=20, ha="right")
    _color_ticks(ax, runs, colors)
    ax.set_ylabel(f"accuracy ({mode}, %)")
    ax.set_ylim(0, 100)
    for i, run in enumerate(runs):
        if fmt.score(run, "after", mode) is None:
            # A failed run keeps its 'before' bar; say why the 'after' bar is missing rather than leave a gap.
            ax.text(i + width / 2, 1, fmt.status_text(run) if run.status != "ok" else "not evaluated",
                    rotation=90, ha="center", va="bottom", fontsize=8, color="#a33")
    ax.set_title(f"Accuracy before / after training (%, scoring mode {mode}), 95% intervals")
    handles = [Patch(facecolor="#777777", alpha=0.35, label="before (light)"),
               Patch(facecolor="#777777", label="after (solid)")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    name = _save(fig, out_dir, f"accuracy_{mode}.png")
    role = "headline mode" if mode == suite.headline_mode else "second mode"
    from bench.report import datachecks  # lazy, as scaling: the figures need it for this caption only

    return FigureInfo(name, f"Accuracy on {datachecks.split_text(suite)}, scoring mode {fmt.mode_note(mode)} "
                            f"({role}), before and after training, 95% {datachecks.interval_text(suite)}.")


def _measured(run: Run, source: str) -> dict[str, float | None]:
    """Phase -> peak bytes for the readings of ``source`` (None = phase recorded but not measured)."""
    memory = run.result.get("memory", {})
    out: dict[str, float | None] = {}
    phases = memory.get("phases") or {}
    for phase in list(PHASES) + [p for p in phases if p not in PHASES]:
        entry = phases.get(phase)
        if isinstance(entry, dict) and entry.get("source") == source:
            out[phase] = fmt.num(entry.get("peak_bytes"))
    if memory.get("source") == source:
        out["whole run"] = fmt.num(memory.get("peak_bytes"))
    return out


def _static(run: Run) -> dict[str, dict[str, float]]:
    networks = run.result.get("memory", {}).get("networks") or {}
    out = {}
    for net in list(NETWORKS) + [n for n in networks if n not in NETWORKS]:
        entry = networks.get(net)
        if isinstance(entry, dict):
            out[net] = {key: fmt.num(entry.get(key)) or 0.0 for key, _, _ in COMPONENTS}
    return out


def _draw_static(ax: Any, runs: list[Run], names: dict[str, str], colors: dict[str, str] | None = None) -> bool:
    """Stacked weights / gradients / optimizer bytes per network and run, in the method's colour; networks are
    separated by a white edge and named inside their segment, components by hatch. False when nothing to draw."""
    colors = colors or _colors_of(runs)
    data = {r.run_id: _static(r) for r in runs}
    total_max = max((sum(sum(c.values()) for c in nets.values()) for nets in data.values()), default=0.0)
    if total_max <= 0:
        return False
    unit, scale = fmt.byte_unit(total_max)
    for i, run in enumerate(runs):
        bottom = 0.0
        for net, comps in data[run.run_id].items():
            start = bottom
            for key, _, hatch in COMPONENTS:
                value = comps[key] / scale
                if value > 0:
                    ax.bar(i, value, 0.6, bottom=bottom, color=colors[run.label], hatch=hatch, edgecolor="white",
                           linewidth=1.2)
                    bottom += value
            if bottom - start > 0.06 * total_max / scale:  # tall enough to hold its name legibly
                ax.text(i, (start + bottom) / 2, net, ha="center", va="center", fontsize=7, color="white",
                        fontweight="bold", bbox={"facecolor": "#00000055", "edgecolor": "none", "pad": 1})
    ax.set_xticks(range(len(runs)), [names[r.run_id] for r in runs], rotation=20, ha="right")
    _color_ticks(ax, runs, colors)
    ax.set_ylabel(f"static memory (accounting, {unit})")
    ax.set_title(f"Static memory per network: weights + gradients + optimizer state ({unit}, source: accounting, "
                 f"not measured)")
    handles = [Patch(facecolor="#999999", hatch=h, edgecolor="white", label=lbl) for _, lbl, h in COMPONENTS]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return True


def _draw_measured(ax: Any, runs: list[Run], names: dict[str, str], source: str,
                   colors: dict[str, str] | None = None) -> bool:
    """Peak per phase and whole-run peak for one source: one group per phase, one bar per run in its method's
    colour (readable with five or more methods). Unmeasured readings are labelled, never drawn as zero."""
    colors = colors or _colors_of(runs)
    data = {r.run_id: _measured(r, source) for r in runs}
    found = {p for d in data.values() for p in d}
    # Suite phase order, then any other phase, then the whole-run peak last, whichever run recorded them first.
    phases = [p for p in PHASES if p in found] + sorted(found - set(PHASES) - {"whole run"})
    phases += ["whole run"] if "whole run" in found else []
    values = [v for d in data.values() for v in d.values() if v is not None]
    if not values:
        return False
    unit, scale = fmt.byte_unit(max(values))
    width = 0.8 / max(1, len(runs))
    for i, run in enumerate(runs):
        xs, hs = [], []
        for j, phase in enumerate(phases):
            x = j - 0.4 + width * (i + 0.5)
            if phase not in data[run.run_id]:
                continue
            v = data[run.run_id][phase]
            if v is None:
                # Say so on the chart: an empty slot would read as zero.
                ax.text(x, 0, "not measured", rotation=90, ha="center", va="bottom", fontsize=7, color="#a33")
                continue
            xs.append(x)
            hs.append(v / scale)
        ax.bar(xs, hs, width, color=colors[run.label], label=names[run.run_id])
    ax.set_xticks(range(len(phases)), phases)
    ax.set_xlabel("phase")
    ax.set_ylabel(f"peak memory ({source}, {unit})")
    ax.set_title(f"Measured peak memory per phase and whole run ({unit}, source: {source}"
                 f"{', ' + SOURCE_WORDS[source] if source in SOURCE_WORDS else ''})")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return True


def _kind_note(runs: list[Run], source: str) -> str:
    """' Per-phase readings are high-water marks ...' from the kind the runs recorded, or ''."""
    kinds = list(dict.fromkeys(k for k in (fmt.memory_kind(r, source) for r in runs) if k))
    if not kinds:
        return ""
    if kinds == ["high-water mark"]:
        return (" Per-phase readings are high-water marks: the allocator keeps its cache, so a later phase's "
                "figure includes memory held by earlier ones.")
    return f" Per-phase readings: {', '.join(kinds)}."


def memory_figures(suite: Suite, out_dir: Path) -> list[FigureInfo]:
    """One chart per measured memory source (static accounting beside it), plus a static-only chart for runs
    that have network accounting but no measured reading."""
    names = fmt.display_names(suite.methods)
    colors = method_colors(suite)
    runs = [r for r in suite.methods if r.result.get("memory")]
    sources: dict[str, list[Run]] = {}
    for run in runs:
        for source in _run_sources(run):
            sources.setdefault(source, []).append(run)
    out = []
    for source, members in sources.items():
        has_static = any(_static(r) for r in members)
        # Static above measured (not side by side): the page shows the figure at full width, so its text stays
        # legible at 50% zoom even with five or more methods.
        fig, axes = _new(max(8.0, 1.1 * len(members) + 4), 8.5 if has_static else 4.5, nrows=2 if has_static else 1)
        drawn_static = _draw_static(axes[0][0], members, names, colors) if has_static else False
        if has_static and not drawn_static:
            axes[0][0].set_visible(False)
        if not _draw_measured(axes[-1][0], members, names, source, colors):
            continue  # every reading of this source was null: nothing honest to draw
        # The title names both quantities drawn: the accounting is not a peak, and the peak is one source's.
        fig.suptitle(f"Memory per method run: static accounting (top) and measured peak, source {source} (bottom)"
                     if drawn_static else f"Measured peak memory per method run, source {source}")
        name = _save(fig, out_dir, f"memory_{_slug(source)}.png")
        caption = (f"Memory, source {source}: static accounting per network (top) and measured peak per phase "
                   f"(bottom, {source} only)." if drawn_static else f"Measured peak memory per phase, source {source}.")
        out.append(FigureInfo(name, caption + _kind_note(members, source)))
    static_only = [r for r in runs if not _run_sources(r) and _static(r)]
    if static_only:
        fig, axes = _new(max(5.0, 1.3 * len(static_only) + 2), 4.5)
        if _draw_static(axes[0][0], static_only, names, colors):
            fig.suptitle("Static memory per method run (accounting; no measured reading)")
            name = _save(fig, out_dir, "memory_static.png")
            out.append(FigureInfo(name, "Static memory accounting for runs without a measured reading."))
    return out


def _run_sources(run: Run) -> list[str]:
    memory = run.result.get("memory", {})
    found = [memory.get("source")] + [p.get("source") for p in (memory.get("phases") or {}).values()
                                       if isinstance(p, dict)]
    return list(dict.fromkeys(s for s in found if isinstance(s, str) and s))


def throughput_figure(suite: Suite, out_dir: Path) -> FigureInfo | None:
    """Completions/s and generated tokens/s per method run, side by side (different units, different axes)."""
    names = fmt.display_names(suite.methods)
    panels = [("completions_per_s", "completions / s (1/s)"), ("tokens_per_s", "generated tokens / s (tokens/s)")]
    runs = [r for r in suite.methods if any(fmt.throughput(r, k) is not None for k, _ in panels)]
    if not runs:
        return None
    colors = method_colors(suite)
    fig, axes = _new(max(8.0, 2.0 * len(runs) + 3), 4.0, ncols=2)
    for ax, (key, label) in zip(axes[0], panels):
        xs = [i for i, r in enumerate(runs) if fmt.throughput(r, key) is not None]
        ax.bar(xs, [fmt.throughput(runs[i], key) for i in xs], 0.6, color=[colors[runs[i].label] for i in xs])
        for i, r in enumerate(runs):
            if fmt.throughput(r, key) is None:
                ax.text(i, 0, "not measured", rotation=90, ha="center", va="bottom", fontsize=7, color="#a33")
        ax.set_xticks(range(len(runs)), [names[r.run_id] for r in runs], rotation=20, ha="right")
        _color_ticks(ax, runs, colors)
        ax.set_ylabel(label)
        ax.set_title(f"{label.split(' (')[0]} (per training second)")
        ax.grid(axis="y", alpha=0.3)
    name = _save(fig, out_dir, "throughput.png")
    return FigureInfo(name, "Completions and generated tokens per second of training: divided by the whole training "
                                 "time, not by the generation phase alone (those rates are in the throughput table).")


def phases_figure(suite: Suite, out_dir: Path) -> FigureInfo | None:
    """Stacked seconds per phase (generation, reward, reference, critic, update, ...) per method run."""
    names = fmt.display_names(suite.methods)
    data: dict[str, dict[str, float]] = {}
    for run in suite.methods:
        times = phase_times.measured_times(run)  # a phase whose TRL seam is missing is left out, not drawn as 0
        if times:
            data[run.run_id] = times
    if not data:
        return None
    runs = [r for r in suite.methods if r.run_id in data]
    order = list(PHASES) + sorted({p for d in data.values() for p in d} - set(PHASES))
    order = [p for p in order if any(p in d for d in data.values())]
    colors = PHASE_COLORS
    fig, axes = _new(8.0, max(2.5, 0.55 * len(runs) + 1.5))
    ax = axes[0][0]
    for j, phase in enumerate(order):
        lefts = [sum(data[r.run_id].get(p, 0.0) for p in order[:j]) for r in runs]
        widths = [data[r.run_id].get(phase, 0.0) for r in runs]
        ax.barh(range(len(runs)), widths, 0.6, left=lefts, color=colors[j % len(colors)], label=phase)
    ax.set_yticks(range(len(runs)), [names[r.run_id] for r in runs])
    _color_ticks(ax, runs, method_colors(suite), axis="y")
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title("Where the time goes: seconds per phase")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="x", alpha=0.3)
    name = _save(fig, out_dir, "phases.png")
    return FigureInfo(name, "Time per phase (seconds, stacked) for each method run." + phase_times.figure_note(suite))


def _seed_band(series: list[list[tuple[float, float]]]) -> tuple[list[float], list[float], list[float], list[float]]:
    """Steps every seed logged, with the mean over seeds and the band around it at each: ± one sample standard
    deviation for 3+ seeds, min–max for 2. Returns (steps, mean, low, high); empty lists when no step is shared."""
    per_seed = [dict(pts) for pts in series]  # step -> value (a repeated step keeps its last value)
    steps = sorted(set.intersection(*(set(d) for d in per_seed))) if per_seed else []
    mean, low, high = [], [], []
    for step in steps:
        values = [d[step] for d in per_seed]
        m = statistics.fmean(values)
        if len(values) >= 3:
            sd = statistics.stdev(values)
            lo, hi = m - sd, m + sd
        else:
            lo, hi = min(values), max(values)
        mean.append(m)
        low.append(lo)
        high.append(hi)
    return steps, mean, low, high


SEED_STYLES = ("--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)))
"""Line styles of a method's seeds, in seed order: seeds differ by style, never by colour (a faint or blended tint
of one method's colour reads as another method's). A method's mean, or its only run, is the solid line."""


def seed_styles(suite: Suite) -> dict[Any, Any]:
    """Seed -> its line style (:data:`SEED_STYLES`), the same in every figure; seeds in numeric order."""
    seeds = sorted({r.result.get("seed") for r in suite.methods if r.result.get("seed") is not None},
                   key=lambda seed: (len(str(seed)), str(seed)))
    return {seed: SEED_STYLES[i % len(SEED_STYLES)] for i, seed in enumerate(seeds)}


def _seed_legend(ax: Any, styles: dict[Any, Any], drawn: set[Any], fontsize: float = 7, **where: Any) -> None:
    """The axes' legend: its labelled lines (one per method), then one grey entry per seed style drawn."""
    handles, labels = ax.get_legend_handles_labels()
    for seed in (s for s in styles if s in drawn):
        handles.append(Line2D([], [], color="#444444", linestyle=styles[seed], linewidth=1.0))
        labels.append(f"seed {seed}")
    ax.legend(handles, labels, fontsize=fontsize, **where)


def curves_figure(suite: Suite, out_dir: Path) -> FigureInfo | None:
    """Training curves against optimizer step: reward, KL (when logged) and other stable metrics present.

    One colour per method, the lr-0 control grey. A method with 2+ ok seeds is drawn as its mean over seeds (solid)
    at the steps every seed logged, a hatched band (± one sample sd for 3+ seeds, min–max for 2) in its colour, and
    each seed as a thin line in the same colour, one line style per seed (:func:`seed_styles`); a method with one
    run keeps a single solid line. No smoothing is applied."""
    names = fmt.display_names(suite.methods)
    runs = [r for r in suite.methods if r.result.get("curves")]
    present = [m for m in CURVE_METRICS
               if any(isinstance(p, dict) and fmt.num(p.get(m)) is not None for r in runs for p in r.result["curves"])]
    if not present:
        return None
    ncols = 2 if len(present) > 1 else 1
    nrows = (len(present) + ncols - 1) // ncols
    colors, styles = method_colors(suite), seed_styles(suite)
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    bands: set[str] = set()  # the band kinds drawn: "sd" and/or "minmax"
    fig, axes = _new(5.0 * ncols + 1, 3.3 * nrows, ncols=ncols, nrows=nrows)
    flat = [ax for row in axes for ax in row]
    for ax, metric in zip(flat, present):
        drawn: set[Any] = set()  # seeds drawn in their own style: the legend explains those styles
        for label, members in groups.items():
            band = _method_curves(ax, metric, label, members, colors[label], styles, names, drawn)
            if band:
                bands.add(band)
        ax.set_xlabel("optimizer step (count)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers: no 1.5 ticks
        ax.set_ylabel(_axis_label(metric), fontsize=8)
        ax.set_title(f"{_axis_label(metric)}, logged per training step", fontsize=9)
        ax.grid(alpha=0.3)
        _seed_legend(ax, styles, drawn)
    for ax in flat[len(present):]:
        ax.set_visible(False)
    name = _save(fig, out_dir, "curves.png")
    return FigureInfo(name, _curves_caption(present, bands))


def _method_curves(ax: Any, metric: str, label: str, members: list[Run], color: Any, styles: dict[Any, Any],
                   names: dict[str, str], drawn: set[Any]) -> str | None:
    """One method's curves of ``metric`` on ``ax``: its mean over 2+ ok seeds with their band and each seed thin,
    else each run as its own line; adds to ``drawn`` the seeds drawn in their own style. Returns the band's kind
    ("sd" for 3+ seeds, "minmax" for 2), None when no band was drawn."""
    ok = [(r, _series(r, metric)) for r in members if r.status == "ok"]
    ok = [(r, pts) for r, pts in ok if pts]
    steps, mean, low, high = _seed_band([pts for _, pts in ok]) if len(ok) >= 2 else ([], [], [], [])
    averaged = {r.run_id for r, _ in ok} if steps else set()
    for run in (r for r in members if r.run_id not in averaged):  # one run, or runs outside the mean
        pts = _series(run, metric)
        if not pts:
            continue
        seed = run.result.get("seed")
        style = styles.get(seed, "-") if len(members) > 1 else "-"
        drawn |= {seed} if style != "-" else set()
        # The lr-0 control's reward wanders by chance alone: drawn as the noise floor the others must clear.
        control = run.result.get("method") == CONTROL_METHOD
        name = NOISE_FLOOR if control and metric == "reward" else names[run.run_id]
        ax.plot([s for s, _ in pts], [v for _, v in pts], marker="." if len(pts) < 30 and not control else None,
                color=color, linestyle=style, linewidth=1.5, label=name, zorder=1 if control else 2)
    if not steps:
        return None
    for run, pts in ok:  # each seed thin, in the method's colour and the seed's line style
        drawn.add(run.result.get("seed"))
        ax.plot([s for s, _ in pts], [v for _, v in pts], color=color, linewidth=0.8,
                linestyle=styles.get(run.result.get("seed"), ":"), label="_nolegend_", zorder=0)
    # Hatched, not filled: overlapping translucent fills blend into a tint that reads as another method.
    ax.fill_between(steps, low, high, facecolor="none", edgecolor=color, hatch="//", linewidth=0,
                    alpha=0.5, zorder=0.5)
    control = any(r.result.get("method") == CONTROL_METHOD for r, _ in ok)
    name = (NOISE_FLOOR if control and metric == "reward" else label) + f" (mean of {len(ok)} seeds)"
    ax.plot(steps, mean, marker="." if len(steps) < 30 and not control else None, color=color,
            linestyle="-", linewidth=2.0, label=name, zorder=1 if control else 2)
    return "sd" if len(ok) >= 3 else "minmax"


def _curves_caption(present: list[str], bands: set[str]) -> str:
    """The curves figure's caption: the metrics drawn and, when a band was drawn, what the mean and band are."""
    caption = ("Training curves against optimizer step (" + ", ".join(present) + "), as logged at each training "
               "step's rollouts; no smoothing. One colour per method (the lr-0 control grey).")
    if bands:
        kinds = [k for k in ("± one sample standard deviation over seeds (3+ seeds)" if "sd" in bands else "",
                             "min–max over seeds (2 seeds)" if "minmax" in bands else "") if k]
        caption += (" A method with 2+ ok seeds is drawn as its mean over seeds (thick solid) at the steps every seed "
                    "logged, with a hatched band: " + " or ".join(kinds) + "; each seed is a thin line in the "
                    "method's colour, one line style per seed (see the legend). A method with one seed is a single "
                    "solid line.")
    return caption


def _figure_modes(suite: Suite) -> tuple[str, str]:
    """The folder's headline mode, then the other of the suite's own pair (as the per-run table shows them)."""
    headline = suite.headline_mode or fmt.HEADLINE_MODE
    return headline, ("suite-flexible" if headline != "suite-flexible" else "suite-strict")


def _series(run: Run, metric: str) -> list[tuple[float, float]]:
    """(step, value) points of one curve metric, sorted by step; points without either are left out."""
    pts = [(fmt.num(p.get("step")), fmt.num(p.get(metric))) for p in (run.result.get("curves") or [])
           if isinstance(p, dict)]
    return sorted((s, v) for s, v in pts if s is not None and v is not None)


def _draw_panels(axes: Any, runs: list[Run], panels: list[tuple[str, float, str]],
                 suite: Suite) -> None:
    """One panel per (metric, scale, y label) stacked over a shared step axis; one line per run in its method's
    colour (the lr-0 control grey), one legend entry per method. A method with several seeds draws each seed in
    that colour with the seed's line style (:func:`seed_styles`), which the legend lists."""
    colors, styles = method_colors(suite), seed_styles(suite)
    per_label = {label: sum(r.label == label for r in runs) for label in {r.label for r in runs}}
    drawn: set[Any] = set()
    for ax, (metric, scale, ylabel) in zip(axes[:, 0], panels):
        named: set[str] = set()
        for run in runs:
            pts = _series(run, metric)
            if not pts:
                continue
            seed = run.result.get("seed")
            style = styles.get(seed, "-") if per_label[run.label] > 1 else "-"
            drawn |= {seed} if per_label[run.label] > 1 else set()
            # Seeds of a method share its colour and one legend entry: 3 seeds x 6 methods stay a short legend.
            label = "_nolegend_" if run.label in named else run.label
            named.add(run.label)
            ax.plot([s for s, _ in pts], [scale * v for _, v in pts], color=colors[run.label],
                    linestyle=style, linewidth=1.6, label=label, marker="." if len(pts) < 30 else None)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    _seed_legend(axes[0][0], styles, drawn, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    for ax in axes[:-1, 0]:
        ax.tick_params(labelbottom=False)  # the step axis is shared: its numbers once, under the last panel
    axes[-1][0].set_xlabel("optimizer step (count)")
    axes[-1][0].xaxis.set_major_locator(MaxNLocator(integer=True))


def aha_figure(suite: Suite, out_dir: Path) -> FigureInfo | None:
    """The 'aha' monitor: share of completions with a reflection phrase (top) and mean completion length
    (bottom) per step for every method that logged them, on one shared step axis."""
    runs = [r for r in suite.methods if _series(r, "reflection_rate")]
    if not runs:
        return None
    fig, axes = _new(9.0, 6.0, nrows=2)
    for ax in axes[1:, 0]:
        ax.sharex(axes[0][0])
    _draw_panels(axes, runs, [("reflection_rate", 100.0, "completions with a reflection phrase (%)"),
                                   ("completion_length", 1.0, "completion length (tokens)")], suite)
    axes[0][0].set_title("The 'aha' monitor, logged per training step: completions with a reflection phrase (%) "
                         "and completion length (tokens)", fontsize=9)
    name = _save(fig, out_dir, "aha.png")
    return FigureInfo(name, "Reflection-phrase rate ('wait', 'let me check', 'verify', ...; bench.telemetry.monitors) and "
                            "mean completion length per logged step, one line per run: one colour per method (the "
                            "lr-0 control grey), one line style per seed. A rise in both together is the 'aha "
                            "moment' the seed texts describe.")


def _reward_model_note(suite: Suite) -> str:
    """'reward model: 71.0% of 200 held-out pairs ranked right [64.3, 77.0]' (95% Wilson), or '' without one."""
    check = reward_check.reward_model_check(suite.runs)
    if not check:
        return ""
    return (f"reward model: {fmt.pct(check['accuracy'])} of {check['n']:,} held-out pairs ranked right "
            f"[{100 * check['low']:.1f}, {100 * check['high']:.1f}] (95% Wilson)")


def overoptimisation_points(run: Run) -> list[tuple[float, float, float, float]]:
    """(step, kl, rm_score, accuracy_reward) of every logged step that has all three, in step order.

    kl: KL(policy ‖ reference) per completion token (nats/token), rm_score: the reward model's mean raw score
    (logit), accuracy_reward: the verifier's mean accuracy reward (share in [0, 1]), all on the same rollout
    completions of that step (baselines/ppo.py). The figure draws exactly these values, unsmoothed.
    """
    out = []
    for point in run.result.get("curves") or []:
        if not isinstance(point, dict):
            continue
        values = [fmt.num(point.get(key)) for key in ("step", "kl", "rm_score", "accuracy_reward")]
        if all(v is not None for v in values):
            out.append(tuple(values))
    return sorted(out)  # type: ignore[arg-type]


KL_BINS = 8
"""Equal-count KL bins of a method's per-step points (pooled over seeds) for the binned-mean line."""


def binned_means(points: list[tuple[float, float]], bins: int = KL_BINS) -> list[tuple[float, float]]:
    """``(mean x, mean y)`` of ``points`` sorted by x and split into up to ``bins`` equal-count bins, in x order.

    The per-step KL of an RL run is noisy, so a line through the steps in order is a scribble; the binned means show
    how the reward moves as KL grows (the shape of Gao et al.'s curves) without smoothing over steps.
    """
    ordered = sorted(points)
    n = len(ordered)
    if n == 0:
        return []
    bins = max(1, min(bins, n))
    edges = [round(i * n / bins) for i in range(bins + 1)]
    out = []
    for lo, hi in zip(edges, edges[1:]):
        chunk = ordered[lo:hi]
        if chunk:
            out.append((sum(x for x, _ in chunk) / len(chunk), sum(y for _, y in chunk) / len(chunk)))
    return out


def overoptimisation_kl_figure(suite: Suite, out_dir: Path) -> FigureInfo | None:
    """The classic over-optimisation figure (Gao et al., 2023): the proxy the policy optimised (reward-model
    score, top) and the true reward (the verifier's accuracy reward, bottom) against KL to the reference.

    Every logged step is a faint point (seeds of a method share its colour; a ring marks each run's last step), and
    one line per method joins the means of its points in KL_BINS equal-count KL bins (pooled over seeds). The
    reward model's held-out pair accuracy is in the top panel's title and in the caption. None when no run logged
    a reward-model score with a KL above zero (no reference: no KL axis).
    """
    runs = [r for r in dynamics.rm_runs(suite) if any(kl > 0 for _, kl, _, _ in overoptimisation_points(r))]
    if not runs:
        return None
    colors = method_colors(suite)
    fig, axes = _new(8.0, 6.4, nrows=2)
    axes[1][0].sharex(axes[0][0])
    pooled: dict[str, tuple[list[tuple[float, float]], list[tuple[float, float]]]] = {}
    for run in runs:
        pts = overoptimisation_points(run)
        kls = [kl for _, kl, _, _ in pts]
        proxy, true = [rm for _, _, rm, _ in pts], [100 * a for _, _, _, a in pts]
        method_proxy, method_true = pooled.setdefault(run.label, ([], []))
        method_proxy += zip(kls, proxy)
        method_true += zip(kls, true)
        for ax, values in ((axes[0][0], proxy), (axes[1][0], true)):
            ax.plot(kls, values, linestyle="none", marker=".", markersize=4, alpha=0.35, color=colors[run.label],
                    label="_nolegend_")  # every logged step, unsmoothed
            ax.plot(kls[-1:], values[-1:], linestyle="none", marker="o", markersize=8, markerfacecolor="none",
                    markeredgecolor=colors[run.label], label="_nolegend_")  # where training ended
    for label, (proxy_pts, true_pts) in pooled.items():
        for ax, pts in ((axes[0][0], proxy_pts), (axes[1][0], true_pts)):
            means = binned_means(pts)
            ax.plot([x for x, _ in means], [y for _, y in means], color=colors[label], linewidth=2.0,
                    marker="s", markersize=4, label=f"{label} (mean per KL bin)")
    note = _reward_model_note(suite)
    axes[0][0].set_ylabel("reward-model score (logit)")
    axes[0][0].set_title("the proxy PPO optimised" + (f"\n{note}" if note else ""), fontsize=9)
    axes[1][0].set_ylabel("verifier accuracy reward (%)")
    axes[1][0].set_title("the true reward, on the same completions", fontsize=9)
    axes[1][0].set_xlabel("KL(policy ‖ reference) per token at the step's rollout (nats/token)")
    axes[0][0].tick_params(labelbottom=False)
    for ax in axes[:, 0]:
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle("Reward over-optimisation against KL: the reward model's score vs the verifier's reward")
    name = _save(fig, out_dir, "overoptimisation_kl.png")
    return FigureInfo(name, "PPO (reward model) against KL to the reference: the reward-model score it optimised "
                            "(top) and the verifier's accuracy reward on the same rollout completions (bottom). "
                            "Each faint point is one logged step (KL per token at that rollout, unsmoothed; a ring "
                            f"marks each run's last step); the line joins the means of {KL_BINS} equal-count KL "
                            "bins of the method's steps, pooled over seeds. A proxy that keeps rising while the true "
                            "reward falls as KL grows is reward over-optimisation (Gao et al., 2023)."
                      + (f" The {note}." if note else " No reward-model stage result: its held-out pair accuracy "
                                                      "is not known."))


def overoptimisation_figure(suite: Suite, out_dir: Path) -> FigureInfo | None:
    """The same runs against optimizer step: reward-model score (top), the verifier's accuracy reward on the same
    completions (bottom) and KL (when logged), sharing the step axis: when in training the two parted."""
    runs = dynamics.rm_runs(suite)
    if not runs:
        return None
    panels = [("rm_score", 1.0, "reward-model score (logit)"),
              ("accuracy_reward", 100.0, "verifier accuracy reward (%)")]
    if any(_series(r, "kl") for r in runs):
        panels.append(("kl", 1.0, "KL to reference (nats/token)"))
    fig, axes = _new(9.0, 2.6 * len(panels) + 0.6, nrows=len(panels))
    for ax in axes[1:, 0]:
        ax.sharex(axes[0][0])
    _draw_panels(axes, runs, panels, suite)
    axes[0][0].set_title("Reward over-optimisation per training step: reward-model score (logit) vs the verifier's "
                         "accuracy reward (%)", fontsize=9)
    note = _reward_model_note(suite)
    name = _save(fig, out_dir, "overoptimisation.png")
    return FigureInfo(name, "PPO (reward model): reward-model score and the verifier's accuracy reward on the same "
                            "rollouts per step" + (", and KL to the reference" if len(panels) > 2 else "")
                      + "; a rising score with a falling verifier reward is reward over-optimisation."
                      + (f" The {note}." if note else ""))


def reward_model_points(suite: Suite) -> list[tuple[int, float, float | None]]:
    """(step, held-out pair accuracy, training pair accuracy or None) of the reward-model stage's curve, in step
    order; step 0 is the untrained head. [] without the stage or its curve (a result written before the stage logged one)."""
    run = next((r for r in suite.stages if r.status == "ok" and r.result.get("method") == reward_check.REWARD_STAGE),
               None)
    out = []
    for point in (run.result.get("curves") or []) if run else []:
        if not isinstance(point, dict):
            continue
        step, heldout = fmt.num(point.get("step")), fmt.num(point.get("heldout_pair_accuracy"))
        if step is not None and heldout is not None:
            out.append((int(step), heldout, fmt.num(point.get("train_pair_accuracy"))))
    return sorted(out)


def reward_model_figure(suite: Suite, out_dir: Path) -> FigureInfo | None:
    """Held-out and training pair accuracy (%) over the reward-model stage's optimizer steps, from its untrained
    head (step 0), with 50% (chance) and the final held-out 95% Wilson interval marked."""
    points = reward_model_points(suite)
    check = reward_check.reward_model_check(suite.runs)
    if len(points) < 2 or check is None:
        return None
    fig, axes = _new(6.5, 3.8)
    ax = axes[0][0]
    steps = [p[0] for p in points]
    ax.plot(steps, [100 * p[1] for p in points], marker="o", color="#1f77b4",
            label=f"held-out pairs (n = {check['n']:,}, one per held-out question)")
    train = [(p[0], 100 * p[2]) for p in points if p[2] is not None]
    if train:
        ax.plot(*zip(*train), marker="s", linestyle="--", color="#ff7f0e", label="training pairs (as many, one per "
                                                                              "training question)")
    ax.errorbar([steps[-1]], [100 * check["accuracy"]], yerr=[[100 * (check["accuracy"] - check["low"])],
                [100 * (check["high"] - check["accuracy"])]], color="#1f77b4", capsize=4, linestyle="none")
    ax.axhline(100 * reward_check.CHANCE, color="grey", linestyle=":", label="chance (50%)")
    ax.set_xlabel("reward-model optimizer step (0 = untrained head)")
    ax.set_ylabel("pairs ranked right (%)")
    ax.set_title("Reward model: pair accuracy (%) over its training steps", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    name = _save(fig, out_dir, "reward_model.png")
    verdict = "learned" if check["learned"] else "did not learn"
    return FigureInfo(name, f"The reward model's pair accuracy over its training steps: held-out pairs (no question "
                            f"shared with training) and as many training pairs, from the untrained head at step 0; "
                            f"the bar is the final held-out 95% Wilson interval, {reward_check.interval_text(check)}. "
                            f"A training curve that rises while the held-out one stays flat is over-fitting. Verdict: "
                            f"it {verdict} (lower bound above 50% and above the untrained head).")


def pareto_figure(suite: Suite, out_dir: Path) -> FigureInfo | None:
    """Accuracy (headline mode) against peak memory and against wall time, seeds as points and each method's mean
    marked (bench.report.pareto); None unless at least two methods other than the control have ok runs with
    accuracy."""
    frame = pareto.pareto_frame(suite)
    if frame["label"].nunique() < 2:
        return None
    source = pareto.memory_source(frame)
    same_source = frame[frame["memory_source"] == source] if source else frame.iloc[0:0]
    colors = method_colors(suite)
    fig, axes = _new(11.0, 4.5, ncols=2)
    memory_ax, time_ax = axes[0]
    on_memory = pareto.draw_panel(memory_ax, same_source, "peak_memory_bytes", fmt.MIB, colors)
    on_time = pareto.draw_panel(time_ax, frame, "wall_s", 1.0, colors)
    memory_ax.set_xlabel(f"peak memory (MiB, source: {source or 'none recorded'})")
    time_ax.set_xlabel("wall time of the run (s)")
    for ax in (memory_ax, time_ax):
        ax.set_ylabel(f"accuracy after training (%, {suite.headline_mode})")
    memory_ax.set_title("accuracy against peak memory")
    time_ax.set_title("accuracy against wall time")
    time_ax.legend(fontsize=7, loc="best")
    name = _save(fig, out_dir, pareto.NAME)
    return FigureInfo(name, pareto.caption(suite, frame, source, on_memory, on_time))


def build_figures(suite: Suite, out_dir: Path) -> list[FigureInfo]:
    """Draw every figure there is data for into ``out_dir``; returns them in page order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figures: list[FigureInfo | None] = [
        *(accuracy_figure(suite, out_dir, mode) for mode in _figure_modes(suite)),
        *memory_figures(suite, out_dir),
        throughput_figure(suite, out_dir),
        phases_figure(suite, out_dir),
        curves_figure(suite, out_dir),
        aha_figure(suite, out_dir),
        overoptimisation_kl_figure(suite, out_dir),  # the classic figure first; the per-step one says when
        overoptimisation_figure(suite, out_dir),
        reward_model_figure(suite, out_dir),
    ]
    from bench.report.scaling import scaling_figures

    figures.append(pareto_figure(suite, out_dir))  # accuracy against memory and time: two methods or more
    figures += scaling_figures(suite, out_dir)  # sweep runs only: memory vs size, time vs G and length
    return [f for f in figures if f is not None]
