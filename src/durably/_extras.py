"""Import guards of the optional extras, importable without them (the CLI asks before it
imports `durably.dashboard`, whose own import would fail; a PostgreSQL URL is checked before
SQLAlchemy's dialect imports its driver, whose bare `ModuleNotFoundError` names no extra)."""

from __future__ import annotations

import importlib.util

__all__ = [
    "DASHBOARD_MODULES",
    "EXTRA_HINT",
    "OTEL_HINT",
    "POSTGRES_HINT",
    "PROMETHEUS_HINT",
    "missing_modules",
    "require_otel",
    "require_postgres_driver",
    "require_prometheus",
]

EXTRA_HINT = "pip install 'durably[dashboard]'"
DASHBOARD_MODULES = ("starlette", "uvicorn", "prometheus_client")
POSTGRES_HINT = "pip install 'durably[postgres]'"
PROMETHEUS_HINT = "pip install 'durably[prometheus]'"
OTEL_HINT = "pip install 'durably[otel]'"


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


def require_postgres_driver(what: str) -> None:
    """Raise `ModuleNotFoundError` naming the `postgres` extra when asyncpg is missing.

    A subclass of the error the import itself would raise, so code that catches
    ImportError keeps working; only the message changes, to say what to install."""
    if missing_modules(("asyncpg",)):
        raise ModuleNotFoundError(
            f"{what} needs asyncpg (the `postgres` extra): {POSTGRES_HINT}", name="asyncpg"
        )


def require_prometheus(what: str) -> None:
    """Raise `ModuleNotFoundError` naming the `prometheus` extra when prometheus_client is
    missing (a subclass of what the import would raise, with a message saying what to
    install)."""
    if missing_modules(("prometheus_client",)):
        raise ModuleNotFoundError(
            f"{what} needs prometheus_client (the `prometheus` extra): {PROMETHEUS_HINT}",
            name="prometheus_client",
        )


def require_otel(what: str) -> None:
    """Raise `ModuleNotFoundError` naming the `otel` extra when the OpenTelemetry API or SDK
    is missing (a subclass of what the import would raise, saying what to install)."""
    missing = missing_modules(("opentelemetry.trace", "opentelemetry.sdk"))
    if missing:
        raise ModuleNotFoundError(
            f"{what} needs OpenTelemetry (the `otel` extra): {OTEL_HINT}", name=missing[0]
        )
