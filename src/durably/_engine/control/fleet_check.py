"""Starts by name checked against the fleet: what the live workers' heartbeat rows serve.

A start by name (`Client.start("invoices.convert", …)`, or `Engine.start` of a name its own
registry lacks) is refused at once, with the close names the fleet does serve, when at least
one worker of the run's namespace beats (`durably._core.worker_beats`) and none of them serves
the name — a typo against a live fleet used to create a run that waited for ever.

Decision: when no worker beats in the namespace at all, the start is allowed. Workers may
start after the client (a deploy, a queue filled ahead of its workers), and refusing then
would make the order processes start in matter. Such a run waits `pending` until a worker
takes it; a worker that does not serve it parks it (`blocked`, "no worker serves workflow
…") where the read side shows it.

One store read per check, answered from a short cache: a web tier starting runs by name at a
high rate must not double its store traffic. Only a "served" answer is reused; a refusal is
always read afresh, so a worker that just started is never refused from a stale view.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Protocol

from durably._core.errors import WorkflowNotFoundError
from durably._core.worker_beats import FleetView
from durably._engine.defs.registry import close_matches
from durably._read.beats import live_fleet
from durably._store.protocol import FleetStore, RunStore

__all__ = ["FleetCheck", "FleetReads", "unserved_message"]

# How long a view in which the name was served is reused.
_CACHE_S = 1.0


def unserved_message(
    name: str,
    version: str | None,
    namespace: str | None,
    view: FleetView,
    *,
    known: Iterable[str] = (),
) -> str:
    """Why a start of `name` is refused: the live workers serve neither it nor (when given)
    that version, with the close names they (or `known`, a registry here) do serve."""
    count = len(view.beats)
    workers = f"{count} live worker{'s' if count != 1 else ''}"
    where = f"namespace {namespace!r}" if namespace is not None else "any namespace"
    if version is not None:
        versions = sorted({v for b in view.beats for n, v in b.workflows if n == name})
        if versions:
            return (
                f"workflow {name}@{version} is served by none of the {workers} in {where} "
                f"(they serve version {', '.join(versions)}); a pinned start never falls "
                "back to another version"
            )
    names = view.workflow_names() | set(known)
    return f"workflow {name} is served by none of the {workers} in {where}" + close_matches(
        name, names
    )


class FleetReads(FleetStore, RunStore, Protocol):
    """The heartbeat rows, and the run a refused start names by id."""


class FleetCheck:
    """`check(name, version, namespace)`: refuse a start by name the live fleet does not
    serve (module docstring). One per client or engine.

    A start naming an existing run by `run_id` is never refused here: it returns that run
    or raises `RunIdConflictError`, as it did before the fleet was asked (one read, on the
    refusing path only)."""

    def __init__(self, store: FleetReads):
        self._store = store
        self._served: dict[tuple[str, str | None, str | None], float] = {}

    async def view(self, namespace: str | None) -> FleetView:
        return await live_fleet(self._store, namespace)

    async def names_existing_run(self, run_id: str | None) -> bool:
        return run_id is not None and await self._store.get_run(run_id) is not None

    async def check(
        self, name: str, version: str | None, namespace: str | None, run_id: str | None = None
    ) -> None:
        """Refuse the start (`WorkflowNotFoundError` naming the close matches) unless the
        live view serves the name or no worker beats; answered from the cache while a
        recent view served the name."""
        key = (name, version, namespace)
        now = time.monotonic()
        if self._served.get(key, 0.0) > now:
            return
        view = await self.view(namespace)
        if not view.visible:
            return  # not cached: the first worker to beat is heeded at once
        if not view.serves(name, version, namespace):
            if await self.names_existing_run(run_id):
                return
            raise WorkflowNotFoundError(unserved_message(name, version, namespace, view))
        if len(self._served) > 1000:  # many distinct names: start the cache over
            self._served.clear()
        self._served[key] = now + _CACHE_S
