"""Fans: `ctx.all` / `ctx.all_settled`.

A workflow-fan member is a child run started with the single-child protocol; a step-fan
member is an `Execution.run_step`. Each member has its own seq; a fully successful wave of
a workflow fan is folded into one `fan:` row (see `_fold_wave`).

Decisions (in-process transport): a step-fan member is an ordinary
`run_step` at its own seq — like `ctx.step`, one row per attempt (no `pending` row before
execution: the dispatching process is the executing one), every row tagged with the group.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, TypeVar

from durably._core.admission import QueueCall
from durably._core.errors import (
    GatherError,
    GatherItemFailure,
    StepFailedError,
    WorkflowSuspended,
    _ControlFlow,
)
from durably._core.log_context import durably_logger
from durably._core.models import ChildWait, JSONValue, SignalWaiter, StepCheckpoint, replace
from durably._engine.defs.registry import RetryPolicy, Step, Workflow
from durably._engine.defs.typed_io import PLAIN, ValueCodec
from durably._engine.run import children
from durably._engine.run.execution import Execution, ReplayNow
from durably._engine.run.host import RunHost
from durably._engine.run.steps import run_step
from durably._store.protocol import BULK_CHUNK

log = durably_logger("durably.engine")

O = TypeVar("O")
FanMode = Literal["wait_all", "fail_fast"]


# ------------------------------------------------------------------ Settled (all_settled items)


@dataclass(frozen=True, slots=True)
class Settled(Generic[O]):
    """One item of `ctx.all_settled`: `Fulfilled(value)` or `Rejected(id, error, ...)`."""

    status: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    @staticmethod
    def from_json(data: dict[str, Any]) -> Settled[Any]:
        if data.get("status") == "fulfilled":
            return Fulfilled(data.get("value"))
        return Rejected(
            id=str(data.get("id")),
            error=str(data.get("error")),
            code=data.get("code"),
            details=data.get("details"),
        )


@dataclass(frozen=True, slots=True)
class Fulfilled(Settled[O]):
    value: O
    status: ClassVar[str] = "fulfilled"

    def to_json(self) -> dict[str, Any]:
        return {"status": "fulfilled", "value": self.value}


@dataclass(frozen=True, slots=True)
class Rejected(Settled[Any]):
    id: str
    error: str
    code: str | None = None
    details: JSONValue = None
    status: ClassVar[str] = "rejected"

    def to_json(self) -> dict[str, Any]:
        # `code`/`details` keys are omitted when absent.
        out: dict[str, Any] = {"status": "rejected", "id": self.id, "error": self.error}
        if self.code is not None:
            out["code"] = self.code
        if self.details is not None:
            out["details"] = self.details
        return out


# ------------------------------------------------------------------ shared


def fan_group(first_seq: int, total: int, fail_fast: bool) -> str:
    """The parallel-group tag `all:<firstSeq>:<total>[:ff]` on every member row: a reader (the join
    barrier, summaries) knows the fan's seq range and mode without the body."""
    return f"all:{first_seq}:{total}" + (":ff" if fail_fast else "")


def _waves(n: int, concurrency: int | None) -> list[range]:
    # Launch window: all N, or waves [k*c, (k+1)*c); wave k+1 launches only once every
    # member of wave k settled (same rule for workflow and step fans).
    if concurrency is None or concurrency >= n:
        return [range(n)]
    return [range(k, min(n, k + concurrency)) for k in range(0, n, concurrency)]


@dataclass(slots=True)
class _Outcome:
    ok: bool
    value: Any = None
    error: str = ""
    code: str | None = None
    details: JSONValue = None


def _finish(
    outcomes: Sequence[_Outcome | None],
    ids: list[str],
    mode: FanMode,
    settled: bool,
) -> list[Any]:
    n = len(ids)
    done = [o for o in outcomes if o is not None]
    assert len(done) == n
    if settled:
        return [
            Fulfilled(o.value) if o.ok else Rejected(ids[i], o.error, o.code, o.details)
            for i, o in enumerate(done)
        ]
    failures = [_failure(i, ids[i], o) for i, o in enumerate(done) if not o.ok]
    if failures:
        raise GatherError(failures, total=n)
    return [o.value for o in done]


