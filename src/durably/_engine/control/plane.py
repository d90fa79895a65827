"""The collaborators of the control-plane operations (start, signal, cancel, retry, …).

A `ControlPlane` is what `durably.Client` works through: the store, the clock, the
signal-buffer policy, a way to announce a change to other processes (the store's wake bus),
and — only inside an `Engine` — the `LocalRuns` hooks of an engine that drives runs in this
same process. Without those hooks (a bare `Client` in a web process) every effect goes
through the store and the wake bus, and whichever worker holds the run does the rest.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from durably._core.errors import SerializationError
from durably._core.models import (
    LIVE_RUN_STATUSES,
    JSONValue,
    RunResult,
    StepCheckpoint,
    StepError,
    WorkflowRun,
    now_utc,
)
from durably._core.quota import SINGLETON_ADMITTED_TAG
from durably._engine.control import signals
from durably._engine.control.signals import SignalBufferPolicy
from durably._engine.control.start import StartRequest, check_run_text
from durably._engine.defs.vocab import may_have_parent
from durably._engine.flow.quotas import check_existing_run, refuse, start_gate

if TYPE_CHECKING:
    from durably._engine.defs.registry import Workflow
    from durably._store.protocol import StateStore

__all__ = ["UNPINNED_VERSION", "ControlPlane", "LocalRuns"]

# `workflow_version` of a run started by name without a version by a process that does not
# have the workflow's code: the worker that first drives it runs its newest registered
# version and writes that version on the run (so every later turn, on any worker, replays
# the same version).
UNPINNED_VERSION = ""

Announce = Callable[[str, str], Awaitable[None]]


class LocalRuns(Protocol):
    """What an engine driving runs in THIS process adds to a control-plane operation.

    An `Engine` passes these hooks to the `Client` it is composed of; a bare `Client` has
    none and relies on the store and the wake bus alone.
    """

    def registration(self, name: str, version: str | None) -> Workflow[Any, Any] | None:
        """The workflow registered here under that name (newest when `version` is None)."""
        ...

    async def run_created(self, run_id: str) -> None:
        """A run was just created by this process: drive it (or announce it)."""
        ...

    def run_ready(self, run_id: str) -> None:
        """A run became runnable again (requeued, asked to cancel with compensation)."""
        ...

    async def redrive(self, run_id: str, cp: StepCheckpoint | None) -> None:
        """Something a run waits for happened (`cp` is the row just written, if any)."""
        ...

    def request_cancel(self, run_id: str) -> bool:
        """Ask a run executing here to unwind; False when it does not execute here."""
        ...

    def stop(self, run_id: str) -> None:
        """Stop a run executing here at once (cancelled or deleted under it)."""
        ...

    def run_cancelled(self, run: WorkflowRun, error: StepError) -> None:
        """Tell local listeners a run was cancelled (its event, `on_cancel`)."""
        ...

    def notify_parent(self, run: WorkflowRun, completion: dict[str, Any]) -> None:
        """Deliver a finished run's completion to its parent (batched, in the background)."""
        ...


