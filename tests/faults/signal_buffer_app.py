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
CONSUMERS = ("take_buffered_signal", "take_buffered_signal_into", "deliver_buffered_signal")
WAITER_TAKERS = ("take_signal_waiter", "deliver_signals", "deliver_buffered_signal")


@durably.workflow("sigbuf.wait")
async def wait_twice(ctx: WorkflowCtx, token: str) -> list[Any]:
    first = await ctx.wait_for_signal(token)
    try:
        second = await ctx.wait_for_signal(token, timeout="1s")
    except SignalTimeoutError:
        second = None  # nothing more arrived: the one signal was delivered once
    return [first, second]


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _tokens_of(name: str, args: tuple[Any, ...]) -> list[str]:
    if name == "deliver_signals":
        return [token for token, _ in args[0]]
    return [args[0]]


def _hit(result: Any) -> bool:
    return bool(result) if isinstance(result, list) else result is not None


def _wrap(cls: type, name: str, token: str, *, before: bool) -> None:
    original: Callable[..., Any] | None = getattr(cls, name, None)
    if original is None:
        return  # a method this version of the store does not have

    async def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        ours = token in _tokens_of(name, args)
        if ours and before:
            _die()
        result = await original(self, *args, **kwargs)
        if ours and _hit(result):
            _die()
        return result

    setattr(cls, name, hooked)


def install_hook(token: str) -> None:
    from durably._store.sql import SqlStateStore

    if DIE == "before-take":
        # A row is buffered before the run waits: its first look at the buffer consumes it.
        for name in CONSUMERS:
            _wrap(SqlStateStore, name, token, before=True)
    elif DIE == "after-take":
        for name in CONSUMERS:
            _wrap(SqlStateStore, name, token, before=False)
    elif DIE == "after-waiter-taken":
        for name in WAITER_TAKERS:
            _wrap(SqlStateStore, name, token, before=False)
    elif DIE:
        raise SystemExit(f"unknown SIGBUF_DIE={DIE!r}")


async def main() -> None:
    store, mode, token = sys.argv[1], sys.argv[2], sys.argv[3]
    install_hook(token)
    if mode == "send":
        async with durably.Client(store) as client:
            await client.signal(token, sys.argv[4])
        print("SENT", flush=True)
        return
    engine = durably.Engine(
        store=store,
        workflows=[wait_twice],
        instance_id=os.environ.get("SIGBUF_INSTANCE") or None,
        lease_ms=1500,
        timer_poll_ms=50,
        reconcile_ms=1000,
    )
    async with engine:
        await engine.start(wait_twice, token, run_id=sys.argv[4])
        print("STARTED", flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main())
