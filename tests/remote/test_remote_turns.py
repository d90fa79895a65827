"""Remote workflow turns, with the published durable-worker 0.26.1 replaying every turn.

The engine side is real: an `Engine` on a real SQLite file or PostgreSQL schema, its router,
deliveries, child mailbox and step-result settler, and `RemoteTurns` built from them (the turn
driver hands runs to it once it is wired in; here the test leases a run and calls `advance`
itself, one turn at a time). The workflow worker is the SDK itself, unmodified, in its own
virtualenv: each `WorkflowTask` the engine queued on the in-memory turn channel below is fed to
the SDK's own workflow replay (`Worker.process_workflow_task`), and the decision JSON it prints
(plus the step events it streamed) is handed back to the engine. So the wire shapes are proven
both ways without a broker. Steps the workflows call go over the in-memory transport; the test
answers them as a step worker would.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from durably import (
    Engine,
    OnErrorRoute,
    StepCheckpoint,
    StepError,
    Workflow,
    WorkflowRun,
    remote_workflow,
)
from durably._core.models import HANDOFF_SEQ_BASE
from durably._core.wire import RemoteTask, StepResult
from durably._core.wire_turns import parse_workflow_decision
from durably._engine.control.start import StartRequest
from durably._engine.remote.turns import RemoteTurns
from durably.transports import InMemoryTransport, TransportPool
from tests.pg_support import fresh_schema, schema_url
from tests.remote.durable_worker_env import durable_worker_python
from tests.store.support import try_lock

# ------------------------------------------------------------------ the SDK side

# Runs under the SDK's interpreter: one JSON request per line ({task, cancelled?}), one JSON
# answer per line ({decision, stepEvents}), produced by the SDK's own replay.
SDK_PROGRAM = r"""
import json
import sys

from durable_worker import FatalError, Worker, WorkflowWorker

worker = Worker(auto_register=False)
split = WorkflowWorker(group="wf-split", auto_register=False)


@worker.workflow("greet")
def greet(ctx, input):
    name = ctx.step("py.upper", input["name"])
    at = ctx.now()
    ctx.sleep(250)
    return {"hi": name, "at": at}


@worker.workflow("approval")
def approval(ctx, input):
    said = ctx.wait_signal("approve-" + input["id"])
    return {"approved": said}


@worker.workflow("family")
def family(ctx, input):
    first = ctx.start_child("leaf", {"x": 1})
    settled = ctx.all_settled("leaf", [{"x": 2}, {"fail": True}])
    return {"first": first, "settled": settled}


@worker.workflow("leaf")
def leaf(ctx, input):
    if input.get("fail"):
        raise FatalError("leaf refused", code="leaf_bad", details={"why": "asked"})
    return input["x"] * 10


@worker.workflow("fanout")
def fanout(ctx, input):
    return ctx.gather_calls(
        [{"name": "py.a", "input": 1}, {"name": "py:b", "input": 2, "group": "default"}]
    )


@worker.workflow("broken")
def broken(ctx, input):
    ctx.side_effect(lambda: "before")
    raise FatalError("it broke", code="bad_input", details={"field": "x"})


@worker.workflow("fixer")
def fixer(ctx, failure):
    return {"fixed": failure["error"]["code"], "of": failure["runId"]}


@worker.workflow("stepfail")
def stepfail(ctx, input):
    return ctx.step("py.fails", input)


@split.workflow("splitwf")
def splitwf(ctx, input):
    return ctx.step("py.echo", input)


for line in sys.stdin:
    request = json.loads(line)
    task = request["task"]
    streamed = []
    is_cancelled = (lambda run_id: True) if request.get("cancelled") else None
    if split.handles(task["workflow"]):
        decision = split.process_task(task, on_step=streamed.append, is_cancelled=is_cancelled)
    else:
        decision = worker.process_workflow_task(
            task, on_step=streamed.append, is_cancelled=is_cancelled
        )
    print(json.dumps({"decision": decision, "stepEvents": streamed}), flush=True)
