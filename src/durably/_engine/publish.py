"""Named events: publish to waiting runs, start `on_event` workflows, buffer; and the
values runs record with `ctx.set_event`."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from durably._core.models import BufferedEvent
from durably._engine.ctx import event_matches, event_token_prefix, match_of_token
from durably._engine.typed_io import PLAIN

if TYPE_CHECKING:
    from durably._engine.engine import Engine

log = logging.getLogger("durably")


async def publish_event(
    engine: Engine, name: str, payload: Any = None, *, id: str | None = None, buffer: bool = True
) -> int:
    """Signal matching waiters, start `on_event` workflows, else buffer."""
    payload = PLAIN.to_json(payload)
    touched = 0
    for waiter in await engine.store.list_signal_waiters(event_token_prefix(name)):
        if event_matches(payload, match_of_token(waiter.token)):
            taken = await engine.store.take_signal_waiter(waiter.token)
            if taken is not None:
                await engine.deliver(taken, payload)
                touched += 1
    for wf in list(engine.latest_workflows()):
        if name in wf.on_event:
            try:
                await engine.create_run(
                    wf,
                    engine.prepare_input(wf, payload),
                    run_id=f"evt:{id or uuid.uuid4()}:{wf.name}",
                )
                touched += 1
            except Exception:
                log.exception("on_event start of %s for %s failed", wf.name, name)
    if touched or buffer is False:
        return touched
    event = BufferedEvent(
        id=id or str(uuid.uuid4()), name=name, payload=payload, published_at=engine.clock()
    )
    await engine.store.buffer_event(event)
    for waiter in await engine.store.list_signal_waiters(event_token_prefix(name)):
        if event_matches(payload, match_of_token(waiter.token)):
            if await engine.store.remove_buffered_event(event.id):
                taken = await engine.store.take_signal_waiter(waiter.token)
                if taken is not None:
                    await engine.deliver(taken, payload)
                    return 1
                await engine.store.buffer_event(event)  # put it back: nobody took it
            break
    return 0
