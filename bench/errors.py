"""User-facing errors: one line that names the problem and the fix, exit status 2, no traceback."""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix (bad preset, bad override, missing file). The CLI prints it on one line."""

    exit_code = 2


class SpecError(UserError):
    """The spec (preset + overrides) is invalid; the message names the key and the fix."""
