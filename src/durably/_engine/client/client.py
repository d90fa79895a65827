"""`durably.Client`: start, signal, cancel, retry and read runs from any process.

A client needs only a store. It never imports workflow code: a run can be started by
`Workflow` object (its input validated against the workflow's annotation, as `Engine.start`
does) or by name with a JSON input, which the worker that executes the run checks when it
first drives it. The client writes to the store and announces what it did on the store's
wake bus (PostgreSQL LISTEN/NOTIFY; polling everywhere else); a worker does the rest.

An `Engine` is composed of a client (for these operations) and the worker runtime that
drives runs; it hands its client the `LocalRuns` hooks (`durably._engine.control.plane`) so that
a run it starts, signals or cancels is also driven, woken or interrupted in-process.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from pydantic import ValidationError

from durably._core.durations import Duration
from durably._core.errors import (
    InputValidationError,
    SerializationError,
    WorkflowNotFoundError,
)
from durably._core.ids import given_run_id
from durably._core.models import JSONValue, RunResult, WorkflowRun
from durably._core.quota import ConcurrencyQuota
from durably._core.triggers import refuse_engine_owned_start
from durably._engine.client.handle import RunHandle, RunWatchers, WaitUntil
from durably._engine.client.reads import ReadApi
from durably._engine.client.signal_api import BufferedSignalsApi
from durably._engine.control import operator, signals
from durably._engine.control.plane import UNPINNED_VERSION, ControlPlane
from durably._engine.control.signals import SignalBufferPolicy, buffer_policy
from durably._engine.defs.options import UNSET, EngineOptions, Unset, merge_options
from durably._engine.defs.registry import Workflow
from durably._engine.defs.stores import open_store
from durably._engine.defs.typed_io import PLAIN, validation_details
from durably._engine.flow.quotas import OnDuplicate
from durably._store.codec import Codec, wrap_store
from durably._store.protocol import WakeBus

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from durably._store.protocol import StateStore

__all__ = ["Client", "prepare_input"]

I = TypeVar("I")
O = TypeVar("O")


def prepare_input(workflow: Workflow[Any, Any], input: Any) -> JSONValue:
    """Validate a start input against the workflow's annotation and validator → its JSON
    form; `InputValidationError` naming the workflow and what is wrong."""
    try:
        typed = workflow.input_codec.validate(input)
    except ValidationError as exc:
        raise InputValidationError(
            workflow.name, str(exc).replace("\n", "; "), validation_details(exc)
        ) from None
    try:
        json_input = workflow.input_codec.to_json(typed)
    except SerializationError as exc:
        raise InputValidationError(workflow.name, str(exc)) from None
    if workflow.validate_input is not None:
        verdict = workflow.validate_input(typed)
        if isinstance(verdict, str) and verdict:
            raise InputValidationError(workflow.name, verdict)
    return json_input


def plain_input(name: str, input: Any) -> JSONValue:
    """The input of a start by name: it must already be JSON (no annotation to apply)."""
    try:
        json_input: JSONValue = PLAIN.to_json(input)
    except SerializationError as exc:
        raise InputValidationError(name, str(exc)) from None
    return json_input


class Client(ReadApi, BufferedSignalsApi):
    """Start, signal, cancel, retry and read runs; needs only a store.

    `store` is a URL (`"sqlite:///app.db"`, `"postgresql+asyncpg://…"`, `"memory"`), an
    SQLAlchemy `AsyncEngine`, or a `StateStore`; None reads `DURABLY_STORE` (else the
    embedded SQLite default), like `Engine(store=…)`. `codec` encrypts payloads at rest
    exactly as `Engine(codec=…)` does — a client and the workers it talks to must use the
    same one. `namespace` is where the runs it starts live. The `signal_buffer_*` options
    bound the signals it buffers for runs not waiting yet, and `max_payload_bytes` the size
    of a signal's payload (`PayloadTooLargeError` past it), as on `Engine`: give them as
    keywords or in `options=EngineOptions(...)` (a keyword wins); a bad value raises
    `ValueError` naming it.

    Use it as `async with Client(...) as client:`; calls made before open it lazily.
    """

    def __init__(
        self,
        store: StateStore | AsyncEngine | str | None = None,
        *,
        codec: Codec | None = None,
        namespace: str | None = "default",
        options: EngineOptions | None = None,
        # The options that apply to a client, as on `Engine` (documented on
        # `EngineOptions`); a keyword given here overrides the same field of `options`.
        signal_buffer_ttl: Duration | Unset = UNSET,
        signal_buffer_per_token: int | Unset = UNSET,
        signal_buffer_per_namespace: int | Unset = UNSET,
        max_payload_bytes: int | Unset = UNSET,
    ):
        # A client only sends and buffers signals, so of `options` it uses the signal-buffer
        # bounds and `max_payload_bytes` (the largest signal payload) and ignores the rest
        # (they tune the worker runtime, which a client does not run); taking the whole
        # value lets a web tier share one EngineOptions with its workers.
        settings = merge_options(
            "Client",
            options,
            {
                "signal_buffer_ttl": signal_buffer_ttl,
                "signal_buffer_per_token": signal_buffer_per_token,
                "signal_buffer_per_namespace": signal_buffer_per_namespace,
                "max_payload_bytes": max_payload_bytes,
            },
        )
        policy = buffer_policy(settings)
        opened, owns = open_store(store)
        self._setup(
            wrap_store(opened, codec),
            owns_store=owns,
            namespace=namespace,
            clock=lambda: int(time.time() * 1000),
            policy=policy,
        )

    @classmethod
    def _for_engine(
        cls,
        plane: ControlPlane,
        opener: Callable[[], Awaitable[None]],
        watchers: RunWatchers,
        poll: Callable[[str], float],
    ) -> Client:
        """The client an `Engine` is composed of: the engine's control plane (its store,
        clock, wake bus and the hooks of the runs it drives); opening it opens the engine.
        Its waits are the engine's (`watchers`, woken by the engine's events and wake bus;
        `poll` says how often a wait on a run re-reads it without a wake)."""
        client = cls.__new__(cls)
        client._setup(plane.store, owns_store=False, plane=plane, opener=opener)
        client._watchers = watchers
        client._poll = poll
        return client

    def _setup(
        self,
        store: StateStore,
        *,
        owns_store: bool,
        plane: ControlPlane | None = None,
        namespace: str | None = None,
        clock: Callable[[], int] | None = None,
        policy: SignalBufferPolicy | None = None,
        opener: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store  # what it reads and writes (wrapped by its codec, if any)
        self._store = store
        self._owns_store = owns_store
        self._opener = opener
        self._bus: WakeBus | None = None
        self._opened = False
        self._open_lock: asyncio.Lock | None = None
        # wait_for_run calls of this client, woken by `settled` messages on the wake bus
        self._watchers = RunWatchers()
        self._poll: Callable[[str], float] = self._poll_interval
        if plane is None:
            assert clock is not None and policy is not None
            plane = ControlPlane(
                store,
                clock=clock,
                signal_buffer=policy,
                announce=self._announce,
                namespace=namespace,
            )
        self._plane = plane

    @property
    def namespace(self) -> str | None:
        return self._plane.namespace

    # ================================================================== lifecycle

    async def __aenter__(self) -> Client:
        await self._ensure_open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _ensure_open(self) -> None:
        if self._opener is not None:
            await self._opener()
            return
        if self._opened:
            return
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._opened:
                return
            await self._store.ensure_schema()
            bus = self._store.wake_bus()  # None: the store has no cross-process channel
            if bus is not None:
                await bus.start(self._on_wake)
                self._bus = bus
            self._opened = True

    async def close(self) -> None:
        """Stop listening to the wake bus and close the store if this client opened it.
        (A client an `Engine` is composed of is closed with the engine.)"""
        if self._opener is not None:
            return
        bus, self._bus = self._bus, None
        if bus is not None:
            await bus.close()
        self._opened = False
        if self._owns_store:
            await self._store.close()

    async def _announce(self, kind: str, run_id: str) -> None:
        """Tell the workers (and other clients); best effort — they poll as well."""
        if self._bus is not None:
            try:
                await self._bus.publish(kind, run_id)
            except Exception:
                pass  # a lost wake costs latency only: every worker polls the store

    def _on_wake(self, kind: str, run_id: str) -> None:
        if kind == "settled":
            self._watchers.wake(run_id)

    def _poll_interval(self, run_id: str) -> float:
        # A `settled` message on the wake bus re-reads at once; polling is the fallback
        # (and the only way on a store without a bus).
        return 1.0 if self._bus is not None else 0.25

    # ================================================================== starting runs

    @overload
    async def start(
        self,
        workflow: Workflow[I, O],
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
    ) -> RunHandle[O]: ...

    @overload
    async def start(
        self,
        workflow: str,
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
    ) -> RunHandle[Any]: ...

    async def start(
        self,
        workflow: Workflow[Any, Any] | str,
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
    ) -> RunHandle[Any]:
        """Create a `pending` run and return its handle at once; idempotent by `run_id`
        (a run of the same workflow in the same namespace is returned as it is; a run of
        another workflow, or of another namespace, under that id is `RunIdConflictError`).
        A NUL or a lone surrogate in the workflow name, a tag or a search attribute is
        refused with `PayloadRejectedError` (a `ValueError`) before anything is written.

        `dedup_id`: while a live run of the workflow (in this namespace) was started with
        the same dedup id, a start returns that run's handle (`on_duplicate="return"`) or
        raises `DuplicateRunError` (`"raise"`); once it is completed, failed, cancelled or
        dead the id is free again. `concurrency=durably.ConcurrencyQuota(key, limit)`: this
        start's quota (instead of the workflow's), `ConcurrencyLimitError` when `limit`
        runs of the key are in flight. Both are checked with the insert in one store
        transaction, so concurrent starts in several processes cannot both pass.

        With a `Workflow` object the input is validated against its annotation and
        validator (`InputValidationError`) and the run is pinned to its version. With a
        name the input must be JSON; the worker that executes the run validates it (an
        invalid input fails the run with the validation error) and, without `version`,
        runs its newest registered version of the workflow.

        `priority`: pending runs are picked up higher first, then oldest (None counts as 0);
        the run's children, fan members, retries and continuations carry it too.
        """
        given_run_id(run_id)  # a bad id is refused before the store is even opened
        refuse_engine_owned_start(workflow, run_id)
        await self._ensure_open()
        if isinstance(workflow, Workflow):
            if version is not None and version != workflow.version:
                raise WorkflowNotFoundError(
                    f"start of {workflow.name}@{workflow.version} with version={version!r}: "
                    "pass the Workflow object of that version, or start it by name"
                )
            wf: Workflow[Any, Any] | None = workflow
        else:
            if not isinstance(workflow, str) or not workflow:
                raise TypeError(f"workflow must be a Workflow or its name, not {workflow!r}")
            wf = self._plane.registration(workflow, version)
        if wf is not None:
            rid = await self._plane.create_run(
                wf.name,
                wf.version,
                prepare_input(wf, input),
                run_id=run_id,
                tags=[*wf.tags, *(tags or ())],
                search_attributes=search_attributes,
                priority=priority,
                namespace=namespace,
                registered=wf,
                concurrency=concurrency,
                dedup_id=dedup_id,
                on_duplicate=on_duplicate,
            )
            return RunHandle(self, rid, wf, self._plane.registration)
        name = str(workflow)
        rid = await self._plane.create_run(
            name,
            version if version is not None else UNPINNED_VERSION,
            plain_input(name, input),
            run_id=run_id,
            tags=tags,
            search_attributes=search_attributes,
            priority=priority,
            namespace=namespace,
            concurrency=concurrency,
            dedup_id=dedup_id,
            on_duplicate=on_duplicate,
        )
        return RunHandle(self, rid, None, self._plane.registration)

    def get_handle(self, run_id: str) -> RunHandle[Any]:
        """A handle on an existing run (its output is returned as stored JSON)."""
        return RunHandle(self, run_id, None, self._plane.registration)

    async def result(self, run_id: str, timeout: float | None = None) -> Any:
        """Wait until the run is terminal: its output, or `RunFailedError`."""
        return await self.get_handle(run_id).result(timeout=timeout)

    # ================================================================== signals

    async def signal(
        self, token: str, payload: Any = None, *, buffer: bool = True
    ) -> RunResult | None:
        """Deliver `payload` to the run waiting on `token` and return that run's current
        state.

        No run waits on it yet: with `buffer=True` the payload is buffered (bounded by the
        `signal_buffer_*` options) and the next wait on the token receives it; returns None.
        With `buffer=False` nothing is stored; returns None.

        Raises `ReservedTokenError` for a token of the engine's own waits (use `update`,
        `continue_run`, `publish_event` for those), `SignalBufferFullError` when the buffer's
        cap for the token or its namespace is reached (nothing stored).
        """
        signals.check_external_token(token)
        if not isinstance(buffer, bool):
            raise TypeError(f"buffer must be True or False, not {buffer!r}")
        await self._ensure_open()
        return await self._plane.signal(
            token, payload, want_result=True, buffer="bounded" if buffer else "none"
        )

    @overload
    async def signal_with_start(
        self,
        workflow: Workflow[I, O],
        input: Any = None,
        *,
        run_id: str,
        token: str,
        payload: Any = None,
        tags: Sequence[str] | None = None,
        search_attributes: dict[str, str | int | float | bool] | None = None,
        version: str | None = None,
        namespace: str | None = None,
    ) -> RunHandle[O]: ...

    @overload
    async def signal_with_start(
        self,
        workflow: str,
        input: Any = None,
        *,
        run_id: str,
        token: str,
        payload: Any = None,
        tags: Sequence[str] | None = None,
        search_attributes: dict[str, str | int | float | bool] | None = None,
        version: str | None = None,
        namespace: str | None = None,
    ) -> RunHandle[Any]: ...

    async def signal_with_start(
        self,
        workflow: Workflow[Any, Any] | str,
        input: Any = None,
        *,
        run_id: str,
        token: str,
        payload: Any = None,
        tags: Sequence[str] | None = None,
        search_attributes: dict[str, str | int | float | bool] | None = None,
        version: str | None = None,
        namespace: str | None = None,
    ) -> RunHandle[Any]:
        """Start the run `run_id` unless it exists, then signal `token` with `payload`.

        Decision: every call delivers its signal. Two concurrent callers with the same
        `run_id` end with ONE run (the start is idempotent by id) that receives BOTH
        payloads — the second is buffered (bounded) until the run waits on the token again.
        The signal is never dropped for want of a waiter: the run may not have reached its
        wait yet.
        """
        if not isinstance(run_id, str) or not run_id:
            raise ValueError("signal_with_start needs the run_id that makes it idempotent")
        signals.check_external_token(token)
        # Checked before the start: a payload the signal would refuse must not leave a run.
        signals.check_payload(
            f"signal payload for {token!r}", PLAIN.to_json(payload), self._plane.signal_buffer
        )
        handle = await self.start(
            workflow,
            input,
            run_id=run_id,
            tags=tags,
            search_attributes=search_attributes,
            version=version,
            namespace=namespace,
        )
        await self.signal(token, payload, buffer=True)
        return handle

    # ================================================================== operator actions

    async def cancel(self, run_id: str, *, compensate: bool = False) -> RunResult | None:
        """Cancel the run (and its children); `compensate=True` unwinds its saga first.
        None when the run is unknown; a settled run is returned untouched."""
        await self._ensure_open()
        return await operator.cancel(self._plane, run_id, compensate=compensate)

    async def retry(self, run_id: str) -> RunResult | None:
        """Retry a failed or dead run in place (the console's "retry"): its failed steps
        and failed children run again; None when the run is unknown."""
        await self._ensure_open()
        return await operator.requeue(self._plane, run_id)

    async def retry_with_input(
        self, run_id: str, input: Any, *, new_run_id: str | None = None
    ) -> str | None:
        """Fix-and-replay as a NEW run (`<run_id>~retry~<8 hex>` unless `new_run_id`)
        with `input`; its success is also delivered to the origin's parent. None when the
        run is unknown."""
        given_run_id(new_run_id, what="new run id")  # "" is refused, not made a random id
        await self._ensure_open()
        run = await self._store.get_run(run_id)
        if run is None:
            return None
        new_id = new_run_id or f"{run_id}~retry~{uuid.uuid4().hex[:8]}"
        registered = self._plane.registration(run.workflow, None)
        static = registered.tags if registered is not None else ()
        await self.start(
            registered or run.workflow,
            input,
            run_id=new_id,
            tags=operator.retry_tags(run, static),
            priority=run.priority,  # a fix-and-replay is as urgent as the run it replaces
            namespace=run.namespace,
        )
        return new_id

    async def continue_run(self, run_id: str) -> RunResult | None:
        """Release the run's first pending breakpoint; None when it has none."""
        await self._ensure_open()
        return await operator.continue_run(self._plane, run_id)

    async def delete_run(self, run_id: str) -> int:
        """Delete the run and its children; the number of runs deleted."""
        await self._ensure_open()
        return await operator.delete_run(self._plane, run_id)

    # ================================================================== waiting

    async def wait_for_run(
        self, run_id: str, timeout: float | None = None, until: WaitUntil = "settled"
    ) -> WorkflowRun:
        """Resolve when the run is settled (`until="terminal"`: completed, failed,
        cancelled or dead); `TimeoutError` after `timeout` seconds."""
        await self._ensure_open()
        return await self._watchers.wait(
            self._store, run_id, timeout=timeout, until=until, poll=self._poll
        )
