"""`WorkerBeats`: this worker's heartbeat row in the store, written every few seconds.

What the row says and how it is read is `durably._core.worker_beats`. Here: when it is
written (once as the engine opens, before it takes work, so a start right after sees it;
then every `BEAT_INTERVAL_MS` from a background task: one upsert, never per step), what goes
in it (the workflows registered here with their versions, the steps served here, and — with a
transport whose workers announce themselves — the tokens live workers beat on and the
workflows their descriptors name), and its removal when the engine closes, so a fleet that
stopped cleanly reads as "no worker" at once instead of after the live window.

A beat that fails (the store is down) is logged once per failing streak and retried at the
next interval; a worker's runs never depend on its beat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from durably._core.handshake import normalize_descriptor
from durably._core.log_context import durably_logger
from durably._core.wire import WireFormatError
from durably._core.worker_beats import (
    ALL_NAMESPACES,
    BEAT_INTERVAL_MS,
    MAX_BEAT_ITEMS,
    PRUNE_AFTER_MS,
    WorkerBeat,
    wall_ms,
)
from durably._store.protocol import FleetStore
from durably._transport.protocol import WorkerDirectory

log = durably_logger("durably.worker")

__all__ = ["WorkerBeats"]

Served = Callable[[], tuple[Sequence[tuple[str, str]], Sequence[str]]]
"""`() -> (workflows as (name, version), step names)`: what this worker serves now."""


class WorkerBeats:
    """One worker's heartbeat row (module docstring)."""

    def __init__(
        self,
        store: FleetStore,
        *,
        instance_id: str,
        namespace: str | None,
        served: Served,
        directories: Callable[[], Sequence[tuple[str, WorkerDirectory]]] = list,
        interval_ms: int = BEAT_INTERVAL_MS,
    ):
        self._store = store
        self._instance_id = instance_id
        self._namespace = ALL_NAMESPACES if namespace is None else namespace
        self._served = served
        self._directories = directories
        self._interval_ms = interval_ms
        self._started_at = wall_ms()
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    async def open(self) -> None:
        """Prune long-silent rows, write the first beat, start the loop."""
        try:
            await self._store.prune_worker_beats(wall_ms() - PRUNE_AFTER_MS)
        except Exception as exc:
            log.debug("could not prune old worker beats: %s", exc)
        await self.beat()
        self._task = asyncio.create_task(self._loop(), name="durably-worker-beat")

    async def close(self) -> None:
        """Stop beating and delete the row (best effort: a row left behind goes stale)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        try:
            await self._store.forget_worker(self._namespace, self._instance_id)
        except Exception as exc:
            log.debug("could not remove the worker beat of %s: %s", self._instance_id, exc)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_ms / 1000.0)
            await self.beat()

    async def beat(self) -> None:
        """Write the row now; a failure is logged (once per streak), never raised."""
        try:
            await self._store.beat_worker(await self._row())
        except Exception as exc:
            if not self._failing:
                log.warning(
                    "could not write the worker beat of %s (%s); retrying every %d s",
                    self._instance_id,
                    exc,
                    self._interval_ms // 1000,
                )
            self._failing = True
            return
        if self._failing:
            log.info("the worker beat of %s is written again", self._instance_id)
        self._failing = False

    async def _row(self) -> WorkerBeat:
        workflows, steps = self._served()
        tokens, announced = await self._transport_view()
        return WorkerBeat(
            namespace=self._namespace,
            instance_id=self._instance_id,
            beat_at=wall_ms(),
            started_at=self._started_at,
            workflows=tuple(sorted(set(workflows)))[:MAX_BEAT_ITEMS],
            steps=tuple(sorted(set(steps)))[:MAX_BEAT_ITEMS],
            tokens=tokens,
            announced=announced,
        )

    async def _transport_view(self) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
        """The tokens live workers beat on and the workflows they announce, over every
        member of the pool that can say (None, (): no such member, or none answered)."""
        directories = self._directories()
        if not directories:
            return None, ()
        tokens: set[str] = set()
        announced: set[str] = set()
        answered = False
        for member, directory in directories:
            try:
                groups = await directory.list_worker_groups()
                raw = await directory.read_worker_descriptors(None)
            except Exception as exc:
                log.debug("worker beat: could not read the workers on %r: %s", member, exc)
                continue
            answered = True
            tokens.update(t for t in groups if isinstance(t, str))
            for item in raw:
                try:
                    descriptor = normalize_descriptor(item)
                except WireFormatError:
                    continue  # a garbled descriptor must not hide the others
                announced.update(descriptor.workflows)
                announced.update(r.name for r in descriptor.registrations or ())
        if not answered:
            return None, ()
        return (
            tuple(sorted(tokens))[:MAX_BEAT_ITEMS],
            tuple(sorted(announced))[:MAX_BEAT_ITEMS],
        )
