"""What the run page's rows say, read from the API's JSON over real SQLite stores: each
timeline row's `row` names its true kind (an in-process `ctx.step` is not "remote"), a sleep
lasts as long as it slept, and the deadline the engine writes for a wait with a timeout is an
engine row belonging to that wait."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import durably
from durably import Engine, SignalTimeoutError, WorkflowCtx
from durably.dashboard import create_app
from durably.transports import InMemoryTransport

from .conftest import FAST, client_for, wait_status, wait_until


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


async def _timeline(client: Any, run_id: str, **params: Any) -> list[dict[str, Any]]:
    res = await client.get(f"/api/runs/{run_id}", params=params)
    assert res.status_code == 200, res.text
    rows: list[dict[str, Any]] = res.json()["timeline"]
    return rows


def _by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {cp["name"]: cp for cp in rows}


async def test_every_row_says_its_true_kind_and_a_sleep_its_real_duration(
    engine: Engine, uid: str
) -> None:
    @durably.step(f"{uid}.double")
    def double(x: int) -> int:
        return 2 * x

    @durably.workflow(f"{uid}.kid")
    async def kid(ctx: WorkflowCtx, x: int) -> int:
        return x

    @durably.workflow(f"{uid}.tour")
    async def tour(ctx: WorkflowCtx, x: int) -> int:
        a = await ctx.step(double, x)
        b = await ctx.local_step("add", lambda log: a + 1)
        await ctx.side_effect(lambda: 5)
        await ctx.now()
        await ctx.sleep("1s")
        await ctx.set_event("progress", 1)
        await ctx.start_child(kid, 1)
        c: int = await ctx.child(kid, 2)
        await ctx.patched("p1")
        return b + c

    run_id = f"{uid}-tour"
    assert await engine.execute(tour, 1, run_id=run_id) == 5
    async with client_for(create_app(engine)) as client:
        rows = await _timeline(client, run_id)
    views = {cp["name"]: cp["row"] for cp in rows}
    kinds = {name: (v["kind"], v["label"]) for name, v in views.items()}
    assert kinds == {
        f"{uid}.double": ("in_process_step", "in-process step"),
        "add": ("local_step", "local step"),
        "sideEffect": ("side_effect", "side effect"),
        "now": ("recorded_time", "recorded time"),
        "sleep": ("sleep", "sleep"),
        "event:progress": ("set_event", "event set"),
        f"spawn:{run_id}.child.6": ("spawn", "child started"),
        f"signal:child:{run_id}.child.7": ("child", "child run"),
        "patch:p1": ("patch", "patch marker"),
    }
    by_name = _by_name(rows)
    # The stored kind is unchanged: only `row` is new.
    assert by_name[f"{uid}.double"]["kind"] == "remote"
    assert "workerGroup" not in by_name[f"{uid}.double"]

    sleep = by_name["sleep"]
    # The row is written once, when the sleep is scheduled: its stored times are equal.
    assert sleep["startedAt"] == sleep["finishedAt"]
    view = sleep["row"]
    assert view["durationMs"] == _ms(view["dueAt"]) - _ms(sleep["startedAt"])
    assert 990 <= view["durationMs"] <= 1000, view
    assert "state" not in view  # it is over
    # Nothing says when a child's wait began (its row is written at the completion).
    assert "durationMs" not in views[f"signal:child:{run_id}.child.7"]
    assert "durationMs" not in views["event:progress"]
    assert views[f"{uid}.double"]["durationMs"] >= 0
    assert not any(v.get("engine") for v in views.values())


async def test_a_sleep_still_to_come_says_it_is_sleeping(engine: Engine, uid: str) -> None:
    @durably.workflow(f"{uid}.nap")
    async def nap(ctx: WorkflowCtx, x: int) -> int:
        await ctx.sleep("10m")
        return x

    run_id = f"{uid}-nap"
    await engine.start(nap, 1, run_id=run_id)
    await wait_status(engine, run_id, "suspended")
    async with client_for(create_app(engine)) as client:
        (sleep,) = await _timeline(client, run_id)
    assert sleep["status"] == "completed"  # as stored: written when scheduled
    assert sleep["row"]["state"] == "sleeping"
    assert sleep["row"]["durationMs"] == 600_000


async def test_the_deadline_of_a_wait_is_an_engine_row_of_that_wait(
    engine: Engine, uid: str
) -> None:
    @durably.workflow(f"{uid}.approval")
    async def approval(ctx: WorkflowCtx, x: int) -> str:
        got = await ctx.wait_for_signal(f"{uid}-approve", timeout="30s")
        try:
            await ctx.wait_for_signal(f"{uid}-never", timeout="50ms")
        except SignalTimeoutError:
            pass
        await ctx.wait_for_event(f"{uid}.paid", timeout="30s")
        return str(got)

    run_id = f"{uid}-approval"
    await engine.start(approval, 1, run_id=run_id)
    await wait_status(engine, run_id, "suspended")
    app = create_app(engine)
    async with client_for(app) as client:
        (deadline,) = await _timeline(client, run_id)
        assert deadline["name"] == f"timeout:{uid}-approve" and deadline["kind"] == "sleep"
        assert deadline["row"] == {
            "kind": "timeout",
            "label": f"timeout of signal wait {uid}-approve",
            "engine": True,
            "owner": deadline["seq"] + 1,
            "state": "armed",
            "durationMs": 30_000,
            "dueAt": deadline["row"]["dueAt"],
        }

        await engine.signal(f"{uid}-approve", "yes")

        async def waits_for_the_event() -> bool:
            names = [cp["name"] for cp in await _timeline(client, run_id)]
            return f"timeout:event:{uid}.paid" in names

        await wait_until(waits_for_the_event)
        await engine.publish_event(f"{uid}.paid", {"ok": True})
        await wait_status(engine, run_id, "completed")
        rows = await _timeline(client, run_id)

    views = {cp["seq"]: cp["row"] for cp in rows}
    names = {cp["seq"]: cp["name"] for cp in rows}
    assert [views[s]["kind"] for s in sorted(views)] == [
        "timeout",
        "signal_wait",
        "timeout",  # the 50 ms wait: it ended by its timeout, so it has no row of its own
        "timeout",
        "event_wait",
    ]
    first, approved, never, paid_deadline, paid = sorted(views)
    assert views[first]["state"] == "not_reached"  # the signal came first
    assert views[approved]["timeoutMs"] == 30_000
    assert views[approved]["durationMs"] >= 0  # from the deadline's row to the delivery
    assert views[never] == {
        **views[never],
        "label": f"timeout of signal wait {uid}-never",
        "engine": True,
        "owner": never + 1,
        "state": "fired",
    }
    assert never + 1 not in names
    assert views[paid_deadline]["label"] == f"timeout of event wait {uid}.paid"
    assert views[paid_deadline]["owner"] == paid
    assert views[paid]["label"] == "event wait" and views[paid]["timeoutMs"] == 30_000


@durably.step("rows.remote.inc")
def inc(x: int) -> int:
    return x + 1


async def test_steps_sent_over_a_transport_are_remote_and_fan_members_say_so(
    tmp_path: Path, uid: str
) -> None:
    @durably.workflow(f"{uid}.sent")
    async def sent(ctx: WorkflowCtx, n: int) -> list[int]:
        one = await ctx.step(inc, 0)
        many: list[int] = await ctx.all(inc, range(n))
        return [one, *many]

    run_id = f"{uid}-sent"
    transport = InMemoryTransport()
    url = f"sqlite:///{tmp_path / 'remote.db'}"
    async with Engine(url, transport=transport, steps=[inc], **FAST) as engine:
        assert await engine.execute(sent, 3, run_id=run_id) == [1, 1, 2, 3]
        async with client_for(create_app(engine)) as client:
            rows = await _timeline(client, run_id)
            res = await client.get(f"/api/runs/{run_id}?summarizeFansOver=1")
            (fan,) = res.json()["fans"]
            page = (await client.get(f"/api/runs/{run_id}/fans/{fan['group']}")).json()
    single, *members = rows
    assert single["workerGroup"] and single["row"]["kind"] == "remote_step"
    assert single["row"]["label"] == "remote step"
    assert len(members) == 3
    for cp in members:
        assert cp["row"]["kind"] == "remote_step"
        assert cp["row"]["label"] == "remote step · fan member"
        assert cp["row"]["fanMember"] is True
    assert [cp["row"]["label"] for cp in page["items"]] == ["remote step · fan member"] * 3
