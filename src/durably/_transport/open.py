"""From what a user passes as `Engine(transport=…)` to a `TransportPool`.

Accepted: a transport object, a `TransportPool`, or `[(id, transport), …]` (an ordered pool
with named members). A URL string names a broker (`redis://…`, `postgresql://…`); until the
package for that broker is installed, the refusal says which extra brings it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias, cast

from durably._transport.pool import TransportPool
from durably._transport.protocol import Transport

__all__ = ["TransportSpec", "transport_pool"]

TransportSpec: TypeAlias = Transport | TransportPool | Sequence[tuple[str, Transport]] | str


def transport_pool(spec: TransportSpec | None) -> TransportPool | None:
    """The pool for `spec`; None for no transport (steps run in-process)."""
    if spec is None:
        return None
    if isinstance(spec, TransportPool):
        return spec
    if isinstance(spec, str):
        raise NotImplementedError(
            f"transport {spec!r}: transport URLs are not supported yet; pass a transport "
            "object (for example durably.InMemoryTransport())"
        )
    if isinstance(spec, (list, tuple)):
        members: list[tuple[str, Transport]] = []
        for member in spec:
            member_id, transport = member
            if not isinstance(member_id, str):
                raise TypeError(f"a transport pool member is (id, transport), got {member!r}")
            members.append((member_id, transport))
        return TransportPool(members)
    return TransportPool([("default", cast(Transport, spec))])
