"""Flow-control queues in the runtime: a step given `queue=` holds one of the queue's slots
while it runs.

`FlowControl` is this process's end of an admission backend (`durably._core.admission`):

- **Before a queued step runs** (in-process: before its handler; over a transport: before
  its `pending` row is written and the task dispatched) it asks the backend for a slot. The
  holder is the step id, so every attempt and every replay of one step asks for the same
  slot. Turned away, the body waits: a resident body parks until `retry_at` or until a
  release names it as next in line; a classic turn suspends with `wake_at = retry_at` and
  the due-timer poll re-drives it (a release naming it re-drives it at once).
- **The slot is given back once the step's result is recorded**: in-process when the handler
  returns (or is cancelled with its run); over a transport when the result is settled (by
  whichever engine of the fleet settles it, or dropped because the run finished), or when
  the attempt fails without a result (dispatch refused, timeout). A run that ends gives back
  its places in line at once; the slot of a step still running on another machine waits
  for that step's result, or lapses after its TTL if none ever comes.
- **Live slots are renewed** every third of the shortest `slot_ttl` of the registered
  queues, so only a dead process's slots lapse. This process renews only the slots it
  knows it holds: one it lost track of lapses instead of leaking.

A queue name nobody registered here admits everything (logged once), as a step without a
queue does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from durably._core.admission import AdmissionBackend, LocalAdmission, Queue, QueueCall
from durably._core.bounds import PayloadRejectedError, check_text
from durably._core.errors import RunEvicted, StoreFailure
from durably._core.log_context import durably_logger
from durably._engine.defs import unsupported
from durably._engine.defs.events import EngineEvent
from durably._engine.defs.stores import fleet_admission
from durably._engine.flow.step_limits import StepLimiter

if TYPE_CHECKING:
    from durably._core.models import StepCheckpoint

log = durably_logger("durably.flow")

__all__ = ["AdmissionSpec", "FlowControl", "QueueReport", "admission_backend", "queue_call"]

#: `Engine(admission=...)`: a backend, or how to choose one. "auto": fleet-wide on a
#: PostgreSQL store, else this process only; "local": this process only; "store": the
#: store's (PostgreSQL only); "redis": the server of the engine's Redis transport; a
#: "redis://…" URL: that Redis server (`durably._transport.admission_open`).
AdmissionSpec = AdmissionBackend | Literal["auto", "local", "store", "redis"] | str

# The longest queue name or fairness key a step may give (characters): a key is stored with
# every place in line, and a run id (the default key) is at most 255 bytes.
_MAX_NAME = 1024


def admission_backend(
    spec: AdmissionSpec, store: Any, *, owner: str, clock: Callable[[], int]
) -> AdmissionBackend:
    if not isinstance(spec, str):
        return spec
    if spec not in ("auto", "local", "store"):
        raise ValueError(
            f'Engine(admission={spec!r}): expected "auto", "local", "store", "redis", a '
            "redis:// URL or an admission backend"
        )
    if spec != "local":
        shared = fleet_admission(store, owner=owner, clock=clock)
        if shared is not None:
            return shared
        if spec == "store":
            raise ValueError(
                'Engine(admission="store") needs a PostgreSQL store: only there do the '
                'engines of a fleet share admission (use "local" to count per engine)'
            )
    return LocalAdmission(clock=clock)


def queue_call(
    queue: str | None, priority: int | None, fairness_key: str | None
) -> QueueCall | None:
    """What `ctx.step(queue=, priority=, fairness_key=)` asks of a flow-control queue."""
    if queue is None:
        # Outside a queue nothing orders steps by priority yet: refused, never ignored.
        unsupported.refuse_priority(priority, "ctx.step")
        if fairness_key is not None:
            raise ValueError("ctx.step(fairness_key=...) needs queue=: it orders a queue's waiters")
        return None
    if not isinstance(queue, str) or not queue:
        raise TypeError(f"ctx.step(queue=...) takes a queue name, not {queue!r}")
    # Both names reach a text column of the admission backend (PostgreSQL refuses a NUL, no
    # UTF-8 encoder takes a lone surrogate): refused here, at the call, with the argument
    # named — never at the backend, where it would look like an outage.
    check_text("ctx.step(queue=...)", queue, max_len=_MAX_NAME)
    if priority is not None and (
        isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) >= 2**31
    ):
        raise TypeError(f"ctx.step(priority=...) takes a 32-bit whole number, not {priority!r}")
    if fairness_key is not None:
        if not isinstance(fairness_key, str):
            raise TypeError(f"ctx.step(fairness_key=...) takes a string, not {fairness_key!r}")
        check_text("ctx.step(fairness_key=...)", fairness_key, max_len=_MAX_NAME)
    return QueueCall(queue, priority or 0, fairness_key)


class QueuedRun(Protocol):
    """What a queue needs of the run asking for a slot (a run's `Execution`): its id, whether
    its turn is over, whether its body is parked in memory, a way to wait for the next
    retry, and a nudge to re-check."""

    @property
    def run_id(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    @property
    def resident(self) -> bool: ...

    async def wait_for_slot(self, seq: int, retry_at: int) -> None: ...

    def deliver(self, seq: int | None, cp: StepCheckpoint | None) -> None: ...


class _Runs(Protocol):
    def execution(self, run_id: str) -> QueuedRun | None: ...


@dataclass(slots=True)
class _Waiting:
    run_id: str
    seq: int
    queue: str
    since: float  # monotonic seconds of its last ask
    nudged: bool = False  # a release named it while it was asking or not yet parked
    asker: object = None  # the execution (turn) that asked last


@dataclass(slots=True)
class _Held:
    run_id: str
    since: float  # monotonic seconds of its admission
    remote: bool  # the step runs on another machine: only its result (or the TTL) frees it
    queue: str = ""


@dataclass(frozen=True, slots=True)
class QueueReport:
    """One queue on the console and in the metrics (`Engine.queue_stats()`).

    From the backend (fleet-wide on a shared one): `in_flight` (slots held), `waiting` (places
    in line), `window_count` (admissions in the current rate window), `admitted_total` (every
    admission on the backend's state) and `blocked`, why a caller asking now is turned away
    ("concurrency": every slot held; "rate": the window is used up; None). From this engine
    since it started: `admitted` and `denied` (answers it got), `held_here` and
    `waiting_here` (its steps holding a slot, waiting for one)."""

    queue: Queue
    backend: str
    in_flight: int
    waiting: int
    window_count: int
    admitted_total: int
    admitted: int
    denied: int
    held_here: int
    waiting_here: int
    blocked: str | None

    def to_json(self) -> dict[str, Any]:
        q = self.queue
        return {
            "queue": q.name,
            "backend": self.backend,
            "concurrency": q.concurrency,
            "rate": None
            if q.rate_limit is None
            else {"limit": q.rate_limit, "periodMs": q.rate_period_ms},
            "fairness": q.fairness,
            "order": q.order,
            "inFlight": self.in_flight,
            "waiting": self.waiting,
            "windowCount": self.window_count,
            "admittedTotal": self.admitted_total,
            "admitted": self.admitted,
            "denied": self.denied,
            "heldHere": self.held_here,
            "waitingHere": self.waiting_here,
            "blocked": self.blocked,
        }


class _NoSlot:
    """`slot()` of a step without a queue: holds nothing (no generator per step)."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


_NO_SLOT = _NoSlot()


class _Permit:
    """`slot()` under a worker concurrency limit (`Engine(concurrency=…)`): the queue's slot
    first, if any, then one of the limiter's permits — a step parked in a queue's line must
    not hold a permit other steps of this process could run with."""

    __slots__ = ("_inner", "_limiter", "_started")

    def __init__(self, limiter: StepLimiter, inner: _Slot | _NoSlot):
        self._limiter, self._inner = limiter, inner
        self._started = 0.0

    async def __aenter__(self) -> None:
        await self._inner.__aenter__()
        try:
            await self._limiter.acquire()
        except BaseException:
            await self._inner.__aexit__(None, None, None)
            raise
        self._started = time.monotonic()

    async def __aexit__(self, *exc: object) -> None:
        self._limiter.release((time.monotonic() - self._started) * 1000.0)
        await self._inner.__aexit__(*exc)


class _Slot:
    """`slot()` of a queued in-process step: admitted on entry, released on exit."""

    __slots__ = ("_call", "_ex", "_flow", "_held", "_seq")

    def __init__(self, flow: FlowControl, ex: QueuedRun, seq: int, call: QueueCall):
        self._flow, self._ex, self._seq, self._call = flow, ex, seq, call
        self._held = False

    async def __aenter__(self) -> None:
        self._held = await self._flow.acquire(self._ex, self._seq, self._call, remote=False)

    async def __aexit__(self, *exc: object) -> None:
        if self._held:
            self._flow.release(self._ex.run_id, self._seq)


class FlowControl:
    """The queues registered here and the slots this process holds (module docstring)."""

    def __init__(
        self,
        backend: AdmissionBackend,
        *,
        queues: Iterable[Queue],
        runs: _Runs,
        redrive: Callable[[str], Coroutine[Any, Any, None]],
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
    ):
        self._backend = backend
        self._queues: dict[str, Queue] = {}
        for queue in queues:
            self.register(queue)
        self._runs = runs
        self._redrive = redrive
        self._spawn = spawn
        self._held: dict[str, _Held] = {}
        self._waiting: dict[str, _Waiting] = {}
        self._by_run: dict[str, set[str]] = {}
        self._warned: set[str] = set()
        self._renewer: asyncio.Task[None] | None = None
        self._closed = False
        self._limiter: StepLimiter | None = None
        # Answers this engine got, per queue (the console's and the metrics' counters).
        self._admitted: dict[str, int] = {}
        self._denied: dict[str, int] = {}
        backend.on_freed(self._freed)

    # ------------------------------------------------------------------ queues

    def register(self, queue: Queue) -> None:
        """Add a queue, or replace the one registered under its name."""
        if not isinstance(queue, Queue):
            raise TypeError(f"register_queue() takes a durably.Queue, not {queue!r}")
        self._queues[queue.name] = queue

    @property
    def active(self) -> bool:
        """Whether any queue is registered here (else nothing is ever admitted or released)."""
        return bool(self._queues)

    @property
    def backend(self) -> AdmissionBackend:
        return self._backend

    def limit_steps(self, limiter: StepLimiter | None) -> None:
        """Run in-process step handlers under this worker concurrency limiter (`slot()`);
        closed with this object."""
        self._limiter = limiter

    @property
    def limiter(self) -> StepLimiter | None:
        return self._limiter

    def holds(self, run_id: str) -> set[str]:
        """The holders (step ids) of `run_id` holding a slot or a place in line here."""
        return set(self._by_run.get(run_id, ()))

    # ------------------------------------------------------------------ admission

    def slot(
        self, ex: QueuedRun, seq: int, call: QueueCall | None
    ) -> AbstractAsyncContextManager[None]:
        """Hold a slot of `call.queue` for the body of the `async with` (an in-process step's
        handler); no queue: nothing to hold. Under a worker concurrency limit, a permit of
        the limiter too."""
        inner = _NO_SLOT if call is None else _Slot(self, ex, seq, call)
        return inner if self._limiter is None else _Permit(self._limiter, inner)

    async def acquire(
        self, ex: QueuedRun, seq: int, call: QueueCall, *, remote: bool = True
    ) -> bool:
        """Wait until the queue admits step `seq` of the run (True), or False when the queue
        is not registered here. Raises `WorkflowSuspended` in a classic turn that must wait.
        `remote`: the step is dispatched to another machine (see `on_run_event`)."""
        queue = self._queues.get(call.queue)
        if queue is None:
            if call.queue not in self._warned:
                self._warned.add(call.queue)
                log.warning(
                    "queue %r is not registered on this engine: its steps run unbounded "
                    "(register it with Engine(queues=[...]) or engine.register_queue)",
                    call.queue,
                )
            return False
        holder = f"{ex.run_id}:{seq}"
        key = call.fairness_key if call.fairness_key is not None else ex.run_id
        while True:
            # In line before asking: a release that names this holder while the ask is on
            # its way must not be lost (it would cost a whole retry interval).
            waiting = self._waiting.get(holder)
            if waiting is None:
                waiting = self._waiting[holder] = _Waiting(ex.run_id, seq, queue.name, 0.0)
                self._by_run.setdefault(ex.run_id, set()).add(holder)
            waiting.asker = ex
            waiting.since = time.monotonic()
            waiting.nudged = False
            try:
                answer = await self._backend.acquire(queue, holder, key=key, priority=call.priority)
            except PayloadRejectedError:
                # The backend refused the values themselves (every backend maps its own data
                # errors to this): asking again can only fail again, so the step's call fails
                # with the reason instead — retrying it as an outage looped forever.
                self._drop_waiting(holder, waiting)
                raise
            except Exception as exc:
                # A connection-level failure, like a store failure: the turn ends unsettled
                # and recovery resumes it once the backend answers again.
                raise StoreFailure(exc) from exc
            if ex.closed:
                self._orphaned(holder, ex, answer.admitted)
                raise RunEvicted()
            counts = self._admitted if answer.admitted else self._denied
            counts[queue.name] = counts.get(queue.name, 0) + 1
            if answer.admitted:
                if self._waiting.get(holder) is waiting:
                    del self._waiting[holder]
                self._held[holder] = _Held(ex.run_id, time.monotonic(), remote, queue.name)
                self._renew_soon()
                return True
            if waiting.nudged:
                continue
            await ex.wait_for_slot(seq, answer.retry_at)

    def _drop_waiting(self, holder: str, waiting: _Waiting) -> None:
        if self._waiting.get(holder) is waiting:
            del self._waiting[holder]
            self._forget(waiting.run_id, holder)

    def _orphaned(self, holder: str, ex: QueuedRun, admitted: bool) -> None:
        """The turn ended while this branch asked (a classic turn whose sibling branch
        suspended it): the branch must not run its step, and a slot it was just given goes
        back — held by a branch that never runs, it could block the queue (and this very run,
        whose next turn may never get this far) until its TTL. Unless a newer turn of the run
        already holds it or is asking for it: then it is that turn's."""
        waiting = self._waiting.get(holder)
        if waiting is not None and waiting.asker is not ex:
            return  # a newer turn is asking: its answer will be "already yours"
        if not admitted or holder in self._held:
            return
        if waiting is not None:
            del self._waiting[holder]
            self._forget(waiting.run_id, holder)
        self._spawn(self._give_back([holder]))

    def release(self, run_id: str, seq: int) -> None:
        """Give back the slot step `seq` of the run holds here (nothing if it holds none).

        In the background: the step's checkpoint is written right after, and a turn that
        ends meanwhile (a sibling branch suspended it) must find it written — an await here
        would let the next turn replay the step before its result was recorded."""
        holder = f"{run_id}:{seq}"
        held = self._held.pop(holder, None)
        if held is not None:
            self._forget(held.run_id, holder)
            self._spawn(self._give_back([holder]))

    async def release_settled(self, holders: Sequence[str]) -> None:
        """The results of these steps were settled (or dropped) here: their slots are free,
        whichever engine of the fleet admitted them."""
        if self._queues and holders:
            await self._give_back(list(holders))

    def on_run_event(self, event: EngineEvent) -> None:
        """A run that ended here (completed, failed, cancelled) gives back its places in line
        and the slots of its in-process steps. A step running on another machine may still
        be running (a cancel reaches it at best effort), so its slot waits for its result —
        but is no longer renewed here: if no result ever comes, it lapses after its TTL."""
        if event.type not in ("run.completed", "run.failed"):
            return
        give_back: list[str] = []
        for holder in list(self._by_run.get(event.run_id, ())):
            held = self._held.get(holder)
            if held is not None and held.remote:
                del self._held[holder]
                self._forget(held.run_id, holder)
            else:
                give_back.append(holder)
        if give_back:
            self._spawn(self._give_back(give_back))

    async def _give_back(self, holders: list[str]) -> None:
        for holder in holders:
            entry: _Held | _Waiting | None = self._held.pop(holder, None)
            if entry is None:
                entry = self._waiting.pop(holder, None)
            if entry is not None:
                self._forget(entry.run_id, holder)
        try:
            await self._backend.release(*holders)
        except Exception as exc:
            # Not renewed any more, so the slot lapses after its TTL instead of leaking.
            log.warning("flow control: releasing %d slot(s) failed: %s", len(holders), exc)

    def _forget(self, run_id: str, holder: str) -> None:
        mine = self._by_run.get(run_id)
        if mine is not None:
            mine.discard(holder)
            if not mine:
                del self._by_run[run_id]

    def _freed(self, queue: str, holders: Sequence[str]) -> None:
        """A release freed slots of `queue` and these waiters rank first: wake ours."""
        for holder in holders:
            waiting = self._waiting.get(holder)
            if waiting is None:
                continue
            waiting.nudged = True
            execution = self._runs.execution(waiting.run_id)
            if execution is not None and execution.resident:
                execution.deliver(waiting.seq, None)
            else:
                self._spawn(self._redrive(waiting.run_id))

    # ------------------------------------------------------------------ renewal

    def _renew_soon(self) -> None:
        if self._renewer is None and not self._closed:
            self._renewer = asyncio.get_running_loop().create_task(
                self._renew_loop(), name="durably-flow-renew"
            )

    async def _renew_loop(self) -> None:
        while not self._closed:
            ttl_ms = min((q.slot_ttl_ms for q in self._queues.values()), default=30_000)
            await asyncio.sleep(ttl_ms / 3000.0)
            started = time.monotonic()
            self._forget_stale_waiters(started)
            held = list(self._held)
            if not held:
                continue
            try:
                still = await self._backend.renew(held)
            except Exception as exc:
                log.warning("flow control: renewing %d slot(s) failed: %s", len(held), exc)
                continue
            for holder in held:
                entry = self._held.get(holder)
                # Lapsed, or released by another engine (a settled remote result): forget
                # it — unless it was admitted again while the renewal was on its way.
                if holder not in still and entry is not None and entry.since < started:
                    del self._held[holder]
                    self._forget(entry.run_id, holder)

    def _forget_stale_waiters(self, now: float) -> None:
        """Places in line of runs that went elsewhere (or stopped asking) are forgotten here
        once the backend would have pruned them too."""
        for holder, waiting in list(self._waiting.items()):
            queue = self._queues.get(waiting.queue)
            ttl_s = (queue.longest_wait_ms if queue is not None else 60_000) / 1000.0
            if now - waiting.since > ttl_s and waiting.since > 0:
                del self._waiting[holder]
                self._forget(waiting.run_id, holder)

    # ------------------------------------------------------------------ stats

    async def stats(self) -> list[QueueReport]:
        """Every queue registered here, with the backend's counts (one cheap read) and this
        engine's own (module `QueueReport`)."""
        queues = sorted(self._queues.values(), key=lambda q: q.name)
        counted = await self._backend.stats(queues)
        held: dict[str, int] = {}
        for entry in self._held.values():
            held[entry.queue] = held.get(entry.queue, 0) + 1
        waiting: dict[str, int] = {}
        for place in self._waiting.values():
            waiting[place.queue] = waiting.get(place.queue, 0) + 1
        return [
            QueueReport(
                queue=queue,
                backend=type(self._backend).__name__,
                in_flight=st.in_flight,
                waiting=st.waiting,
                window_count=st.window_count,
                admitted_total=st.admitted,
                admitted=self._admitted.get(queue.name, 0),
                denied=self._denied.get(queue.name, 0),
                held_here=held.get(queue.name, 0),
                waiting_here=waiting.get(queue.name, 0),
                blocked=st.blocked(queue),
            )
            for queue, st in zip(queues, counted, strict=True)
        ]

    # ------------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        """Stop renewing and close the backend. Slots still held (steps running on other
        machines) lapse after their TTL; in-process steps finished in the drain."""
        self._closed = True
        if self._limiter is not None:
            await self._limiter.close()  # kept: an engine opened again limits its steps again
        task, self._renewer = self._renewer, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        await self._backend.close()
