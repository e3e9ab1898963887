"""Published anchors: external GSM8K numbers for the run's model, shown beside the measured ones, marked external.

The anchors are data (``baselines/anchors.yaml``: value, source, model, prompt, shots, extraction, budget for each
number). One is shown only when the suite's model is the anchor's model *with its pretrained weights*
(``spec.model.source`` hub or path, matched on ``spec.model.name_or_path``): a tiny model, or a real architecture
with random weights (the systems presets), has no published accuracy to stand beside. Every anchor row says
"external" and lists how its number was obtained, because none of it (prompt, extraction, budget) is this
suite's: the difference between an anchor and a measured number is not a finding by itself.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from bench.report import fmt
from bench.report.load import Suite

ANCHORS_FILE = "anchors.yaml"
PRETRAINED_SOURCES = ("hub", "path")
"""Model sources that load published weights; the others (tiny, config, architecture) are random-init."""
FIELDS = ("model", "value", "what", "beside", "source", "prompt", "shots", "extraction", "budget", "verified")


def anchors_path() -> Path:
    """The shipped anchors file (``baselines/anchors.yaml``)."""
    return Path(str(resources.files("baselines") / ANCHORS_FILE))


def load_anchors(path: Path | None = None) -> list[dict[str, Any]]:
    """The anchors in ``path`` (default: the shipped file), each with every field of :data:`FIELDS`.

    Raises ValueError naming the entry and the field when one is missing or ``value`` is not a number, so a
    malformed anchor fails in the tests rather than printing an unlabelled number.
    """
    path = Path(path) if path is not None else anchors_path()
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    entries = data.get("anchors") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a mapping with a list 'anchors'")
    for i, entry in enumerate(entries):
        missing = [f for f in FIELDS if not isinstance(entry, dict) or entry.get(f) in (None, "")]
        if missing:
            raise ValueError(f"{path}: anchor {i + 1} lacks {', '.join(missing)}")
        if fmt.num(entry["value"]) is None or not 0 <= entry["value"] <= 100:
            raise ValueError(f"{path}: anchor {i + 1} value {entry['value']!r} is not a percentage")
    return entries


def _model_key(name: str) -> str:
    """'Qwen/Qwen2.5-0.5B-Instruct' and '/models/qwen2.5-0.5b-instruct/' both -> 'qwen2.5-0.5b-instruct'."""
    return name.strip().rstrip("/").rsplit("/", 1)[-1].lower()


def suite_model(suite: Suite) -> tuple[str | None, str]:
    """(the model whose published numbers apply, or None; why / what it is) from the suite's spec."""
    model = (suite.spec or {}).get("model") or {}
    source, name = model.get("source"), model.get("name_or_path")
    if source not in PRETRAINED_SOURCES or not isinstance(name, str) or not name:
        what = model.get("architecture") or name or source or "unknown"
        return None, f"model {what} (source {source or 'unknown'}) has no pretrained weights a published number is for"
    return name, f"model {name} (source {source})"


def matching_anchors(suite: Suite, anchors: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The anchors for the suite's model (see the module docstring); empty when none apply."""
    name, _ = suite_model(suite)
    if name is None:
        return []
    anchors = load_anchors() if anchors is None else anchors
    return [a for a in anchors if _model_key(str(a["model"])) == _model_key(name)]


def _measured(suite: Suite, beside: str) -> str:
    """The measured number an anchor sits beside, in the headline mode, with what it is."""
    mode = suite.headline_mode
    ok = [r for r in suite.methods if r.status == "ok"]
    if beside == "before":
        scores = [s for s in (fmt.score(r, "before", mode) for r in ok) if s]
        return f"{fmt.score_text(scores[0])} (start, {mode})" if scores else fmt.NOT_MEASURED
    values = [s["accuracy"] for s in (fmt.score(r, "after", mode) for r in ok if r.result.get("method") == beside)
              if s]
    if not values:
        return fmt.NOT_MEASURED
    label = next(r.label for r in ok if r.result.get("method") == beside)
    mean = sum(values) / len(values)
    return f"{fmt.pct(mean)} ({label} after, {mode}, mean of {len(values)} seed(s))"


def run_budget(suite: Suite) -> str:
    """This run's training budget in the anchors' terms, from the spec that ran: LoRA (rank) or full fine-tuning,
    steps, prompts x group size per step, new tokens."""
    spec = suite.spec or {}
    train = spec.get("train") or {}
    lora = train.get("lora") or {}
    how = f"LoRA rank {lora.get('r', '?')}" if lora.get("enabled") else "full fine-tuning"
    gen = spec.get("generation") or {}
    parts = [how]
    if train.get("steps") is not None:
        parts.append(f"{train['steps']} steps" + (f" of {train['prompts_per_step']} prompts x G {train['group_size']}"
                                                   if train.get("prompts_per_step") and train.get("group_size")
                                                   else ""))
    if gen.get("max_new_tokens") is not None:
        parts.append(f"up to {gen['max_new_tokens']} new tokens")
    return "this run: " + ", ".join(parts)


def anchor_table(suite: Suite, anchors: list[dict[str, Any]] | None = None) -> fmt.Table:
    """Published numbers for the suite's model beside the measured ones; empty when the model has none."""
    matched = matching_anchors(suite, anchors)
    if not matched:
        return fmt.Table([], [])
    rows = []
    for a in matched:
        verified = "yes" if a["verified"] is True else fmt.cap_text(str(a["verified"]), 300)
        rows.append([f"{float(a['value']):.1f}% (external)", str(a["what"]), _measured(suite, str(a["beside"])),
                     str(a["prompt"]), str(a["shots"]), str(a["extraction"]),
                     f"{a['budget']}; {run_budget(suite)}",
                     fmt.cap_text(str(a["source"]), 500), verified])
    _, model = suite_model(suite)
    notes = [f"External numbers for {model}, from baselines/anchors.yaml. They were measured elsewhere with their own "
             f"prompt, shots, answer extraction and training budget (columns), so a gap to the measured number "
             f"mixes those differences with any real one; they are context, not a reproduction."]
    return fmt.Table(["published (external)", "what", "measured here", "prompt", "shots", "extraction", "budget",
                      "source", "verified"], rows, notes)
