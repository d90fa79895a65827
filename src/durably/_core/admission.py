"""Flow-control queues for steps: the queue settings, the admission rules, the backend
contract and the in-process backend.

A queue bounds how many steps hold one of its slots at once (`concurrency`) and how many are
admitted per fixed window (`rate`). A step asks for a slot before it runs (or before it is
dispatched to a worker) and gives it back when its result is recorded. A step that is turned
away waits in line: the backend remembers it as a *waiter* with an arrival number, so it keeps
its place across retries, and tells it when to ask again (`retry_at`).

The rules every backend follows, so that a queue behaves the same whichever one admits:

1. Slots whose holder stopped renewing them for `slot_ttl` are free again (a process that
   died mid-step must not hold its slots forever); a waiter that has not asked again two
   retry intervals after the time it was told to is forgotten (a cancelled run must not
   keep its place). A caller is told to ask again after one retry interval, or — far back
   in line — after as many intervals as rounds of admissions are ahead of it (at most
   `MAX_WAIT`); when a full rate window stops it, when the window its turn could come in
   begins.
2. A holder that already holds a slot is admitted again without taking a second one (a turn
   replayed after a crash asks again for the slot its step already has).
3. The rate limit counts admissions per window aligned to the epoch (`now - now % period`):
   every backend, and every process, agrees on which window an admission falls in. Windows
   only move forward (a caller with an older clock reading counts in the current one). A
   full window turns everyone away until it ends, whatever their priority.
4. With `free` slots (concurrency left, capped by what the window still allows), a caller is
   admitted when fewer than `free` waiters rank before it. The ranking: higher priority
   first; then, with `fairness="key"`, the fairness key served least recently (a key never
   served counts as served at tick 0); then arrival (earliest first, or latest first for
   `order="lifo"`). Letting the best `free` in — not only the very best — keeps slots busy
   while the best waiter's process is between two retries.
5. Release is idempotent: releasing a holder that holds nothing (a second release, or a slot
   that already lapsed) frees nothing, so it can never free somebody else's slot.
6. A release that freed slots tells the backend's listeners (`on_freed`) which waiters now
   rank first, so the process holding them can ask again at once instead of at `retry_at`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from durably._core.durations import Duration, to_ms

__all__ = [
    "ADMITTED",
    "KEY_MEMORY",
    "MAX_WAIT",
    "NOTIFY_AT_MOST",
    "Admission",
    "AdmissionBackend",
    "FreedListener",
    "LocalAdmission",
    "Queue",
    "QueueCall",
    "QueueStats",
    "window_count",
]

# How many admissions back a fairness key's last service is remembered. A key not served
# for this long ranks as if never served, which is where it would rank anyway; forgetting
# it keeps the per-queue memory bounded when every run is its own key (the default).
KEY_MEMORY = 10_000
# A caller far back in line is told to ask again later, not every retry interval: after
# `1 + ahead // concurrency` intervals (the rounds of admissions before its turn could
# come; windows, when the rate limit is what stops it), at most this many. A release wakes
# the waiters whose turn it is anyway, so waiting longer costs them nothing, and hundreds
# of waiters asking every interval would keep the queue busy answering them.
MAX_WAIT = 10
# At most this many waiters are named in one freed-slot notice (a PostgreSQL notification
# payload is limited to 8000 bytes; run ids may be 255 bytes long).
NOTIFY_AT_MOST = 16

Fairness = Literal["fifo", "key"]
Order = Literal["fifo", "lifo"]


def _positive_ms(value: Duration, what: str) -> int:
    try:
        ms = to_ms(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"Queue({what}=...): {exc}") from None
    if ms <= 0:
        raise ValueError(f"Queue({what}=...) must be positive, got {value!r}")
    return ms


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Queue({what}=...) must be a whole number of at least 1, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Queue:
    """A flow-control queue that `ctx.step(..., queue=name)` asks for a slot.

    - `concurrency`: how many steps may hold a slot at once (None: no bound).
    - `rate`: `(limit, per)` — at most `limit` admissions per fixed window of `per` (seconds,
      a timedelta or a string such as "1s"); None: no rate limit.
    - `fairness`: `"fifo"` ranks waiters by arrival; `"key"` lets the fairness key served
      least recently go first (the key is the run id unless the call gives
      `fairness_key=`), so one run's wide fan cannot starve the others.
    - `order`: `"fifo"` (earliest waiter first) or `"lifo"` (latest first).
    - `retry`: how long a turned-away step waits before it asks again, unless a freed slot
      wakes it sooner (a step far back in line waits a few intervals, at most ten); a
      waiter that has not asked again two intervals after it was due loses its place.
    - `slot_ttl`: how long a slot outlives its holder's process: a live engine renews its
      slots every third of it, so only a dead one's slots lapse.
    """

    name: str
    concurrency: int | None = None
    rate: tuple[int, Duration] | None = None
    fairness: Fairness = "fifo"
    order: Order = "fifo"
    retry: Duration = 1.0
    slot_ttl: Duration = 30.0
    # Derived once, in milliseconds (not arguments).
    rate_limit: int | None = field(init=False, default=None, repr=False, compare=False)
    rate_period_ms: int | None = field(init=False, default=None, repr=False, compare=False)
    retry_ms: int = field(init=False, default=0, repr=False, compare=False)
    slot_ttl_ms: int = field(init=False, default=0, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or not self.name.isprintable():
            raise ValueError(
                f"Queue(name=...) must be a non-empty printable string, got {self.name!r}"
            )
        if len(self.name.encode()) > 200:
            raise ValueError("Queue(name=...) must be at most 200 bytes of UTF-8")
        if self.concurrency is not None:
            _positive_int(self.concurrency, "concurrency")
        if self.rate is not None:
            if not isinstance(self.rate, tuple) or len(self.rate) != 2:
                raise ValueError(f"Queue(rate=...) must be (limit, per), got {self.rate!r}")
            object.__setattr__(self, "rate_limit", _positive_int(self.rate[0], "rate limit"))
            object.__setattr__(self, "rate_period_ms", _positive_ms(self.rate[1], "rate period"))
        if self.fairness not in ("fifo", "key"):
            raise ValueError(f'Queue(fairness=...) must be "fifo" or "key", got {self.fairness!r}')
        if self.order not in ("fifo", "lifo"):
            raise ValueError(f'Queue(order=...) must be "fifo" or "lifo", got {self.order!r}')
        object.__setattr__(self, "retry_ms", _positive_ms(self.retry, "retry"))
        object.__setattr__(self, "slot_ttl_ms", _positive_ms(self.slot_ttl, "slot_ttl"))

    @property
    def longest_wait_ms(self) -> int:
        """The longest a waiter is ever told to wait before asking again, plus the grace
        after which a waiter that did not ask is forgotten."""
        window = self.rate_period_ms or 0
        return MAX_WAIT * max(self.retry_ms, window) + 2 * self.retry_ms

    @property
    def fair(self) -> bool:
        return self.fairness == "key"

    @property
    def lifo(self) -> bool:
        return self.order == "lifo"


@dataclass(frozen=True, slots=True)
class QueueCall:
    """What one `ctx.step(..., queue=, priority=, fairness_key=)` asks of a queue."""

    queue: str
    priority: int = 0
    fairness_key: str | None = None


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer to an acquire: admitted, or turned away until `retry_at` (epoch ms)."""

    admitted: bool
    retry_at: int = 0


