"""The processes of the buffered-signal crash tests (run by test_signal_buffer_faults.py).

`python signal_buffer_app.py STORE wait TOKEN RUN_ID` opens an engine on STORE (a SQLite or
PostgreSQL URL), starts (or, started already, takes back) run RUN_ID of `sigbuf.wait`, which
waits for TOKEN twice — the second time for one second at most — and returns both payloads;
it prints `STARTED` and keeps driving runs until it is killed.

`python signal_buffer_app.py STORE send TOKEN PAYLOAD` signals TOKEN with PAYLOAD through a
`durably.Client` (no engine) and exits.

SIGBUF_DIE (environment) names the point where this process SIGKILLs itself:

- `before-take`: the first time a store call is about to consume a row buffered on TOKEN;
- `after-take`: right after a store call consumed one (its statement committed): the old
  engine took the row with one statement and wrote the wait's checkpoint with the next;
- `after-waiter-taken`: right after a store call took TOKEN's waiter for a delivery (the old
  sender took it with one statement and wrote the delivery with the next).

The same for named events: `python signal_buffer_app.py STORE evwait NAME RUN_ID EVENT_ID`
starts run RUN_ID of `sigbuf.evwait`, which waits for event NAME twice (the second time for
one second at most); `python signal_buffer_app.py STORE publish NAME PAYLOAD EVENT_ID`
publishes it with id EVENT_ID from an engine that drives no runs. There the kill points are
the store calls that consume the buffered event EVENT_ID (the old engine removed it with one
statement and wrote the wait's checkpoint with the next) and, for `after-waiter-taken`, those
that take a waiter of event NAME.

The hooks wrap the store's methods by name, so the same script kills the engine at the same
point whichever methods it uses. SIGBUF_INSTANCE sets the engine's instance id.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import durably
from durably import SignalTimeoutError, WorkflowCtx

DIE = os.environ.get("SIGBUF_DIE", "")

# Store methods that consume a buffered row of their first argument's token, and those that
# take a waiter for a delivery (`deliver_signals` takes a list of (token, payload) pairs).
CONSUMERS = ("take_buffered_signal_into", "deliver_buffered_signal")
WAITER_TAKERS = ("deliver_signals", "deliver_buffered_signal")
# Store methods that consume the buffered event named by their first argument (its id), and
# those that take a waiter of an event (its token second for `deliver_buffered_event`).
EVENT_CONSUMERS = ("remove_buffered_event", "take_buffered_event_into", "deliver_buffered_event")
EVENT_WAITER_TAKERS = ("deliver_signals", "deliver_buffered_event")


@durably.workflow("sigbuf.wait")
async def wait_twice(ctx: WorkflowCtx, token: str) -> list[Any]:
    first = await ctx.wait_for_signal(token)
    try:
        second = await ctx.wait_for_signal(token, timeout="1s")
    except SignalTimeoutError:
        second = None  # nothing more arrived: the one signal was delivered once
    return [first, second]


@durably.workflow("sigbuf.evwait")
async def wait_event_twice(ctx: WorkflowCtx, name: str) -> list[Any]:
    first = await ctx.wait_for_event(name)
    try:
        second = await ctx.wait_for_event(name, timeout="1s")
    except SignalTimeoutError:
        second = None  # nothing more arrived: the one event was delivered once
    return [first, second]


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _tokens_of(name: str, args: tuple[Any, ...]) -> list[str]:
    if name == "deliver_signals":
        return [token for token, _ in args[0]]
    if name == "deliver_buffered_event":
        return [args[1]]
    return [args[0]]


def _event_waiter_tokens(event_name: str) -> Callable[[str, tuple[Any, ...]], bool]:
    from durably._engine.defs.event_tokens import event_token_prefix

    prefix = event_token_prefix(event_name)
    return lambda name, args: any(t.startswith(prefix) for t in _tokens_of(name, args))


def _hit(result: Any) -> bool:
    return bool(result) if isinstance(result, list) else result is not None


def _wrap(
    cls: type, name: str, ours_if: Callable[[str, tuple[Any, ...]], bool], *, before: bool
) -> None:
    original: Callable[..., Any] | None = getattr(cls, name, None)
    if original is None:
        return  # a method this version of the store does not have

    async def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        ours = ours_if(name, args)
        if ours and before:
            _die()
        result = await original(self, *args, **kwargs)
        if ours and _hit(result):
            _die()
        return result

    setattr(cls, name, hooked)


def install_hook(token: str) -> None:
    """Kill points on the buffered signals of `token`."""

    def on_token(name: str, args: tuple[Any, ...]) -> bool:
        return token in _tokens_of(name, args)

    _install(CONSUMERS, on_token, WAITER_TAKERS, on_token)


def install_event_hook(event_name: str, event_id: str) -> None:
    """Kill points on the buffered event `event_id` and the waiters of `event_name`."""

    def on_event(name: str, args: tuple[Any, ...]) -> bool:
        return bool(args) and args[0] == event_id

    _install(EVENT_CONSUMERS, on_event, EVENT_WAITER_TAKERS, _event_waiter_tokens(event_name))


def _install(
    consumers: tuple[str, ...],
    consumed: Callable[[str, tuple[Any, ...]], bool],
    takers: tuple[str, ...],
    taken: Callable[[str, tuple[Any, ...]], bool],
) -> None:
    from durably._store.sql import SqlStateStore

    if DIE == "before-take":
        # A row is buffered before the run waits: its first look at the buffer consumes it.
        for name in consumers:
            _wrap(SqlStateStore, name, consumed, before=True)
    elif DIE == "after-take":
        for name in consumers:
            _wrap(SqlStateStore, name, consumed, before=False)
    elif DIE == "after-waiter-taken":
        for name in takers:
            _wrap(SqlStateStore, name, taken, before=False)
    elif DIE:
        raise SystemExit(f"unknown SIGBUF_DIE={DIE!r}")


async def events(store: str, mode: str, name: str) -> None:
    if mode == "publish":
        install_event_hook(name, sys.argv[5])
        async with durably.Engine(store=store, workflows=[], drive=False) as publisher:
            await publisher.publish_event(name, sys.argv[4], id=sys.argv[5])
        print("PUBLISHED", flush=True)
        return
    install_event_hook(name, sys.argv[5])
    await _drive(store, wait_event_twice, name, sys.argv[4])


async def _drive(store: str, workflow: Any, arg: str, run_id: str) -> None:
    """Start (or take back) run `run_id` of `workflow` and drive runs until killed."""
    engine = durably.Engine(
        store=store,
        workflows=[workflow],
        instance_id=os.environ.get("SIGBUF_INSTANCE") or None,
        lease_ms=1500,
        timer_poll_ms=50,
        reconcile_ms=1000,
    )
    async with engine:
        await engine.start(workflow, arg, run_id=run_id)
        print("STARTED", flush=True)
        await asyncio.sleep(3600)


async def main() -> None:
    store, mode, token = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode in ("evwait", "publish"):
        await events(store, mode, token)
        return
    install_hook(token)
    if mode == "send":
        async with durably.Client(store) as client:
            await client.signal(token, sys.argv[4])
        print("SENT", flush=True)
        return
    await _drive(store, wait_twice, token, sys.argv[4])


if __name__ == "__main__":
    asyncio.run(main())
