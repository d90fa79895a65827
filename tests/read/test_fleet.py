"""Worker health and the workflow directory from what live workers publish: reading their
self-reported status leniently, matching each liveness entry to its descriptor, telling
workflow tokens from step tokens, the alert case, the directory's disagreements, namespace
filtering and observed tokens — and the JSON of the new fields, pinned."""

# ruff: noqa: E501  (the pinned JSON texts are kept on one line each)
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from durably import GroupHealth
from durably._core.handshake import (
    LEGACY_V1_CAPABILITIES,
    OnErrorRouteWire,
    ProtocolBand,
    SdkInfo,
    WorkerDescriptor,
    WorkflowRegistration,
    descriptor_hash,
    descriptor_to_wire,
)
from durably._read.fleet import (
    MAX_FLEET_GROUPS,
    MAX_LISTED,
    FleetRead,
    description_of,
    fleet_groups,
    parse_descriptors,
    tokens_to_measure,
    worker_status_of,
    workflow_directory,
)
from durably._read.list_models import (
    PartitionSighting,
    WorkerConcurrency,
    WorkerDescription,
    WorkerHeartbeat,
    WorkerStatus,
    WorkflowDirectory,
)


@dataclass(frozen=True)
class Beat:
    token: str
    instance_id: str
    last_beat_at: int = 1_000
    status: dict[str, Any] | None = None
    descriptor_hash: str | None = None


SDK_STATUS = {
    "runtime": "python",
    "concurrency": {"mode": "fixed", "limit": 4},
    "inFlight": 2,
    "rssBytes": 52_000_000,
    "memory": {"source": "cgroup", "idleUsageBytes": 1},
}

SDK_WORKER = WorkerDescriptor(
    instance_id="py-host-7",
    runtime="python",
    sdk=SdkInfo("durable-worker", "0.26.1"),
    capabilities=LEGACY_V1_CAPABILITIES,
    workflows=("orders.place", "orders.place.onError.refund"),
    steps=("orders:charge",),
    registrations=(
        WorkflowRegistration(
            name="orders.place",
            version="2",
            group="orders.place",
            on_error=(OnErrorRouteWire("orders.place.onError.refund", "declined"),),
        ),
    ),
    started_at=1_700_000_000_000,
)


# ------------------------------------------------------------------ status


def test_a_durable_worker_status_reads_without_its_extras() -> None:
    status = worker_status_of(SDK_STATUS)
    assert status == WorkerStatus(
        concurrency=WorkerConcurrency(mode="fixed", limit=4),
        in_flight=2,
        runtime="python",
        rss_bytes=52_000_000,
    )
    assert "memory" not in json.dumps(status.to_json() if status else None)


def test_an_adaptive_status_keeps_its_band_and_last_adjustment() -> None:
    status = worker_status_of(
        {
            "concurrency": {"mode": "adaptive", "limit": 6, "min": 1, "max": 16},
            "inFlight": 5,
            "p95Ms": 12.5,
            "lastAdjust": {"at": 9, "from": 4, "to": 6, "reason": "grow", "secret": {"x": 1}},
        }
    )
    assert status is not None
    assert status.concurrency == WorkerConcurrency(mode="adaptive", limit=6, min=1, max=16)
    assert status.in_flight == 5 and status.p95_ms == 12.5
    assert status.last_adjust == {"at": 9, "from": 4, "to": 6, "reason": "grow"}


@pytest.mark.parametrize(
    "raw",
    [None, {}, {"ts": 5}, {"concurrency": "lots"}, {"inFlight": True}, {"inFlight": 1.5}],
)
def test_a_status_that_states_no_load_is_absent(raw: Any) -> None:
    assert worker_status_of(raw) is None


def test_wrongly_typed_fields_read_as_absent() -> None:
    status = worker_status_of(
        {
            "runtime": "cobol",
            "concurrency": {"mode": "turbo", "limit": "8", "min": True},
            "inFlight": 3,
            "rssBytes": "big",
            "cpuPct": float("nan"),
            "throughputPerMin": float("inf"),
            "lastAdjust": ["not", "an", "object"],
        }
    )
    assert status == WorkerStatus(concurrency=WorkerConcurrency(mode="fixed", limit=0), in_flight=3)


# ------------------------------------------------------------------ groups


def test_descriptors_that_cannot_be_read_are_skipped() -> None:
    good = descriptor_to_wire(SDK_WORKER)
    assert parse_descriptors([good, "{not json", {"runtime": "python"}, 7]) == (SDK_WORKER,)


