"""Event triggers at run time: which workflows a published event starts, and the two
built-in accumulator workflows behind `debounce=` and `batch=`.

Routing (`start_subscribers`, called by `publish.publish_event`): a workflow whose
`on_event` names the event and whose trigger's `match` accepts the payload is either started
at once (run id `evt:<event id>:<workflow>`, so a redelivered publish with the same id starts
nothing new) or, with `debounce=`/`batch=`, handed to its accumulator: the event is stored
as a buffered event under the name `__evtacc__:<target>` (durable once `publish_event`
returned), the accumulator chain's first run `__evtacc__:<target>` is created unless it
exists, and the chain is woken by a signal on the token `__evtacc__:<target>` that carries
nothing.

The accumulators are ordinary workflows (`__evt_debounce`, `__evt_batch`), so a crash, a
lease move or a restart resumes them from their checkpoints like any run: the quiet period or
batch window runs on durable timers. An accumulator takes events in three moves — read the
oldest stored events without consuming them, record them in a checkpoint (a local step),
then delete them — so a kill at any point either finds them still stored or recorded (the
replay deletes them again, which is a no-op): each event is taken exactly once. It starts
the target from a checkpointed local step with a run id recorded before the start
(`ctx.side_effect`), so a replay of a start that may or may not have happened starts
nothing twice.

Decisions (where this departs from the upstream design, which signals each event's payload
and ends an accumulation with `start_child(target)` and `continue_as_new`), each found by
the kill -9 test (tests/faults/test_trigger_faults.py):

- The payloads do not travel as signals. A wait takes a buffered signal and writes its
  checkpoint in two statements, so a kill between the two loses the event (seen: one event
  of twenty missing from its batch). The signal is only a wake-up: losing one delays the
  accumulator until its next timeout, it loses nothing. Wake-ups carry an expiry and are
  purged by the accumulator when it takes the events they announce.
- `start_child` and `continue_as_new` create their run AFTER the accumulator's checkpoint,
  from a background task: a kill in between loses the target's start (the batch is never
  delivered) or the successor (the chain stops). Here the accumulator creates both itself,
  inside checkpointed local steps (create first, record after; creating is idempotent by
  id), and only then completes. The successor is `<run id>~N` as a continuation would be;
  the target's run is a top-level run (no parent waits for it, so nothing buffers its
  completion).

A long burst never makes one accumulator run's history long: after `FOLD_LIMIT` rounds a
run hands what it holds (the last payload, or the events and the batch's deadline) to its
successor and completes. An idle accumulator looks for stored events every `IDLE_RECHECK_MS`
even without a wake-up, which bounds the delay a lost wake-up can cause.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, cast

from durably._core.errors import (
    DurablyError,
    RunIdConflictError,
    SignalBufferFullError,
    SignalTimeoutError,
    WorkflowNotFoundError,
)
from durably._core.models import BufferedEvent, JSONValue
from durably._core.triggers import (
    ACCUMULATOR_PREFIX,
    BATCH_WORKFLOW,
    DEBOUNCE_WORKFLOW,
    Accumulation,
    EventTrigger,
    accumulator_id,
)
from durably._engine.control import UNPINNED_VERSION, ControlPlane
from durably._engine.ctx import WorkflowCtx, event_matches
from durably._engine.execution import StoreFailure
from durably._engine.registry import Workflow
from durably._engine.signals import SignalRoute, signal
from durably._engine.vocab import next_continuation_id

if TYPE_CHECKING:
    from durably._store.protocol import StateStore

log = logging.getLogger("durably")

# Rounds (a take and a wait) one accumulator run makes before it hands over to its
# successor: bounds the history a replay after a crash reads (four checkpoints a round).
FOLD_LIMIT = 200

# Stored events one round takes at most (a batch takes at most what it still has room for).
TAKE_LIMIT = 500

# How long an idle accumulator waits for a wake-up before it looks for stored events anyway.
IDLE_RECHECK_MS = 300_000

# Starts a run of `workflow` for an event: (workflow, its input, the run id).
EventStart = Callable[[Workflow[Any, Any], Any, str], Awaitable[object]]


class TriggerHost(Protocol):
    """What the accumulators need from the worker runtime that drives them."""

    @property
    def store(self) -> StateStore: ...

    @property
    def plane(self) -> ControlPlane: ...

    def registration(self, name: str, version: str | None = None) -> Workflow[Any, Any] | None: ...

    def latest_workflows(self) -> list[Workflow[Any, Any]]: ...

    def register(self, item: Workflow[Any, Any]) -> None: ...

    def resolve(
        self, workflow: Workflow[Any, Any] | str, version: str | None
    ) -> Workflow[Any, Any]: ...

    def prepare_input(self, workflow: Workflow[Any, Any], input: Any) -> JSONValue: ...

    async def create_run(
        self, wf: Workflow[Any, Any], json_input: JSONValue, *, run_id: str | None
    ) -> str: ...


# The runtimes an Engine installed (`install`): an accumulator body finds its runtime as its
# ctx's host. Weak, so an engine that is gone is not kept alive by it.
_HOSTS: weakref.WeakSet[Any] = weakref.WeakSet()


def install(host: TriggerHost) -> None:
    """Make `host` able to run the accumulators (called by the Engine's constructor)."""
    _HOSTS.add(host)
    ensure_builtins(host)


def ensure_builtins(host: TriggerHost) -> None:
    """Register the built-in accumulators when a workflow registered here uses one (and only
    then: an engine with `workflows=[]` stays a pure step worker, and one without debounce or
    batch lists no workflow it never runs)."""
    if host.registration(DEBOUNCE_WORKFLOW, "1") is not None:
        return
    if any(wf.accumulate is not None for wf in host.latest_workflows()):
        host.register(DEBOUNCE)
        host.register(BATCH)


def refuse_reserved_event(name: str) -> None:
    """The accumulators keep their events under names of their own: a publish (or a wait)
    on such a name would feed or rob one."""
    if name.startswith(ACCUMULATOR_PREFIX):
        raise ValueError(
            f"event name {name!r} is reserved for the engine's event accumulators "
            f"(names starting with {ACCUMULATOR_PREFIX!r})"
        )


# ------------------------------------------------------------------ routing


def accepts(trigger: EventTrigger, name: str, payload: JSONValue) -> bool:
    """Whether `trigger` starts its workflow for the event `name` with `payload`."""
    if trigger.name != name:
        return False
    match = trigger.match
    if match is None:
        return True
    if callable(match):
        try:
            return bool(match(payload))
        except Exception:
            log.exception("the match of event trigger %r raised; treated as no match", name)
            return False
    return event_matches(payload, match)


async def start_subscribers(
    route: SignalRoute,
    name: str,
    payload: JSONValue,
    *,
    event_id: str | None,
    workflows: Iterable[Workflow[Any, Any]],
    start: EventStart,
) -> int:
    """Start (or feed the accumulator of) every workflow whose trigger accepts the event;
    the number touched. A subscriber refused for its input or its registration is skipped
    and logged; a store failure propagates (the publish did not happen for it)."""
    touched = 0
    evt = event_id or str(uuid.uuid4())  # one id per publish, shared by its subscribers
    for wf in list(workflows):
        if not any(accepts(t, name, payload) for t in wf.event_triggers):
            continue
        try:
            if wf.accumulate is None:
                await start(wf, payload, f"evt:{evt}:{wf.name}")
            else:
                await _feed(route, wf.name, wf.accumulate, payload, start)
        except (DurablyError, ValueError, TypeError, LookupError):
            log.exception("on_event start of %s for %s failed", wf.name, name)
            continue
        touched += 1
    return touched


_order_lock = threading.Lock()
_last_ns = 0
_serial = itertools.count()


def _ordered_key() -> tuple[str, int]:
    """An id and a publish time that sort in this process's publish order: stored events are
    read oldest `published_at` first, ties by id, and a wall clock can repeat or step back."""
    global _last_ns
    with _order_lock:
        _last_ns = max(_last_ns + 1, time.time_ns())
        now_ns = _last_ns
    return f"{now_ns:020d}-{next(_serial):09d}-{uuid.uuid4().hex[:12]}", now_ns // 1_000_000


async def _feed(
    route: SignalRoute, target: str, acc: Accumulation, payload: JSONValue, start: EventStart
) -> None:
    """Hand one event to `target`'s accumulator: store it, create the chain's first run
    unless it exists, then wake the chain."""
    head = accumulator_id(target)
    event_key, published_at = _ordered_key()
    await route.store.buffer_event(
        BufferedEvent(id=event_key, name=head, payload=payload, published_at=published_at)
    )
    builtin = DEBOUNCE if acc.kind == "debounce" else BATCH
    try:
        await start(builtin, acc.input_for(target), head)
    except RunIdConflictError:
        pass  # the chain exists as the other kind (a deploy switched debounce and batch)
    try:
        await signal(route, head, None, buffer="bounded")
    except SignalBufferFullError:
        pass  # wake-ups are already waiting for the accumulator; the event is stored


# ------------------------------------------------------------------ the accumulators


def _host_of(ctx: WorkflowCtx) -> TriggerHost:
    host = ctx._host
    if host not in _HOSTS:
        raise RuntimeError("event accumulators run only inside a durably.Engine")
    return cast(TriggerHost, host)


def _ms(ms: int) -> timedelta:
    return timedelta(milliseconds=max(ms, 1))


async def _now_ms(ctx: WorkflowCtx) -> int:
    return int((await ctx.now()).timestamp() * 1000)


async def _take(
    ctx: WorkflowCtx, host: TriggerHost, token: str, limit: int, last_only: bool
) -> tuple[int, list[Any]]:
    """Take up to `limit` stored events, oldest first: (how many, their payloads — only the
    last one when `last_only`). Read, recorded, then deleted: exactly once across kills."""
    store = host.store

    async def take(_log: Any) -> dict[str, Any]:
        try:
            # The wake-ups of the events read below are spent; later ones stay.
            await store.purge_buffered_signals(token=token)
            found = await store.list_buffered_events(token, limit)
        except Exception as exc:
            raise StoreFailure(exc) from exc
        payloads = [e.payload for e in found]
        return {"ids": [e.id for e in found], "payloads": payloads[-1:] if last_only else payloads}

    taken: dict[str, Any] = await ctx.local_step("trigger.take", take)
    for event_id in taken["ids"]:
        try:
            await store.remove_buffered_event(event_id)  # again on a replay: a no-op
        except Exception as exc:
            raise StoreFailure(exc) from exc
    return len(taken["ids"]), list(taken["payloads"])


async def _wake_or(ctx: WorkflowCtx, token: str, ms: int) -> None:
    """Wait for a wake-up, at most `ms`."""
    try:
        await ctx.wait_for_signal(token, timeout=_ms(ms))
    except SignalTimeoutError:
        pass


async def _debounce(ctx: WorkflowCtx, input: dict[str, Any]) -> dict[str, Any]:
    """Wait for events until none came for `windowMs`; start the target with the last
    payload; hand over to the next run of the chain."""
    host = _host_of(ctx)
    target, window = str(input["target"]), int(input["windowMs"])
    token = accumulator_id(target)
    have = "pending" in input
    last = input.get("pending")
    quiet_at = input.get("quietAt")  # when the window since the last event ends
    if have and not isinstance(quiet_at, int):
        quiet_at = await _now_ms(ctx) + window
    for _ in range(FOLD_LIMIT):
        count, payloads = await _take(ctx, host, token, TAKE_LIMIT, last_only=True)
        now = await _now_ms(ctx)
        if count:
            have, last, quiet_at = True, payloads[-1], now + window
            if count == TAKE_LIMIT:
                continue  # more are stored: take them before waiting
        if not have:
            await _wake_or(ctx, token, IDLE_RECHECK_MS)
            continue
        assert isinstance(quiet_at, int)
        if now >= quiet_at:
            outcome = await _deliver(ctx, host, target, last)
            await _hand_over(ctx, host, input, {})
            return outcome
        await _wake_or(ctx, token, quiet_at - now)
    carry = {"pending": last, "quietAt": quiet_at} if have else {}
    return await _hand_over(ctx, host, input, carry)


async def _batch(ctx: WorkflowCtx, input: dict[str, Any]) -> dict[str, Any]:
    """Collect events until `maxSize` of them, or `windowMs` after the first was taken;
    start the target with `{"events": [...]}` in publish order; hand over."""
    host = _host_of(ctx)
    target, window = str(input["target"]), int(input["windowMs"])
    max_size = int(input["maxSize"])
    token = accumulator_id(target)
    events: list[Any] = list(input.get("events") or [])
    deadline = input.get("deadline")
    for _ in range(FOLD_LIMIT):
        room, more = max_size - len(events), False
        if room > 0:
            limit = min(room, TAKE_LIMIT)
            count, payloads = await _take(ctx, host, token, limit, last_only=False)
            events.extend(payloads)
            more = count == limit < room  # cut by TAKE_LIMIT: more may be stored
        now = await _now_ms(ctx)
        if events and not isinstance(deadline, int):
            deadline = now + window
        if events and (len(events) >= max_size or (isinstance(deadline, int) and now >= deadline)):
            outcome = await _deliver(ctx, host, target, {"events": events})
            await _hand_over(ctx, host, input, {})
            return outcome
        if more:
            continue
        await _wake_or(ctx, token, deadline - now if isinstance(deadline, int) else IDLE_RECHECK_MS)
    carry = {"events": events, "deadline": deadline} if events else {}
    return await _hand_over(ctx, host, input, carry)


async def _deliver(
    ctx: WorkflowCtx, host: TriggerHost, target: str, payload: Any
) -> dict[str, Any]:
    """Start the target with `payload` exactly once: its run id is recorded first, and the
    start is idempotent by that id, so a replay of a start cut short starts nothing new."""
    run_id: str = await ctx.side_effect(lambda: f"evt:{uuid.uuid4()}:{target}")

    async def fire(_log: Any) -> dict[str, Any]:
        try:
            try:
                wf = host.resolve(target, None)
            except WorkflowNotFoundError:
                # Not registered in the engine that runs the accumulator (a fleet whose
                # engines register different workflows): started by name, the engine that
                # has it validates the input at its first turn. Never dropped for that.
                await host.plane.create_run(target, UNPINNED_VERSION, payload, run_id=run_id)
                return {"target": target, "started": run_id}
            json_input = host.prepare_input(wf, payload)
            await host.create_run(wf, json_input, run_id=run_id)
        except (DurablyError, ValueError, TypeError, LookupError) as exc:
            # As for an event that starts its workflow directly: a target that is gone or
            # refuses the input is skipped (logged), and the accumulator carries on.
            log.warning("event trigger of %s: not started: %s", target, exc)
            return {"target": target, "started": None, "error": str(exc)}
        except Exception as exc:
            raise StoreFailure(exc) from exc  # resume from the last checkpoint later
        return {"target": target, "started": run_id}

    result: dict[str, Any] = await ctx.local_step("trigger.deliver", fire)
    return result


async def _hand_over(
    ctx: WorkflowCtx, host: TriggerHost, input: dict[str, Any], carry: dict[str, Any]
) -> dict[str, Any]:
    """Create the chain's next run (`<id>~N`) before this one completes. Its configuration
    is the target's current one (a deploy that changed the window applies from the next
    accumulation on); `carry` is what this run collected and has not delivered."""
    target = str(input["target"])
    next_id = next_continuation_id(ctx.run_id)

    async def create(_log: Any) -> str:
        registered = host.registration(target)
        acc = registered.accumulate if registered is not None else None
        builtin = DEBOUNCE if ctx.workflow == DEBOUNCE_WORKFLOW else BATCH
        successor = {k: v for k, v in input.items() if k not in _CARRIED}
        if acc is not None:
            builtin = DEBOUNCE if acc.kind == "debounce" else BATCH
            successor = acc.input_for(target)
        successor.update(_carry_as(builtin.name, carry))
        try:
            await host.create_run(builtin, successor, run_id=next_id)
        except RunIdConflictError:
            pass  # created by an earlier attempt of this step, before a deploy
        except Exception as exc:
            raise StoreFailure(exc) from exc
        return next_id

    created: str = await ctx.local_step("trigger.next", create)
    return {"target": target, "next": created, "carried": bool(carry)}


_CARRIED = ("pending", "quietAt", "events", "deadline")


def _carry_as(kind: str, carry: dict[str, Any]) -> dict[str, Any]:
    """What a run hands over, in the shape its successor's kind reads."""
    if not carry:
        return {}
    if kind == DEBOUNCE_WORKFLOW:
        if "pending" in carry:
            return carry
        return {"pending": carry["events"][-1]}  # debounce keeps only the last payload
    if "events" in carry:
        return carry
    return {"events": [carry["pending"]]}


DEBOUNCE: Workflow[dict[str, Any], dict[str, Any]] = Workflow(_debounce, DEBOUNCE_WORKFLOW, "1")
BATCH: Workflow[dict[str, Any], dict[str, Any]] = Workflow(_batch, BATCH_WORKFLOW, "1")


__all__ = [
    "BATCH",
    "DEBOUNCE",
    "FOLD_LIMIT",
    "accepts",
    "ensure_builtins",
    "install",
    "refuse_reserved_event",
    "start_subscribers",
]
