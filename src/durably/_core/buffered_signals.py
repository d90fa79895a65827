"""What operators see of the signal buffer, and the bounds the engine puts on it.

A signal sent before any run waits on its token is buffered, so the wait that registers a
moment later still gets it (README's first example relies on this). Buffered signals that
came from outside the engine are bounded: each expires after a TTL (an expired one is never
delivered and is purged), and a cap per token and per token namespace refuses new ones
instead of growing without limit. The engine's own completion records (a child's completion
waiting for its parent to join) carry no expiry: losing one would leave a parent waiting
forever.

Listing a buffered signal never returns its payload, only its size, so an operator's view
cannot leak the data a caller sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from durably._core.jsonshape import JsonObject, json_field

BufferScope = Literal["token", "namespace"]
"""Which cap refused a signal: the per-token one or the per-namespace one."""

# Engine defaults (the `Engine(signal_buffer_*=…)` options).
DEFAULT_SIGNAL_BUFFER_TTL_MS = 24 * 3_600_000
DEFAULT_SIGNAL_BUFFER_PER_TOKEN = 100
DEFAULT_SIGNAL_BUFFER_PER_NAMESPACE = 10_000

# Paging of `list_buffered_signals` (as for the other operator listings).
DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 1_000


@dataclass(frozen=True, slots=True)
class BufferedSignalInfo(JsonObject, dates="iso_ms"):
    """One buffered signal as operators see it — never its payload. Dates are written in
    JavaScript's `toISOString` form (UTC, milliseconds), like the other operator listings.

    - `token`: the token it waits to be taken on;
    - `size_bytes`: bytes of its stored JSON payload (0 for a null payload; with a payload
      codec, the size of the encoded form at rest);
    - `buffered_at`: when it was buffered (None only for rows another writer left without);
    - `expires_at`: when it expires; None for the engine's own completion records, which
      never expire and are never purged.
    """

    token: str
    size_bytes: int = field(metadata=json_field(read_default=0))
    buffered_at: datetime | None
    expires_at: datetime | None

    def is_expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now


__all__ = [
    "DEFAULT_LIST_LIMIT",
    "DEFAULT_SIGNAL_BUFFER_PER_NAMESPACE",
    "DEFAULT_SIGNAL_BUFFER_PER_TOKEN",
    "DEFAULT_SIGNAL_BUFFER_TTL_MS",
    "MAX_LIST_LIMIT",
    "BufferScope",
    "BufferedSignalInfo",
]
