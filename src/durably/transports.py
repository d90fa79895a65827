"""The transports an `Engine` can carry steps (and workflow turns) over.

    from durably.transports import RedisTransport, SqlTransport

- `InMemoryTransport` — the reference transport, its broker in this process;
- `RedisTransport` — BullMQ queues on Redis, wire-compatible with durable-worker
  (`pip install 'durably[redis]'`);
- `SqlTransport` — task and result tables in PostgreSQL (`pip install 'durably[postgres]'`);
- `TransportPool` — several transports in order, with pinned ids and fail-over.

A URL passed as `Engine(transport="redis://…")` builds one with default settings; build the
object for anything else (key prefix, transport namespace, polling).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from durably._transport.memory import InMemoryBroker, InMemoryTransport
from durably._transport.pool import TransportPool
from durably._transport.protocol import Transport, TransportUnavailableError

if TYPE_CHECKING:
    from durably._transport.redis import RedisTransport
    from durably._transport.sql import SqlTransport

__all__ = [
    "InMemoryBroker",
    "InMemoryTransport",
    "RedisTransport",
    "SqlTransport",
    "Transport",
    "TransportPool",
    "TransportUnavailableError",
]

# The broker transports are imported on first use: each needs an optional extra, and a
# process that never uses that broker must not need its packages.
_EXTRAS = {"RedisTransport": ("redis", "redis"), "SqlTransport": ("sql", "postgres")}


def __getattr__(name: str) -> Any:
    if name not in _EXTRAS:
        raise AttributeError(f"module 'durably.transports' has no attribute {name!r}")
    module, extra = _EXTRAS[name]
    try:
        loaded = importlib.import_module(f"durably._transport.{module}")
    except ImportError as exc:
        raise ImportError(
            f"durably.transports.{name} needs an optional extra: "
            f"pip install 'durably[{extra}]' ({exc})"
        ) from None
    return getattr(loaded, name)
