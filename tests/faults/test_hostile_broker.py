"""A hostile broker writer, fuzzed: while ordinary runs execute, a seeded generator sends
malformed and adversarial messages on every channel an outsider can write to, and afterwards
every ordinary run completed with the right output, no step ran twice, no run holds a value
it was not given, and the log has at most one line per bad message.

The writer is an outsider: BullMQ jobs added with the `bullmq` package on the queues the
engine consumes, plain Redis commands for the heartbeat and descriptor keys and the run-beat
channel, and rows inserted with asyncpg into the SQL transport's results table. Where a value
cannot be produced by a well-behaved JSON encoder (NaN, a nesting deeper than the encoder's
recursion, a lone surrogate written raw), the job's data is handed to the broker as the raw
text a buggy or hostile writer in another language would store.

What the writer may legitimately do is not tested here: anyone who can write to the results
queue can answer a step attempt that is in flight with a well-formed result (the wire carries
no signature); that is the trust boundary docs/architecture.md describes. So the generator
aims its well-formed messages at positions that are never in flight (other runs, later
positions, runs that do not exist, engine-owned tokens) and its malformed ones anywhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest

import durably
from durably import TenantGateway, WorkflowCtx
from tests.pg_support import pg_schema, pg_url  # noqa: F401
from tests.remote import redis_support
from tests.remote.redis_support import wait_for

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(300)

SEED = 20261202
RUNS = 12
SECRET = "a-fuzz-secret-of-enough-length"
LIMIT = 64 * 1024  # max_payload_bytes for the engine under attack: oversize is cheap to make


class RawJson(dict[str, Any]):
    """Job data handed to the broker as this exact text (see `raw_bullmq`)."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text


