"""`durably.SyncClient`: the `Client`'s verbs for synchronous code (Django, Flask, scripts).

A sync client owns one event loop, run by one background thread, and one `Client` that
lives on it. Every verb hands its coroutine to that loop (`run_coroutine_threadsafe`) and
blocks the calling thread until the answer: so any number of threads may call one sync
client at once (their calls interleave on the loop, as tasks of an async client would), and
the store's connections, the wake-bus listener and the waits all stay on the one loop they
were made on. `close()` (or leaving `with SyncClient(...)`) closes the client on its loop,
then stops the loop and joins the thread.

A verb called from the client's own loop thread would wait for itself forever, so it is
refused with `RuntimeError`; so is any verb after `close()`.
"""

from __future__ import annotations

import asyncio
import builtins
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import Future
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from durably._core.buffered_signals import DEFAULT_LIST_LIMIT, BufferedSignalInfo
from durably._core.durations import Duration
from durably._core.models import RunResult, RunStatus, StepCheckpoint, WorkflowRun
from durably._core.quota import ConcurrencyQuota
from durably._core.retention import DEFAULT_BATCH_SIZE, PruneResult, RetentionPolicy
from durably._core.run_activity import ActivityBucket, ActivityWindow
from durably._engine.client.client import CANCEL_WHERE_LIMIT, Client
from durably._engine.client.docs import documented_by
from durably._engine.client.handle import RunHandle, WaitUntil
from durably._engine.client.run_gateway import RunEventListener
from durably._engine.client.schedule_views import ScheduleDescription
from durably._engine.client.schedules import ScheduleClient
from durably._engine.defs.intercept import Interceptor
from durably._engine.defs.options import UNSET, EngineOptions, Unset
from durably._engine.defs.registry import Workflow
from durably._engine.defs.schedules import Schedule
from durably._engine.flow.quotas import OnDuplicate
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
from durably._store.codec import Codec

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from durably._store.protocol import StateStore

__all__ = ["SyncClient", "SyncRunHandle", "SyncScheduleClient"]

I = TypeVar("I")
O = TypeVar("O")
T = TypeVar("T")


class _LoopThread:
    """One event loop run by one daemon thread; `call` runs a coroutine there and waits."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._closed = False
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.call_soon(ready.set)
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()
        ready.wait()

    @property
    def closed(self) -> bool:
        return self._closed

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and return its result (or raise its exception) here."""
        if self._closed:
            coro.close()
            raise RuntimeError("this SyncClient is closed")
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                "a SyncClient verb was called from the client's own event loop: await the "
                "async durably.Client there instead"
            )
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result()

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the loop soon, from any thread (nothing once the loop is closed)."""
        if self._closed:
            return
        try:
            self._loop.call_soon_threadsafe(fn)
        except RuntimeError:
            pass  # closed meanwhile: what `fn` would stop ended with the loop

    def stop(self) -> None:
        """Stop the loop and join its thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


class SyncRunHandle(Generic[O]):
    """A started run, for synchronous code: `handle.result()` blocks for its output."""

    def __init__(self, handle: RunHandle[O], loop: _LoopThread) -> None:
        self._handle = handle
        self._loop = loop
        self.run_id = handle.run_id

    def __repr__(self) -> str:
        return f"<SyncRunHandle {self.run_id!r}>"

    @documented_by(RunHandle.result)
    def result(self, timeout: float | None = None) -> O:
        return self._loop.call(self._handle.result(timeout=timeout))

    @documented_by(RunHandle.wait)
    def wait(self, timeout: float | None = None) -> WorkflowRun:
        return self._loop.call(self._handle.wait(timeout=timeout))

    def status(self) -> RunStatus:
        """The run's status now (`LookupError` when it is unknown)."""
        return self._loop.call(self._handle.status())