def _failure(index: int, id: str, o: _Outcome) -> GatherItemFailure:
    return GatherItemFailure(index, id, o.error, o.code, o.details)


# ------------------------------------------------------------------ workflow fan


def _completion_outcome(completion: Any, codec: ValueCodec) -> _Outcome:
    """A child's Completion as an outcome, like `ctx._unwrap` but without raising: a failed
    child's code/details are kept for the GatherItemFailure / Rejected item."""
    if isinstance(completion, dict) and completion.get("ok") is True:
        value = completion.get("value")
        return _Outcome(True, None if value is None else codec.from_json(value))
    if isinstance(completion, dict):
        return _Outcome(
            False,
            error=str(completion.get("error")),
            code=completion.get("code"),
            details=completion.get("details"),
        )
    return _Outcome(False, error=str(completion))


async def workflow_fan(
    ex: Execution,
    workflow: Workflow[Any, Any] | str,
    inputs: list[Any],
    first: int,
    *,
    mode: FanMode,
    concurrency: int | None,
    settled: bool,
    priority: int | None = None,
) -> list[Any]:
    """Run one child of `workflow` per input. Members carry `priority` when given, else
    their parent's (children.create_children)."""
    host = ex.host
    store = ex.store
    n = len(inputs)
    fail_fast = mode == "fail_fast" and not settled
    group = fan_group(first, n, fail_fast)
    codec = workflow.output_codec if isinstance(workflow, Workflow) else PLAIN
    if concurrency is None:
        ids = [f"{ex.run_id}.all.{first}.{i}" for i in range(n)]
    else:
        # Windowed member ids: `.w<k>.<i>`, k = i // concurrency (the wave), i = input index.
        ids = [f"{ex.run_id}.all.{first}.w{i // concurrency}.{i}" for i in range(n)]
    # Each member's raw Completion once it settled. Kept as JSON (dicts of plain values,
    # which the garbage collector does not track), and the member's row is dropped from the
    # snapshot once read: a 40,000-member fan must not keep 40,000 row objects alive for
    # every full collection to walk (that made wide fans super-linear).
    completions: list[Any] = [_NOT_YET] * n

    def wave_start(i: int) -> int:
        return 0 if concurrency is None else i - i % concurrency

    def record(i: int) -> bool | None:
        """None while member `i` has not settled; else whether it succeeded."""
        if completions[i] is _NOT_YET:
            head = ex.snapshot.get(first + wave_start(i))
            if head is not None and (folded := _folded(head)) is not None:
                start, values = folded
                completions[i] = values[i - start]
            else:
                cp = ex.snapshot.get(first + i)
                if cp is None or cp.status != "completed" or cp.name.startswith("fan:"):
                    return None
                completions[i] = cp.output
                del ex.snapshot[first + i]
        return _completion_ok(completions[i])

    unresolved: set[int] = set()  # members of the waves so far without an outcome yet
    bad: list[int] = []

    def first_failure() -> int | None:
        # failFast: scanning in INPUT order, the first completed member
        # whose Completion is ok:false (members of later waves have no rows). Incremental:
        # each member is looked at until it has an outcome, so O(N) over the whole fan.
        for i in list(unresolved):
            outcome = record(i)
            if outcome is not None:
                unresolved.discard(i)
                if not outcome:
                    bad.append(i)
        return min(bad) if bad else None

    async def stop(index: int) -> None:
        o = _completion_outcome(completions[index], codec)
        # Decision (failFast): remove our own waiters of the members not
        # yet completed BEFORE cancelling them, so their `cancelled` completions are
        # buffered instead of landing at fan seqs; a replay then finds the same first
        # failure. The cancel is a deferred plain cancel, errors swallowed, idempotent.
        pending = [i for i in range(n) if record(i) is None]
        for i in pending:
            await store.remove_signal_waiter(
                SignalWaiter(token=f"child:{ids[i]}", run_id=ex.run_id, seq=first + i)
            )
        host.spawn(_cancel_quietly(host, [ids[i] for i in pending]))
        raise GatherError([_failure(index, ids[index], o)], total=n)

    def take(cp: StepCheckpoint) -> None:
        # Deliveries that land while the fan is still launching are recorded (and their rows
        # dropped) as they arrive, not kept until the wait starts.
        if first <= cp.seq < first + n and cp.status == "completed":
            record(cp.seq - first)

    ex.fan_watches.append(take)
    try:
        for wave in _waves(n, concurrency):
            unresolved.update(wave)
            # Before (re)launching: a replay of a fan that already stopped must not register
            # waiters again; with waves, no further wave is ever started.
            if fail_fast and (failure := first_failure()) is not None:
                await stop(failure)
            await _launch_members(
                ex,
                workflow,
                inputs,
                ids,
                first,
                [i for i in wave if record(i) is None],
                group,
                priority,
            )
            outstanding = [i for i in wave if record(i) is None]
            if fail_fast and (failure := first_failure()) is not None:
                await stop(failure)
            if outstanding:
                if not ex.resident:
                    # Classic mode: suspend once for the whole wave; the lost-wake
                    # guard of the suspend settle re-reads the awaited rows.
                    ex.waiting_seqs.update(first + i for i in outstanding)
                    raise WorkflowSuspended(None)
                # Resident: park once until the whole wave settled; failFast
                # (decision) wakes on the first failure observed — the first failed member in
                # INPUT order among those settled then, what a replay scan also finds.
                await _await_members(ex, first, ids, outstanding, record, fail_fast)
                if fail_fast and (failure := first_failure()) is not None:
                    await stop(failure)
            if n >= host.options.fold_fans_over and all(record(i) is True for i in wave):
                prefix = ids[wave.start].rsplit(".", 1)[0]
                await _fold_wave(
                    ex, first, wave, prefix, group, completions[wave.start : wave.stop]
                )
    finally:
        ex.fan_watches.remove(take)
    outcomes = [_completion_outcome(c, codec) for c in completions]
    return _finish(outcomes, ids, mode, settled)