def test_each_entry_finds_its_descriptor_by_hash_then_by_instance() -> None:
    durably_server = WorkerDescriptor(
        instance_id="durably-41-abc",  # the engine's id; its liveness key names the process
        runtime="python",
        sdk=SdkInfo("durably", "0.1.0"),
        capabilities=("gpu",),
        steps=("resize",),
    )
    read = FleetRead(
        "default",
        beats=(
            Beat(
                "resize",
                "durably-host-41",
                status={"concurrency": {"limit": 3}, "inFlight": 1},
                descriptor_hash=descriptor_hash(durably_server),
            ),
            Beat("orders-charge", "py-host-7", status=SDK_STATUS),  # no hash: by instance id
            Beat("orders.place", "py-host-7", descriptor_hash="0000000000000000"),  # stale hash
            Beat("legacy", "old-worker", last_beat_at=0),
        ),
        descriptors=(SDK_WORKER, durably_server),
        depths={"resize": 0, "orders-charge": 3, "orders.place": 0, "legacy": 0},
    )
    groups = {g.group: g for g in fleet_groups(read)}
    assert list(groups) == ["legacy", "orders-charge", "orders.place", "resize"]
    [resize] = groups["resize"].live_workers
    assert resize.instance_id == "durably-host-41"
    assert resize.descriptor == description_of(durably_server)
    assert resize.status is not None and resize.status.in_flight == 1
    assert groups["resize"].kind == "step" and groups["resize"].transport == "default"

    [charge] = groups["orders-charge"].live_workers
    assert charge.descriptor is not None and charge.descriptor.sdk == "durable-worker"
    assert groups["orders-charge"].kind == "step"  # `orders:charge` lives on `orders-charge`
    assert groups["orders-charge"].depth == 3 and not groups["orders-charge"].alert
    assert groups["orders.place"].kind == "workflow"
    assert groups["orders.place"].live_workers[0].descriptor is not None

    [legacy] = groups["legacy"].live_workers
    assert legacy.descriptor is None and legacy.status is None and legacy.last_beat_at == 0
    assert groups["legacy"].kind is None


def test_partitioned_and_namespaced_tokens_are_recognised() -> None:
    partitioned = WorkerDescriptor(
        instance_id="py-a", runtime="python", workflows=("bill",), steps=("ship",), partition="acme"
    )
    namespaced = WorkerDescriptor(
        instance_id="durably-b", runtime="python", steps=("pack:box",), namespace="tenant-9"
    )
    read = FleetRead(
        "default",
        beats=(
            Beat("bill@acme", "py-a"),
            Beat("ship@acme", "py-a"),
            Beat("pack-box@tenant-9", "durably-b"),
        ),
        descriptors=(partitioned, namespaced),
        depths={"bill@acme": 0, "ship@acme": 0, "pack-box@tenant-9": 0},
    )
    kinds = {g.group: g.kind for g in fleet_groups(read)}
    assert kinds == {"bill@acme": "workflow", "ship@acme": "step", "pack-box@tenant-9": "step"}


def test_a_known_token_with_a_backlog_and_nobody_serving_it_is_the_alert() -> None:
    read = FleetRead(
        "redis",
        beats=(Beat("served", "w-1"),),
        depths={"served": 0, "ghost": 4, "idle": 0},
    )
    groups = fleet_groups(read, workflow_tokens={"ghost", "idle"})
    assert [(g.group, g.depth, g.kind, g.alert) for g in groups] == [
        ("ghost", 4, "workflow", True),
        ("served", 0, None, False),
    ]


def test_a_transport_that_could_not_be_read_lists_no_group() -> None:
    assert fleet_groups(FleetRead("default", error="ConnectionError: refused")) == []


def test_the_tokens_measured_are_capped() -> None:
    beats = [Beat(f"t{i:05d}", "w") for i in range(MAX_FLEET_GROUPS + 5)]
    tokens = tokens_to_measure(beats, ["a-known"])
    assert len(tokens) == MAX_FLEET_GROUPS and tokens[0] == "a-known"


def test_a_worker_listing_too_much_is_cut() -> None:
    huge = WorkerDescriptor(
        instance_id="w", runtime="node", steps=tuple(f"s{i}" for i in range(MAX_LISTED + 50))
    )
    assert len(description_of(huge).steps) == MAX_LISTED


# ------------------------------------------------------------------ the directory


