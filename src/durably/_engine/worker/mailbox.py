"""`ChildMailbox`: child completions delivered to their parents in batches.

A finished child's completion is queued per parent; one drain per parent delivers the
queued completions with ONE `deliver_signals` transaction per batch, then wakes the parent at
most once per batch. A parent that is not resident here is re-driven only when the fan's
join barrier opens: no member of the fan is still `running` (a failed completion always
opens it). So a parent waiting on N children costs O(N) store work in total, never O(N²),
and one replay per settled wave at most.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from durably._core.log_context import durably_logger
from durably._core.models import (
    JSONValue,
    StepCheckpoint,
    utc_from_ms,
)
from durably._engine.control import signals
from durably._engine.run.children import deliver_signals, fan_span
from durably._engine.worker.runs import BackgroundTasks, ExecutingRuns

if TYPE_CHECKING:
    from durably._store.protocol import CheckpointStore, StateStore

log = durably_logger("durably.worker")


# Completions delivered per `deliver_signals` call.
MAILBOX_BATCH = 1000


class MailboxRoute(signals.SignalRoute, Protocol):
    """Where the mailbox's completions go: the signal path (buffering a completion nobody
    waits for yet) and the re-drive of a parent that is not resident here."""

    async def redrive(self, run_id: str, cp: StepCheckpoint | None = None) -> None: ...


class MailboxRuns(ExecutingRuns, BackgroundTasks, Protocol):
    """What the mailbox asks of the runs here: is the parent resident (delivered to in
    memory), and where a parent's delivery runs in the background."""


class ChildMailbox:
    """Child completions queued per parent run, delivered in batches (module docstring)."""

    def __init__(self, store: StateStore, runs: MailboxRuns, *, clock: Callable[[], int]):
        self._store = store
        self._runs = runs
        self._clock = clock
        self._route: MailboxRoute | None = None
        self._queues: dict[str, list[tuple[str, JSONValue]]] = {}

    def connect(self, route: MailboxRoute) -> None:
        """The delivery path (it posts to this mailbox in turn, hence set after both exist)."""
        self._route = route

    def _routed(self) -> MailboxRoute:
        assert self._route is not None, "ChildMailbox.connect was not called"
        return self._route

    def post(self, parent_id: str, child_id: str, completion: JSONValue) -> None:
        queue = self._queues.get(parent_id)
        if queue is not None:
            queue.append((f"child:{child_id}", completion))
            return
        self._queues[parent_id] = [(f"child:{child_id}", completion)]
        self._runs.spawn(self._drain(parent_id))

    async def _drain(self, parent_id: str) -> None:
        await asyncio.sleep(0)  # let the rest of a burst of completions queue up
        while True:
            queue = self._queues[parent_id]
            if not queue:
                del self._queues[parent_id]  # no await since the check: a post starts anew
                return
            batch = queue[:MAILBOX_BATCH]
            del queue[:MAILBOX_BATCH]
            try:
                await self._deliver(parent_id, batch)
            except Exception:
                # Decision: a store failure here must not lose completions. Each token
                # goes through the plain signal path (which buffers when needed); whatever
                # still fails is recovered by the parent's replay (its reconcile fallback).
                log.warning("batched child delivery to %s failed; retrying one by one", parent_id)
                for token, completion in batch:
                    try:
                        await signals.signal(self._routed(), token, completion)
                    except Exception:
                        log.exception("delivering %s to %s failed", token, parent_id)

    async def _deliver(self, parent_id: str, batch: list[tuple[str, JSONValue]]) -> None:
        route = self._routed()
        at = utc_from_ms(self._clock())
        written = await deliver_signals(self._store, batch, at)
        delivered = {cp.name[len("signal:") :] for cp in written}
        for token, completion in batch:
            if token in delivered or await self._already_delivered(parent_id, token):
                continue
            # No waiter: buffer it for a wait registered later.
            await signals.signal(route, token, completion)
        by_run: dict[str, list[StepCheckpoint]] = {}
        for cp in written:
            by_run.setdefault(cp.run_id, []).append(cp)
        for run_id, cps in by_run.items():
            await self._wake_parent(run_id, cps)

    async def _already_delivered(self, parent_id: str, token: str) -> bool:
        """The parent's row for this child already holds its completion: a replay of the
        parent read the finished child and delivered it itself (`recover_completions`) while
        this announcement was on its way. Buffering it again would leave a completion nobody
        ever takes (engine completion records never expire)."""
        try:
            row = await self._store.get_latest_checkpoint_by_name(parent_id, f"signal:{token}")
        except Exception:
            return False  # unknown: buffering is the safe side (a wait may still come)
        return row is not None and row.status == "completed"

    async def _wake_parent(self, run_id: str, cps: list[StepCheckpoint]) -> None:
        """At most one wake of the parent per delivered batch, behind the join barrier."""
        execution = self._runs.execution(run_id)
        if execution is not None and execution.resident:
            for cp in cps:
                execution.deliver(cp.seq, cp)  # in memory: no replay, no store work
            return
        if execution is None and await _barrier_closed(self._store, run_id, cps):
            return
        await self._routed().redrive(run_id, cps[-1])


async def _barrier_closed(store: CheckpointStore, run_id: str, cps: list[StepCheckpoint]) -> bool:
    """The join barrier of child fans: closed iff every delivered completion is ok and some
    member of each touched fan is still `running` (one count per fan per batch). A barrier
    that cannot be read counts as open (a spare wake replays harmlessly; a lost one would
    strand the run)."""
    count = store.count_checkpoints
    ranges: set[tuple[int, int]] = set()
    for cp in cps:
        output = cp.output
        if not (isinstance(output, dict) and output.get("ok") is True):
            return False
        span = fan_span(cp.parallel_group)
        if span is None:
            return False
        ranges.add(span)
    try:
        for lo, hi in ranges:
            if await count(run_id, lo, hi, ["running", "pending"]) == 0:
                return False
    except Exception:
        return False
    return True
