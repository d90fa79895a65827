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

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

BufferScope = Literal["token", "namespace"]
"""Which cap refused a signal: the per-token one or the per-namespace one."""

# Engine defaults (the `Engine(signal_buffer_*=…)` options).
DEFAULT_SIGNAL_BUFFER_TTL_MS = 24 * 3_600_000
DEFAULT_SIGNAL_BUFFER_PER_TOKEN = 100
DEFAULT_SIGNAL_BUFFER_PER_NAMESPACE = 10_000

# Paging of `list_buffered_signals` (as for the other operator listings).
DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 1_000


def _iso(value: datetime) -> str:
    """UTC, millisecond precision, `Z` (the form every other data object writes)."""
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    value = value.astimezone(UTC)
    return f"{value:%Y-%m-%dT%H:%M:%S}.{value.microsecond // 1000:03d}Z"


def _parse(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    text = str(value)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class BufferedSignalInfo:
    """One buffered signal as operators see it — never its payload.

    - `token`: the token it waits to be taken on;
    - `size_bytes`: bytes of its stored JSON payload (0 for a null payload; with a payload
      codec, the size of the encoded form at rest);
    - `buffered_at`: when it was buffered (None only for rows another writer left without);
    - `expires_at`: when it expires; None for the engine's own completion records, which
      never expire and are never purged.
    """

    token: str
    size_bytes: int
    buffered_at: datetime | None
    expires_at: datetime | None

    def is_expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"token": self.token, "sizeBytes": self.size_bytes}
        if self.buffered_at is not None:
            out["bufferedAt"] = _iso(self.buffered_at)
        if self.expires_at is not None:
            out["expiresAt"] = _iso(self.expires_at)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BufferedSignalInfo:
        return cls(
            token=str(data["token"]),
            size_bytes=int(data.get("sizeBytes", 0)),
            buffered_at=_parse(data.get("bufferedAt")),
            expires_at=_parse(data.get("expiresAt")),
        )


__all__ = [
    "DEFAULT_LIST_LIMIT",
    "DEFAULT_SIGNAL_BUFFER_PER_NAMESPACE",
    "DEFAULT_SIGNAL_BUFFER_PER_TOKEN",
    "DEFAULT_SIGNAL_BUFFER_TTL_MS",
    "MAX_LIST_LIMIT",
    "BufferScope",
    "BufferedSignalInfo",
]
