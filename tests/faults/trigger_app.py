"""The engine process of the event-trigger crash tests (run by test_trigger_faults.py).

`python trigger_app.py STORE PREFIX FIRST LAST` opens an engine on STORE (a SQLite or
PostgreSQL URL) with four workflows fed by the event `<PREFIX>.evt`: `<PREFIX>.debounced`
(debounce=WINDOW) and `<PREFIX>.batched` (batch=Batch(100, WINDOW)), and the same two per
key, `<PREFIX>.keyed_debounced` and `<PREFIX>.keyed_batched`, whose key is the number's
parity ("k0", "k1": two keys, interleaved). It publishes the events FIRST..LAST-1 (payload:
the number), prints `PUBLISHED` and keeps driving runs until it is killed — the test
SIGKILLs it before the accumulators flush. With FIRST == LAST it publishes nothing and only
drives (the process that recovers after the kill).

Settings (environment): TRIGGER_INSTANCE (instance_id), TRIGGER_WINDOW (the window, default
"2s"), TRIGGER_DIE_IN_FLUSH=1 (SIGKILL this process right after the first target run an
accumulator starts was committed, before the accumulator recorded that it started it),
TRIGGER_DIE_IN_CLOSE=1 (SIGKILL this process right after an accumulator raised its chain's
reopen marker, before it recorded the close).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import durably
from durably import Batch, WorkflowCtx

WINDOW = os.environ.get("TRIGGER_WINDOW", "2s")


def parity(n: int) -> str:
    """The accumulator key of event `n` for the keyed workflows."""
    return f"k{n % 2}"


def workflows(prefix: str) -> list[durably.Workflow[Any, Any]]:
    event = f"{prefix}.evt"

    @durably.workflow(f"{prefix}.debounced", on_event=[event], debounce=WINDOW)
    async def debounced(ctx: WorkflowCtx, payload: int) -> int:
        return payload

    @durably.workflow(f"{prefix}.batched", on_event=[event], batch=Batch(100, WINDOW))
    async def batched(ctx: WorkflowCtx, batch: dict[str, list[int]]) -> list[int]:
        return batch["events"]

    keyed_debounce = durably.Debounce(WINDOW, key=parity)

    @durably.workflow(f"{prefix}.keyed_debounced", on_event=[event], debounce=keyed_debounce)
    async def keyed_debounced(ctx: WorkflowCtx, payload: int) -> int:
        return payload

    keyed_batch = Batch(100, WINDOW, key=parity)

    @durably.workflow(f"{prefix}.keyed_batched", on_event=[event], batch=keyed_batch)
    async def keyed_batched(ctx: WorkflowCtx, batch: dict[str, list[int]]) -> list[int]:
        return batch["events"]

    return [debounced, batched, keyed_debounced, keyed_batched]


def die_in_flush() -> None:
    """SIGKILL this process once the store committed the first event-started target run."""
    from durably._store.sql import SqlStateStore

    original = SqlStateStore.create_run

    async def create_then_die(self: SqlStateStore, run: durably.WorkflowRun) -> None:
        await original(self, run)
        if run.id.startswith("evt:"):
            os.kill(os.getpid(), signal.SIGKILL)

    SqlStateStore.create_run = create_then_die  # type: ignore[method-assign]


def die_in_close() -> None:
    """SIGKILL this process once the store committed the first chain reopen marker."""
    from durably._core.models import BufferedEvent
    from durably._store.sql import SqlStateStore

    original = SqlStateStore.buffer_event

    async def buffer_then_die(self: SqlStateStore, event: BufferedEvent) -> None:
        await original(self, event)
        if event.name.endswith("#next"):
            os.kill(os.getpid(), signal.SIGKILL)

    SqlStateStore.buffer_event = buffer_then_die  # type: ignore[method-assign]


async def main() -> None:
    if os.environ.get("TRIGGER_DIE_IN_FLUSH") == "1":
        die_in_flush()
    if os.environ.get("TRIGGER_DIE_IN_CLOSE") == "1":
        die_in_close()
    store, prefix, first, last = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    engine = durably.Engine(
        store=store,
        workflows=workflows(prefix),
        instance_id=os.environ.get("TRIGGER_INSTANCE") or None,
        lease_ms=1500,
        timer_poll_ms=50,
        reconcile_ms=3000,
    )
    async with engine:
        for n in range(first, last):
            touched = await engine.publish_event(f"{prefix}.evt", n)
            assert touched == 4, touched
        print("PUBLISHED", flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main())
