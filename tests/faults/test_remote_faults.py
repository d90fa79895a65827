"""Remote steps under faults: real worker and engine processes, SIGKILL, real brokers.

The workload is tests/faults/remote_fault_app.py (a step that logs its side effect with its pid,
then sleeps; a workflow of N such steps). The engine under test runs in this process on a SQLite
file unless the test kills it; workers are `durably worker` subprocesses. Redis tests use the
shared server with a prefix of their own, except the restart test, which runs its own
redis-server (the shared one is never restarted); SQL tests use a table prefix of their own on
the shared PostgreSQL.

- a worker killed mid-step: the step runs again once, on the next worker, after the broker's
  lease lapses (BullMQ's lock and stall check; the SQL transport's claim lease);
- a step running longer than the lease runs once while its worker lives (BullMQ renews its
  lock; the SQL step server renews its claims, and hands them back at drain);
- a duplicate result for a settled step is dropped without changing anything;
- Redis restarted (SIGKILL, append-only file) with runs in flight: nothing is lost;
- the engine killed while results wait in the broker: the next engine applies them.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durably._core.wire import RemoteTask, StepResult, step_id_of
from durably._transport.redis_bullmq import BullQueue, redis_client
from durably._transport.redis_results import RESULT_JOB_OPTS
from durably.transports import RedisTransport
from tests.faults import remote_fault_app as fault_app
from tests.pg_support import PG_URL, connect
from tests.remote import redis_support
from tests.remote.redis_support import OwnRedis, require_redis_server
from tests.remote.sql_support import (
    db_fixture,  # noqa: F401
    insert_result,
    prefix_fixture,  # noqa: F401
    rows,
)
from tests.remote.sql_support import task as sql_task
from tests.remote.sql_support import transport as sql_transport
from tests.remote.worker_process import WorkerProcess, running_worker, subprocess_env

pytestmark = pytest.mark.timeout(90)

WORKER_APP = "tests.faults.remote_fault_app:worker_app"
KINDS = ["redis", "sql"]
#: How long a run may take to finish once its step can run (a lapsed lease included).
SETTLE_S = 30.0
#: How long the restart test keeps its Redis down.
OUTAGE_S = 1.0


class Broker:
    """The transport settings of one test, exported to the environment the workload reads
    (this process's and, inherited, the subprocesses')."""

    def __init__(self, kind: str, url: str, prefix: str, log: Path):
        self.kind, self.url, self.prefix, self.log = kind, url, prefix, log

    def export(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FAULT_TRANSPORT", self.kind)
        monkeypatch.setenv("FAULT_URL", self.url)
        monkeypatch.setenv("FAULT_PREFIX", self.prefix)
        monkeypatch.setenv("FAULT_LOG", str(self.log))

    def effects(self) -> list[tuple[str, int, int]]:
        """The side-effect lines so far: (run id, step seq, pid of the worker that ran it)."""
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            run_id, seq, pid = line.split()
            out.append((run_id, int(seq), int(pid)))
        return out

    def results_queue(self) -> BullQueue:
        """A producer on `P-results` (Redis only), as a worker would publish."""
        names = RedisTransport(self.url, prefix=self.prefix).names
        return BullQueue(names.results, redis_client(self.url, patient=False))


@pytest.fixture(params=KINDS)
def broker(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Broker:
    kind: str = request.param
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_prefix")
    else:
        url, prefix = PG_URL, request.getfixturevalue("prefix")
    found = Broker(kind, url, prefix, tmp_path / "effects.log")
    found.export(monkeypatch)
    return found


redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix


async def eventually(check: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await _truth(check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.02)


async def _truth(value: Any) -> bool:
    return bool(await value) if asyncio.iscoroutine(value) else bool(value)


def _sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'engine.db'}"


async def _wait_all(app: Any, run_ids: list[str], timeout: float = SETTLE_S) -> list[Any]:
    """The runs once every one is terminal; on timeout, fails showing the others' rows."""
    try:
        async with asyncio.timeout(timeout):
            waits = (app.wait_for_run(r, until="terminal") for r in run_ids)
            return list(await asyncio.gather(*waits))
    except TimeoutError:
        stuck = []
        for run_id in run_ids:
            run = await app.get_run(run_id)
            if run is None or run.status in ("completed", "failed", "cancelled", "dead"):
                continue
            rows = [
                (cp.seq, cp.kind, cp.status, cp.attempts, cp.wake_at)
                for cp in await app.list_checkpoints(run_id)
            ]
            stuck.append((run_id, run.status, run.locked_by, run.wake_at, rows))
        raise AssertionError(f"runs not terminal within {timeout} s: {stuck}") from None