_NOT_YET: Any = object()  # a member Completion not known yet


def _completion_ok(completion: Any) -> bool:
    return isinstance(completion, dict) and completion.get("ok") is True


def _folded(cp: StepCheckpoint) -> tuple[int, list[Any]] | None:
    """A folded `fan:` row: (first input index, completions)."""
    if not cp.name.startswith("fan:") or not isinstance(cp.output, dict):
        return None
    completions = cp.output.get("completions")
    if not isinstance(completions, list):
        return None
    return int(cp.output.get("first", 0)), completions


async def _fold_wave(
    ex: Execution, first: int, wave: range, prefix: str, group: str, completions: list[Any]
) -> None:
    """A settled wave of a wide workflow fan becomes ONE `fan:` row at the
    wave's first seq (the other seqs hold no row), so the run keeps O(waves) rows instead of
    O(N). Decision: only waves whose members ALL succeeded fold — a failed member keeps its
    own row, so `requeue` can re-arm it in place and a failed-only page can list it. The
    fold is one transaction, idempotent under replay (a replay reads either form)."""
    head = ex.snapshot.get(first + wave.start)
    if head is not None and head.name.startswith("fan:"):
        return
    cp = ex.instant(
        first + wave.start,
        f"fan:{prefix}",
        "signal",
        output={"first": wave.start, "count": len(wave), "completions": completions},
        parallel_group=group,
    )
    await ex.store.fold_checkpoints(ex.run_id, first + wave.start, first + wave.stop - 1, cp)
    for i in wave:
        ex.snapshot.pop(first + i, None)
    ex.snapshot[cp.seq] = cp


async def _launch_members(
    ex: Execution,
    workflow: Workflow[Any, Any] | str,
    inputs: list[Any],
    ids: list[str],
    first: int,
    indices: list[int],
    group: str,
    priority: int | None,
) -> None:
    """The single-child protocol (as in `ctx.child`) for the not-completed members of a wave,
    in bulk: waiters and `running` placeholders in one `register_child_waits`
    transaction (waiter FIRST, so no completion can miss it), then every absent child created
    with multi-row inserts (children.create_children)."""
    # In chunks: each chunk's rows are built, written and dropped before the next, so a
    # 40,000-member launch never holds 40,000 pending row objects at once.
    for start in range(0, len(indices), BULK_CHUNK):
        await _launch_chunk(
            ex, workflow, inputs, ids, first, indices[start : start + BULK_CHUNK], group, priority
        )


