"""Signal safety: external signals never reach the engine's own waits, and what they may
leave behind is bounded (a TTL, per-token and per-namespace caps, `buffer=False`), listed
and purged by operators."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import (
    Engine,
    FatalError,
    InMemoryStateStore,
    OnErrorRoute,
    ReservedTokenError,
    SignalBufferFullError,
    SignalTimeoutError,
    WorkflowCtx,
)
from durably._core.tokens import reserved_prefixes, reserved_token_kind
from tests.engine_support import (
    FAST_TUNING,
    RESULT_TIMEOUT,
    EngineFactory,
    wait_until,
    wait_waiting_on,
)
from tests.pg_support import fresh_schema, schema_url

# ------------------------------------------------------------------ helpers


async def _waiter_token(engine: Engine, run_id: str, prefix: str) -> str:
    """The token of the run's live waiter starting with `prefix` (waits for it)."""
    found: list[str] = []

    async def check() -> bool:
        found[:] = [
            w.token for w in await engine.store.list_signal_waiters(prefix) if w.run_id == run_id
        ]
        return bool(found)

    await wait_until(check)
    return found[0]


async def _still_waiting(engine: Engine, run_id: str) -> None:
    """Give a wrongly delivered signal time to act, then check the run did not move on."""
    await asyncio.sleep(0.2)
    run = await engine.get_run(run_id)
    assert run is not None and run.status == "suspended", run


async def _refused(engine: Engine, token: str, kind: str) -> None:
    with pytest.raises(ReservedTokenError) as caught:
        await engine.signal(token, {"ok": True, "value": "FORGED"})
    assert caught.value.token == token
    assert caught.value.kind == kind
    assert kind in str(caught.value) and "external signals cannot address it" in str(caught.value)
    # Refused before anything was stored: no planted value for a later wait either.
    assert await engine.count_buffered_signals() == 0


# ------------------------------------------------------------------ reserved tokens


async def test_a_forged_child_completion_is_refused_and_the_parent_keeps_waiting(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> str:
        await ctx.wait_for_signal(f"{uid}.release")
        return "real"

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx, x: int) -> str:
        return await ctx.child(child, x, id=f"{uid}-kid")

    async with engine_factory() as engine:
        handle = await engine.start(parent, 1, run_id=f"{uid}-p")
        await wait_waiting_on(engine, handle.run_id, f"child:{uid}-kid")
        await wait_waiting_on(engine, f"{uid}-kid", f"{uid}.release")
        await _refused(engine, f"child:{uid}-kid", "child-workflow completion")
        await _still_waiting(engine, handle.run_id)
        kid = await engine.get_run(f"{uid}-kid")
        assert kid is not None and kid.status == "suspended"  # the child really still runs
        # The real completion still arrives the engine's way.
        await engine.signal(f"{uid}.release", None)
        assert await handle.result(timeout=RESULT_TIMEOUT) == "real"