class ControlPlane:
    """The store, clock, buffer policy and wake announcements one client works with, plus
    the local hooks of the engine it belongs to (None for a standalone client)."""

    __slots__ = ("announce", "clock", "local", "namespace", "signal_buffer", "store")

    def __init__(
        self,
        store: StateStore,
        *,
        clock: Callable[[], int],
        signal_buffer: SignalBufferPolicy,
        announce: Announce,
        namespace: str | None,
        local: LocalRuns | None = None,
    ):
        self.store = store
        self.clock = clock
        self.signal_buffer = signal_buffer
        self.announce = announce
        self.namespace = namespace
        self.local = local

    # ------------------------------------------------------------------ runs

    async def create_run(
        self,
        request: StartRequest,
        json_input: JSONValue,
        *,
        registered: Workflow[Any, Any] | None = None,
        fresh: bool = True,
    ) -> str:
        """Insert the `pending` run `request` asks for (idempotent by its run id: a run of
        the same workflow in the same namespace is returned as it is; another workflow, or a
        run of another namespace, is a `RunIdConflictError`), then have it driven.
        `registered`: the workflow it runs, when known here — the run is pinned to its
        version and carries its tags; without it the run is created by name, pinned to
        `request.version` (or unpinned). The workflow's quota and singleton options
        (`registered`, else the registration here) and the start's own
        `concurrency`/`dedup_id` are checked with the insert (`quotas.py`); a refused start
        creates nothing. `fresh=False`: the run already has checkpoints (a fork's copied
        rows), so its first turn must read them rather than take it as a new run's."""
        workflow = request.workflow
        if registered is not None:
            version = registered.version
            # A workflow's own tags come first; they are code, not the caller's input, but
            # are held to the same rules so a bad one fails alike on every store.
            check_run_text(workflow, registered.tags, None)
            tags: Sequence[str] = [*registered.tags, *request.tags]
        else:
            version = request.version if request.version is not None else UNPINNED_VERSION
            tags = request.tags
        rid = request.run_id or str(uuid.uuid4())
        ns = request.namespace or self.namespace or "default"
        prepared = await start_gate(
            registered or self.registration(workflow, version or None),
            json_input,
            name=workflow,
            namespace=ns,
            concurrency=request.concurrency,
            dedup_id=request.dedup_id,
        )
        merged = [t for t in dict.fromkeys([*tags, *prepared.tags]) if t != SINGLETON_ADMITTED_TAG]
        search_attributes = request.search_attributes
        now = now_utc()
        run = WorkflowRun(
            id=rid,
            workflow=workflow,
            workflow_version=version,
            status="pending",
            input=json_input,
            tags=tuple(merged) if merged else None,
            search_attributes=dict(search_attributes) if search_attributes else None,
            namespace=ns,
            priority=request.priority,
            created_at=now,
            updated_at=now,
        )
        if prepared.gate is not None:
            outcome = await self.store.create_run_gated(run, prepared.gate)
            given = refuse(
                outcome, prepared, name=workflow, run_id=rid, on_duplicate=request.on_duplicate
            )
            if outcome.verdict == "exists":
                await self._check_existing(rid, workflow, ns)
            if outcome.verdict != "created":
                return given  # the existing run (by id), or the live holder of the dedup id
            await self._created(rid, fresh)
            return rid
        try:
            # Insert first and read only on conflict: one round trip for a new run.
            await self.store.create_run(run)
        except SerializationError:
            raise
        except Exception:
            existing = await self.store.get_run(rid)
            if existing is None:
                raise
            check_existing_run(existing, name=workflow, namespace=ns)
            return rid
        await self._created(rid, fresh)
        return rid

    async def _check_existing(self, rid: str, workflow: str, namespace: str) -> None:
        """The run holding `rid` must be this start's (same workflow, same namespace)."""
        existing = await self.store.get_run(rid)
        if existing is not None:
            check_existing_run(existing, name=workflow, namespace=namespace)

    async def _created(self, rid: str, fresh: bool = True) -> None:
        if not fresh:
            await self.run_ready(rid)
        elif self.local is not None:
            await self.local.run_created(rid)
        else:
            await self.announce("ready", rid)

    def registration(self, name: str, version: str | None) -> Workflow[Any, Any] | None:
        return self.local.registration(name, version) if self.local is not None else None

    async def run_ready(self, run_id: str) -> None:
        if self.local is not None:
            self.local.run_ready(run_id)
        else:
            await self.announce("ready", run_id)

    def request_cancel(self, run_id: str) -> bool:
        return self.local.request_cancel(run_id) if self.local is not None else False

    def stop(self, run_id: str) -> None:
        if self.local is not None:
            self.local.stop(run_id)

    def run_cancelled(self, run: WorkflowRun, error: StepError) -> None:
        if self.local is not None:
            self.local.run_cancelled(run, error)

    # ------------------------------------------------------------------ signals

    async def redrive(self, run_id: str, cp: StepCheckpoint | None = None) -> None:
        if self.local is not None:
            await self.local.redrive(run_id, cp)
            return
        # Driven elsewhere: make it due now so its holder's timer poll wakes it, and say so
        # on the wake bus so that happens within milliseconds.
        if await self.store.update_run_if_status(
            run_id, {"wake_at": self.clock()}, LIVE_RUN_STATUSES
        ):
            await self.announce("ready", run_id)

    async def signal(
        self,
        token: str,
        payload: Any,
        *,
        want_result: bool = False,
        buffer: signals.BufferMode = "durable",
    ) -> RunResult | None:
        """The internal signal path (any token, the engine's own namespaces included)."""
        return await signals.signal(self, token, payload, want_result=want_result, buffer=buffer)

    async def notify_parent(self, run: WorkflowRun, completion: dict[str, Any]) -> None:
        """Tell a finished run's parent (only runs that can have one are announced)."""
        if self.local is not None:
            self.local.notify_parent(run, completion)
            return
        if not may_have_parent(run):
            return
        await self.signal(f"child:{run.id}", completion)
        if "~retry~" in run.id and completion.get("ok"):
            await self.signal(f"child:{run.id.split('~retry~')[0]}", completion)
