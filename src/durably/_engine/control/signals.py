"""Signals: delivery to waiting runs, buffering, re-drive and parent notification.

`signal()` here is the engine's INTERNAL path: it may address any token, the engine's own
waiter namespaces included (child completions, breakpoints, updates). The public
`Engine.signal` checks the token first (`check_external_token`) and always buffers bounded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from durably._core.bounds import DEFAULT_MAX_PAYLOAD_BYTES, check_size
from durably._core.errors import ReservedTokenError, SignalBufferFullError
from durably._core.log_context import durably_logger
from durably._core.models import (
    JSONValue,
    RunResult,
    StepCheckpoint,
    utc_from_ms,
)
from durably._core.tokens import reserved_token_hint, reserved_token_kind, token_namespace
from durably._engine.defs.typed_io import PLAIN
from durably._store.protocol import BufferedSignalAdmin, EventStore

if TYPE_CHECKING:
    from durably._engine.defs.options import EngineOptions
    from durably._store.protocol import StateStore

log = durably_logger("durably.engine")

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


class ExpiringBuffers(BufferedSignalAdmin, EventStore, Protocol):
    """What the sweep of expired buffered signals and events needs of the store."""


async def sweep_expired_signals(
    store: ExpiringBuffers, policy: SignalBufferPolicyLike, clock: Callable[[], int]
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


@dataclass(slots=True)
class SignalBufferPolicy:
    """The bounds an engine (or a client) puts on external signals and events: the buffer's
    TTL and caps, the largest payload (`max_payload_bytes`), and its sweep schedule."""

    ttl_ms: int
    per_token: int
    per_namespace: int
    next_sweep_ms: int = 0  # engine clock; signals.sweep_expired_signals
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES


def buffer_policy(options: EngineOptions) -> SignalBufferPolicy:
    """The signal-buffer bounds of an engine's or a client's options (already validated
    when the options were built)."""
    return SignalBufferPolicy(
        ttl_ms=options.signal_buffer_ttl_ms,
        per_token=options.signal_buffer_per_token,
        per_namespace=options.signal_buffer_per_namespace,
        max_payload_bytes=options.max_payload_bytes,
    )
