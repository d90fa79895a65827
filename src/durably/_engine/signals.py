"""Signals: delivery to waiting runs, buffering, re-drive and parent notification.

`signal()` here is the engine's INTERNAL path: it may address any token, the engine's own
waiter namespaces included (child completions, breakpoints, updates). The public
`Engine.signal` checks the token first (`check_external_token`) and always buffers bounded.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from durably._core.bounds import check_size
from durably._core.errors import ReservedTokenError, SignalBufferFullError
from durably._core.models import (
    LIVE_RUN_STATUSES,
    JSONValue,
    RunPatch,
    RunResult,
    StepCheckpoint,
    WorkflowRun,
    utc_from_ms,
)
from durably._core.tokens import reserved_token_hint, reserved_token_kind, token_namespace
from durably._engine.typed_io import PLAIN
from durably._engine.vocab import PARENT_TAG_PREFIX, may_have_parent

if TYPE_CHECKING:
    from durably._engine.dispatch import Dispatcher
    from durably._store.protocol import StateStore

log = logging.getLogger("durably")

BufferMode = Literal["durable", "bounded", "none"]
"""What a signal that finds no waiter does:

- `"durable"`: buffered without expiry or cap — the engine's own completion records (a
  child's completion before its parent joins: losing it would leave the parent waiting);
- `"bounded"`: buffered with the engine's TTL and caps (`Engine(signal_buffer_*=…)`);
  refused with `SignalBufferFullError` over a cap — every signal that came from outside;
- `"none"`: nothing is stored (delivered only to a run waiting now).
"""

# How often a driving engine deletes expired buffered signals (poller.poll_once). Expired
# rows are never delivered whenever they are deleted; this only bounds how long they occupy
# the store.
SWEEP_EVERY_MS = 60_000


class BufferBounds(Protocol):
    """The bounds of the bounded signal buffer (an engine's or a client's
    `SignalBufferPolicy`)."""

    @property
    def ttl_ms(self) -> int: ...

    @property
    def per_token(self) -> int: ...

    @property
    def per_namespace(self) -> int: ...

    @property
    def max_payload_bytes(self) -> int: ...


def check_payload(what: str, payload: JSONValue, bounds: BufferBounds) -> None:
    """Refuse an external payload larger than `max_payload_bytes` (its compact JSON, in
    UTF-8 bytes) with `PayloadTooLargeError`, before anything is delivered or stored: a
    signal or an event is a message, not a place to keep data (pass a reference instead)."""
    limit = bounds.max_payload_bytes
    if payload is None or isinstance(payload, (bool, int, float)):
        return
    if isinstance(payload, str) and len(payload) * 4 + 2 <= limit:
        return  # cannot be over: a character is at most 4 bytes of UTF-8
    encoded = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    check_size(what, len(encoded.encode("utf-8", "surrogatepass")), limit)


class SignalBufferPolicyLike(BufferBounds, Protocol):
    """Buffer bounds plus the time of the next sweep of expired rows."""

    next_sweep_ms: int


class Announcer(Protocol):
    async def announce(self, kind: str, run_id: str) -> None: ...


class CompletionMailbox(Protocol):
    def post(self, parent_id: str, child_id: str, completion: JSONValue) -> None: ...


class SignalRoute(Protocol):
    """What delivering or buffering a signal needs: the store, the buffer's bounds, the
    clock of delivery times, and a way to wake a run whose delivery is written
    (`redrive`): the engine's `Deliveries`, or a client's `ControlPlane`."""

    @property
    def store(self) -> StateStore: ...

    @property
    def signal_buffer(self) -> BufferBounds: ...

    @property
    def clock(self) -> Callable[[], int]: ...

    async def redrive(self, run_id: str, cp: StepCheckpoint | None = None) -> None: ...


def check_external_token(token: object) -> str:
    """The token of an external signal, or a clear error: a token is a non-empty string
    outside the engine's own waiter namespaces (`durably._core.tokens`)."""
    if not isinstance(token, str):
        raise TypeError(f"a signal token must be a str, not {type(token).__name__}")
    if not token:
        raise ValueError("a signal token must not be empty")
    kind = reserved_token_kind(token)
    if kind is not None:
        raise ReservedTokenError(token, kind, reserved_token_hint(token))
    return token


async def signal(
    route: SignalRoute,
    token: str,
    payload: Any,
    *,
    want_result: bool = False,
    buffer: BufferMode = "durable",
) -> RunResult | None:
    """Deliver to the waiter; else buffer (per `buffer`), then hand the oldest buffered
    payload to a wait that registered meanwhile, and wake the run delivered to.

    Each delivery takes the waiter (and the buffered row) in the transaction that writes the
    checkpoint: taken in one statement and written in the next, a crash in between would
    leave the run waiting for a delivery nobody makes any more (and lose a buffered
    payload). The wake-up is not part of it: a lost one is made up by the run's re-check."""
    store = route.store
    payload = PLAIN.to_json(payload)
    if buffer != "durable":
        # Every signal from outside (and `update`): bounded like every other payload. The
        # engine's own completion records were bounded where their values were made.
        check_payload(f"signal payload for {token!r}", payload, route.signal_buffer)
    at = utc_from_ms(route.clock())
    written = await store.deliver_signals([(token, payload)], at)
    cp = written[0] if written else None
    if cp is None:
        if buffer == "none":
            return None
        if buffer == "bounded":
            await buffer_bounded(route, token, payload)
        else:
            await store.buffer_signal(token, payload)
        cp = await store.deliver_buffered_signal(token, at)
        if cp is None:
            return None  # nobody waits yet, or the waiting side consumed it itself
    await route.redrive(cp.run_id, cp)
    if not want_result:
        return None
    run = await store.get_run(cp.run_id)
    return RunResult(run.id, run.status, run.output, run.error) if run else None