ADMITTED = Admission(True)


@dataclass(frozen=True, slots=True)
class QueueStats:
    """What a backend counts for one queue now (`AdmissionBackend.stats`): slots held
    (`in_flight`, lapsed ones left out), places in line (`waiting`, lapsed ones left out)
    and admissions in the current rate window (`window_count`; 0 without a rate limit or
    once the window is over). Fleet-wide on a shared backend; `admitted` counts every
    admission since the queue was first used (on this backend's state)."""

    queue: str
    in_flight: int = 0
    waiting: int = 0
    window_count: int = 0
    admitted: int = 0

    def blocked(self, queue: Queue) -> str | None:
        """Why the queue turns callers away now: "rate" (the current window is full),
        "concurrency" (every slot is held), or None (a caller asking now could get in)."""
        if queue.rate_limit is not None and self.window_count >= queue.rate_limit:
            return "rate"
        if queue.concurrency is not None and self.in_flight >= queue.concurrency:
            return "concurrency"
        return None


#: `listener(queue_name, holders)`: slots of the queue were freed and these waiters (best
#: first, at most NOTIFY_AT_MOST) rank first now.
FreedListener = Callable[[str, Sequence[str]], None]


class AdmissionBackend(Protocol):
    """Where slots are counted: this process only (`LocalAdmission`), or a fleet through a
    shared server (PostgreSQL; Redis). Every backend follows the rules of this module, which
    one conformance suite checks on each of them.

    A holder is a step id (`<run id>:<seq>`), unique across queues. Each backend instance
    acts for one process (its owner), which renews the slots it holds.
    """

    async def acquire(self, queue: Queue, holder: str, *, key: str, priority: int = 0) -> Admission:
        """Admit `holder` to `queue` or turn it away until `retry_at`, in one atomic step."""
        ...

    async def release(self, *holders: str) -> int:
        """Give back the holders' slots and places in line; how many slots were freed."""
        ...

    async def renew(self, holders: Collection[str]) -> set[str]:
        """Extend these holders' slots (the ones this process knows it holds) by their
        queue's `slot_ttl`; the holders that still hold one. A slot that already lapsed is
        not taken back, and a slot this process forgot (say, its release failed) is not
        renewed, so it lapses instead of leaking."""
        ...

    def on_freed(self, listener: FreedListener) -> None:
        """Call `listener` whenever a release frees slots (possibly from another process)."""
        ...

    async def stats(self, queues: Sequence[Queue]) -> list[QueueStats]:
        """The counts of these queues now, one per queue in order (zeros for a queue nobody
        used yet); one cheap read, changing nothing."""
        ...

    async def close(self) -> None: ...


