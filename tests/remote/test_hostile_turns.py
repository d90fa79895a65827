"""The workflow-turn channels as an outsider sees them: anyone who can write to the shared Redis
can add jobs to `<prefix>-decisions` and `<prefix>-step-events`.

Every test here writes raw BullMQ jobs with the `bullmq` package (or raw Redis commands) on the
queue names the engine consumes, and reads the turns the engine queued straight off Redis, as a
forger would. The engine is real: SQLite file store, `RedisTransport` on the shared Redis.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import durably
from durably.transports import RedisTransport
from tests.remote import redis_support

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(180)

ran: list[Any] = []


@durably.step("hostile.double")
async def double(x: int) -> int:
    ran.append(x)
    return x * 2


@durably.workflow("hostile.victim")
async def victim(ctx: Any, x: int) -> int:
    await ctx.wait_for_signal(f"go-{ctx.run_id}")
    return await ctx.step(double, x)


@durably.workflow("hostile.leaf")
async def leaf(ctx: Any, x: int) -> int:
    await ctx.wait_for_signal(f"leaf-{ctx.run_id}")
    return x + 1


@durably.workflow("hostile.parent")
async def parent(ctx: Any, x: int) -> int:
    return await ctx.child(leaf, x)


attacker = durably.remote_workflow("hostile.attacker")


class Outsider:
    """A broker writer: raw BullMQ jobs and raw Redis reads."""

    def __init__(self, url: str, prefix: str):
        import bullmq
        import redis.asyncio as aioredis

        self._bullmq = bullmq
        self.url = url
        self.prefix = prefix
        self.redis = aioredis.Redis.from_url(url)
        self._queues: dict[str, Any] = {}

    def queue(self, name: str) -> Any:
        if name not in self._queues:
            self._queues[name] = self._bullmq.Queue(
                name, {"connection": self.url, "prefix": "bull"}
            )
        return self._queues[name]

    async def add(self, queue: str, job_name: str, data: Any) -> str:
        """Add a job; `data` given as text is written as the job's data verbatim (what no
        JSON encoder of a client would produce: `NaN`, a nesting 200,000 deep): the job is
        added delayed, its data rewritten with a raw HSET, then promoted."""
        opts: dict[str, Any] = {"removeOnComplete": True, "removeOnFail": True}
        q = self.queue(f"{self.prefix}-{queue}")
        if not isinstance(data, str):
            return str((await q.add(job_name, data, opts)).id)
        job = await q.add(job_name, {"placeholder": True}, {**opts, "delay": 3_600_000})
        await self.redis.hset(f"bull:{self.prefix}-{queue}:{job.id}", "data", data)
        await job.promote()
        return str(job.id)

    async def decide(self, decision: dict[str, Any] | str) -> str:
        return await self.add("decisions", "decision", decision)

    async def step_event(self, event: dict[str, Any] | str) -> str:
        return await self.add("step-events", "stepEvent", event)

    async def jobs_on(self, queue: str) -> list[dict[str, Any]]:
        """The data of every job waiting on `<prefix>-<queue>`."""
        key = f"bull:{self.prefix}-{queue}"
        ids = [i.decode() for i in await self.redis.lrange(f"{key}:wait", 0, -1)]
        out: list[dict[str, Any]] = []
        for job_id in ids:
            raw = await self.redis.hget(f"{key}:{job_id}", "data")
            if raw is not None:
                out.append(json.loads(raw))
        return out

    async def turn_of(self, token: str, run_id: str) -> dict[str, Any]:
        """The turn the engine queued for `run_id` on `tasks-<token>` (as a worker reads it)."""

        async def found() -> dict[str, Any] | None:
            for data in await self.jobs_on(f"tasks-{token}"):
                if data.get("runId") == run_id:
                    return data
            return None

        return await until(found)

    async def pending_jobs(self, queue: str) -> int:
        """Jobs on `<prefix>-<queue>` still waiting, delayed or in hand."""
        key = f"bull:{self.prefix}-{queue}"
        return int(
            await self.redis.llen(f"{key}:wait")
            + await self.redis.llen(f"{key}:active")
            + await self.redis.zcard(f"{key}:delayed")
        )

    async def close(self) -> None:
        for queue in self._queues.values():
            await queue.close()
        await self.redis.aclose()


async def until(what: Callable[[], Awaitable[Any]], timeout: float = 30) -> Any:
    """Poll `what` until it returns something truthy (fails at the deadline)."""
    async with asyncio.timeout(timeout):
        while True:
            value = await what()
            if value:
                return value
            await asyncio.sleep(0.05)


def logged(caplog: pytest.LogCaptureFixture, *parts: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if all(p in r.getMessage() for p in parts)]


@asynccontextmanager
async def engine_on(
    redis_url: str, redis_prefix: str, tmp_path: Path, **kw: Any
) -> AsyncIterator[tuple[durably.Engine, Outsider]]:
    engine = durably.Engine(
        f"sqlite:///{tmp_path / 'engine.db'}",
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=[victim, leaf, parent, attacker],
        steps=[double],
        timer_poll_ms=50,
        **kw,
    )
    outsider = Outsider(redis_url, redis_prefix)
    try:
        async with engine:
            yield engine, outsider
    finally:
        await outsider.close()


async def checkpoint(engine: durably.Engine, run_id: str, seq: int) -> Any:
    return next((r for r in await engine.list_checkpoints(run_id) if r.seq == seq), None)


async def status_of(engine: durably.Engine, run_id: str) -> str | None:
    run = await engine.get_run(run_id)
    return run.status if run is not None else None


# ------------------------------------------------------------------ planted checkpoints


async def test_a_step_event_cannot_plant_a_checkpoint_in_a_run_without_an_outstanding_turn(
    redis_url: str, redis_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="durably")
    ran.clear()
    async with engine_on(redis_url, redis_prefix, tmp_path) as (engine, outsider):
        await engine.start(victim, 21, run_id="local-1")

        async def parked() -> bool:
            return await status_of(engine, "local-1") == "suspended"

        await until(parked)
        # A forged outcome for the step the run has yet to call (seq 1), and for the signal
        # wait it is parked on (seq 0, a position of another kind).
        for seq, name in ((1, "hostile.double"), (0, "signal:go-local-1")):
            await outsider.step_event(
                {
                    "runId": "local-1",
                    "seq": seq,
                    "name": name,
                    "phase": "completed",
                    "startedAt": 1,
                    "finishedAt": 2,
                    "output": 999,
                }
            )

        async def handled() -> bool:
            rows = await engine.list_checkpoints("local-1")
            return len(logged(caplog, "dropped workflow step event local-1:")) == 2 or any(
                r.seq == 1 for r in rows
            )

        await until(handled)
        assert [r.seq for r in await engine.list_checkpoints("local-1") if r.seq == 1] == []
        await engine.signal("go-local-1", None)

        async def settled() -> str | None:
            status = await status_of(engine, "local-1")
            return status if status in ("completed", "failed") else None

        assert await until(settled) == "completed"
        run = await engine.get_run("local-1")
        assert run is not None and run.output == 42  # the step's own outcome
        assert ran == [21]  # the handler really ran
        drops = logged(caplog, "dropped workflow step event local-1:")
        assert len(drops) == 2
        assert "no turn is outstanding" in drops[0]


async def test_a_step_event_only_records_a_local_step_of_the_outstanding_turn(
    redis_url: str, redis_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="durably")
    async with engine_on(redis_url, redis_prefix, tmp_path) as (engine, outsider):
        await engine.start(attacker, None, run_id="rw-1")
        task = await outsider.turn_of("hostile.attacker", "rw-1")
        # The run's own turn: a call dispatched at seq 0 and a sleep at seq 1.
        await outsider.decide(
            {
                "taskId": task["taskId"],
                "runId": "rw-1",
                "status": "continue",
                "commands": [
                    {
                        "kind": "call",
                        "seq": 0,
                        "name": "hostile.double",
                        "group": "default",
                        "input": 5,
                    },
                    {"kind": "sleep", "seq": 1, "ms": 3_600_000},
                ],
            }
        )

        # The result makes the run due: a new turn is issued; take it.
        second = await until(
            lambda: _newer_turn(outsider, "hostile.attacker", "rw-1", task["taskId"])
        )
        forged = {
            "runId": "rw-1",
            "name": "x",
            "phase": "completed",
            "startedAt": 1,
            "output": "forged",
        }
        await outsider.step_event({**forged, "seq": 0})  # a dispatched call's row
        await outsider.step_event({**forged, "seq": 1})  # a sleep's row
        await outsider.step_event({**forged, "seq": 2, "taskId": task["taskId"]})  # old turn
        await outsider.step_event({**forged, "seq": 3, "taskId": second["taskId"]})  # its own

        async def recorded() -> bool:
            return await checkpoint(engine, "rw-1", 3) is not None

        await until(recorded)

        async def all_dropped() -> bool:
            return len(logged(caplog, "dropped workflow step event rw-1:")) >= 3

        await until(all_dropped)
        rows = {r.seq: r for r in await engine.list_checkpoints("rw-1")}
        assert (rows[0].kind, rows[0].output) == ("remote", 10)
        assert rows[1].kind == "sleep" and rows[1].output is None
        assert 2 not in rows
        assert (rows[3].kind, rows[3].status, rows[3].output) == ("local", "completed", "forged")


async def _newer_turn(
    outsider: Outsider, token: str, run_id: str, old: str
) -> dict[str, Any] | None:
    for data in await outsider.jobs_on(f"tasks-{token}"):
        if data.get("runId") == run_id and data.get("taskId") != old:
            return data
    return None


# ------------------------------------------------------------------ stolen child completions


async def test_a_decision_cannot_wait_on_another_runs_child_completion(
    redis_url: str, redis_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="durably")
    async with engine_on(redis_url, redis_prefix, tmp_path) as (engine, outsider):
        await engine.start(parent, 1, run_id="victim")
        await engine.start(attacker, None, run_id="thief")

        async def child_parked() -> bool:
            return await status_of(engine, "victim.child.0") == "suspended"

        await until(child_parked)
        task = await outsider.turn_of("hostile.attacker", "thief")
        tokens = [
            "child:victim.child.0",
            "bp:victim",
            "update:victim:x",
            "event:x",
            "timeout:x",
            "child:victim.onError.1",
            "wh:victim:0",
        ]
        for n, token in enumerate(tokens, start=1):
            # One at a time: decisions of one run racing each other for its lease would drop
            # each other before they are even looked at.
            await outsider.decide(
                {
                    "taskId": task["taskId"],
                    "runId": "thief",
                    "status": "continue",
                    "commands": [{"kind": "waitSignal", "seq": 0, "signal": token}],
                }
            )

            async def refused(n: int = n) -> bool:
                drops = logged(caplog, "dropped remote workflow decision", task["taskId"])
                return len(drops) >= n or bool(await engine.list_checkpoints("thief"))

            await until(refused)
        await engine.signal("leaf-victim.child.0", None)

        async def settled() -> str | None:
            status = await status_of(engine, "victim")
            return status if status in ("completed", "failed") else None

        assert await until(settled, timeout=20) == "completed"
        run = await engine.get_run("victim")
        assert run is not None and run.output == 2
        assert await engine.list_checkpoints("thief") == []
        thief = await engine.get_run("thief")
        assert thief is not None and thief.awaiting_decision_task_id == task["taskId"]
        drops = logged(caplog, "dropped remote workflow decision", task["taskId"])
        assert len(drops) == len(tokens)
        assert "the engine owns it" in drops[0] and "another run's webhook" in drops[-1]


async def test_a_decision_writes_only_its_own_runs_positions(
    redis_url: str, redis_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="durably")
    async with engine_on(redis_url, redis_prefix, tmp_path) as (engine, outsider):
        await engine.start(attacker, None, run_id="rw-2")
        task = await outsider.turn_of("hostile.attacker", "rw-2")
        base = {"taskId": task["taskId"], "runId": "rw-2", "status": "continue"}
        # A decision whose task is another run's, and one naming another run as its own.
        await outsider.decide({**base, "runId": "victim", "commands": []})
        await outsider.decide(
            {
                **base,
                "commands": [
                    {"kind": "sleep", "seq": 0, "ms": 10},
                    {"kind": "recordStep", "seq": 0, "name": "x", "output": 1},
                ],
            }
        )

        async def refused() -> bool:
            return bool(logged(caplog, "two commands at seq 0")) or bool(
                await engine.list_checkpoints("rw-2")
            )

        await until(refused)
        assert await engine.list_checkpoints("rw-2") == []
        assert await engine.get_run("victim") is None


# ------------------------------------------------------------------ partitions


async def test_a_call_cannot_target_another_namespaces_partition(
    redis_url: str, redis_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="durably")
    # An engine of every namespace (None): it drives both the tenant's run and the default one.
    async with engine_on(redis_url, redis_prefix, tmp_path, namespace=None) as (engine, outsider):
        await engine.start(attacker, None, run_id="acme-1", namespace="acme")
        task = await outsider.turn_of("hostile.attacker@acme", "acme-1")
        base = {"taskId": task["taskId"], "runId": "acme-1", "status": "continue"}
        call = {"kind": "call", "seq": 0, "name": "x.charge", "input": 1}
        for n, group in enumerate(("globex", "default", "acme@globex"), start=1):
            await outsider.decide({**base, "commands": [{**call, "group": group}]})

            async def refused(n: int = n) -> bool:
                drops = logged(caplog, "dropped remote workflow decision", task["taskId"])
                return len(drops) >= n or await checkpoint(engine, "acme-1", 0) is not None

            await until(refused)
        assert await checkpoint(engine, "acme-1", 0) is None
        for queue in ("tasks-x.charge@globex", "tasks-x.charge", "tasks-x.charge@acme@globex"):
            assert await outsider.jobs_on(queue) == []
        # The run still waits for that turn: its own partition is taken.
        await outsider.decide({**base, "commands": [{**call, "group": "acme"}]})

        async def dispatched() -> list[dict[str, Any]]:
            return await outsider.jobs_on("tasks-x.charge@acme")

        [job] = await until(dispatched)
        assert (job["runId"], job["group"]) == ("acme-1", "x.charge@acme")

        # A run of the default namespace cannot reach a tenant's partition either.
        await engine.start(attacker, None, run_id="dflt-1")
        task = await outsider.turn_of("hostile.attacker", "dflt-1")
        await outsider.decide(
            {
                "taskId": task["taskId"],
                "runId": "dflt-1",
                "status": "continue",
                "commands": [{**call, "group": "acme"}],
            }
        )

        async def refused_default() -> bool:
            return bool(logged(caplog, "dropped remote workflow decision", task["taskId"]))

        await until(refused_default)
        assert await checkpoint(engine, "dflt-1", 0) is None
        assert len(await outsider.jobs_on("tasks-x.charge@acme")) == 1


# ------------------------------------------------------------------ bounds


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


async def test_unstorable_messages_are_dropped_once_and_never_block_the_rest(
    redis_url: str, redis_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="durably")
    async with engine_on(redis_url, redis_prefix, tmp_path, max_payload_bytes=64 * 1024) as (
        engine,
        outsider,
    ):
        await engine.start(attacker, None, run_id="rw-3")
        task = await outsider.turn_of("hostile.attacker", "rw-3")
        tid = task["taskId"]
        event = {
            "runId": "rw-3",
            "name": "now#0",
            "phase": "completed",
            "startedAt": 1,
            "finishedAt": 2,
            "output": 1,
        }
        bad_events = [
            {**event, "seq": 0, "output": math.nan},
            {**event, "seq": 1, "output": {"x": [math.inf]}},
            {**event, "seq": 2, "output": "\ud800"},
            {**event, "seq": 1e20},
            {**event, "seq": 3, "startedAt": 10**16},
            {**event, "seq": 4, "finishedAt": 2**53 - 1},
            {**event, "seq": 5, "name": "a\x00b"},
            {**event, "seq": 6, "output": "x" * (70 * 1024)},
            {**event, "seq": 7, "events": [{"at": "soon"}]},
        ]
        for bad in bad_events:
            await outsider.step_event(json.dumps(bad))
        deep_event = json.dumps({**event, "seq": 8, "output": "DEEP"})
        await outsider.step_event(deep_event.replace('"DEEP"', _deep(200_000)))
        await outsider.step_event({**event, "seq": 9, "output": "fine"})

        async def good_event() -> bool:
            return await checkpoint(engine, "rw-3", 9) is not None

        await until(good_event)
        good = await checkpoint(engine, "rw-3", 9)
        assert good is not None and good.output == "fine"

        bad_decisions: list[Any] = [
            {"commands": [{"kind": "sleep", "seq": 0, "ms": math.nan}]},
            {"commands": [{"kind": "sleep", "seq": 0, "ms": 1e300}]},
            {"commands": [{"kind": "call", "seq": 0, "name": "x", "input": math.inf}]},
            {"commands": [{"kind": "recordStep", "seq": 1e20, "name": "x"}]},
            {"commands": [{"kind": "recordStep", "seq": 0, "name": "x", "startedAt": 10**16}]},
            {"commands": [{"kind": "waitSignal", "seq": 0, "signal": "\ud800"}]},
            {"commands": [{"kind": "waitSignal", "seq": 0, "signal": "a\x00"}]},
            {
                "commands": [
                    {"kind": "recordStep", "seq": 0, "name": "x", "output": "y" * (70 * 1024)}
                ]
            },
        ]
        for bad in bad_decisions:
            await outsider.decide(
                json.dumps({"taskId": tid, "runId": "rw-3", "status": "continue", **bad})
            )
        deep_decision = json.dumps(
            {
                "taskId": tid,
                "runId": "rw-3",
                "status": "completed",
                "commands": [],
                "output": "DEEP",
            }
        )
        await outsider.decide(deep_decision.replace('"DEEP"', _deep(200_000)))

        async def decisions_dropped() -> bool:
            # The deep step event too: it was sent before the good one, but jobs are taken
            # concurrently.
            return (
                len(logged(caplog, "dropped a remote workflow decision", tid)) >= len(bad_decisions)
                and bool(logged(caplog, "-decisions: not a decision"))
                and bool(logged(caplog, "-step-events: not a stepEvent"))
            )

        await until(decisions_dropped)
        for seq in range(9):
            assert await checkpoint(engine, "rw-3", seq) is None, seq
        run = await engine.get_run("rw-3")
        assert run is not None and run.awaiting_decision_task_id == tid
        assert len(logged(caplog, "dropped a remote workflow decision", tid)) == len(bad_decisions)
        assert len(logged(caplog, "dropped a workflow step event")) == len(bad_events)
        # The deep ones cannot even be parsed: each is dropped by its queue's consumer.
        assert len(logged(caplog, "-step-events: not a stepEvent")) == 1
        assert len(logged(caplog, "-decisions: not a decision")) == 1
        # Nothing was put back to be retried.
        assert await outsider.pending_jobs("decisions") == 0
        assert await outsider.pending_jobs("step-events") == 0
        # The turn still applies.
        await outsider.decide(
            {
                "taskId": tid,
                "runId": "rw-3",
                "status": "completed",
                "commands": [],
                "output": "done",
            }
        )

        async def done() -> bool:
            return await status_of(engine, "rw-3") == "completed"

        await until(done)


# ------------------------------------------------------------------ the rules, one by one


@pytest.mark.parametrize(
    ("group", "namespace", "route_group", "allowed"),
    [
        ("default", "default", None, True),
        ("acme", "default", None, False),  # a tenant's partition
        ("wf-split", "default", "wf-split", True),  # the registered split worker's group
        ("other", "default", "wf-split", False),
        ("acme", "acme", None, True),
        ("eu@acme", "acme", None, True),
        ("globex", "acme", None, False),
        ("default", "acme", None, False),  # the default namespace's bare queue
        ("acme@globex", "acme", None, False),
        ("wf-split", "acme", "wf-split", False),  # would leave `@acme`
    ],
)
def test_a_calls_group_stays_inside_its_runs_namespace(
    group: str, namespace: str, route_group: str | None, allowed: bool
) -> None:
    from durably._engine.remote.turn_routes import call_group_refusal

    assert (call_group_refusal(group, namespace, route_group) is None) is allowed


def test_a_turn_message_that_cannot_be_stored_is_refused_with_its_ids() -> None:
    from durably._core.wire import WireFormatError
    from durably._core.wire_turns import (
        parse_run_heartbeat,
        parse_workflow_decision,
        parse_workflow_step_event,
    )

    tid = "r:wf:0123abcd"
    decision = {"taskId": tid, "runId": "r", "status": "continue", "commands": []}
    for raw in (
        json.dumps({**decision, "output": float("nan")}),
        "[" * 200_000,
        {**decision, "commands": [{"kind": "sleep", "seq": 0, "ms": 10**300}]},
        {**decision, "commands": [{"kind": "waitSignal", "seq": 2**53, "signal": "s"}]},
    ):
        with pytest.raises(WireFormatError):
            parse_workflow_decision(raw)
    with pytest.raises(WireFormatError, match="max_payload_bytes"):
        parse_workflow_decision({**decision, "x": "y" * 2000}, max_bytes=1000)
    event = {"runId": "r", "seq": 0, "name": "n", "phase": "running", "startedAt": 1}
    assert parse_workflow_step_event(event).run_id == "r"
    for bad in (
        {**event, "startedAt": 253_402_300_800_000},
        {**event, "taskId": "other:wf:1"},
        {**event, "runId": "r\x00"},
    ):
        with pytest.raises(WireFormatError):
            parse_workflow_step_event(bad)
    with pytest.raises(WireFormatError, match="'r'"):
        parse_run_heartbeat({"runId": "r", "seq": 1e20, "group": "g"})
