"""The in-process transport holds step results to the same bounds as the brokers: a result over
`max_payload_bytes`, or holding a string no store can encode, fails its attempt (not retried:
the same step would answer the same) and nothing of it is stored. Each test runs on memory and
SQLite, resident and replay (tests/engine_support.py)."""

from __future__ import annotations

import pytest

import durably
from durably import RunFailedError, WorkflowCtx
from durably.transports import InMemoryTransport
from tests.engine_support import EngineFactory

RESULT_TIMEOUT = 20


async def test_a_result_over_max_payload_bytes_fails_its_attempt(
    engine_factory: EngineFactory, uid: str
) -> None:
    calls: list[int] = []

    @durably.step(f"{uid}.big")
    async def big(n: int) -> str:
        calls.append(n)
        return "x" * n

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, n: int) -> str:
        return await ctx.step(big, n, retries=3)

    transport = InMemoryTransport()
    async with engine_factory(transport=transport, steps=[big], max_payload_bytes=4096) as engine:
        assert (
            await engine.execute(wf, 100, run_id=f"{uid}-ok", timeout=RESULT_TIMEOUT) == "x" * 100
        )
        with pytest.raises(RunFailedError, match="max_payload_bytes"):
            await engine.execute(wf, 10_000, run_id=f"{uid}-big", timeout=RESULT_TIMEOUT)
        [row] = await engine.list_checkpoints(f"{uid}-big")
    assert calls == [100, 10_000]  # not retried
    assert row.status == "failed" and row.output is None and row.error is not None
    assert row.error.code == "result_too_large"
    assert row.error.details == {"size": row.error.details["size"], "limit": 4096}
    assert row.error.details["size"] > 10_000


async def test_a_result_holding_a_lone_surrogate_fails_its_attempt(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.step(f"{uid}.odd")
    async def odd(x: int) -> str:
        return "a\ud800b"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> str:
        return await ctx.step(odd, x)

    async with engine_factory(transport=InMemoryTransport(), steps=[odd]) as engine:
        with pytest.raises(RunFailedError, match="lone surrogate"):
            await engine.execute(wf, 1, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
        [row] = await engine.list_checkpoints(f"{uid}-r")
    assert row.status == "failed" and row.error is not None
    assert row.error.code == "invalid_result"
