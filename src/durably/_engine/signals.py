"""Signals: delivery to waiting runs, buffering, re-drive and parent notification
(engine.md §1.7, §1.8, §3.5)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durably._core.models import (
    JSONValue,
    RunResult,
    SignalWaiter,
    StepCheckpoint,
    WorkflowRun,
    delivered_signal,
    utc_from_ms,
)
from durably._engine import driver
from durably._engine.typed_io import PLAIN

if TYPE_CHECKING:
    from durably._engine.engine import Engine


async def signal(
    engine: Engine, token: str, payload: Any, *, want_result: bool = False
) -> RunResult | None:
    """engine.md §3.5: take the waiter and deliver; else buffer, then re-take the waiter
    (a wait that registered meanwhile) and hand it the buffered payload."""
    store = engine.store
    payload = PLAIN.to_json(payload)
    waiter = await store.take_signal_waiter(token)
    if waiter is None:
        await store.buffer_signal(token, payload)
        waiter = await store.take_signal_waiter(token)
        if waiter is None:
            return None
        hit = await store.take_buffered_signal(token)
        if hit is None:
            return None  # the waiting side consumed it itself
        payload = hit.payload
    await deliver(engine, waiter, payload)
    if not want_result:
        return None
    run = await store.get_run(waiter.run_id)
    return RunResult(run.id, run.status, run.output, run.error) if run else None


async def deliver(engine: Engine, waiter: SignalWaiter, payload: JSONValue) -> None:
    """Write the instant `signal:<token>` checkpoint at the waiter's seq, then wake the run."""
    cp = delivered_signal(waiter, payload, utc_from_ms(engine.clock()))
    await engine.store.save_checkpoint(cp)
    await redrive(engine, waiter.run_id, cp)


async def redrive(engine: Engine, run_id: str, cp: StepCheckpoint | None = None) -> None:
    """Wake a run after something it waits for happened (engine.md §1.7 `_redrive`)."""
    execution = engine.executions.get(run_id)
    if execution is not None:
        if execution.resident:
            execution.deliver(cp.seq if cp else None, cp)
        else:
            # A classic turn is ending: queue one more turn after it, so a delivery
            # racing its settle is never left to the reconcile fallback.
            engine.dispatch(run_id)
        return
    if engine.drive_runs and not engine.draining:
        engine.dispatch(run_id, nudge=True)
    else:
        await nudge(engine, run_id)


async def nudge(engine: Engine, run_id: str) -> None:
    """The run is driven elsewhere (another process holds its lease, or this engine does
    not drive): make it due now, so the holder's timer poll wakes it (engine.md §9.4),
    and announce it on the wake bus so that happens within milliseconds."""
    if await driver.update_if_live(engine, run_id, {"wake_at": engine.clock()}):
        await engine.wakes.announce("ready", run_id)


PARENT_TAG_PREFIX = "durable:parent:"


def parent_tag(parent_run_id: str) -> str:
    """The engine-minted tag naming the run that started a child (durably)."""
    return PARENT_TAG_PREFIX + parent_run_id


def may_have_parent(run: WorkflowRun) -> bool:
    return "~retry~" in run.id or any(t.startswith(PARENT_TAG_PREFIX) for t in run.tags or ())


def notify_parent(engine: Engine, run: WorkflowRun | str, completion: dict[str, Any]) -> None:
    """engine.md §1.8: deferred `signal('child:<runId>', completion)`.

    durably: only runs that can have a parent are announced — runs started by a parent
    (tagged `durable:parent:<id>`), retries of runs (`~retry~`), or a bare id (a child
    whose start failed). A top-level run would only leave a buffered completion behind
    that nobody ever takes (three store statements and one orphan row per run).
    """
    if isinstance(run, WorkflowRun):
        if not may_have_parent(run):
            return
        run_id = run.id
        parents = [
            t[len(PARENT_TAG_PREFIX) :] for t in run.tags or () if t.startswith(PARENT_TAG_PREFIX)
        ]
        if parents and "~retry~" not in run_id:
            # Batched per parent (children.ChildMailbox): a fan's completions share
            # one delivery transaction and one wake of the parent per batch.
            engine.mailbox.post(parents[0], run_id, completion)
            return
    else:
        run_id = run

    async def notify() -> None:
        await signal(engine, f"child:{run_id}", completion)
        if "~retry~" in run_id and completion.get("ok"):
            await signal(engine, f"child:{run_id.split('~retry~')[0]}", completion)

    engine.spawn(notify())
