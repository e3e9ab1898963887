"""The one-line message a spec mistake gives (shared by the validation tests of several modules)."""

from __future__ import annotations

import pytest

from bench.errors import SpecError
from bench.config.loading import load_spec


def spec_error(overrides: list[str], preset: str = "cpu-quick") -> str:
    """The SpecError message of ``preset`` + ``overrides``, asserted to be one line (what the user sees)."""
    with pytest.raises(SpecError) as info:
        load_spec(preset, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message