def _other_worker(routes: tuple[OnErrorRouteWire, ...]) -> WorkerDescriptor:
    reg = SDK_WORKER.registrations[0] if SDK_WORKER.registrations else None
    assert reg is not None
    return WorkerDescriptor(
        instance_id="py-host-8",
        runtime="python",
        sdk=SDK_WORKER.sdk,
        workflows=SDK_WORKER.workflows,
        steps=SDK_WORKER.steps,
        registrations=(
            WorkflowRegistration(
                name=reg.name, version=reg.version, group=reg.group, on_error=routes
            ),
        ),
    )


def test_the_directory_reports_workers_that_disagree_on_on_error_routes() -> None:
    other = _other_worker((OnErrorRouteWire("orders.place.onError.refund", "expired"),))
    read = FleetRead(
        "default",
        beats=(Beat("orders.place", "py-host-7"), Beat("orders.place", "py-host-8")),
        descriptors=(SDK_WORKER, other),
    )
    directory = workflow_directory([read], namespace="default")
    [place] = [w for w in directory.workflows if w.key == "orders.place@2"]
    assert place.instances == ("py-host-7", "py-host-8")
    assert [(d.axis, len(d.values)) for d in place.disagreements] == [("onError", 2)]
    assert directory.disagreements == (place,)
    assert directory.supported
    assert "disagree on orders.place@2" in directory.detail
    # the bare claim the `workflows` list makes for the handler, and no observed leftovers
    assert {w.key for w in directory.workflows} == {"orders.place@2", "orders.place.onError.refund"}


def test_the_same_routes_in_another_order_are_no_disagreement() -> None:
    routes = (OnErrorRouteWire("h1", "a"), OnErrorRouteWire("h2", "b"))
    one = _other_worker(routes)
    two = WorkerDescriptor(
        instance_id="py-host-9",
        runtime="python",
        workflows=one.workflows,
        registrations=(
            WorkflowRegistration(
                name="orders.place", version="2", group="orders.place", on_error=routes[::-1]
            ),
        ),
    )
    directory = workflow_directory([FleetRead("default", descriptors=(one, two))], namespace=None)
    assert directory.disagreements == ()


def test_a_namespaced_engine_sees_its_namespace_and_counts_the_others() -> None:
    acme = WorkerDescriptor(
        instance_id="py-acme",
        runtime="python",
        workflows=("bill",),
        registrations=(WorkflowRegistration(name="bill", group="bill@acme"),),
        partition="acme",
        namespace="acme",
    )
    read = FleetRead(
        "default",
        beats=(
            Beat("orders.place", "py-host-7"),
            Beat("bill@acme", "py-acme"),
            Beat("report@acme", "old-acme"),  # no descriptor: observed
        ),
        descriptors=(SDK_WORKER, acme),
    )
    mine = workflow_directory([read], namespace="acme")
    assert [(w.key, w.evidence) for w in mine.workflows] == [
        ("bill", "declared"),
        ("report@acme", "observed"),
    ]
    assert mine.other_partitions == (
        PartitionSighting(partition="default", groups=("orders.place",), instances=("py-host-7",)),
    )
    assert "other partitions: default (1 token, 1 worker)" in mine.detail
    # an operator's engine (no namespace) keeps everything
    everything = workflow_directory([read], namespace=None)
    assert everything.other_partitions == ()
    assert {"bill", "orders.place@2", "report@acme"} <= {w.key for w in everything.workflows}


def test_what_the_detail_says() -> None:
    assert not workflow_directory([], namespace="default").supported
    assert "No transport of this engine" in workflow_directory([], namespace="default").detail
    quiet = workflow_directory([FleetRead("default")], namespace="default")
    assert quiet.supported and quiet.workflows == ()
    assert quiet.detail == "No live worker announces a workflow."
    broken = workflow_directory(
        [FleetRead("primary"), FleetRead("backup", error="TransportUnavailableError: down")],
        namespace="default",
    )
    assert broken.detail.endswith(
        "Transport 'backup' could not be read: TransportUnavailableError: down"
    )


# ------------------------------------------------------------------ JSON


