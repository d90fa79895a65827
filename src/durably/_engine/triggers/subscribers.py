"""Event triggers at run time: which workflows a published event starts, and the two
built-in accumulator workflows behind `debounce=` and `batch=`.

Routing (`plan_subscribers` then `start_subscribers`, called by `publish.publish_event`): a
workflow whose `on_event` names the event and whose trigger's `match` accepts the payload is
either started at once (run id `evt:<event id>:<workflow>`, so a redelivered publish with the
same id starts nothing new) or, with `debounce=`/`batch=`, handed to an accumulator chain:
the target's shared one, or with `key=` the one of the event's key. A chain is named by
`accumulator_id(namespace, target, key)` (`__evtacc__:<namespace>:<target>[:<key>]`, each
part escaped): the event is stored as a buffered event under that name (durable once
`publish_event` returned), the chain's current run is created unless it exists, and the
chain is woken by a signal on the token of the same name that carries nothing. The keys are
computed before anything is published: a key function that fails refuses the whole publish.

The accumulators are ordinary workflows (`__evt_debounce`, `__evt_batch`), so a crash, a
lease move or a restart resumes them from their checkpoints like any run: the quiet period or
batch window runs on durable timers. An accumulator takes events in three moves — read the
oldest stored events without consuming them, record them in a checkpoint (a local step),
then delete them — so a kill at any point either finds them still stored or recorded (the
replay deletes them again, which is a no-op): each event is taken exactly once. It starts
the target from a checkpointed local step with a run id recorded before the start
(`ctx.side_effect`), so a replay of a start that may or may not have happened starts
nothing twice.

A chain has one run taking its events at a time: `<id>`, `<id>~1`, `<id>~2`, … A run that
has nothing left to hold CLOSES the chain instead of waiting: an idle key costs no run, no
timer and no polling (one per order id would never end otherwise). Closing and reopening
meet on a marker stored under `<id>#next`, whose value is the index of the run a publisher
creates: the closing run `~i` first raises the marker to `i+1`, then looks for stored
events — any there, it creates `~i+1` itself and completes; none, it completes. A publisher
stores its event, then reads the marker and creates that run (idempotent by id). Either the
publisher's event was stored before the closing run looked (the run sees it), or the marker
was raised before the publisher read it (the publisher creates `~i+1`); a run that raised
the marker takes no event any more, so `~i+1` never runs beside it. Until a run closes, the
marker names an earlier run of the chain, which exists: a publisher's create changes nothing.
The marker only ever rises: the replay of a close cut short by a crash may come after the
run it named has run and closed again, and must not send publishers back to a finished run.

Decisions (where this departs from the upstream design, which signals each event's payload
and ends an accumulation with `start_child(target)` and `continue_as_new`), each found by
the kill -9 test (tests/faults/test_trigger_faults.py):

- The payloads do not travel as signals. A wait takes a buffered signal and writes its
  checkpoint in two statements, so a kill between the two loses the event (seen: one event
  of twenty missing from its batch). The signal is only a wake-up: losing one delays the
  accumulator until its current window ends, it loses nothing. Wake-ups carry an expiry and
  are purged by the accumulator when it takes the events they announce.
- `start_child` and `continue_as_new` create their run AFTER the accumulator's checkpoint,
  from a background task: a kill in between loses the target's start (the batch is never
  delivered) or the successor (the chain stops). Here the accumulator creates both itself,
  inside checkpointed local steps (create first, record after; creating is idempotent by
  id), and only then completes. The target's run is a top-level run (no parent waits for
  it, so nothing buffers its completion).

A long burst never makes one accumulator run's history long: after `FOLD_LIMIT` rounds a
run hands what it holds (the last payload, or the events and the batch's deadline) to its
successor and completes.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from durably._core.errors import (
    DurablyError,
    RunIdConflictError,
    SignalBufferFullError,
    SignalTimeoutError,
    StoreFailure,
    WorkflowNotFoundError,
)
from durably._core.log_context import durably_logger
from durably._core.models import BufferedEvent, JSONValue
from durably._core.triggers import (
    BATCH_WORKFLOW,
    DEBOUNCE_WORKFLOW,
    EventTrigger,
    accumulator_id,
    key_of,
)
from durably._engine.control.plane import ControlPlane
from durably._engine.control.signals import SignalRoute, signal
from durably._engine.control.start import StartRequest
from durably._engine.defs.event_tokens import event_matches
from durably._engine.defs.registry import Workflow
from durably._engine.run.ctx import WorkflowCtx

if TYPE_CHECKING:
    from durably._store.protocol import StateStore

log = durably_logger("durably.engine")

# Rounds (a take and a wait) one accumulator run makes before it hands over to its
# successor: bounds the history a replay after a crash reads (four checkpoints a round).
FOLD_LIMIT = 200

# Stored events one round takes at most (a batch takes at most what it still has room for).
TAKE_LIMIT = 500

# Markers read at once: a chain keeps one (two for the instant a closing run raises it).
_MARKER_READ = 16

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
        self, wf: Workflow[Any, Any], json_input: JSONValue, request: StartRequest
    ) -> str: ...


def install(host: TriggerHost) -> None:
    """Make `host` able to run the accumulators (called by the Engine's constructor)."""
    ensure_builtins(host)


def ensure_builtins(host: TriggerHost) -> None:
    """Register the built-in accumulators when a workflow registered here uses one (and only
    then: an engine with `workflows=[]` stays a pure step worker, and one without debounce or
    batch lists no workflow it never runs)."""
    if host.registration(DEBOUNCE_WORKFLOW, "1") is not None:
        return
    if any(wf.accumulate is not None for wf in host.latest_workflows()):
        for accumulator in accumulators(host):
            host.register(accumulator)


def accumulators(host: TriggerHost) -> tuple[Workflow[Any, Any], Workflow[Any, Any]]:
    """The debounce and batch accumulators as workflows of `host`: their bodies are given
    the runtime they store events in and start runs through, instead of finding it in the
    run's context."""

    async def debounce(ctx: WorkflowCtx, input: dict[str, Any]) -> dict[str, Any]:
        return await _debounce(ctx, host, input)

    async def batch(ctx: WorkflowCtx, input: dict[str, Any]) -> dict[str, Any]:
        return await _batch(ctx, host, input)

    debounce.__doc__, batch.__doc__ = _debounce.__doc__, _batch.__doc__
    return (
        Workflow(debounce, DEBOUNCE_WORKFLOW, DEBOUNCE.version),
        Workflow(batch, BATCH_WORKFLOW, BATCH.version),
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


@dataclass(frozen=True, slots=True)
class Subscriber:
    """A workflow an event starts or feeds, and the accumulator key of the event for it
    (None: started directly, or the target's shared accumulator)."""

    workflow: Workflow[Any, Any]
    key: str | None = None


def plan_subscribers(
    name: str, payload: JSONValue, workflows: Iterable[Workflow[Any, Any]]
) -> list[Subscriber]:
    """The workflows whose triggers accept the event, each with its accumulator key. Raises
    `EventKeyError` when a key function fails, before anything was published for the event:
    the caller learns of it and may publish again, and no other subscriber got it once."""
    out = []
    for wf in list(workflows):
        if not any(accepts(t, name, payload) for t in wf.event_triggers):
            continue
        acc = wf.accumulate
        out.append(Subscriber(wf, None if acc is None else key_of(acc, wf.name, name, payload)))
    return out


async def start_subscribers(
    route: SignalRoute,
    name: str,
    payload: JSONValue,
    *,
    event_id: str | None,
    subscribers: Iterable[Subscriber],
    namespace: str | None,
    start: EventStart,
) -> int:
    """Start (or feed the accumulator of) every subscriber of the event (`plan_subscribers`);
    the number touched. A subscriber refused for its input or its registration is skipped
    and logged; a store failure propagates (the publish did not happen for it)."""
    touched = 0
    evt = event_id or str(uuid.uuid4())  # one id per publish, shared by its subscribers
    for sub in list(subscribers):
        wf = sub.workflow
        try:
            if wf.accumulate is None:
                await start(wf, payload, f"evt:{evt}:{wf.name}")
            else:
                await _feed(route, namespace or "default", wf, sub.key, payload, start)
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


def _marker_name(chain: str) -> str:
    """Where a chain's reopen marker is stored: never the name of a chain (the last part of
    an accumulator id is escaped, without '#', or '#' and 32 hex digits)."""
    return f"{chain}#next"


def _run_of(chain: str, index: int) -> str:
    """The id of a chain's run `index` (`<chain>`, then `<chain>~1`, … as continuations)."""
    return chain if index == 0 else f"{chain}~{index}"


def _index_of(chain: str, run_id: str) -> int:
    if run_id == chain:
        return 0
    base, sep, n = run_id.rpartition("~")
    if base != chain or not sep or not n.isdigit():
        raise ValueError(f"run {run_id!r} is not a run of the accumulator chain {chain!r}")
    return int(n)


def _marker_value(event: BufferedEvent) -> int:
    value = event.payload
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


async def _reopen_index(store: StateStore, chain: str) -> int:
    """The index of the chain's run a publisher creates: the highest marker (0: none)."""
    found = await store.list_buffered_events(_marker_name(chain), _MARKER_READ)
    return max((_marker_value(e) for e in found), default=0)


async def _feed(
    route: SignalRoute,
    namespace: str,
    wf: Workflow[Any, Any],
    key: str | None,
    payload: JSONValue,
    start: EventStart,
) -> None:
    """Hand one event to its accumulator chain: store it, create the run the chain's marker
    names unless it exists (it does unless the chain closed), then wake the chain."""
    acc = wf.accumulate
    assert acc is not None
    chain = accumulator_id(namespace, wf.name, key)
    event_key, published_at = _ordered_key()
    await route.store.buffer_event(
        BufferedEvent(id=event_key, name=chain, payload=payload, published_at=published_at)
    )
    run_id = _run_of(chain, await _reopen_index(route.store, chain))
    builtin = DEBOUNCE if acc.kind == "debounce" else BATCH
    try:
        await start(builtin, acc.input_for(wf.name, chain, namespace, key), run_id)
    except RunIdConflictError:
        pass  # the chain exists as the other kind (a deploy switched debounce and batch)
    try:
        await signal(route, chain, None, buffer="bounded")
    except SignalBufferFullError:
        pass  # wake-ups are already waiting for the accumulators; the event is stored


# ------------------------------------------------------------------ the accumulators


@dataclass(frozen=True, slots=True)
class _Chain:
    """The accumulator run's place: its chain (event name and wake token), target,
    namespace and index in the chain."""

    name: str
    target: str
    namespace: str | None
    index: int

    @classmethod
    def of(cls, ctx: WorkflowCtx, input: dict[str, Any]) -> _Chain:
        name = str(input["chain"])
        namespace = input.get("namespace")
        ns = namespace if isinstance(namespace, str) else None
        return cls(name, str(input["target"]), ns, _index_of(name, ctx.run_id))


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


async def _debounce(ctx: WorkflowCtx, host: TriggerHost, input: dict[str, Any]) -> dict[str, Any]:
    """Wait for events until none came for `windowMs`; start the target with the last
    payload; close the chain, or hand over when more events came."""
    chain = _Chain.of(ctx, input)
    window = int(input["windowMs"])
    have = "pending" in input
    last = input.get("pending")
    quiet_at = input.get("quietAt")  # when the window since the last event ends
    if have and not isinstance(quiet_at, int):
        quiet_at = await _now_ms(ctx) + window
    for _ in range(FOLD_LIMIT):
        count, payloads = await _take(ctx, host, chain.name, TAKE_LIMIT, last_only=True)
        now = await _now_ms(ctx)
        if count:
            have, last, quiet_at = True, payloads[-1], now + window
            if count == TAKE_LIMIT:
                continue  # more are stored: take them before waiting
        if not have:
            return await _finish(ctx, host, chain, input, {"target": chain.target})
        assert isinstance(quiet_at, int)
        if now >= quiet_at:
            outcome = await _deliver(ctx, host, chain, last)
            return await _finish(ctx, host, chain, input, outcome)
        await _wake_or(ctx, chain.name, quiet_at - now)
    carry = {"pending": last, "quietAt": quiet_at} if have else {}
    return await _hand_over(ctx, host, chain, input, carry)


async def _batch(ctx: WorkflowCtx, host: TriggerHost, input: dict[str, Any]) -> dict[str, Any]:
    """Collect events until `maxSize` of them, or `windowMs` after the first was taken;
    start the target with `{"events": [...]}` in publish order; close the chain, or hand
    over when more events came."""
    chain = _Chain.of(ctx, input)
    window, max_size = int(input["windowMs"]), int(input["maxSize"])
    events: list[Any] = list(input.get("events") or [])
    deadline = input.get("deadline")
    for _ in range(FOLD_LIMIT):
        room, more = max_size - len(events), False
        if room > 0:
            limit = min(room, TAKE_LIMIT)
            count, payloads = await _take(ctx, host, chain.name, limit, last_only=False)
            events.extend(payloads)
            more = count == limit < room  # cut by TAKE_LIMIT: more may be stored
        now = await _now_ms(ctx)
        if not events:
            return await _finish(ctx, host, chain, input, {"target": chain.target})
        if not isinstance(deadline, int):
            deadline = now + window
        if len(events) >= max_size or now >= deadline:
            outcome = await _deliver(ctx, host, chain, {"events": events})
            return await _finish(ctx, host, chain, input, outcome)
        if more:
            continue
        await _wake_or(ctx, chain.name, deadline - now)
    carry = {"events": events, "deadline": deadline} if events else {}
    return await _hand_over(ctx, host, chain, input, carry)


async def _deliver(
    ctx: WorkflowCtx, host: TriggerHost, chain: _Chain, payload: Any
) -> dict[str, Any]:
    """Start the target with `payload` exactly once: its run id is recorded first, and the
    start is idempotent by that id, so a replay of a start cut short starts nothing new."""
    target, namespace = chain.target, chain.namespace
    run_id: str = await ctx.side_effect(lambda: f"evt:{uuid.uuid4()}:{target}")

    async def fire(_log: Any) -> dict[str, Any]:
        try:
            request = StartRequest(workflow=target, run_id=run_id, namespace=namespace)
            try:
                wf = host.resolve(target, None)
            except WorkflowNotFoundError:
                # Not registered in the engine that runs the accumulator (a fleet whose
                # engines register different workflows): started by name, the engine that
                # has it validates the input at its first turn. Never dropped for that.
                await host.plane.create_run(request, payload)
                return {"target": target, "started": run_id}
            json_input = host.prepare_input(wf, payload)
            await host.create_run(wf, json_input, request)
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


async def _finish(
    ctx: WorkflowCtx,
    host: TriggerHost,
    chain: _Chain,
    input: dict[str, Any],
    outcome: dict[str, Any],
) -> dict[str, Any]:
    """End this run holding nothing: close the chain (module docstring), or, when events
    were stored meanwhile, create the next run to take them."""
    store = host.store
    marker, reopen_at = _marker_name(chain.name), chain.index + 1

    async def close(_log: Any) -> dict[str, bool]:
        try:
            found = await store.list_buffered_events(marker, _MARKER_READ)
            # Never lower the marker: a replay of this step may come after the runs it
            # named have run and closed again.
            top = max((_marker_value(e) for e in found), default=0)
            if top < reopen_at:
                _, at = _ordered_key()
                await store.buffer_event(
                    BufferedEvent(
                        id=f"{marker}~{reopen_at}", name=marker, payload=reopen_at, published_at=at
                    )
                )
                top = reopen_at
            for event in found:
                if _marker_value(event) < top:
                    await store.remove_buffered_event(event.id)
            await store.purge_buffered_signals(token=chain.name)  # no run waits on them now
            # Looked for after the marker was raised: see the module docstring.
            return {"closed": not await store.list_buffered_events(chain.name, 1)}
        except Exception as exc:
            raise StoreFailure(exc) from exc

    closed: dict[str, bool] = await ctx.local_step("trigger.close", close)
    if closed["closed"]:
        return {**outcome, "closed": True}
    return {**outcome, **await _hand_over(ctx, host, chain, input, {})}


async def _hand_over(
    ctx: WorkflowCtx,
    host: TriggerHost,
    chain: _Chain,
    input: dict[str, Any],
    carry: dict[str, Any],
) -> dict[str, Any]:
    """Create the chain's next run (`<chain>~<index+1>`) before this one completes. Its
    configuration is the target's current one (a deploy that changed the window applies from
    the next run on); `carry` is what this run collected and has not delivered."""
    target = chain.target
    next_id = _run_of(chain.name, chain.index + 1)

    async def create(_log: Any) -> str:
        registered = host.registration(target)
        acc = registered.accumulate if registered is not None else None
        builtin = DEBOUNCE if ctx.workflow == DEBOUNCE_WORKFLOW else BATCH
        successor = {k: v for k, v in input.items() if k not in _CARRIED}
        if acc is not None:
            builtin = DEBOUNCE if acc.kind == "debounce" else BATCH
            key = input.get("key")
            namespace = chain.namespace or "default"
            key = key if isinstance(key, str) else None
            successor = acc.input_for(target, chain.name, namespace, key)
        successor.update(_carry_as(builtin.name, carry))
        try:
            request = StartRequest(workflow=builtin.name, run_id=next_id, namespace=chain.namespace)
            await host.create_run(builtin, successor, request)
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


async def _unhosted(ctx: WorkflowCtx, input: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError("event accumulators run only inside a durably.Engine")


# The accumulators as the runs a publisher or a closing run creates (name, version, input
# codec). Registered as is, their body refuses to run: an engine registers the ones
# `accumulators` binds to it.
DEBOUNCE: Workflow[dict[str, Any], dict[str, Any]] = Workflow(_unhosted, DEBOUNCE_WORKFLOW, "1")
BATCH: Workflow[dict[str, Any], dict[str, Any]] = Workflow(_unhosted, BATCH_WORKFLOW, "1")


__all__ = [
    "BATCH",
    "DEBOUNCE",
    "FOLD_LIMIT",
    "Subscriber",
    "accepts",
    "accumulators",
    "ensure_builtins",
    "install",
    "plan_subscribers",
    "start_subscribers",
]
