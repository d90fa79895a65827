"""The durably console: a Starlette ASGI app to mount in a host app, or to serve alone with
`durably dashboard APP_OR_STORE_URL --port N`.

Needs the `dashboard` extra: `pip install 'durably[dashboard]'`.
"""

from __future__ import annotations

from durably._extras import EXTRA_HINT, missing_modules

_missing = missing_modules(("starlette", "prometheus_client"))
if _missing:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        f"durably.dashboard needs {', '.join(_missing)} (the `dashboard` extra): {EXTRA_HINT}"
    )

from durably.dashboard.app import create_app, normalize_path  # noqa: E402
from durably.dashboard.auth import DashboardAuth, DashboardConfigError  # noqa: E402

__all__ = ["EXTRA_HINT", "DashboardAuth", "DashboardConfigError", "create_app", "normalize_path"]
