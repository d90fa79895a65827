"""Worker descriptors: what a worker process says about itself, read off the wire.

A worker publishes a descriptor (identity, the protocol band it speaks, its feature capabilities,
the workflows and steps it serves, and optionally a richer announcement per workflow) next to a
small liveness heartbeat that carries only a content hash of that descriptor. A reader re-reads
the descriptor when the hash changes. The published `durable-worker` SDK and the TypeScript SDKs
write these shapes, so key names, key order, the defaults for missing fields and the hash algorithm
must match them byte for byte.

Descriptors come from other processes and are untrusted: `normalize_descriptor` fills the defaults
an older SDK leaves out and refuses anything that is not a descriptor with a `WireFormatError`
naming the problem, so a caller can log it and skip that one worker.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn, TypeGuard

from durably._core.bounds import (
    MAX_WIRE_INT,
    PayloadRejectedError,
    check_json_value,
    loads_untrusted,
)
from durably._core.wire import WireFormatError

__all__ = [
    "CURRENT_PROTOCOL_VERSION",
    "DESCRIPTOR_KIND",
    "LEGACY_V1_CAPABILITIES",
    "LEGACY_V1_PROTOCOL",
    "MAX_DESCRIPTOR_BYTES",
    "MAX_HEARTBEAT_BYTES",
    "UNKNOWN_SDK",
    "HeartbeatValue",
    "OnErrorRouteWire",
    "ProtocolBand",
    "SdkInfo",
    "WorkerDescriptor",
    "WorkflowRegistration",
    "canonical_descriptor_json",
    "canonical_routes",
    "descriptor_hash",
    "descriptor_to_json",
    "descriptor_to_wire",
    "fnv1a64_utf16",
    "is_legacy_descriptor",
    "normalize_descriptor",
    "parse_heartbeat_value",
    "read_heartbeat_value",
    "route_set_json",
    "routes_to_json",
]

# The kind named in a WireFormatError for a descriptor that cannot be read.
DESCRIPTOR_KIND = "worker descriptor"

MAX_DESCRIPTOR_BYTES = 256 * 1024
"""The largest descriptor value read (bytes of JSON). A real one is a few KiB even with
hundreds of workflows; a bigger value is skipped unread (and a transport does not fetch it)."""

MAX_HEARTBEAT_BYTES = 64 * 1024
"""The largest liveness value read (bytes): a timestamp, a status object and a hash are well
under a KiB. A bigger value is not parsed: the key then counts as a beat without a value."""

# The only protocol major that exists. The band is carried at all so that a future breaking
# protocol is detected at the handshake instead of corrupting runs.
CURRENT_PROTOCOL_VERSION = 1


@dataclass(frozen=True, slots=True)
class SdkInfo:
    """Which SDK wrote a descriptor. Shown to operators; never decides anything."""

    name: str
    version: str


@dataclass(frozen=True, slots=True)
class ProtocolBand:
    """The protocol majors a side speaks: its preferred `version` and the inclusive range
    `[low, high]` it can negotiate within. Two sides can talk when their ranges overlap."""

    version: int
    low: int
    high: int

    @property
    def range(self) -> tuple[int, int]:
        return (self.low, self.high)


# What a descriptor without a `protocol` field is taken to speak: a worker written before the
# handshake existed speaks the original protocol and is assumed compatible.
LEGACY_V1_PROTOCOL = ProtocolBand(version=1, low=1, high=1)

# What a descriptor without a `capabilities` field is taken to offer: the features every worker of
# the original protocol already had. Kept in this exact order because every SDK advertises the list
# in this order and the published bytes are compared. `search-attr-v2` is a later feature and
# deliberately not part of it.
LEGACY_V1_CAPABILITIES: tuple[str, ...] = (
    "saga",
    "signals",
    "search-attributes",
    "priority",
    "entities",
    "child-workflows",
    "singleton",
    "schedules",
    "continue-as-new",
    "queries",
    "cancellation",
)

# The marker for a descriptor that does not say which SDK wrote it.
UNKNOWN_SDK = SdkInfo(name="unknown", version="0")


@dataclass(frozen=True, slots=True)
class OnErrorRouteWire:
    """Where a failed run goes, as a worker announces it: failures whose error `code` equals
    `code` start the workflow `workflow` instead of failing; no `code` catches every other code."""

    workflow: str
    code: str | None = None

    def to_json(self) -> dict[str, str]:
        # `code` first, as durable-worker's inline handlers write it; omitted for the catch-all.
        out: dict[str, str] = {}
        if self.code is not None:
            out["code"] = self.code
        out["workflow"] = self.workflow
        return out


@dataclass(frozen=True, slots=True)
class WorkflowRegistration:
    """One workflow a worker announces it can execute. Every field but `name` is optional, and an
    absent field means "not stated": a reader must never turn it into a default, because a wrong
    version or origin is worse than none."""

    name: str
    version: str | None = None
    group: str | None = None
    requires: tuple[str, ...] | None = None
    origin: str | None = None
    on_error: tuple[OnErrorRouteWire, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.version is not None:
            out["version"] = self.version
        if self.group is not None:
            out["group"] = self.group
        if self.requires is not None:
            out["requires"] = list(self.requires)
        if self.origin is not None:
            out["origin"] = self.origin
        if self.on_error is not None:
            out["onError"] = routes_to_json(self.on_error)
        return out


@dataclass(frozen=True, slots=True)
class WorkerDescriptor:
    """A worker's (or a control plane's) descriptor, with every default already filled in.

    The defaults are the ones `normalize_descriptor` fills for a field a descriptor leaves out, so
    `WorkerDescriptor(instance_id=i, runtime=r)` is what a bare `{instanceId, runtime}` reads as.
    `capabilities`, `workflows` and `steps` are sets on the wire; they keep the order they were
    received in so the descriptor can be written back byte for byte, and everything that compares
    them treats them as sets. `registrations` None means the worker does not announce any (an older
    SDK, or a worker with steps only); an empty tuple means it announces that it serves none."""

    instance_id: str
    runtime: str
    sdk: SdkInfo = UNKNOWN_SDK
    protocol: ProtocolBand = LEGACY_V1_PROTOCOL
    capabilities: tuple[str, ...] = LEGACY_V1_CAPABILITIES
    workflows: tuple[str, ...] = ()
    steps: tuple[str, ...] = ()
    registrations: tuple[WorkflowRegistration, ...] | None = None
    partition: str | None = None
    namespace: str | None = None
    started_at: int = 0


# ------------------------------------------------------------------ reading


def _fail(problem: str, instance_id: str | None) -> NoReturn:
    raise WireFormatError(DESCRIPTOR_KIND, problem, instance_id)


def _as_object(raw: object) -> Mapping[str, Any]:
    # Text is parsed with the shared bounds (at most MAX_DESCRIPTOR_BYTES, 128 levels, no
    # NaN, no lone surrogate: a descriptor's strings end up in stored `run.blocked`
    # diagnostics, which a lone surrogate would make unwritable); an object already parsed is
    # checked the same way, so no caller's value can exhaust the recursion of a later encode.
    if isinstance(raw, (bytes, bytearray)):
        if len(raw) > MAX_DESCRIPTOR_BYTES:
            _fail(f"{len(raw)} bytes, over the limit of {MAX_DESCRIPTOR_BYTES}", None)
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            _fail("not UTF-8 text", None)
    try:
        if isinstance(raw, str):
            raw = loads_untrusted(raw, what=DESCRIPTOR_KIND, max_bytes=MAX_DESCRIPTOR_BYTES)
        elif isinstance(raw, Mapping):
            check_json_value(DESCRIPTOR_KIND, dict(raw))
    except PayloadRejectedError as exc:
        _fail(exc.problem, None)
    if not isinstance(raw, Mapping):
        _fail("not a JSON object", None)
    return raw


def _is_int(value: object) -> TypeGuard[int]:
    # bool is an int in Python but never a number on the wire; nor is one beyond what a
    # JavaScript worker can represent (a 1e300 written as an integer).
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_WIRE_INT


def _or_empty(value: object) -> object:
    return [] if value is None else value


def _string_list(value: object, where: str, instance_id: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        _fail(f"`{where}` must be a list of strings", instance_id)
    return tuple(value)


def _optional_string(raw: Mapping[str, Any], key: str, where: str, instance_id: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        _fail(f"`{where}{key}` must be a string", instance_id)
    return value


def _sdk(value: object, instance_id: str) -> SdkInfo:
    # An empty object counts as absent, as durable-worker reads it.
    if value is None or (isinstance(value, Mapping) and not value):
        return UNKNOWN_SDK
    if not isinstance(value, Mapping):
        _fail("`sdk` must be an object", instance_id)
    name, version = value.get("name"), value.get("version")
    if not isinstance(name, str) or not isinstance(version, str):
        _fail("`sdk` must have string `name` and `version`", instance_id)
    return SdkInfo(name=name, version=version)


def _protocol(value: object, instance_id: str) -> ProtocolBand:
    # An empty object counts as absent, as durable-worker reads it.
    if value is None or (isinstance(value, Mapping) and not value):
        return LEGACY_V1_PROTOCOL
    if not isinstance(value, Mapping):
        _fail("`protocol` must be an object", instance_id)
    version, band = value.get("version"), value.get("range")
    if not _is_int(version):
        _fail("`protocol.version` must be an integer", instance_id)
    if not isinstance(band, list) or len(band) != 2 or not all(_is_int(b) for b in band):
        _fail("`protocol.range` must be a list of two integers", instance_id)
    return ProtocolBand(version=version, low=band[0], high=band[1])


def _route(value: object, where: str, instance_id: str) -> OnErrorRouteWire:
    if not isinstance(value, Mapping):
        _fail(f"`{where}` must be an object", instance_id)
    workflow = value.get("workflow")
    if not isinstance(workflow, str) or not workflow:
        _fail(f"`{where}.workflow` must be a non-empty string", instance_id)
    code = _optional_string(value, "code", f"{where}.", instance_id)
    return OnErrorRouteWire(workflow=workflow, code=code)


def _registration(value: object, where: str, instance_id: str) -> WorkflowRegistration:
    if not isinstance(value, Mapping):
        _fail(f"`{where}` must be an object", instance_id)
    name = value.get("name")
    if not isinstance(name, str) or not name:
        _fail(f"`{where}.name` must be a non-empty string", instance_id)
    prefix = f"{where}."
    requires = value.get("requires")
    routes = value.get("onError")
    if routes is not None and not isinstance(routes, list):
        _fail(f"`{where}.onError` must be a list", instance_id)
    return WorkflowRegistration(
        name=name,
        version=_optional_string(value, "version", prefix, instance_id),
        group=_optional_string(value, "group", prefix, instance_id),
        requires=(
            None if requires is None else _string_list(requires, f"{where}.requires", instance_id)
        ),
        origin=_optional_string(value, "origin", prefix, instance_id),
        on_error=(
            None
            if routes is None
            else tuple(
                _route(route, f"{where}.onError[{i}]", instance_id)
                for i, route in enumerate(routes)
            )
        ),
    )


def normalize_descriptor(raw: object) -> WorkerDescriptor:
    """A descriptor from its JSON (an object, or JSON text), with the defaults an older SDK leaves
    out: no `protocol` is the original protocol, no `capabilities` is the original feature set
    (an explicit empty list is kept: a newer SDK that offers nothing), no `workflows`/`steps` is
    none, no `sdk` is the unknown marker, no `startedAt` is 0. `registrations`, `partition` and
    `namespace` stay absent when absent. JSON null reads as absent. Unknown keys are ignored.

    Raises `WireFormatError` for anything that is not a descriptor: not an object, no
    `instanceId` or `runtime`, or a field of the wrong type."""
    data = _as_object(raw)
    instance_id = data.get("instanceId")
    if not isinstance(instance_id, str) or not instance_id:
        _fail("`instanceId` must be a non-empty string", None)
    runtime = data.get("runtime")
    # Any runtime name is accepted: it is shown to operators, and a worker of a runtime this
    # engine has not heard of still speaks the same protocol.
    if not isinstance(runtime, str) or not runtime:
        _fail("`runtime` must be a non-empty string", instance_id)

    capabilities = data.get("capabilities")
    registrations = data.get("registrations")
    if registrations is not None and not isinstance(registrations, list):
        _fail("`registrations` must be a list", instance_id)
    started_at = data.get("startedAt")
    if started_at is None:
        started_at = 0
    elif not _is_int(started_at) or started_at < 0:
        _fail("`startedAt` must be a non-negative integer (at most 2**53 - 1)", instance_id)

    return WorkerDescriptor(
        instance_id=instance_id,
        runtime=runtime,
        sdk=_sdk(data.get("sdk"), instance_id),
        protocol=_protocol(data.get("protocol"), instance_id),
        capabilities=(
            LEGACY_V1_CAPABILITIES
            if capabilities is None
            else _string_list(capabilities, "capabilities", instance_id)
        ),
        workflows=_string_list(_or_empty(data.get("workflows")), "workflows", instance_id),
        steps=_string_list(_or_empty(data.get("steps")), "steps", instance_id),
        registrations=(
            None
            if registrations is None
            else tuple(
                _registration(reg, f"registrations[{i}]", instance_id)
                for i, reg in enumerate(registrations)
            )
        ),
        partition=_optional_string(data, "partition", "", instance_id),
        namespace=_optional_string(data, "namespace", "", instance_id),
        started_at=started_at,
    )


def is_legacy_descriptor(raw: Mapping[str, Any]) -> bool:
    """True when a raw descriptor predates the handshake (it has no `protocol`); such a worker
    is taken to speak the original protocol and is assumed compatible."""
    return raw.get("protocol") is None


# ------------------------------------------------------------------ writing


def routes_to_json(routes: Iterable[OnErrorRouteWire]) -> list[dict[str, str]]:
    return [route.to_json() for route in routes]


def descriptor_to_wire(d: WorkerDescriptor) -> dict[str, Any]:
    """The descriptor as its JSON object, keys in the order every SDK writes them. Optional
    `registrations`, `partition` and `namespace` are left out when unset, so a worker that
    announces nothing keeps the bytes (and hash) it had before those fields existed."""
    out: dict[str, Any] = {
        "instanceId": d.instance_id,
        "runtime": d.runtime,
        "sdk": {"name": d.sdk.name, "version": d.sdk.version},
        "protocol": {"version": d.protocol.version, "range": [d.protocol.low, d.protocol.high]},
        "capabilities": list(d.capabilities),
        "workflows": list(d.workflows),
        "steps": list(d.steps),
    }
    if d.registrations is not None:
        out["registrations"] = [reg.to_json() for reg in d.registrations]
    if d.partition is not None:
        out["partition"] = d.partition
    if d.namespace is not None:
        out["namespace"] = d.namespace
    out["startedAt"] = d.started_at
    return out


def descriptor_to_json(d: WorkerDescriptor) -> str:
    """The descriptor as the text durable-worker stores under its descriptor key (Python's default
    `json.dumps` layout), so a descriptor durably publishes is indistinguishable from one the
    published SDK publishes. Readers only parse it; the hash never depends on this layout."""
    return json.dumps(descriptor_to_wire(d))


# ------------------------------------------------------------------ the content hash

# A lone UTF-16 surrogate (one without its partner) in a string.
_LONE_SURROGATE = re.compile(
    "[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]"
)


def _compact(value: object) -> str:
    """Compact JSON with non-ASCII characters written as themselves: the text JavaScript's
    `JSON.stringify` produces for the same value, which is what every SDK hashes. A lone surrogate
    is written as a `\\uXXXX` escape, as `JSON.stringify` does, instead of failing to encode."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _as_set(values: Iterable[str]) -> list[str]:
    # By code point, as durable-worker sorts. The TypeScript SDKs sort by UTF-16 code unit, which
    # orders differently only between a character above U+FFFF and one in U+E000-U+FFFF.
    return sorted(set(values))


