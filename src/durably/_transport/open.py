"""From what a user passes as `Engine(transport=…)` to a `TransportPool`.

Accepted: a transport object, a `TransportPool`, `[(id, transport), …]` (an ordered pool with
named members), or a URL naming a broker with default settings:

- `redis://…` / `rediss://…` — the Redis transport (BullMQ queues; the `redis` extra);
- `postgresql://…` / `postgres://…` — the SQL transport on PostgreSQL (tables in that
  database; the `postgres` extra).

A transport built from a URL takes the engine's instance id (its control messages and
liveness keys carry it). For other settings (prefix, transport namespace, polling) build the
transport object yourself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias, cast

from durably._transport.pool import TransportPool
from durably._transport.protocol import Transport

__all__ = ["TransportSpec", "transport_pool"]

TransportSpec: TypeAlias = Transport | TransportPool | Sequence[tuple[str, Transport]] | str


def transport_pool(spec: TransportSpec | None, *, instance_id: str) -> TransportPool | None:
    """The pool for `spec`; None for no transport (steps run in-process)."""
    if spec is None:
        return None
    if isinstance(spec, TransportPool):
        return spec
    if isinstance(spec, str):
        return TransportPool([("default", open_transport(spec, instance_id=instance_id))])
    if isinstance(spec, (list, tuple)):
        members: list[tuple[str, Transport]] = []
        for member in spec:
            member_id, transport = member
            if not isinstance(member_id, str):
                raise TypeError(f"a transport pool member is (id, transport), got {member!r}")
            members.append((member_id, transport))
        return TransportPool(members)
    return TransportPool([("default", cast(Transport, spec))])


def open_transport(url: str, *, instance_id: str) -> Transport:
    """The transport a URL names (module docstring), or a `ValueError` naming the URL."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    # Imported here, not at the top: each broker's packages are an optional extra, and a
    # process that never names that broker must not need them.
    if scheme in ("redis", "rediss"):
        try:
            from durably._transport.redis import RedisTransport
        except ImportError as exc:
            raise ImportError(
                f"transport {url!r} needs the Redis transport's packages: "
                f"pip install 'durably[redis]' ({exc})"
            ) from None
        return RedisTransport(url, instance_id=instance_id)
    if scheme in ("postgresql", "postgres"):
        from durably._transport.sql import SqlTransport

        return SqlTransport(url, instance_id=instance_id)
    raise ValueError(
        f"transport {url!r}: unknown scheme {scheme or '(none)'!r}; use redis://… or "
        "postgresql://…, or pass a transport object"
    )