DESCRIPTION = WorkerDescription(
    runtime="python",
    sdk="durable-worker",
    sdk_version="0.26.1",
    protocol=1,
    protocol_range=(1, 1),
    capabilities=("saga", "signals"),
    workflows=("orders.place",),
    steps=("orders:charge",),
    partition="acme",
    namespace="tenant-9",
    started_at=1_700_000_000_000,
)
FLEET_GROUP = GroupHealth(
    group="orders-charge",
    depth=3,
    live_workers=(
        WorkerHeartbeat(
            group="orders-charge",
            instance_id="py-host-7",
            last_beat_at=1234,
            status=WorkerStatus(concurrency=WorkerConcurrency("fixed", 4), in_flight=2),
            descriptor=DESCRIPTION,
        ),
    ),
    kind="step",
    transport="default",
)

PINNED = {
    "worker_description_full": '{"runtime": "python", "sdk": "durable-worker", "sdkVersion": "0.26.1", "protocol": 1, "protocolRange": [1, 1], "capabilities": ["saga", "signals"], "workflows": ["orders.place"], "steps": ["orders:charge"], "partition": "acme", "namespace": "tenant-9", "startedAt": 1700000000000}',
    "worker_description_min": '{"runtime": "node", "sdk": "unknown", "sdkVersion": "0", "protocol": 1, "protocolRange": [1, 1], "capabilities": [], "workflows": [], "steps": [], "startedAt": 0}',
    "group_health_fleet": '{"group": "orders-charge", "depth": 3, "liveWorkers": [{"group": "orders-charge", "instanceId": "py-host-7", "lastBeatAt": 1234, "status": {"concurrency": {"mode": "fixed", "limit": 4}, "inFlight": 2}, "descriptor": {"runtime": "python", "sdk": "durable-worker", "sdkVersion": "0.26.1", "protocol": 1, "protocolRange": [1, 1], "capabilities": ["saga", "signals"], "workflows": ["orders.place"], "steps": ["orders:charge"], "partition": "acme", "namespace": "tenant-9", "startedAt": 1700000000000}}], "kind": "step", "transport": "default"}',
    "partition_sighting": '{"partition": "acme", "groups": ["bill@acme"], "instances": ["py-a"]}',
}


@pytest.mark.parametrize(
    ("case", "obj"),
    [
        ("worker_description_full", DESCRIPTION),
        (
            "worker_description_min",
            WorkerDescription(
                runtime="node", sdk="unknown", sdk_version="0", protocol=1, protocol_range=(1, 1)
            ),
        ),
        ("group_health_fleet", FLEET_GROUP),
        ("partition_sighting", PartitionSighting("acme", ("bill@acme",), ("py-a",))),
    ],
)
def test_the_json_of_the_fleet_fields_is_pinned_and_reads_back(case: str, obj: Any) -> None:
    text = json.dumps(obj.to_json())
    assert text == PINNED[case]
    again = type(obj).from_json(json.loads(text))
    assert again == obj


def test_a_store_group_keeps_its_old_json() -> None:
    # Groups derived from the store name no transport and no descriptor: the JSON the console
    # and the tenant gateway read stays what it was.
    text = json.dumps(GroupHealth(group="runs@default", depth=1).to_json())
    assert text == '{"group": "runs@default", "depth": 1, "liveWorkers": []}'


def test_the_directory_json_is_pinned() -> None:
    read = FleetRead(
        "default",
        beats=(Beat("orders.place", "py-host-7"), Beat("legacy", "old")),
        descriptors=(
            WorkerDescriptor(
                instance_id="py-host-7",
                runtime="python",
                protocol=ProtocolBand(1, 1, 1),
                workflows=("orders.place",),
                registrations=(
                    WorkflowRegistration(
                        name="orders.place",
                        version="2",
                        group="orders.place",
                        on_error=(OnErrorRouteWire("h", "E"),),
                    ),
                ),
            ),
        ),
    )
    directory = workflow_directory([read], namespace="default")
    assert isinstance(directory, WorkflowDirectory)
    assert json.dumps(directory.to_json()) == (
        '{"supported": true, "workflows": ['
        '{"evidence": "declared", "key": "orders.place@2", "name": "orders.place", "version": "2", "groups": ["orders.place"], "origins": [], "requires": [], "onError": [[{"code": "E", "workflow": "h"}]], "runtimes": ["python"], "instances": ["py-host-7"], "disagreements": []}, '
        '{"evidence": "observed", "key": "legacy", "name": "legacy", "groups": ["legacy"], "origins": [], "requires": [], "onError": [], "runtimes": [], "instances": ["old"], "disagreements": []}], '
        '"otherPartitions": [], '
        '"detail": "2 workflows served by 2 live workers (1 only seen beating, not announced)."}'
    )