async def buffer_bounded(route: SignalRoute, token: str, payload: JSONValue) -> None:
    """Buffer under the engine's TTL and caps (one store statement); over a cap nothing is
    stored and `SignalBufferFullError` says which cap and how to raise it."""
    policy = route.signal_buffer
    refused = await route.store.buffer_signal_bounded(
        token,
        payload,
        ttl_ms=policy.ttl_ms,
        per_token=policy.per_token,
        per_namespace=policy.per_namespace,
    )
    if refused is None:
        return
    if refused == "token":
        cap, option = policy.per_token, "signal_buffer_per_token"
    else:
        cap, option = policy.per_namespace, "signal_buffer_per_namespace"
    raise SignalBufferFullError(token, refused, token_namespace(token), cap, option)


async def sweep_expired_signals(
    store: StateStore, policy: SignalBufferPolicyLike, clock: Callable[[], int]
) -> int:
    """Delete expired buffered signals, at most once per `SWEEP_EVERY_MS` (called by the
    poll loop of a driving engine); the number deleted."""
    now = clock()
    if now < policy.next_sweep_ms:
        return 0
    policy.next_sweep_ms = now + SWEEP_EVERY_MS
    try:
        removed = await store.purge_buffered_signals(expired_only=True)
        # Buffered events expire `ttl_ms` after they were published (accumulator events
        # never: the store keeps them).
        events = await store.purge_expired_events(now - policy.ttl_ms)
    except Exception:
        log.exception("purging expired buffered signals failed; retrying at the next sweep")
        return 0
    if removed or events:
        log.info("purged %d expired buffered signal(s) and %d event(s)", removed, events)
    return removed + events


class Deliveries:
    """Waking runs in this process: a signal's delivery, a re-drive after something a run
    waits for happened, a nudge for a run driven elsewhere, and a finished run's completion
    on its way to its parent. It is the `SignalRoute` of the runtime's internal signals."""

    def __init__(
        self,
        store: StateStore,
        *,
        clock: Callable[[], int],
        signal_buffer: BufferBounds,
        dispatcher: Dispatcher,
        wakes: Announcer,
        mailbox: CompletionMailbox,
    ):
        self._store = store
        self._clock = clock
        self._signal_buffer = signal_buffer
        self._dispatcher = dispatcher
        self._wakes = wakes
        self._mailbox = mailbox

    @property
    def store(self) -> StateStore:
        return self._store

    @property
    def signal_buffer(self) -> BufferBounds:
        return self._signal_buffer

    @property
    def clock(self) -> Callable[[], int]:
        return self._clock

    async def redrive(self, run_id: str, cp: StepCheckpoint | None = None) -> None:
        """Wake a run after something it waits for happened."""
        dispatcher = self._dispatcher
        execution = dispatcher.execution(run_id)
        if execution is not None:
            if execution.resident:
                execution.deliver(cp.seq if cp else None, cp)
            else:
                # A classic turn is ending: queue one more turn after it, so a delivery
                # racing its settle is never left to the reconcile fallback.
                dispatcher.dispatch(run_id)
            return
        if dispatcher.drive_runs and not dispatcher.draining:
            dispatcher.dispatch(run_id, nudge=True)
        else:
            await self.nudge(run_id)

    async def nudge(self, run_id: str) -> None:
        """The run is driven elsewhere (another process holds its lease, or this engine
        does not drive): make it due now, so the holder's timer poll wakes it, and announce
        it on the wake bus so that happens within milliseconds."""
        patch: RunPatch = {"wake_at": self._clock()}
        if await self._store.update_run_if_status(run_id, patch, LIVE_RUN_STATUSES):
            await self._wakes.announce("ready", run_id)

    def notify_parent(self, run: WorkflowRun | str, completion: dict[str, Any]) -> None:
        """Tell a finished run's parent: deferred `signal('child:<runId>', completion)`.

        Only runs that can have a parent are announced — runs started by a parent (tagged
        `durable:parent:<id>`), retries of runs (`~retry~`), or a bare id (a child whose
        start failed). A top-level run would only leave a buffered completion behind that
        nobody ever takes (three store statements and one orphan row per run).
        """
        if isinstance(run, WorkflowRun):
            if not may_have_parent(run):
                return
            run_id = run.id
            parents = [
                t[len(PARENT_TAG_PREFIX) :]
                for t in run.tags or ()
                if t.startswith(PARENT_TAG_PREFIX)
            ]
            if parents and "~retry~" not in run_id:
                # Batched per parent (children.ChildMailbox): a fan's completions share
                # one delivery transaction and one wake of the parent per batch.
                self._mailbox.post(parents[0], run_id, completion)
                return
        else:
            run_id = run

        async def notify() -> None:
            await signal(self, f"child:{run_id}", completion)
            if "~retry~" in run_id and completion.get("ok"):
                await signal(self, f"child:{run_id.split('~retry~')[0]}", completion)

        self._dispatcher.spawn(notify())
