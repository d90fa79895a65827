"""Bounds on what a signal or an event may carry and leave behind, on the memory store, a
SQLite file and PostgreSQL.

- `max_payload_bytes` bounds the payload of `signal`, `signal_with_start` and
  `publish_event`, on `Engine` and on `Client` alike: past it, `PayloadTooLargeError` and
  nothing is stored (no run, no buffered row).
- An event nobody takes is buffered like a signal nobody waits for: it expires after
  `signal_buffer_ttl` (never delivered after that, deleted by the sweep), and past
  `signal_buffer_per_token` events of one name or `signal_buffer_per_namespace` events in
  all it is refused with `SignalBufferFullError`, nothing stored. The engine's own
  accumulator events are never refused, never expire.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import (
    Client,
    Engine,
    InMemoryStateStore,
    PayloadTooLargeError,
    SignalBufferFullError,
    WorkflowCtx,
)
from durably._core.models import BufferedEvent
from durably._engine.control import signals
from tests.pg_support import fresh_schema, schema_url

FAST: dict[str, Any] = {"timer_poll_ms": 20, "lease_ms": 2000, "drain_timeout_ms": 2000}
LIMIT = 2048
BIG = "x" * (LIMIT + 1)  # its JSON is LIMIT + 3 bytes


class Stores:
    def __init__(self, kind: str, tmp_path: Path, schema: str | None = None) -> None:
        self.kind = kind
        self._tmp = tmp_path
        self._schema = schema
        self._memory = InMemoryStateStore() if kind == "memory" else None

    def target(self) -> Any:
        if self._memory is not None:
            return self._memory
        if self._schema is not None:
            return schema_url(self._schema)
        return f"sqlite:///{self._tmp / 'signals.db'}"

    def engine(self, **options: Any) -> Engine:
        return Engine(store=self.target(), **{**FAST, **options})


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    if request.param != "postgres":
        yield Stores(request.param, tmp_path)
        return
    async with fresh_schema(create=False) as schema:
        yield Stores("postgres", tmp_path, schema)


@pytest.fixture
def uid() -> str:
    return f"s{uuid.uuid4().hex[:10]}"


async def test_engine_refuses_signal_and_event_payloads_over_the_limit(
    stores: Stores, uid: str
) -> None:
    async with stores.engine(max_payload_bytes=LIMIT) as engine:
        with pytest.raises(PayloadTooLargeError, match=r"over the limit of 2048 bytes"):
            await engine.signal(f"{uid}-tok", BIG)
        with pytest.raises(PayloadTooLargeError):
            await engine.signal(f"{uid}-tok", {"nested": [BIG]}, buffer=False)
        with pytest.raises(PayloadTooLargeError, match="event payload"):
            await engine.publish_event(f"{uid}.evt", {"blob": BIG})
        assert await engine.count_buffered_signals() == 0
        assert await engine.store.list_buffered_events(f"{uid}.evt", 10) == []
        # At the limit is fine (the JSON of a string is its text and two quotes).
        await engine.signal(f"{uid}-tok", "y" * (LIMIT - 2))
        assert await engine.count_buffered_signals() == 1


async def test_client_takes_max_payload_bytes_and_refuses_before_starting(
    stores: Stores, uid: str
) -> None:
    async with Client(stores.target(), max_payload_bytes=LIMIT) as client:
        with pytest.raises(PayloadTooLargeError):
            await client.signal(f"{uid}-tok", BIG)
        with pytest.raises(PayloadTooLargeError):
            await client.signal_with_start(
                f"{uid}.wf", {"a": 1}, run_id=f"{uid}-r", token=f"{uid}-tok", payload=BIG
            )
        assert await client.get_run(f"{uid}-r") is None  # nothing started
        assert await client.count_buffered_signals() == 0
    # The default is 4 MiB: a client without the option refuses past it too.
    async with Client(stores.target()) as client:
        with pytest.raises(PayloadTooLargeError, match="4194304 bytes"):
            await client.signal(f"{uid}-tok", "z" * (4 * 1024 * 1024))


async def test_buffered_events_are_capped_per_name_and_in_all(stores: Stores, uid: str) -> None:
    async with stores.engine(signal_buffer_per_token=2, signal_buffer_per_namespace=3) as engine:
        assert await engine.publish_event(f"{uid}.a", 1) == 0
        assert await engine.publish_event(f"{uid}.a", 2) == 0
        with pytest.raises(SignalBufferFullError) as full:
            await engine.publish_event(f"{uid}.a", 3)
        assert (full.value.scope, full.value.cap) == ("token", 2)
        assert full.value.option == "signal_buffer_per_token"
        assert str(full.value).startswith(
            f"event '{uid}.a' refused: 2 events are already buffered with this name"
        )
        assert await engine.publish_event(f"{uid}.b", 1) == 0
        with pytest.raises(SignalBufferFullError) as full:
            await engine.publish_event(f"{uid}.c", 1)  # a made-up name: the total is capped
        assert (full.value.scope, full.value.namespace, full.value.cap) == ("namespace", "event", 3)
        store = engine.store
        # Both kept (two events published in one millisecond may list in either order).
        kept = [e.payload for e in await store.list_buffered_events(f"{uid}.a", 10)]
        assert sorted(kept) == [1, 2]
        assert await store.list_buffered_events(f"{uid}.c", 10) == []
        # The engine's own accumulator events are never refused.
        for n in range(5):
            acc = BufferedEvent(
                f"{uid}-acc-{n}", f"__evtacc__:default:{uid}", n, int(time.time() * 1000)
            )
            await store.buffer_event(acc)
        assert len(await store.list_buffered_events(f"__evtacc__:default:{uid}", 10)) == 5


async def test_expired_buffered_events_are_not_delivered_and_are_swept(
    stores: Stores, uid: str
) -> None:
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        return await ctx.wait_for_event(f"{uid}.e", timeout=0.5)

    async with stores.engine(workflows=[wf], signal_buffer_ttl=0.3) as engine:
        store = engine.store
        now = int(time.time() * 1000)
        acc_name = f"__evtacc__:default:{uid}"
        await store.buffer_event(BufferedEvent(f"{uid}-acc", acc_name, "kept", now - 10_000_000))
        assert await engine.publish_event(f"{uid}.e", "stale") == 0
        published = time.time()
        # The TTL is time itself: wait until the event is past it.
        await asyncio.sleep(max(0.0, published + 0.35 - time.time()))
        with pytest.raises(durably.RunFailedError, match="timed out"):
            await engine.execute(wf, run_id=f"{uid}-r", timeout=20)
        policy = engine.signal_buffer
        policy.next_sweep_ms = 0
        assert (
            await signals.sweep_expired_signals(store, policy, lambda: int(time.time() * 1000)) == 1
        )
        assert await store.list_buffered_events(f"{uid}.e", 10) == []
        assert [e.payload for e in await store.list_buffered_events(acc_name, 10)] == ["kept"]
        # A live one is delivered as before.
        assert await engine.publish_event(f"{uid}.e", "fresh") == 0
        assert await engine.execute(wf, run_id=f"{uid}-r2", timeout=20) == "fresh"
