"""Engine options: typed keywords and an `EngineOptions` value, how the two combine, and the
check of every option when the engine (or the options value) is built."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import inspect
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import Client, Engine, EngineOptions, SignalBufferFullError, WorkflowCtx
from durably._cli.common import replica_of

# The module that defines `EngineOptions`, wherever the runtime keeps it.
OPTIONS_SOURCE = Path(inspect.getfile(EngineOptions))
FIELDS = [f.name for f in dataclasses.fields(EngineOptions)]

# One wrong value of each option: below its minimum, or of the wrong type.
BAD: list[tuple[str, Any]] = [
    ("lease_ms", 0),
    ("lease_ms", -1),
    ("lease_ms", 1.5),
    ("lease_ms", "30s"),
    ("timer_poll_ms", 0),
    ("reconcile_ms", None),
    ("max_recovery_attempts", -1),
    ("max_recovery_attempts", "3"),
    ("drain_timeout_ms", -1),
    ("instance_wait_ms", -5),
    ("max_concurrent_runs", 0),
    ("claim_batch", 0),
    ("pending_batch", True),
    ("max_resident_runs", -1),
    ("step_threads", 0),
    ("fan_window", 0),
    ("fold_fans_over", 0),
    ("event_scan_limit", 0),
    ("compensation_retries", 0),
    ("track_step_start", 1),
    ("always_replay", "yes"),
    ("signal_buffer_ttl", "30 fortnights"),
    ("signal_buffer_ttl", -5),
    ("signal_buffer_ttl", None),
    ("signal_buffer_per_token", 0),
    ("signal_buffer_per_namespace", 2.5),
    ("retention_sweep_ms", -1),
    ("retention_sweep_ms", "60s"),
    ("retention_batch_size", 0),
    ("retention_batch_size", None),
    ("retention_max_batches", 0),
    ("retention_max_batches", True),
]


def test_every_option_is_a_typed_documented_field_and_an_engine_keyword() -> None:
    tree = ast.parse(OPTIONS_SOURCE.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EngineOptions")
    documented = {
        stmt.target.id
        for stmt, after in zip(cls.body, cls.body[1:], strict=False)
        if isinstance(stmt, ast.AnnAssign)
        and isinstance(stmt.target, ast.Name)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
        and len(after.value.value) > 20
    }
    assert sorted(documented) == sorted(FIELDS)
    params = inspect.signature(Engine).parameters
    keyword_options = [
        name
        for name, p in params.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name in FIELDS
    ]
    assert sorted(keyword_options) == sorted(FIELDS)
    assert all(params[name].annotation != "Any" for name in params)
    assert params["unsupported"].annotation == "Never"


def test_defaults_are_the_documented_ones() -> None:
    options = Engine("memory").options
    assert options == EngineOptions()
    assert (options.lease_ms, options.timer_poll_ms, options.reconcile_ms) == (
        30_000,
        1_000,
        300_000,
    )
    assert options.max_recovery_attempts is None
    assert options.effective_instance_wait_ms == 10_000 + 2 * 30_000  # drain + two leases
    assert options.signal_buffer_ttl_ms == 86_400_000


def test_keywords_override_the_options_value_field_by_field() -> None:
    base = EngineOptions(lease_ms=5_000, timer_poll_ms=7, max_recovery_attempts=3)
    engine = Engine("memory", options=base, lease_ms=9_000, max_recovery_attempts=None)
    assert engine.options == dataclasses.replace(base, lease_ms=9_000, max_recovery_attempts=None)
    # an explicit None is a value (no limit), not "not given"
    assert engine.options.max_recovery_attempts is None
    assert (engine.options.lease_ms, engine.options.timer_poll_ms) == (9_000, 7)
    assert engine.options.effective_instance_wait_ms == 10_000 + 2 * 9_000
    only = Engine("memory", options=base)
    assert only.options is base


async def test_the_engine_runs_on_the_merged_options(uid: str) -> None:
    """Not only `engine.options`: the lease this engine takes on a run is the keyword's
    `lease_ms`, not the one of `options`."""

    @durably.workflow(f"{uid}.waits")
    async def waits(ctx: WorkflowCtx) -> None:
        await ctx.wait_for_signal(f"{uid}.go")

    now = 1_700_000_000_000  # a still clock: the lease ends exactly `lease_ms` after it
    base = EngineOptions(lease_ms=5_000, timer_poll_ms=7)
    async with Engine(
        "memory", workflows=[waits], options=base, lease_ms=9_000, clock=lambda: now
    ) as engine:
        handle = await engine.start(waits)
        await handle.wait(timeout=10)  # suspended with its body resident: the lease is held
        run = await engine.get_run(handle.run_id)
    assert run is not None and run.status == "suspended"
    assert run.locked_until == now + 9_000


async def test_durations_of_the_options_value_are_read_like_the_keywords(uid: str) -> None:
    for ttl, ms in (("10s", 10_000), (90, 90_000), (timedelta(minutes=5), 300_000)):
        assert EngineOptions(signal_buffer_ttl=ttl).signal_buffer_ttl_ms == ms
        options = EngineOptions(signal_buffer_ttl=ttl)
        async with Engine("memory", workflows=[], options=options) as engine:
            await engine.signal(f"{uid}.ttl", 1)
            [row] = await engine.list_buffered_signals(prefix=f"{uid}.ttl")
        assert row.buffered_at is not None and row.expires_at is not None
        assert row.expires_at - row.buffered_at == timedelta(milliseconds=ms)


@pytest.mark.parametrize(("option", "value"), BAD)
def test_a_bad_option_is_refused_where_it_is_given_naming_it(option: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^Engine\({option}="):
        Engine("memory", **{option: value})
    with pytest.raises(ValueError, match=rf"^EngineOptions\({option}="):
        EngineOptions(**{option: value})


def test_options_must_be_an_engine_options_value() -> None:
    with pytest.raises(ValueError, match=r"Engine\(options=…\) must be an EngineOptions"):
        Engine("memory", options={"lease_ms": 1})  # type: ignore[arg-type]


def test_options_are_frozen() -> None:
    options = EngineOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.lease_ms = 1  # type: ignore[misc]


async def test_client_takes_the_signal_buffer_options_the_same_way(uid: str) -> None:
    shared = EngineOptions(signal_buffer_per_token=3, signal_buffer_ttl="1h", lease_ms=5)
    async with Client("memory", options=shared, signal_buffer_per_token=4) as client:
        for n in range(4):  # the keyword's cap of 4, not the options' 3
            await client.signal(f"{uid}.t", n)
        with pytest.raises(SignalBufferFullError, match="signal_buffer_per_token"):
            await client.signal(f"{uid}.t", 4)
        rows = await client.list_buffered_signals(prefix=f"{uid}.t")
    # the options' TTL: each row expires an hour after it was buffered
    assert [
        r.expires_at - r.buffered_at
        for r in rows
        if r.expires_at is not None and r.buffered_at is not None
    ] == [timedelta(hours=1)] * 4
    with pytest.raises(ValueError, match=r"^Client\(signal_buffer_ttl="):
        Client("memory", signal_buffer_ttl="soon")


async def test_bounds_from_an_options_value_hold_for_engine_and_client(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'opts.db'}"
    one = EngineOptions(signal_buffer_per_token=1)
    async with Engine(url, workflows=[], options=one) as engine:
        await engine.signal("opts:a", 1)
        with pytest.raises(SignalBufferFullError, match="signal_buffer_per_token"):
            await engine.signal("opts:a", 2)
    async with Client(url, options=one) as client:
        with pytest.raises(SignalBufferFullError, match="signal_buffer_per_token"):
            await client.signal("opts:a", 3)
        assert await client.count_buffered_signals(prefix="opts:") == 1


async def test_a_cli_replica_copies_every_option_of_the_app(uid: str) -> None:
    @durably.workflow(f"{uid}.echo")
    async def echo(ctx: WorkflowCtx, x: int) -> int:
        return x

    app = Engine(
        "memory",
        workflows=[echo],
        lease_ms=1_234,
        max_recovery_attempts=2,
        signal_buffer_ttl="2h",
        signal_buffer_per_token=5,
    )
    replica = replica_of(app)
    assert replica.options == app.options
    try:
        async with replica:
            # a signal buffered from the replica obeys the app's own bounds
            await replica.signal(f"{uid}.t", 1)
            [row] = await replica.list_buffered_signals(prefix=f"{uid}.t")
            assert row.buffered_at is not None and row.expires_at is not None
            assert row.expires_at - row.buffered_at == timedelta(hours=2)
            # it starts runs but never executes one (a driving engine runs its own at once)
            handle = await replica.start(echo, 1)
            await asyncio.sleep(0.3)
            run = await replica.get_run(handle.run_id)
            assert run is not None and run.status == "pending"
    finally:
        await app.close()  # never opened: closes the store it owns
