"""Buffered signals of the in-memory reference store, with their expiry and caps.

The contract is written on `durably._store.protocol.StateStore`. No method body suspends
(the only `await`, of `save_checkpoint`, never yields), so the cap check and the insert of
`buffer_signal_bounded`, and a take together with the checkpoint it becomes, are each one
atomic step here: the caps are exact. Times are epoch ms of the store's clock.

A part object of `InMemoryStateStore` (which forwards the contract methods to it). The
buffered signal rows are its own state; it is given the store's `MemoryTables` (the
checkpoints and waiters a take consults, the buffered events, the clock, the call counter)
and the store's own `save_checkpoint` and `buffer_event`, so a checkpoint or an event it
writes is stored and counted exactly as the store's own writes are.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from durably._core import jsonutil
from durably._core.buffered_signals import BufferedSignalInfo, BufferScope
from durably._core.models import (
    BufferedEvent,
    BufferedSignal,
    JSONValue,
    StepCheckpoint,
    delivered_signal,
    utc_from_ms,
)
from durably._core.tokens import token_namespace
from durably._core.triggers import ACCUMULATOR_PREFIX
from durably._store.memory_tables import MemoryTables


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
    """Buffered signals (its own rows) and the bounded buffered events of `tables`."""

    def __init__(
        self,
        tables: MemoryTables,
        *,
        save_checkpoint: Callable[[StepCheckpoint], Awaitable[None]],
        buffer_event: Callable[[BufferedEvent], Awaitable[None]],
    ) -> None:
        self._tables = tables
        self._save_checkpoint = save_checkpoint
        self._buffer_event = buffer_event
        # token -> FIFO of rows; namespace -> tokens with rows (for the namespace cap)
        self._signals: dict[str, deque[_Buffered]] = {}
        self._signal_namespaces: dict[str, set[str]] = {}
        self._signal_ids = itertools.count(1)

    def _now_ms(self) -> int:
        return self._tables.now_ms()

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
        self._tables.tick()
        self._append_signal(token, payload, self._now_ms(), None)

    async def buffer_signal_bounded(
        self, token: str, payload: JSONValue, *, ttl_ms: int, per_token: int, per_namespace: int
    ) -> BufferScope | None:
        self._tables.tick()
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

    def _oldest_live(self, token: str) -> int | None:
        """The index of the token's OLDEST unexpired row (expired rows are skipped and left
        for a purge)."""
        now = self._now_ms()
        for index, row in enumerate(self._signals.get(token, ())):
            if row.live(now):
                return index
        return None

    def _remove_signal(self, token: str, index: int) -> JSONValue:
        queue = self._signals[token]
        payload = queue[index].payload
        del queue[index]
        self._drop_token_if_empty(token)
        return payload

    async def peek_buffered_signals(self, token: str, limit: int) -> list[BufferedSignal]:
        self._tables.tick()
        now = self._now_ms()
        live = [row for row in self._signals.get(token, ()) if row.live(now)]
        return [
            BufferedSignal(payload=jsonutil.loads(jsonutil.dumps(row.payload)))
            for row in live[: max(limit, 0)]
        ]

    async def take_buffered_signal_into(
        self, token: str, cp: StepCheckpoint, *, waiting: bool = False
    ) -> BufferedSignal | None:
        """The oldest live row of `token` becomes `cp`'s output, in one step (nothing here
        suspends: the awaited `save_checkpoint` never yields). The checkpoint is written
        first because it is the part that can refuse (a payload that is not strict JSON)."""
        self._tables.tick()
        held = self._tables.waiters.get(token)
        ours = held is not None and (held.run_id, held.seq) == (cp.run_id, cp.seq)
        if waiting and not ours:
            return None  # a sender took our waiter: its delivery is on the way
        current = self._tables.checkpoints.get(cp.run_id, {}).get(cp.seq)
        if current is not None and current.status == "completed":
            return None
        index = self._oldest_live(token)
        if index is None:
            return None
        payload = self._signals[token][index].payload
        await self._save_checkpoint(dataclasses.replace(cp, output=payload))
        self._remove_signal(token, index)
        if ours:
            del self._tables.waiters[token]
        return BufferedSignal(payload=payload)

    async def deliver_buffered_signal(self, token: str, at: datetime) -> StepCheckpoint | None:
        """The token's waiter and its oldest live row, taken together into the waiter's
        checkpoint (one step, as above)."""
        self._tables.tick()
        waiter = self._tables.waiters.get(token)
        index = self._oldest_live(token)
        if waiter is None or index is None:
            return None
        cp = delivered_signal(waiter, self._signals[token][index].payload, at)
        await self._save_checkpoint(cp)
        self._remove_signal(token, index)
        del self._tables.waiters[token]
        return cp

    async def buffer_event_bounded(
        self, event: BufferedEvent, *, ttl_ms: int, per_name: int, per_namespace: int
    ) -> BufferScope | None:
        """The caps checked and the event stored in one step (nothing here suspends before
        the insert): exact. Live: published less than `ttl_ms` before this event."""
        self._tables.tick()
        since = event.published_at - ttl_ms
        same = in_ns = 0
        for other in self._tables.events.values():
            if other.published_at <= since or other.name.startswith(ACCUMULATOR_PREFIX):
                continue
            in_ns += 1
            same += other.name == event.name
        if same >= per_name:
            return "token"
        if in_ns >= per_namespace:
            return "namespace"
        await self._buffer_event(event)  # never suspends: still one atomic step
        return None

    async def purge_expired_events(self, published_before_ms: int) -> int:
        self._tables.tick()
        gone = [
            e.id
            for e in self._tables.events.values()
            if e.published_at <= published_before_ms and not e.name.startswith(ACCUMULATOR_PREFIX)
        ]
        for event_id in gone:
            del self._tables.events[event_id]
        return len(gone)

    async def take_buffered_event_into(self, event_id: str, token: str, cp: StepCheckpoint) -> bool:
        """The buffered event becomes `cp`'s output and the wait's waiter row goes, in one
        step (as above)."""
        self._tables.tick()
        held = self._tables.waiters.get(token)
        if held is None or (held.run_id, held.seq) != (cp.run_id, cp.seq):
            return False  # a publisher took our waiter: its delivery is on the way
        current = self._tables.checkpoints.get(cp.run_id, {}).get(cp.seq)
        event = self._tables.events.get(event_id)
        if event is None or (current is not None and current.status == "completed"):
            return False
        await self._save_checkpoint(dataclasses.replace(cp, output=event.payload))
        del self._tables.events[event_id]
        del self._tables.waiters[token]
        return True

    async def deliver_buffered_event(
        self, event_id: str, token: str, at: datetime
    ) -> StepCheckpoint | None:
        """The token's waiter and the buffered event, taken together into the waiter's
        checkpoint (one step, as above)."""
        self._tables.tick()
        waiter = self._tables.waiters.get(token)
        event = self._tables.events.get(event_id)
        if waiter is None or event is None:
            return None
        cp = delivered_signal(waiter, event.payload, at)
        await self._save_checkpoint(cp)
        del self._tables.events[event_id]
        del self._tables.waiters[token]
        return cp

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
        self._tables.tick()
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
        self._tables.tick()
        return len(self._matching(prefix))

    async def purge_buffered_signals(
        self, *, token: str | None = None, prefix: str | None = None, expired_only: bool = False
    ) -> int:
        self._tables.tick()
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
