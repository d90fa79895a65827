"""Named events: publish to waiting runs, start `on_event` workflows, buffer; and the
values runs record with `ctx.set_event`."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from durably._core.errors import SignalBufferFullError
from durably._core.models import BufferedEvent, utc_from_ms
from durably._core.triggers import refuse_reserved_event
from durably._engine.control.signals import check_payload
from durably._engine.defs.event_tokens import event_matches, event_token_prefix, match_of_token
from durably._engine.defs.typed_io import PLAIN
from durably._engine.triggers.subscribers import (
    EventStart,
    plan_subscribers,
    start_subscribers,
)

# The signal-buffer namespace buffered events count in (their waits' tokens are `event:…`).
EVENT_NAMESPACE = "event"


class EventBufferFullError(SignalBufferFullError):
    """An event nobody takes could not be buffered: its name already holds
    `signal_buffer_per_token` buffered events (`scope == "token"`), or all names together
    `signal_buffer_per_namespace` (`scope == "namespace"`, `namespace == "event"`). Nothing
    was stored. A `SignalBufferFullError` (`.token` is `event:<name>`), with its own words."""

    def __init__(self, name: str, scope: str, cap: int, option: str):
        super().__init__(f"{EVENT_NAMESPACE}:{name}", scope, EVENT_NAMESPACE, cap, option)
        where = "with this name" if scope == "token" else "in all (every event name)"
        shown = repr(name if len(name) <= 200 else name[:200] + "…")
        self.args = (
            f"event {shown} refused: {cap} events are already buffered {where}, the cap set "
            f"by Engine({option}=…); nothing was stored. A buffered event is taken by the "
            "next wait_for_event that matches it and expires after signal_buffer_ttl; raise "
            f"the cap with {option}, or publish with buffer=False",
        )
        self.name = name


if TYPE_CHECKING:
    from durably._engine.control.signals import SignalRoute
    from durably._engine.defs.registry import Workflow


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
    # Bounded as a signal's payload is: refused before any waiter, subscriber or buffer sees it.
    check_payload(f"event payload of {name!r}", payload, route.signal_buffer)
    # First, before anything is published: an accumulator key function that fails refuses
    # the whole publish (EventKeyError), rather than reaching some subscribers only.
    subscribers = plan_subscribers(name, payload, workflows)
    # Each matching waiter is taken in the transaction that writes its delivery (one for
    # all of them): taken first and written next, a crash between the two left the run
    # waiting for an event nobody delivers any more.
    matching = [
        (waiter.token, payload)
        for waiter in await store.list_signal_waiters(event_token_prefix(name))
        if event_matches(payload, match_of_token(waiter.token))
    ]
    delivered = await store.deliver_signals(matching, utc_from_ms(clock())) if matching else []
    for cp in delivered:
        await route.redrive(cp.run_id, cp)
    touched = len(delivered)
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
    # Bounded like an external signal: a made-up name must not grow the store without end.
    # The event expires `signal_buffer_ttl` after it was published, and is refused (nothing
    # stored) past `signal_buffer_per_token` events of its name or
    # `signal_buffer_per_namespace` events in all, as a signal on the token `event:<name>`
    # (namespace `event`, that of the event waits' tokens) would be. The engine's own
    # accumulator events never pass here (they are stored by `triggers.py`, unbounded):
    # losing one would lose an event a trigger accepted.
    policy = route.signal_buffer
    refused = await store.buffer_event_bounded(
        event,
        ttl_ms=policy.ttl_ms,
        per_name=policy.per_token,
        per_namespace=policy.per_namespace,
    )
    if refused is not None:
        cap, option = (
            (policy.per_token, "signal_buffer_per_token")
            if refused == "token"
            else (policy.per_namespace, "signal_buffer_per_namespace")
        )
        raise EventBufferFullError(name, refused, cap, option)
    # A wait that registered after the first look: hand it the event, taking both in one
    # transaction. None means the waiter left or the wait took the event itself.
    for waiter in await store.list_signal_waiters(event_token_prefix(name)):
        if event_matches(payload, match_of_token(waiter.token)):
            handed = await store.deliver_buffered_event(
                event.id, waiter.token, utc_from_ms(clock())
            )
            if handed is not None:
                await route.redrive(handed.run_id, handed)
                return 1
    return 0
