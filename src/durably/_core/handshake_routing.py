"""Negotiation and capability routing over worker descriptors.

Before work is dispatched to a routing token, the engine reads the descriptors of the workers live
on that token and asks two questions of each: does it offer every capability the work requires,
and does it speak a protocol major the engine speaks? If nobody qualifies, the run is parked
`blocked` with a reason an operator can act on, instead of being put on a queue that no worker
able to run it consumes. The outcomes, reason codes and messages match the other SDKs, because
they are shown on dashboards and stored in run events.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from durably._core.handshake_descriptor import (
    CURRENT_PROTOCOL_VERSION,
    ProtocolBand,
    SdkInfo,
    WorkerDescriptor,
    descriptor_to_wire,
)

__all__ = [
    "CONTROL_PLANE_SDK_NAME",
    "BlockCode",
    "DispatchBlocked",
    "DispatchDiagnostics",
    "DispatchPlan",
    "DispatchRoutable",
    "Negotiation",
    "NegotiationOutcome",
    "can_route",
    "control_plane_descriptor",
    "negotiate",
    "plan_dispatch",
    "required_capabilities",
]

NegotiationOutcome = Literal["compatible", "degraded", "incompatible"]
BlockCode = Literal["protocol.incompatible", "capability.unavailable"]

# The SDK name durably's control plane states in its own descriptor.
CONTROL_PLANE_SDK_NAME = "durably"


def _range_json(band: tuple[int, int]) -> list[int]:
    return [band[0], band[1]]


@dataclass(frozen=True, slots=True)
class Negotiation:
    """How two sides get on. `incompatible` (no protocol major in common) is the only outcome that
    forbids dispatch; `degraded` means the capability sets differ, which is normal (a control plane
    offers no capabilities at all) and only matters for work that requires a missing one."""

    outcome: NegotiationOutcome
    negotiated_protocol: int | None
    local_range: tuple[int, int]
    remote_range: tuple[int, int]
    shared: tuple[str, ...]
    missing_on_remote: tuple[str, ...]
    missing_on_local: tuple[str, ...]
    missing_required: tuple[str, ...] = ()
    reason_code: BlockCode | None = None
    reason_message: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The result in the shape (and key order) the other SDKs return it."""
        out: dict[str, Any] = {
            "outcome": self.outcome,
            "negotiatedProtocol": self.negotiated_protocol,
            "protocol": {
                "localRange": _range_json(self.local_range),
                "remoteRange": _range_json(self.remote_range),
            },
            "capabilities": {
                "shared": list(self.shared),
                "missingOnRemote": list(self.missing_on_remote),
                "missingOnLocal": list(self.missing_on_local),
            },
        }
        if self.reason_code is None:
            return out
        detail: dict[str, Any]
        if self.reason_code == "protocol.incompatible":
            detail = {
                "localRange": _range_json(self.local_range),
                "remoteRange": _range_json(self.remote_range),
            }
        elif self.missing_required:
            detail = {
                "missingRequired": list(self.missing_required),
                "missingOnRemote": list(self.missing_on_remote),
                "missingOnLocal": list(self.missing_on_local),
            }
        else:
            detail = {
                "missingOnRemote": list(self.missing_on_remote),
                "missingOnLocal": list(self.missing_on_local),
            }
        out["reason"] = {"code": self.reason_code, "message": self.reason_message, "detail": detail}
        return out


def _minus(a: Iterable[str], b: Iterable[str]) -> tuple[str, ...]:
    exclude = set(b)
    return tuple(sorted(x for x in set(a) if x not in exclude))


