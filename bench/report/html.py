"""index.html: one self-contained page (inline CSS, figures referenced relatively from figures/).

Rendered with jinja2 and ``autoescape=True``: completions are model output and may contain anything,
including ``<script>``; autoescaping makes every interpolated value text, never markup.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jinja2

from bench.report import citation, claims, findings, fmt, headline, overview, scaling, summary, tables
from bench.report import phases as phase_times
from bench.report import trackers as live_curves
from bench.report.figures import FigureInfo
from bench.report.load import Suite

MAX_SAMPLES = 3
"""Sample completions shown per method run: enough to see what the model writes, short enough to scroll."""
SPEC_LIMIT = 20 * fmt.TEXT_LIMIT
"""Characters of the resolved spec's JSON shown (a shipped preset's is about 5,000; a huge description is cut)."""

TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Benchmark report: {{ suite.preset }} · {{ title }}</title>
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1200px;
       padding: 0 1rem; color: #222; line-height: 1.4; }
h1 { margin-bottom: .2rem; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
table { border-collapse: collapse; margin: .6rem 0; font-size: .9rem; }
th, td { border: 1px solid #ccc; padding: .3rem .5rem; text-align: left; vertical-align: top; }
th { background: #f3f5f8; }
tr.failed td, td.failed { background: #fdecea; }
tr.notrun td { color: #777; font-style: italic; }
td.error { background: #fdecea; color: #8a1f11; font-family: ui-monospace, monospace; font-size: .8rem; }
pre { background: #f6f8fa; padding: .6rem; overflow-x: auto; white-space: pre-wrap; word-break: break-word;
      font-size: .8rem; }
figure { margin: 1rem 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: .85rem; color: #555; }
.meta { color: #666; font-size: .9rem; } .problems { color: #8a1f11; }
.sample { border: 1px solid #e3e3e3; padding: .5rem; margin: .5rem 0; }
.ok { color: #1e6b34; } .wrong { color: #8a1f11; }
.warning { background: #fff4e0; border-left: 4px solid #d9822b; padding: .4rem .6rem; margin: .4rem 0; }
.scroll { overflow-x: auto; max-width: 100%; }
td.num { text-align: right; font-variant-numeric: tabular-nums; } td.na { text-align: center; color: #888; }
td:first-child { white-space: nowrap; }
nav.toc { font-size: .9rem; margin: .8rem 0; line-height: 1.8; }
ul.notes { font-size: .85rem; color: #444; margin-top: .2rem; }
td.best { font-weight: 700; background: #eaf4ea; }
ol.findings li { margin: .3rem 0; } ol.findings .basis { color: #555; font-size: .9rem; }
td.verdict-supported { background: #eaf4ea; color: #1e6b34; font-weight: 600; }
td.verdict-not-supported { background: #fdecea; color: #8a1f11; font-weight: 600; }
td.verdict-not-measured { color: #666; font-style: italic; }
td.verdict-construction { background: #eef2f7; color: #34495e; }
table.cite th { width: 14rem; }
table.claims { table-layout: fixed; width: 100%; } table.claims td:first-child { white-space: normal; }
table.claims col.claim { width: 26%; } table.claims col.source { width: 12%; } table.claims col.how { width: 25%; }
section.glance { border: 1px solid #888; border-radius: 4px; padding: .2rem 1rem .6rem; background: #f6f8fa; }
section.glance h2 { margin-top: .6rem; } section.glance li { margin: .25rem 0; }
table.claims col.measured { width: 27%; } table.claims col.verdict { width: 10%; } code.cmd { word-break: break-all; }
</style>
</head>
<body>
{% macro cell(c) -%}
<td{% if c is numeric %} class="num"{% elif c == missing %} class="na"{% endif %}>{{ c|keep_together }}</td>
{%- endmacro %}
{% macro table_section(title, key, t, level=2, align=true) %}
{% if t %}
<h{{ level }} id="{{ key }}">{{ title }}</h{{ level }}>
<p class="meta">{{ intro(key) }}</p>
{% for w in t.warnings %}<p class="warning"><strong>Warning:</strong> {{ w }}</p>{% endfor %}
<div class="scroll"><table>
<tr>{% for h in t.header %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in t.rows %}{% set i = loop.index0 %}<tr>{% for c in row %}
{%- if t.best is defined and (i, loop.index0) in t.best %}<td class="best">{{ c|keep_together }}</td>
{%- elif align %}{{ cell(c) }}{% else %}<td>{{ c }}</td>{% endif %}{% endfor %}</tr>{% endfor %}
</table></div>
{% if t.notes %}<ul class="notes">{% for n in t.notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
{% endif %}
{% endmacro %}
<h1>Benchmark report: {{ suite.preset }} · {{ title }}</h1>
<p class="meta">{{ description }}{% if suite.created_at %} · created {{ suite.created_at }}{% endif %}
 · folder <code>{{ suite.suite_dir.name }}</code></p>
{% if suite.problems %}<ul class="problems">{% for p in suite.problems %}<li>{{ p }}</li>{% endfor %}</ul>{% endif %}
<nav class="toc">{% for id, title in toc %}<a href="#{{ id }}">{{ title }}</a>
{%- if not loop.last %} · {% endif %}{% endfor %}</nav>

{% if glance %}<section class="glance" id="at-a-glance"><h2>At a glance</h2>
<p class="meta">{{ intro("glance") }}</p>
<ul>{% for line in glance %}<li>{{ line }}</li>{% endfor %}</ul></section>{% endif %}

<h2 id="findings">Findings</h2>
<p class="meta">{{ intro("findings") }}</p>
{% if findings %}<ol class="findings">{% for f in findings %}<li>{{ f.text }} <span class="basis">({{ f.basis }})</span></li>{% endfor %}</ol>
{% else %}<p>No measurement in this run supports a finding (no method run finished ok).</p>{% endif %}

{% if claims %}
<h2 id="claims">Claims check</h2>
<p class="meta">{{ intro("claims") }}</p>
<div class="scroll"><table class="claims">
<colgroup><col class="claim"><col class="source"><col class="how"><col class="measured"><col class="verdict"></colgroup>
<tr>{% for h in claims.header %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in claims.rows %}<tr>{% for c in row[:-1] %}<td>{{ c }}</td>{% endfor %}
<td class="verdict-{{ verdict_class(row[-1]) }}">{{ row[-1] }}</td></tr>{% endfor %}
</table></div>
{% if claims.notes %}<ul class="notes">{% for n in claims.notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
{% endif %}

{{ table_section("Headline", "headline", headline_table) }}

{{ table_section("Data checks", "data_checks", detail.data_checks, 2, false) }}

<h2 id="cite">Cite this run</h2>
<p class="meta">{{ intro("cite") }}</p>
<div class="scroll"><table class="cite">
{% for k, v in cite %}<tr><th>{{ k }}</th><td>{% if k.startswith("command") %}<code class="cmd">{{ v }}</code>{% else %}{{ v }}{% endif %}</td></tr>{% endfor %}
</table></div>

<h2 id="results">Results per method</h2>
<p class="meta">One row per run (seed). How each number was obtained (memory sources, scoring modes):
<a href="#notes">Notes on sources</a>.</p>
{% if headline %}
<div class="scroll"><table>
<tr>{% for h in headline_columns %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in headline %}
<tr class="{{ 'failed' if row.status == 'failed' else ('notrun' if row.status == 'not_run' else '') }}">
{% for c in row.cells %}{{ cell(c) }}{% endfor %}</tr>
{% if row.error %}<tr><td class="error" colspan="{{ headline_columns|length }}">{{ row.error }}</td></tr>{% endif %}
{% endfor %}
</table></div>
<ul class="notes">{% for n in mode_notes %}<li>{{ n }}</li>{% endfor %}</ul>
{% for w in weight_warnings %}<p class="warning"><strong>Warning:</strong> {{ w }}</p>{% endfor %}
{% else %}<p>No method runs were planned or found.</p>{% endif %}

{{ table_section("Across seeds", "seeds", detail.seeds, 2, false) }}

{{ table_section("Paired tests (headline accuracy, same questions)", "paired", paired) }}

{% for key, title, t in extra_detail %}{{ table_section(title, key, t, 2, false) }}{% endfor %}

{% if differs_rows %}
<h2 id="differs">What differs between methods</h2>
<p class="meta">Per-method settings recorded by each run; settings that differ come first. Precision per network
is under <a href="#networks">Networks resident while training</a>, decoding under
<a href="#generation">Generation settings</a>.</p>
<div class="scroll"><table>
<tr>{% for h in differs_header %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in differs_rows %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}
</table></div>
{% endif %}

{{ table_section("Networks resident while training", "networks", detail.networks) }}

{{ table_section("Throughput and time", "throughput", detail.throughput) }}

{% if phase_rows %}
<h2 id="phases">Time per phase</h2>
<p class="meta">Exclusive seconds per phase (bench.telemetry). "not instrumented": the phase was not measured, not zero.</p>
<div class="scroll"><table>
<tr>{% for h in phase_header %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in phase_rows %}<tr>{% for c in row %}{{ cell(c) }}{% endfor %}</tr>{% endfor %}
</table></div>
{% if phase_notes %}<ul>{% for n in phase_notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
{% endif %}

{{ table_section("Time per phase: shares", "phase_share", phase_share) }}

{{ table_section("Peak memory per phase", "phase_memory", phase_memory) }}

{{ table_section("Memory per rank", "memory_per_rank", detail.memory_per_rank) }}

{{ table_section("Generation backend", "generation_backend", detail.generation_backend) }}

{% if scaling_tables %}
<h2 id="scaling">Scaling (sweep)</h2>
<p class="meta">{{ intro("scaling") }}</p>
{% for title, t in scaling_tables.items() %}
<h3>{{ title }}</h3>
<div class="scroll"><table>
<tr>{% for h in t.header %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in t.rows %}<tr>{% for c in row %}{{ cell(c) }}{% endfor %}</tr>{% endfor %}
</table></div>
{% for w in t.warnings %}<p class="warning"><strong>Warning:</strong> {{ w }}</p>{% endfor %}
{% if t.notes %}<ul class="notes">{% for n in t.notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
{% endfor %}
{% endif %}

{% if stages %}
<h2 id="stages">Shared stages</h2>
<div class="scroll"><table>
<tr><th>stage</th><th>status</th><th>accuracy after ({{ suite.headline_mode }})</th><th>wall time</th><th>metrics</th></tr>
{% for s in stages %}
<tr><td>{{ s.stage }}</td><td>{{ s.status }}</td><td>{{ s.accuracy }}</td><td>{{ s.wall }}</td>
<td>{% for k, v in s.metrics %}{{ k }} = {{ v }}{% if not loop.last %}<br>{% endif %}{% else %}—{% endfor %}</td></tr>
{% if s.error %}<tr><td class="error" colspan="5">{{ s.error }}</td></tr>{% endif %}
{% endfor %}
</table></div>
{% endif %}

{{ table_section("Max lengths and truncation", "lengths", detail.lengths) }}

{% if tensorboard %}<p class="meta" id="live-curves">Every run's training curves, as they were logged live, in
TensorBoard: <code class="cmd">{{ tensorboard }}</code></p>{% endif %}
{% for w in tracker_warnings %}<p class="warning"><strong>Tracker warning</strong> (the run's numbers are unaffected): {{ w }}</p>{% endfor %}

{% if figures %}
<h2 id="figures">Figures</h2>
{% for f in figures %}
<figure><img src="figures/{{ f.name }}" alt="{{ f.caption }}"><figcaption>{{ f.caption }}</figcaption></figure>
{% endfor %}
{% endif %}

{% if samples %}
<h2 id="samples">Sample completions</h2>
{% for name, items in samples %}
<h3>{{ name }}</h3>
{% for s in items %}
<div class="sample">
<div><strong>Question:</strong> {{ s.question }}</div>
<pre>{{ s.completion }}</pre>
<div>gold: <code>{{ s.gold }}</code> ·
{% if s.correct is none %}verdict not recorded{% elif s.correct %}<span class="ok">correct</span>{% else %}<span class="wrong">wrong</span>{% endif %}</div>
</div>
{% endfor %}
{% endfor %}
{% endif %}

<h2 id="notes">Notes on sources</h2>
<ul>{% for n in notes %}<li>{{ n }}</li>{% endfor %}</ul>

<h2 id="settings">Settings and environment</h2>
{{ table_section("Generation settings", "generation", detail.generation, 3, false) }}

<h3 id="environment">Environment</h3>
{% if environment %}
<p class="meta">As recorded by run <code>{{ environment_run }}</code>.</p>
<div class="scroll"><table>
{% for k, v in environment %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>{% endfor %}
</table></div>
{% else %}<p>No run recorded its environment.</p>{% endif %}

<h3 id="spec">Resolved spec</h3>
{% if spec %}<details><summary>The full resolved spec (JSON), as the suite ran it</summary>
<pre>{{ spec }}</pre></details>
{% else %}<p>No spec recorded.</p>{% endif %}
</body>
</html>
"""


