"""The handshake: reading and writing worker descriptors, their hash, liveness values,
negotiation, dispatch planning, and what the live workers announce (directory and onError routes).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durably._core.handshake import (
    LEGACY_V1_CAPABILITIES,
    LEGACY_V1_PROTOCOL,
    UNKNOWN_SDK,
    AnnouncedWorkflow,
    Disagreement,
    DispatchBlocked,
    DispatchRoutable,
    HeartbeatSighting,
    OnErrorRouteWire,
    ProtocolBand,
    RouteDecision,
    SdkInfo,
    WorkerDescriptor,
    WorkflowRegistration,
    aggregate,
    announced_on_error_routes,
    announcements_of,
    can_route,
    canonical_descriptor_json,
    canonical_routes,
    control_plane_descriptor,
    covered_tokens,
    descriptor_hash,
    descriptor_to_json,
    descriptor_to_wire,
    fnv1a64_utf16,
    is_legacy_descriptor,
    negotiate,
    normalize_descriptor,
    observed_announcements,
    parse_heartbeat_value,
    plan_dispatch,
    required_capabilities,
)
from durably._core.wire import WireFormatError


def worker(instance_id: str = "w1", **fields: Any) -> WorkerDescriptor:
    """A modern worker descriptor (protocol 1, the given capabilities) as read off the wire."""
    raw: dict[str, Any] = {
        "instanceId": instance_id,
        "runtime": "python",
        "protocol": {"version": 1, "range": [1, 1]},
        "capabilities": ["saga", "signals"],
        "startedAt": 1000,
    }
    raw.update(fields)
    return normalize_descriptor(raw)


def route(workflow: str, code: str | None = None) -> OnErrorRouteWire:
    return OnErrorRouteWire(workflow=workflow, code=code)


# ------------------------------------------------------------------ normalize


def test_a_descriptor_without_handshake_fields_reads_as_the_original_protocol() -> None:
    raw = {"instanceId": "legacy-1", "runtime": "python"}
    d = normalize_descriptor(raw)
    assert is_legacy_descriptor(raw)
    assert d == WorkerDescriptor(instance_id="legacy-1", runtime="python")
    assert d.protocol == LEGACY_V1_PROTOCOL == ProtocolBand(1, 1, 1)
    assert d.capabilities == LEGACY_V1_CAPABILITIES
    assert "search-attr-v2" not in d.capabilities
    assert d.sdk == UNKNOWN_SDK == SdkInfo("unknown", "0")
    assert (d.workflows, d.steps, d.started_at) == ((), (), 0)
    assert (d.registrations, d.partition, d.namespace) == (None, None, None)


def test_an_explicit_empty_capability_list_is_kept() -> None:
    raw = {"instanceId": "m", "runtime": "node", "protocol": {"version": 1, "range": [1, 1]}}
    assert not is_legacy_descriptor(raw)
    assert normalize_descriptor({**raw, "capabilities": []}).capabilities == ()
    assert normalize_descriptor(raw).capabilities == LEGACY_V1_CAPABILITIES


def test_null_reads_as_absent_and_unknown_keys_are_ignored() -> None:
    nulls = {
        key: None
        for key in (
            "sdk",
            "protocol",
            "capabilities",
            "workflows",
            "steps",
            "registrations",
            "partition",
            "namespace",
            "startedAt",
        )
    }
    d = normalize_descriptor({"instanceId": "n", "runtime": "node", **nulls, "later": [1, 2]})
    assert d == WorkerDescriptor(instance_id="n", runtime="node")


def test_registrations_absent_and_empty_are_different_statements() -> None:
    assert normalize_descriptor({"instanceId": "a", "runtime": "node"}).registrations is None
    announces_none = normalize_descriptor(
        {"instanceId": "a", "runtime": "node", "registrations": []}
    )
    assert announces_none.registrations == ()


def test_set_fields_keep_their_received_order_and_members() -> None:
    d = worker(workflows=["b", "a", "a"], steps=["z", "y"], capabilities=["signals", "saga"])
    assert d.workflows == ("b", "a", "a")
    assert d.steps == ("z", "y")
    assert d.capabilities == ("signals", "saga")


def test_a_registration_keeps_only_what_it_states() -> None:
    d = worker(
        workflows=["line", "plain"],
        registrations=[
            {
                "name": "line",
                "version": "2",
                "group": "line@acme",
                "requires": ["saga"],
                "origin": "pkg",
                "onError": [{"code": "bad", "workflow": "h1"}, {"workflow": "h2", "code": None}],
            },
            {"name": "plain"},
        ],
    )
    assert d.registrations == (
        WorkflowRegistration(
            name="line",
            version="2",
            group="line@acme",
            requires=("saga",),
            origin="pkg",
            on_error=(route("h1", "bad"), route("h2")),
        ),
        WorkflowRegistration(name="plain"),
    )


def test_json_text_and_bytes_are_read_too() -> None:
    raw = {"instanceId": "t", "runtime": "node", "workflows": ["注文"]}
    expected = normalize_descriptor(raw)
    assert normalize_descriptor(json.dumps(raw)) == expected
    assert normalize_descriptor(json.dumps(raw, ensure_ascii=False).encode()) == expected


GARBAGE: list[tuple[object, str, str | None]] = [
    ("{not json", "not JSON", None),
    (b"\xff\xfe", "not UTF-8", None),
    ("[1, 2]", "not a JSON object", None),
    (42, "not a JSON object", None),
    ({"runtime": "node"}, "`instanceId` must be a non-empty string", None),
    ({"instanceId": "", "runtime": "node"}, "`instanceId`", None),
    ({"instanceId": 7, "runtime": "node"}, "`instanceId`", None),
    ({"instanceId": "g"}, "`runtime` must be a non-empty string", "g"),
    ({"instanceId": "g", "runtime": 1}, "`runtime`", "g"),
    ({"instanceId": "g", "runtime": "node", "sdk": "x"}, "`sdk` must be an object", "g"),
    ({"instanceId": "g", "runtime": "node", "sdk": {"name": "x"}}, "`sdk` must have", "g"),
    ({"instanceId": "g", "runtime": "node", "protocol": 1}, "`protocol` must be an object", "g"),
    (
        {"instanceId": "g", "runtime": "node", "protocol": {"version": True, "range": [1, 1]}},
        "`protocol.version` must be an integer",
        "g",
    ),
    (
        {"instanceId": "g", "runtime": "node", "protocol": {"version": 1, "range": [1]}},
        "`protocol.range` must be a list of two integers",
        "g",
    ),
    (
        {"instanceId": "g", "runtime": "node", "protocol": {"version": 1, "range": [1, 1.5]}},
        "`protocol.range`",
        "g",
    ),
    (
        {"instanceId": "g", "runtime": "node", "capabilities": "saga"},
        "`capabilities` must be a list of strings",
        "g",
    ),
    ({"instanceId": "g", "runtime": "node", "workflows": ["a", 1]}, "`workflows`", "g"),
    ({"instanceId": "g", "runtime": "node", "workflows": ""}, "`workflows`", "g"),
    ({"instanceId": "g", "runtime": "node", "steps": {"a": 1}}, "`steps`", "g"),
    ({"instanceId": "g", "runtime": "node", "startedAt": -1}, "`startedAt`", "g"),
    ({"instanceId": "g", "runtime": "node", "startedAt": 1.5}, "`startedAt`", "g"),
    ({"instanceId": "g", "runtime": "node", "startedAt": False}, "`startedAt`", "g"),
    ({"instanceId": "g", "runtime": "node", "partition": 3}, "`partition` must be a string", "g"),
    ({"instanceId": "g", "runtime": "node", "namespace": []}, "`namespace`", "g"),
    ({"instanceId": "g", "runtime": "node", "registrations": {}}, "`registrations` must be", "g"),
    ({"instanceId": "g", "runtime": "node", "registrations": ["x"]}, "`registrations[0]`", "g"),
    (
        {"instanceId": "g", "runtime": "node", "registrations": [{"name": "a"}, {"version": "1"}]},
        "`registrations[1].name` must be a non-empty string",
        "g",
    ),
    (
        {"instanceId": "g", "runtime": "node", "registrations": [{"name": "a", "version": 2}]},
        "`registrations[0].version` must be a string",
        "g",
    ),
    (
        {"instanceId": "g", "runtime": "node", "registrations": [{"name": "a", "requires": "s"}]},
        "`registrations[0].requires`",
        "g",
    ),
    (
        {"instanceId": "g", "runtime": "node", "registrations": [{"name": "a", "onError": {}}]},
        "`registrations[0].onError` must be a list",
        "g",
    ),
    (
        {
            "instanceId": "g",
            "runtime": "node",
            "registrations": [{"name": "a", "onError": [{"workflow": "h"}, {"code": "c"}]}],
        },
        "`registrations[0].onError[1].workflow` must be a non-empty string",
        "g",
    ),
    (
        {
            "instanceId": "g",
            "runtime": "node",
            "registrations": [{"name": "a", "onError": [{"workflow": "h", "code": 5}]}],
        },
        "`registrations[0].onError[0].code` must be a string",
        "g",
    ),
]


@pytest.mark.parametrize(("raw", "problem", "instance_id"), GARBAGE)
def test_garbage_is_refused_naming_the_problem(
    raw: object, problem: str, instance_id: str | None
) -> None:
    with pytest.raises(WireFormatError) as caught:
        normalize_descriptor(raw)
    assert caught.value.kind == "worker descriptor"
    assert problem in caught.value.problem
    assert caught.value.message_id == instance_id
    assert problem in str(caught.value)


# ------------------------------------------------------------------ writing


def test_the_wire_form_has_every_key_in_the_published_order() -> None:
    d = worker(
        workflows=["w"],
        registrations=[{"name": "w"}],
        partition="p",
        namespace="n",
    )
    assert list(descriptor_to_wire(d)) == [
        "instanceId",
        "runtime",
        "sdk",
        "protocol",
        "capabilities",
        "workflows",
        "steps",
        "registrations",
        "partition",
        "namespace",
        "startedAt",
    ]
    assert list(descriptor_to_wire(d)["protocol"]) == ["version", "range"]


def test_unset_optional_fields_are_left_out() -> None:
    wire = descriptor_to_wire(WorkerDescriptor(instance_id="a", runtime="node"))
    assert wire == {
        "instanceId": "a",
        "runtime": "node",
        "sdk": {"name": "unknown", "version": "0"},
        "protocol": {"version": 1, "range": [1, 1]},
        "capabilities": list(LEGACY_V1_CAPABILITIES),
        "workflows": [],
        "steps": [],
        "startedAt": 0,
    }


def test_a_registration_writes_only_stated_fields_in_order() -> None:
    reg = WorkflowRegistration(
        name="n", origin="o", on_error=(route("h", "c"), route("all")), version="1"
    )
    assert json.dumps(reg.to_json()) == (
        '{"name": "n", "version": "1", "origin": "o", '
        '"onError": [{"code": "c", "workflow": "h"}, {"workflow": "all"}]}'
    )
    assert WorkflowRegistration(name="bare").to_json() == {"name": "bare"}


def test_published_text_is_pythons_default_json_layout() -> None:
    d = worker(workflows=["注文"])
    text = descriptor_to_json(d)
    assert text == json.dumps(descriptor_to_wire(d))
    assert '"instanceId": "w1", "runtime": "python"' in text
    assert "\\u6ce8\\u6587" in text
    assert normalize_descriptor(text) == d


# ------------------------------------------------------------------ hash


def test_fnv_matches_the_reference_vectors_for_ascii() -> None:
    # For ASCII every code unit's high byte is zero, so the hash is plain 64-bit FNV-1a.
    assert fnv1a64_utf16("") == "cbf29ce484222325"
    assert fnv1a64_utf16("a") == "af63dc4c8601ec8c"
    assert fnv1a64_utf16("foobar") == "85944171f73967e8"


def fnv_over_units(units: list[int]) -> str:
    h = 0xCBF29CE484222325
    for unit in units:
        h ^= unit & 0xFF
        h ^= unit >> 8
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def test_fnv_folds_both_bytes_of_each_utf16_code_unit() -> None:
    assert fnv1a64_utf16("€") == fnv_over_units([0x20AC])
    # An astral character is two code units (a surrogate pair), as JavaScript sees it.
    assert fnv1a64_utf16("😀") == fnv_over_units([0xD83D, 0xDE00])
    assert fnv1a64_utf16("€") != fnv1a64_utf16("\xac ")


def test_the_hashed_text_is_the_fixed_canonical_projection() -> None:
    d = worker(
        capabilities=["signals", "saga", "saga"],
        workflows=["b", "a"],
        registrations=[
            {"name": "b", "requires": ["y", "x", "y"], "onError": [{"workflow": "h"}]},
            {"name": "a", "version": "1"},
        ],
        namespace="ns",
    )
    assert canonical_descriptor_json(d) == (
        '{"instanceId":"w1","runtime":"python","sdk":{"name":"unknown","version":"0"},'
        '"protocol":{"version":1,"range":[1,1]},"capabilities":["saga","signals"],'
        '"workflows":["a","b"],"steps":[],"registrations":['
        '{"name":"a","version":"1","group":null,"requires":null,"origin":null},'
        '{"name":"b","version":null,"group":null,"requires":["x","y"],"origin":null,'
        '"onError":[{"code":null,"workflow":"h"}]}],'
        '"partition":null,"namespace":"ns","startedAt":1000}'
    )
    assert descriptor_hash(d) == fnv1a64_utf16(canonical_descriptor_json(d))


def test_the_hash_is_sixteen_lowercase_hex_digits() -> None:
    assert re.fullmatch(r"[0-9a-f]{16}", descriptor_hash(worker()))


@pytest.mark.parametrize(
    "change",
    [
        {"instanceId": "w2"},
        {"runtime": "node"},
        {"sdk": {"name": "x", "version": "1"}},
        {"protocol": {"version": 2, "range": [1, 2]}},
        {"capabilities": ["saga"]},
        {"workflows": ["w"]},
        {"steps": ["s"]},
        {"registrations": []},
        {"registrations": [{"name": "w"}]},
        {"registrations": [{"name": "w", "onError": []}]},
        {"partition": "p"},
        {"partition": ""},
        {"namespace": "n"},
        {"startedAt": 1001},
    ],
)
def test_any_change_of_content_changes_the_hash(change: dict[str, Any]) -> None:
    assert descriptor_hash(worker(**change)) != descriptor_hash(worker())


def test_a_registration_without_routes_keeps_the_hash_it_had_before_routes_existed() -> None:
    d = worker(registrations=[{"name": "w"}])
    assert '"onError"' not in canonical_descriptor_json(d)
    with_routes = worker(registrations=[{"name": "w", "onError": [{"workflow": "h"}]}])
    assert descriptor_hash(with_routes) != descriptor_hash(d)


def test_a_lone_surrogate_is_hashed_as_its_json_escape_instead_of_failing() -> None:
    # Read off the wire such a descriptor is refused (its strings reach stored diagnostics,
    # which a lone surrogate makes unwritable); one built here still hashes as JS does.
    with pytest.raises(WireFormatError, match="lone surrogate"):
        normalize_descriptor('{"instanceId": "a\\ud800", "runtime": "node"}')
    d = WorkerDescriptor(instance_id="a\ud800", runtime="node")
    assert d.instance_id == "a\ud800"
    assert '"instanceId":"a\\ud800"' in canonical_descriptor_json(d)
    assert re.fullmatch(r"[0-9a-f]{16}", descriptor_hash(d))


def test_route_lists_are_compared_as_sets() -> None:
    a = canonical_routes([route("h2"), route("h1", "b"), route("h0", "a"), route("h2")])
    assert a == (route("h0", "a"), route("h1", "b"), route("h2"))
    assert canonical_routes(reversed(a)) == a


# The upstream golden fixtures (descriptor.json → 44c6793c8eb7089f,
# descriptor-registrations.json → 8923307c940a5dde) are not shipped here: they are not part of
# the published SDK. Compatibility of the hash is proven instead against the SDK itself on
# hundreds of descriptors (test_handshake_sdk.py).


# ------------------------------------------------------------------ heartbeat values


@pytest.mark.parametrize(
    ("raw", "beat"),
    [
        ('{"ts": 1752710460000}', 1752710460000),
        (b'{"ts": 1752710460000, "status": {"inFlight": 0}}', 1752710460000),
        ('{"ts": 1752710460}', 1752710460000),
        ('{"ts": 1752710460.5}', 1752710460500),
        ("1752710460000", 1752710460000),
        ("  1752710460 \n", 1752710460000),
        (b"1752710460000", 1752710460000),
        ("1.7527e9", 1752700000000),
        (None, 0),
        ("", 0),
        ("garbage", 0),
        ("inf", 0),
        ("nan", 0),
        ("1_000", 0),
        ("-5", 0),
        ("{broken", 0),
        ("{}", 0),
        ('{"ts": "1752710460000"}', 0),
        ('{"ts": true}', 0),
        ('{"ts": 1e400}', 0),
        (b"\xff", 0),
        ("[1752710460000]", 0),
    ],
)
def test_the_beat_time_is_read_in_every_form(raw: str | bytes | None, beat: int) -> None:
    assert parse_heartbeat_value(raw).last_beat_ms == beat


def test_status_and_descriptor_hash_are_read_when_present() -> None:
    status = {"runtime": "python", "concurrency": {"mode": "fixed", "limit": 1}, "inFlight": 0}
    raw = json.dumps({"ts": 1700000000000, "status": status, "descriptorHash": "44c6793c8eb7089f"})
    assert parse_heartbeat_value(raw) == (1700000000000, status, "44c6793c8eb7089f")
    assert parse_heartbeat_value('{"ts": 1700000000000}') == (1700000000000, None, None)
    # The compact form's status is a lifecycle word, not an execution status.
    compact = '{"ts": 1700000000000, "status": "up", "descriptorHash": "abc"}'
    assert parse_heartbeat_value(compact) == (1700000000000, None, "abc")
    assert parse_heartbeat_value('{"ts": 1, "descriptorHash": 7}').descriptor_hash is None


# ------------------------------------------------------------------ negotiation


def test_full_parity_is_compatible() -> None:
    result = negotiate(worker("a"), worker("b"))
    assert result.outcome == "compatible"
    assert result.negotiated_protocol == 1
    assert result.shared == ("saga", "signals")
    assert result.reason_code is None
    assert "reason" not in result.to_json()


def test_no_protocol_overlap_is_incompatible_before_capabilities_are_looked_at() -> None:
    remote = worker("b", protocol={"version": 2, "range": [2, 3]}, capabilities=["x"])
    result = negotiate(worker("a"), remote, required=["y"])
    assert result.outcome == "incompatible"
    assert result.negotiated_protocol is None
    assert result.to_json()["reason"] == {
        "code": "protocol.incompatible",
        "message": "no common protocol major: local speaks [1, 1], remote speaks [2, 3]",
        "detail": {"localRange": [1, 1], "remoteRange": [2, 3]},
    }


def test_a_missing_required_capability_degrades() -> None:
    result = negotiate(worker("a"), worker("b"), required=["z", "saga", "y", "z"])
    assert result.outcome == "degraded"
    assert result.missing_required == ("y", "z")
    assert result.to_json()["reason"] == {
        "code": "capability.unavailable",
        "message": "remote is missing required capability(ies): y, z",
        "detail": {"missingRequired": ["y", "z"], "missingOnRemote": [], "missingOnLocal": []},
    }


def test_an_asymmetry_either_way_degrades_and_reads_the_same_from_both_sides() -> None:
    a = worker("a", capabilities=["saga", "signals", "priority"])
    b = worker("b", capabilities=["saga", "queries"])
    ab, ba = negotiate(a, b), negotiate(b, a)
    assert ab.outcome == ba.outcome == "degraded"
    assert ab.missing_on_remote == ba.missing_on_local == ("priority", "signals")
    assert ab.missing_on_local == ba.missing_on_remote == ("queries",)
    assert ab.reason_message == (
        "capability mismatch: remote lacks priority, signals; local lacks queries"
    )
    assert ab.to_json()["reason"]["detail"] == {
        "missingOnRemote": ["priority", "signals"],
        "missingOnLocal": ["queries"],
    }


def test_the_agreed_protocol_is_the_highest_major_both_speak() -> None:
    a = worker("a", protocol={"version": 2, "range": [1, 2]})
    b = worker("b", protocol={"version": 3, "range": [1, 3]})
    assert negotiate(a, b).negotiated_protocol == 2


def test_legacy_peers_negotiate_as_compatible() -> None:
    a = normalize_descriptor({"instanceId": "a", "runtime": "node"})
    b = normalize_descriptor({"instanceId": "b", "runtime": "python"})
    assert negotiate(a, b).outcome == "compatible"


def test_the_control_plane_against_any_worker_is_degraded_but_dispatchable() -> None:
    cp = control_plane_descriptor("e1", None)
    assert negotiate(cp, worker()).outcome == "degraded"


# ------------------------------------------------------------------ routing


def test_required_capabilities_drop_duplicates_keeping_order() -> None:
    assert required_capabilities(["b", "a", "b"]) == ("b", "a")


def test_can_route_needs_every_required_capability() -> None:
    w = worker(capabilities=["saga", "priority"])
    assert can_route(["saga", "priority"], w)
    assert not can_route(["saga", "search-attr-v2"], w)
    assert can_route([], w)
    legacy = normalize_descriptor({"instanceId": "l", "runtime": "python"})
    assert can_route(["entities"], legacy)
    assert not can_route(["search-attr-v2"], legacy)


CP = control_plane_descriptor("engine-1", "acme")


def test_a_capable_compatible_worker_makes_the_work_routable() -> None:
    capable = worker("w1", capabilities=["saga", "search-attr-v2"])
    other = worker("w2")
    v2 = worker("w3", capabilities=["search-attr-v2"], protocol={"version": 2, "range": [2, 2]})
    plan = plan_dispatch(["search-attr-v2"], [capable, other, v2], CP, "orders")
    assert plan == DispatchRoutable(workers=(capable,))
    assert plan.status == "routable"


def test_nobody_offering_the_capability_blocks_naming_what_is_missing() -> None:
    workers = [worker("w1"), worker("w2", capabilities=["priority"])]
    plan = plan_dispatch(["search-attr-v2", "saga", "search-attr-v2", "x"], workers, CP, "orders")
    assert isinstance(plan, DispatchBlocked)
    assert plan.code == "capability.unavailable"
    assert plan.reason == "blocked: no compatible worker (requires search-attr-v2, saga, x)"
    assert plan.requires == ("search-attr-v2", "saga", "x")
    diagnostics = plan.to_json()["diagnostics"]
    assert list(diagnostics) == [
        "code",
        "token",
        "requires",
        "liveWorkers",
        "missingCapabilities",
        "controlPlane",
        "workers",
    ]
    assert diagnostics["code"] == "capability.unavailable"
    assert diagnostics["token"] == "orders"
    assert diagnostics["liveWorkers"] == 2
    # `saga` is offered by one worker, so it is not missing, though nobody offers all three.
    assert diagnostics["missingCapabilities"] == ["search-attr-v2", "x"]
    assert diagnostics["controlPlane"] == descriptor_to_wire(CP)
    assert diagnostics["workers"] == [descriptor_to_wire(w) for w in workers]


def test_stored_diagnostics_list_a_bounded_number_of_workers() -> None:
    # The diagnostics are stored with the run; anyone can publish descriptors on a token.
    workers = [worker(f"w{i}") for i in range(40)]
    plan = plan_dispatch(["gpu"], workers, CP, "orders")
    assert isinstance(plan, DispatchBlocked)
    diagnostics = plan.to_json()["diagnostics"]
    assert diagnostics["liveWorkers"] == 40
    assert diagnostics["workers"] == [descriptor_to_wire(w) for w in workers[:16]]


def test_capable_workers_on_another_protocol_block_as_protocol_incompatible() -> None:
    v2 = worker("v2", capabilities=["saga"], protocol={"version": 2, "range": [2, 3]})
    incapable = worker("old", capabilities=[])
    plan = plan_dispatch(["saga"], [v2, incapable], CP, "orders@acme")
    assert isinstance(plan, DispatchBlocked)
    assert plan.code == "protocol.incompatible"
    assert plan.reason == "blocked: no protocol-compatible worker (requires saga)"
    diagnostics = plan.to_json()["diagnostics"]
    assert list(diagnostics) == [
        "code",
        "token",
        "requires",
        "liveWorkers",
        "controlPlaneRange",
        "workerRanges",
        "controlPlane",
        "workers",
    ]
    assert diagnostics["controlPlaneRange"] == [1, 1]
    assert diagnostics["workerRanges"] == [[2, 3]]
    assert diagnostics["liveWorkers"] == 2


def test_work_requiring_nothing_blocks_without_a_requires_suffix() -> None:
    plan = plan_dispatch([], [worker(protocol={"version": 2, "range": [2, 2]})], CP, "t")
    assert isinstance(plan, DispatchBlocked)
    assert plan.reason == "blocked: no protocol-compatible worker"
    assert plan.to_json()["status"] == "blocked"


def test_planning_needs_at_least_one_live_descriptor() -> None:
    with pytest.raises(ValueError, match="at least one live descriptor"):
        plan_dispatch([], [], CP, "t")


def test_the_control_plane_descriptor() -> None:
    cp = control_plane_descriptor("engine-1", "acme", sdk_version="0.1.0")
    assert descriptor_to_wire(cp) == {
        "instanceId": "cp-engine-1",
        "runtime": "python",
        "sdk": {"name": "durably", "version": "0.1.0"},
        "protocol": {"version": 1, "range": [1, 1]},
        "capabilities": [],
        "workflows": [],
        "steps": [],
        "namespace": "acme",
        "startedAt": 0,
    }
    for namespace in (None, "", "default"):
        assert control_plane_descriptor("e", namespace).namespace is None
    assert announcements_of(cp) == ()


# ------------------------------------------------------------------ announcements


def test_a_descriptor_announces_its_registrations_and_its_uncovered_names() -> None:
    d = worker(
        "w1",
        workflows=["a", "b", "c", "c"],
        registrations=[{"name": "a", "version": "2"}, {"name": "z"}],
    )
    announced = announcements_of(d)
    assert [(a.name, a.version) for a in announced] == [
        ("a", "2"),
        ("z", None),
        ("b", None),
        ("c", None),
    ]
    assert {(a.instance_id, a.runtime) for a in announced} == {("w1", "python")}


def test_aggregate_folds_by_name_and_version_and_reports_each_disagreement() -> None:
    w1 = worker(
        "w1",
        runtime="node",
        workflows=["pipe"],
        registrations=[
            {
                "name": "pipe",
                "version": "2",
                "group": "g1",
                "origin": "o1",
                "requires": ["b", "a"],
                "onError": [{"workflow": "h"}, {"code": "c", "workflow": "hc"}],
            }
        ],
    )
    w2 = worker(
        "w2",
        workflows=["pipe"],
        registrations=[
            {
                "name": "pipe",
                "version": "2",
                "group": "g2",
                "origin": "o2",
                "requires": ["c"],
                "onError": [{"workflow": "other"}],
            }
        ],
    )
    (entry,) = aggregate([w1, w2, w1])
    assert entry.key == "pipe@2"
    assert entry.version == "2"
    assert entry.groups == ("g1", "g2")
    assert entry.origins == ("o1", "o2")
    assert entry.requires == (("a", "b"), ("c",))
    assert entry.on_error == ((route("hc", "c"), route("h")), (route("other"),))
    assert entry.runtimes == ("node", "python")
    assert entry.instances == ("w1", "w2")
    assert entry.disagreements == (
        Disagreement("group", ("g1", "g2")),
        Disagreement("origin", ("o1", "o2")),
        Disagreement("requires", ("a,b", "c")),
        Disagreement(
            "onError",
            (
                '[{"code":"c","workflow":"hc"},{"code":null,"workflow":"h"}]',
                '[{"code":null,"workflow":"other"}]',
            ),
        ),
    )
    assert entry.to_json()["onError"] == [
        [{"code": "c", "workflow": "hc"}, {"workflow": "h"}],
        [{"workflow": "other"}],
    ]


def test_silence_and_the_same_set_written_differently_are_not_disagreements() -> None:
    stated = worker(
        "w1",
        registrations=[
            {"name": "p", "group": "g", "requires": ["a", "b"], "onError": [{"workflow": "h"}]}
        ],
    )
    reordered = worker(
        "w2",
        registrations=[
            {
                "name": "p",
                "group": "g",
                "requires": ["b", "a", "a"],
                "onError": [{"workflow": "h"}, {"workflow": "h"}],
            }
        ],
    )
    silent = worker("w3", workflows=["p"])
    (entry,) = aggregate([stated, reordered, silent])
    assert entry.disagreements == ()
    assert entry.requires == (("a", "b"),)
    assert entry.on_error == ((route("h"),),)
    assert entry.instances == ("w1", "w2", "w3")


def test_aggregate_keeps_versions_apart_and_sorts_by_key() -> None:
    d = worker(
        workflows=["b", "a@1"],
        registrations=[{"name": "a", "version": "1"}, {"name": "a", "version": "2"}, {"name": "b"}],
    )
    entries = aggregate([d])
    assert [(e.key, e.name, e.version) for e in entries] == [
        ("a@1", "a", "1"),
        ("a@1", "a@1", None),
        ("a@2", "a", "2"),
        ("b", "b", None),
    ]
    assert all(e.evidence == "declared" for e in entries)
    assert "version" not in entries[1].to_json()


def test_heartbeats_no_descriptor_explains_become_observed_entries() -> None:
    d = worker(
        "w1",
        workflows=["orders:fulfill"],
        registrations=[{"name": "orders:fulfill", "group": "fulfil-q"}],
        steps=["billing:charge"],
        partition="acme",
    )
    announced = aggregate([d])
    covered = covered_tokens(announced, [d])
    assert covered == {"orders-fulfill", "fulfil-q", "billing-charge", "billing-charge@acme"}
    sightings = [
        HeartbeatSighting("orders-fulfill", "w1"),
        HeartbeatSighting("billing-charge@acme", "w1"),
        HeartbeatSighting("legacy-flow", "old-2"),
        HeartbeatSighting("legacy-flow", "old-1"),
        HeartbeatSighting("legacy-flow", "old-1"),
        HeartbeatSighting("", "nobody"),
    ]
    assert observed_announcements(sightings, covered) == (
        AnnouncedWorkflow(
            evidence="observed",
            key="legacy-flow",
            name="legacy-flow",
            version=None,
            groups=("legacy-flow",),
            origins=(),
            requires=(),
            on_error=(),
            runtimes=(),
            instances=("old-1", "old-2"),
            disagreements=(),
        ),
    )


# ------------------------------------------------------------------ announced onError routes


def line_worker(
    instance_id: str, routes: list[dict[str, str]] | None, **reg: Any
) -> WorkerDescriptor:
    registration: dict[str, Any] = {"name": "line", **reg}
    if routes is not None:
        registration["onError"] = routes
    return worker(instance_id, workflows=["line"], registrations=[registration])


def test_one_announced_route_set_is_used() -> None:
    routes = [{"code": "invalid_line", "workflow": "rejected"}, {"workflow": "dlq"}]
    decision = announced_on_error_routes(
        [line_worker("w1", routes), line_worker("w2", list(reversed(routes)))], "line", "1"
    )
    assert decision == RouteDecision(routes=(route("rejected", "invalid_line"), route("dlq")))


def test_an_unversioned_announcement_counts_for_any_version() -> None:
    decision = announced_on_error_routes([line_worker("w1", [{"workflow": "h"}])], "line", "1")
    assert decision.routes == (route("h"),)


def test_announcements_of_another_version_or_workflow_are_ignored() -> None:
    descriptors = [
        line_worker("w1", [{"workflow": "h-v2"}], version="2"),
        line_worker("w2", [{"workflow": "h-v1"}], version="1"),
        worker("w3", registrations=[{"name": "other", "onError": [{"workflow": "x"}]}]),
    ]
    assert announced_on_error_routes(descriptors, "line", "1").routes == (route("h-v1"),)
    assert announced_on_error_routes(descriptors, "line", "3") == RouteDecision()


def test_no_stated_routes_means_no_routing() -> None:
    descriptors = [line_worker("w1", None), worker("w2", workflows=["line"])]
    assert announced_on_error_routes(descriptors, "line", "1") == RouteDecision()
    assert announced_on_error_routes([], "line", "1") == RouteDecision()


def test_a_worker_stating_no_routes_does_not_disagree_with_one_that_does() -> None:
    descriptors = [line_worker("w1", None), line_worker("w2", [{"workflow": "h"}])]
    assert announced_on_error_routes(descriptors, "line", "1").routes == (route("h"),)


def test_different_route_sets_route_nothing_and_say_why() -> None:
    descriptors = [
        line_worker("old-1", [{"workflow": "dlq"}]),
        line_worker("new-1", [{"code": "bad", "workflow": "rejected"}, {"workflow": "dlq"}]),
        line_worker("old-2", [{"workflow": "dlq"}], version="1"),
    ]
    decision = announced_on_error_routes(descriptors, "line", "1")
    assert decision.routes == ()
    assert decision.unrouted == (
        "the live workers of line (version 1) announce 2 different onError route sets: "
        '[{"code":"bad","workflow":"rejected"},{"code":null,"workflow":"dlq"}] from new-1; '
        '[{"code":null,"workflow":"dlq"}] from old-1, old-2; not routing until they agree'
    )


def test_an_explicitly_empty_route_set_disagrees_with_a_stated_one() -> None:
    descriptors = [line_worker("w1", []), line_worker("w2", [{"workflow": "h"}])]
    decision = announced_on_error_routes(descriptors, "line", "1")
    assert decision.routes == () and decision.unrouted is not None
    assert announced_on_error_routes([line_worker("w1", [])], "line", "1") == RouteDecision()


# ------------------------------------------------------------------ properties

names = st.text(min_size=1, max_size=8)
name_lists = st.lists(names, max_size=5)
routes_st = st.lists(
    st.fixed_dictionaries({"workflow": names}, optional={"code": names}), max_size=4
)
registration_st = st.fixed_dictionaries(
    {"name": names},
    optional={
        "version": names,
        "group": names,
        "origin": names,
        "requires": name_lists,
        "onError": routes_st,
    },
)
raw_descriptors = st.fixed_dictionaries(
    {"instanceId": names, "runtime": st.sampled_from(["node", "python"])},
    optional={
        "sdk": st.fixed_dictionaries({"name": names, "version": names}),
        "protocol": st.integers(0, 5).flatmap(
            lambda low: st.fixed_dictionaries(
                {
                    "version": st.integers(0, 9),
                    "range": st.tuples(st.just(low), st.integers(low, 9)),
                }
            )
        ),
        "capabilities": name_lists,
        "workflows": name_lists,
        "steps": name_lists,
        "registrations": st.lists(registration_st, max_size=4),
        "partition": names,
        "namespace": names,
        "startedAt": st.integers(0, 2**53 - 1),  # beyond: refused (not exact in JS)
    },
).map(lambda raw: json.loads(json.dumps(raw)))


@settings(max_examples=200, deadline=None)
@given(raw=raw_descriptors)
def test_normalize_is_idempotent_through_the_wire(raw: dict[str, Any]) -> None:
    d = normalize_descriptor(raw)
    assert normalize_descriptor(descriptor_to_wire(d)) == d
    assert normalize_descriptor(descriptor_to_json(d)) == d
    assert descriptor_hash(normalize_descriptor(descriptor_to_json(d))) == descriptor_hash(d)


@settings(max_examples=200, deadline=None)
@given(raw=raw_descriptors, data=st.data())
def test_the_hash_ignores_the_order_and_repetition_of_set_members(
    raw: dict[str, Any], data: st.DataObject
) -> None:
    shuffled = dict(raw)
    for key in ("capabilities", "workflows", "steps"):
        if key in raw:
            members = list(raw[key])
            if members:
                members += data.draw(st.lists(st.sampled_from(members), max_size=3))
            shuffled[key] = data.draw(st.permutations(members))
    if "registrations" in raw:
        regs = []
        for reg in raw["registrations"]:
            reg = dict(reg)
            if "requires" in reg:
                reg["requires"] = data.draw(st.permutations(reg["requires"] * 2))
            if "onError" in reg:
                reg["onError"] = data.draw(st.permutations(reg["onError"] + reg["onError"][:1]))
            regs.append(reg)
        shuffled["registrations"] = data.draw(st.permutations(regs + regs[:1]))
    # Key order of the JSON object does not matter either.
    shuffled = dict(reversed(list(shuffled.items())))
    assert descriptor_hash(normalize_descriptor(shuffled)) == descriptor_hash(
        normalize_descriptor(raw)
    )


@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(st.text(), st.binary(), st.none()))
def test_reading_a_heartbeat_value_never_raises(raw: str | bytes | None) -> None:
    value = parse_heartbeat_value(raw)
    assert value.last_beat_ms >= 0


@settings(max_examples=100, deadline=None)
@given(routes=routes_st, data=st.data())
def test_announced_routes_agree_across_reorderings(
    routes: list[dict[str, str]], data: st.DataObject
) -> None:
    reordered = data.draw(st.permutations(routes))
    decision = announced_on_error_routes(
        [line_worker("w1", routes), line_worker("w2", reordered)], "line", "1"
    )
    assert decision.unrouted is None
    assert set(decision.routes) == {route(r["workflow"], r.get("code")) for r in routes}
