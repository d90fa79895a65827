"""What the public signal methods do: `update`, and operator access to the signal buffer
(`list_buffered_signals`, `count_buffered_signals`, `purge_buffered_signals`).

`Updates` is an `Engine`'s (only an engine validates updates and drives the runs they
wake); `BufferedSignals` is a `Client`'s, and an engine's through its client. `signal` itself
is `Client.signal`. Every signal that enters here came from outside the engine, so:

- its token must not belong to one of the engine's own waiter namespaces (a child's
  completion, a breakpoint, an update, an event wait, …: `durably._core.tokens`) —
  `ReservedTokenError`, nothing delivered or stored. The engine reaches those waits through
  `signals.signal`, its internal path, after checking that the thing really happened
  (`update` validates first, `continue_run` finds the pending breakpoint, a child's completion
  is announced when the child settles);
- when no run waits on the token yet it is buffered BOUNDED (`SignalBufferPolicy`: a TTL and a
  cap per token and per namespace), or not at all with `buffer=False`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from durably._core.buffered_signals import (
    DEFAULT_LIST_LIMIT,
    MAX_LIST_LIMIT,
    BufferedSignalInfo,
)
from durably._engine.client.handle import UpdateResult
from durably._engine.control import signals

if TYPE_CHECKING:
    from durably._store.protocol import StateStore

__all__ = ["BufferedSignals", "Opener", "Updates"]

# Opens the store (and whatever else its owner runs) before a call that needs it; idempotent.
Opener = Callable[[], Awaitable[None]]

# Largest offset accepted by the listing (a 32-bit integer in every store's SQL).
_MAX_OFFSET = 2**31 - 1


def _whole(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number, not {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low:,} and {high:,}, not {value:,}")
    return value


def _prefix(value: str | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(
            f"prefix must be a non-empty string, not {value!r} (omit it to cover every token)"
        )
    return value


class Updates:
    """`Engine.update`: the update validators registered on an engine, and the delivery of
    an accepted update over the engine's internal signal route.

    Collaborators: the store (the run an update is for), `opener` (opens the engine) and
    `route` (how the engine delivers a signal and wakes the run, `signals.SignalRoute`).
    """

    def __init__(self, store: StateStore, *, opener: Opener, route: signals.SignalRoute):
        self._store = store
        self._opener = opener
        self._route = route
        self._validators: dict[tuple[str, str], Callable[[Any], Any]] = {}

    def register_validator(self, workflow: str, name: str, fn: Callable[[Any], Any]) -> None:
        """Check every update `name` of `workflow`'s runs with `fn(arg)` first."""
        self._validators[(workflow, name)] = fn

    async def update(self, run_id: str, name: str, arg: Any = None) -> UpdateResult:
        """Validate, then deliver to `ctx.on_update(name)`. An update sent
        before the run waits for it is buffered like any external signal (bounded;
        `SignalBufferFullError` over a cap)."""
        run = await self._store.get_run(run_id)
        if run is None:
            return UpdateResult(False, f"run {run_id} not found")
        validator = self._validators.get((run.workflow, name))
        if validator is not None:
            try:
                verdict = validator(arg)
            except Exception as exc:
                return UpdateResult(False, str(exc) or type(exc).__name__)
            if isinstance(verdict, str) and verdict:
                return UpdateResult(False, verdict)
        await self._opener()
        result = await signals.signal(
            self._route,
            f"update:{run_id}:{name}",
            arg,
            want_result=True,
            buffer="bounded",
        )
        return UpdateResult(True, None, result is not None)


class BufferedSignals:
    """Operator access to the signal buffer of one store; `opener` opens it first."""

    def __init__(self, store: StateStore, *, opener: Opener):
        self._store = store
        self._opener = opener

    async def list_buffered_signals(
        self, *, prefix: str | None = None, limit: int = DEFAULT_LIST_LIMIT, offset: int = 0
    ) -> list[BufferedSignalInfo]:
        """Buffered signals, oldest first: token, payload size, when buffered, when it expires
        (None: an engine-owned completion record that never expires) — never the payload.
        `prefix` keeps tokens starting with it (exact, case-sensitive); `limit` 1..1,000."""
        prefix = _prefix(prefix)
        limit = _whole("limit", limit, 1, MAX_LIST_LIMIT)
        offset = _whole("offset", offset, 0, _MAX_OFFSET)
        await self._opener()
        return await self._store.list_buffered_signals(prefix=prefix, limit=limit, offset=offset)

    async def count_buffered_signals(self, *, prefix: str | None = None) -> int:
        """How many signals are buffered (tokens starting with `prefix` when given)."""
        prefix = _prefix(prefix)
        await self._opener()
        return await self._store.count_buffered_signals(prefix=prefix)

    async def purge_buffered_signals(
        self,
        *,
        token: str | None = None,
        prefix: str | None = None,
        expired_only: bool = False,
        all: bool = False,
    ) -> int:
        """Delete buffered signals; returns how many were deleted.

        Say what to delete: `token=` (exactly that token), `prefix=` (tokens starting with
        it), `all=True` (every one), optionally narrowed with `expired_only=True`;
        `expired_only=True` alone deletes every expired one. Decision: the engine's own
        completion records (a child's completion waiting for its parent to join; listed
        without an expiry) are never deleted — a parent joining later would wait forever.
        """
        # `all` is the parameter here (the builtin is shadowed on purpose: it reads best).
        if not isinstance(expired_only, bool) or not isinstance(all, bool):
            raise TypeError("expired_only and all must be True or False")
        scopes = [name for name, value in (("token", token), ("prefix", prefix)) if value]
        if token is not None and (not isinstance(token, str) or not token):
            raise ValueError(f"token must be a non-empty string, not {token!r}")
        prefix = _prefix(prefix)
        if all:
            scopes.append("all")
        if len(scopes) > 1:
            raise ValueError(f"choose one of token=, prefix= or all=True, not {scopes}")
        if not scopes and not expired_only:
            raise ValueError(
                "purge_buffered_signals needs an explicit choice: token=…, prefix=…, "
                "expired_only=True, or all=True to delete every buffered signal"
            )
        await self._opener()
        return await self._store.purge_buffered_signals(
            token=token, prefix=prefix, expired_only=expired_only
        )
