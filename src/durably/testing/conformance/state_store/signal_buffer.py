"""State-store cases: the bounded signal buffer — per-token and per-namespace caps, expiry
by the store's clock, listing, counting and purging.

A signal sent before its run waits is buffered; `buffer_signal_bounded` keeps a row until it
expires (`ttl_ms`, judged by the store's clock, which the cases move) and refuses a row over
a cap, naming the cap. The engine's own records (`buffer_signal`) never expire.
"""

from __future__ import annotations

import json
from datetime import timedelta

from durably import StateStore
from durably._core.buffered_signals import BufferScope
from durably._core.models import BufferedSignal
from durably._store.protocol import Payload

from .base import StoreCases
from .support import StoreClock, take_buffered

HOUR = 3_600_000
BIG = 1_000_000  # a cap nobody reaches in these cases


async def bounded(
    store: StateStore,
    token: str,
    payload: Payload = 1,
    *,
    ttl_ms: int = HOUR,
    per_token: int = BIG,
    per_namespace: int = BIG,
) -> BufferScope | None:
    return await store.buffer_signal_bounded(
        token, payload, ttl_ms=ttl_ms, per_token=per_token, per_namespace=per_namespace
    )


async def tokens(store: StateStore, prefix: str | None = None) -> list[str]:
    rows = await store.list_buffered_signals(prefix=prefix, limit=1000, offset=0)
    return [row.token for row in rows]