def _canonical_route(route: OnErrorRouteWire) -> dict[str, Any]:
    return {"code": route.code, "workflow": route.workflow}


def canonical_routes(routes: Iterable[OnErrorRouteWire]) -> tuple[OnErrorRouteWire, ...]:
    """A route list as a set: duplicates dropped, ordered by each route's compact JSON with a null
    `code` for the catch-all. Two lists naming the same routes in any order become equal, which
    is how the hash and the comparison of announcements treat them."""
    by_json = {_compact(_canonical_route(route)): route for route in routes}
    return tuple(by_json[key] for key in sorted(by_json))


def route_set_json(routes: Iterable[OnErrorRouteWire]) -> str:
    """A route list's canonical compact JSON (`code` null for the catch-all): how two route sets
    are compared, ordered and shown."""
    return _compact([_canonical_route(route) for route in canonical_routes(routes)])


def _canonical_registrations(regs: Iterable[WorkflowRegistration]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for reg in regs:
        entry: dict[str, Any] = {
            "name": reg.name,
            "version": reg.version,
            "group": reg.group,
            "requires": None if reg.requires is None else _as_set(reg.requires),
            "origin": reg.origin,
        }
        # Only when routes are stated, so a registration without routes keeps the hash it had
        # before routes could be announced.
        if reg.on_error is not None:
            entry["onError"] = [_canonical_route(r) for r in canonical_routes(reg.on_error)]
        entries.append(entry)
    by_json = {_compact(entry): entry for entry in entries}
    return [by_json[key] for key in sorted(by_json)]


def _canonical(d: WorkerDescriptor) -> dict[str, Any]:
    out: dict[str, Any] = {
        "instanceId": d.instance_id,
        "runtime": d.runtime,
        "sdk": {"name": d.sdk.name, "version": d.sdk.version},
        "protocol": {"version": d.protocol.version, "range": [d.protocol.low, d.protocol.high]},
        "capabilities": _as_set(d.capabilities),
        "workflows": _as_set(d.workflows),
        "steps": _as_set(d.steps),
    }
    # The one key that is left out rather than written as null: descriptors that do not announce
    # registrations keep the hash every SDK published before the field existed.
    if d.registrations is not None:
        out["registrations"] = _canonical_registrations(d.registrations)
    out["partition"] = d.partition
    out["namespace"] = d.namespace
    out["startedAt"] = d.started_at
    return out


def canonical_descriptor_json(d: WorkerDescriptor) -> str:
    """The text the descriptor hash is computed over: fixed key order, sets sorted and
    de-duplicated, unset optional fields as null."""
    return _compact(_canonical(d))


_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK_64 = 0xFFFFFFFFFFFFFFFF


def fnv1a64_utf16(text: str) -> str:
    """64-bit FNV-1a over a string's UTF-16 code units, as 16 lowercase hex digits."""
    # JavaScript strings are UTF-16; the TypeScript SDKs fold each code unit's low byte and then
    # its high byte into the hash before multiplying. UTF-16-LE bytes, two at a time, are exactly
    # those bytes in that order (a character outside the BMP is two code units).
    units = text.encode("utf-16-le", "surrogatepass")
    h = _FNV_OFFSET
    for i in range(0, len(units), 2):
        h ^= units[i]
        h ^= units[i + 1]
        h = (h * _FNV_PRIME) & _MASK_64
    return format(h, "016x")


def descriptor_hash(d: WorkerDescriptor) -> str:
    """The descriptor's content hash (16 lowercase hex digits), the value a worker's heartbeat
    carries as `descriptorHash`. The same members of a set in any order, or a different key order
    in the JSON, give the same hash; any change of content, including a restart (`startedAt`),
    gives another."""
    return fnv1a64_utf16(canonical_descriptor_json(d))


# ------------------------------------------------------------------ liveness heartbeats


class HeartbeatValue(NamedTuple):
    """What a worker-liveness key says: when the worker last beat (epoch ms, 0 when the value is
    unreadable), its execution status object if it sent one, and its descriptor hash if it sent
    one."""

    last_beat_ms: int
    status: dict[str, Any] | None
    descriptor_hash: str | None


# Timestamps below this are in seconds: older workers wrote epoch seconds, and no epoch-ms time
# since 2001 is this small.
_EPOCH_MS_THRESHOLD = 1e12

# A plain decimal number; Python's float() would also take "inf", "nan" and "1_000".
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def _beat_ms(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    if value <= 0:
        return 0
    ms = value * 1000 if value < _EPOCH_MS_THRESHOLD else value
    # A time no worker can mean (beyond 2**53 ms, some 285,000 years) reads as unknown.
    return int(ms) if ms <= MAX_WIRE_INT else 0


def parse_heartbeat_value(raw: str | bytes | None) -> HeartbeatValue:
    """Read a worker-liveness key. The current value is JSON `{"ts", "status"?, "descriptorHash"?}`;
    older workers wrote a bare number, and some wrote seconds instead of milliseconds (any time
    below 1e12 is seconds). Nothing here raises: the key's existence already says the worker is
    alive, so an unreadable value only loses the beat time (0) and the extras."""
    return read_heartbeat_value(raw)[0]


def read_heartbeat_value(raw: str | bytes | None) -> tuple[HeartbeatValue, str | None]:
    """`parse_heartbeat_value`, and why the value could not be read (None when it could, or
    when it is absent). Never raises: a value over `MAX_HEARTBEAT_BYTES`, nested deeper than
    128 levels, holding NaN or a lone surrogate, or not JSON reads as no value."""
    empty = HeartbeatValue(0, None, None)
    if raw is None:
        return empty, None
    if len(raw) > MAX_HEARTBEAT_BYTES:
        return empty, f"{len(raw)} bytes, over the {MAX_HEARTBEAT_BYTES} a liveness value may hold"
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            return empty, "not UTF-8 text"
    text = raw.strip()
    if not text.startswith("{"):
        if _NUMBER.fullmatch(text):
            return HeartbeatValue(_beat_ms(float(text)), None, None), None
        return empty, "neither a JSON object nor a number"
    try:
        data = loads_untrusted(text, what="liveness value", max_bytes=MAX_HEARTBEAT_BYTES)
    except PayloadRejectedError as exc:
        return empty, exc.problem
    if not isinstance(data, dict):
        return empty, "not a JSON object"
    status = data.get("status")
    descriptor = data.get("descriptorHash")
    value = HeartbeatValue(
        _beat_ms(data.get("ts")),
        # A lifecycle word ("up") is not an execution status; only the object form is.
        status if isinstance(status, dict) else None,
        descriptor if isinstance(descriptor, str) and descriptor else None,
    )
    return value, None