async def _launch_chunk(
    ex: Execution,
    workflow: Workflow[Any, Any] | str,
    inputs: list[Any],
    ids: list[str],
    first: int,
    indices: list[int],
    group: str,
    priority: int | None,
) -> None:
    placeholders: dict[int, StepCheckpoint] = {}
    waits: list[ChildWait] = []
    for i in indices:
        token = f"child:{ids[i]}"
        waiter = SignalWaiter(token=token, run_id=ex.run_id, seq=first + i, parallel_group=group)
        placeholder = None
        if ex.snapshot.get(first + i) is None:
            placeholder = ex.instant(
                first + i, f"signal:{token}", "signal", status="running", parallel_group=group
            )
            placeholders[i] = placeholder
        waits.append(ChildWait(waiter, placeholder))
    await children.register_waits(ex.store, waits)
    # Members with a row already (a replay) are included: the insert is idempotent, and a
    # crash between the placeholders and the children must not leave a member unstarted.
    existed = await children.create_children(
        ex.host, workflow, [(ids[i], inputs[i]) for i in indices], ex.run, priority
    )
    # A replay: members whose row still waits may have a child that finished while its
    # announcement was lost (children.recover_completions).
    waiting = {ids[i]: first + i for i in indices if i not in placeholders}
    await children.recover_completions(ex, waiting)
    # Lost-wake guard, needed only where the child existed before this launch wrote the
    # member's waiter: its completion may have been buffered, so it is re-read here.
    fresh_members = {ids[i]: i for i in placeholders}
    for child_id in existed:
        i = fresh_members.get(child_id, -1)
        if i < 0:
            continue
        token = f"child:{child_id}"
        # Taken with the member's waiter in the checkpoint's transaction (a crash between
        # two statements would lose the completion), unless a delivery has the waiter.
        row = ex.instant(first + i, f"signal:{token}", "signal", parallel_group=group)
        hit = await ex.store.take_buffered_signal_into(token, row, waiting=True)
        if hit is not None:
            ex.snapshot[row.seq] = replace(row, output=hit.payload)


async def _await_members(
    ex: Execution,
    first: int,
    ids: list[str],
    indices: list[int],
    record: Callable[[int], bool | None],
    fail_fast: bool,
) -> None:
    """Resident wait for a wave: O(1) per delivered member (a watch on the execution), one
    park for the whole wave. A re-check wake (a member settled by another process, which
    only nudges) re-reads the run's rows once."""
    left = {first + i for i in indices if record(i) is None}
    failed = False

    def settle(cp: StepCheckpoint) -> None:
        nonlocal failed
        if cp.seq in left and cp.status == "completed":
            left.discard(cp.seq)
            outcome = record(cp.seq - first)  # always: it keeps the member's Completion
            failed = failed or outcome is False

    def watch(cp: StepCheckpoint) -> None:
        settle(cp)
        if not left or (fail_fast and failed):
            ex.poke()

    ex.fan_watches.append(watch)
    try:
        while left and not (fail_fast and failed):
            if not await ex.park_for_fan():
                for cp in await ex.store.list_checkpoints(ex.run_id):
                    if cp.seq in left and cp.status == "completed":
                        ex.snapshot[cp.seq] = cp
                        settle(cp)
                waiting = {ids[seq - first]: seq for seq in left}
                for cp in await children.recover_completions(ex, waiting):
                    settle(cp)
    finally:
        ex.fan_watches.remove(watch)


async def _cancel_quietly(host: RunHost, ids: list[str]) -> None:
    for child_id in ids:
        try:
            await host.cancel(child_id)
        except Exception:
            log.debug("fail_fast cancel of %s failed", child_id, exc_info=True)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


# ------------------------------------------------------------------ step fan


