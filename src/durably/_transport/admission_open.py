"""From `Engine(admission="redis")` or `Engine(admission="redis://…")` to a `RedisAdmission`.

- `"redis"`: count slots on the server of the engine's Redis transport, under that
  transport's key prefix (its namespace folded in), so a fleet that already shares a Redis
  transport shares its queues' slots with no second setting to keep in step. An engine
  without a Redis transport is refused (`ValueError`): there is no server to use.
- `"redis://…"` / `"rediss://…"`: that server, under the default prefix `durable`.

Either way the backend acts for the engine (its instance id owns the slots, its clock
stamps them). For another prefix or a shared client, pass a `RedisAdmission` object.

The Redis packages are an optional extra, so they are imported only when one of these forms
is given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from durably._transport.pool import TransportPool

if TYPE_CHECKING:
    from durably._core.admission import AdmissionBackend

__all__ = ["REDIS_SCHEMES", "redis_admission"]

REDIS_SCHEMES = ("redis://", "rediss://")


def redis_admission(
    spec: Any, transports: TransportPool | None, *, owner: str, clock: Callable[[], int]
) -> AdmissionBackend | None:
    """The Redis backend `spec` names ("redis" or a Redis URL), or None for any other spec
    (a backend object, "auto", "local", "store": the engine's own choice)."""
    if not isinstance(spec, str):
        return None
    if spec == "redis":
        url, prefix = _transport_server(transports)
    elif spec.lower().startswith(REDIS_SCHEMES):
        url, prefix = spec, "durable"
    else:
        return None
    try:
        from durably._transport.redis_admission import RedisAdmission
    except ImportError as exc:
        raise ImportError(
            f"Engine(admission={spec!r}) needs the Redis packages: pip install 'durably[redis]' "
            f"({exc})"
        ) from None
    return RedisAdmission(url, prefix=prefix, owner=owner, clock=clock)


def _transport_server(transports: TransportPool | None) -> tuple[str, str]:
    """The URL and key prefix of the first Redis member of the engine's transport pool."""
    for _, member in transports.members if transports is not None else ():
        server = member.redis_server
        if server is not None:
            return server
    raise ValueError(
        'Engine(admission="redis") counts slots on the server of the engine\'s Redis '
        'transport, and this engine has none: give it transport="redis://…", or name the '
        'server: admission="redis://host:6379/0"'
    )
