"""`AdmissionBackendSuite`: the admission-backend contract, for any backend.

Every case runs on one `AdmissionWorld`: backends that share one admission state, as the
engines of one fleet do (`world.backend("A")` and `world.backend("B")` act for two
processes), all reading one `ManualClock`, so windows, slot lifetimes and waiter pruning are
checked without sleeping. Holders are step ids.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import TracebackType
from typing import ClassVar, Protocol

import pytest
import pytest_asyncio

from durably import Queue
from durably._core.admission import Admission, AdmissionBackend, QueueStats

# ------------------------------------------------------------------ the world of one test


class ManualClock:
    """Epoch milliseconds that move only when told (starts on a whole second). Call it for
    the time; every backend of one world reads the same clock."""

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


class AdmissionWorld(Protocol):
    """What the cases are given: the clock, and backends sharing one admission state."""

    @property
    def clock(self) -> ManualClock: ...

    async def backend(self, owner: str = "A") -> AdmissionBackend:
        """The backend acting for process `owner` (made on first ask, then the same one)."""
        ...


BackendFactory = Callable[[ManualClock, str], Awaitable[AdmissionBackend]]


class BackendWorld:
    """An `AdmissionWorld` over an async factory `(clock, owner) -> backend`: one backend per
    owner, made on first ask, all closed when the world's context exits."""

    def __init__(self, factory: BackendFactory, clock: ManualClock | None = None) -> None:
        self._factory = factory
        self._clock = clock if clock is not None else ManualClock()
        self._backends: dict[str, AdmissionBackend] = {}
        self._stack = AsyncExitStack()

    @property
    def clock(self) -> ManualClock:
        return self._clock

    async def backend(self, owner: str = "A") -> AdmissionBackend:
        found = self._backends.get(owner)
        if found is None:
            found = await self._factory(self._clock, owner)
            self._stack.push_async_callback(found.close)
            self._backends[owner] = found
        return found

    async def __aenter__(self) -> BackendWorld:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.aclose()


# ------------------------------------------------------------------ helpers of the cases


async def _try(
    backend: AdmissionBackend, queue: Queue, holder: str, *, key: str = "k", priority: int = 0
) -> Admission:
    return await backend.acquire(queue, holder, key=key, priority=priority)


async def _admitted(backend: AdmissionBackend, queue: Queue, holder: str, **kw: object) -> bool:
    return (await _try(backend, queue, holder, **kw)).admitted  # type: ignore[arg-type]


async def _next_admitted(
    backend: AdmissionBackend, queue: Queue, holders: list[str], keys: dict[str, str] | None = None
) -> list[str]:
    """Every holder in `holders` asks once, in REVERSE order (so arrival, not the order of
    the asks, decides); the ones admitted."""
    keys = keys or {}
    out = []
    for holder in reversed(holders):
        if await _admitted(backend, queue, holder, key=keys.get(holder, "k")):
            out.append(holder)
    return out


async def _line_up(
    backend: AdmissionBackend, queue: Queue, holders: list[str], **kw: object
) -> None:
    assert await _admitted(backend, queue, "first:0", key="first")
    for holder in holders:
        assert not await _admitted(backend, queue, holder, **kw)


async def _drain_order(
    backend: AdmissionBackend, queue: Queue, holders: list[str], keys: dict[str, str] | None = None
) -> list[str]:
    """Release the current holder, let everyone ask, record who got in; repeat."""
    order: list[str] = []
    current = "first:0"
    left = list(holders)
    while left:
        await backend.release(current)
        admitted = await _next_admitted(backend, queue, left, keys)
        assert len(admitted) == 1, admitted
        current = admitted[0]
        order.append(current)
        left.remove(current)
    return order


