"""`durably.RunGateway`: the bounded read/control/stream surface a web tier needs.

A console, an API route or an admin tool written against `RunGateway` runs unchanged over
any of the three things that answer it:

- `durably.Client` — a process that holds the store (a web tier next to separate workers);
- `durably.Engine` — a process that also drives runs;
- `durably.TenantGateway` — a tenant's process without the store, whose every call travels
  over the transport to the control plane (and sees only that tenant's runs).

It is a structural type (`typing.Protocol`): nothing inherits from it; the type checker
proves each of the three conforms (tests/typing). What is not here stays on the concrete
types: starting runs (a tenant starts by name only), signals, updates, bulk actions,
metrics, the signal buffer and everything that needs the worker.

The methods' documentation is on `Client`, whose verbs these are.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from durably._core.models import RunResult, WorkflowRun
from durably._engine.defs.events import EngineEvent
from durably._read.list_models import (
    GroupHealth,
    RunFacetRow,
    RunListItem,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
    RunWaiting,
)
from durably._read.models import FanPage, RunDetail
from durably._read.vocabulary import FAN_PAGE_DEFAULT_LIMIT

__all__ = ["RunEventListener", "RunGateway"]

#: A listener of one run's live events: called with each `EngineEvent`; it may be a
#: coroutine function (its result is awaited).
RunEventListener = Callable[[EngineEvent], Awaitable[None] | None]


class RunGateway(Protocol):
    """What a web tier reads, controls and streams runs through (module description)."""

    def topology(self) -> dict[str, str]:
        """`{"role": "control-plane"}` over the store, `{"role": "tenant", "tenant": t}` over
        the transport; no I/O."""
        ...

    # ------------------------------------------------------------------ reads

    async def get_run(self, run_id: str) -> WorkflowRun | None: ...

    async def get_run_detail(
        self,
        run_id: str,
        *,
        summarize_fans_over: int | None = None,
        if_none_match: str | None = None,
    ) -> RunDetail | None: ...

    async def get_fan_members(
        self,
        run_id: str,
        group: str,
        *,
        offset: int = 0,
        limit: int = FAN_PAGE_DEFAULT_LIMIT,
        failed_only: bool = False,
        if_none_match: str | None = None,
    ) -> FanPage | None: ...

    async def list_runs(self, **query: Any) -> list[WorkflowRun]: ...

    async def list_run_items(self, **query: Any) -> list[RunListItem]:
        """`list_runs` with what each listed run waits on (a console's list rows)."""
        ...

    async def run_facets(self, **query: Any) -> list[RunFacetRow]: ...

    async def run_value_facets(
        self,
        axis: RunValueAxis | Mapping[str, Any] | str,
        options: RunValueFacetOptions | Mapping[str, Any] | None = None,
        **query: Any,
    ) -> list[RunValueFacetRow]: ...

    async def waiting_for(self, run_ids: Iterable[str]) -> dict[str, RunWaiting]: ...

    async def worker_health(self) -> list[GroupHealth]: ...

    # ------------------------------------------------------------------ control

    async def cancel(self, run_id: str, *, compensate: bool = False) -> RunResult | None: ...

    async def retry(self, run_id: str) -> RunResult | None: ...

    async def continue_run(self, run_id: str) -> RunResult | None: ...

    async def redispatch_pending(self, run_id: str) -> dict[str, Any] | None: ...

    async def retry_with_input(self, run_id: str, input: Any) -> str | None: ...

    # ------------------------------------------------------------------ live events

    def subscribe(self, run_id: str, listener: RunEventListener) -> Awaitable[Callable[[], None]]:
        """Call `listener` with the run's live events (best effort: nothing is replayed);
        resolves to the function that unsubscribes."""
        ...
