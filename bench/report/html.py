"""index.html: one self-contained page (inline CSS, figures referenced relatively from figures/).

Rendered with jinja2 and ``autoescape=True``: completions are model output and may contain anything,
including ``<script>``; autoescaping makes every interpolated value text, never markup.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2

from bench.report import fmt, tables
from bench.report import phases as phase_times
from bench.report.figures import FigureInfo
from bench.report.load import Suite

MAX_SAMPLES = 3
"""Sample completions shown per method run: enough to see what the model writes, short enough to scroll."""

TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Benchmark report: {{ suite.preset }}</title>
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
</style>
</head>
<body>
<h1>Benchmark report: {{ suite.preset }}</h1>
<p class="meta">{{ suite.description }}{% if suite.created_at %} · created {{ suite.created_at }}{% endif %}
 · folder <code>{{ suite.suite_dir.name }}</code></p>
{% if suite.problems %}<ul class="problems">{% for p in suite.problems %}<li>{{ p }}</li>{% endfor %}</ul>{% endif %}

<h2>Results per method</h2>
{% if headline %}
<table>
<tr>{% for h in headline_columns %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in headline %}
<tr class="{{ 'failed' if row.status == 'failed' else ('notrun' if row.status == 'not_run' else '') }}">
{% for c in row.cells %}<td>{{ c }}</td>{% endfor %}</tr>
{% if row.error %}<tr><td class="error" colspan="{{ headline_columns|length }}">{{ row.error }}</td></tr>{% endif %}
{% endfor %}
</table>
{% for w in weight_warnings %}<p class="warning"><strong>Warning:</strong> {{ w }}</p>{% endfor %}
{% else %}<p>No method runs were planned or found.</p>{% endif %}

{% if differs_rows %}
<h2>What differs between methods</h2>
<p class="meta">Per-method settings recorded by each run; settings that differ come first.</p>
<table>
<tr>{% for h in differs_header %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in differs_rows %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}
</table>
{% endif %}

{% if paired %}
<h2>Paired tests (strict accuracy, same questions)</h2>
<p class="meta">Exact McNemar test on the questions where exactly one method is right; the difference A − B
with a 95% paired-bootstrap interval (2000 resamples). Runs are paired within a seed.</p>
<table>
<tr><th>A</th><th>B</th><th>questions</th><th>A only right</th><th>B only right</th><th>McNemar p</th>
<th>A − B (95% CI)</th></tr>
{% for t in paired %}
<tr><td>{{ t.a }}</td><td>{{ t.b }}</td><td>{{ t.n }}</td><td>{{ t.a_only }}</td><td>{{ t.b_only }}</td>
<td>{{ p_value_text(t.p_value) }}</td>
<td>{{ '%+.1f'|format(100 * t.diff) }} pp [{{ '%+.1f'|format(100 * t.diff_low) }}, {{ '%+.1f'|format(100 * t.diff_high) }}]</td></tr>
{% endfor %}
</table>
{% endif %}

{% if stages %}
<h2>Shared stages</h2>
<table>
<tr><th>stage</th><th>status</th><th>accuracy after (strict)</th><th>wall time</th><th>metrics</th></tr>
{% for s in stages %}
<tr><td>{{ s.stage }}</td><td>{{ s.status }}</td><td>{{ s.accuracy }}</td><td>{{ s.wall }}</td>
<td>{% for k, v in s.metrics %}{{ k }} = {{ v }}{% if not loop.last %}<br>{% endif %}{% else %}—{% endfor %}</td></tr>
{% if s.error %}<tr><td class="error" colspan="5">{{ s.error }}</td></tr>{% endif %}
{% endfor %}
</table>
{% endif %}

{% if phase_rows %}
<h2>Time per phase</h2>
<p class="meta">Exclusive seconds per phase (bench.telemetry). "not instrumented": the phase was not measured, not zero.</p>
<table>
<tr>{% for h in phase_header %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in phase_rows %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}
</table>
{% if phase_notes %}<ul>{% for n in phase_notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
{% endif %}

{% if figures %}
<h2>Figures</h2>
{% for f in figures %}
<figure><img src="figures/{{ f.name }}" alt="{{ f.caption }}"><figcaption>{{ f.caption }}</figcaption></figure>
{% endfor %}
{% endif %}

{% if samples %}
<h2>Sample completions</h2>
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

<h2>Notes on sources</h2>
<ul>{% for n in notes %}<li>{{ n }}</li>{% endfor %}</ul>

<h2>Environment</h2>
{% if environment %}
<p class="meta">As recorded by run <code>{{ environment_run }}</code>.</p>
<table>{% for k, v in environment %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>{% endfor %}</table>
{% else %}<p>No run recorded its environment.</p>{% endif %}

<h2>Resolved spec</h2>
{% if spec %}<pre>{{ spec }}</pre>{% else %}<p>No spec recorded.</p>{% endif %}
</body>
</html>
"""


def _environment(suite: Suite) -> tuple[str | None, list[tuple[str, str]]]:
    """The environment of the first ok run (else any run) that recorded one."""
    candidates = sorted(suite.runs, key=lambda r: r.status != "ok")
    for run in candidates:
        env = run.result.get("environment")
        if isinstance(env, dict) and env:
            return run.run_id, [(str(k), fmt.value_text(v)) for k, v in env.items()]
    return None, []


def _samples(suite: Suite) -> list[tuple[str, list[dict[str, Any]]]]:
    names = fmt.display_names(suite.methods)
    out = []
    for run in suite.methods:
        items = []
        for s in (run.result.get("samples") or [])[:MAX_SAMPLES]:
            if isinstance(s, dict):
                correct = s.get("correct")
                items.append({"question": str(s.get("question", "")), "completion": str(s.get("completion", "")),
                              "gold": str(s.get("gold", "")), "correct": correct if isinstance(correct, bool) else None})
        if items:
            out.append((names[run.run_id], items))
    return out


def render_html(suite: Suite, figures: list[FigureInfo]) -> str:
    """The page as a string (autoescaped)."""
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    template = env.from_string(TEMPLATE)
    differs_header, differs_rows = tables.what_differs(suite)
    phase_header, phase_rows = phase_times.phase_table(suite)
    env_run, environment = _environment(suite)
    return template.render(
        suite=suite,
        headline_columns=tables.HEADLINE_COLUMNS,
        headline=tables.headline_rows(suite),
        weight_warnings=tables.weight_change_warnings(suite),
        differs_header=differs_header,
        differs_rows=differs_rows,
        paired=tables.paired_tests(suite),
        p_value_text=fmt.p_value_text,
        stages=tables.stage_rows(suite),
        phase_header=phase_header,
        phase_rows=phase_rows,
        phase_notes=[n.replace("`", "") for n in phase_times.phase_notes(suite)],  # Markdown marks
        figures=figures,
        samples=_samples(suite),
        notes=[n.replace("`", "").replace("*", "") for n in tables.notes(suite)],  # Markdown marks
        environment=environment,
        environment_run=env_run,
        spec=json.dumps(suite.spec, indent=2, sort_keys=True, default=str) if suite.spec else "",
    )


def write_html(suite: Suite, figures: list[FigureInfo], path: Path) -> Path:
    path.write_text(render_html(suite, figures), encoding="utf-8")
    return path
