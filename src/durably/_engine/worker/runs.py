"""What the worker's parts ask of the runs executing in this process.

The `Dispatcher` answers all of it, but each part names only the few questions it asks, as
a protocol composed from the pieces below: a part can then be built (and tested) with a
small fake instead of a dispatcher, and what it depends on reads off its constructor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from durably._engine.run.execution import Execution

__all__ = ["BackgroundTasks", "DriveState", "ExecutingRuns", "Redispatch"]


class ExecutingRuns(Protocol):
    """Which runs have a turn executing here."""

    def execution(self, run_id: str) -> Execution | None:
        """The run's execution when a turn of it runs here now."""
        ...


class BackgroundTasks(Protocol):
    """Where background coroutines run, tracked so none is lost or outlives the worker."""

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...


class DriveState(Protocol):
    """Whether this process drives runs at all, and whether it stopped taking new work."""

    @property
    def drive_runs(self) -> bool: ...

    @property
    def draining(self) -> bool: ...


class Redispatch(Protocol):
    """Runs a turn of a run here soon (one more after the current one, when one runs)."""

    def dispatch(self, run_id: str, *, nudge: bool = False) -> None: ...