def negotiate(
    local: WorkerDescriptor, remote: WorkerDescriptor, required: Iterable[str] = ()
) -> Negotiation:
    """Negotiate `local` (normally the control plane) against `remote` (a worker), in order:
    protocol ranges that do not overlap → `incompatible`; else a `required` capability the remote
    lacks → `degraded`; else capability sets that differ either way → `degraded`; else
    `compatible`. The agreed protocol is the higher end both ranges share."""
    local_range, remote_range = local.protocol.range, remote.protocol.range
    local_caps, remote_caps = set(local.capabilities), set(remote.capabilities)
    shared = tuple(sorted(local_caps & remote_caps))
    missing_on_remote = _minus(local_caps, remote_caps)
    missing_on_local = _minus(remote_caps, local_caps)
    # The compatible answer; the other outcomes are this with a reason attached.
    answer = Negotiation(
        outcome="compatible",
        negotiated_protocol=min(local_range[1], remote_range[1]),
        local_range=local_range,
        remote_range=remote_range,
        shared=shared,
        missing_on_remote=missing_on_remote,
        missing_on_local=missing_on_local,
    )

    if max(local_range[0], remote_range[0]) > min(local_range[1], remote_range[1]):
        return replace(
            answer,
            outcome="incompatible",
            negotiated_protocol=None,
            reason_code="protocol.incompatible",
            reason_message=(
                f"no common protocol major: local speaks [{local_range[0]}, {local_range[1]}], "
                f"remote speaks [{remote_range[0]}, {remote_range[1]}]"
            ),
        )

    missing_required = _minus(required, remote_caps)
    if missing_required:
        return replace(
            answer,
            outcome="degraded",
            missing_required=missing_required,
            reason_code="capability.unavailable",
            reason_message=(
                "remote is missing required capability(ies): " + ", ".join(missing_required)
            ),
        )

    if missing_on_remote or missing_on_local:
        parts: list[str] = []
        if missing_on_remote:
            parts.append("remote lacks " + ", ".join(missing_on_remote))
        if missing_on_local:
            parts.append("local lacks " + ", ".join(missing_on_local))
        return replace(
            answer,
            outcome="degraded",
            reason_code="capability.unavailable",
            reason_message="capability mismatch: " + "; ".join(parts),
        )

    return answer


def required_capabilities(requires: Iterable[str]) -> tuple[str, ...]:
    """A capability demand without duplicates, in the order first stated. Empty = runs anywhere."""
    return tuple(dict.fromkeys(requires))


def can_route(requires: Iterable[str], worker: WorkerDescriptor) -> bool:
    """True when `worker` offers every capability in `requires`. A worker whose descriptor has
    no `capabilities` was read as offering the original feature set, so it can still take work
    that requires only those."""
    offered = set(worker.capabilities)
    return all(cap in offered for cap in requires)


# ------------------------------------------------------------------ dispatch planning


MAX_DIAGNOSED_WORKERS = 16
"""At most this many live workers' descriptors are written into stored diagnostics."""


@dataclass(frozen=True, slots=True)
class DispatchDiagnostics:
    """Why nobody could run a piece of work, stored with the `run.blocked` event: the code, the
    token, what was required, how many workers were live, and the descriptors involved.
    `missing_capabilities` is set for a capability gap; the two range fields for a protocol gap."""

    code: BlockCode
    token: str
    requires: tuple[str, ...]
    live_workers: int
    control_plane: WorkerDescriptor
    workers: tuple[WorkerDescriptor, ...]
    missing_capabilities: tuple[str, ...] | None = None
    control_plane_range: tuple[int, int] | None = None
    worker_ranges: tuple[tuple[int, int], ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "code": self.code,
            "token": self.token,
            "requires": list(self.requires),
            "liveWorkers": self.live_workers,
        }
        if self.missing_capabilities is not None:
            out["missingCapabilities"] = list(self.missing_capabilities)
        if self.control_plane_range is not None:
            out["controlPlaneRange"] = _range_json(self.control_plane_range)
        if self.worker_ranges is not None:
            out["workerRanges"] = [_range_json(band) for band in self.worker_ranges]
        out["controlPlane"] = descriptor_to_wire(self.control_plane)
        # The first MAX_DIAGNOSED_WORKERS only (`liveWorkers` keeps the count): the
        # diagnostics are stored with the run, and the descriptors are anyone's to publish.
        out["workers"] = [descriptor_to_wire(w) for w in self.workers[:MAX_DIAGNOSED_WORKERS]]
        return out


@dataclass(frozen=True, slots=True)
class DispatchRoutable:
    """At least one live worker can run the work; `workers` are the ones that can."""

    workers: tuple[WorkerDescriptor, ...]
    status: Literal["routable"] = "routable"


