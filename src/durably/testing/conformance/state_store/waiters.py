"""State-store cases: signal waiters and the buffered signals and events."""

from __future__ import annotations

from durably import SignalWaiter, StateStore
from durably._core.models import BufferedEvent, BufferedSignal

from .base import StoreCases
from .support import take_buffered, take_waiter


class WaiterCases(StoreCases):
    """The waiters cases of the state-store suite."""

    async def test_waiters_put_list_by_prefix_take_once(self, store: StateStore) -> None:
        await store.put_signal_waiter(SignalWaiter("wh:r2:1", "r2", 1))
        await store.put_signal_waiter(SignalWaiter("wh:r1:5", "r1", 5))
        await store.put_signal_waiter(SignalWaiter("wh:r1:3", "r1", 3))
        await store.put_signal_waiter(SignalWaiter("child:c1", "r1", 4))
        await store.put_signal_waiter(SignalWaiter("WH:r9:0", "r9", 0))

        listed = await store.list_signal_waiters("wh:")
        assert [w.token for w in listed] == ["wh:r1:3", "wh:r1:5", "wh:r2:1"]  # (run_id, seq)
        every = await store.list_signal_waiters("")
        assert [w.token for w in every] == ["wh:r1:3", "child:c1", "wh:r1:5", "wh:r2:1", "WH:r9:0"]
        assert await store.list_signal_waiters("wh_") == []

        taken = await take_waiter(store, "wh:r1:3")
        assert taken == SignalWaiter("wh:r1:3", "r1", 3)
        assert await take_waiter(store, "wh:r1:3") is None
        assert await take_waiter(store, "never") is None
        assert [w.token for w in await store.list_signal_waiters("wh:")] == ["wh:r1:5", "wh:r2:1"]

    async def test_waiter_put_replaces_by_token(self, store: StateStore) -> None:
        await store.put_signal_waiter(SignalWaiter("approve", "r1", 1, parallel_group="g"))
        await store.put_signal_waiter(SignalWaiter("approve", "r2", 7))
        assert await store.list_signal_waiters("approve") == [SignalWaiter("approve", "r2", 7)]

    async def test_waiter_parallel_group_round_trip(self, store: StateStore) -> None:
        grouped = SignalWaiter("child:c1", "r1", 2, parallel_group="fan-1")
        plain = SignalWaiter("child:c2", "r1", 3)
        await store.put_signal_waiter(grouped)
        await store.put_signal_waiter(plain)
        listed = await store.list_signal_waiters("child:")
        assert listed == [grouped, plain]
        assert listed[1].parallel_group is None
        assert await take_waiter(store, "child:c1") == grouped
        assert await take_waiter(store, "child:c2") == plain

    async def test_remove_signal_waiter_exact_match(self, store: StateStore) -> None:
        await store.put_signal_waiter(SignalWaiter("tok", "r2", 5))
        await store.remove_signal_waiter(SignalWaiter("tok", "r1", 5))  # stale identity
        await store.remove_signal_waiter(SignalWaiter("tok", "r2", 6))  # mismatched seq
        await store.remove_signal_waiter(SignalWaiter("absent", "r2", 5))  # absent
        assert await store.list_signal_waiters("tok") == [SignalWaiter("tok", "r2", 5)]
        await store.remove_signal_waiter(SignalWaiter("tok", "r2", 5))  # exact
        assert await store.list_signal_waiters("") == []

    async def test_buffered_signals_fifo_per_token(self, store: StateStore) -> None:
        await store.buffer_signal("a", {"n": 1})
        await store.buffer_signal("b", "b1")
        await store.buffer_signal("a", None)
        await store.buffer_signal("a", [3])
        await store.buffer_signal("b", 2.5)

        assert await take_buffered(store, "a") == BufferedSignal({"n": 1})
        assert await take_buffered(store, "b") == BufferedSignal("b1")
        hit = await take_buffered(store, "a")
        assert hit is not None and hit.payload is None  # a NULL payload is still a hit
        assert await take_buffered(store, "a") == BufferedSignal([3])
        assert await take_buffered(store, "a") is None
        assert await take_buffered(store, "b") == BufferedSignal(2.5)
        assert await take_buffered(store, "b") is None
        assert await take_buffered(store, "never") is None

    async def test_buffered_events(self, store: StateStore) -> None:
        await store.buffer_event(BufferedEvent("e3", "order.paid", {"id": 3}, 300))
        await store.buffer_event(BufferedEvent("e1", "order.paid", {"id": 1}, 100))
        await store.buffer_event(BufferedEvent("e2b", "order.paid", {"id": 22}, 200))
        await store.buffer_event(BufferedEvent("e2a", "order.paid", {"id": 2}, 200))
        await store.buffer_event(BufferedEvent("x1", "order.shipped", None, 50))

        listed = await store.list_buffered_events("order.paid", 50)
        assert [e.id for e in listed] == ["e1", "e2a", "e2b", "e3"]
        assert listed[0] == BufferedEvent("e1", "order.paid", {"id": 1}, 100)
        # not consuming; limit caps
        assert [e.id for e in await store.list_buffered_events("order.paid", 2)] == ["e1", "e2a"]
        assert await store.list_buffered_events("order.shipped", 50) == [
            BufferedEvent("x1", "order.shipped", None, 50)
        ]
        assert await store.list_buffered_events("nope", 50) == []

        assert await store.remove_buffered_event("e1") is True
        assert await store.remove_buffered_event("e1") is False
        assert await store.remove_buffered_event("never") is False
        assert [e.id for e in await store.list_buffered_events("order.paid", 50)] == [
            "e2a",
            "e2b",
            "e3",
        ]