class AdmissionBackendSuite:
    """The admission-backend contract as pytest cases; each takes the `world` fixture.

    Subclass it (the class name starts with `Test`) and define `open_world()`: an async
    context manager yielding a fresh `AdmissionWorld`, usually a `BackendWorld` over a
    factory `(clock, owner) -> backend` whose backends share one admission state of this
    test's own (a fresh key prefix, a fresh schema), cleaned up when the context exits. Or
    override the `world` fixture, e.g. to parametrize over several backends.
    """

    # Every case is a coroutine: marked, so the suite runs under pytest-asyncio's strict
    # mode as well as its auto mode.
    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.asyncio]

    def open_world(self) -> AbstractAsyncContextManager[AdmissionWorld]:
        """A fresh world of backends sharing one admission state; override it (or the
        `world` fixture)."""
        raise NotImplementedError(
            f"{type(self).__name__} must define open_world() or override the world fixture"
        )

    @pytest_asyncio.fixture
    async def world(self) -> AsyncIterator[AdmissionWorld]:
        """The world of one case, from `open_world`."""
        async with self.open_world() as world:
            yield world

    async def test_concurrency_is_never_exceeded_under_concurrent_acquirers(
        self,
        world: AdmissionWorld,
    ) -> None:
        queue = Queue("api", concurrency=3, retry=0.05)
        backends = [await world.backend("A"), await world.backend("B")]
        in_flight = 0
        peak = 0
        done: list[str] = []

        async def one(i: int) -> None:
            nonlocal in_flight, peak
            backend = backends[i % 2]
            holder = f"run-{i}:0"
            for _ in range(10_000):
                if (await _try(backend, queue, holder, key=f"run-{i}")).admitted:
                    break
                await asyncio.sleep(random.uniform(0.001, 0.01))
            else:
                raise AssertionError(f"{holder} was never admitted")
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(random.uniform(0.001, 0.01))
            in_flight -= 1
            assert await backend.release(holder) == 1
            done.append(holder)

        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(30))), 60)
        assert len(done) == 30
        assert peak == 3  # reached, never passed

    async def test_a_holder_asking_again_keeps_its_one_slot(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("q", concurrency=2)
        assert await _admitted(backend, queue, "a:0")
        assert await _admitted(backend, queue, "a:0")  # a replayed turn asks again
        assert await _admitted(backend, queue, "b:0")
        assert not await _admitted(backend, queue, "c:0")

    async def test_an_unbounded_queue_admits_everyone(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("free")
        for i in range(20):
            assert await _admitted(backend, queue, f"r{i}:0")

    async def test_queues_count_their_slots_apart(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        one, two = Queue("one", concurrency=1), Queue("two", concurrency=1)
        assert await _admitted(backend, one, "a:0")
        assert await _admitted(backend, two, "b:0")
        assert not await _admitted(backend, one, "c:0")

    async def test_the_rate_window_is_respected_and_aligned(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("rated", rate=(5, 1.0))
        world.clock.advance(250)  # a quarter into a window: it still ends on the whole second
        for i in range(5):
            assert await _admitted(backend, queue, f"r{i}:0")
            await backend.release(f"r{i}:0")  # releasing does not give back window room
        denied = await _try(backend, queue, "r5:0")
        assert not denied.admitted
        window_end = world.clock.now - 250 + 1000
        assert denied.retry_at == window_end
        world.clock.advance(749)
        assert not await _admitted(backend, queue, "r5:0")
        world.clock.advance(1)
        assert await _admitted(backend, queue, "r5:0")

    async def test_a_caller_with_an_older_clock_counts_in_the_current_window(
        self,
        world: AdmissionWorld,
    ) -> None:
        # Callers of one queue may reach the backend out of order (one waited for the lock;
        # another host's clock lags): an older reading must not reopen an older, emptier window.
        backend = await world.backend()
        queue = Queue("rated", rate=(2, 1.0))
        assert await _admitted(backend, queue, "a:0")
        assert await _admitted(backend, queue, "b:0")
        world.clock.advance(-300)
        late = await _try(backend, queue, "c:0")
        assert not late.admitted
        assert late.retry_at == world.clock.now + 300 + 1000

    async def test_the_rate_limit_turns_away_every_priority(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("rated", rate=(2, 1.0))
        assert await _admitted(backend, queue, "a:0")
        assert await _admitted(backend, queue, "b:0")
        assert not await _admitted(backend, queue, "vip:0", priority=100)

    async def test_rate_and_concurrency_together(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("both", concurrency=1, rate=(2, 1.0))
        assert await _admitted(backend, queue, "a:0")
        full = await _try(backend, queue, "b:0")
        assert not full.admitted and full.retry_at == world.clock.now + queue.retry_ms
        await backend.release("a:0")
        assert await _admitted(backend, queue, "b:0")
        await backend.release("b:0")
        limited = await _try(backend, queue, "c:0")
        assert not limited.admitted and limited.retry_at == world.clock.now + 1000

    async def test_fifo_admits_the_earliest_waiter(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("fifo", concurrency=1)
        holders = ["a:0", "b:0", "c:0", "d:0"]
        await _line_up(backend, queue, holders)
        assert await _drain_order(backend, queue, holders) == holders

    async def test_lifo_admits_the_latest_waiter(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("lifo", concurrency=1, order="lifo")
        holders = ["a:0", "b:0", "c:0", "d:0"]
        await _line_up(backend, queue, holders)
        assert await _drain_order(backend, queue, holders) == list(reversed(holders))

    async def test_a_newcomer_does_not_jump_the_line(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("fifo", concurrency=1)
        await _line_up(backend, queue, ["a:0"])
        await backend.release("first:0")
        assert not await _admitted(backend, queue, "late:0")  # the slot is a:0's
        assert await _admitted(backend, queue, "a:0")

    async def test_higher_priority_goes_first_then_arrival(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("prio", concurrency=1)
        assert await _admitted(backend, queue, "first:0")
        priorities = {"low:0": 0, "high:0": 5, "mid:0": 1, "high2:0": 5}
        for holder, priority in priorities.items():
            assert not await _admitted(backend, queue, holder, priority=priority)
        order: list[str] = []
        current = "first:0"
        left = list(priorities)
        while left:
            await backend.release(current)
            admitted = [
                h
                for h in reversed(left)
                if await _admitted(backend, queue, h, priority=priorities[h])
            ]
            assert len(admitted) == 1
            current = admitted[0]
            order.append(current)
            left.remove(current)
        assert order == ["high:0", "high2:0", "mid:0", "low:0"]

    async def test_fairness_by_key_alternates_between_keys(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("fair", concurrency=1, fairness="key")
        keys = {"a1:0": "a", "a2:0": "a", "a3:0": "a", "b1:0": "b", "b2:0": "b"}
        assert await _admitted(backend, queue, "first:0", key="first")
        for holder, key in keys.items():
            assert not await _admitted(backend, queue, holder, key=key)
        order = await _drain_order(backend, queue, list(keys), keys)
        assert order == ["a1:0", "b1:0", "a2:0", "b2:0", "a3:0"]

    async def test_without_fairness_arrival_decides(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("plain", concurrency=1)
        keys = {"a1:0": "a", "a2:0": "a", "a3:0": "a", "b1:0": "b", "b2:0": "b"}
        assert await _admitted(backend, queue, "first:0", key="first")
        for holder, key in keys.items():
            assert not await _admitted(backend, queue, holder, key=key)
        assert await _drain_order(backend, queue, list(keys), keys) == list(keys)

    async def test_priority_beats_fairness(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("fair", concurrency=1, fairness="key")
        assert await _admitted(backend, queue, "first:0", key="a")
        assert not await _admitted(backend, queue, "b:0", key="b")  # never served
        assert not await _admitted(backend, queue, "a:0", key="a", priority=1)  # served, but higher
        await backend.release("first:0")
        assert not await _admitted(backend, queue, "b:0", key="b")
        assert await _admitted(backend, queue, "a:0", key="a", priority=1)

    async def test_with_free_slots_the_best_few_get_in(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("wide", concurrency=2)
        assert await _admitted(backend, queue, "x:0")
        assert await _admitted(backend, queue, "y:0")
        for holder in ("a:0", "b:0", "c:0"):
            assert not await _admitted(backend, queue, holder)
        await backend.release("x:0", "y:0")
        # Two slots are free: the second in line need not wait for the first to ask.
        assert not await _admitted(backend, queue, "c:0")
        assert await _admitted(backend, queue, "b:0")
        assert await _admitted(backend, queue, "a:0")
        assert not await _admitted(backend, queue, "c:0")

    async def test_release_frees_exactly_once(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("once", concurrency=1)
        assert await _admitted(backend, queue, "a:0")
        assert await backend.release("a:0") == 1
        assert await backend.release("a:0") == 0  # a second release is no second slot
        assert await _admitted(backend, queue, "b:0")
        assert await backend.release("a:0") == 0
        assert not await _admitted(backend, queue, "c:0")  # b's slot is still b's
        assert await backend.release("never:0") == 0

    async def test_release_takes_a_waiter_out_of_line(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("line", concurrency=1)
        await _line_up(backend, queue, ["a:0", "b:0"])
        assert await backend.release("a:0") == 0  # a waiter holds no slot ...
        await backend.release("first:0")
        assert await _admitted(backend, queue, "b:0")  # ... but it left the line

    async def test_another_process_can_release(self, world: AdmissionWorld) -> None:
        # A step's result may be settled by another engine of the fleet than the one that
        # admitted it; the slot is the step's, whoever releases it.
        a, b = await world.backend("A"), await world.backend("B")
        queue = Queue("shared", concurrency=1)
        assert await _admitted(a, queue, "s:0")
        assert not await _admitted(b, queue, "t:0")
        assert await b.release("s:0") == 1
        assert await _admitted(b, queue, "t:0")

    async def test_a_release_names_the_next_in_line(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        heard: asyncio.Queue[tuple[str, list[str]]] = asyncio.Queue()
        backend.on_freed(lambda queue, holders: heard.put_nowait((queue, list(holders))))
        queue = Queue("told", concurrency=1)
        await _line_up(backend, queue, ["a:0", "b:0"])
        await _admitted(backend, queue, "warm:0")  # (a PostgreSQL listener starts on an acquire)
        await asyncio.sleep(0.2)
        assert await backend.release("first:0") == 1
        name, holders = await asyncio.wait_for(heard.get(), 10)
        assert name == "told"
        assert holders == ["a:0"]
        assert await backend.release("nobody:0") == 0
        await asyncio.sleep(0.2)
        assert heard.empty()  # nothing freed, nobody told

    async def test_a_dead_holders_slot_frees_after_its_ttl(self, world: AdmissionWorld) -> None:
        dead, alive = await world.backend("A"), await world.backend("B")
        queue = Queue("ttl", concurrency=1, slot_ttl=2.0)
        assert await _admitted(dead, queue, "dead:0")  # its process dies: no renew, no release
        world.clock.advance(1999)
        assert not await _admitted(alive, queue, "b:0")
        world.clock.advance(1)
        assert await _admitted(alive, queue, "b:0")
        assert await dead.release("dead:0") == 0  # the lapsed slot is nobody's to free

    async def test_renewing_keeps_a_live_holders_slot(self, world: AdmissionWorld) -> None:
        holder, other = await world.backend("A"), await world.backend("B")
        queue = Queue("ttl", concurrency=1, slot_ttl=2.0)
        assert await _admitted(holder, queue, "long:0")
        for _ in range(5):
            world.clock.advance(1500)
            assert await holder.renew(["long:0"]) == {"long:0"}
            assert not await _admitted(other, queue, "b:0")
        world.clock.advance(2000)
        assert await holder.renew(["long:0"]) == set()  # lapsed: renewing does not take it back
        assert await _admitted(other, queue, "b:0")

    async def test_waiters_that_stop_asking_are_pruned(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("prune", concurrency=1, retry=0.1)  # waiters live 300 ms without asking
        assert await _admitted(backend, queue, "first:0")
        assert not await _admitted(backend, queue, "gone:0", priority=9)  # its run was cancelled
        world.clock.advance(250)
        assert not await _admitted(backend, queue, "c:0")
        world.clock.advance(100)  # gone:0 last asked 350 ms ago
        assert not await _admitted(backend, queue, "c:0")
        await backend.release("first:0")
        assert await _admitted(backend, queue, "c:0")

    async def test_a_waiter_that_keeps_asking_keeps_its_place(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("keep", concurrency=1, retry=0.1)
        assert await _admitted(backend, queue, "first:0")
        assert not await _admitted(backend, queue, "early:0")
        for _ in range(5):
            world.clock.advance(200)
            assert not await _admitted(backend, queue, "early:0")
            assert not await _admitted(backend, queue, "late:0")
        await backend.release("first:0")
        assert not await _admitted(backend, queue, "late:0")
        assert await _admitted(backend, queue, "early:0")

    async def test_a_denied_caller_is_told_when_to_ask_again(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("retry", concurrency=1, retry=0.25)
        assert await _admitted(backend, queue, "a:0")
        denied = await _try(backend, queue, "b:0")
        assert denied == Admission(False, world.clock.now + 250)

    async def test_a_caller_far_back_in_line_is_told_to_ask_later(
        self, world: AdmissionWorld
    ) -> None:
        backend = await world.backend()
        queue = Queue("deep", concurrency=2, retry=0.1)
        now = world.clock.now
        assert await _admitted(backend, queue, "x:0")
        assert await _admitted(backend, queue, "y:0")
        told = [(await _try(backend, queue, f"w{i}:0")).retry_at - now for i in range(30)]
        # One round of admissions (two slots) per interval ahead of it, at most ten intervals.
        assert told[:6] == [100, 100, 200, 200, 300, 300]
        assert told[-1] == 1000 and max(told) == 1000

    async def test_a_caller_stopped_by_the_rate_is_told_the_window_its_turn_can_come_in(
        self,
        world: AdmissionWorld,
    ) -> None:
        backend = await world.backend()
        queue = Queue("rated", rate=(2, 1.0))
        assert await _admitted(backend, queue, "a:0")
        assert await _admitted(backend, queue, "b:0")
        window_end = world.clock.now + 1000
        told = [(await _try(backend, queue, f"w{i}:0")).retry_at for i in range(5)]
        assert told == [
            window_end,
            window_end,
            window_end + 1000,
            window_end + 1000,
            window_end + 2000,
        ]

    async def test_a_waiter_told_to_wait_long_keeps_its_place_until_it_is_due(
        self,
        world: AdmissionWorld,
    ) -> None:
        backend = await world.backend()
        queue = Queue("deep", concurrency=1, retry=0.1)
        assert await _admitted(backend, queue, "first:0")
        for i in range(4):
            assert not await _admitted(backend, queue, f"w{i}:0")
        late = await _try(backend, queue, "last:0")
        assert late.retry_at == world.clock.now + 500  # four ahead, one slot: five intervals
        world.clock.advance(650)  # the others never asked again: they are gone by now
        assert not await _admitted(backend, queue, "newcomer:0")  # last:0 is still in line
        await backend.release("first:0")
        assert not await _admitted(backend, queue, "newcomer:0")
        assert await _admitted(backend, queue, "last:0")

    async def test_stats_count_slots_waiters_and_the_current_window(
        self, world: AdmissionWorld
    ) -> None:
        backend = await world.backend("A")
        other = await world.backend("B")
        queue = Queue("api", concurrency=2, rate=(3, "1s"), retry=1.0, slot_ttl=10.0)
        idle = Queue("idle", concurrency=1)
        assert await backend.stats([queue, idle]) == [QueueStats("api"), QueueStats("idle")]
        assert await _admitted(backend, queue, "a:0")
        assert await _admitted(other, queue, "b:0")  # another process's slot counts too
        assert not await _admitted(backend, queue, "c:0")
        api, unused = await backend.stats([queue, idle])
        assert (api.in_flight, api.waiting, api.window_count, api.admitted) == (2, 1, 2, 2)
        assert api.blocked(queue) == "concurrency"
        assert unused == QueueStats("idle")
        await backend.release("a:0")
        assert await _admitted(backend, queue, "c:0")
        [api] = await other.stats([queue])
        assert (api.in_flight, api.waiting, api.window_count, api.admitted) == (2, 0, 3, 3)
        await backend.release("b:0", "c:0")
        [api] = await backend.stats([queue])
        assert (api.in_flight, api.window_count) == (0, 3)
        assert api.blocked(queue) == "rate"  # the window's 3 admissions are used up
        world.clock.advance(1_000)  # the next window
        [api] = await backend.stats([queue])
        assert (api.in_flight, api.waiting, api.window_count, api.admitted) == (0, 0, 0, 3)
        assert api.blocked(queue) is None

    async def test_stats_leave_out_lapsed_slots_and_waiters(self, world: AdmissionWorld) -> None:
        backend = await world.backend()
        queue = Queue("q", concurrency=1, retry=1.0, slot_ttl=2.0)
        assert await _admitted(backend, queue, "a:0")
        assert not await _admitted(backend, queue, "b:0")  # told to ask again in 1 s
        world.clock.advance(2_000)  # the slot lapsed; the waiter keeps its place until 3 s
        [q] = await backend.stats([queue])
        assert (q.in_flight, q.waiting) == (0, 1)
        world.clock.advance(1_000)
        [q] = await backend.stats([queue])
        assert (q.in_flight, q.waiting, q.admitted) == (0, 0, 1)