NUMERIC = re.compile(r"^[-+−]?[\d,]*\.?\d+(e-?\d+)?( ?(s|%|MiB|GiB|pp))?( †)?$")
"""A cell that is one number (with an optional unit): right-aligned so digits line up down a column."""
KEEP_TOGETHER = ((re.compile(r"(\d%) \["), "\\1\u00a0["), (re.compile(r"(\d)–(\d)"), "\\1\u2060–\u2060\\2"))
"""'25.0% [14.9–38.8]' must not wrap inside itself: a no-break space before the bracket, word joiners around
the en dash (a browser may otherwise break after it). The cell can still wrap at ' → '."""


def _is_numeric(text: Any) -> bool:
    return isinstance(text, str) and bool(NUMERIC.match(text))


def _keep_together(text: Any) -> str:
    out = str(text)
    for pattern, repl in KEEP_TOGETHER:
        out = pattern.sub(repl, out)
    return out


def _env_value(key: str, value: Any) -> str:
    """An environment value as text: byte counts in GiB with the exact count, an empty list as 'none'."""
    if key.endswith("_bytes") and fmt.num(value) is not None:
        return f"{value / fmt.GIB:,.1f} GiB ({int(value):,} bytes)"
    if isinstance(value, (list, tuple)) and not value:
        return "none"
    return fmt.cell_text(value)