@dataclass(frozen=True, slots=True)
class DispatchBlocked:
    """No live worker can run the work. `reason` is the operator-facing sentence the run is
    parked with, e.g. `blocked: no compatible worker (requires search-attr-v2)`."""

    code: BlockCode
    reason: str
    requires: tuple[str, ...]
    diagnostics: DispatchDiagnostics
    status: Literal["blocked"] = "blocked"

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "code": self.code,
            "reason": self.reason,
            "requires": list(self.requires),
            "diagnostics": self.diagnostics.to_json(),
        }


DispatchPlan = DispatchRoutable | DispatchBlocked


def _requires_suffix(required: Sequence[str]) -> str:
    return f" (requires {', '.join(required)})" if required else ""


def plan_dispatch(
    requires: Iterable[str],
    live_descriptors: Sequence[WorkerDescriptor],
    cp: WorkerDescriptor,
    token: str,
) -> DispatchPlan:
    """Decide whether work requiring `requires` can go to `token`, whose live workers published
    `live_descriptors`, negotiating each against the control plane's descriptor `cp`.

    A worker qualifies when it offers every required capability and is not protocol-incompatible
    with the control plane. Any qualifying worker → routable. Otherwise blocked: with
    `protocol.incompatible` when some workers had the capabilities but none speaks a shared
    protocol major, else with `capability.unavailable` naming the required capabilities no live
    worker offers.

    `live_descriptors` must not be empty: no descriptors at all means the workers on that token
    predate the handshake (or the transport has no descriptors), and the caller skips the check
    rather than blocking work those workers are serving."""
    if not live_descriptors:
        raise ValueError(
            "plan_dispatch needs at least one live descriptor; with none the routing check is "
            "skipped, not failed"
        )
    required = required_capabilities(requires)
    workers = tuple(live_descriptors)
    capable = [w for w in workers if can_route(required, w)]
    compatible = tuple(w for w in capable if negotiate(cp, w).outcome != "incompatible")
    if compatible:
        return DispatchRoutable(workers=compatible)

    if capable:
        code: BlockCode = "protocol.incompatible"
        return DispatchBlocked(
            code=code,
            reason="blocked: no protocol-compatible worker" + _requires_suffix(required),
            requires=required,
            diagnostics=DispatchDiagnostics(
                code=code,
                token=token,
                requires=required,
                live_workers=len(workers),
                control_plane=cp,
                workers=workers,
                control_plane_range=cp.protocol.range,
                worker_ranges=tuple(w.protocol.range for w in capable),
            ),
        )

    offered = {cap for w in workers for cap in w.capabilities}
    code = "capability.unavailable"
    return DispatchBlocked(
        code=code,
        reason="blocked: no compatible worker" + _requires_suffix(required),
        requires=required,
        diagnostics=DispatchDiagnostics(
            code=code,
            token=token,
            requires=required,
            live_workers=len(workers),
            control_plane=cp,
            workers=workers,
            missing_capabilities=tuple(cap for cap in required if cap not in offered),
        ),
    )


def control_plane_descriptor(
    engine_instance_id: str, namespace: str | None, *, sdk_version: str = "0"
) -> WorkerDescriptor:
    """The descriptor the engine negotiates as. A control plane routes work and executes none
    through this handshake, so it offers no capabilities and serves no workflows or steps; it
    states the protocol band it speaks so a worker on another major is caught before dispatch.
    The default namespace is left out, as workers leave it out."""
    return WorkerDescriptor(
        instance_id=f"cp-{engine_instance_id}",
        runtime="python",
        sdk=SdkInfo(name=CONTROL_PLANE_SDK_NAME, version=sdk_version),
        protocol=ProtocolBand(
            version=CURRENT_PROTOCOL_VERSION,
            low=CURRENT_PROTOCOL_VERSION,
            high=CURRENT_PROTOCOL_VERSION,
        ),
        capabilities=(),
        workflows=(),
        steps=(),
        namespace=namespace if namespace not in (None, "", "default") else None,
        started_at=0,
    )
