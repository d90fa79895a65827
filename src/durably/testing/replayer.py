"""`Replayer`: replay a recorded run against the code deployed now, without executing a step.

The history (`load_history`) is loaded into a fresh in-memory store — the run as
`pending` with no lease, and every recorded checkpoint — and an ordinary engine over that
store, given the workflows and steps, re-drives the run. The engine's own replay serves
every recorded position from the history, so no recorded step runs again; the engine is
built inside a replay guard (`_engine/run/replay_guard.py`) that holds any step or local
step the history does not have before its body could run. What counts as divergence:

1. The code asks, at a recorded position, for another checkpoint than the one recorded (a
   step inserted, removed or renamed before the end of the history, not guarded by
   `ctx.patched`): the engine's own `NonDeterminismError`, raised again here.
2. The recorded run ended by its own code (completed or failed) and the code wants to do
   work the history does not have (a step appended after the last recorded one, or a
   recorded failure the code now retries): `NonDeterminismError` naming that step.
3. The recorded run completed or failed and the replay ends otherwise (another status, or
   a completed run with another output): `NonDeterminismError` naming both endings.

A history of a live run (suspended, running, pending, blocked) ends where it was recorded:
work past its last checkpoint is the run's future, not a divergence, and the replay stops
there. A cancelled or dead run was ended from outside its code (an operator, the recovery
limit), so its history is read the same way: where the code would have gone next is not
recorded, and the replay checks only the positions it holds. A replay that neither ends
nor stops within `timeout` seconds is a `TimeoutError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durably._core.errors import NonDeterminismError
from durably._core.models import JSONValue, RunStatus, replace
from durably._engine.defs.registry import Step, Workflow
from durably._engine.engine import Engine
from durably._engine.run.replay_guard import REPLAY_GUARD
from durably._read.history import RunHistory
from durably._store.memory import InMemoryStateStore
from durably.testing.history import load_history

__all__ = ["ReplayResult", "Replayer", "history_files", "replay_histories"]

# How long a replay may take by default: it executes no step, so only a body that waits on
# something outside the history (a child the replay had to start) comes near it.
DEFAULT_TIMEOUT = 30.0


# The endings a run's own code decides: a replay must reach the same one. Cancelled and dead
# runs were ended from outside, so their histories stop where they were recorded.
_ENDED_BY_CODE: tuple[RunStatus, ...] = ("completed", "failed")


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a green replay did: the run's status where the replay ended (`completed`,
    `failed` for a history that ended so; `suspended` or `stopped` for a live, cancelled
    or dead one — `stopped` means the code reached work past the history, `next_step`
    names it)."""

    run_id: str
    workflow: str
    recorded_status: RunStatus
    status: str
    output: JSONValue = None
    next_step: str | None = None


@dataclass(frozen=True, slots=True)
class _Held:
    seq: int
    name: str


class _Guard:
    """The replay guard of one replay: records the first new work of the replayed run and
    holds every turn that reaches new work until the replay's engine is closed."""

    def __init__(self, run_id: str) -> None:
        self._run_id = run_id
        self.held: _Held | None = None
        self.reached = asyncio.Event()

    async def new_work(self, run_id: str, seq: int, name: str) -> None:
        if run_id == self._run_id and self.held is None:
            self.held = _Held(seq, name)
            self.reached.set()
        await asyncio.Event().wait()  # released only by the engine's close (cancelled)