async def step_fan(
    ex: Execution,
    name: str,
    definition: Step[Any, Any] | None,
    inputs: list[Any],
    first: int,
    policy: RetryPolicy,
    *,
    mode: FanMode,
    concurrency: int | None,
    settled: bool,
    queue: QueueCall | None = None,
) -> list[Any]:
    """One step per input; with `queue`, each member's attempts wait for a slot of that
    flow-control queue like any `ctx.step(queue=...)`."""
    n = len(inputs)
    fail_fast = mode == "fail_fast" and not settled
    group = fan_group(first, n, fail_fast)
    ids = [f"{ex.run_id}:{first + i}" for i in range(n)]  # member id = its step id
    outcomes: list[_Outcome | None] = [None] * n
    for wave in _waves(n, concurrency):
        await _step_wave(
            ex,
            name,
            definition,
            inputs,
            first,
            policy,
            group,
            wave,
            outcomes,
            ids,
            fail_fast,
            queue,
        )
    return _finish(outcomes, ids, mode, settled)


async def _step_wave(
    ex: Execution,
    name: str,
    definition: Step[Any, Any] | None,
    inputs: list[Any],
    first: int,
    policy: RetryPolicy,
    group: str,
    wave: range,
    outcomes: list[_Outcome | None],
    ids: list[str],
    fail_fast: bool,
    queue: QueueCall | None,
) -> None:
    # O(1) per settled member: each task reports itself on a queue (an
    # `asyncio.wait(FIRST_COMPLETED)` loop re-registers on every pending task per
    # wake-up, O(N²) for a 40,000-member fan).
    #
    # Decision (in-process transport): the whole wave is launched, but at most
    # `fan_window` member tasks exist at once — a new one starts as one settles, like a
    # worker pool with that many slots. It bounds the live coroutines (memory, and the
    # garbage collector's work, which otherwise grows with N per member) without
    # changing what the fan returns; `concurrency` waves keep their own meaning.
    settled_q: asyncio.Queue[asyncio.Task[Any]] = asyncio.Queue()
    tasks: dict[asyncio.Task[Any], int] = {}
    to_launch = iter(wave)

    def launch_next() -> None:
        i = next(to_launch, None)
        if i is None:
            return
        task = asyncio.ensure_future(
            run_step(ex, first + i, name, definition, inputs[i], policy, None, group, queue)
        )
        tasks[task] = i
        task.add_done_callback(settled_q.put_nowait)

    for _ in range(min(len(wave), ex.host.options.fan_window)):
        launch_next()
    flow: list[tuple[int, BaseException]] = []
    stopping = False
    try:
        while tasks:
            task = await settled_q.get()
            i = tasks.pop(task)
            exc = task.exception()
            # A member waiting for its retry (a suspension) does not hold the others
            # back; after any other control-flow signal no new member starts.
            stopping = stopping or (
                isinstance(exc, _ControlFlow) and not isinstance(exc, WorkflowSuspended)
            )
            if not stopping:
                launch_next()
            if exc is None:
                outcomes[i] = _Outcome(True, task.result())
            elif isinstance(exc, StepFailedError):
                # A member failed for good: its recorded StepError surfaces.
                se = exc.step_error
                failed = _Outcome(False, error=se.message, code=se.code, details=se.details)
                outcomes[i] = failed
                if fail_fast:
                    # failFast: raise with the first member failed
                    # for good; decision: siblings still in flight are cancelled
                    # (their late results are ignored anyway).
                    raise GatherError([_failure(i, ids[i], failed)], total=len(ids))
            else:
                flow.append((i, exc))
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
            task.add_done_callback(_retrieve)
    if flow:
        # Decision: every in-flight member of the wave settles before the turn ends (so
        # its checkpoint lands); then the most severe signal propagates: store
        # failure / eviction / NonDeterminism first, then ReplayNow, then a suspension
        # at the earliest wakeAt among members.
        raise _pick(flow)


def _pick(flow: list[tuple[int, BaseException]]) -> BaseException:
    excs = [e for _, e in flow]
    for e in excs:
        if not isinstance(e, WorkflowSuspended | ReplayNow) and isinstance(e, _ControlFlow):
            return e
    for e in excs:
        if not isinstance(e, _ControlFlow):
            return e
    for e in excs:
        if isinstance(e, ReplayNow):
            return e
    wakes = [e.wake_at for e in excs if isinstance(e, WorkflowSuspended)]
    known = [w for w in wakes if w is not None]
    return WorkflowSuspended(min(known) if known else None)
