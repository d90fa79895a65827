"""Workflow start admission of the in-memory reference store (the contract is written on
`durably._store.protocol.StateStore`).

Each method runs without suspending (the awaited `create_run` never yields), so every check
and the write it allows are one atomic step with respect to other asyncio tasks — the same
guarantee the SQL store gets from one transaction under a per-key lock.

A part object of `InMemoryStateStore` (which forwards the four contract methods to it). It
is given the store's `MemoryTables` (the runs it counts and re-tags, the clock, the call
counter) and the store's own `create_run`, so a gated start writes the run exactly as a
plain start does (normalised, indexed, counted); the dedup keys are its own state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence

from durably._core.models import LIVE_RUN_STATUSES, WorkflowRun, utc_from_ms
from durably._core.quota import (
    SINGLETON_ACTIVE_STATUSES,
    SINGLETON_ADMITTED_TAG,
    StartGate,
    StartOutcome,
    singleton_admits,
    singleton_line,
)
from durably._store.memory_tables import MemoryTables


class MemoryStartAdmission:
    """Gated starts and singleton admission over the runs of `tables`."""

    def __init__(
        self, tables: MemoryTables, create_run: Callable[[WorkflowRun], Awaitable[None]]
    ) -> None:
        self._tables = tables
        self._create_run = create_run
        self._dedup: dict[str, str] = {}  # start dedup key -> the run that took it last

    def _count_tagged(self, tag: str, statuses: tuple[str, ...], workflow: str | None) -> int:
        return sum(
            1
            for run in self._tables.runs.values()
            if run.status in statuses
            and (workflow is None or run.workflow == workflow)
            and tag in (run.tags or ())
        )

    async def create_run_gated(self, run: WorkflowRun, gate: StartGate) -> StartOutcome:
        self._tables.tick()
        existing = self._tables.runs.get(run.id)
        if existing is not None:
            return StartOutcome("exists", holder=existing.workflow)
        if gate.dedup_key is not None:
            holder = self._tables.runs.get(self._dedup.get(gate.dedup_key, ""))
            if holder is not None and holder.status in LIVE_RUN_STATUSES:
                return StartOutcome("duplicate", holder=holder.id)
        refused = self._check_capacity(gate)
        if refused is not None:
            return refused
        await self._create_run(run)  # never suspends: still one atomic step
        if gate.dedup_key is not None:
            self._dedup[gate.dedup_key] = run.id
        return StartOutcome("created")

    def _check_capacity(self, gate: StartGate) -> StartOutcome | None:
        if gate.singleton_tag is not None and gate.singleton_capacity is not None:
            active = self._count_tagged(
                gate.singleton_tag, SINGLETON_ACTIVE_STATUSES, gate.singleton_workflow
            )
            if active >= gate.singleton_capacity:
                return StartOutcome("singleton_full", active=active)
        if gate.quota_tag is not None:
            if gate.quota_limit <= 0:
                return StartOutcome("quota_full", active=0)
            active = self._count_tagged(gate.quota_tag, gate.quota_statuses, None)
            if active >= gate.quota_limit:
                return StartOutcome("quota_full", active=active)
        return None

    async def gate_untagged_run(
        self, run_id: str, new_tags: Sequence[str], gate: StartGate
    ) -> StartOutcome:
        self._tables.tick()
        run = self._tables.runs.get(run_id)
        if run is None or run.status != "pending":
            return StartOutcome("exists", holder=run.workflow if run is not None else None)
        refused = self._check_capacity(gate)
        if refused is not None:
            return refused
        tags = tuple(dict.fromkeys([*(run.tags or ()), *new_tags]))
        self._tables.runs[run_id] = dataclasses.replace(run, tags=tags)
        return StartOutcome("created")

    def _singleton_active(self, tag: str, workflow: str) -> list[tuple[str, str, bool]]:
        runs = sorted(
            (
                r
                for r in self._tables.runs.values()
                if r.workflow == workflow
                and r.status in SINGLETON_ACTIVE_STATUSES
                and tag in (r.tags or ())
            ),
            key=lambda r: (r.created_at, r.id),
        )
        return [(r.id, r.status, SINGLETON_ADMITTED_TAG in (r.tags or ())) for r in runs]

    async def try_admit_singleton(
        self, run_id: str, tag: str, workflow: str, limit: int, retry_wake_at_ms: int
    ) -> bool:
        self._tables.tick()
        run = self._tables.runs.get(run_id)
        if run is None or run.status not in SINGLETON_ACTIVE_STATUSES:
            return False
        tags = tuple(run.tags or ())
        if tag not in tags:
            # A run created without its key's tag (a fan member, a start by name from a
            # process without the workflow's code) joins the line at its first turn.
            tags = (*tags, tag)
            run = self._tables.runs[run_id] = dataclasses.replace(run, tags=tags)
        if singleton_admits(run_id, self._singleton_active(tag, workflow), limit):
            if SINGLETON_ADMITTED_TAG not in tags:
                self._tables.runs[run_id] = dataclasses.replace(
                    run, tags=(*tags, SINGLETON_ADMITTED_TAG)
                )
            return True
        if run.status != "cancelling":
            self._tables.runs[run_id] = dataclasses.replace(
                run,
                status="suspended",
                wake_at=retry_wake_at_ms,
                locked_by=None,
                locked_until=None,
                updated_at=utc_from_ms(self._tables.now_ms()),
            )
        return False

    async def wake_singleton_waiters(
        self, tag: str, workflow: str, limit: int, now_ms: int
    ) -> list[str]:
        self._tables.tick()
        _, nxt = singleton_line(self._singleton_active(tag, workflow), limit)
        for run_id in nxt:
            run = self._tables.runs[run_id]
            if run.status == "suspended":
                self._tables.runs[run_id] = dataclasses.replace(run, wake_at=now_ms)
        return nxt
