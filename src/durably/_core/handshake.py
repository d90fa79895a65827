"""The worker handshake, in one import.

Remote workers publish a descriptor of themselves next to a liveness heartbeat; the engine reads
them to decide whether work can be dispatched to a token (capabilities and protocol), to list the
workflows the deployment serves, and to find the onError routes of a workflow it serves by
convention. Everything here is pure: no transport, no store, no clock.

- `handshake_descriptor`: the descriptor objects, reading them off the wire
  (`normalize_descriptor`), writing them (`descriptor_to_wire`, `descriptor_to_json`), the content
  hash (`descriptor_hash`) and the liveness key value (`parse_heartbeat_value`);
- `handshake_routing`: `negotiate`, `can_route`, `plan_dispatch`, `control_plane_descriptor`;
- `handshake_announce`: `announcements_of`, `aggregate`, the observed tier and
  `announced_on_error_routes`.
"""

from __future__ import annotations

from durably._core.handshake_announce import (
    AnnouncedWorkflow,
    Disagreement,
    DisagreementAxis,
    Evidence,
    HeartbeatSighting,
    RouteDecision,
    WorkflowAnnouncement,
    aggregate,
    announced_on_error_routes,
    announcements_of,
    covered_tokens,
    observed_announcements,
)
from durably._core.handshake_descriptor import (
    CURRENT_PROTOCOL_VERSION,
    DESCRIPTOR_KIND,
    LEGACY_V1_CAPABILITIES,
    LEGACY_V1_PROTOCOL,
    MAX_DESCRIPTOR_BYTES,
    MAX_HEARTBEAT_BYTES,
    UNKNOWN_SDK,
    HeartbeatValue,
    OnErrorRouteWire,
    ProtocolBand,
    SdkInfo,
    WorkerDescriptor,
    WorkflowRegistration,
    canonical_descriptor_json,
    canonical_routes,
    descriptor_hash,
    descriptor_to_json,
    descriptor_to_wire,
    fnv1a64_utf16,
    is_legacy_descriptor,
    normalize_descriptor,
    parse_heartbeat_value,
    read_heartbeat_value,
    route_set_json,
    routes_to_json,
)
from durably._core.handshake_routing import (
    CONTROL_PLANE_SDK_NAME,
    BlockCode,
    DispatchBlocked,
    DispatchDiagnostics,
    DispatchPlan,
    DispatchRoutable,
    Negotiation,
    NegotiationOutcome,
    can_route,
    control_plane_descriptor,
    negotiate,
    plan_dispatch,
    required_capabilities,
)

__all__ = [
    "CONTROL_PLANE_SDK_NAME",
    "CURRENT_PROTOCOL_VERSION",
    "DESCRIPTOR_KIND",
    "LEGACY_V1_CAPABILITIES",
    "LEGACY_V1_PROTOCOL",
    "MAX_DESCRIPTOR_BYTES",
    "MAX_HEARTBEAT_BYTES",
    "UNKNOWN_SDK",
    "AnnouncedWorkflow",
    "BlockCode",
    "Disagreement",
    "DisagreementAxis",
    "DispatchBlocked",
    "DispatchDiagnostics",
    "DispatchPlan",
    "DispatchRoutable",
    "Evidence",
    "HeartbeatSighting",
    "HeartbeatValue",
    "Negotiation",
    "NegotiationOutcome",
    "OnErrorRouteWire",
    "ProtocolBand",
    "RouteDecision",
    "SdkInfo",
    "WorkerDescriptor",
    "WorkflowAnnouncement",
    "WorkflowRegistration",
    "aggregate",
    "announced_on_error_routes",
    "announcements_of",
    "can_route",
    "canonical_descriptor_json",
    "canonical_routes",
    "control_plane_descriptor",
    "covered_tokens",
    "descriptor_hash",
    "descriptor_to_json",
    "descriptor_to_wire",
    "fnv1a64_utf16",
    "is_legacy_descriptor",
    "negotiate",
    "normalize_descriptor",
    "observed_announcements",
    "parse_heartbeat_value",
    "plan_dispatch",
    "read_heartbeat_value",
    "required_capabilities",
    "route_set_json",
    "routes_to_json",
]