class Replayer:
    """Replays recorded histories against `workflows` (and `steps`, for steps a body calls
    by name), the code deployed now. `timeout`: seconds one replay may take."""

    def __init__(
        self,
        *,
        workflows: Iterable[Workflow[Any, Any]],
        steps: Iterable[Step[Any, Any]] = (),
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._workflows = list(workflows)
        if not self._workflows:
            raise ValueError("Replayer(workflows=[...]): give the workflows to replay")
        self._steps = list(steps)
        if timeout <= 0:
            raise ValueError(f"Replayer(timeout={timeout!r}): seconds > 0")
        self._timeout = timeout

    def _check_registered(self, history: RunHistory) -> None:
        run = history.run
        versions = [wf.version for wf in self._workflows if wf.name == run.workflow]
        if not versions:
            names = sorted({wf.name for wf in self._workflows})
            raise ValueError(
                f"the history is a run of workflow {run.workflow!r}, which is not among the "
                f"Replayer's workflows ({', '.join(names)})"
            )
        if run.workflow_version not in versions:
            raise ValueError(
                f"the history is a run of version {run.workflow_version!r} of workflow "
                f"{run.workflow!r}; the Replayer has versions {', '.join(sorted(versions))}"
            )

    async def replay(self, history: RunHistory | Mapping[str, Any] | str | Path) -> ReplayResult:
        """Replay `history` (a `RunHistory`, a history dict or a path to its JSON file).

        Returns a `ReplayResult` when the code follows the history; raises
        `NonDeterminismError` when it does not (see the module's rules),
        `HistoryFormatError` for a malformed history, `ValueError` when the history's
        workflow (or its version) is not among `workflows`."""
        loaded = load_history(history)
        self._check_registered(loaded)
        recorded = loaded.run
        store = InMemoryStateStore()
        await store.create_run(
            replace(
                recorded,
                status="pending",  # picked up by the replay's engine like a new run
                output=None,
                error=None,
                wake_at=None,
                locked_by=None,
                locked_until=None,
                awaiting_decision_task_id=None,
            )
        )
        await store.save_checkpoints(list(loaded.checkpoints))
        guard = _Guard(recorded.id)
        token = REPLAY_GUARD.set(guard)
        try:
            engine = Engine(
                store,
                workflows=self._workflows,
                steps=self._steps,
                namespace=recorded.namespace,
                drain_timeout_ms=0,  # a held turn never ends by itself: close cancels it
            )
            async with engine:
                await self._until_done(engine, guard, recorded.id)
        finally:
            REPLAY_GUARD.reset(token)
        replayed = await store.get_run(recorded.id)
        assert replayed is not None  # created above; nothing deletes it
        return _judge(loaded, replayed.status, replayed.output, replayed.error, guard.held)

    async def _until_done(self, engine: Engine, guard: _Guard, run_id: str) -> None:
        """Let the engine pick the run up and drive it until it is settled (suspended,
        blocked or ended) or the guard holds it at new work; `TimeoutError` after
        `timeout`. The run's status is what ends the wait, not the engine's turns: a
        suspended run may stay resident (parked in memory) with its turn still open."""
        settled = asyncio.ensure_future(engine.wait_for_run(run_id))
        held = asyncio.ensure_future(guard.reached.wait())
        try:
            await engine.run_pending()
            done, _ = await asyncio.wait(
                {settled, held}, timeout=self._timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (settled, held):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if not done:
            raise TimeoutError(
                f"the replay of run {run_id!r} did not end within {self._timeout}s: "
                "its body waits on something the history does not hold"
            )

    def replay_sync(self, history: RunHistory | Mapping[str, Any] | str | Path) -> ReplayResult:
        """`replay` from synchronous code (runs its own event loop)."""
        return asyncio.run(self.replay(history))


def _judge(
    history: RunHistory,
    status: RunStatus,
    output: JSONValue,
    error: Any,
    held: _Held | None,
) -> ReplayResult:
    recorded = history.run
    if error is not None and error.code == NonDeterminismError.code:
        details = error.details if isinstance(error.details, Mapping) else {}
        raise NonDeterminismError(
            recorded.id,
            int(details.get("seq", -1)),
            str(details.get("expected", "?")),
            str(details.get("recorded", "?")),
        )
    ended = recorded.status in _ENDED_BY_CODE
    last = max((cp.seq for cp in history.checkpoints), default=-1)
    if held is not None and ended:
        raise NonDeterminismError(
            recorded.id,
            held.seq,
            held.name,
            f"the end of the history (the run {recorded.status} after seq {last})",
        )
    result = ReplayResult(
        run_id=recorded.id,
        workflow=recorded.workflow,
        recorded_status=recorded.status,
        status="stopped" if held is not None else status,
        output=output,
        next_step=held.name if held is not None else None,
    )
    if ended and (status != recorded.status or output != recorded.output):
        raise NonDeterminismError(
            recorded.id,
            last + 1,
            f"the run {status} with output {output!r}",
            f"the run {recorded.status} with output {recorded.output!r}",
        )
    return result


def _history_files(folder: str | Path) -> list[Path]:
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"replay_histories: {root} is not a folder")
    return sorted(root.glob("*.json"))


def replay_histories(
    folder: str | Path,
    *,
    workflows: Iterable[Workflow[Any, Any]],
    steps: Iterable[Step[Any, Any]] = (),
    timeout: float = DEFAULT_TIMEOUT,
) -> list[ReplayResult]:
    """Replay every `*.json` history in `folder` (in name order) against `workflows`: the
    results, or an `AssertionError` naming each file that did not replay and why (every
    file is replayed, so one run reports all of them). A folder without histories is an
    `AssertionError` too: a check that replays nothing must not pass."""
    files = _history_files(folder)
    if not files:
        raise AssertionError(f"replay_histories: no *.json history in {folder}")
    replayer = Replayer(workflows=workflows, steps=steps, timeout=timeout)
    results: list[ReplayResult] = []
    failures: list[str] = []
    for path in files:
        try:
            results.append(replayer.replay_sync(path))
        except Exception as exc:  # every failure is reported with its file
            failures.append(f"{path.name}: {type(exc).__name__}: {exc}")
    if failures:
        raise AssertionError(
            f"{len(failures)} of {len(files)} histories in {folder} did not replay:\n"
            + "\n".join(failures)
        )
    return results


def history_files(folder: str | Path) -> Iterator[Path]:
    """The `*.json` histories of `folder` in name order, for a parametrized test
    (`@pytest.mark.parametrize("path", history_files(...), ids=lambda p: p.name)`)."""
    yield from _history_files(folder)