def rank(queue: Queue, priority: int, served: int, arrival: int) -> tuple[int, int, int]:
    """A waiter's place in line: smaller goes first."""
    return (-priority, served if queue.fair else 0, -arrival if queue.lifo else arrival)


def window_count(queue: Queue, now: int, window_start: int, count: int) -> int:
    """The admissions counted in the rate window `now` falls in: `count` if the stored
    window is that one (or a later one: windows only move forward), else none yet."""
    if queue.rate_period_ms is None:
        return 0
    return count if window_start >= now - now % queue.rate_period_ms else 0


def _retry_at(queue: Queue, now: int, window: int, rate_full: bool, ahead: int) -> int:
    """When a turned-away caller with `ahead` waiters before it should ask again."""
    if rate_full and queue.rate_limit is not None and queue.rate_period_ms is not None:
        return window + queue.rate_period_ms * min(MAX_WAIT, 1 + ahead // queue.rate_limit)
    per_round = max(queue.concurrency or queue.rate_limit or 1, 1)
    return now + queue.retry_ms * min(MAX_WAIT, 1 + ahead // per_round)


@dataclass(slots=True)
class _Waiter:
    priority: int
    key: str
    arrival: int
    expires_at: int


@dataclass(slots=True)
class _Slot:
    ttl_ms: int
    expires_at: int


@dataclass(slots=True)
class _Line:
    """One queue's state in this process."""

    queue: Queue
    slots: dict[str, _Slot] = field(default_factory=dict)
    waiters: dict[str, _Waiter] = field(default_factory=dict)
    window_start: int = 0
    window_count: int = 0
    arrivals: int = 0
    served: int = 0
    key_served: dict[str, int] = field(default_factory=dict)

    def lapse(self, now: int) -> list[str]:
        """Drop the slots and waiters whose time ran out; their holders."""
        gone = [h for h, s in self.slots.items() if s.expires_at <= now]
        for holder in gone:
            del self.slots[holder]
        lapsed = [h for h, w in self.waiters.items() if w.expires_at <= now]
        for holder in lapsed:
            del self.waiters[holder]
        return gone + lapsed

    def served_of(self, key: str) -> int:
        return self.key_served.get(key, 0)

    def best(self, now: int, count: int) -> list[str]:
        live = [(h, w) for h, w in self.waiters.items() if w.expires_at > now]
        live.sort(
            key=lambda hw: rank(
                self.queue, hw[1].priority, self.served_of(hw[1].key), hw[1].arrival
            )
        )
        return [h for h, _ in live[:count]]


class LocalAdmission:
    """The in-process backend: slots counted in this process only, so a queue's limits hold
    per engine (each engine of a fleet admits up to the limit). The default on stores other
    than PostgreSQL, where the engines of a fleet share no admission state."""

    def __init__(self, *, clock: Callable[[], int]):
        self._clock = clock
        self._lines: dict[str, _Line] = {}
        self._where: dict[str, str] = {}  # holder -> queue name (slot or place in line)
        self._listeners: list[FreedListener] = []

    def _line(self, queue: Queue) -> _Line:
        line = self._lines.get(queue.name)
        if line is None:
            line = self._lines[queue.name] = _Line(queue)
        else:
            line.queue = queue  # re-registering a queue replaces its settings
        return line

    async def acquire(self, queue: Queue, holder: str, *, key: str, priority: int = 0) -> Admission:
        now = self._clock()
        line = self._line(queue)
        for gone in line.lapse(now):
            if self._where.get(gone) == queue.name:
                del self._where[gone]
        slot = line.slots.get(holder)
        if slot is not None:
            slot.ttl_ms = queue.slot_ttl_ms
            slot.expires_at = now + queue.slot_ttl_ms
            return ADMITTED
        window = 0
        rate_left = math.inf
        if queue.rate_limit is not None and queue.rate_period_ms is not None:
            # Windows only move forward: a caller whose clock reading is older than the last
            # one's counts in the current window (never reopens an older, emptier one).
            window = max(now - now % queue.rate_period_ms, line.window_start)
            if line.window_start != window:
                line.window_start, line.window_count = window, 0
            rate_left = queue.rate_limit - line.window_count
        free = math.inf if queue.concurrency is None else queue.concurrency - len(line.slots)
        free = min(free, rate_left)
        me = line.waiters.get(holder)
        arrival = me.arrival if me is not None else line.arrivals + 1
        mine = rank(queue, priority, line.served_of(key), arrival)
        ahead = sum(
            1
            for h, w in line.waiters.items()
            if h != holder and rank(queue, w.priority, line.served_of(w.key), w.arrival) < mine
        )
        if ahead < free:
            line.waiters.pop(holder, None)
            line.slots[holder] = _Slot(queue.slot_ttl_ms, now + queue.slot_ttl_ms)
            self._where[holder] = queue.name
            line.served += 1
            if queue.fair:
                line.key_served[key] = line.served
                self._forget_old_keys(line)
            if queue.rate_limit is not None:
                line.window_count += 1
            return ADMITTED
        retry_at = _retry_at(queue, now, window, rate_left <= 0, ahead)
        expires = retry_at + 2 * queue.retry_ms
        if me is None:
            line.arrivals += 1
            line.waiters[holder] = _Waiter(priority, key, line.arrivals, expires)
            self._where[holder] = queue.name
        else:
            me.priority, me.key, me.expires_at = priority, key, expires
        return Admission(False, retry_at)

    @staticmethod
    def _forget_old_keys(line: _Line) -> None:
        if len(line.key_served) > 2 * KEY_MEMORY:
            horizon = line.served - KEY_MEMORY
            line.key_served = {k: t for k, t in line.key_served.items() if t >= horizon}

    async def release(self, *holders: str) -> int:
        now = self._clock()
        freed: dict[str, int] = {}
        for holder in holders:
            name = self._where.pop(holder, None)
            line = self._lines.get(name) if name is not None else None
            if line is None:
                continue
            line.waiters.pop(holder, None)
            slot = line.slots.pop(holder, None)
            if slot is not None and slot.expires_at > now:
                freed[line.queue.name] = freed.get(line.queue.name, 0) + 1
        for name, count in freed.items():
            line = self._lines[name]
            concurrency = line.queue.concurrency
            free = count if concurrency is None else max(count, concurrency - len(line.slots))
            best = line.best(now, min(free, NOTIFY_AT_MOST))
            for listener in tuple(self._listeners):
                listener(name, best)
        return sum(freed.values())

    async def renew(self, holders: Collection[str]) -> set[str]:
        now = self._clock()
        held: set[str] = set()
        for holder in holders:
            name = self._where.get(holder)
            line = self._lines.get(name) if name is not None else None
            slot = line.slots.get(holder) if line is not None else None
            if slot is not None and slot.expires_at > now:
                slot.expires_at = now + slot.ttl_ms
                held.add(holder)
        return held

    def on_freed(self, listener: FreedListener) -> None:
        self._listeners.append(listener)

    async def stats(self, queues: Sequence[Queue]) -> list[QueueStats]:
        now = self._clock()
        out: list[QueueStats] = []
        for queue in queues:
            line = self._lines.get(queue.name)
            if line is None:
                out.append(QueueStats(queue.name))
                continue
            out.append(
                QueueStats(
                    queue.name,
                    in_flight=sum(1 for s in line.slots.values() if s.expires_at > now),
                    waiting=sum(1 for w in line.waiters.values() if w.expires_at > now),
                    window_count=window_count(queue, now, line.window_start, line.window_count),
                    admitted=line.served,
                )
            )
        return out

    async def close(self) -> None:
        return None
