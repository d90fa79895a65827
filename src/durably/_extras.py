"""Import guards of the optional extras, importable without them (the CLI asks before it
imports `durably.dashboard`, whose own import would fail)."""

from __future__ import annotations

import importlib.util

__all__ = ["DASHBOARD_MODULES", "EXTRA_HINT", "missing_modules"]

EXTRA_HINT = "pip install 'durably[dashboard]'"
DASHBOARD_MODULES = ("starlette", "uvicorn")


def missing_modules(names: tuple[str, ...] = DASHBOARD_MODULES) -> list[str]:
    """The modules among `names` (default: the `dashboard` extra) that cannot be imported."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing
