"""Helpers of the store tests: the state-store suite's own (`durably.testing.conformance`),
and the first-party stores' round-trip counter.

The suite's cases live in the package; `test_state_store_suite.py` runs them on memory,
SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Protocol

from durably import StateStore
from durably.testing.conformance.state_store.support import (
    T0,
    at,
    attr,
    id_set,
    ids,
    make_cp,
    make_run,
    pickup,
    seed_attrs,
    take_buffered,
    take_waiter,
    try_lock,
)

__all__ = [
    "T0",
    "ConformantStore",
    "at",
    "attr",
    "id_set",
    "ids",
    "make_cp",
    "make_run",
    "pickup",
    "seed_attrs",
    "take_buffered",
    "take_waiter",
    "try_lock",
]


class ConformantStore(StateStore, Protocol):
    """A first-party store: it counts the round trips it has served."""

    statement_count: int