"""


class Sdk:
    """The SDK's replay in a subprocess of its own interpreter."""

    def __init__(self, python: Path):
        self._proc = subprocess.Popen(
            [str(python), "-c", SDK_PROGRAM],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lock = threading.Lock()

    def _replay(self, task: dict[str, Any], cancelled: bool) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with self._lock:
            self._proc.stdin.write(json.dumps({"task": task, "cancelled": cancelled}) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        assert line, "the SDK process died"
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def replay(
        self, task: dict[str, Any], *, cancelled: bool = False
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The SDK's decision for `task` and the step events it streamed meanwhile."""
        answer = await asyncio.to_thread(self._replay, task, cancelled)
        return answer["decision"], answer["stepEvents"]

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(timeout=10)


@pytest.fixture(scope="module")
def sdk() -> Iterator[Sdk]:
    runner = Sdk(durable_worker_python())
    yield runner
    runner.close()


# ------------------------------------------------------------------ the engine side


class MemoryTurns:
    """A turn channel whose broker is a list: the test reads the tasks the engine queued."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def dispatch_turn(self, task: dict[str, object], *, token: str) -> None:
        # What a broker would carry: the JSON text, read back.
        self.sent.append((token, json.loads(json.dumps(task))))

    async def start_turns(self, sink: object) -> None:
        return None


@dataclass
class Directory:
    """Live worker groups and their descriptors, as a transport with descriptors reports them."""

    tokens: set[str] = field(default_factory=set)
    descriptors: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    async def list_worker_groups(self) -> set[str]:
        return set(self.tokens)

    async def read_worker_descriptors(self, token: str | None = None) -> list[dict[str, Any]]:
        return list(self.descriptors.get(token or "", []))


class Clock:
    def __init__(self) -> None:
        self.now = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


class RefusingSteps:
    async def dispatch(self, task: RemoteTask) -> object:
        raise ConnectionError("broker down")


@dataclass
class Harness:
    engine: Engine
    turns: RemoteTurns
    channel: MemoryTurns
    transport: InMemoryTransport
    clock: Clock
    sdk: Sdk

    @property
    def store(self) -> Any:
        return self.engine.store

    async def run(self, run_id: str) -> WorkflowRun:
        run = await self.store.get_run(run_id)
        assert run is not None
        return run

    async def issue(self, run_id: str) -> dict[str, Any]:
        """Lease the run as a turn driver would and issue a turn; the task it queued."""
        now = self.clock()
        run = await self.store.claim_run(run_id, self.engine.instance_id, now + 30_000, now)
        assert run is not None, f"{run_id} is leased"
        before = len(self.channel.sent)
        assert await self.turns.drive_if_remote(run)  # the turn driver's hook
        assert len(self.channel.sent) == before + 1, "no turn was queued"
        return self.channel.sent[-1][1]

    async def replay(self, task: dict[str, Any], **kw: Any) -> dict[str, Any]:
        """The SDK replays the turn; its step events and decision go back to the engine."""
        decision, streamed = await self.sdk.replay(task, **kw)
        if streamed:
            await self.turns.step_events(streamed)
        await self.turns.decisions([decision])
        return decision

    async def turn(self, run_id: str, **kw: Any) -> dict[str, Any]:
        return await self.replay(await self.issue(run_id), **kw)

    async def answer_steps(self, output_of: Any) -> list[RemoteTask]:
        """Answer every step task dispatched so far (as a step worker would)."""
        tasks = list(self.transport.broker.dispatched)
        self.transport.broker.dispatched.clear()
        for task in tasks:
            self.transport.broker.publish_result(
                StepResult(
                    run_id=task.run_id,
                    seq=task.seq,
                    step_id=task.step_id,
                    status="completed",
                    output=output_of(task),
                    started_at=self.clock(),
                )
            )
        return tasks

    async def until(self, what: Any, timeout: float = 10) -> None:
        async with asyncio.timeout(timeout):
            while not await what():  # noqa: ASYNC110 - polls the store, not an event
                await asyncio.sleep(0.02)

    async def until_due(self, run_id: str) -> None:
        """Wait until something made the run due for a new turn (a nudge or its timer)."""

        async def due() -> bool:
            run = await self.run(run_id)
            return run.wake_at is not None and run.wake_at <= self.clock()

        await self.until(due)


@pytest.fixture(params=["sqlite", "postgres"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/turns.db"
        return
    async with fresh_schema() as schema:
        yield schema_url(schema)


@asynccontextmanager
async def harness(
    store_url: str,
    sdk: Sdk,
    workflows: list[Workflow[Any, Any]],
    *,
    directory: Directory | None = None,
    steps: Any = None,
    silence_ms: int | None = None,
) -> AsyncIterator[Harness]:
    clock = Clock()
    transport = InMemoryTransport()
    # A control replica (`drive=False`): nothing drives runs behind the test's back; every turn
    # is issued by the test, and every wake shows as a nudge (`wake_at` = now).
    engine = Engine(
        store=store_url, transport=transport, workflows=workflows, drive=False, clock=clock
    )
    async with engine:
        worker = engine._worker  # the runtime's parts, until the lead wires RemoteTurns in
        channel = MemoryTurns()
        turns = RemoteTurns(
            worker.settling,
            worker._router,
            worker.deliveries,
            worker.plane,
            channel=channel,
            directory=directory,
            steps=steps if steps is not None else TransportPool([("default", transport)]),
            registration=worker.registration,
            start_registered=worker.start_child_soon,
            spawn=worker.spawn,
            clock=clock,
            fallback_wake_at=worker.fallback_wake_at,
            instance_id=engine.instance_id,
            namespace=engine.namespace,
            lease_ms=30_000,
            silence_ms=silence_ms,
        )
        yield Harness(engine, turns, channel, transport, clock, sdk)


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def wf(name: str, **kw: Any) -> Workflow[Any, Any]:
    return remote_workflow(name, **kw)


# ------------------------------------------------------------------ history


async def test_the_history_is_built_from_the_checkpoints_by_the_naming_rules(
    store_url: str, sdk: Sdk
) -> None:
    async with harness(store_url, sdk, [wf("greet")]) as h:
        await h.engine.start("greet", {"name": "ada"}, run_id="hist")
        now = h.clock()
        t = at(now)

        def row(seq: int, name: str, kind: Any, status: Any, **kw: Any) -> StepCheckpoint:
            return StepCheckpoint(
                run_id="hist",
                seq=seq,
                name=name,
                kind=kind,
                step_id=f"hist:{seq}",
                status=status,
                started_at=t,
                finished_at=t,
                **kw,
            )

        failure = StepError(message="card declined", code="declined", details={"n": 2})
        for cp in [
            row(0, "py.charge", "remote", "completed", output={"ok": 1}),
            row(1, "py.charge", "remote", "failed", error=failure),
            row(2, "py.slow", "remote", "pending"),
            row(3, "now#3", "local", "completed", output=1234),
            row(4, "sideEffect", "local", "running"),
            row(5, "sleep:5", "sleep", "pending", wake_at=now - 1),
            row(6, "sleep:6", "sleep", "pending", wake_at=now + 60_000),
            row(7, "signal:approve", "signal", "completed", output={"yes": True}),
            row(
                8,
                "signal:child:hist.child.8",
                "signal",
                "completed",
                output={"ok": True, "value": 80},
            ),
            row(
                9,
                "signal:child:hist.child.9",
                "signal",
                "completed",
                output={"ok": False, "error": "nope", "code": "leaf_bad", "details": [1]},
            ),
            row(10, "signal:child:hist.child.10", "signal", "running"),
            row(11, "breakpoint", "signal", "pending"),
            row(12, "sideEffect", "local", "failed", error=StepError(message="boom")),
            row(
                HANDOFF_SEQ_BASE,
                "signal:child:hist.onError.1",
                "signal",
                "completed",
                output={"ok": True, "value": 1},
            ),
            row(HANDOFF_SEQ_BASE + 1, "handoff:retired:hist.onError.2", "signal", "completed"),
        ]:
            await h.store.save_checkpoint(cp)
        history = [event.to_json() for event in await h.turns.history("hist")]
    assert history == [
        {"seq": 0, "kind": "call", "name": "py.charge", "output": {"ok": 1}},
        {
            "seq": 1,
            "kind": "call",
            "name": "py.charge",
            "error": {"message": "card declined", "code": "declined", "details": {"n": 2}},
        },
        {"seq": 3, "kind": "step", "name": "now#3", "output": 1234},
        {"seq": 5, "kind": "timer", "name": "sleep:5"},
        {"seq": 7, "kind": "signal", "output": {"yes": True}},
        {"seq": 8, "kind": "child", "output": 80},
        {
            "seq": 9,
            "kind": "child",
            "error": {"message": "nope", "code": "leaf_bad", "details": [1]},
        },
        {"seq": 12, "kind": "step", "name": "sideEffect", "error": {"message": "boom"}},
    ]


# ------------------------------------------------------------------ turns end to end


async def test_a_remote_run_advances_turn_by_turn_with_the_sdk_replaying(
    store_url: str, sdk: Sdk
) -> None:
    async with harness(store_url, sdk, [wf("greet")]) as h:
        await h.engine.start("greet", {"name": "ada"}, run_id="g1")

        # Turn 1: the task, then the run parked waiting for exactly that turn, lease free.
        task = await h.issue("g1")
        token, _ = h.channel.sent[-1]
        assert token == "greet"
        assert task == {
            "taskId": task["taskId"],
            "runId": "g1",
            "workflow": "greet",
            "workflowVersion": "1",
            "input": {"name": "ada"},
            "history": [],
            "group": "greet",
            "attempt": 1,
        }
        assert task["taskId"].startswith("g1:wf:") and len(task["taskId"]) == len("g1:wf:") + 8
        run = await h.run("g1")
        assert (run.status, run.awaiting_decision_task_id, run.locked_by) == (
            "suspended",
            task["taskId"],
            None,
        )
        assert run.wake_at == h.clock() + h.engine.options.reconcile_ms

        decision = await h.replay(task)
        assert decision["status"] == "continue"
        assert decision["commands"] == [
            {"kind": "call", "seq": 0, "name": "py.upper", "group": "default", "input": "ada"}
        ]
        call = await h.store.get_checkpoint("g1", 0)
        assert (call.kind, call.status, call.worker_group, call.input) == (
            "remote",
            "pending",
            "py.upper",
            "ada",
        )
        run = await h.run("g1")
        assert (run.status, run.awaiting_decision_task_id) == ("suspended", None)
        sent = await h.answer_steps(lambda t: t.input.upper())
        assert [(t.step_id, t.group, t.attempt, t.input) for t in sent] == [
            ("g1:0", "py.upper", 1, "ada")
        ]
        await h.until_due("g1")  # the result settled and woke the run

        # Turn 2: the call is history; the SDK runs `now` itself and sleeps.
        task = await h.issue("g1")
        assert task["history"] == [{"seq": 0, "kind": "call", "name": "py.upper", "output": "ADA"}]
        decision = await h.replay(task)
        assert [c["kind"] for c in decision["commands"]] == ["recordStep", "sleep"]
        recorded = await h.store.get_checkpoint("g1", 1)
        assert (recorded.name, recorded.kind, recorded.status) == ("now#1", "local", "completed")
        sleep = await h.store.get_checkpoint("g1", 2)
        assert (sleep.name, sleep.status, sleep.wake_at) == ("sleep:2", "pending", h.clock() + 250)
        run = await h.run("g1")
        assert run.wake_at == h.clock() + 250  # the timer, not the reconcile wake

        # Turn 3, once the timer is due: the run completes with the body's output.
        h.clock.advance(250)
        task = await h.issue("g1")
        assert [e["kind"] for e in task["history"]] == ["call", "step", "timer"]
        decision = await h.replay(task)
        assert decision["status"] == "completed"
        run = await h.run("g1")
        assert run.status == "completed"
        assert run.output == {"hi": "ADA", "at": recorded.output}
        assert run.locked_by is None and run.awaiting_decision_task_id is None


async def test_a_decision_applies_at_most_once_and_only_for_the_turn_the_run_waits_for(
    store_url: str, sdk: Sdk
) -> None:
    async with harness(store_url, sdk, [wf("greet")]) as h:
        await h.engine.start("greet", {"name": "bo"}, run_id="once")
        stale = await h.issue("once")
        current = await h.issue("once")  # a re-drive issues a new turn, superseding the first
        assert stale["taskId"] != current["taskId"]
        stale_decision, _ = await h.sdk.replay(stale)
        decision, _ = await h.sdk.replay(current)

        assert not await h.turns.apply_decision(parse_workflow_decision(stale_decision))
        assert await h.store.get_checkpoint("once", 0) is None
        assert (await h.run("once")).awaiting_decision_task_id == current["taskId"]

        assert await h.turns.apply_decision(parse_workflow_decision(decision))
        assert not await h.turns.apply_decision(parse_workflow_decision(decision))  # a duplicate
        await h.turns.decisions([decision, decision])  # redelivered: nothing more happens
        assert len(h.transport.broker.dispatched) == 1  # the step was sent once


async def test_a_decision_is_dropped_while_another_process_holds_the_lease(
    store_url: str, sdk: Sdk
) -> None:
    async with harness(store_url, sdk, [wf("greet")]) as h:
        await h.engine.start("greet", {"name": "cy"}, run_id="held")
        task = await h.issue("held")
        decision, _ = await h.sdk.replay(task)
        now = h.clock()
        assert await try_lock(h.store, "held", "another-engine", now + 30_000, now)
        assert not await h.turns.apply_decision(parse_workflow_decision(decision))
        run = await h.run("held")
        assert (run.awaiting_decision_task_id, run.locked_by) == (task["taskId"], "another-engine")
        assert await h.store.get_checkpoint("held", 0) is None


async def test_a_cancelled_run_is_never_revived_by_its_decision(store_url: str, sdk: Sdk) -> None:
    async with harness(store_url, sdk, [wf("greet")]) as h:
        await h.engine.start("greet", {"name": "di"}, run_id="gone")
        task = await h.issue("gone")
        await h.engine.cancel("gone")
        decision = await h.replay(task)
        assert decision["status"] == "continue"
        run = await h.run("gone")
        assert (run.status, run.error.message if run.error else None) == ("cancelled", "cancelled")
        assert await h.store.list_checkpoints("gone") == []
        assert h.transport.broker.dispatched == []


async def test_a_cancelled_decision_cancels_the_run(store_url: str, sdk: Sdk) -> None:
    async with harness(store_url, sdk, [wf("greet")]) as h:
        await h.engine.start("greet", {"name": "ed"}, run_id="stop")
        decision = await h.turn("stop", cancelled=True)  # the worker saw a cancel broadcast
        assert decision["status"] == "cancelled"
        run = await h.run("stop")
        assert (run.status, run.error.message if run.error else None) == ("cancelled", "cancelled")
        assert run.locked_by is None


async def test_a_compensating_cancel_of_a_remote_run_is_finalized_by_its_next_turn(
    store_url: str, sdk: Sdk
) -> None:
    async with harness(store_url, sdk, [wf("greet")]) as h:
        await h.engine.start("greet", {"name": "fi"}, run_id="comp")
        await h.turn("comp")
        assert (await h.engine.cancel("comp", compensate=True)).status == "cancelling"
        now = h.clock()
        run = await h.store.claim_run("comp", h.engine.instance_id, now + 30_000, now)
        await h.turns.advance(run)
        assert len(h.channel.sent) == 1  # no new turn: finalized
        run = await h.run("comp")
        assert (run.status, run.locked_by) == ("cancelled", None)


# ------------------------------------------------------------------ commands


async def test_wait_signal_registers_a_waiter_and_a_delivery_wakes_the_run(
    store_url: str, sdk: Sdk
) -> None:
    async with harness(store_url, sdk, [wf("approval")]) as h:
        await h.engine.start("approval", {"id": "7"}, run_id="ap")
        await h.turn("ap")
        waiters = await h.store.list_signal_waiters("approve-")
        assert [(w.token, w.run_id, w.seq) for w in waiters] == [("approve-7", "ap", 0)]

        await h.engine.signal("approve-7", {"by": "ops"})
        await h.until_due("ap")
        task = await h.issue("ap")
        assert task["history"] == [{"seq": 0, "kind": "signal", "output": {"by": "ops"}}]
        await h.replay(task)
        run = await h.run("ap")
        assert (run.status, run.output) == ("completed", {"approved": {"by": "ops"}})


async def test_wait_signal_takes_a_signal_buffered_before_the_decision(
    store_url: str, sdk: Sdk
) -> None:
    async with harness(store_url, sdk, [wf("approval")]) as h:
        await h.engine.start("approval", {"id": "8"}, run_id="early")
        task = await h.issue("early")
        await h.engine.signal("approve-8", "yes")  # nobody waits yet: buffered
        await h.replay(task)
        delivered = await h.store.get_checkpoint("early", 0)
        assert (delivered.name, delivered.status, delivered.output) == (
            "signal:approve-8",
            "completed",
            "yes",
        )
        assert await h.store.list_signal_waiters("approve-") == []
        await h.until_due("early")  # resumed once the decision released the lease
        await h.turn("early")
        assert (await h.run("early")).output == {"approved": "yes"}


async def test_sleep_keeps_the_deadline_of_a_sleep_already_recorded(
    store_url: str, sdk: Sdk
) -> None:
    async with harness(store_url, sdk, [wf("greet")]) as h:
        await h.engine.start("greet", {"name": "gu"}, run_id="nap")
        await h.turn("nap")
        await h.answer_steps(lambda t: "GU")
        await h.until_due("nap")
        await h.turn("nap")
        deadline = (await h.store.get_checkpoint("nap", 2)).wake_at
        # A re-drive before the timer is due (recovery, reconcile): the SDK emits the sleep
        # again, and the deadline must not move.
        h.clock.advance(100)
        decision = await h.turn("nap")
        assert [c["kind"] for c in decision["commands"]] == ["sleep"]
        assert (await h.store.get_checkpoint("nap", 2)).wake_at == deadline
        assert (await h.run("nap")).wake_at == deadline


async def test_children_start_after_the_turn_and_their_outcomes_reach_the_parent(
    store_url: str, sdk: Sdk
) -> None:
    async with harness(store_url, sdk, [wf("family"), wf("leaf")]) as h:
        await h.engine.start("family", None, run_id="fam")
        await h.turn("fam")
        waiters = await h.store.list_signal_waiters("child:fam.")
        assert [(w.token, w.seq) for w in waiters] == [("child:fam.child.0", 0)]
        placeholder = await h.store.get_checkpoint("fam", 0)
        assert (placeholder.name, placeholder.status) == ("signal:child:fam.child.0", "running")

        async def exists(run_id: str) -> Any:
            async def check() -> bool:
                return await h.store.get_run(run_id) is not None

            return check

        await h.until(await exists("fam.child.0"))
        child = await h.run("fam.child.0")
        assert (child.workflow, child.workflow_version, child.input) == ("leaf", "1", {"x": 1})
        await h.turn("fam.child.0")
        await h.until_due("fam")

        task = await h.issue("fam")
        assert task["history"] == [{"seq": 0, "kind": "child", "output": 10}]
        decision = await h.replay(task)
        assert [(c["kind"], c["seq"], c.get("parallelGroup")) for c in decision["commands"]] == [
            ("startChild", 1, "gather:1"),
            ("startChild", 2, "gather:1"),
        ]
        for child_id in ("fam.child.1", "fam.child.2"):
            await h.until(await exists(child_id))
            await h.turn(child_id)
        assert (await h.run("fam.child.2")).status == "failed"

        async def both_delivered() -> bool:
            rows = [await h.store.get_checkpoint("fam", s) for s in (1, 2)]
            return all(r is not None and r.status == "completed" for r in rows)

        await h.until(both_delivered)
        task = await h.issue("fam")
        assert task["history"][1:] == [
            {"seq": 1, "kind": "child", "output": 20},
            {
                "seq": 2,
                "kind": "child",
                "error": {
                    "message": "leaf refused",
                    "code": "leaf_bad",
                    "details": {"why": "asked"},
                },
            },
        ]
        await h.replay(task)
        run = await h.run("fam")
        assert run.status == "completed"
        assert run.output == {
            "first": 10,
            "settled": [
                {"status": "fulfilled", "value": 20},
                {
                    "status": "rejected",
                    "id": "fam.child.2",
                    "error": "leaf refused",
                    "code": "leaf_bad",
                    "details": {"why": "asked"},
                },
            ],
        }


async def test_a_child_without_a_registration_is_served_by_convention_or_fails_to_start(
    store_url: str, sdk: Sdk
) -> None:
    directory = Directory(
        tokens={"family", "leaf"},
        descriptors={
            "leaf": [
                {
                    "instanceId": "py-host-1",
                    "runtime": "python",
                    "workflows": ["leaf"],
                    "registrations": [{"name": "leaf", "version": "3", "group": "leaf"}],
                }
            ]
        },
    )
    # Nothing is registered: the parent and its child are both served by convention.
    async with harness(store_url, sdk, [], directory=directory) as h:
        await h.engine._worker.plane.create_run(
            StartRequest(workflow="family", run_id="conv"), None
        )
        await h.turn("conv")
        parent = await h.run("conv")
        assert (parent.workflow_version, parent.tags) == ("1", ("version:undeclared",))

        async def started() -> bool:
            return await h.store.get_run("conv.child.0") is not None

        await h.until(started)
        child = await h.run("conv.child.0")
        assert (child.workflow, child.workflow_version) == ("leaf", "3")  # as announced
        assert await h.turns.serves(child)
        task = await h.issue("conv.child.0")
        assert (h.channel.sent[-1][0], task["workflowVersion"]) == ("leaf", "3")

        # The workers go away: a new child of that workflow cannot start, and the parent is
        # told so instead of waiting forever.
        directory.tokens = {"family"}
        h.turns._live._tokens = None  # forget the cached read (its TTL is a second)
        await h.engine._worker.plane.create_run(
            StartRequest(workflow="family", run_id="conv2"), None
        )
        await h.turn("conv2")

        async def failed_start() -> bool:
            cp = await h.store.get_checkpoint("conv2", 0)
            return cp is not None and cp.status == "completed"

        await h.until(failed_start)
        completion = (await h.store.get_checkpoint("conv2", 0)).output
        assert completion == {
            "ok": False,
            "error": 'child workflow "leaf" failed to start: workflow leaf is not registered',
        }
        assert await h.store.get_run("conv2.child.0") is None


async def test_an_unregistered_child_of_a_registered_remote_workflow_inherits_its_queue(
    store_url: str, sdk: Sdk
) -> None:
    async with harness(store_url, sdk, [wf("family", group="wf-split")]) as h:
        await h.engine.start("family", None, run_id="inh")
        await h.issue("inh")
        h.turns.start_child_soon("leaf", {"x": 1}, "inh.child.0", await h.run("inh"), None, None)

        async def started() -> bool:
            return await h.store.get_run("inh.child.0") is not None

        await h.until(started)
        route = await h.turns.route(await h.run("inh.child.0"))
        assert route is not None and (route.how, route.token) == ("inherited", "wf-split")
        assert route.registration is not None and route.registration.name == "family"


async def test_a_workflow_registered_with_a_body_is_never_remote(store_url: str, sdk: Sdk) -> None:
    async def body(ctx: Any, x: int) -> int:
        return x

    local = Workflow(body, "leaf", "1")  # same name a live worker serves by convention
    async with harness(store_url, sdk, [local], directory=Directory(tokens={"leaf"})) as h:
        await h.engine.start(local, 1, run_id="here")
        now = h.clock()
        leased = await h.store.claim_run("here", h.engine.instance_id, now + 30_000, now)
        assert not await h.turns.drive_if_remote(leased)  # left to the local turn driver
        run = await h.run("here")
        assert (run.status, run.locked_by) == ("pending", h.engine.instance_id)
        assert h.channel.sent == []


async def test_calls_route_by_step_name_with_the_worker_partition_as_suffix(
    store_url: str, sdk: Sdk
) -> None:
    async with harness(store_url, sdk, [wf("fanout"), wf("splitwf", group="wf-split")]) as h:
        await h.engine.start("fanout", None, run_id="fan")
        await h.turn("fan")
        sent = await h.answer_steps(lambda t: t.input * 100)
        assert sorted((t.step_id, t.group) for t in sent) == [
            ("fan:0", "py.a"),
            # `:` is not allowed in a queue name. (A partition of another namespace, such as
            # `acme` from this default-namespace run, is refused: test_hostile_turns.py.)
            ("fan:1", "py-b"),
        ]
        rows = await h.store.list_checkpoints("fan")
        assert [(r.seq, r.parallel_group) for r in rows] == [(0, "gather:0"), (1, "gather:0")]

        # A split workflow worker: its turns go to its group, its bare steps to `name@group`.
        await h.engine.start("splitwf", "hey", run_id="split")
        task = await h.issue("split")
        assert (h.channel.sent[-1][0], task["group"]) == ("wf-split", "wf-split")
        await h.replay(task)
        assert [(t.step_id, t.group) for t in h.transport.broker.dispatched] == [
            ("split:0", "py.echo@wf-split")
        ]


async def test_a_call_no_broker_takes_fails_and_wakes_the_run(store_url: str, sdk: Sdk) -> None:
    async with harness(store_url, sdk, [wf("greet")], steps=RefusingSteps()) as h:
        await h.engine.start("greet", {"name": "ha"}, run_id="refused")
        await h.turn("refused")
        row = await h.store.get_checkpoint("refused", 0)
        assert row.status == "failed"
        assert row.error is not None and row.error.retryable is True
        assert row.error.message.startswith("remote step worker failed: ")
        await h.until_due("refused")
        task = await h.issue("refused")
        assert task["history"][0]["kind"] == "call" and "error" in task["history"][0]


# ------------------------------------------------------------------ failures and onError


async def test_a_failed_decision_is_routed_to_its_on_error_handler(
    store_url: str, sdk: Sdk
) -> None:
    broken = wf("broken", on_error=[OnErrorRoute(workflow="fixer", code="bad_input")])
    async with harness(store_url, sdk, [broken, wf("fixer")]) as h:
        await h.engine.start("broken", None, run_id="br")
        decision = await h.turn("br")
        assert decision["status"] == "failed"
        run = await h.run("br")
        assert (run.status, run.error.code if run.error else None) == ("suspended", "bad_input")
        recorded = await h.store.get_checkpoint("br", 0)
        assert (recorded.name, recorded.output) == ("sideEffect", "before")

        async def handler_started() -> bool:
            return await h.store.get_run("br.onError.1") is not None

        await h.until(handler_started)
        handler = await h.run("br.onError.1")
        assert handler.input["error"]["details"] == {"field": "x"}
        await h.turn("br.onError.1")
        await h.until_due("br")

        # The routed run follows its handoff: no turn goes to a worker.
        now = h.clock()
        run = await h.store.claim_run("br", h.engine.instance_id, now + 30_000, now)
        sent = len(h.channel.sent)
        await h.turns.advance(run)
        assert len(h.channel.sent) == sent
        run = await h.run("br")
        assert (run.status, run.output) == ("completed", {"fixed": "bad_input", "of": "br"})


async def test_an_unrouted_failure_fails_the_run_with_the_workers_error(
    store_url: str, sdk: Sdk
) -> None:
    async with harness(store_url, sdk, [wf("stepfail")]) as h:
        await h.engine.start("stepfail", 5, run_id="sf")
        await h.turn("sf")
        task = h.transport.broker.dispatched[0]
        h.transport.broker.publish_result(
            StepResult(
                run_id="sf",
                seq=0,
                step_id=task.step_id,
                status="failed",
                error=StepError(message="no", code="nope", details={"k": 1}, retryable=False),
            )
        )
        await h.until_due("sf")
        await h.turn("sf")
        run = await h.run("sf")
        assert run.status == "failed"
        assert (run.error.message, run.error.code, run.error.details) == ("no", "nope", {"k": 1})


async def test_a_worker_without_the_workflow_leaves_the_run_waiting(
    store_url: str, sdk: Sdk
) -> None:
    async with harness(store_url, sdk, [wf("ghost")]) as h:
        await h.engine.start("ghost", None, run_id="boo")
        decision = await h.turn("boo")
        assert decision["error"]["code"] == "no_workflow"
        run = await h.run("boo")
        assert (run.status, run.locked_by, run.awaiting_decision_task_id) == (
            "suspended",
            None,
            None,
        )
        assert run.wake_at == h.clock() + h.engine.options.reconcile_ms


# ------------------------------------------------------------------ malformed input


async def test_malformed_decisions_are_logged_with_their_ids_and_dropped(
    store_url: str, sdk: Sdk, caplog: pytest.LogCaptureFixture
) -> None:
    async with harness(store_url, sdk, [wf("greet")]) as h:
        await h.engine.start("greet", {"name": "io"}, run_id="bad")
        task = await h.issue("bad")
        tid = task["taskId"]
        good, _ = await h.sdk.replay(task)
        caplog.set_level(logging.ERROR, logger="durably")
        await h.turns.decisions(
            [
                {**good, "commands": "call"},
                {**good, "status": "paused"},
                {**good, "commands": [{**good["commands"][0], "seq": -1}]},
                {**good, "commands": [{**good["commands"][0], "seq": HANDOFF_SEQ_BASE}]},
                {**good, "commands": [{"kind": "upsertSearchAttributes", "seq": 1}]},
                {**good, "taskId": "other:wf:12345678"},
                ["not", "an", "object"],
            ]
        )
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == 7
        assert f"workflow decision {tid!r}: `commands` must be a list" in messages[0]
        assert f"{tid!r}: `status` must be one of" in messages[1]
        assert f"{tid!r}: `commands[0].seq` must be a non-negative integer" in messages[2]
        assert "`commands[0].seq` is in the range the engine reserves" in messages[3]
        assert (
            f"workflow decision {tid!r}: remote workflow command 'upsertSearchAttributes' "
            "is not supported"
        ) in messages[4]
        assert "`taskId` is not `<runId>:wf:<suffix>`" in messages[5]
        assert "not a JSON object" in messages[6]
        run = await h.run("bad")
        assert run.awaiting_decision_task_id == tid  # untouched: still waiting for its turn
        assert await h.store.list_checkpoints("bad") == []
        await h.turns.decisions([good])  # the well-formed one still applies
        assert (await h.store.get_checkpoint("bad", 0)).status == "pending"


# ------------------------------------------------------------------ step events, heartbeats


async def test_step_events_show_a_local_step_live_and_never_hide_its_recorded_outcome(
    store_url: str, sdk: Sdk
) -> None:
    async with harness(store_url, sdk, [wf("greet")]) as h:
        await h.engine.start("greet", {"name": "jo"}, run_id="live")
        await h.turn("live")
        await h.answer_steps(lambda t: "JO")
        await h.until_due("live")
        task = await h.issue("live")
        decision, streamed = await h.sdk.replay(task)
        assert [e["phase"] for e in streamed] == ["running", "completed"]
        running, completed = streamed
        await h.turns.step_events([running])
        row = await h.store.get_checkpoint("live", 1)
        assert (row.name, row.status) == ("now#1", "running")
        await h.turns.step_events([completed])
        assert (await h.store.get_checkpoint("live", 1)).status == "completed"
        await h.turns.decisions([decision])
        await h.turns.step_events([running, {"runId": "live", "seq": "x"}])  # late; malformed
        row = await h.store.get_checkpoint("live", 1)
        assert (row.status, row.output) == ("completed", completed["output"])


async def test_run_heartbeats_push_the_liveness_wake_of_a_replaying_turn(
    store_url: str, sdk: Sdk
) -> None:
    async with harness(store_url, sdk, [wf("greet")], silence_ms=20_000) as h:
        await h.engine.start("greet", {"name": "ky"}, run_id="beat")
        await h.issue("beat")
        assert (await h.run("beat")).wake_at == h.clock() + 20_000
        h.clock.advance(5_000)
        await h.turns.run_heartbeats([{"runId": "beat", "seq": 0, "group": "greet"}])
        run = await h.run("beat")
        assert (run.wake_at, run.locked_by) == (h.clock() + 20_000, None)
        # A step-scoped beat is not the turn's, and a run not waiting for a turn is left alone.
        h.clock.advance(5_000)
        await h.turns.run_heartbeats(
            [{"runId": "beat", "seq": 3, "group": "greet", "stepId": "beat:3"}]
        )
        assert (await h.run("beat")).wake_at == h.clock() + 15_000


# ------------------------------------------------------------------ priority


async def test_a_remote_runs_priority_rides_its_turns_calls_and_children(
    store_url: str, sdk: Sdk
) -> None:
    """A run's priority is on every workflow task of the run (the broker orders turns by it),
    on the step tasks its calls send, and on the children it starts (which carry it on
    their own turns); a run without one sends none."""
    async with harness(store_url, sdk, [wf("greet"), wf("family"), wf("leaf")]) as h:
        await h.engine.start("greet", {"name": "ada"}, run_id="pg1", priority=6)
        task = await h.issue("pg1")
        assert task["priority"] == 6
        await h.replay(task)
        sent = await h.answer_steps(lambda t: t.input.upper())
        assert [(t.step_id, t.priority) for t in sent] == [("pg1:0", 6)]
        await h.until_due("pg1")
        assert (await h.issue("pg1"))["priority"] == 6  # every turn, not just the first

        await h.engine.start("family", None, run_id="pf", priority=-2)
        await h.turn("pf")

        async def child_exists() -> bool:
            return await h.store.get_run("pf.child.0") is not None

        await h.until(child_exists)
        assert (await h.run("pf.child.0")).priority == -2
        assert (await h.issue("pf.child.0"))["priority"] == -2

        await h.engine.start("greet", {"name": "bo"}, run_id="plain")
        assert "priority" not in await h.issue("plain")