# ------------------------------------------------------------------ a worker killed mid-step


@pytest.mark.parametrize("broker", KINDS, indirect=True)
async def test_a_worker_killed_mid_step_runs_it_again_once(broker: Broker, tmp_path: Path) -> None:
    app = fault_app.engine(_sqlite(tmp_path), "engine-t", timer_poll_ms=50)
    async with app:
        first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
        async with running_worker(
            WORKER_APP, first_log, cwd=tmp_path, env={"FAULT_STEP_SLEEP": "60"}
        ) as first:
            await app.start(fault_app.wf, {"x": 4, "steps": 1}, run_id="killed")
            await eventually(broker.effects, 15, "the first worker starting the step")
            first.sigkill()
        assert broker.effects() == [("killed", 0, first.pid)]
        run = await app.get_run("killed")
        assert run is not None and run.status not in ("completed", "failed")
        async with running_worker(
            WORKER_APP, second_log, cwd=tmp_path, env={"FAULT_STEP_SLEEP": "0"}
        ) as second:
            [run] = await _wait_all(app, ["killed"])
            assert run.status == "completed", (run.error, second.output())
            assert run.output == [{"x": 40, "pid": second.pid}]
            # Once on each worker: the dead one's attempt and the re-run after the lease.
            assert broker.effects() == [("killed", 0, first.pid), ("killed", 0, second.pid)]
        [row] = await app.list_checkpoints("killed")
        assert (row.status, row.output) == ("completed", {"x": 40, "pid": second.pid})


# ------------------------------------------------------------------ a duplicate late result


async def _publish_duplicate(broker: Broker, run_id: str, seq: int, output: Any) -> None:
    """A second result for a settled step, as a worker that ran it twice would send; returns
    once the engine's consumer took it (the broker acknowledges only after the sink)."""
    step_id = step_id_of(run_id, seq)
    if broker.kind == "redis":
        queue = broker.results_queue()
        payload = {"runId": run_id, "seq": seq, "stepId": step_id, "status": "completed"}
        await queue.add("result", {**payload, "output": output}, RESULT_JOB_OPTS)

        async def consumed() -> bool:
            counts = await queue.counts("waiting", "active", "delayed", "prioritized")
            return sum(counts.values()) == 0

        await eventually(consumed, 15, "the duplicate result consumed")
        return
    db = await connect()
    try:
        table = f'"{broker.prefix}_transport_results"'

        async def consumed() -> bool:
            rows = await db.fetchval(f"SELECT count(*) FROM {table} WHERE step_id = $1", step_id)
            return bool(rows == 0)

        # The drain deletes a result row after the settlement it made has committed: the
        # first result may still be there for a moment after the step reads settled.
        await eventually(consumed, 15, "the first result consumed")
        await insert_result(db, broker.prefix, step_id, output=output)
        await eventually(consumed, 15, "the duplicate result consumed")
    finally:
        await db.close()


