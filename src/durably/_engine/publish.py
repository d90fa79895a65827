"""Named events: publish to waiting runs, start `on_event` workflows, buffer; and the
values runs record with `ctx.set_event`."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from durably._core.models import BufferedEvent
from durably._engine.ctx import event_matches, event_token_prefix, match_of_token
from durably._engine.typed_io import PLAIN

if TYPE_CHECKING:
    from durably._engine.registry import Workflow
    from durably._engine.signals import SignalRoute

# Starts a run of `workflow` for an event: (workflow, the event's payload, the run id).
EventStart = Callable[["Workflow[Any, Any]", Any, str], Awaitable[object]]

log = logging.getLogger("durably")


async def publish_event(
    route: SignalRoute,
    name: str,
    payload: Any = None,
    *,
    id: str | None = None,
    buffer: bool = True,
    workflows: Iterable[Workflow[Any, Any]],
    start: EventStart,
    clock: Callable[[], int],
) -> int:
    """Signal matching waiters, start the `on_event` workflows among `workflows` (through
    `start`), else buffer (when `buffer`). The number of runs touched."""
    store = route.store
    payload = PLAIN.to_json(payload)
    touched = 0
    for waiter in await store.list_signal_waiters(event_token_prefix(name)):
        if event_matches(payload, match_of_token(waiter.token)):
            taken = await store.take_signal_waiter(waiter.token)
            if taken is not None:
                await route.deliver(taken, payload)
                touched += 1
    for wf in list(workflows):
        if name in wf.on_event:
            try:
                await start(wf, payload, f"evt:{id or uuid.uuid4()}:{wf.name}")
                touched += 1
            except Exception:
                log.exception("on_event start of %s for %s failed", wf.name, name)
    if touched or buffer is False:
        return touched
    event = BufferedEvent(
        id=id or str(uuid.uuid4()), name=name, payload=payload, published_at=clock()
    )
    await store.buffer_event(event)
    for waiter in await store.list_signal_waiters(event_token_prefix(name)):
        if event_matches(payload, match_of_token(waiter.token)):
            if await store.remove_buffered_event(event.id):
                taken = await store.take_signal_waiter(waiter.token)
                if taken is not None:
                    await route.deliver(taken, payload)
                    return 1
                await store.buffer_event(event)  # put it back: nobody took it
            break
    return 0
