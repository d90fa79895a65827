"""Workflow start admission of the in-memory reference store (the contract is written on
`durably._store.protocol.StateStore`).

Each method runs without suspending (the awaited `create_run` never yields), so every check
and the write it allows are one atomic step with respect to other asyncio tasks — the same
guarantee the SQL store gets from one transaction under a per-key lock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from durably._core.models import LIVE_RUN_STATUSES, WorkflowRun, ms_from_utc, utc_from_ms
from durably._core.quota import (
    SINGLETON_ACTIVE_STATUSES,
    SINGLETON_ADMITTED_TAG,
    StartGate,
    StartOutcome,
    singleton_admits,
    singleton_line,
)


class MemoryStartAdmission:
    """Mixed into `InMemoryStateStore` (which provides what is declared here)."""

    if TYPE_CHECKING:
        _runs: dict[str, WorkflowRun]
        _dedup: dict[str, str]
        _clock: Callable[[], datetime]

        def _tick(self) -> None: ...

        async def create_run(self, run: WorkflowRun) -> None: ...

    def _count_tagged(self, tag: str, statuses: tuple[str, ...], workflow: str | None) -> int:
        return sum(
            1
            for run in self._runs.values()
            if run.status in statuses
            and (workflow is None or run.workflow == workflow)
            and tag in (run.tags or ())
        )

    async def create_run_gated(self, run: WorkflowRun, gate: StartGate) -> StartOutcome:
        self._tick()
        existing = self._runs.get(run.id)
        if existing is not None:
            return StartOutcome("exists", holder=existing.workflow)
        if gate.dedup_key is not None:
            holder = self._runs.get(self._dedup.get(gate.dedup_key, ""))
            if holder is not None and holder.status in LIVE_RUN_STATUSES:
                return StartOutcome("duplicate", holder=holder.id)
        refused = self._check_capacity(gate)
        if refused is not None:
            return refused
        await self.create_run(run)  # never suspends: still one atomic step
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
        self._tick()
        run = self._runs.get(run_id)
        if run is None or run.status != "pending":
            return StartOutcome("exists", holder=run.workflow if run is not None else None)
        refused = self._check_capacity(gate)
        if refused is not None:
            return refused
        tags = tuple(dict.fromkeys([*(run.tags or ()), *new_tags]))
        self._runs[run_id] = dataclasses.replace(run, tags=tags)
        return StartOutcome("created")

    def _singleton_active(self, tag: str, workflow: str) -> list[tuple[str, str, bool]]:
        runs = sorted(
            (
                r
                for r in self._runs.values()
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
        self._tick()
        run = self._runs.get(run_id)
        if run is None or run.status not in SINGLETON_ACTIVE_STATUSES:
            return False
        tags = tuple(run.tags or ())
        if tag not in tags:
            # A run created without its key's tag (a fan member, a start by name from a
            # process without the workflow's code) joins the line at its first turn.
            tags = (*tags, tag)
            run = self._runs[run_id] = dataclasses.replace(run, tags=tags)
        if singleton_admits(run_id, self._singleton_active(tag, workflow), limit):
            if SINGLETON_ADMITTED_TAG not in tags:
                self._runs[run_id] = dataclasses.replace(run, tags=(*tags, SINGLETON_ADMITTED_TAG))
            return True
        if run.status != "cancelling":
            self._runs[run_id] = dataclasses.replace(
                run,
                status="suspended",
                wake_at=retry_wake_at_ms,
                locked_by=None,
                locked_until=None,
                updated_at=utc_from_ms(ms_from_utc(self._clock())),
            )
        return False

    async def wake_singleton_waiters(
        self, tag: str, workflow: str, limit: int, now_ms: int
    ) -> list[str]:
        self._tick()
        _, nxt = singleton_line(self._singleton_active(tag, workflow), limit)
        for run_id in nxt:
            run = self._runs[run_id]
            if run.status == "suspended":
                self._runs[run_id] = dataclasses.replace(run, wake_at=now_ms)
        return nxt
