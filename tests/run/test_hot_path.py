"""No replay on the hot path.

A run that stays on its instance is never replayed: for N sequential in-process steps the
body runs once and the store sees one checkpoint write per step plus the run's start and
finish. Waits (a durable sleep, a signal) do not replay a resident run either. The
`always_replay` test mode is the contrast: it replays the body once per step.
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import InMemoryStateStore, WorkflowCtx
from tests.engine_support import wait_until

N = 40

_WRITES = {
    "create_run",
    "update_run",
    "update_run_if_status",
    "claim_run",
    "save_checkpoint",
    "release_run_lock",
}


def _count_calls(store: Any) -> collections.Counter[str]:
    """Wrap the store's coroutine methods to count calls (the store itself stays real)."""
    counts: collections.Counter[str] = collections.Counter()
    for name in dir(type(store)):
        if name.startswith("_"):
            continue
        method = getattr(store, name)
        if not callable(method) or not hasattr(type(store), name):
            continue

        def wrap(method: Any = method, name: str = name) -> Any:
            async def counted(*args: Any, **kwargs: Any) -> Any:
                counts[name] += 1
                return await method(*args, **kwargs)

            return counted

        import inspect

        if inspect.iscoroutinefunction(method):
            setattr(store, name, wrap())
    return counts


def _workflow(uid: str, with_waits: bool) -> tuple[Any, list[int]]:
    entries: list[int] = []

    @durably.step(f"{uid}.inc")
    async def inc(x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.seq")
    async def seq(ctx: WorkflowCtx, n: int) -> int:
        entries.append(1)  # one entry per execution of the body (a replay re-enters)
        x = 0
        for i in range(n):
            x = await ctx.step(inc, x)
            if with_waits and i == n // 2:
                await ctx.sleep(0.02)
                x += await ctx.wait_for_signal(f"{uid}.go")
        return x

    return seq, entries


@pytest.mark.parametrize("always_replay", [False, True], ids=["hot", "replay"])
async def test_sequential_steps_run_the_body_once_with_one_write_per_step(
    uid: str, always_replay: bool
) -> None:
    store = InMemoryStateStore()
    counts = _count_calls(store)
    seq, entries = _workflow(uid, with_waits=False)
    async with durably.Engine(
        store=store,
        workflows=[seq],
        always_replay=always_replay,
        timer_poll_ms=20 if always_replay else 60_000,
    ) as engine:
        await asyncio.sleep(0.1)  # the boot poll pass is not part of the run's cost
        counts.clear()
        result = await engine.execute(seq, N, run_id=f"{uid}-r", timeout=30)
    assert result == N
    assert counts["save_checkpoint"] == N  # exactly one checkpoint write per step
    if always_replay:
        assert len(entries) == N + 1  # evicted after every step: replayed N times
        return
    assert len(entries) == 1  # never replayed
    writes = {k: v for k, v in counts.items() if k in _WRITES}
    # create, lease, `running` and the final settle (both conditional writes), N checkpoints
    assert writes == {
        "create_run": 1,
        "claim_run": 1,
        "update_run_if_status": 2,
        "save_checkpoint": N,
    }
    assert counts["list_checkpoints"] == 0  # a fresh run has nothing to load


async def test_waits_do_not_replay_a_resident_run(uid: str) -> None:
    seq, entries = _workflow(uid, with_waits=True)
    async with durably.Engine(
        store=InMemoryStateStore(), workflows=[seq], timer_poll_ms=20
    ) as engine:
        handle = await engine.start(seq, 10, run_id=f"{uid}-w")
        run = await handle.wait(timeout=10)  # settles `suspended` on the sleep or the signal
        assert run.status == "suspended"
        # Sent while the body sleeps or waits: buffered or delivered, it is taken in place.
        await engine.signal(f"{uid}.go", 100)
        assert await handle.result(timeout=10) == 110
    assert len(entries) == 1


async def test_sqlite_statements_per_step(uid: str, tmp_path: Path) -> None:
    seq, entries = _workflow(uid, with_waits=False)
    async with durably.Engine(
        store=f"sqlite:///{tmp_path / 'hot.db'}", workflows=[seq], timer_poll_ms=60_000
    ) as engine:
        await asyncio.sleep(0.2)  # let the boot poll pass finish before counting
        before = engine.store.statement_count  # type: ignore[attr-defined]
        assert await engine.execute(seq, N, run_id=f"{uid}-s", timeout=30) == N
        statements = engine.store.statement_count - before  # type: ignore[attr-defined]
    assert len(entries) == 1
    # N checkpoint writes + create, claim, running, settle, and the result read.
    assert statements <= N + 5, statements


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
async def test_resident_cap_evicts_the_longest_parked_run(
    uid: str, tmp_path: Path, store_kind: str
) -> None:
    entries: list[str] = []

    @durably.workflow(f"{uid}.waiter")
    async def waiter(ctx: WorkflowCtx, token: str) -> str:
        entries.append(ctx.run_id)
        got = await ctx.wait_for_signal(token)
        return f"{token}={got}"

    store: Any = (
        InMemoryStateStore() if store_kind == "memory" else (f"sqlite:///{tmp_path / 'cap.db'}")
    )
    async with durably.Engine(
        store=store, workflows=[waiter], max_resident_runs=1, timer_poll_ms=20
    ) as engine:
        handles = []
        for i in range(3):
            handles.append(await engine.start(waiter, f"{uid}.t{i}", run_id=f"{uid}-{i}"))
            await handles[-1].wait(timeout=10)

        async def evicted() -> bool:
            # A resident run keeps its lease; an evicted one gave it back and waits in the
            # store only: the two older parked runs were evicted, the newest stays.
            runs = [await engine.get_run(f"{uid}-{i}") for i in range(3)]
            leased = [run is not None and run.locked_by is not None for run in runs]
            return leased == [False, False, True]

        await wait_until(evicted)
        for i in range(3):
            await engine.signal(f"{uid}.t{i}", i)
        results = [await h.result(timeout=10) for h in handles]
    assert results == [f"{uid}.t{i}={i}" for i in range(3)]
    # the evicted runs replayed once when their signal came; the resident one did not
    assert sorted(entries) == sorted([f"{uid}-0", f"{uid}-0", f"{uid}-1", f"{uid}-1", f"{uid}-2"])
