"""Opening the store an `Engine` was given (a URL, an SQLAlchemy engine, or a store)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from durably._core.admission import AdmissionBackend
from durably._store.codec import CodecStateStore
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


def fleet_admission(
    store: StateStore, *, owner: str, clock: Callable[[], int]
) -> AdmissionBackend | None:
    """The admission backend the engines sharing `store` share (PostgreSQL), or None. The
    SQL store is loaded only for a store of its own, as above."""
    inner = store.inner if isinstance(store, CodecStateStore) else store
    if not type(inner).__module__.startswith("durably._store.sql"):
        return None
    from durably._store.sql import store_admission

    return store_admission(inner, owner=owner, clock=clock)
