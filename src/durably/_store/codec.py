"""The payload codec wrapper: `CodecStateStore(inner, codec)`.

A `Codec` turns a JSON payload into another JSON value at rest and back (`encode`/`decode`,
synchronous, exact inverses; `None` is never passed to it and stays `None`). The wrapper
implements the whole `StateStore` contract over any complete store, encoding on every write
and decoding on every read of:

- run `input`/`output` (create, update when the key is in the patch, every run read);
- checkpoint `input`/`output` (every checkpoint write and read, bulk ones included);
- buffered signal payloads (`buffer_signal`, `buffer_signal_bounded`, `take_buffered_signal`)
  and buffered event payloads.

Everything else is searchable metadata and passes through untouched: ids, statuses, names,
tags, search attributes, namespace, origin, timestamps, `error` (a structured error stays
readable), checkpoint `events`, waiter rows, and every aggregate (counts, facets,
`checkpoint_stats`), which read no payload.

Methods outside the contract are NOT forwarded — a payload-carrying method the wrapper
cannot encode must fail rather than write cleartext — while plain data attributes (test
hooks such as `statement_count`) are readable through the wrapper.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from durably._core.aggregates import CheckpointQuery, CheckpointStat
from durably._core.buffered_signals import BufferedSignalInfo, BufferScope
from durably._core.models import (
    BufferedEvent,
    BufferedSignal,
    ChildWait,
    JSONValue,
    RunPatch,
    RunQuery,
    RunStatus,
    SignalWaiter,
    StepCheckpoint,
    WorkflowRun,
    replace,
)
from durably._core.run_facets import (
    LeaseOwnerRow,
    RunFacetRow,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
)
from durably._store.protocol import InstanceHold, StateStore, WakeBus, require_store


@runtime_checkable
class Codec(Protocol):
    """`decode(encode(v)) == v` for every JSON value `v` other than None.
    The encoded form must itself be JSON (it is stored in the payload's JSON column)."""

    def encode(self, value: JSONValue) -> JSONValue: ...
    def decode(self, value: JSONValue) -> JSONValue: ...


class CodecError(ValueError):
    """A stored value could not be decoded (wrong key, tampered or foreign data)."""


class CodecStateStore:
    """Any complete `StateStore` (`inner`) with its payloads encoded by `codec` at rest."""

    def __init__(self, inner: Any, codec: Codec):
        self._inner: StateStore = require_store(inner)
        self._codec = codec

    @property
    def inner(self) -> Any:
        """The wrapped store (reads through it return the encoded values)."""
        return self._inner

    @property
    def codec(self) -> Codec:
        return self._codec

    def __getattr__(self, name: str) -> Any:
        # Plain data attributes of the inner store (test hooks, counters) read through;
        # methods never do (see the module docstring).
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._inner, name)
        if callable(value):
            raise AttributeError(
                f"{type(self).__name__} does not forward {name!r}: it cannot tell whether "
                "the method carries payloads"
            )
        return value

    def __repr__(self) -> str:
        return f"CodecStateStore({self._inner!r}, {self._codec!r})"

    # ------------------------------------------------------------------ value mapping

    def _enc(self, value: JSONValue) -> JSONValue:
        return None if value is None else self._codec.encode(value)

    def _dec(self, value: JSONValue) -> JSONValue:
        return None if value is None else self._codec.decode(value)

    def _run_in(self, run: WorkflowRun) -> WorkflowRun:
        if run.input is None and run.output is None:
            return run
        return replace(run, input=self._enc(run.input), output=self._enc(run.output))

    def _run_out(self, run: WorkflowRun | None) -> Any:
        if run is None or (run.input is None and run.output is None):
            return run
        return replace(run, input=self._dec(run.input), output=self._dec(run.output))

    def _runs_out(self, runs: Sequence[WorkflowRun]) -> list[WorkflowRun]:
        return [self._run_out(run) for run in runs]

    def _patch_in(self, patch: RunPatch) -> RunPatch:
        if "input" not in patch and "output" not in patch:
            return patch
        encoded = RunPatch(**patch)
        if "input" in encoded:
            encoded["input"] = self._enc(encoded["input"])
        if "output" in encoded:
            encoded["output"] = self._enc(encoded["output"])
        return encoded

    def _cp_in(self, cp: StepCheckpoint) -> StepCheckpoint:
        if cp.input is None and cp.output is None:
            return cp
        return replace(cp, input=self._enc(cp.input), output=self._enc(cp.output))

    def _cp_out(self, cp: StepCheckpoint | None) -> Any:
        if cp is None or (cp.input is None and cp.output is None):
            return cp
        return replace(cp, input=self._dec(cp.input), output=self._dec(cp.output))

    def _cps_out(self, cps: Sequence[StepCheckpoint]) -> list[StepCheckpoint]:
        return [self._cp_out(cp) for cp in cps]

    # ------------------------------------------------------------------ runs

    async def ensure_schema(self) -> None:
        await self._inner.ensure_schema()

    async def close(self) -> None:
        await self._inner.close()

    async def create_run(self, run: WorkflowRun) -> None:
        await self._inner.create_run(self._run_in(run))

    async def update_run(self, run_id: str, patch: RunPatch) -> None:
        await self._inner.update_run(run_id, self._patch_in(patch))

    async def get_run(self, run_id: str) -> WorkflowRun | None:
        run: WorkflowRun | None = self._run_out(await self._inner.get_run(run_id))
        return run

    async def delete_run(self, run_id: str) -> None:
        await self._inner.delete_run(run_id)

    async def update_run_if_status(
        self, run_id: str, patch: RunPatch, statuses: Sequence[RunStatus]
    ) -> bool:
        return bool(await self._inner.update_run_if_status(run_id, self._patch_in(patch), statuses))

    async def create_runs(self, runs: Sequence[WorkflowRun]) -> list[str | None]:
        result: list[str | None] = await self._inner.create_runs([self._run_in(r) for r in runs])
        return result

    # ------------------------------------------------------------------ checkpoints

    async def get_checkpoint(self, run_id: str, seq: int) -> StepCheckpoint | None:
        cp: StepCheckpoint | None = self._cp_out(await self._inner.get_checkpoint(run_id, seq))
        return cp

    async def save_checkpoint(self, cp: StepCheckpoint) -> None:
        await self._inner.save_checkpoint(self._cp_in(cp))

    async def list_checkpoints(self, run_id: str) -> list[StepCheckpoint]:
        return self._cps_out(await self._inner.list_checkpoints(run_id))

    async def get_latest_checkpoint_by_name(self, run_id: str, name: str) -> StepCheckpoint | None:
        found: StepCheckpoint | None = self._cp_out(
            await self._inner.get_latest_checkpoint_by_name(run_id, name)
        )
        return found

    async def list_checkpoints_by_name_prefix(
        self, run_id: str, prefixes: Sequence[str]
    ) -> list[StepCheckpoint]:
        return self._cps_out(await self._inner.list_checkpoints_by_name_prefix(run_id, prefixes))

    async def count_checkpoints(
        self, run_id: str, from_seq: int, to_seq: int, statuses: Sequence[str]
    ) -> int:
        return await self._inner.count_checkpoints(run_id, from_seq, to_seq, statuses)

    async def checkpoint_stats(self, run_id: str, group: str | None = None) -> list[CheckpointStat]:
        return await self._inner.checkpoint_stats(run_id, group)

    async def save_checkpoint_if_pending(self, cp: StepCheckpoint) -> bool:
        return bool(await self._inner.save_checkpoint_if_pending(self._cp_in(cp)))

    async def save_checkpoints_if_pending(self, cps: Sequence[StepCheckpoint]) -> list[bool]:
        result: list[bool] = await self._inner.save_checkpoints_if_pending(
            [self._cp_in(cp) for cp in cps]
        )
        return result

    async def query_checkpoints(self, run_id: str, query: CheckpointQuery) -> list[StepCheckpoint]:
        return self._cps_out(await self._inner.query_checkpoints(run_id, query))

    async def fold_checkpoints(
        self, run_id: str, first_seq: int, last_seq: int, cp: StepCheckpoint
    ) -> None:
        await self._inner.fold_checkpoints(run_id, first_seq, last_seq, self._cp_in(cp))

    async def register_child_waits(self, waits: Sequence[ChildWait]) -> None:
        await self._inner.register_child_waits(
            [
                w if w.placeholder is None else replace(w, placeholder=self._cp_in(w.placeholder))
                for w in waits
            ]
        )

    async def deliver_signals(
        self, payloads: Sequence[tuple[str, JSONValue]], at: datetime
    ) -> list[StepCheckpoint]:
        encoded = [(token, self._enc(payload)) for token, payload in payloads]
        return self._cps_out(await self._inner.deliver_signals(encoded, at))

    # ------------------------------------------------------------------ pick-up scans, leases

    async def list_incomplete_runs(self, namespace: str | None = None) -> list[WorkflowRun]:
        return self._runs_out(await self._inner.list_incomplete_runs(namespace))

    async def list_pending_runs(
        self, limit: int, namespace: str | None = None
    ) -> list[WorkflowRun]:
        return self._runs_out(await self._inner.list_pending_runs(limit, namespace))

    async def list_due_timers(
        self, now_ms: int, namespace: str | None = None, limit: int | None = None
    ) -> list[WorkflowRun]:
        return self._runs_out(await self._inner.list_due_timers(now_ms, namespace, limit))

    async def list_orphaned_suspended(
        self, now_ms: int, namespace: str | None = None, limit: int = 100
    ) -> list[WorkflowRun]:
        return self._runs_out(await self._inner.list_orphaned_suspended(now_ms, namespace, limit))

    async def try_lock_run(self, run_id: str, owner: str, lease_until_ms: int, now_ms: int) -> bool:
        return bool(await self._inner.try_lock_run(run_id, owner, lease_until_ms, now_ms))

    async def release_run_lock(self, run_id: str) -> None:
        await self._inner.release_run_lock(run_id)

    async def renew_run_lock(self, run_id: str, owner: str, lease_until_ms: int) -> bool:
        return bool(await self._inner.renew_run_lock(run_id, owner, lease_until_ms))

    async def renew_run_locks(self, owner: str, lease_until_ms: int) -> int:
        return await self._inner.renew_run_locks(owner, lease_until_ms)

    async def release_locks_of(self, owner: str) -> int:
        return await self._inner.release_locks_of(owner)

    async def hold_instance(self, instance_id: str) -> InstanceHold | None:
        return await self._inner.hold_instance(instance_id)

    def wake_bus(self) -> WakeBus | None:
        return self._inner.wake_bus()

    async def claim_run(
        self, run_id: str, owner: str, lease_until_ms: int, now_ms: int
    ) -> WorkflowRun | None:
        run: WorkflowRun | None = self._run_out(
            await self._inner.claim_run(run_id, owner, lease_until_ms, now_ms)
        )
        return run

    async def claim_runs(
        self, ids: Sequence[str], owner: str, lease_until_ms: int, now_ms: int
    ) -> list[WorkflowRun]:
        return self._runs_out(await self._inner.claim_runs(ids, owner, lease_until_ms, now_ms))

    async def claim_pending_runs(
        self,
        owner: str,
        lease_until_ms: int,
        now_ms: int,
        limit: int,
        namespace: str | None = None,
    ) -> list[WorkflowRun]:
        return self._runs_out(
            await self._inner.claim_pending_runs(owner, lease_until_ms, now_ms, limit, namespace)
        )

    # ------------------------------------------------------------------ waiters (verbatim)

    async def put_signal_waiter(self, waiter: SignalWaiter) -> None:
        await self._inner.put_signal_waiter(waiter)

    async def take_signal_waiter(self, token: str) -> SignalWaiter | None:
        waiter: SignalWaiter | None = await self._inner.take_signal_waiter(token)
        return waiter

    async def list_signal_waiters(self, prefix: str) -> list[SignalWaiter]:
        waiters: list[SignalWaiter] = await self._inner.list_signal_waiters(prefix)
        return waiters

    async def remove_signal_waiter(self, waiter: SignalWaiter) -> None:
        await self._inner.remove_signal_waiter(waiter)

    # ------------------------------------------------------------------ buffered signals/events

    async def buffer_signal(self, token: str, payload: JSONValue) -> None:
        await self._inner.buffer_signal(token, self._enc(payload))

    async def take_buffered_signal(self, token: str) -> BufferedSignal | None:
        hit: BufferedSignal | None = await self._inner.take_buffered_signal(token)
        if hit is None or hit.payload is None:
            return hit
        return BufferedSignal(payload=self._dec(hit.payload))

    async def buffer_signal_bounded(
        self, token: str, payload: JSONValue, *, ttl_ms: int, per_token: int, per_namespace: int
    ) -> BufferScope | None:
        refused: BufferScope | None = await self._inner.buffer_signal_bounded(
            token,
            self._enc(payload),
            ttl_ms=ttl_ms,
            per_token=per_token,
            per_namespace=per_namespace,
        )
        return refused

    # Operator access to the buffer reads and deletes no payload (a listing reports the
    # size of the stored, i.e. encoded, form): passed through.

    async def list_buffered_signals(
        self, *, prefix: str | None, limit: int, offset: int
    ) -> list[BufferedSignalInfo]:
        rows: list[BufferedSignalInfo] = await self._inner.list_buffered_signals(
            prefix=prefix, limit=limit, offset=offset
        )
        return rows

    async def count_buffered_signals(self, *, prefix: str | None = None) -> int:
        return int(await self._inner.count_buffered_signals(prefix=prefix))

    async def purge_buffered_signals(
        self, *, token: str | None = None, prefix: str | None = None, expired_only: bool = False
    ) -> int:
        return int(
            await self._inner.purge_buffered_signals(
                token=token, prefix=prefix, expired_only=expired_only
            )
        )

    async def buffer_event(self, event: BufferedEvent) -> None:
        if event.payload is not None:
            event = replace(event, payload=self._enc(event.payload))
        await self._inner.buffer_event(event)

    async def list_buffered_events(self, name: str, limit: int) -> list[BufferedEvent]:
        events: list[BufferedEvent] = await self._inner.list_buffered_events(name, limit)
        return [
            e if e.payload is None else replace(e, payload=self._dec(e.payload)) for e in events
        ]

    async def remove_buffered_event(self, event_id: str) -> bool:
        return bool(await self._inner.remove_buffered_event(event_id))

    # ------------------------------------------------------------------ listing and counting

    async def list_runs(self, query: RunQuery) -> list[WorkflowRun]:
        return self._runs_out(await self._inner.list_runs(query))

    async def count_runs(self, query: RunQuery) -> int:
        return await self._inner.count_runs(query)

    async def run_facets(self, query: RunQuery) -> list[RunFacetRow]:
        return await self._inner.run_facets(query)

    async def run_value_facets(
        self,
        axis: RunValueAxis,
        query: RunQuery,
        opts: RunValueFacetOptions | None = None,
    ) -> list[RunValueFacetRow]:
        return await self._inner.run_value_facets(axis, query, opts)

    async def lease_owners(self, now_ms: int, namespace: str | None = None) -> list[LeaseOwnerRow]:
        return await self._inner.lease_owners(now_ms, namespace)


def wrap_store(store: Any, codec: Codec | None) -> Any:
    """`Engine(codec=...)`: the store wrapped in a `CodecStateStore` (unchanged for None)."""
    if codec is None:
        return store
    if not isinstance(codec, Codec):
        raise TypeError("codec must have encode(value) and decode(value) methods")
    return CodecStateStore(store, codec)


__all__ = ["Codec", "CodecError", "CodecStateStore", "wrap_store"]