class SyncScheduleClient:
    """`ScheduleClient`'s verbs for synchronous code (`sync_client.schedules`): each runs on
    the sync client's loop and blocks for its answer."""

    def __init__(self, schedules: ScheduleClient, loop: _LoopThread) -> None:
        self._schedules = schedules
        self._loop = loop

    @documented_by(ScheduleClient.create)
    def create(self, schedule: Schedule) -> ScheduleDescription:
        return self._loop.call(self._schedules.create(schedule))

    @documented_by(ScheduleClient.upsert)
    def upsert(self, schedule: Schedule) -> ScheduleDescription:
        return self._loop.call(self._schedules.upsert(schedule))

    @documented_by(ScheduleClient.update)
    def update(self, schedule_id: str, **changes: Any) -> ScheduleDescription:
        return self._loop.call(self._schedules.update(schedule_id, **changes))

    @documented_by(ScheduleClient.describe)
    def describe(self, schedule_id: str) -> ScheduleDescription:
        return self._loop.call(self._schedules.describe(schedule_id))

    @documented_by(ScheduleClient.list)
    def list(
        self, *, workflow: str | None = None, paused: bool | None = None, limit: int = 100
    ) -> builtins.list[ScheduleDescription]:
        return self._loop.call(self._schedules.list(workflow=workflow, paused=paused, limit=limit))

    @documented_by(ScheduleClient.pause)
    def pause(self, schedule_id: str, note: str | None = None) -> ScheduleDescription:
        return self._loop.call(self._schedules.pause(schedule_id, note))

    @documented_by(ScheduleClient.unpause)
    def unpause(self, schedule_id: str) -> ScheduleDescription:
        return self._loop.call(self._schedules.unpause(schedule_id))

    @documented_by(ScheduleClient.trigger)
    def trigger(self, schedule_id: str) -> SyncRunHandle[Any]:
        return SyncRunHandle(self._loop.call(self._schedules.trigger(schedule_id)), self._loop)

    @documented_by(ScheduleClient.backfill)
    def backfill(
        self, schedule_id: str, start: datetime | int, end: datetime | int
    ) -> builtins.list[str]:
        return self._loop.call(self._schedules.backfill(schedule_id, start, end))

    @documented_by(ScheduleClient.delete)
    def delete(self, schedule_id: str) -> None:
        self._loop.call(self._schedules.delete(schedule_id))