async def test_a_forged_breakpoint_release_is_refused_continue_run_still_works(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        await ctx.breakpoint("inspect")
        return "continued"

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        token = await _waiter_token(engine, handle.run_id, "bp:")
        await wait_waiting_on(engine, handle.run_id, token)
        await _refused(engine, token, "breakpoint")
        await _still_waiting(engine, handle.run_id)
        released = await engine.continue_run(handle.run_id)
        assert released is not None
        assert await handle.result(timeout=RESULT_TIMEOUT) == "continued"


async def test_a_forged_update_is_refused_engine_update_still_validates_and_delivers(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        return await ctx.on_update("limit")

    async with engine_factory() as engine:
        engine.register_update_validator(wf, "limit", lambda arg: None if arg < 100 else "too high")
        handle = await engine.start(wf)
        token = f"update:{handle.run_id}:limit"
        await wait_waiting_on(engine, handle.run_id, token)
        # The validator would refuse 1000: a raw signal must not skip it.
        await _refused(engine, token, "workflow update")
        await _still_waiting(engine, handle.run_id)
        rejected = await engine.update(handle.run_id, "limit", 1000)
        assert not rejected.accepted and rejected.reason == "too high"
        accepted = await engine.update(handle.run_id, "limit", 42)
        assert accepted.accepted
        assert await handle.result(timeout=RESULT_TIMEOUT) == 42


async def test_a_forged_event_delivery_is_refused_publish_event_still_works(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        return await ctx.wait_for_event(f"{uid}.paid", match={"order": 7})

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        token = await _waiter_token(engine, handle.run_id, "event:")
        await wait_waiting_on(engine, handle.run_id, token)
        await _refused(engine, token, "named-event wait")
        await _still_waiting(engine, handle.run_id)
        assert await engine.publish_event(f"{uid}.paid", {"order": 7, "by": "bank"}) == 1
        assert await handle.result(timeout=RESULT_TIMEOUT) == {"order": 7, "by": "bank"}


async def test_a_forged_on_error_handler_completion_is_refused(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.workflow(f"{uid}.handler")
    async def handler(ctx: WorkflowCtx, failure: Any) -> str:
        await ctx.wait_for_signal(f"{uid}.handled")
        return "handled"

    @durably.workflow(f"{uid}.wf", on_error=[OnErrorRoute(workflow=f"{uid}.handler")])
    async def wf(ctx: WorkflowCtx) -> None:
        raise FatalError("declined", code="declined")

    async with engine_factory() as engine:
        handle = await engine.start(wf, run_id=f"{uid}-r")
        token = f"child:{uid}-r.onError.1"
        await wait_waiting_on(engine, f"{uid}-r.onError.1", f"{uid}.handled")
        await _waiter_token(engine, handle.run_id, token)
        await _refused(engine, token, "onError handler completion")
        await asyncio.sleep(0.2)
        run = await engine.get_run(handle.run_id)
        assert run is not None and run.status not in ("completed", "failed"), run
        await engine.signal(f"{uid}.handled", None)
        assert await handle.result(timeout=RESULT_TIMEOUT) == "handled"


@pytest.mark.parametrize("prefix", reserved_prefixes())
async def test_every_reserved_namespace_is_refused_with_its_kind(
    engine_factory: EngineFactory, prefix: str
) -> None:
    token = f"{prefix}some-run:3"
    kind = reserved_token_kind(token)
    assert kind is not None
    async with engine_factory() as engine:
        await _refused(engine, token, kind)
        # Refused before anything: neither delivered nor buffered, with buffer=False too.
        with pytest.raises(ReservedTokenError):
            await engine.signal(token, None, buffer=False)
        assert await engine.count_buffered_signals() == 0


async def test_plain_and_webhook_tokens_stay_open_and_bad_tokens_are_refused(
    engine_factory: EngineFactory, uid: str
) -> None:
    async with engine_factory() as engine:
        for token in (f"{uid}.go", f"approve:{uid}", f"wh:{uid}-run:4", f"Child:{uid}"):
            assert await engine.signal(token, 1) is None  # buffered: not reserved
        with pytest.raises(ValueError, match="must not be empty"):
            await engine.signal("", 1)
        with pytest.raises(TypeError, match="must be a str"):
            await engine.signal(42, 1)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="buffer must be True or False"):
            await engine.signal(f"{uid}.go", 1, buffer="no")  # type: ignore[arg-type]
        assert await engine.count_buffered_signals() == 4


# ------------------------------------------------------------------ buffer=False


async def test_buffer_false_to_a_token_nobody_waits_on_plants_nothing(
    engine_factory: EngineFactory, uid: str
) -> None:
    token = f"{uid}.later"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        try:
            return await ctx.wait_for_signal(token, timeout="300ms")
        except SignalTimeoutError:
            return "nothing was planted"

    async with engine_factory() as engine:
        assert await engine.signal(token, "PLANTED", buffer=False) is None
        assert await engine.count_buffered_signals() == 0
        handle = await engine.start(wf)
        assert await handle.result(timeout=RESULT_TIMEOUT) == "nothing was planted"


async def test_buffer_false_delivers_to_a_run_waiting_now(
    engine_factory: EngineFactory, uid: str
) -> None:
    token = f"{uid}.now"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        return await ctx.wait_for_signal(token)

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        await wait_waiting_on(engine, handle.run_id, token)
        result = await engine.signal(token, {"by": "webhook"}, buffer=False)
        assert result is not None and result.run_id == handle.run_id
        assert await handle.result(timeout=RESULT_TIMEOUT) == {"by": "webhook"}


# ------------------------------------------------------------------ bounded buffering


async def test_a_signal_sent_just_before_the_wait_is_still_received(
    engine_factory: EngineFactory, uid: str
) -> None:
    """README's first example: start, then signal at once — before the run reaches its wait."""

    @durably.step(f"{uid}.charge")
    async def charge(order: str) -> str:
        await asyncio.sleep(0.05)
        return f"charge-{order}"

    @durably.workflow(f"{uid}.checkout")
    async def checkout(ctx: WorkflowCtx, order: str) -> dict[str, str]:
        charge_id = await ctx.step(charge, order)
        approval = await ctx.wait_for_signal(f"approve:{uid}-{order}", timeout="10s")
        return {"charge": charge_id, "approved_by": approval}

    async with engine_factory() as engine:
        handle = await engine.start(checkout, "o-1")
        assert await engine.signal(f"approve:{uid}-o-1", "alice") is None  # buffered
        listed = await engine.list_buffered_signals(prefix=f"approve:{uid}")
        assert [row.token for row in listed] == [f"approve:{uid}-o-1"]
        assert await handle.result(timeout=RESULT_TIMEOUT) == {
            "charge": "charge-o-1",
            "approved_by": "alice",
        }
        assert await engine.count_buffered_signals(prefix=f"approve:{uid}") == 0


async def test_caps_refuse_with_a_named_error_and_store_nothing(
    engine_factory: EngineFactory, uid: str
) -> None:
    ns = f"{uid}ns"
    got: list[Any] = []

    @durably.workflow(f"{uid}.drain")
    async def drain(ctx: WorkflowCtx, token: str) -> list[Any]:
        out = []
        for _ in range(3):
            try:
                out.append(await ctx.wait_for_signal(token, timeout="300ms"))
            except SignalTimeoutError:
                break
        return out

    async with engine_factory(signal_buffer_per_token=2, signal_buffer_per_namespace=3) as engine:
        await engine.signal(f"{ns}:a", "a1")
        await engine.signal(f"{ns}:a", "a2")
        with pytest.raises(SignalBufferFullError) as per_token:
            await engine.signal(f"{ns}:a", "a3-REFUSED")
        err = per_token.value
        assert (err.token, err.scope, err.cap, err.option) == (
            f"{ns}:a",
            "token",
            2,
            "signal_buffer_per_token",
        )
        assert f"{ns}:a" in str(err) and "signal_buffer_per_token" in str(err)
        assert "nothing was stored" in str(err)

        await engine.signal(f"{ns}:b", "b1")  # the namespace now holds its cap of 3
        with pytest.raises(SignalBufferFullError) as per_namespace:
            await engine.signal(f"{ns}:c", "c1-REFUSED")
        err = per_namespace.value
        assert (err.scope, err.namespace, err.cap, err.option) == (
            "namespace",
            ns,
            3,
            "signal_buffer_per_namespace",
        )
        assert "signal_buffer_per_namespace" in str(err)
        # A token without ':' is its own namespace: it is not counted in `ns`.
        await engine.signal(f"{ns}-solo", "solo")
        assert await engine.count_buffered_signals(prefix=ns) == 4

        got.append(await engine.execute(drain, f"{ns}:a", timeout=RESULT_TIMEOUT))
        got.append(await engine.execute(drain, f"{ns}:c", timeout=RESULT_TIMEOUT))
        # Taking signals frees room again.
        await engine.signal(f"{ns}:c", "c2")
        assert await engine.count_buffered_signals(prefix=f"{ns}:c") == 1

    assert got == [["a1", "a2"], []]


async def test_updates_sent_early_are_buffered_bounded(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        await ctx.wait_for_signal(f"{uid}.first")
        return await ctx.on_update("late")

    async with engine_factory(signal_buffer_per_token=1) as engine:
        handle = await engine.start(wf)
        await wait_waiting_on(engine, handle.run_id, f"{uid}.first")
        early = await engine.update(handle.run_id, "late", "early-value")
        assert early.accepted and not early.delivered
        [row] = await engine.list_buffered_signals(prefix="update:")
        assert row.expires_at is not None  # bounded like any signal from outside
        with pytest.raises(SignalBufferFullError):
            await engine.update(handle.run_id, "late", "second")
        await engine.signal(f"{uid}.first", None)
        assert await handle.result(timeout=RESULT_TIMEOUT) == "early-value"


async def test_child_completions_are_engine_records_never_expiring_nor_purged(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        return x * 2

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> int:
        kid = await ctx.start_child(child, 21, id=f"{uid}-kid")
        await ctx.wait_for_signal(f"{uid}.join")
        return int(await ctx.child(child, 21, id=kid))

    async with engine_factory() as engine:
        handle = await engine.start(parent)
        await wait_waiting_on(engine, handle.run_id, f"{uid}.join")

        async def completion_buffered() -> bool:
            return await engine.count_buffered_signals(prefix=f"child:{uid}-kid") == 1

        await wait_until(completion_buffered)
        [row] = await engine.list_buffered_signals(prefix=f"child:{uid}-kid")
        assert row.expires_at is None
        assert await engine.purge_buffered_signals(all=True) == 0
        assert await engine.purge_buffered_signals(prefix="child:") == 0
        assert await engine.purge_buffered_signals(token=f"child:{uid}-kid") == 0
        await engine.signal(f"{uid}.join", None)
        assert await handle.result(timeout=RESULT_TIMEOUT) == 42


# ------------------------------------------------------------------ TTL (store clock)


class _Clock:
    """A store clock `offset` ahead of real time (what buffered signals' expiry reads), and
    an engine clock `engine_offset` ahead of it (what paces the engine's sweep of expired
    signals); the engine's timers keep real time until a test moves `engine_offset`."""

    def __init__(self) -> None:
        self.offset = timedelta()
        self.engine_offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def engine_ms(self) -> int:
        return int((time.time() + self.engine_offset.total_seconds()) * 1000)


def _buffered(engine: Engine, prefix: str, n: int) -> Callable[[], Awaitable[bool]]:
    """A `wait_until` predicate: exactly `n` buffered signals under `prefix`."""

    async def check() -> bool:
        return await engine.count_buffered_signals(prefix=prefix) == n

    return check


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def clocked(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[_Clock, Callable[..., Engine]]]:
    clock = _Clock()
    stores: list[Any] = []

    def engine(**options: Any) -> Engine:
        return Engine(stores[0], **{**FAST_TUNING, "clock": clock.engine_ms, **options})

    if request.param == "memory":
        stores.append(InMemoryStateStore(clock=clock))
        yield clock, engine
        return
    from durably._store.sql import SqlStateStore

    if request.param == "sqlite":
        stores.append(SqlStateStore.from_url(f"sqlite:///{tmp_path}/ttl.db", clock=clock))
        try:
            yield clock, engine
        finally:
            await stores[0].close()
        return
    async with fresh_schema(create=False) as schema:
        stores.append(SqlStateStore.from_url(schema_url(schema), clock=clock))
        try:
            yield clock, engine
        finally:
            await stores[0].close()


async def test_an_expired_signal_is_never_delivered_and_gets_purged(
    clocked: tuple[_Clock, Callable[..., Engine]], uid: str
) -> None:
    clock, make = clocked
    token = f"{uid}.stale"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        try:
            return await ctx.wait_for_signal(token, timeout="300ms")
        except SignalTimeoutError:
            return "expired"

    # A signal that has already expired when the driving engine opens: the poll loop's first
    # pass sweeps once at boot and takes it; the next sweep is a minute (of engine time) later.
    clock.offset = -timedelta(hours=2)
    async with make(drive=False, signal_buffer_ttl="1h") as early:
        await early.signal(f"{uid}.probe", 1)
    clock.offset = timedelta()
    async with make(signal_buffer_ttl="1h", signal_buffer_per_token=1) as engine:
        await wait_until(_buffered(engine, f"{uid}.probe", 0))  # booted: time may move now
        await engine.signal(token, "old")
        [row] = await engine.list_buffered_signals(prefix=token)
        assert row.buffered_at is not None and row.expires_at is not None
        assert row.expires_at - row.buffered_at == timedelta(hours=1)

        clock.offset = timedelta(hours=1, seconds=1)
        # An expired row neither counts against the cap nor reaches a wait.
        await engine.signal(f"{uid}.other", "x")
        assert await engine.execute(wf, timeout=RESULT_TIMEOUT) == "expired"
        await engine.signal(token, "fresh")  # the cap of 1 ignores the expired row
        assert await engine.count_buffered_signals(prefix=token) == 2

        # The poll loop's sweep deletes the expired row once it is due (a minute later).
        clock.engine_offset = timedelta(minutes=1, seconds=1)
        await wait_until(_buffered(engine, token, 1))
        assert await engine.execute(wf, timeout=RESULT_TIMEOUT) == "fresh"


async def test_the_sweep_runs_at_most_once_a_minute(
    clocked: tuple[_Clock, Callable[..., Engine]], uid: str
) -> None:
    clock, make = clocked
    async with make(drive=False, signal_buffer_ttl=1) as early:  # it never sweeps
        await early.signal(f"{uid}.a", 1)
    clock.offset = timedelta(seconds=2)
    async with make(signal_buffer_ttl=1) as engine:
        await wait_until(_buffered(engine, f"{uid}.a", 0))  # the sweep at boot
        await engine.signal(f"{uid}.b", 1)
        clock.offset = timedelta(seconds=4)
        await asyncio.sleep(0.3)  # a dozen poll passes: none of them sweeps again so soon
        assert await engine.count_buffered_signals(prefix=f"{uid}.b") == 1
        assert await engine.purge_buffered_signals(expired_only=True) == 1  # an operator may
        await engine.signal(f"{uid}.c", 1)
        clock.offset = timedelta(seconds=6)
        clock.engine_offset = timedelta(minutes=1, seconds=1)  # a minute on: due again
        await wait_until(_buffered(engine, f"{uid}.c", 0))


# ------------------------------------------------------------------ options and operator calls


def test_signal_buffer_options_parse_durations_and_refuse_bad_values() -> None:
    def ttl_ms(engine: Engine) -> int:
        return engine.options.signal_buffer_ttl_ms

    assert ttl_ms(Engine("memory", signal_buffer_ttl="24h")) == 86_400_000
    assert ttl_ms(Engine("memory", signal_buffer_ttl=90)) == 90_000
    assert ttl_ms(Engine("memory", signal_buffer_ttl=timedelta(minutes=5))) == 300_000
    default = Engine("memory").options
    assert (
        default.signal_buffer_ttl_ms,
        default.signal_buffer_per_token,
        default.signal_buffer_per_namespace,
    ) == (86_400_000, 100, 10_000)
    for ttl in ("30 fortnights", "soon", 0, -5, None, True):
        with pytest.raises(ValueError, match="signal_buffer_ttl"):
            Engine("memory", signal_buffer_ttl=ttl)
    for option in ("signal_buffer_per_token", "signal_buffer_per_namespace"):
        for bad in (0, -1, 2.5, "10", True):
            with pytest.raises(ValueError, match=option):
                Engine("memory", **{option: bad})


async def test_listing_never_returns_payloads_and_pages(
    engine_factory: EngineFactory, uid: str
) -> None:
    async with engine_factory() as engine:
        payloads = [{"secret": "hunter2", "n": i} for i in range(5)]
        for i, payload in enumerate(payloads):
            await engine.signal(f"{uid}:{i}", payload)
        await engine.signal(f"{uid}-other", "é")
        rows = await engine.list_buffered_signals(prefix=f"{uid}:")
        assert [r.token for r in rows] == [f"{uid}:{i}" for i in range(5)]
        sizes = [len(json.dumps(p, separators=(",", ":")).encode()) for p in payloads]
        assert [r.size_bytes for r in rows] == sizes
        assert all("hunter2" not in json.dumps(r.to_json()) for r in rows)
        assert set(rows[0].to_json()) == {"token", "sizeBytes", "bufferedAt", "expiresAt"}
        assert durably.BufferedSignalInfo.from_json(rows[0].to_json()) == rows[0]
        page = await engine.list_buffered_signals(prefix=f"{uid}:", limit=2, offset=3)
        assert [r.token for r in page] == [f"{uid}:3", f"{uid}:4"]
        [other] = await engine.list_buffered_signals(prefix=f"{uid}-")
        assert other.size_bytes == len('"é"'.encode())
        assert await engine.count_buffered_signals(prefix=f"{uid}:") == 5
        assert await engine.count_buffered_signals() == 6


async def test_purge_by_token_prefix_expired_and_all(
    engine_factory: EngineFactory, uid: str
) -> None:
    async with engine_factory() as engine:
        for token in (f"{uid}:a", f"{uid}:a", f"{uid}:ab", f"{uid}:b", f"{uid}-c"):
            await engine.signal(token, 1)
        assert await engine.purge_buffered_signals(token=f"{uid}:a") == 2  # exact token
        assert await engine.count_buffered_signals(prefix=f"{uid}:a") == 1  # `:ab` kept
        assert await engine.purge_buffered_signals(expired_only=True) == 0  # none expired
        assert await engine.purge_buffered_signals(prefix=f"{uid}:") == 2
        assert await engine.purge_buffered_signals(all=True) == 1
        assert await engine.count_buffered_signals() == 0


async def test_operator_calls_refuse_bad_arguments(engine_factory: EngineFactory) -> None:
    async with engine_factory() as engine:
        for limit in (0, 1001, -1, True, "5", 2.0):
            with pytest.raises(ValueError, match="limit"):
                await engine.list_buffered_signals(limit=limit)  # type: ignore[arg-type]
        for offset in (-1, 2**31, "1"):
            with pytest.raises(ValueError, match="offset"):
                await engine.list_buffered_signals(offset=offset)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="prefix"):
            await engine.list_buffered_signals(prefix="")
        with pytest.raises(ValueError, match="explicit choice"):
            await engine.purge_buffered_signals()
        with pytest.raises(ValueError, match="choose one"):
            await engine.purge_buffered_signals(token="a", prefix="b")
        with pytest.raises(ValueError, match="choose one"):
            await engine.purge_buffered_signals(prefix="a", all=True)
        with pytest.raises(ValueError, match="token"):
            await engine.purge_buffered_signals(token="")
        assert len(await engine.list_buffered_signals(limit=1000)) == 0


class _StoreWithoutBounds:
    """A store written before bounded buffering: the memory store minus its new methods."""

    HIDDEN = frozenset(
        {
            "buffer_signal_bounded",
            "list_buffered_signals",
            "count_buffered_signals",
            "purge_buffered_signals",
        }
    )

    def __init__(self) -> None:
        self._inner = InMemoryStateStore()

    def __getattr__(self, name: str) -> Any:
        if name in self.HIDDEN:
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_a_store_without_bounded_buffering_is_refused_at_construction() -> None:
    # Never buffered unbounded: the engine refuses the store before anything runs.
    with pytest.raises(TypeError, match="lacks buffer_signal_bounded, list_buffered_signals"):
        Engine(_StoreWithoutBounds(), **FAST_TUNING)
