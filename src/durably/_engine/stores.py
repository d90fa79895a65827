"""Opening the store an `Engine` was given (a URL, an SQLAlchemy engine, or a store)."""

from __future__ import annotations

import os
from typing import Any

from durably._store.protocol import StateStore, require_store


def open_store(store: Any) -> tuple[StateStore, bool]:
    if store is None:
        store = os.environ.get("DURABLY_STORE") or "sqlite:///durably.db"
    if isinstance(store, str):
        if store in ("memory", "memory://"):
            from durably._store.memory import InMemoryStateStore

            return InMemoryStateStore(), True
        from durably._store.sql import SqlStateStore

        return SqlStateStore.from_url(store), True
    try:
        from sqlalchemy.ext.asyncio import AsyncEngine
    except ImportError:  # pragma: no cover - sqlalchemy is a core dependency
        AsyncEngine = None  # type: ignore[assignment,misc]
    if AsyncEngine is not None and isinstance(store, AsyncEngine):
        from durably._store.sql import SqlStateStore

        return SqlStateStore(store), False
    return require_store(store), False  # a partial store fails here, naming what it lacks