@contextmanager
def raw_bullmq() -> Iterator[None]:
    """Let `Queue.add` store a `RawJson`'s text as the job's data, as a writer whose encoder
    does not refuse NaN, or that builds its JSON by hand, would."""
    import bullmq.scripts as scripts

    real = scripts.json

    class Shim:
        @staticmethod
        def dumps(value: Any, *args: Any, **kwargs: Any) -> str:
            if isinstance(value, RawJson):
                return value.text
            return real.dumps(value, *args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    scripts.json = Shim()  # type: ignore[assignment]
    try:
        yield
    finally:
        scripts.json = real


# ------------------------------------------------------------------ the ordinary workload

CALLS: Counter[tuple[str, int]] = Counter()


def workload(tag: str) -> tuple[Any, Any, Any, Any]:
    @durably.step(f"{tag}.add", retries=1)
    async def add(item: dict[str, Any]) -> int:
        CALLS[(item["run"], item["k"])] += 1
        return int(item["v"]) + 1

    @durably.step(f"{tag}.gpu", retries=1, requires=["fuzz-gpu"])
    async def gpu(item: dict[str, Any]) -> int:
        CALLS[(item["run"], item["k"])] += 1
        return int(item["v"]) * 2

    @durably.workflow(f"{tag}.child")
    async def child(ctx: WorkflowCtx, n: int) -> int:
        return n * 10

    @durably.workflow(f"{tag}.ordinary")
    async def ordinary(ctx: WorkflowCtx, n: int) -> list[Any]:
        a = await ctx.step(add, {"run": ctx.run_id, "k": 0, "v": n})
        b = await ctx.step(gpu, {"run": ctx.run_id, "k": 1, "v": a})
        go = await ctx.wait_for_signal(f"{tag}-go:{n}")
        c = await ctx.child(child, n)
        return [a, b, go, c]

    return add, gpu, child, ordinary


def expected(n: int) -> list[Any]:
    return [n + 1, (n + 1) * 2, f"go-{n}", n * 10]


# ------------------------------------------------------------------ the generator


class Hostile:
    """Seeded adversarial values and messages aimed at the ordinary runs."""

    def __init__(self, rng: random.Random, victims: list[str], tag: str):
        self.rng = rng
        self.victims = victims
        self.tag = tag
        # Until the victims are started, a tenant taking one of their ids first is simply
        # the first start of that id (the operator's start is then the conflict): start-runs
        # aim at the victims only once they exist.
        self.started = False

    def pick(self, options: list[Any]) -> Any:
        return options[self.rng.randrange(len(options))]

    def run_id(self) -> Any:
        victim = self.pick(self.victims)
        return self.pick(
            [
                victim,
                victim,
                f"nope-{self.rng.getrandbits(32):x}",
                "",
                "x" * 400,
                "a/b",
                "nul\x00id",
                7,
                None,
                ["list"],
            ]
        )

    def seq(self) -> Any:
        # Positions 0 and 1 are the ordinary runs' steps, which may be in flight: well-formed
        # messages never aim there (see the module docstring).
        return self.pick([2, 3, 4, 9, 40, -1, 10**20, 2**63, 1.5, "2", None, True])

    def value(self) -> Any:
        return self.pick(
            [
                None,
                "planted",
                {"planted": True},
                [1, 2, 3],
                "\ud800",
                "x" * (LIMIT + 1),
                10**30,
                -(2**70),
                {"deep": self.nested(60)},
            ]
        )

    def nested(self, depth: int) -> Any:
        value: Any = "leaf"
        for _ in range(depth):
            value = [value]
        return value

    def raw(self, template: dict[str, Any], key: str) -> RawJson:
        """`template` with `key`'s value replaced by text no strict encoder writes."""
        marker = "__RAW_VALUE__"
        text = json.dumps({**template, key: marker})
        bad = self.pick(
            ["NaN", "Infinity", "-Infinity", "[" * 200_000 + "]" * 200_000, '"\\ud800"', "1e400"]
        )
        return RawJson(text.replace(json.dumps(marker), bad))

    def maybe_raw(self, message: dict[str, Any], key: str) -> dict[str, Any]:
        return self.raw(message, key) if self.rng.random() < 0.3 else message

    def token(self) -> str:
        victim = self.pick(self.victims)
        return self.pick(
            [
                f"child:{victim}.child.3",
                f"bp:{victim}:2",
                f"update:{victim}:x",
                f"event:go:{victim}",
                "__evtacc__:default:x",
                f"timer:{victim}:2",
                f"{self.tag}-go:{self.rng.randrange(RUNS)}",
            ]
        )

    # ---- one message per channel. Most are well-formed and aimed at what they must not
    # touch (a hostile writer's message parses); the rest carry one malformed field.

    def corrupt(self, message: dict[str, Any], keys: list[str]) -> dict[str, Any]:
        """`message` as it is (60 %), or with one of `keys` malformed."""
        if self.rng.random() < 0.6:
            return message
        key = self.pick(keys)
        if self.rng.random() < 0.5:
            return self.raw(message, key)
        broken = dict(message)
        broken[key] = self.pick([None, 10**20, -1, 1.5, "", ["x"], {"x": 1}, "\ud800", "x" * 500])
        return broken

    def result(self) -> dict[str, Any]:
        run_id = self.pick([*self.victims, f"nope-{self.rng.getrandbits(32):x}"])
        seq = self.pick([2, 3, 4, 9])
        message: dict[str, Any] = {
            "runId": run_id,
            "seq": seq,
            "stepId": f"{run_id}:{seq}",
            "status": self.pick(["completed", "failed"]),
            "output": self.pick(["planted", {"planted": True}, "x" * (LIMIT + 1)]),
            "startedAt": 1_700_000_000_000,
        }
        if message["status"] == "failed":
            message["error"] = {"message": "forged", "retryable": False}
        return self.corrupt(message, ["seq", "output", "startedAt", "runId", "status"])

    def step_event(self) -> dict[str, Any]:
        message = {
            "runId": self.pick(self.victims),
            "seq": self.pick([0, 1, 2, 3, 4]),
            "name": "forged",
            "phase": "completed",
            "output": self.pick(["planted", {"planted": True}, "x" * (LIMIT + 1)]),
            "startedAt": 1_700_000_000_000,
        }
        return self.corrupt(message, ["seq", "output", "startedAt", "runId", "phase"])

    def decision(self) -> dict[str, Any]:
        run_id = self.pick(self.victims)
        commands = [
            {"kind": "waitSignal", "seq": 2, "signal": self.token()},
            {"kind": "recordStep", "seq": 2, "name": "forged", "output": "planted"},
            {"kind": "call", "seq": 5, "name": f"{self.tag}.add", "group": "globex"},
            {"kind": "startChild", "seq": 6, "workflow": f"{self.tag}.child"},
            {"kind": "sleep", "seq": 7, "ms": 10**20},
        ]
        status = self.pick(["continue", "completed", "failed", "cancelled"])
        message: dict[str, Any] = {
            "runId": run_id,
            "taskId": f"{run_id}:wf:deadbeef",
            "status": status,
            "commands": [self.pick(commands) for _ in range(3)] if status == "continue" else [],
        }
        if status == "completed":
            message["output"] = "planted"
        if status == "failed":
            message["error"] = {"message": "forged", "code": "x"}
        return self.corrupt(message, ["runId", "taskId", "status", "commands"])

    def run_beat(self) -> str:
        return self.pick(
            [
                json.dumps({"runId": self.pick(self.victims), "taskId": "forged", "at": 10**20}),
                "[" * 200_000,
                "not json",
                json.dumps({"runId": None}),
                "NaN",
            ]
        )

    def heartbeat_value(self) -> str:
        return self.pick(
            [
                "[" * 200_000,
                "NaN",
                "1e400",
                json.dumps({"ts": 10**30, "status": self.nested(50)}),
                "\x00\x01garbage",
                "x" * 300_000,
            ]
        )

    def descriptor_value(self) -> str:
        return self.pick(
            [
                "[" * 200_000,
                json.dumps({"capabilities": self.nested(100)}),
                json.dumps({"capabilities": ["fuzz-gpu"], "protocol": 10**30}),
                "{not json",
                "x" * 300_000,
            ]
        )

    def start_run(self, evil_token: str, squat: str) -> dict[str, Any]:
        message: dict[str, Any] = {
            "workflow": f"{self.tag}.ordinary",
            "runId": self.pick([*self.victims, squat]) if self.started else squat,
            "input": 1,
            "tags": ["ok"],
            "searchAttributes": {"k": "v"},
            "token": evil_token,
        }
        if self.rng.random() < 0.5:
            message["tags"] = self.pick([["ok", "nul\x00tag"], ["durable:parent:x"]])
            message["searchAttributes"] = self.pick([{"k\x00": "v"}, {"k": "v\x00"}])
        return self.corrupt(message, ["input", "workflow", "runId", "token"])

    def run_request(self, evil_token: str) -> dict[str, Any]:
        victim = self.pick(self.victims)
        body = self.pick(
            [
                {"kind": "cancel", "runId": victim},
                {"kind": "retryWithInput", "runId": victim, "input": "planted"},
                {"kind": "getRunDetail", "runId": victim},
                {"kind": "continue", "runId": victim},
                {"kind": "redispatch", "runId": victim},
                {"kind": "listRuns", "limit": 10**20},
            ]
        )
        message = {
            "requestId": f"r-{self.rng.getrandbits(32):x}",
            "token": evil_token,
            "tenant": "evil",
            "body": body,
        }
        return self.corrupt(message, ["requestId", "token", "body"])


# ------------------------------------------------------------------ the attack


class Bad:
    """Counts the bad messages sent, and the log lines they caused."""

    def __init__(self) -> None:
        self.sent = 0


@asynccontextmanager
async def bullmq_queue(url: str, name: str) -> AsyncIterator[Any]:
    from bullmq import Queue

    queue = Queue(name, {"connection": url, "prefix": "bull"})
    try:
        yield queue
    finally:
        await queue.close()


async def attack_redis(
    url: str,
    prefix: str,
    hostile: Hostile,
    bad: Bad,
    rounds: int,
    tokens: list[str],
    squats: list[str],
) -> None:
    import redis.asyncio as aioredis

    evil = TenantGateway.mint_token(SECRET, "evil")
    client = aioredis.Redis.from_url(url)
    queues: dict[str, Callable[[], dict[str, Any]]] = {
        f"{prefix}-results": hostile.result,
        f"{prefix}-step-events": hostile.step_event,
        f"{prefix}-decisions": hostile.decision,
        f"{prefix}-start-run": lambda: hostile.start_run(evil, hostile.pick(squats)),
        f"{prefix}-run-request": lambda: hostile.run_request(evil),
    }
    names = {
        f"{prefix}-results": "result",
        f"{prefix}-step-events": "stepEvent",
        f"{prefix}-decisions": "decision",
        f"{prefix}-start-run": "startRun",
        f"{prefix}-run-request": "runRequest",
    }
    try:
        async with (
            bullmq_queue(url, f"{prefix}-results") as results,
            bullmq_queue(url, f"{prefix}-step-events") as events,
            bullmq_queue(url, f"{prefix}-decisions") as decisions,
            bullmq_queue(url, f"{prefix}-start-run") as starts,
            bullmq_queue(url, f"{prefix}-run-request") as requests,
        ):
            by_name = {
                f"{prefix}-results": results,
                f"{prefix}-step-events": events,
                f"{prefix}-decisions": decisions,
                f"{prefix}-start-run": starts,
                f"{prefix}-run-request": requests,
            }
            with raw_bullmq():
                for i in range(rounds):
                    for name, make in queues.items():
                        await by_name[name].add(names[name], make(), {"removeOnComplete": True})
                        bad.sent += 1
                    await client.publish(f"{prefix}-heartbeat", hostile.run_beat())
                    bad.sent += 1
                    token = hostile.pick(tokens)
                    await client.set(
                        f"{prefix}-worker-heartbeat:{token}:evil-{i}",
                        hostile.heartbeat_value(),
                        ex=35,
                    )
                    await client.set(
                        f"{prefix}-worker-descriptor:{token}:evil-{i}",
                        hostile.descriptor_value(),
                        ex=35,
                    )
                    # A live-looking worker whose descriptor is garbage.
                    await client.set(
                        f"{prefix}-worker-heartbeat:{token}:live-evil-{i}",
                        json.dumps({"ts": int(time.time() * 1000)}),
                        ex=35,
                    )
                    await client.set(
                        f"{prefix}-worker-descriptor:{token}:live-evil-{i}",
                        hostile.descriptor_value(),
                        ex=35,
                    )
                    bad.sent += 4
                    await asyncio.sleep(0)
    finally:
        await client.aclose()


async def queues_drained(url: str, prefix: str) -> bool:
    for name in ("results", "step-events", "decisions", "start-run", "run-request"):
        async with bullmq_queue(url, f"{prefix}-{name}") as queue:
            counts = await queue.getJobCounts("waiting", "active", "delayed", "prioritized")
            if any(counts.values()):
                return False
    return True


def durably_log_lines(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    return [r for r in records if r.name.startswith("durably") and r.levelno >= logging.WARNING]


async def test_a_hostile_redis_writer_cannot_plant_steal_stall_or_loop(
    pg_url: str,  # noqa: F811
    redis_url: str,
    redis_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from durably.transports import RedisTransport

    caplog.set_level(logging.INFO)
    CALLS.clear()
    tag = f"fz{uuid.uuid4().hex[:6]}"
    add, gpu, child, ordinary = workload(tag)
    rng = random.Random(SEED)
    victims = [f"{tag}-{n}" for n in range(RUNS)]
    hostile = Hostile(rng, victims, tag)
    bad = Bad()
    engine = durably.Engine(
        pg_url,
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=[ordinary, child],
        steps=[add, gpu],
        capabilities=["fuzz-gpu"],
        tenant_token_secret=SECRET,
        max_payload_bytes=LIMIT,
        always_replay=True,  # every turn replays its checkpoints: a planted one would show
    )
    squats = [f"{tag}-late-{k}" for k in range(4)]
    tokens = [f"{tag}.add", f"{tag}.gpu"]
    async with engine:
        # The first volley lands before any run starts: garbage worker keys are there when
        # the first `requires=` step plans its dispatch.
        await attack_redis(redis_url, redis_prefix, hostile, bad, 20, tokens, squats)
        handles = [await engine.start(ordinary, n, run_id=victims[n]) for n in range(RUNS)]
        hostile.started = True
        await attack_redis(redis_url, redis_prefix, hostile, bad, 30, tokens, squats)

        async def all_waiting() -> bool:
            runs = [await engine.get_run(v) for v in victims]
            return all(r is not None and r.status == "suspended" for r in runs)

        await wait_for(all_waiting, 120, "every ordinary run waiting for its signal")
        # A second volley while the runs wait for their signals and children.
        await attack_redis(redis_url, redis_prefix, hostile, bad, 20, tokens, squats)
        for n in range(RUNS):
            await engine.signal(f"{tag}-go:{n}", f"go-{n}")
        outputs = [await h.result(timeout=120) for h in handles]
        assert outputs == [expected(n) for n in range(RUNS)]
        for victim in victims:
            assert CALLS[(victim, 0)] == 1 and CALLS[(victim, 1)] == 1, dict(CALLS)
            for cp in await engine.list_checkpoints(victim):
                # Nothing planted: no checkpoint holds a value the generator made.
                text = json.dumps(cp.output, default=str) if cp.output is not None else ""
                assert "planted" not in text and "forged" not in text, cp
                assert cp.error is None or "forged" not in cp.error.message, cp
        # An id a tenant took in its own namespace is a conflict for the operator, never
        # the tenant's run handed back.
        for k, squat in enumerate(squats):
            taken = await engine.get_run(squat)
            if taken is not None and taken.namespace not in (None, "default"):
                with pytest.raises(durably.RunIdConflictError):
                    await engine.start(ordinary, k, run_id=squat)
            else:
                handle = await engine.start(ordinary, k, run_id=squat)
                await engine.signal(f"{tag}-go:{k}", f"go-{k}")
                assert await handle.result(timeout=120) == expected(k)
        # Every hostile job was consumed and dropped once: none is re-queued forever.
        await wait_for(
            lambda: queues_drained(redis_url, redis_prefix), 30, "hostile queues drained"
        )
    lines = durably_log_lines(caplog.records)
    assert len(lines) <= bad.sent, (len(lines), bad.sent, [r.getMessage()[:200] for r in lines])


# ------------------------------------------------------------------ SQL transport rows


def hostile_rows(rng: random.Random, victims: list[str], now: int) -> list[tuple[Any, ...]]:
    """Result rows a hostile writer inserts into `<prefix>_transport_results`: (step_id,
    run_id, seq, status, output, error, started_at, created_at), oldest first so the drain
    meets them before any real result."""
    rows: list[tuple[Any, ...]] = []
    for i in range(60):
        run_id = rng.choice([*victims, f"nope-{i}"])
        seq = rng.choice([2, 3, 9])
        step_id = f"{run_id}:{seq}"
        output = rng.choice(
            [
                "NaN",
                "Infinity",
                "[" * 200_000 + "]" * 200_000,
                '"\\ud800"',
                json.dumps("x" * (LIMIT + 1)),
                "not json",
                json.dumps("planted"),
            ]
        )
        status = rng.choice(["completed", "completed", "failed", "weird"])
        error = rng.choice([None, "not json", json.dumps({"message": "forged"}), "[" * 100_000])
        started_at = rng.choice([now, now * 1_000_000, -1, None])
        if rng.random() < 0.2:
            step_id = f"{run_id}:{seq + 1}"  # disagrees with run_id/seq
        rows.append((step_id, run_id, seq, status, output, error, started_at, i + 1))
    return rows


async def test_hostile_sql_result_rows_neither_plant_nor_block_the_drain(
    pg_url: str,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    from durably.transports import SqlTransport
    from tests.pg_support import PG_URL, connect
    from tests.remote.sql_support import create_tables, drop_tables

    caplog.set_level(logging.INFO)
    CALLS.clear()
    tag = f"fs{uuid.uuid4().hex[:6]}"
    prefix = f"t{uuid.uuid4().hex[:12]}"
    add, _gpu, child, _ordinary = workload(tag)

    @durably.workflow(f"{tag}.sql")
    async def sql_ordinary(ctx: WorkflowCtx, n: int) -> list[Any]:
        a = await ctx.step(add, {"run": ctx.run_id, "k": 0, "v": n})
        b = await ctx.step(add, {"run": ctx.run_id, "k": 1, "v": a})
        go = await ctx.wait_for_signal(f"{tag}-go:{n}")
        return [a, b, go]

    victims = [f"{tag}-{n}" for n in range(RUNS)]
    rows = hostile_rows(random.Random(SEED), victims, int(time.time() * 1000))
    await create_tables(prefix)
    db = await connect()
    try:
        insert = (
            f'INSERT INTO "{prefix}_transport_results" (step_id, run_id, seq, status, output, '
            "error, started_at, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) "
            "ON CONFLICT (step_id) DO NOTHING"
        )
        await db.executemany(insert, rows[:30])
        engine = durably.Engine(
            pg_url,
            transport=SqlTransport(PG_URL, prefix=prefix, poll_ms=50, pool_size=2),
            workflows=[sql_ordinary, child],
            steps=[add],
            max_payload_bytes=LIMIT,
            always_replay=True,
            timer_poll_ms=50,
        )
        async with engine:
            handles = [await engine.start(sql_ordinary, n, run_id=victims[n]) for n in range(RUNS)]
            await db.executemany(insert, rows[30:])

            async def all_waiting() -> bool:
                runs = [await engine.get_run(v) for v in victims]
                return all(r is not None and r.status == "suspended" for r in runs)

            await wait_for(all_waiting, 120, "every ordinary run waiting for its signal")
            for n in range(RUNS):
                await engine.signal(f"{tag}-go:{n}", f"go-{n}")
            outputs = [await h.result(timeout=120) for h in handles]
            assert outputs == [[n + 1, n + 2, f"go-{n}"] for n in range(RUNS)]
            for victim in victims:
                assert CALLS[(victim, 0)] == 1 and CALLS[(victim, 1)] == 1, dict(CALLS)
                for cp in await engine.list_checkpoints(victim):
                    text = json.dumps(cp.output, default=str) if cp.output is not None else ""
                    assert "planted" not in text, cp
                    assert cp.error is None or "forged" not in cp.error.message, cp

            async def drained() -> bool:
                left = await db.fetchval(f'SELECT count(*) FROM "{prefix}_transport_results"')
                return bool(left == 0)

            await wait_for(drained, 30, "every hostile row removed from the results table")
    finally:
        await db.close()
        await drop_tables(prefix)
    lines = durably_log_lines(caplog.records)
    assert len(lines) <= len(rows), (len(lines), [r.getMessage()[:200] for r in lines])
