"""`Engine(codec=AesGcmCodec(key))` end to end: a workflow with
steps, a fan of steps, a signal (delivered to a waiter and buffered ahead of one), an event
and a child runs to the right result on memory and SQLite, hot and replayed; the rows at rest
hold AES-GCM envelopes and no cleartext (the raw SQLite tables, or the inner memory store)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import durably
from durably import AesGcmCodec, CodecStateStore, WorkflowCtx
from tests.engine_support import RESULT_TIMEOUT, EngineFactory, wait_waiting_on

KEY = AesGcmCodec.generate_key()
TABLES = (
    "durable_workflow_runs",
    "durable_step_checkpoints",
    "durable_buffered_signals",
    "durable_buffered_events",
    "durable_signal_waiters",
)


def _raw_sqlite(url: str) -> str:
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        return "\n".join(repr(r) for t in TABLES for r in conn.execute(f"SELECT * FROM {t}"))
    finally:
        conn.close()


async def _raw_memory(engine: durably.Engine, run_ids: list[str]) -> str:
    assert isinstance(engine.store, CodecStateStore)
    inner = engine.store.inner
    parts: list[Any] = []
    for run_id in run_ids:
        parts.append(await inner.get_run(run_id))
        parts.extend(await inner.list_checkpoints(run_id))
    return "\n".join(repr(p) for p in parts)


async def test_workflow_runs_through_the_codec(engine_factory: EngineFactory, uid: str) -> None:
    @durably.step(f"{uid}.mask")
    def mask(card: str) -> str:
        return f"SECRET-MASKED-{card[-4:]}"

    @durably.step(f"{uid}.double")
    def double(x: int) -> dict[str, int]:
        return {"SECRETdoubled": x * 2}

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, note: str) -> str:
        return f"SECRET-CHILD-{note}"

    @durably.workflow(f"{uid}.main")
    async def main(ctx: WorkflowCtx, order: dict[str, Any]) -> dict[str, Any]:
        masked = await ctx.step(mask, order["card"])
        doubled = await ctx.all(double, [1, 2, 3])
        approval = await ctx.wait_for_signal(f"{uid}-approve")
        early = await ctx.wait_for_signal(f"{uid}-early")  # buffered before the wait
        kid = await ctx.child(child, order["note"])
        paid = await ctx.wait_for_event(f"{uid}.paid")
        return {
            "masked": masked,
            "doubled": doubled,
            "approval": approval,
            "early": early,
            "child": kid,
            "paid": paid,
        }

    order = {"card": "SECRET-4111-1111-1111-4242", "note": "n1"}
    codec = AesGcmCodec(KEY)
    async with engine_factory(codec=codec) as engine:
        assert isinstance(engine.store, CodecStateStore)
        await engine.signal(f"{uid}-early", {"SECRET": "early-bird"})
        handle = await engine.start(main, order, run_id=f"{uid}-run")
        await wait_waiting_on(engine, handle.run_id, f"{uid}-approve")
        await engine.signal(f"{uid}-approve", {"by": "SECRET-alice"})
        await engine.publish_event(f"{uid}.paid", {"amount": "SECRET-42"})
        result = await handle.result(timeout=RESULT_TIMEOUT)
        run = await engine.get_run(handle.run_id)
        checkpoints = await engine.list_checkpoints(handle.run_id)
        detail = await engine.get_run_detail(handle.run_id)
        child_ids = [cp.name.removeprefix("signal:child:") for cp in checkpoints]
        child_ids = [c for c in child_ids if c.startswith(f"{uid}-run.child")]
        raw = (
            _raw_sqlite(engine_factory.store())
            if engine_factory.store_kind == "sqlite"
            else await _raw_memory(engine, [handle.run_id, *child_ids])
        )

    assert result == {
        "masked": "SECRET-MASKED-4242",
        "doubled": [{"SECRETdoubled": 2}, {"SECRETdoubled": 4}, {"SECRETdoubled": 6}],
        "approval": {"by": "SECRET-alice"},
        "early": {"SECRET": "early-bird"},
        "child": "SECRET-CHILD-n1",
        "paid": {"amount": "SECRET-42"},
    }
    # reads through the engine are decoded
    assert run is not None and run.input == order and run.output == result
    assert child_ids, [cp.name for cp in checkpoints]
    assert detail is not None and "aesgcm:" not in json.dumps(detail.to_json())
    by_name = {cp.name: cp for cp in checkpoints}
    assert by_name[f"{uid}.mask"].output == "SECRET-MASKED-4242"
    assert by_name[f"signal:child:{child_ids[0]}"].output == {
        "ok": True,
        "value": "SECRET-CHILD-n1",
    }
    # ... and nothing readable at rest: only envelopes; metadata stays searchable
    assert "SECRET" not in raw
    assert "aesgcm:v1:" in raw
    assert f"{uid}.mask" in raw and f"{uid}.main" in raw
