"""`GET runs/:id/stream`: server-sent events of one run while it moves; the engine
subscription is closed when the client disconnects.

httpx's ASGI transport buffers whole responses, so the stream is driven with raw ASGI
messages (the way a server would)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

import durably
from durably import Engine, EngineEvent, WorkflowCtx
from durably.dashboard import create_app

from .conftest import client_for, wait_status, wait_until


class AsgiStream:
    """One GET against an ASGI app, read chunk by chunk; `disconnect()` ends it."""

    def __init__(self, app: Any, path: str) -> None:
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._gone = asyncio.Event()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [(b"host", b"localhost"), (b"accept", b"text/event-stream")],
            "client": ("127.0.0.1", 1234),
            "server": ("localhost", 80),
        }
        self.task = asyncio.create_task(app(scope, self._receive, self._send))
        self.buffer = ""

    async def _receive(self) -> dict[str, Any]:
        if not hasattr(self, "_sent_request"):
            self._sent_request = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        await self.messages.put(message)

    async def start(self) -> dict[str, Any]:
        return await asyncio.wait_for(self.messages.get(), 5)

    async def next_message(self) -> str:
        """The next SSE message (comment or data block), without its blank line."""
        while "\n\n" not in self.buffer:
            message = await asyncio.wait_for(self.messages.get(), 10)
            self.buffer += message.get("body", b"").decode()
        block, _, self.buffer = self.buffer.partition("\n\n")
        return block

    async def disconnect(self) -> None:
        self._gone.set()
        await asyncio.wait_for(self.task, 5)


def track_subscriptions(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The listeners subscribed through `engine.subscribe` (how the console listens) and
    not unsubscribed yet."""
    live: list[object] = []
    subscribe = engine.subscribe

    def tracked(listener: Callable[[EngineEvent], Any]) -> Callable[[], None]:
        live.append(listener)
        unsubscribe = subscribe(listener)

        def untrack() -> None:
            if listener in live:
                live.remove(listener)
            unsubscribe()

        return untrack

    monkeypatch.setattr(engine, "subscribe", tracked)
    return live


async def test_sse_delivers_the_runs_events_while_it_moves(
    engine: Engine, uid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    @durably.step(f"{uid}.work")
    def work(x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.mover")
    async def mover(ctx: WorkflowCtx, token: str) -> int:
        got = await ctx.wait_for_signal(token)
        a = await ctx.step(work, got)
        return await ctx.step(work, a)

    @durably.workflow(f"{uid}.other")
    async def other(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(work, x)

    subscriptions = track_subscriptions(engine, monkeypatch)
    app = create_app(engine)
    rid, token = f"{uid}-moving", f"{uid}-go"
    await engine.start(mover, token, run_id=rid)
    await wait_status(engine, rid, "suspended")

    async def parked() -> bool:
        return any(w.run_id == rid for w in await engine.store.list_signal_waiters(token))

    await wait_until(parked)
    assert subscriptions == []
    stream = AsgiStream(app, f"/api/runs/{rid}/stream")
    start = await stream.start()
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    assert headers["content-type"].startswith("text/event-stream")
    assert await stream.next_message() == ": connected"
    assert len(subscriptions) == 1

    await engine.execute(other, 1)  # another run's events are not streamed
    await engine.signal(token, 1)
    events: list[dict[str, Any]] = []
    while not events or events[-1]["type"] != "run.completed":
        block = await stream.next_message()
        assert block.startswith("data: ") and "\n" not in block, block
        events.append(json.loads(block[len("data: ") :]))
    assert {e["runId"] for e in events} == {rid}
    types = [e["type"] for e in events]
    assert types.count("step.completed") >= 2
    assert events[-1]["output"] == 3
    # An in-process step keeps its row's kind and says where it ran.
    steps = [e for e in events if e["type"].startswith("step.")]
    assert {(e["kind"], e["placement"]) for e in steps} == {("remote", "in_process")}

    await stream.disconnect()
    assert subscriptions == []  # unsubscribed


async def test_stream_of_an_unknown_run_is_404(engine: Engine) -> None:
    async with client_for(create_app(engine)) as client:
        assert (await client.get("/api/runs/nope/stream")).status_code == 404


async def test_a_read_replica_console_follows_a_run_moving_in_another_process(
    tmp_path: Any, uid: str
) -> None:
    """`durably dashboard STORE_URL` serves a drive=False engine: the run moves in a worker
    (another engine on the same SQLite file), so no engine event reaches the console; the
    stream polls the run row and reports the change."""
    from .conftest import FAST

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> int:
        return int(await ctx.wait_for_signal(f"{uid}-go"))

    url = f"sqlite:///{tmp_path / 'replica.db'}"
    async with (
        Engine(url, workflows=[wf], **FAST) as worker,
        Engine(url, workflows=[wf], drive=False, **FAST) as replica,
    ):
        handle = await worker.start(wf, run_id=f"{uid}-r")
        await wait_status(worker, handle.run_id, "suspended")
        stream = AsgiStream(create_app(replica), f"/api/runs/{uid}-r/stream")
        assert (await stream.start())["status"] == 200
        assert (await stream.next_message()) == ": connected"
        await asyncio.sleep(1.2)  # the poll has seen the suspended row
        await worker.signal(f"{uid}-go", 5)
        assert await worker.get_handle(handle.run_id).result(timeout=10) == 5
        message = await stream.next_message()
        while message.startswith(":"):
            message = await stream.next_message()
        change = json.loads(message.removeprefix("data: "))
        assert change["type"] == "run.changed" and change["runId"] == f"{uid}-r"
        assert change["status"] in ("running", "completed")
        await stream.disconnect()
