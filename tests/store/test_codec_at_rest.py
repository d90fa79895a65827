"""Payloads written through `CodecStateStore(sql, AesGcmCodec(key))` are ciphertext at rest,
in SQLite and in PostgreSQL, for EVERY contract method that writes a payload.

The tables are read with the database's own client (sqlite3, asyncpg), not through durably,
so nothing decodes on the way. Each write carries its own marker (`SECRET-<method>`): a leak
names the method. The set of methods exercised here must equal the set the derived wrapper
encodes (taken from the `StateStore` annotations): a new payload-writing method fails this
test until it is written here too and its rows are checked.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from durably import AesGcmCodec, CodecStateStore, RunQuery, SignalWaiter, StateStore
from durably._core.models import BufferedEvent, ChildWait
from durably._core.quota import StartGate
from durably._core.schedules import ScheduleRecord, ScheduleSpec, ScheduleState
from durably._store.codec import contract_methods, plan_method
from tests.pg_support import connect, fresh_schema, schema_url
from tests.store.support import T0, at, make_cp, make_run, take_buffered

KEY = bytes(range(32))
ENVELOPE = "aesgcm:v1:"


def secret(method: str) -> dict[str, str]:
    return {"value": f"SECRET-{method}"}


# One write per payload-carrying method, in an order where each finds what it needs; each
# asserts that it wrote (a conditional write that silently wrote nothing would prove nothing).
Write = Callable[[Any], Awaitable[None]]
WRITES: dict[str, Write] = {}


def writes(fn: Write) -> Write:
    WRITES[fn.__name__] = fn
    return fn


@writes
async def create_run(s: Any) -> None:
    await s.create_run(make_run("r1", input=secret("create_run")))


@writes
async def create_runs(s: Any) -> None:
    created = await s.create_runs([make_run("r2", status="pending", input=secret("create_runs"))])
    assert created == [None]
    await s.create_runs([make_run("r3", status="pending", input=secret("create_runs"))])


@writes
async def create_run_gated(s: Any) -> None:
    gate = StartGate(dedup_key="at-rest", quota_tag="concurrency:k", quota_limit=1)
    run = make_run("r4", status="pending", input=secret("create_run_gated"))
    assert (await s.create_run_gated(run, gate)).verdict == "created"


@writes
async def update_run(s: Any) -> None:
    await s.update_run("r1", {"output": secret("update_run")})


@writes
async def update_run_if_status(s: Any) -> None:
    assert await s.update_run_if_status(
        "r2", {"input": secret("update_run_if_status")}, ["pending"]
    )


@writes
async def save_checkpoint(s: Any) -> None:
    cp = make_cp("r1", 0, input=secret("save_checkpoint"), output=secret("save_checkpoint"))
    await s.save_checkpoint(cp)
    for seq in (1, 2):  # the pending rows the conditional writes below settle
        await s.save_checkpoint(make_cp("r1", seq, status="pending", output=None))


@writes
async def save_checkpoint_if_pending(s: Any) -> None:
    cp = make_cp("r1", 1, output=secret("save_checkpoint_if_pending"))
    assert await s.save_checkpoint_if_pending(cp)


@writes
async def save_checkpoints_if_pending(s: Any) -> None:
    cp = make_cp("r1", 2, output=secret("save_checkpoints_if_pending"))
    assert await s.save_checkpoints_if_pending([cp]) == [True]


@writes
async def save_checkpoints(s: Any) -> None:
    await s.save_checkpoints([make_cp("r1", 30, output=secret("save_checkpoints"))])


def _child_wait(child: str, seq: int) -> ChildWait:
    placeholder = make_cp(
        "r1",
        seq,
        name=f"signal:child:{child}",
        kind="signal",
        status="running",
        output=None,
        input=secret("register_child_waits"),
    )
    waiter = SignalWaiter(token=f"child:{child}", run_id="r1", seq=seq)
    return ChildWait(waiter=waiter, placeholder=placeholder)


@writes
async def register_child_waits(s: Any) -> None:
    # c1 is delivered below (its row is replaced); c2's placeholder stays.
    await s.register_child_waits([_child_wait("c1", 3), _child_wait("c2", 5)])


@writes
async def deliver_signals(s: Any) -> None:
    (row,) = await s.deliver_signals([("child:c1", secret("deliver_signals"))], at(1))
    assert row.output == secret("deliver_signals")


@writes
async def fold_checkpoints(s: Any) -> None:
    cp = make_cp("r1", 4, name="fan:g", output=secret("fold_checkpoints"))
    await s.fold_checkpoints("r1", 4, 4, cp)


@writes
async def buffer_signal(s: Any) -> None:
    await s.buffer_signal("tok", secret("buffer_signal"))


@writes
async def buffer_signal_bounded(s: Any) -> None:
    payload = secret("buffer_signal_bounded")
    refused = await s.buffer_signal_bounded(
        "tok2", payload, ttl_ms=60_000, per_token=10, per_namespace=100
    )
    assert refused is None


@writes
async def buffer_event(s: Any) -> None:
    event = BufferedEvent(id="e1", name="paid", payload=secret("buffer_event"), published_at=1)
    await s.buffer_event(event)


@writes
async def buffer_event_bounded(s: Any) -> None:
    event = BufferedEvent(
        id="e-bounded",
        name="shipped",
        payload=secret("buffer_event_bounded"),
        published_at=int(time.time() * 1000),
    )
    refused = await s.buffer_event_bounded(event, ttl_ms=60_000, per_name=10, per_namespace=100)
    assert refused is None


@writes
async def take_buffered_signal_into(s: Any) -> None:
    # A wait takes a signal buffered before it into its row (seq 6): the payload moves, and
    # the checkpoint it was given (output None) is encoded on the way in like any other.
    await s.buffer_signal("into", secret("take_buffered_signal_into"))
    row = make_cp("r1", 6, name="signal:into", kind="signal", output=None)
    hit = await s.take_buffered_signal_into("into", row)
    assert hit is not None and hit.payload == secret("take_buffered_signal_into")


@writes
async def take_buffered_event_into(s: Any) -> None:
    # An event wait takes an event buffered before it into its row (seq 8), as above.
    event = BufferedEvent(
        id="e2", name="into", payload=secret("take_buffered_event_into"), published_at=2
    )
    await s.buffer_event(event)
    await s.put_signal_waiter(SignalWaiter(token="event:into", run_id="r1", seq=8))
    row = make_cp("r1", 8, name="signal:event:into", kind="signal", output=None)
    assert await s.take_buffered_event_into("e2", "event:into", row) is True


@writes
async def put_schedule(s: Any) -> None:
    # A persisted schedule's input: every run it starts is given it.
    record = ScheduleRecord(
        id="nightly",
        workflow="report",
        created_at=1,
        updated_at=1,
        spec=ScheduleSpec(input=secret("put_schedule"), every_ms=60_000),
        state=ScheduleState(note="readable"),
    )
    assert await s.put_schedule(record, if_absent=True) is True


# Methods whose arguments carry no payload but which write one they take from the buffer:
# outside the wrapper's encoding set, their rows are checked all the same.
MOVES: dict[str, Write] = {}


async def deliver_buffered_signal(s: Any) -> None:
    await s.buffer_signal("moved", secret("deliver_buffered_signal"))
    await s.put_signal_waiter(SignalWaiter(token="moved", run_id="r1", seq=7))
    row = await s.deliver_buffered_signal("moved", at(2))
    assert row is not None and row.output == secret("deliver_buffered_signal")


async def deliver_buffered_event(s: Any) -> None:
    event = BufferedEvent(
        id="e3", name="moved", payload=secret("deliver_buffered_event"), published_at=3
    )
    await s.buffer_event(event)
    await s.put_signal_waiter(SignalWaiter(token="event:moved", run_id="r1", seq=9))
    row = await s.deliver_buffered_event("e3", "event:moved", at(3))
    assert row is not None and row.output == secret("deliver_buffered_event")


MOVES["deliver_buffered_signal"] = deliver_buffered_signal
MOVES["deliver_buffered_event"] = deliver_buffered_event


def test_every_payload_writing_method_is_exercised() -> None:
    encoding = {
        name
        for name, fn in contract_methods(StateStore).items()
        if plan_method(StateStore, name, fn)[0]
    }
    assert set(WRITES) == encoding, (
        "a StateStore method that writes a payload must be written in WRITES, so its rows "
        "are checked for cleartext"
    )


async def _sqlite_dump(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return "\n".join(repr(row) for t in tables for row in conn.execute(f'SELECT * FROM "{t}"'))
    finally:
        conn.close()


async def _pg_dump(schema: str) -> str:
    conn = await connect()
    try:
        tables = [
            r["table_name"]
            for r in await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1",
                schema,
            )
        ]
        rows = [
            r[0]
            for t in tables
            for r in await conn.fetch(f'SELECT row_to_json(t)::text FROM "{schema}"."{t}" t')
        ]
        return "\n".join(rows)
    finally:
        await conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
async def sql_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Any, Callable[[], Awaitable[str]]]]:
    from durably._store.sql import SqlStateStore

    if request.param == "sqlite":
        path = tmp_path / "at_rest.db"
        sql = SqlStateStore.from_url(f"sqlite:///{path}")
        await sql.ensure_schema()
        try:
            yield sql, lambda: _sqlite_dump(path)
        finally:
            await sql.close()
        return
    async with fresh_schema(create=False) as schema:
        sql = SqlStateStore.from_url(schema_url(schema))
        await sql.ensure_schema()
        try:
            yield sql, lambda: _pg_dump(schema)
        finally:
            await sql.close()


async def test_every_payload_is_ciphertext_at_rest(
    sql_store: tuple[Any, Callable[[], Awaitable[str]]],
) -> None:
    sql, dump = sql_store
    store = CodecStateStore(sql, AesGcmCodec(KEY))
    for write in [*WRITES.values(), *MOVES.values()]:
        await write(store)

    raw = await dump()
    leaked = [name for name in [*WRITES, *MOVES] if f"SECRET-{name}" in raw]
    assert leaked == [], f"cleartext at rest from {leaked}"
    # runs: r1 input+output, r2 input, r3 input, r4 input; checkpoints: 0 input+output, 1,
    # 2, 3 (the delivery), 4 (the fold), 5 input (c2's placeholder), 6 and 7 (the buffered
    # signals taken into rows), 8 and 9 (the buffered events taken into rows), 30 (the bulk
    # upsert); two signals still buffered; two events (one buffered plainly, one within the
    # bounds); one schedule's input.
    assert raw.count(ENVELOPE) == 5 + 12 + 2 + 2 + 1
    assert "signal:child:c1" in raw and "fan:g" in raw and "paid" in raw  # metadata readable
    assert "nightly" in raw and "readable" in raw  # a schedule's id and state stay readable

    # Read back through the wrapper: every payload comes back as written.
    run1, run2 = await store.get_run("r1"), await store.get_run("r2")
    assert run1 is not None and run2 is not None
    assert run1.input == secret("create_run") and run1.output == secret("update_run")
    assert run2.input == secret("update_run_if_status")
    cps = {cp.seq: cp for cp in await store.list_checkpoints("r1")}
    assert cps[0].input == secret("save_checkpoint") == cps[0].output
    assert cps[1].output == secret("save_checkpoint_if_pending")
    assert cps[2].output == secret("save_checkpoints_if_pending")
    assert cps[3].output == secret("deliver_signals")
    assert cps[5].input == secret("register_child_waits") and cps[5].status == "running"
    assert cps[4].output == secret("fold_checkpoints") and cps[4].name == "fan:g"
    assert cps[6].output == secret("take_buffered_signal_into")
    assert cps[7].output == secret("deliver_buffered_signal") and cps[7].name == "signal:moved"
    assert cps[8].output == secret("take_buffered_event_into")
    assert cps[9].output == secret("deliver_buffered_event")
    assert cps[9].name == "signal:event:moved"
    signal = await take_buffered(store, "tok")
    assert signal is not None and signal.payload == secret("buffer_signal")
    bounded = await take_buffered(store, "tok2")
    assert bounded is not None and bounded.payload == secret("buffer_signal_bounded")
    (event,) = await store.list_buffered_events("paid", 10)
    assert event.payload == secret("buffer_event")
    (shipped,) = await store.list_buffered_events("shipped", 10)
    assert shipped.payload == secret("buffer_event_bounded")
    listed = {r.id: r.input for r in await store.list_runs(RunQuery())}
    assert listed == {
        "r1": secret("create_run"),
        "r2": secret("update_run_if_status"),
        "r3": secret("create_runs"),
        "r4": secret("create_run_gated"),
    }

    # The plain store reads envelopes, never the payload.
    plain = await sql.get_run("r1")
    assert plain is not None and plain.created_at == T0
    assert isinstance(plain.input, str) and plain.input.startswith(ENVELOPE)