@pytest.mark.parametrize("broker", KINDS, indirect=True)
async def test_a_duplicate_late_result_is_dropped(
    broker: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    # This engine serves the step itself (in-process): the duplicate is what is under test.
    app = fault_app.engine_serving_steps(_sqlite(tmp_path), "engine-t")
    async with app:
        await app.start(fault_app.gated, 3, run_id="dup")
        await eventually(
            lambda: _step_settled(app, "dup"), 15, "the first step settled, the run waiting"
        )
        rows = [cp for cp in await app.list_checkpoints("dup") if cp.kind == "remote"]
        assert [(cp.seq, cp.status) for cp in rows] == [(0, "completed")]
        original = rows[0]
        # While the run still waits: the row is no longer pending, the result changes nothing.
        await _publish_duplicate(broker, "dup", original.seq, {"x": -1, "pid": 0})
        await app.signal(fault_app.gate_token("dup"), "go")
        [run] = await _wait_all(app, ["dup"])
        assert run.status == "completed" and run.output == original.output
        # And after the run finished.
        await _publish_duplicate(broker, "dup", original.seq, {"x": -2, "pid": 0})
        after = await app.get_run("dup")
        assert after is not None
        assert (after.status, after.output) == ("completed", original.output)
        [row] = [cp for cp in await app.list_checkpoints("dup") if cp.kind == "remote"]
        assert (row.status, row.output, row.attempts) == ("completed", original.output, 1)
        assert row.finished_at == original.finished_at
    assert len(broker.effects()) == 1  # the step ran once; only its result came twice
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


async def _step_settled(app: Any, run_id: str) -> bool:
    rows = await app.list_checkpoints(run_id)
    return any(cp.kind == "remote" and cp.status == "completed" for cp in rows)


@pytest.mark.parametrize("broker", KINDS, indirect=True)
async def test_a_step_longer_than_the_lease_runs_once(broker: Broker, tmp_path: Path) -> None:
    # The worker lives: its claim on the task must outlast the lease, or it (or another
    # worker) takes the task again and the step runs twice while the first run goes on.
    pause = 2 * max(fault_app.LOCK_MS, fault_app.SQL_LEASE_MS) / 1000
    app = fault_app.engine(_sqlite(tmp_path), "engine-t", timer_poll_ms=50)
    async with app:
        async with running_worker(
            WORKER_APP, tmp_path / "worker.log", cwd=tmp_path, env={"FAULT_STEP_SLEEP": str(pause)}
        ) as worker:
            await app.start(fault_app.wf, {"x": 1, "steps": 1}, run_id="long")
            [run] = await _wait_all(app, ["long"])
            assert run.status == "completed", (run.error, worker.output())
            assert broker.effects() == [("long", 0, worker.pid)]


async def test_sql_claims_of_running_steps_are_renewed_and_handed_back_at_drain(
    prefix: str, db: Any
) -> None:
    lease_ms = 500
    t = sql_transport(prefix, lease_ms=lease_ms)
    started = asyncio.Event()
    runs: list[str] = []
    taken_again: list[str] = []

    async def stuck(task: RemoteTask) -> StepResult:
        runs.append(task.step_id)
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def thief(task: RemoteTask) -> StepResult:
        taken_again.append(task.step_id)
        return StepResult(task.run_id, task.seq, task.step_id, "completed", output=None)

    try:
        await t.dispatch(sql_task("run-r", 0, "long"))
        server = await t.step_server(["long"], stuck, concurrency=4)
        async with asyncio.timeout(5):
            await started.wait()
        [first] = await rows(db, prefix, "tasks")
        # Another server on the same token, while the step runs for several leases.
        other = await t.step_server(["long"], thief, concurrency=4)
        await asyncio.sleep(3 * lease_ms / 1000)
        [row] = await rows(db, prefix, "tasks")
        assert row["claimed_by"] == first["claimed_by"]
        assert row["claimed_at"] > first["claimed_at"]  # renewed
        assert (runs, taken_again) == (["run-r:0"], [])
        await other.drain(1)
        await server.drain(0.1)
        # The release matched the renewed stamp: the task is back in the queue at once.
        [row] = await rows(db, prefix, "tasks")
        assert (row["claimed_by"], row["claimed_at"]) == (None, None)
    finally:
        await t.close()


# ------------------------------------------------------------------ Redis restarted


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    require_redis_server()
    folder = tmp_path / "redis"
    folder.mkdir()
    server = OwnRedis(folder)
    server.start()
    yield server
    server.stop()


async def test_redis_restarted_with_runs_in_flight_loses_nothing(
    own_redis: OwnRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await redis_support.require_redis()  # the redis extra must be there as well
    broker = Broker("redis", own_redis.url, "restart", tmp_path / "effects.log")
    broker.export(monkeypatch)
    n, steps = 20, 2
    ids = [f"rr-{i}" for i in range(n)]
    app = fault_app.engine(_sqlite(tmp_path), "engine-t", timer_poll_ms=50)
    async with app:
        async with running_worker(
            WORKER_APP, tmp_path / "worker.log", cwd=tmp_path, env={"FAULT_STEP_SLEEP": "0.3"}
        ) as worker:
            for i, run_id in enumerate(ids):
                await app.start(fault_app.wf, {"x": i, "steps": steps}, run_id=run_id)
            # Every run is in its first step: results are about to go out, second steps to be
            # dispatched.
            await eventually(lambda: len(broker.effects()) >= n, 15, "steps running")
            finished = [r for r in await app.list_runs() if r.status == "completed"]
            assert len(finished) < n, "every run finished before the restart"
            # Killed, then started again on the same port and files; the engine and the
            # worker ride it out on their own.
            await asyncio.to_thread(own_redis.kill)
            # Down for longer than a step takes: results and dispatches meet a dead server.
            await asyncio.sleep(OUTAGE_S)
            await asyncio.to_thread(own_redis.start)
            runs = await _wait_all(app, ids, 45)
            problems = [(r.id, r.status, r.error) for r in runs if r.status != "completed"]
            assert problems == [], worker.output()[-3000:]
    for i, run in enumerate(runs):
        assert [step["x"] for step in run.output] == fault_app.expected_output(i, steps)
    assert len({r.id for r in runs if r.status == "completed"}) == n
    # At least once: every step of every run ran (a step in flight at the crash may twice).
    assert {(run_id, seq) for run_id, seq, _ in broker.effects()} == {
        (run_id, seq) for run_id in ids for seq in range(steps)
    }


# ------------------------------------------------------------------ the engine killed


async def _waiting_results(broker: Broker) -> int:
    """Results in the broker that no engine holds: waiting jobs, or unclaimed rows."""
    if broker.kind == "redis":
        counts = await broker.results_queue().counts("waiting", "active")
        assert counts["active"] == 0, counts
        return counts["waiting"]
    db = await connect()
    try:
        table = f'"{broker.prefix}_transport_results"'
        found = await db.fetchval(f"SELECT count(*) FROM {table} WHERE claimed_by IS NULL")
        return int(found)
    finally:
        await db.close()


@pytest.mark.parametrize("broker", KINDS, indirect=True)
async def test_results_waiting_for_a_killed_engine_are_applied_by_the_next(
    broker: Broker, tmp_path: Path
) -> None:
    n = 10
    ids = [f"rf-{i}" for i in range(n)]
    store = _sqlite(tmp_path)
    async with running_worker(
        WORKER_APP, tmp_path / "worker.log", cwd=tmp_path, env={"FAULT_STEP_SLEEP": "1.5"}
    ) as worker:
        engine_a = WorkerProcess(
            [sys.executable, "-m", "tests.faults.remote_fault_app", "engine", store, str(n), "1"],
            tmp_path / "engine-a.log",
            cwd=tmp_path,
            env=subprocess_env(),
        )

        def dispatched() -> bool:
            assert engine_a.proc.poll() is None, f"engine A exited:\n{engine_a.output()}"
            return "STARTED" in engine_a.output() and len(broker.effects()) == n

        try:
            # Every step started (so every task was dispatched); none has answered yet.
            await eventually(dispatched, 20, "engine A's steps running")
        finally:
            engine_a.sigkill()

        async def piled_up() -> bool:
            return await _waiting_results(broker) == n

        await eventually(piled_up, 10, "the results waiting in the broker")
        app = fault_app.engine(store, "engine-b", timer_poll_ms=50, reconcile_ms=500)
        async with app:
            runs = await _wait_all(app, ids)
        problems = [(r.id, r.status, r.error) for r in runs if r.status != "completed"]
        assert problems == [], worker.output()[-3000:]
        for i, run in enumerate(runs):
            assert run.output == [{"x": i * 10, "pid": worker.pid}]
        # The results were applied, not replaced: no step ran again.
        assert sorted(broker.effects()) == [(run_id, 0, worker.pid) for run_id in sorted(ids)]
