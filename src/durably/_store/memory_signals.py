"""Buffered signals of the in-memory reference store, with their expiry and caps.

The contract is written on `durably._store.protocol.StateStore`. Every method body runs
without an `await`, so the cap check and the insert of `buffer_signal_bounded` are one atomic
step here: the caps are exact. Times are epoch ms of the store's clock.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from durably._core import jsonutil
from durably._core.buffered_signals import BufferedSignalInfo, BufferScope
from durably._core.models import BufferedSignal, JSONValue, ms_from_utc, utc_from_ms
from durably._core.tokens import token_namespace


@dataclass(slots=True)
class _Buffered:
    id: int
    token: str
    payload: JSONValue  # the strict-JSON round trip, as a SQL store would read it back
    size_bytes: int
    buffered_at: int
    expires_at: int | None  # None: the engine's own completion record (never expires)

    def live(self, now: int) -> bool:
        return self.expires_at is None or self.expires_at > now


def _stored(payload: JSONValue) -> tuple[JSONValue, int]:
    """(the JSON round trip of `payload`, bytes of its JSON text); raises
    `SerializationError` before anything is written, like the other payload writes."""
    if payload is None:
        return None, 0
    text = jsonutil.dumps(payload)
    return jsonutil.loads(text), len(text.encode("utf-8"))


class MemorySignalBuffer:
    """Mixed into `InMemoryStateStore` (which provides what is declared here)."""

    if TYPE_CHECKING:
        _clock: Callable[[], datetime]

        def _tick(self) -> None: ...

    def _init_signal_buffer(self) -> None:
        # token -> FIFO of rows; namespace -> tokens with rows (for the namespace cap)
        self._signals: dict[str, deque[_Buffered]] = {}
        self._signal_namespaces: dict[str, set[str]] = {}
        self._signal_ids = itertools.count(1)

    def _now_ms(self) -> int:
        return ms_from_utc(self._clock())

    def _append_signal(
        self, token: str, payload: JSONValue, now: int, expires_at: int | None
    ) -> None:
        stored, size = _stored(payload)
        row = _Buffered(next(self._signal_ids), token, stored, size, now, expires_at)
        self._signals.setdefault(token, deque()).append(row)
        self._signal_namespaces.setdefault(token_namespace(token), set()).add(token)

    def _drop_token_if_empty(self, token: str) -> None:
        if self._signals.get(token):
            return
        self._signals.pop(token, None)
        namespace = token_namespace(token)
        tokens = self._signal_namespaces.get(namespace)
        if tokens is not None:
            tokens.discard(token)
            if not tokens:
                del self._signal_namespaces[namespace]

    async def buffer_signal(self, token: str, payload: JSONValue) -> None:
        self._tick()
        self._append_signal(token, payload, self._now_ms(), None)

    async def buffer_signal_bounded(
        self, token: str, payload: JSONValue, *, ttl_ms: int, per_token: int, per_namespace: int
    ) -> BufferScope | None:
        self._tick()
        now = self._now_ms()
        if sum(1 for row in self._signals.get(token, ()) if row.live(now)) >= per_token:
            return "token"
        in_namespace = 0
        for other in self._signal_namespaces.get(token_namespace(token), ()):
            in_namespace += sum(1 for row in self._signals.get(other, ()) if row.live(now))
        if in_namespace >= per_namespace:
            return "namespace"
        self._append_signal(token, payload, now, now + ttl_ms)
        return None

    async def take_buffered_signal(self, token: str) -> BufferedSignal | None:
        """Removes and returns the OLDEST unexpired payload for `token`; a NULL payload is
        still a hit; an expired row is skipped (and left for a purge)."""
        self._tick()
        queue = self._signals.get(token)
        if not queue:
            return None
        now = self._now_ms()
        for index, row in enumerate(queue):
            if row.live(now):
                del queue[index]
                self._drop_token_if_empty(token)
                return BufferedSignal(payload=row.payload)
        return None

    def _matching(self, prefix: str | None) -> list[_Buffered]:
        rows = [
            row
            for token, queue in self._signals.items()
            if prefix is None or token.startswith(prefix)
            for row in queue
        ]
        rows.sort(key=lambda row: row.id)
        return rows

    async def list_buffered_signals(
        self, *, prefix: str | None, limit: int, offset: int
    ) -> list[BufferedSignalInfo]:
        self._tick()
        rows = self._matching(prefix)[max(offset, 0) : max(offset, 0) + max(limit, 0)]
        return [
            BufferedSignalInfo(
                token=row.token,
                size_bytes=row.size_bytes,
                buffered_at=utc_from_ms(row.buffered_at),
                expires_at=utc_from_ms(row.expires_at) if row.expires_at is not None else None,
            )
            for row in rows
        ]

    async def count_buffered_signals(self, *, prefix: str | None = None) -> int:
        self._tick()
        return len(self._matching(prefix))

    async def purge_buffered_signals(
        self, *, token: str | None = None, prefix: str | None = None, expired_only: bool = False
    ) -> int:
        self._tick()
        now = self._now_ms()
        if token is not None:
            tokens = [token] if token in self._signals else []
        else:
            tokens = [t for t in self._signals if prefix is None or t.startswith(prefix)]
        removed = 0
        for name in tokens:
            queue = self._signals[name]
            keep = deque(
                row
                for row in queue
                if row.expires_at is None or (expired_only and row.expires_at > now)
            )
            removed += len(queue) - len(keep)
            self._signals[name] = keep
            self._drop_token_if_empty(name)
        return removed


__all__ = ["MemorySignalBuffer"]
