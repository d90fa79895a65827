"""The one way an old public name warns that it has a new one."""

from __future__ import annotations

import warnings


def deprecated(old: str, new: str) -> None:
    """Warn that `old` (e.g. "Engine.requeue") is deprecated in favour of `new`; the warning
    points at the caller of the deprecated method, not at this module."""
    warnings.warn(
        f"{old} is deprecated; use {new} (same arguments, same result)",
        DeprecationWarning,
        stacklevel=3,
    )
