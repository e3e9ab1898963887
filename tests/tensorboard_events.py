"""Reading a run's TensorBoard event files back with TensorBoard's own reader (shared by tests/test_trackers.py and
the end-to-end check in tests/test_end_to_end.py); light to import: no torch."""

from __future__ import annotations

import math
from pathlib import Path

TENSORBOARD_DIR = "tensorboard"
"""A run's event-file folder (bench.telemetry.trackers.TENSORBOARD_DIR)."""


def tensorboard_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """Every scalar in ``folder``'s event files, read with TensorBoard's own reader: tag -> {step: value}."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def assert_tensorboard_equals_curves(run_dir: Path, curves: list[dict]) -> None:
    """Each curve value of ``curves`` (result.json's) is TensorBoard's scalar of that name at that step, and each
    curve name has no other step there. TensorBoard keeps a scalar as a float32, so equal means equal as float32
    (two NaNs are equal: a curve may hold one, bench.results)."""
    import numpy as np

    scalars = tensorboard_scalars(run_dir / TENSORBOARD_DIR)
    expected: dict[str, dict[int, float]] = {}
    for point in curves:
        for key, value in point.items():
            if key != "step" and isinstance(value, (int, float)):
                expected.setdefault(key, {})[int(point["step"])] = float(value)
    assert expected, f"{run_dir.name}: no curves to compare"
    for key, by_step in expected.items():
        assert key in scalars, f"{run_dir.name}: {key} not in TensorBoard ({sorted(scalars)})"
        assert set(scalars[key]) == set(by_step), (run_dir.name, key, sorted(scalars[key]), sorted(by_step))
        for step, value in by_step.items():
            got, want = scalars[key][step], np.float32(value)
            assert got == want or (math.isnan(got) and math.isnan(want)), (run_dir.name, key, step, got, value)
