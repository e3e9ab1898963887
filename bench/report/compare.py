"""``bench compare RUN_A RUN_B [...] --out DIR``: two or more suite folders side by side.

One self-contained page (``DIR/index.html``, inline CSS, no figures, nothing fetched) and ``DIR/compare.md``:
first what differs in the environment (hardware, package versions, commit, preset, command), because that is
what a reader must know before reading any difference; then every headline number of every method, per
folder, with its difference from the first folder. Peak memory is compared only between readings of the same
source; a method missing from a folder reads "not in this run". Builds from result files alone (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

import jinja2

from bench.config.paths import check_path, check_suite_folder, shown
from bench.errors import UserError
from bench.report import citation, fmt, throughput
from bench.report.findings import accuracy, headline_mode, network_bytes
from bench.report.load import SUITE_FILE, Run, Suite, load_suite

ABSENT = "not in this run"
METRICS = (
    # key, label, unit, digits, higher is better
    ("static", "static memory, accounting", "MiB", 2, False),
    ("peak", "peak memory", "MiB", 1, False),
    ("step", "s/step (median)", "s", 3, False),
    ("tokens", "generated tokens/s of training", "tokens/s", 1, True),
    ("completions", "completions/s of training", "1/s", 2, True),
    ("generation", "completions/s of generation phase", "1/s", 2, True),
    ("before", "accuracy before", "%", 1, True),
    ("after", "accuracy after", "%", 1, True),
)


@dataclass
class Value:
    """One headline number of one method in one folder: the value (for differences) and its text."""

    value: float | None
    text: str
    source: str | None = None


def check_folder(path: Path) -> None:
    """Raise UserError (one line, exit 2) unless ``path`` is a suite folder (bench.config.paths.check_suite_folder:
    a folder whose suite.json has the shape `bench run` writes)."""
    check_suite_folder(path, "RUN_DIR")


def check_out_folder(out_dir: Path, folders: list[Path]) -> Path:
    """``out_dir`` checked as a folder to write (bench.config.paths.check_path) that is none of the compared folders,
    lies in no suite folder (its index.html would be written over, or beside, that suite's own page), holds
    nothing but an earlier comparison (files of the user's are never replaced), and can be written."""
    from bench.config.outputs import check_fresh_folder, check_writable, enclosing_suite

    hint = "give a new folder, e.g. --out reports/a-vs-b"
    out_dir = check_path(out_dir, "out-dir", "--out", hint=hint)
    for folder in folders:
        if out_dir.exists() and out_dir.resolve() == Path(folder).resolve():
            raise UserError(f"--out '{shown(out_dir)}' is one of the compared folders; its own index.html would be "
                            f"replaced: {hint}")
    if (out_dir / SUITE_FILE).exists() or (out_dir / SUITE_FILE).is_symlink():
        raise UserError(f"--out '{shown(out_dir)}' is a suite folder (it holds {SUITE_FILE}); its report would be "
                        f"replaced: {hint}")
    suite = enclosing_suite(out_dir)
    if suite is not None:
        raise UserError(f"--out '{shown(out_dir)}' lies inside the suite folder '{shown(suite)}'; a comparison "
                        f"is written beside suite folders, not into one: {hint}")
    for name in ("index.html", "compare.md"):
        if (out_dir / name).is_dir() and not (out_dir / name).is_symlink():
            raise UserError(f"'{shown(out_dir / name)}' is a folder where the comparison writes a file; give "
                            f"another --out")
    check_fresh_folder(out_dir, "--out", hint, ours=is_comparison_folder)
    return check_writable(out_dir, "--out", hint)


COMPARISON_FILES = ("index.html", "compare.md")
"""What `bench compare` writes into --out (and all an earlier comparison's folder holds)."""


def is_comparison_folder(folder: Path) -> bool:
    """Whether ``folder`` holds an earlier comparison and nothing else: only COMPARISON_FILES, compare.md opening
    with the heading :func:`compare_markdown` writes. Re-running a comparison into its folder replaces it."""
    names = {p.name for p in folder.iterdir()}
    if not names <= set(COMPARISON_FILES) or "compare.md" not in names:
        return False
    try:
        with (folder / "compare.md").open("rb") as handle:
            return handle.read(64).startswith(b"# Comparison: ")
    except OSError:
        return False


def check_distinct(folders: list[Path]) -> None:
    """Refuse a folder given twice (the same folder by two paths, e.g. reports/latest and the folder it names):
    every difference would read zero, which looks like a result."""
    seen: dict[Path, Path] = {}
    for folder in folders:
        key = Path(folder).resolve()
        if key in seen:
            same = "is given twice" if str(folder) == str(seen[key]) else f"is the same folder as '{shown(seen[key])}'"
            raise UserError(f"RUN_DIR '{shown(folder)}' {same}; give two or more different suite folders")
        seen[key] = Path(folder)


def _names(suites: list[Suite]) -> list[str]:
    """Column names: the folder names, numbered when two are the same (reports/latest vs other/latest)."""
    names = [s.suite_dir.resolve().name for s in suites]
    return [f"{n} ({i + 1})" if names.count(n) > 1 else n for i, n in enumerate(names)]


def environment_rows(suites: list[Suite]) -> tuple[list[list[str]], list[list[str]]]:
    """(rows that differ, rows that are the same): field, then one value per folder."""
    flat = []
    for suite in suites:
        entries = dict(citation.citation(suite))
        entries.pop("accuracy n and seeds", None)
        entries.pop("command (continue this folder)", None)  # names the folder itself: always differs
        env = citation.environment(suite)
        skip = ("time_utc", "packages", "gpus")
        entries.update({k: fmt.cell_text(v) for k, v in fmt.flat_items(env) if not k.startswith(skip)})
        flat.append(entries)
    keys = list(dict.fromkeys(k for entries in flat for k in entries))
    differ, same = [], []
    for key in keys:
        row = [key] + [entries.get(key, citation.NOT_RECORDED) for entries in flat]
        (differ if len(set(row[1:])) > 1 else same).append(row)
    return differ, same


def compared_mode(suites: list[Suite]) -> str:
    """The one scoring mode every folder's accuracy is compared in: the first folder's headline mode (two
    folders with different headline modes are still compared like for like)."""
    return headline_mode(suites[0])


def _numbers(suite: Suite, mode: str | None = None) -> dict[str, dict[str, Value]]:
    """Label -> metric key -> Value, seeds pooled (the mean over ok seeds); accuracy in ``mode`` (default: the
    folder's headline mode)."""
    groups: dict[str, list[Run]] = {}
    for run in suite.methods:
        groups.setdefault(run.label, []).append(run)
    mode = mode or headline_mode(suite)
    out = {}
    for label, runs in groups.items():
        ok = [r for r in runs if r.status == "ok"]
        if not ok:
            out[label] = {k: Value(None, fmt.status_text(runs[0])) for k, *_ in METRICS}
            continue

        def pooled(values: list[float | None]) -> float | None:
            xs = [v for v in values if v is not None]
            return mean(xs) if xs else None

        counted = next((r for r in ok if network_bytes(r)), None)
        static = sum(network_bytes(counted).values()) if counted else None
        source = ok[0].result.get("memory", {}).get("source")
        peak = pooled([fmt.num(r.result.get("memory", {}).get("peak_bytes")) for r in ok
                       if r.result.get("memory", {}).get("source") == source])
        acc = {w: [accuracy(r, w, mode) for r in ok] for w in ("before", "after")}
        row = {
            "static": Value(static, fmt.mib_number(static)),
            "peak": Value(peak, fmt.bytes_text(peak, source) if peak is not None else fmt.NOT_MEASURED, source),
            "step": Value(pooled([fmt.throughput(r, "step_s_median") for r in ok]), ""),
            "tokens": Value(pooled([fmt.throughput(r, "tokens_per_s") for r in ok]), ""),
            "completions": Value(pooled([fmt.throughput(r, "completions_per_s") for r in ok]), ""),
            # Per second of decoding alone: training seconds also hold reward, critic and update time.
            "generation": Value(pooled([throughput.generation_rate(r) for r in ok]), ""),
        }
        for key, digits in (("step", 3), ("tokens", 1), ("completions", 2), ("generation", 2)):
            row[key].text = fmt.float_text(row[key].value, digits)
        for when, scores in acc.items():
            real = [s for s in scores if s is not None]
            if len(real) == 1:
                row[when] = Value(100 * real[0]["accuracy"], f"{fmt.score_text(real[0])} (n = "
                                                              f"{fmt.int_text(real[0].get('total'))})")
            elif real:
                m = mean(s["accuracy"] for s in real)
                row[when] = Value(100 * m, f"{fmt.pct(m)} (mean of {len(real)} seeds)")
            else:
                row[when] = Value(None, fmt.MISSING)
        out[label] = row
    return out


def _difference(a: Value, b: Value, key: str, unit: str, digits: int) -> str:
    if a.value is None or b.value is None:
        return fmt.MISSING
    if key == "peak" and a.source != b.source:
        return f"not comparable ({a.source} vs {b.source})"
    scale = fmt.MIB if unit == "MiB" else 1.0
    diff = (b.value - a.value) / scale
    unit_text = "pp" if unit == "%" else unit
    ratio = f", {b.value / a.value:.2f}×" if a.value and unit != "%" else ""
    return f"{diff:+,.{digits}f} {unit_text}{ratio}"


def headline_rows(suites: list[Suite]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: method, number, one value per folder, then the difference of each folder from the first."""
    names = _names(suites)
    mode = compared_mode(suites)
    numbers = [_numbers(s, mode) for s in suites]
    labels = list(dict.fromkeys(lbl for n in numbers for lbl in n))
    header = ["method", "number", *names] + [f"{n} − {names[0]}" for n in names[1:]]
    rows = []
    absent = Value(None, ABSENT)
    for label in labels:
        for key, title, unit, digits, _ in METRICS:
            cells = [n.get(label, {}).get(key, absent) for n in numbers]
            if all(c.value is None for c in cells) and key in ("static", "tokens", "completions", "generation"):
                continue  # e.g. DPO's generation rates: nothing to compare anywhere
            shown_unit = f" ({mode})" if key in ("before", "after") else "" if key == "peak" else f" ({unit})"
            rows.append([label, title + shown_unit, *[c.text for c in cells]]
                        + [_difference(cells[0], c, key, unit, digits) for c in cells[1:]])
    return header, rows


TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Comparison: {{ names|join(' vs ') }}</title>
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1300px;
       padding: 0 1rem; color: #222; line-height: 1.4; }
h2 { margin-top: 2rem; border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
table { border-collapse: collapse; margin: .6rem 0; font-size: .9rem; }
th, td { border: 1px solid #ccc; padding: .3rem .5rem; text-align: left; vertical-align: top; }
th { background: #f3f5f8; } td.diff { background: #fff8e6; } .meta { color: #666; font-size: .9rem; }
.scroll { overflow-x: auto; }
</style></head><body>
<h1>Comparison: {{ names|join(' vs ') }}</h1>
<p class="meta">Folders: {% for p in paths %}<code>{{ p }}</code>{% if not loop.last %}, {% endif %}{% endfor %}.
Differences are each folder minus the first ({{ names[0] }}).</p>
{% for p in problems %}<p class="meta">{{ p }}</p>{% endfor %}
<h2 id="environment">Environment differences</h2>
{% if env_differ %}<div class="scroll"><table><tr><th>field</th>{% for n in names %}<th>{{ n }}</th>{% endfor %}</tr>
{% for row in env_differ %}<tr><th>{{ row[0] }}</th>{% for c in row[1:] %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}
</table></div>{% else %}<p>None recorded: the folders share hardware, versions, commit, preset and command.</p>{% endif %}
<h2 id="headline">Headline numbers</h2>
<div class="scroll"><table><tr>{% for h in header %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in rows %}<tr>{% for c in row %}<td{% if loop.index > 2 + names|length %} class="diff"{% endif %}>{{ c }}</td>{% endfor %}</tr>{% endfor %}
</table></div>
<h2 id="same">Environment in common</h2>
{% if env_same %}<div class="scroll"><table>
{% for row in env_same %}<tr><th>{{ row[0] }}</th><td>{{ row[1] }}</td></tr>{% endfor %}
</table></div>{% else %}<p>Nothing in common was recorded.</p>{% endif %}
</body></html>
"""


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    cell = fmt.md_text  # result data shown as written: never raw HTML, a split cell or an ended row

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows])


def mode_notes(suites: list[Suite]) -> list[str]:
    """Which scoring mode the accuracy rows use, and a note when a folder's own headline mode is another."""
    mode = compared_mode(suites)
    names = _names(suites)
    notes = [f"Accuracy: every folder in {fmt.mode_note(mode)}."]
    notes += [f"{n}: its own headline mode is {s.headline_mode}; compared here in {mode}, like for like."
              for n, s in zip(names, suites) if headline_mode(s) != mode]
    return notes


def compare_markdown(suites: list[Suite]) -> str:
    names = _names(suites)
    differ, same = environment_rows(suites)
    header, rows = headline_rows(suites)
    parts = [fmt.md_text(f"# Comparison: {' vs '.join(names)}"), "",
             "Folders: " + ", ".join(fmt.md_code(s.suite_dir.resolve()) for s in suites)
             + f". Differences are each folder minus the first ({fmt.md_text(names[0])}).", "",
             "## Environment differences", ""]
    parts += [_md_table(["field", *names], differ) if differ else "None recorded.", "", "## Headline numbers", "",
              _md_table(header, rows), ""] + [f"- {fmt.md_text(n)}" for n in mode_notes(suites)]
    parts += ["", "## Environment in common", ""]
    parts += [_md_table(["field", "value"], [r[:2] for r in same]) if same else "Nothing in common was recorded.", ""]
    return "\n".join(parts)


def compare_html(suites: list[Suite]) -> str:
    names = _names(suites)
    differ, same = environment_rows(suites)
    header, rows = headline_rows(suites)
    problems = [f"{n}: {fmt.cap_text(p)}" for n, s in zip(names, suites) for p in s.problems]
    problems += mode_notes(suites)
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return env.from_string(TEMPLATE).render(names=names, paths=[str(s.suite_dir.resolve()) for s in suites],
                                            env_differ=differ, env_same=same, header=header, rows=rows,
                                            problems=problems)


def compare(folders: list[Path], out_dir: Path) -> Path:
    """Write ``out_dir/index.html`` and ``out_dir/compare.md`` for two or more suite folders; returns the page.

    Raises:
        UserError: fewer than two folders, or one that is not a suite folder (one line; the CLI exits 2).
    """
    if len(folders) < 2:
        raise UserError("bench compare needs two or more suite folders")
    for folder in folders:
        check_folder(Path(folder))
    check_distinct([Path(f) for f in folders])
    out_dir = check_out_folder(Path(out_dir), [Path(f) for f in folders])  # before anything is written
    suites = [load_suite(Path(f)) for f in folders]
    out_dir.mkdir(parents=True, exist_ok=True)
    fmt.write_text_atomic(out_dir / "compare.md", compare_markdown(suites))
    return fmt.write_text_atomic(out_dir / "index.html", compare_html(suites))
