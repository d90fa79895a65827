"""`TransportPool`: an engine's transports in order, with pinned ids and fail-over.

A single transport is the pool `[("default", transport)]`. A dispatch goes to the member the
step pins (an unknown id is an error, never a silent fall-back), otherwise to the members in
order until one accepts it; the task is stamped with the id of the member that took it, so a
worker that consumes several brokers replies on that one. Results are consumed from every
member.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from durably._core.log_context import durably_logger
from durably._core.wire import RemoteTask
from durably._transport.protocol import ResultSink, Transport, TransportUnavailableError

log = durably_logger("durably.transport")

__all__ = ["TransportPool"]


class TransportPool:
    """Ordered, named transports; dispatch with pinning and fail-over."""

    def __init__(self, members: Sequence[tuple[str, Transport]]):
        if not members:
            raise ValueError("a transport pool needs at least one transport")
        ids = [member_id for member_id, _ in members]
        if len(set(ids)) != len(ids):
            raise ValueError(f"transport ids must be unique, got {ids}")
        self._members = list(members)

    @property
    def members(self) -> list[tuple[str, Transport]]:
        return list(self._members)

    def member(self, member_id: str) -> Transport:
        for candidate_id, transport in self._members:
            if candidate_id == member_id:
                return transport
        known = ", ".join(candidate_id for candidate_id, _ in self._members)
        raise LookupError(f"no transport named {member_id!r} (this engine has: {known})")

    async def start(self, sink: ResultSink) -> None:
        for _, transport in self._members:
            await transport.start(sink)

    async def close(self) -> None:
        for member_id, transport in self._members:
            try:
                await transport.close()
            except Exception:
                log.warning("closing transport %r failed", member_id, exc_info=True)

    async def dispatch(self, task: RemoteTask, *, pinned: str | None = None) -> str:
        """Dispatch on the pinned member, else the first that accepts; the id that took it."""
        order = self._members
        if pinned is not None:
            first = self.member(pinned)
            order = [(pinned, first)] + [m for m in self._members if m[0] != pinned]
        last: Exception | None = None
        for member_id, transport in order:
            try:
                await transport.dispatch(dataclasses.replace(task, transport=member_id))
                return member_id
            except TransportUnavailableError as exc:
                log.warning("transport %r refused step %s: %s", member_id, task.step_id, exc)
                last = exc
        assert last is not None
        raise last
