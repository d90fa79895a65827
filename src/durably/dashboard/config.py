"""The console's configuration error, shared by the modules that validate options."""

from __future__ import annotations

__all__ = ["DashboardConfigError"]


class DashboardConfigError(ValueError):
    """The dashboard's configuration is invalid (raised when the app is built)."""
