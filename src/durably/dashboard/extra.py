"""The import guard of the `dashboard` extra (starlette + uvicorn)."""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRA_HINT", "missing_modules"]

EXTRA_HINT = "pip install 'durably[dashboard]'"


def missing_modules(names: tuple[str, ...] = ("starlette", "uvicorn")) -> list[str]:
    """The modules of the `dashboard` extra that cannot be imported."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing
