"""Remote turns against the store: the history a turn is sent, and a decision's commands.

`history_of` turns a run's checkpoints into the `HistoryEvent`s a worker replays. The worker's
replay compares each event's `kind` strictly and its `name` when there is one, so the rows map
exactly: a dispatched step is a `call` named as the step, a step the worker ran itself is a
`step` under its recorded name, a due sleep is a `timer`, a delivered signal is a `signal` and
a child's completion a `child` (both without a name: a worker waits on a signal by its token and
on a child by its workflow, neither of which the row's name says in the worker's terms). Rows
still pending or running, the onError handoff rows and any other engine bookkeeping never reach
a worker.

`apply_commands` writes what one decision asks for, under the run's lease:

- `recordStep`: the local step's row, as the worker recorded it (it overwrites: the decision is
  authoritative over anything streamed while the turn ran);
- `call`: a `pending` remote row, then the step task through the transport pool, unless the
  position already has a row (a fan re-emits its unfinished calls every turn). A dispatch no
  broker takes fails the step (a failed `call` in the next history; the worker decides);
- `sleep`: a `pending` `sleep:<seq>` row with its deadline, keeping an existing row's deadline
  (a re-driven turn re-emits the sleep, and must not push the timer out);
- `waitSignal`: take a buffered signal for the token, else register the waiter and look once
  more (a signal buffered between the two reads would otherwise never be delivered);
- `startChild`: the waiter `child:<runId>.child.<seq>` (and the child's placeholder row), then
  the child is started after the turn if it does not exist yet; a child that already finished
  has its completion sent again (its first announcement may have been lost).

Before any of that, `vet_commands` looks at every command against the rows at its position
and refuses the whole decision (nothing written) when one addresses what is not the run's
own: a `waitSignal` on an engine-owned token (`child:`, `bp:`, `update:`, `event:`, timers,
every prefix `_core/tokens.py` reserves: `Engine.signal` refuses senders the same rule) or on
another run's webhook token; a command at a position holding a row of another kind (a
`recordStep` over a dispatched call, a child's row or a signal); two commands at one
position; a `call` whose `group` is outside the run's namespace (`call_group_refusal`). Every
write below uses the id of the run the decision's task was issued for, never an id the
decision names.

`step_event_refusal` and `step_event_row` are the same rules for a live step event: only an
empty position or a local step still running is a worker's to record.

Every position a command waits on is returned in `Applied.watch`: a row there that is already
settled when the turn is over means something happened after the history was read, and the run
needs another turn at once (the caller checks after it released the lease).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from durably._core.log_context import durably_logger
from durably._core.models import (
    HANDOFF_SEQ_BASE,
    ChildWait,
    RunQuery,
    SignalWaiter,
    StepCheckpoint,
    StepError,
    WorkflowRun,
    delivered_signal,
    ms_from_utc,
    utc_from_ms,
)
from durably._core.tokens import reserved_token_kind
from durably._core.wire import RemoteTask, sanitize_queue_token, step_id_of, tenant_group
from durably._core.wire_turns import (
    CallCommand,
    HistoryEvent,
    HistoryKind,
    RecordStepCommand,
    SleepCommand,
    StartChildCommand,
    WaitSignalCommand,
    WorkflowCommand,
    WorkflowStepEvent,
)
from durably._engine.defs.events import EngineEvent
from durably._engine.defs.vocab import parent_tag
from durably._engine.remote.turn_routes import call_group_refusal
from durably._store.protocol import ReadStore, RunStore

if TYPE_CHECKING:
    from durably._store.protocol import CheckpointStore, SignalStore, StateStore


log = durably_logger("durably.remote")


class ChildReads(RunStore, ReadStore, Protocol):
    """Reading a run's children: by their parent tag, else one by one."""


__all__ = [
    "LATE_STEP_EVENT",
    "Applied",
    "CommandRefusedError",
    "EventSink",
    "StepDispatch",
    "apply_commands",
    "child_run_id",
    "history_of",
    "step_event",
    "step_event_refusal",
    "step_event_row",
    "vet_commands",
]

_SETTLED = ("completed", "failed")
LATE_STEP_EVENT = ("no turn is outstanding", "the position is already settled")
"""How a step event that came after its turn's decision is refused (a reason starts so)."""
_CHILD_ROW = "signal:child:"
# Above this many positions to look at, one listing of the run's rows is cheaper than a
# read per position.
_LIST_OVER = 16


def child_run_id(run_id: str, seq: int) -> str:
    """The id of the child a `startChild` at `seq` starts (the SDK reports exactly this id)."""
    return f"{run_id}.child.{seq}"


# ------------------------------------------------------------------ history


def history_of(cps: Iterable[StepCheckpoint], now_ms: int) -> list[HistoryEvent]:
    """The history of a remote run, in seq order (module docstring)."""
    events: list[HistoryEvent] = []
    for cp in sorted(cps, key=lambda c: c.seq):
        event = _event_of(cp, now_ms)
        if event is not None:
            events.append(event)
    return events


def _event_of(cp: StepCheckpoint, now_ms: int) -> HistoryEvent | None:
    # Negative seqs (saga undo rows) and the onError handoff rows are the engine's own.
    if cp.seq < 0 or cp.seq >= HANDOFF_SEQ_BASE:
        return None
    if cp.kind == "sleep":
        # A sleep is over when its deadline passed, whether or not anything completed its row.
        due = cp.status in _SETTLED or (
            cp.status == "pending" and cp.wake_at is not None and cp.wake_at <= now_ms
        )
        return HistoryEvent(seq=cp.seq, kind="timer", name=cp.name) if due else None
    if cp.status not in _SETTLED:
        return None
    failed = cp.status == "failed"
    if cp.kind == "signal" and cp.name.startswith(_CHILD_ROW):
        return _child_event(cp)
    if cp.kind == "signal":
        if not cp.name.startswith("signal:"):
            return None  # an engine marker (a retired handoff, a breakpoint), not a delivery
        return HistoryEvent(seq=cp.seq, kind="signal", output=None if failed else cp.output)
    kind: HistoryKind = "call" if cp.kind == "remote" else "step"
    if failed:
        return HistoryEvent(
            seq=cp.seq, kind=kind, name=cp.name, error=cp.error or StepError(message="failed")
        )
    return HistoryEvent(seq=cp.seq, kind=kind, name=cp.name, output=cp.output)


def _child_event(cp: StepCheckpoint) -> HistoryEvent:
    """A child's completion (`{ok, value}` / `{ok: false, error, code?, details?}`) as the
    worker reads it: the child's output, or an error with the child's code and details."""
    completion = cp.output
    if not isinstance(completion, dict) or "ok" not in completion:
        return HistoryEvent(seq=cp.seq, kind="child", output=completion)
    if completion.get("ok"):
        return HistoryEvent(seq=cp.seq, kind="child", output=completion.get("value"))
    code = completion.get("code")
    error = StepError(
        message=str(completion.get("error", "child workflow failed")),
        code=code if isinstance(code, str) else None,
        details=completion.get("details"),
    )
    return HistoryEvent(seq=cp.seq, kind="child", error=error)


# ------------------------------------------------------------------ commands


class StepDispatch(Protocol):
    """Where a `call` command's step task goes (the engine's transport pool)."""

    async def dispatch(self, task: RemoteTask) -> object: ...


class EventSink(Protocol):
    def emit(self, event: EngineEvent) -> None: ...


@dataclass
class Applied:
    """What a decision's commands leave for after the turn."""

    wake_at: int | None = None
    """The earliest sleep deadline among the commands."""
    watch: list[int] = field(default_factory=list)
    """Positions whose rows, settled once the turn is over, call for another turn."""
    start: list[StartChildCommand] = field(default_factory=list)
    """Children to start (no run with their id exists)."""
    finished: list[tuple[int, WorkflowRun]] = field(default_factory=list)
    """Children that already finished while their parent still waits: (seq, child run)."""


class CommandRefusedError(ValueError):
    """A decision's command addresses what is not its run's own (module docstring)."""


async def vet_commands(
    store: StateStore,
    run: WorkflowRun,
    commands: Sequence[WorkflowCommand],
    route_group: str | None,
) -> dict[int, StepCheckpoint]:
    """The rows at the commands' positions, once every command is the run's own to apply;
    raises `CommandRefusedError` naming the first that is not. `route_group` is the group
    this engine registered the run's remote workflow with, if any (`call_group_refusal`)."""
    seen: set[int] = set()
    for command in commands:
        if command.seq in seen:
            raise CommandRefusedError(f"two commands at seq {command.seq}")
        seen.add(command.seq)
        if isinstance(command, WaitSignalCommand):
            problem = _foreign_token(command.signal, run.id)
            if problem is not None:
                raise CommandRefusedError(
                    f"waitSignal at seq {command.seq} names {command.signal!r}: {problem}"
                )
        elif isinstance(command, CallCommand):
            problem = call_group_refusal(command.group, run.namespace, route_group)
            if problem is not None:
                raise CommandRefusedError(f"call at seq {command.seq}: {problem}")
    rows = await _rows_at(store, run.id, [c.seq for c in commands])
    for command in commands:
        existing = rows.get(command.seq)
        if existing is not None and not _same_kind(existing, command, run.id):
            raise CommandRefusedError(
                f"{command.kind} at seq {command.seq} would overwrite the {existing.kind} row "
                f"{existing.name!r} there"
            )
    return rows


def _foreign_token(token: str, run_id: str) -> str | None:
    kind = reserved_token_kind(token)
    if kind is not None:
        return f"the engine owns it (a {kind})"
    # A webhook token (`wh:<runId>:<seq>`) is delivered from outside, to that run only.
    if token.startswith("wh:") and not token.startswith(f"wh:{run_id}:"):
        return "another run's webhook token"
    return None


def _same_kind(cp: StepCheckpoint, command: WorkflowCommand, run_id: str) -> bool:
    """Whether the row at a command's position is the one that command itself leaves there
    (a re-driven turn re-emits every operation not yet in its history)."""
    if isinstance(command, RecordStepCommand):
        return cp.kind == "local"
    if isinstance(command, CallCommand):
        return cp.kind == "remote"
    if isinstance(command, SleepCommand):
        return cp.kind == "sleep"
    if isinstance(command, WaitSignalCommand):
        return cp.kind == "signal" and cp.name == f"signal:{command.signal}"
    return cp.kind == "signal" and cp.name == f"{_CHILD_ROW}{child_run_id(run_id, command.seq)}"


async def apply_commands(
    store: StateStore,
    events: EventSink,
    steps: StepDispatch | None,
    run: WorkflowRun,
    commands: Sequence[WorkflowCommand],
    now_ms: int,
    rows: dict[int, StepCheckpoint] | None = None,
) -> Applied:
    """Write one decision's commands for `run` (whose lease the caller holds); `rows` are
    the rows at their positions when the caller already read them (`vet_commands`)."""
    applied = Applied()
    if not commands:
        return applied
    at = utc_from_ms(now_ms)
    if rows is None:
        rows = await _rows_at(store, run.id, [c.seq for c in commands])
    calls: list[CallCommand] = []
    waits: list[ChildWait] = []
    children: list[StartChildCommand] = []
    for command in commands:
        existing = rows.get(command.seq)
        if isinstance(command, RecordStepCommand):
            # Counted once: a step event streamed during the turn may have recorded it.
            first = existing is None or existing.status not in _SETTLED
            await _record_step(store, events if first else None, run, command, now_ms)
        elif isinstance(command, CallCommand):
            applied.watch.append(command.seq)
            if existing is None:
                calls.append(command)
        elif isinstance(command, SleepCommand):
            deadline = _sleep_deadline(existing, command, now_ms)
            if existing is None and deadline is not None:
                await store.save_checkpoint(_sleep_row(run.id, command, deadline, at))
            if deadline is not None:
                applied.wake_at = (
                    deadline if applied.wake_at is None else min(applied.wake_at, deadline)
                )
        elif isinstance(command, WaitSignalCommand):
            applied.watch.append(command.seq)
            if existing is None or existing.status not in _SETTLED:
                await _wait_signal(store, run, command, at)
        else:
            applied.watch.append(command.seq)
            if existing is not None and existing.status in _SETTLED:
                continue  # settled after the history was read: the next turn sees it
            child_id = child_run_id(run.id, command.seq)
            waiter = SignalWaiter(
                token=f"child:{child_id}",
                run_id=run.id,
                seq=command.seq,
                parallel_group=command.parallel_group,
            )
            # The placeholder lets readers show the child as running and lets a cancel of
            # the parent find it; a worker never sees it (a running row is not history).
            placeholder = None if existing is not None else _child_placeholder(waiter, at)
            waits.append(ChildWait(waiter, placeholder))
            children.append(command)
    if waits:
        await store.register_child_waits(waits)
    if children:
        await _sort_children(store, run.id, children, applied)
    if calls:
        await _dispatch_calls(store, events, steps, run, calls, now_ms)
    return applied


async def _rows_at(
    store: CheckpointStore, run_id: str, seqs: list[int]
) -> dict[int, StepCheckpoint]:
    if not seqs:
        return {}
    if len(seqs) > _LIST_OVER:
        wanted = set(seqs)
        return {cp.seq: cp for cp in await store.list_checkpoints(run_id) if cp.seq in wanted}
    rows: dict[int, StepCheckpoint] = {}
    for seq in dict.fromkeys(seqs):
        cp = await store.get_checkpoint(run_id, seq)
        if cp is not None:
            rows[seq] = cp
    return rows


async def _record_step(
    store: CheckpointStore,
    events: EventSink | None,
    run: WorkflowRun,
    cmd: RecordStepCommand,
    now_ms: int,
) -> None:
    started = cmd.started_at if cmd.started_at is not None else now_ms
    finished = cmd.finished_at if cmd.finished_at is not None else now_ms
    failed = cmd.error is not None
    cp = StepCheckpoint(
        run_id=run.id,
        seq=cmd.seq,
        name=cmd.name,
        kind="local",
        step_id=step_id_of(run.id, cmd.seq),
        status="failed" if failed else "completed",
        output=None if failed else cmd.output,
        error=cmd.error,
        attempts=1,
        events=cmd.events or None,
        parallel_group=cmd.parallel_group,
        enqueued_at=utc_from_ms(started),
        started_at=utc_from_ms(started),
        finished_at=utc_from_ms(finished),
    )
    await store.save_checkpoint(cp)
    if events is not None:
        events.emit(step_event(run, cp, "local"))


def step_event(run: WorkflowRun, cp: StepCheckpoint, kind: str) -> EngineEvent:
    # A row of a remote workflow turn: the workflow worker ran the step or dispatched it.
    started = ms_from_utc(cp.started_at)
    if cp.status in ("pending", "running"):
        return EngineEvent(
            type="step.started",
            run_id=run.id,
            workflow=run.workflow,
            seq=cp.seq,
            name=cp.name,
            kind=kind,
            placement="remote",
        )
    return EngineEvent(
        type="step.failed" if cp.status == "failed" else "step.completed",
        run_id=run.id,
        workflow=run.workflow,
        seq=cp.seq,
        name=cp.name,
        kind=kind,
        placement="remote",
        output=cp.output if cp.status == "completed" else None,
        error=cp.error,
        duration_ms=float(max(0, ms_from_utc(cp.finished_at) - started)),
    )


def _sleep_deadline(existing: StepCheckpoint | None, cmd: SleepCommand, now_ms: int) -> int | None:
    if existing is None:
        return now_ms + cmd.ms
    if existing.kind == "sleep" and existing.status == "pending":
        return existing.wake_at
    return None  # already over (or not a sleep at all): nothing to wait for


def _sleep_row(run_id: str, cmd: SleepCommand, deadline: int, at: datetime) -> StepCheckpoint:
    return StepCheckpoint(
        run_id=run_id,
        seq=cmd.seq,
        name=f"sleep:{cmd.seq}",
        kind="sleep",
        step_id=step_id_of(run_id, cmd.seq),
        status="pending",
        attempts=1,
        wake_at=deadline,
        enqueued_at=at,
        started_at=at,
        finished_at=at,
    )


async def _wait_signal(
    store: SignalStore, run: WorkflowRun, cmd: WaitSignalCommand, at: datetime
) -> None:
    waiter = SignalWaiter(token=cmd.signal, run_id=run.id, seq=cmd.seq)
    # A buffered signal leaves the buffer in the write of the wait's checkpoint (one
    # transaction): a crash between two statements would lose it.
    row = delivered_signal(waiter, None, at)
    if await store.take_buffered_signal_into(cmd.signal, row) is None:
        await store.put_signal_waiter(waiter)
        # Check, register, check again (taking our waiter too, unless a sender has it): a
        # signal buffered between the first look and the waiter's insert would otherwise
        # wait in the buffer forever.
        await store.take_buffered_signal_into(cmd.signal, row, waiting=True)


def _child_placeholder(waiter: SignalWaiter, at: datetime) -> StepCheckpoint:
    return StepCheckpoint(
        run_id=waiter.run_id,
        seq=waiter.seq,
        name=f"{_CHILD_ROW}{waiter.token[len('child:') :]}",
        kind="signal",
        step_id=step_id_of(waiter.run_id, waiter.seq),
        status="running",
        attempts=1,
        parallel_group=waiter.parallel_group,
        enqueued_at=at,
        started_at=at,
        finished_at=at,
    )


async def _sort_children(
    store: ChildReads, run_id: str, children: list[StartChildCommand], applied: Applied
) -> None:
    """Split the children into those to start and those already finished."""
    ids = {child_run_id(run_id, c.seq): c for c in children}
    found: dict[str, WorkflowRun] = {}
    if len(ids) > _LIST_OVER:
        for listed in await store.list_runs(RunQuery(tag=parent_tag(run_id))):
            if listed.id in ids:
                found[listed.id] = listed
    else:
        for child_id in ids:
            read = await store.get_run(child_id)
            if read is not None:
                found[child_id] = read
    for child_id, command in ids.items():
        child = found.get(child_id)
        if child is None:
            applied.start.append(command)
        elif child.status in ("completed", "failed", "cancelled", "dead"):
            applied.finished.append((command.seq, child))


async def _dispatch_calls(
    store: CheckpointStore,
    events: EventSink,
    steps: StepDispatch | None,
    run: WorkflowRun,
    calls: list[CallCommand],
    now_ms: int,
) -> None:
    at = utc_from_ms(now_ms)
    rows = [
        StepCheckpoint(
            run_id=run.id,
            seq=c.seq,
            name=c.name,
            kind="remote",
            step_id=step_id_of(run.id, c.seq),
            status="pending",
            input=c.input,
            attempts=1,
            # `group` is the step's partition: the queue is the step's own name.
            worker_group=tenant_group(sanitize_queue_token(c.name), c.group),
            parallel_group=c.parallel_group,
            enqueued_at=at,
            started_at=at,
            finished_at=at,
        )
        for c in calls
    ]
    # The pending rows first, so a result can never arrive before its row. No row exists at
    # these positions (checked under the lease); the writes of one loop turn share a commit.
    await asyncio.gather(*(store.save_checkpoint(cp) for cp in rows))
    todo = rows
    outcomes = await asyncio.gather(
        *(_dispatch_one(steps, run, cp) for cp in todo), return_exceptions=True
    )
    refused: list[StepCheckpoint] = []
    for cp, outcome in zip(todo, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            log.warning(
                "run %s: step %s (seq %d) was not dispatched: %s", run.id, cp.name, cp.seq, outcome
            )
            refused.append(_refused(cp, outcome, now_ms))
        else:
            events.emit(step_event(run, cp, "remote"))
    if refused:
        # No result will ever come for these: fail them now, so the worker sees a failed call
        # (retryable, as a broker outage is) and decides.
        await store.save_checkpoints_if_pending(refused)
        for cp in refused:
            events.emit(step_event(run, cp, "remote"))


async def _dispatch_one(steps: StepDispatch | None, run: WorkflowRun, cp: StepCheckpoint) -> None:
    if steps is None:
        raise RuntimeError("this engine has no transport to dispatch steps on")
    assert cp.worker_group is not None
    await steps.dispatch(
        RemoteTask(
            run_id=run.id,
            seq=cp.seq,
            name=cp.name,
            step_id=cp.step_id,
            group=cp.worker_group,
            input=cp.input,
            attempt=1,
            priority=run.priority,
        )
    )


def _refused(cp: StepCheckpoint, exc: BaseException, now_ms: int) -> StepCheckpoint:
    return StepCheckpoint(
        run_id=cp.run_id,
        seq=cp.seq,
        name=cp.name,
        kind="remote",
        step_id=cp.step_id,
        status="failed",
        input=cp.input,
        error=StepError(
            message=f"remote step worker failed: the step could not be dispatched ({exc})",
            retryable=True,
        ),
        attempts=1,
        worker_group=cp.worker_group,
        parallel_group=cp.parallel_group,
        enqueued_at=cp.enqueued_at,
        started_at=cp.started_at,
        finished_at=utc_from_ms(now_ms),
    )


# ------------------------------------------------------------------ step events


def step_event_refusal(current: StepCheckpoint | None, event: WorkflowStepEvent) -> str | None:
    """Why `event` may not be written over `current`, the row at its position, else None: a
    worker streams only its own local steps, so only an empty position or a local step still
    running is its to record (never a dispatched call, a sleep, a signal or child, never a
    settled outcome); a `running` only where nothing is yet."""
    if current is None:
        return None
    if current.kind != "local":
        return f"seq {event.seq} holds a {current.kind} row ({current.name!r})"
    if current.status in _SETTLED:
        return f"{LATE_STEP_EVENT[1]} (seq {event.seq}, {current.status})"
    if event.phase == "running":
        return f"seq {event.seq} is already recorded ({current.status})"
    return None


def step_event_row(event: WorkflowStepEvent, now_ms: int) -> StepCheckpoint:
    started = utc_from_ms(event.started_at)
    running = event.phase == "running"
    finished = started if running else utc_from_ms(event.finished_at or now_ms)
    return StepCheckpoint(
        run_id=event.run_id,
        seq=event.seq,
        name=event.name,
        kind="local",
        step_id=step_id_of(event.run_id, event.seq),
        status=event.phase,
        output=event.output if event.phase == "completed" else None,
        error=event.error,
        attempts=1,
        events=event.events or None,
        parallel_group=event.parallel_group,
        enqueued_at=started,
        started_at=started,
        finished_at=finished,
    )
