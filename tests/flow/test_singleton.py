"""Singleton workflows: `@durably.workflow(singleton=Singleton(key=..., limit=...,
max_queue_depth=...))` on the memory store, a SQLite file and PostgreSQL.

Runs of one key run their bodies `limit` at a time, admitted in creation order; the others
are parked `suspended` by the store at their turn. The holder carries the marker tag
`durable:singleton:admitted` (dropped when it ends, and on a manual retry); when it ends or
is cancelled, the next in line is woken. `max_queue_depth` refuses a start that would queue
too many (`SingletonQueueFullError`, nothing created). A cancelled waiter is never revived.

What ran when comes from a side-effect log the steps write (wall-clock times), never from the
engine's own bookkeeping.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import (
    Client,
    Engine,
    InMemoryStateStore,
    RunFailedError,
    Singleton,
    SingletonQueueFullError,
    WorkflowCtx,
    WorkflowRun,
)
from durably._core.quota import SINGLETON_ADMITTED_TAG
from tests.pg_support import fresh_schema, schema_url

TIMEOUT = 20.0
FAST: dict[str, Any] = {"timer_poll_ms": 20, "lease_ms": 2000, "drain_timeout_ms": 2000}
_ids = itertools.count()

# uid -> [(label, "start"|"end", time)]
LOG: dict[str, list[tuple[str, str, float]]] = {}


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield InMemoryStateStore()
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'singleton.db'}"
    else:
        async with fresh_schema(create=False) as schema:
            yield schema_url(schema)


@pytest.fixture
def uid() -> str:
    return f"s{next(_ids)}-{uuid.uuid4().hex[:6]}"


def logged_workflow(uid: str, **singleton: Any) -> Any:
    """Marks its start (a step), waits for `go:<label>`, marks its end (a step)."""
    LOG[uid] = []

    @durably.step(f"{uid}.mark")
    def mark(what: list[str]) -> None:
        LOG[uid].append((what[0], what[1], time.time()))

    @durably.workflow(f"{uid}.wf", singleton=Singleton(key=lambda i: i["key"], **singleton))
    async def wf(ctx: WorkflowCtx, inp: dict[str, str]) -> str:
        await ctx.step(mark, [inp["label"], "start"])
        got = await ctx.wait_for_signal(f"go:{uid}:{inp['label']}")
        await ctx.step(mark, [inp["label"], "end"])
        return str(got)

    return wf


def started(uid: str) -> list[str]:
    return [label for label, what, _ in LOG[uid] if what == "start"]


async def until(predicate: Any, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def run_of(engine: Engine | Client, run_id: str) -> WorkflowRun:
    run = await engine.get_run(run_id)
    assert run is not None
    return run


def spans(uid: str) -> dict[str, tuple[float, float]]:
    out: dict[str, list[float]] = {}
    for label, _, at in LOG[uid]:
        out.setdefault(label, []).append(at)
    return {label: (times[0], times[-1]) for label, times in out.items()}


async def test_runs_of_one_key_take_turns_in_creation_order(target: Any, uid: str) -> None:
    wf = logged_workflow(uid)
    async with Engine(target, workflows=[wf], **FAST) as engine:
        handles = {}
        for label, key in (("a1", "a"), ("a2", "a"), ("b1", "b"), ("a3", "a")):
            handles[label] = await engine.start(
                wf, {"key": key, "label": label}, run_id=f"{uid}-{label}"
            )

        async def two_started() -> bool:
            return sorted(started(uid)) == ["a1", "b1"]

        await until(two_started)  # another key is not held up
        holder = await run_of(engine, f"{uid}-a1")
        assert holder.tags == ("singleton:a", SINGLETON_ADMITTED_TAG)
        for label in ("a2", "a3"):

            async def parked(label: str = label) -> bool:
                run = await engine.get_run(f"{uid}-{label}")
                return run is not None and run.status == "suspended" and run.wake_at is not None

            await until(parked)
            waiting = await run_of(engine, f"{uid}-{label}")
            assert waiting.tags == ("singleton:a",)
        await asyncio.sleep(1.5)  # a few retries of the waiters: still only a1 of key a
        assert sorted(started(uid)) == ["a1", "b1"]
        for label in ("a1", "b1", "a2", "a3"):
            await engine.signal(f"go:{uid}:{label}", label)
            assert await handles[label].result(timeout=TIMEOUT) == label
        done = await run_of(engine, f"{uid}-a1")
        assert done.tags == ("singleton:a",)  # the marker goes when the run ends
    assert [label for label in started(uid) if label.startswith("a")] == ["a1", "a2", "a3"]
    runs = spans(uid)
    order = [runs[label] for label in ("a1", "a2", "a3")]
    for (_, end), (start, _) in itertools.pairwise(order):
        assert start >= end  # never two runs of key `a` at once


async def test_a_limit_of_two_runs_two_bodies_at_once(target: Any, uid: str) -> None:
    wf = logged_workflow(uid, limit=2)
    async with Engine(target, workflows=[wf], **FAST) as engine:
        handles = [
            await engine.start(wf, {"key": "k", "label": f"r{n}"}, run_id=f"{uid}-r{n}")
            for n in range(3)
        ]

        async def two() -> bool:
            return sorted(started(uid)) == ["r0", "r1"]

        await until(two)
        await asyncio.sleep(1.2)
        assert sorted(started(uid)) == ["r0", "r1"]
        await engine.signal(f"go:{uid}:r1", "x")
        await handles[1].result(timeout=TIMEOUT)

        async def third() -> bool:
            return "r2" in started(uid)

        await until(third, timeout=5)  # woken on release, not only by its own retry
        for n in (0, 2):
            await engine.signal(f"go:{uid}:r{n}", "x")
            await handles[n].result(timeout=TIMEOUT)


async def test_max_queue_depth_refuses_a_start_and_creates_nothing(target: Any, uid: str) -> None:
    wf = logged_workflow(uid, max_queue_depth=1)
    async with Engine(target, workflows=[wf], **FAST) as engine:
        first = await engine.start(wf, {"key": "k", "label": "q0"}, run_id=f"{uid}-q0")
        await engine.start(wf, {"key": "k", "label": "q1"}, run_id=f"{uid}-q1")
        with pytest.raises(SingletonQueueFullError) as info:
            await engine.start(wf, {"key": "k", "label": "q2"}, run_id=f"{uid}-q2")
        assert (info.value.workflow, info.value.key, info.value.max_queue_depth) == (
            f"{uid}.wf",
            "k",
            1,
        )
        assert await engine.get_run(f"{uid}-q2") is None
        # an idempotent re-start is never refused; another key has its own line
        again = await engine.start(wf, {"key": "k", "label": "q0"}, run_id=f"{uid}-q0")
        assert again.run_id == first.run_id
        await engine.start(wf, {"key": "other", "label": "o"}, run_id=f"{uid}-o")
        await engine.cancel(f"{uid}-q0")
        await engine.start(wf, {"key": "k", "label": "q2"}, run_id=f"{uid}-q2")
        for label in ("q1", "q2", "o"):
            await engine.signal(f"go:{uid}:{label}", "x")
        await engine.wait_for_run(f"{uid}-q2", timeout=TIMEOUT, until="terminal")


async def test_a_fans_members_pass_the_queue_depth_one_by_one(target: Any, uid: str) -> None:
    """Members of a workflow fan join their key's line as single starts would: one holds the
    key, `max_queue_depth` wait, the rest are not created and settle as failures."""
    wf = logged_workflow(uid, max_queue_depth=1)

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> list[str]:
        inputs = [{"key": "k", "label": f"f{n}"} for n in range(3)]
        settled = await ctx.all_settled(wf, inputs)
        return [s.value if isinstance(s, durably.Fulfilled) else s.error for s in settled]

    async with Engine(target, workflows=[wf, parent], **FAST) as engine:
        handle = await engine.start(parent, run_id=f"{uid}-p")

        async def one_started() -> bool:
            return started(uid) == ["f0"]

        await until(one_started)
        assert await engine.get_run(f"{uid}-p.all.0.2") is None  # over the depth: not created
        for label in ("f0", "f1"):
            await engine.signal(f"go:{uid}:{label}", label)
        out = await handle.result(timeout=TIMEOUT)
    assert out[:2] == ["f0", "f1"]
    assert f'singleton queue for {uid}.wf key "k" is full (1 waiting)' in out[2], out


async def test_cancelling_the_holder_admits_the_next_and_a_cancelled_waiter_stays_cancelled(
    target: Any, uid: str
) -> None:
    wf = logged_workflow(uid)
    async with Engine(target, workflows=[wf], **FAST) as engine:
        for n in range(3):
            await engine.start(wf, {"key": "k", "label": f"c{n}"}, run_id=f"{uid}-c{n}")

        async def holder_started() -> bool:
            return started(uid) == ["c0"]

        await until(holder_started)
        await engine.cancel(f"{uid}-c1")  # a waiter: cancelled, never admitted
        await engine.cancel(f"{uid}-c0")  # the holder: the next live waiter goes

        async def next_started() -> bool:
            return started(uid) == ["c0", "c2"]

        await until(next_started, timeout=5)
        assert (await run_of(engine, f"{uid}-c1")).status == "cancelled"
        cancelled = await run_of(engine, f"{uid}-c0")
        assert cancelled.status == "cancelled" and SINGLETON_ADMITTED_TAG not in (
            cancelled.tags or ()
        )
        await engine.signal(f"go:{uid}:c2", "x")
        await engine.wait_for_run(f"{uid}-c2", timeout=TIMEOUT, until="terminal")
        assert (await run_of(engine, f"{uid}-c1")).status == "cancelled"


async def test_a_retried_run_queues_again_behind_the_holder(target: Any, uid: str) -> None:
    fail_once = [True]

    @durably.workflow(f"{uid}.flaky", singleton=Singleton(key=lambda i: "k"))
    async def flaky(ctx: WorkflowCtx, inp: dict[str, Any]) -> str:
        if inp["fail"] and fail_once[0]:  # fails its first attempt only (not replayed)
            fail_once[0] = False
            raise durably.FatalError("first time")
        return str(await ctx.wait_for_signal(f"go:{uid}:{inp['label']}"))

    async with Engine(target, workflows=[flaky], **FAST) as engine:
        failed = await engine.start(flaky, {"fail": True, "label": "f"}, run_id=f"{uid}-f")
        with pytest.raises(RunFailedError):
            await failed.result(timeout=TIMEOUT)
        assert SINGLETON_ADMITTED_TAG not in ((await run_of(engine, failed.run_id)).tags or ())
        holder = await engine.start(flaky, {"fail": False, "label": "h"}, run_id=f"{uid}-h")
        await holder.wait(timeout=TIMEOUT)  # admitted, waiting for its signal
        await engine.retry(failed.run_id)

        async def parked() -> bool:
            run = await engine.get_run(failed.run_id)
            return run is not None and run.status == "suspended" and run.wake_at is not None

        await until(parked)
        assert SINGLETON_ADMITTED_TAG not in ((await run_of(engine, failed.run_id)).tags or ())
        await engine.signal(f"go:{uid}:h", "x")
        await holder.result(timeout=TIMEOUT)

        async def admitted() -> bool:
            run = await engine.get_run(failed.run_id)
            return run is not None and SINGLETON_ADMITTED_TAG in (run.tags or ())

        await until(admitted, timeout=5)
        await engine.signal(f"go:{uid}:f", "y")
        assert await failed.result(timeout=TIMEOUT) == "y"


async def test_a_start_by_name_without_the_code_is_queued_at_its_first_turn(
    target: Any, uid: str
) -> None:
    """A client without the workflow's code cannot compute the key: the run is tagged by
    the worker at its first turn, and waits behind the holder like any other."""
    wf = logged_workflow(uid)
    async with Engine(target, workflows=[wf], **FAST) as engine:
        await engine.start(wf, {"key": "k", "label": "e"}, run_id=f"{uid}-e")

        async def holder() -> bool:
            return started(uid) == ["e"]

        await until(holder)
        async with Client(target) as client:
            by_name = await client.start(f"{uid}.wf", {"key": "k", "label": "n"}, run_id=f"{uid}-n")

            async def parked() -> bool:
                run = await client.get_run(by_name.run_id)
                return run is not None and run.status == "suspended"

            await until(parked)
            assert (await run_of(client, by_name.run_id)).tags == ("singleton:k",)
        await asyncio.sleep(0.5)
        assert started(uid) == ["e"]
        for label in ("e", "n"):
            await engine.signal(f"go:{uid}:{label}", "x")
        await engine.wait_for_run(f"{uid}-n", timeout=TIMEOUT, until="terminal")
    assert started(uid) == ["e", "n"]


def test_bad_singleton_options_are_refused_at_declaration(uid: str) -> None:
    with pytest.raises(TypeError, match=r"durably\.Singleton"):
        durably.workflow(f"{uid}.x", singleton={"key": "k"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive int"):
        Singleton(key=lambda i: "k", limit=0)
    with pytest.raises(ValueError, match="max_queue_depth"):
        Singleton(key=lambda i: "k", max_queue_depth=-1)


async def test_concurrent_starts_of_a_full_key_from_two_clients_on_postgresql(uid: str) -> None:
    """No queue at all (`max_queue_depth=0`): of 12 starts of one key raced from two clients
    (two connection pools, as two processes would have), exactly one is created."""
    wf = logged_workflow(uid, max_queue_depth=0)
    async with fresh_schema(create=False) as schema:
        url = schema_url(schema)
        async with Client(url) as one, Client(url) as two:

            async def attempt(n: int) -> bool:
                client = one if n % 2 else two
                try:
                    await client.start(wf, {"key": "k", "label": str(n)}, run_id=f"{uid}-{n}")
                except SingletonQueueFullError:
                    return False
                return True

            created = await asyncio.gather(*(attempt(n) for n in range(12)))
            assert sum(created) == 1
            assert await one.count_runs(tag="singleton:k") == 1
