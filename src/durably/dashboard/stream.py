"""`GET runs/:id/stream`: the run's engine events as server-sent events.

Each event of the run is one `data: <EngineEvent JSON>` message. The engine subscription is
opened when the stream starts and closed when the client disconnects (or the server shuts the
stream down). A comment line is sent first (so a client sees the stream is open) and then
every `keepalive` seconds of silence (so proxies keep the connection).

Engine events exist only in the process that drives the run. A console served by a
`drive=False` engine (`durably dashboard STORE_URL` next to separate workers) therefore also
polls the run row every `POLL_SECONDS` and sends `{"type": "run.changed", "runId", "status",
"updatedAt"}` when its status or `updatedAt` moved — so the page still follows a run that
moves in another process (the UI refetches on any message). A console over a `Client`
has no events at all: it only polls the row.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse

from durably._engine.client.client import Client
from durably._engine.defs.events import EngineEvent
from durably._engine.engine import Engine

__all__ = ["KEEPALIVE_SECONDS", "QUEUE_LIMIT", "event_stream", "sse_response"]

KEEPALIVE_SECONDS = 15.0
#: How often a `drive=False` console re-reads the streamed run's row.
POLL_SECONDS = 1.0
#: Events buffered for a slow client before the oldest are dropped.
QUEUE_LIMIT = 10_000


async def event_stream(
    engine: Client | Engine,
    run_id: str,
    request: Request | None = None,
    keepalive: float = KEEPALIVE_SECONDS,
    poll: float | None = None,
) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[EngineEvent | dict[str, Any]] = asyncio.Queue()
    worker = engine if isinstance(engine, Engine) else None
    if poll is None:
        poll = None if worker is not None and worker.drive_runs else POLL_SECONDS

    def enqueue(event: EngineEvent | dict[str, Any]) -> None:
        if queue.qsize() >= QUEUE_LIMIT:
            queue.get_nowait()
        queue.put_nowait(event)

    def on_event(event: EngineEvent) -> None:
        if event.run_id != run_id:
            return
        # events may be emitted from a step thread: hop onto the loop
        loop.call_soon_threadsafe(enqueue, event)

    async def watch_row() -> None:
        assert poll is not None
        seen: tuple[str, str] | None = None
        while True:
            try:
                run = await engine.get_run(run_id)
            except Exception:
                run = None  # the store is away: try again at the next tick
            if run is not None:
                now = (run.status, run.updated_at.isoformat())
                if seen is not None and now != seen:
                    enqueue(
                        {
                            "type": "run.changed",
                            "runId": run_id,
                            "status": now[0],
                            "updatedAt": now[1],
                        }
                    )
                seen = now
            await asyncio.sleep(poll)

    unsubscribe = worker.subscribe(on_event) if worker is not None else None
    poller = asyncio.ensure_future(watch_row()) if poll else None
    try:
        yield ": connected\n\n"
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), keepalive)
            except TimeoutError:
                if request is not None and await request.is_disconnected():
                    return
                yield ": keepalive\n\n"
                continue
            body = event if isinstance(event, dict) else event.to_json()
            data = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
            yield f"data: {data}\n\n"
    finally:
        if unsubscribe is not None:
            unsubscribe()
        if poller is not None:
            poller.cancel()


def sse_response(engine: Client | Engine, run_id: str, request: Request) -> StreamingResponse:
    return StreamingResponse(
        event_stream(engine, run_id, request),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