class SyncClient:
    """`durably.Client` for synchronous code: the same verbs under the same names, each one
    blocking until its answer (module docstring). It takes `Client`'s arguments.

    Use it as `with SyncClient(...) as client:`, or keep one per process (a web app's
    module-level client) and `close()` it at shutdown; it is safe to share between threads.
    Calls made before opening open it lazily, as `Client`'s do.
    """

    def __init__(
        self,
        store: StateStore | AsyncEngine | str | None = None,
        *,
        codec: Codec | None = None,
        namespace: str | None = "default",
        options: EngineOptions | None = None,
        signal_buffer_ttl: Duration | Unset = UNSET,
        signal_buffer_per_token: int | Unset = UNSET,
        signal_buffer_per_namespace: int | Unset = UNSET,
        max_payload_bytes: int | Unset = UNSET,
        interceptors: Sequence[Interceptor] | None = None,
    ):
        self._loop = _LoopThread("durably-sync-client")

        async def make() -> Client:
            # Made on the loop, so that whatever the store binds at creation is bound there.
            return Client(
                store,
                codec=codec,
                namespace=namespace,
                options=options,
                signal_buffer_ttl=signal_buffer_ttl,
                signal_buffer_per_token=signal_buffer_per_token,
                signal_buffer_per_namespace=signal_buffer_per_namespace,
                max_payload_bytes=max_payload_bytes,
                # The hooks run on this client's own loop thread, so a contextvar of the
                # calling thread is not visible in them.
                interceptors=interceptors,
            )

        try:
            self._client = self._loop.call(make())
        except BaseException:
            self._loop.stop()
            raise
        self.schedules = SyncScheduleClient(self._client.schedules, self._loop)
        """Persisted schedules, as `Client.schedules` (each verb blocks for its answer)."""

    @property
    def namespace(self) -> str | None:
        return self._client.namespace

    # ================================================================== lifecycle

    def __enter__(self) -> SyncClient:
        self._loop.call(self._client.__aenter__())
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the client on its loop, then stop the loop and its thread (idempotent)."""
        if self._loop.closed:
            return
        try:
            self._loop.call(self._client.close())
        finally:
            self._loop.stop()

    # ================================================================== starting runs

    @documented_by(Client.start)
    def start(
        self,
        workflow: Workflow[I, O] | str,
        input: Any = None,
        *,
        run_id: str | None = None,
        tags: Sequence[str] | None = None,
        search_attributes: dict[str, str | int | float | bool] | None = None,
        priority: int | None = None,
        version: str | None = None,
        namespace: str | None = None,
        concurrency: ConcurrencyQuota | None = None,
        dedup_id: str | None = None,
        on_duplicate: OnDuplicate = "return",
        output_type: Any = None,
    ) -> SyncRunHandle[O]:
        handle: RunHandle[O] = self._loop.call(
            self._client.start(
                workflow,
                input,
                run_id=run_id,
                tags=tags,
                search_attributes=search_attributes,
                priority=priority,
                version=version,
                namespace=namespace,
                concurrency=concurrency,
                dedup_id=dedup_id,
                on_duplicate=on_duplicate,
                output_type=output_type,
            )
        )
        return SyncRunHandle(handle, self._loop)

    @documented_by(Client.execute)
    def execute(
        self,
        workflow: Workflow[I, O] | str,
        input: Any = None,
        *,
        timeout: float | None = None,
        **options: Any,
    ) -> O:
        result: O = self._loop.call(
            self._client.execute(workflow, input, timeout=timeout, **options)
        )
        return result

    @documented_by(Client.get_handle)
    def get_handle(self, run_id: str) -> SyncRunHandle[Any]:
        return SyncRunHandle(self._client.get_handle(run_id), self._loop)

    @documented_by(Client.result)
    def result(self, run_id: str, timeout: float | None = None) -> Any:
        return self._loop.call(self._client.result(run_id, timeout))

    # ================================================================== signals

    @documented_by(Client.signal)
    def signal(self, token: str, payload: Any = None, *, buffer: bool = True) -> RunResult | None:
        return self._loop.call(self._client.signal(token, payload, buffer=buffer))

    @documented_by(Client.signal_with_start)
    def signal_with_start(
        self,
        workflow: Workflow[I, O] | str,
        input: Any = None,
        *,
        run_id: str,
        token: str,
        payload: Any = None,
        tags: Sequence[str] | None = None,
        search_attributes: dict[str, str | int | float | bool] | None = None,
        version: str | None = None,
        namespace: str | None = None,
    ) -> SyncRunHandle[O]:
        handle: RunHandle[O] = self._loop.call(
            self._client.signal_with_start(
                workflow,
                input,
                run_id=run_id,
                token=token,
                payload=payload,
                tags=tags,
                search_attributes=search_attributes,
                version=version,
                namespace=namespace,
            )
        )
        return SyncRunHandle(handle, self._loop)

    # ================================================================== operator actions

    @documented_by(Client.cancel)
    def cancel(self, run_id: str, *, compensate: bool = False) -> RunResult | None:
        return self._loop.call(self._client.cancel(run_id, compensate=compensate))

    @documented_by(Client.cancel_where)
    def cancel_where(
        self, *, compensate: bool = False, limit: int = CANCEL_WHERE_LIMIT, **query: Any
    ) -> list[str]:
        return self._loop.call(
            self._client.cancel_where(compensate=compensate, limit=limit, **query)
        )

    @documented_by(Client.retry)
    def retry(self, run_id: str) -> RunResult | None:
        return self._loop.call(self._client.retry(run_id))

    @documented_by(Client.retry_with_input)
    def retry_with_input(
        self, run_id: str, input: Any, *, new_run_id: str | None = None
    ) -> str | None:
        return self._loop.call(self._client.retry_with_input(run_id, input, new_run_id=new_run_id))

    @documented_by(Client.fork)
    def fork(
        self,
        run_id: str,
        *,
        from_seq: int,
        new_run_id: str | None = None,
        input: Any = UNSET,
        version: str | None = None,
    ) -> SyncRunHandle[Any]:
        handle = self._loop.call(
            self._client.fork(
                run_id, from_seq=from_seq, new_run_id=new_run_id, input=input, version=version
            )
        )
        return SyncRunHandle(handle, self._loop)

    @documented_by(Client.continue_run)
    def continue_run(self, run_id: str) -> RunResult | None:
        return self._loop.call(self._client.continue_run(run_id))

    @documented_by(Client.redispatch_pending)
    def redispatch_pending(self, run_id: str) -> dict[str, Any] | None:
        return self._loop.call(self._client.redispatch_pending(run_id))

    @documented_by(Client.delete_run)
    def delete_run(self, run_id: str) -> int:
        return self._loop.call(self._client.delete_run(run_id))

    @documented_by(Client.prune)
    def prune(
        self,
        policy: RetentionPolicy,
        *,
        dry_run: bool = False,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> PruneResult:
        return self._loop.call(self._client.prune(policy, dry_run=dry_run, batch_size=batch_size))

    # ================================================================== waiting & reading

    @documented_by(Client.wait_for_run)
    def wait_for_run(
        self, run_id: str, timeout: float | None = None, until: WaitUntil = "settled"
    ) -> WorkflowRun:
        return self._loop.call(self._client.wait_for_run(run_id, timeout, until))

    @documented_by(Client.get_run)
    def get_run(self, run_id: str) -> WorkflowRun | None:
        return self._loop.call(self._client.get_run(run_id))

    @documented_by(Client.list_runs)
    def list_runs(self, **query: Any) -> list[WorkflowRun]:
        return self._loop.call(self._client.list_runs(**query))

    @documented_by(Client.list_run_items)
    def list_run_items(self, **query: Any) -> list[RunListItem]:
        return self._loop.call(self._client.list_run_items(**query))

    @documented_by(Client.list_checkpoints)
    def list_checkpoints(self, run_id: str) -> list[StepCheckpoint]:
        return self._loop.call(self._client.list_checkpoints(run_id))

    @documented_by(Client.export_history)
    def export_history(self, run_id: str) -> dict[str, Any]:
        return self._loop.call(self._client.export_history(run_id))

    @documented_by(Client.get_run_children)
    def get_run_children(self, run_id: str) -> list[str]:
        return self._loop.call(self._client.get_run_children(run_id))

    @documented_by(Client.get_event)
    def get_event(self, run_id: str, key: str) -> Any:
        return self._loop.call(self._client.get_event(run_id, key))

    @documented_by(Client.get_run_detail)
    def get_run_detail(
        self,
        run_id: str,
        *,
        summarize_fans_over: int | None = None,
        if_none_match: str | None = None,
    ) -> RunDetail | None:
        return self._loop.call(
            self._client.get_run_detail(
                run_id, summarize_fans_over=summarize_fans_over, if_none_match=if_none_match
            )
        )

    @documented_by(Client.get_fan_members)
    def get_fan_members(
        self,
        run_id: str,
        group: str,
        *,
        offset: int = 0,
        limit: int = FAN_PAGE_DEFAULT_LIMIT,
        failed_only: bool = False,
        if_none_match: str | None = None,
    ) -> FanPage | None:
        return self._loop.call(
            self._client.get_fan_members(
                run_id,
                group,
                offset=offset,
                limit=limit,
                failed_only=failed_only,
                if_none_match=if_none_match,
            )
        )

    @documented_by(Client.run_facets)
    def run_facets(self, **query: Any) -> list[RunFacetRow]:
        return self._loop.call(self._client.run_facets(**query))

    @documented_by(Client.run_activity)
    def run_activity(self, window: ActivityWindow, **query: Any) -> list[ActivityBucket]:
        return self._loop.call(self._client.run_activity(window, **query))

    @documented_by(Client.run_value_facets)
    def run_value_facets(
        self,
        axis: RunValueAxis | Mapping[str, Any] | str,
        options: RunValueFacetOptions | Mapping[str, Any] | None = None,
        **query: Any,
    ) -> list[RunValueFacetRow]:
        return self._loop.call(self._client.run_value_facets(axis, options, **query))

    @documented_by(Client.waiting_for)
    def waiting_for(self, run_ids: Iterable[str]) -> dict[str, RunWaiting]:
        # Read here: an iterator handed to another thread would be consumed there.
        return self._loop.call(self._client.waiting_for(list(run_ids)))

    @documented_by(Client.count_runs)
    def count_runs(self, **query: Any) -> int:
        return self._loop.call(self._client.count_runs(**query))

    @documented_by(Client.worker_health)
    def worker_health(self) -> list[GroupHealth]:
        return self._loop.call(self._client.worker_health())

    @documented_by(Client.topology)
    def topology(self) -> dict[str, str]:
        return self._client.topology()

    def subscribe(self, run_id: str, listener: RunEventListener) -> Callable[[], None]:
        """As `Client.subscribe`, for synchronous code: `listener` is called on the sync
        client's own loop thread (keep it quick, or hand the event to your thread); the
        returned function unsubscribes from any thread."""
        unsubscribe = self._loop.call(self._client.subscribe(run_id, listener))
        loop = self._loop

        def stop() -> None:
            loop.call_soon(unsubscribe)

        return stop

    # ================================================================== the signal buffer

    @documented_by(Client.list_buffered_signals)
    def list_buffered_signals(
        self, *, prefix: str | None = None, limit: int = DEFAULT_LIST_LIMIT, offset: int = 0
    ) -> list[BufferedSignalInfo]:
        return self._loop.call(
            self._client.list_buffered_signals(prefix=prefix, limit=limit, offset=offset)
        )

    @documented_by(Client.count_buffered_signals)
    def count_buffered_signals(self, *, prefix: str | None = None) -> int:
        return self._loop.call(self._client.count_buffered_signals(prefix=prefix))

    @documented_by(Client.purge_buffered_signals)
    def purge_buffered_signals(
        self,
        *,
        token: str | None = None,
        prefix: str | None = None,
        expired_only: bool = False,
        all: bool = False,
    ) -> int:
        return self._loop.call(
            self._client.purge_buffered_signals(
                token=token, prefix=prefix, expired_only=expired_only, all=all
            )
        )
