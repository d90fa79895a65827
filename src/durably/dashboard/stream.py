"""`GET runs/:id/stream`: the run's engine events as server-sent events (run-detail.md §12.3).

Each event of the run is one `data: <EngineEvent JSON>` message. The engine subscription is
opened when the stream starts and closed when the client disconnects (or the server shuts the
stream down). A comment line is sent first (so a client sees the stream is open) and then
every `keepalive` seconds of silence (so proxies keep the connection).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import StreamingResponse

from durably._engine.engine import Engine
from durably._engine.events import EngineEvent

__all__ = ["KEEPALIVE_SECONDS", "QUEUE_LIMIT", "event_stream", "sse_response"]

KEEPALIVE_SECONDS = 15.0
#: Events buffered for a slow client before the oldest are dropped.
QUEUE_LIMIT = 10_000


async def event_stream(
    engine: Engine,
    run_id: str,
    request: Request | None = None,
    keepalive: float = KEEPALIVE_SECONDS,
) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[EngineEvent] = asyncio.Queue()

    def enqueue(event: EngineEvent) -> None:
        if queue.qsize() >= QUEUE_LIMIT:
            queue.get_nowait()
        queue.put_nowait(event)

    def on_event(event: EngineEvent) -> None:
        if event.run_id != run_id:
            return
        # events may be emitted from a step thread: hop onto the loop
        loop.call_soon_threadsafe(enqueue, event)

    unsubscribe = engine.subscribe(on_event)
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
            data = json.dumps(event.to_json(), ensure_ascii=False, separators=(",", ":"))
            yield f"data: {data}\n\n"
    finally:
        unsubscribe()


def sse_response(engine: Engine, run_id: str, request: Request) -> StreamingResponse:
    return StreamingResponse(
        event_stream(engine, run_id, request),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