class SignalBufferCases(StoreCases):
    """The bounded signal buffer cases of the state-store suite."""

    async def test_bounded_buffer_is_fifo_and_round_trips_payloads(self, store: StateStore) -> None:
        for payload in ({"n": 1}, None, [3, "é"], 2.5):
            assert await bounded(store, "tok", payload) is None
        assert await take_buffered(store, "tok") == BufferedSignal({"n": 1})
        hit = await take_buffered(store, "tok")
        assert hit is not None and hit.payload is None  # a null payload is still a hit
        assert await take_buffered(store, "tok") == BufferedSignal([3, "é"])
        assert await take_buffered(store, "tok") == BufferedSignal(2.5)
        assert await take_buffered(store, "tok") is None

    async def test_per_token_cap_refuses_and_stores_nothing(self, store: StateStore) -> None:
        assert await bounded(store, "ns:a", "a1", per_token=2) is None
        assert await bounded(store, "ns:a", "a2", per_token=2) is None
        assert await bounded(store, "ns:a", "REFUSED", per_token=2) == "token"
        assert await tokens(store) == ["ns:a", "ns:a"]
        assert await bounded(store, "ns:b", "b1", per_token=2) is None  # another token: room
        assert await take_buffered(store, "ns:a") == BufferedSignal("a1")
        assert await take_buffered(store, "ns:a") == BufferedSignal("a2")
        assert await take_buffered(store, "ns:a") is None
        assert await bounded(store, "ns:a", "a3", per_token=2) is None  # taken rows free room

    async def test_per_namespace_cap_counts_the_text_before_the_first_colon(
        self, store: StateStore
    ) -> None:
        # "acme", "acme:1" and "acme:2:x" share the namespace "acme"; "acme-2" and "acmex:1"
        # are namespaces of their own.
        for token in ("acme", "acme:1", "acme:2:x"):
            assert await bounded(store, token, per_namespace=3) is None
        assert await bounded(store, "acme:3", "REFUSED", per_namespace=3) == "namespace"
        assert await bounded(store, "acme", "REFUSED", per_namespace=3) == "namespace"
        assert await bounded(store, "acme-2", per_namespace=3) is None
        assert await bounded(store, "acmex:1", per_namespace=3) is None
        assert await store.count_buffered_signals() == 5
        assert await store.count_buffered_signals(prefix="acme:3") == 0

    async def test_the_token_cap_is_reported_before_the_namespace_cap(
        self, store: StateStore
    ) -> None:
        assert await bounded(store, "x:1", per_token=1, per_namespace=1) is None
        assert await bounded(store, "x:1", per_token=1, per_namespace=1) == "token"
        assert await bounded(store, "x:2", per_token=1, per_namespace=1) == "namespace"

    async def test_engine_records_are_not_capped_but_count_in_their_namespace(
        self, store: StateStore
    ) -> None:
        for _ in range(3):
            await store.buffer_signal("child:c1", {"ok": True})  # the engine's own
        assert await bounded(store, "child:c2", per_namespace=3) == "namespace"
        assert await store.count_buffered_signals(prefix="child:") == 3

    async def test_expired_rows_are_never_taken_nor_counted_and_purge_removes_them(
        self, store: StateStore, store_clock: StoreClock
    ) -> None:
        assert await bounded(store, "t", "old", ttl_ms=HOUR, per_token=1) is None
        await store.buffer_signal("child:k", "engine record")  # never expires
        [row] = await store.list_buffered_signals(prefix="t", limit=10, offset=0)
        assert row.buffered_at is not None and row.expires_at is not None
        assert row.expires_at - row.buffered_at == timedelta(hours=1)
        assert abs(row.buffered_at - store_clock()) < timedelta(seconds=5)

        store_clock.advance(hours=1)  # expires_at == now: expired
        assert await take_buffered(store, "t") is None
        assert await bounded(store, "t", "new", ttl_ms=HOUR, per_token=1) is None  # cap frees
        assert await tokens(store) == ["t", "child:k", "t"]  # the expired row is still listed
        listed = await store.list_buffered_signals(prefix="t", limit=10, offset=0)
        # Stored times are whole milliseconds (rounded): read "now" one millisecond on.
        now = store_clock() + timedelta(milliseconds=1)
        assert [r.is_expired(now) for r in listed] == [True, False]

        assert await store.purge_buffered_signals(expired_only=True) == 1
        assert await tokens(store) == ["child:k", "t"]
        assert await take_buffered(store, "t") == BufferedSignal("new")
        store_clock.advance(days=400)
        assert await take_buffered(store, "child:k") == BufferedSignal("engine record")

    async def test_listing_pages_oldest_first_by_exact_prefix_without_payloads(
        self, store: StateStore
    ) -> None:
        payloads = {"ord:1": {"card": "4242-secret"}, "ord:2": None, "Ord:3": "é", "ord_4": [1]}
        for token, payload in payloads.items():
            assert await bounded(store, token, payload) is None
        await store.buffer_signal("child:c", True)

        rows = await store.list_buffered_signals(prefix=None, limit=1000, offset=0)
        assert [r.token for r in rows] == ["ord:1", "ord:2", "Ord:3", "ord_4", "child:c"]
        assert [r.expires_at is None for r in rows] == [False, False, False, False, True]
        assert all(r.buffered_at is not None for r in rows)
        assert all("secret" not in json.dumps(r.to_json()) for r in rows)

        assert await tokens(store, "ord:") == ["ord:1", "ord:2"]  # exact, case-sensitive
        assert await tokens(store, "ord_") == ["ord_4"]  # `_` is no wildcard
        assert await tokens(store, "%") == []
        page = await store.list_buffered_signals(prefix=None, limit=2, offset=1)
        assert [r.token for r in page] == ["ord:2", "Ord:3"]
        assert await store.list_buffered_signals(prefix=None, limit=5, offset=10) == []
        assert await store.count_buffered_signals() == 5
        assert await store.count_buffered_signals(prefix="ord") == 3
        assert await store.count_buffered_signals(prefix="nothing") == 0

    async def test_purge_by_token_prefix_and_everything_keeps_engine_records(
        self, store: StateStore
    ) -> None:
        for token in ("a:1", "a:1", "a:10", "a:2", "b:1"):
            await bounded(store, token)
        await store.buffer_signal("child:k", 1)
        await store.buffer_signal("a:1", "engine-owned on a plain token")

        assert await store.purge_buffered_signals(token="a:1") == 2  # exactly that token
        assert await tokens(store, "a:") == ["a:10", "a:2", "a:1"]
        assert await store.purge_buffered_signals(prefix="a:1") == 1  # a:10
        assert await store.purge_buffered_signals(prefix="child:") == 0
        assert await store.purge_buffered_signals(expired_only=True) == 0
        assert await store.purge_buffered_signals() == 2  # a:2, b:1
        assert await tokens(store) == ["child:k", "a:1"]
        assert await store.purge_buffered_signals(token="nobody") == 0

    async def test_purge_expired_only_within_a_prefix(
        self, store: StateStore, store_clock: StoreClock
    ) -> None:
        await bounded(store, "p:old", ttl_ms=1000)
        await bounded(store, "q:old", ttl_ms=1000)
        store_clock.advance(seconds=2)
        await bounded(store, "p:new", ttl_ms=1000)
        assert await store.purge_buffered_signals(prefix="p:", expired_only=True) == 1
        assert await tokens(store) == ["q:old", "p:new"]
        assert await store.purge_buffered_signals(token="q:old", expired_only=True) == 1

    async def test_listed_sizes_are_the_bytes_of_the_stored_json_text(
        self, store: StateStore
    ) -> None:
        payloads = {"ord:1": {"card": "4242-secret"}, "ord:2": None, "Ord:3": "é", "ord_4": [1]}
        for token, payload in payloads.items():
            assert await bounded(store, token, payload) is None
        await store.buffer_signal("child:c", True)
        rows = await store.list_buffered_signals(prefix=None, limit=1000, offset=0)
        # bytes of the stored JSON text; a null payload stores nothing
        expected = [
            len(json.dumps(p, separators=(",", ":"), ensure_ascii=False).encode())
            for p in (*payloads.values(), True)
        ]
        expected[1] = 0
        assert [r.size_bytes for r in rows] == expected
        assert rows[2].size_bytes == 4  # '"é"': é is two bytes in UTF-8
