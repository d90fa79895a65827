"""Named events: publish to waiting runs, start `on_event` workflows, buffer; and the
values runs record with `ctx.set_event`."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from durably._core.models import BufferedEvent
from durably._engine.event_tokens import event_matches, event_token_prefix, match_of_token
from durably._engine.triggers import (
    EventStart,
    plan_subscribers,
    refuse_reserved_event,
    start_subscribers,
)
from durably._engine.typed_io import PLAIN

if TYPE_CHECKING:
    from durably._engine.registry import Workflow
    from durably._engine.signals import SignalRoute


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
    namespace: str | None = None,
) -> int:
    """Signal matching waiters, start the `on_event` workflows among `workflows` (through
    `start`; or feed their debounce/batch accumulators, those of `namespace`:
    `triggers.start_subscribers`), else buffer (when `buffer`). The number of runs touched."""
    refuse_reserved_event(name, id)
    store = route.store
    payload = PLAIN.to_json(payload)
    # First, before anything is published: an accumulator key function that fails refuses
    # the whole publish (EventKeyError), rather than reaching some subscribers only.
    subscribers = plan_subscribers(name, payload, workflows)
    touched = 0
    for waiter in await store.list_signal_waiters(event_token_prefix(name)):
        if event_matches(payload, match_of_token(waiter.token)):
            taken = await store.take_signal_waiter(waiter.token)
            if taken is not None:
                await route.deliver(taken, payload)
                touched += 1
    touched += await start_subscribers(
        route,
        name,
        payload,
        event_id=id,
        subscribers=subscribers,
        namespace=namespace,
        start=start,
    )
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