def _environment(suite: Suite) -> tuple[str | None, list[tuple[str, str]]]:
    """The environment of the first ok run (else any run) that recorded one; nested values (``packages``)
    opened up into dotted keys, so no cell is a JSON blob."""
    candidates = sorted(suite.runs, key=lambda r: r.status != "ok")
    for run in candidates:
        env = run.result.get("environment")
        if isinstance(env, dict) and env:
            return run.run_id, [(str(k), _env_value(str(k), v)) for k, v in fmt.flat_items(env)]
    return None, []


def _toc(detail: dict[str, fmt.Table], figures: list[FigureInfo], has: dict[str, bool],
         extras: list[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """(anchor, title) of the sections this page has, in page order: a reader jumps instead of scrolling.
    ``extras``: (key, title) of the statistics and training-dynamics tables placed after the paired tests."""
    sections = [("at-a-glance", "At a glance", has["glance"]), ("findings", "Findings", True),
                ("claims", "Claims check", has["claims"]),
                ("headline", "Headline", has["headline"]),
                ("data_checks", "Data checks", bool(detail["data_checks"])), ("cite", "Cite this run", True),
                ("results", "Results per run", True), ("seeds", "Across seeds", bool(detail["seeds"])),
                ("paired", "Paired tests", has["paired"]), *((key, title, True) for key, title in extras),
                ("differs", "What differs", has["differs"]),
                ("networks", "Networks", bool(detail["networks"])),
                ("throughput", "Throughput and time", bool(detail["throughput"])),
                ("phases", "Time per phase", has["phases"]), ("phase_share", "Phase shares", has["phase_share"]),
                ("phase_memory", "Memory per phase", has["phase_memory"]),
                ("memory_per_rank", "Memory per rank", bool(detail["memory_per_rank"])),
                ("generation_backend", "Generation backend", bool(detail["generation_backend"])),
                ("scaling", "Scaling", has["scaling"]),
                ("stages", "Shared stages", has["stages"]),
                ("lengths", "Max lengths", bool(detail["lengths"])), ("figures", "Figures", bool(figures)),
                ("samples", "Samples", has["samples"]), ("notes", "Notes on sources", True),
                ("settings", "Settings and environment", True)]
    return [(anchor, title) for anchor, title, present in sections if present]


def _samples(suite: Suite) -> list[tuple[str, list[dict[str, Any]]]]:
    names = fmt.display_names(suite.methods)
    out = []
    for run in suite.methods:
        items = []
        for s in (run.result.get("samples") or [])[:MAX_SAMPLES]:
            if isinstance(s, dict):
                correct = s.get("correct")
                items.append({"question": fmt.cap_text(s.get("question", "")),
                              "completion": fmt.cap_text(s.get("completion", "")),
                              "gold": fmt.cap_text(s.get("gold", "")),
                              "correct": correct if isinstance(correct, bool) else None})
        if items:
            out.append((names[run.run_id], items))
    return out


def _spec_text(suite: Suite) -> str:
    """The resolved spec as indented JSON, capped at SPEC_LIMIT characters ('' when none was recorded)."""
    if not suite.spec:
        return ""
    return fmt.cap_text(json.dumps(suite.spec, indent=2, sort_keys=True, default=str), SPEC_LIMIT)


def render_html(suite: Suite, figures: list[FigureInfo]) -> str:
    """The page as a string (autoescaped)."""
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["keep_together"] = _keep_together
    env.tests["numeric"] = _is_numeric
    template = env.from_string(TEMPLATE)
    differs_header, differs_rows = tables.what_differs(suite)
    detail = tables.detail_tables(suite)
    phase_header, phase_rows = phase_times.phase_table(suite)
    env_run, environment = _environment(suite)
    paired = summary.paired_table(suite)
    stages, samples = tables.stage_rows(suite), _samples(suite)
    claims_table, headline_table = claims.claims_table(suite), overview.headline_table(suite)
    phase_share, phase_memory = overview.phase_share_table(suite), overview.phase_memory_table(suite)
    scaling_tables = scaling.titled_scaling_tables(suite)
    has = {"paired": bool(paired), "differs": bool(differs_rows), "phases": bool(phase_rows),
           "stages": bool(stages), "samples": bool(samples), "claims": bool(claims_table),
           "headline": bool(headline_table), "phase_share": bool(phase_share), "phase_memory": bool(phase_memory),
           "scaling": bool(scaling_tables), "glance": bool(headline.headline_block(suite))}
    return template.render(
        suite=suite,
        title=citation.run_title(suite),
        description=fmt.cap_text(citation.run_description(suite)),
        toc=_toc(detail, figures, has, [(k, title) for k, title, _ in summary.extra_detail(detail)]),
        missing=fmt.MISSING,
        headline_columns=summary.headline_columns(suite),
        mode_notes=summary.mode_notes(suite),
        headline=summary.headline_rows(suite),
        weight_warnings=tables.run_warnings(suite),
        detail=detail,
        intro=summary.intro,
        findings=findings.findings(suite),
        glance=headline.headline_block(suite),
        claims=claims_table,
        verdict_class=lambda verdict: claims.CSS_CLASS.get(verdict, "not-measured"),
        headline_table=headline_table,
        cite=citation.citation(suite),
        extra_detail=summary.extra_detail(detail),
        phase_share=phase_share,
        phase_memory=phase_memory,
        scaling_tables=scaling_tables,
        differs_header=differs_header,
        differs_rows=differs_rows,
        paired=paired,
        stages=stages,
        phase_header=phase_header,
        phase_rows=phase_rows,
        phase_notes=[n.replace("`", "") for n in phase_times.phase_notes(suite)],  # Markdown marks
        figures=figures,
        samples=samples,
        notes=[n.replace("`", "").replace("*", "") for n in tables.notes(suite)],  # Markdown marks
        environment=environment,
        environment_run=env_run,
        spec=_spec_text(suite),
        tensorboard=live_curves.tensorboard_command(suite),
        tracker_warnings=live_curves.tracker_warnings(suite),
    )


def write_html(suite: Suite, figures: list[FigureInfo], path: Path) -> Path:
    """Write the page atomically: a reader or a crash mid-write never sees half a page."""
    return fmt.write_text_atomic(path, render_html(suite, figures))
