"""durably's handshake checked against the published durable-worker 0.26.1, computed by the SDK.

One subprocess runs the SDK's own interpreter (installed unmodified from the package registry, see
`durable_worker_env`) over the same inputs durably gets: raw descriptors (legacy, partial, unicode,
unsorted and duplicated sets, registrations with onError routes), descriptors the SDK builds itself
from real `Worker` / `WorkflowWorker` registrations, a few hundred random descriptors, negotiations,
routing decisions and heartbeat values. durably must compute the same hashes, publish the same
bytes, and reach the same decisions and messages.
"""

from __future__ import annotations

import json
import random
import subprocess
from typing import Any

import pytest

from durably._core.handshake import (
    LEGACY_V1_CAPABILITIES,
    DispatchBlocked,
    DispatchRoutable,
    control_plane_descriptor,
    descriptor_hash,
    descriptor_to_json,
    descriptor_to_wire,
    is_legacy_descriptor,
    negotiate,
    normalize_descriptor,
    parse_heartbeat_value,
    plan_dispatch,
)
from tests.remote.durable_worker_env import durable_worker_python

# Runs under the SDK's interpreter; reads the cases as JSON on stdin, prints the SDK's answers.
SDK_PROGRAM = r"""
import json
import sys

from durable_worker import Worker, WorkflowWorker
from durable_worker.adaptive import AdaptiveController, ConcurrencyConfig
from durable_worker.handshake import (
    WorkerDescriptor,
    descriptor_hash,
    heartbeat_status,
    is_legacy_descriptor,
    negotiate,
    resolve_routing,
)
from durable_worker.redis_runner import (
    _build_descriptor,
    _heartbeat_value,
    _tenant_group,
    sanitize_queue_token,
)

cases = json.load(sys.stdin)


def described(raw):
    typed = WorkerDescriptor.from_wire(raw)
    return {
        "hash": descriptor_hash(raw),
        "typedHash": descriptor_hash(typed),
        "published": json.dumps(typed.to_wire()),
        "legacy": is_legacy_descriptor(raw),
    }


def routing(case):
    plan = resolve_routing(case["requires"], case["workers"])
    if plan["status"] == "routable":
        return {"status": "routable", "instances": [w.instance_id for w in plan["workers"]]}
    return {"status": "blocked", "reason": plan["reason"]}


unified = Worker(auto_register=False)


@unified.step("billing:charge")
def charge(data):
    return data


@unified.step("\u00dcn\u00efcode.step")
def unicode_step(data):
    return data


@unified.workflow(
    "pipeline", version="2", origin="flip-python-db", requires=["signals", "saga", "saga"]
)
def pipeline(ctx, input):
    return None


@unified.workflow(
    "line",
    on_error=[{"code": "invalid_line", "workflow": "line-rejected"}, {"workflow": "line-dlq"}],
)
def line(ctx, input):
    return None


@unified.workflow("order", version="3", origin="shop")
def order(ctx, input):
    return None


@order.on_error("declined")
def reject(ctx, failure):
    return None


@order.on_error()
def catch_all(ctx, failure):
    return None


@unified.workflow("\u6ce8\u6587\U0001f600")
def chumon(ctx, input):
    return None


split = WorkflowWorker(group="wf-group")


@split.workflow("split-wf", on_error=[{"workflow": "split-dlq"}])
def split_wf(ctx, input):
    return None


steps_only = Worker(auto_register=False)


@steps_only.step("resize")
def resize(data):
    return data


def unified_group(name):
    return _tenant_group(sanitize_queue_token(name), "acme")


built = [
    _build_descriptor(unified, "acme", "default", unified_group),
    _build_descriptor(unified, None, "dev", None),
    _build_descriptor(split, None, None, lambda _name: "wf-group"),
    _build_descriptor(steps_only, "", "", None),
]
controller = AdaptiveController(ConcurrencyConfig("fixed", 4, 1, 4, 85.0, None, 1000))
first_hash = descriptor_hash(built[0])

print(
    json.dumps(
        {
            "descriptors": [described(raw) for raw in cases["descriptors"]],
            "random": [described(raw) for raw in cases["random"]],
            "negotiations": [
                negotiate(c["local"], c["remote"], required=c["required"])
                for c in cases["negotiations"]
            ],
            "routing": [routing(c) for c in cases["routing"]],
            "built": [
                {"published": json.dumps(d.to_wire()), "hash": descriptor_hash(d)} for d in built
            ],
            "heartbeats": {
                "hash": first_hash,
                "workflowWorker": _heartbeat_value(None, first_hash),
                "stepWorker": _heartbeat_value(controller, first_hash),
                "compact": json.dumps(
                    heartbeat_status(built[0], ts=1752710460000, status="draining")
                ),
            },
        }
    )
)
"""

ROUTES = [
    {"code": "invalid_line", "workflow": "line-rejected"},
    {"workflow": "line-dlq"},
    {"code": "invalid_line", "workflow": "line-rejected"},
    {"code": "áccent", "workflow": "handler-😀"},
]

# Descriptors whose published bytes must match too: durably writes a route as `{code?, workflow}`
# and drops unknown keys, which is what the SDK writes for these.
DESCRIPTORS: list[dict[str, Any]] = [
    {"instanceId": "legacy-1", "runtime": "python"},
    {
        "instanceId": "modern-empty",
        "runtime": "node",
        "protocol": {"version": 1, "range": [1, 1]},
        "capabilities": [],
    },
    {
        "instanceId": "wörker-ü-01",
        "runtime": "node",
        "sdk": {"name": "@adonis-agora/durable", "version": "1.0.0-β"},
        "protocol": {"version": 2, "range": [1, 3]},
        "capabilities": ["signals", "saga", "search-attr-v2", "saga"],
        "workflows": ["注文", "émoji😀", "b", "a", "a"],
        "steps": ["z.step", "Billing.charge", "Billing.charge", 'quote"back\\slash\n\ttab\u0001'],
        "partition": "ñ-partition",
        "namespace": "ns-東京",
        "startedAt": 1752710400000,
    },
    {
        "instanceId": "py-pipeline-1",
        "runtime": "python",
        "sdk": {"name": "durable-worker", "version": "0.26.1"},
        "protocol": {"version": 1, "range": [1, 1]},
        "capabilities": list(LEGACY_V1_CAPABILITIES),
        "workflows": ["pipeline", "line", "extraction"],
        "steps": ["extraction:page"],
        "registrations": [
            {"name": "pipeline", "version": "2", "group": "pipeline@acme", "requires": ["saga"]},
            {"name": "extraction", "group": "extraction@acme", "origin": "flip"},
            {"name": "line", "group": "line@acme", "onError": ROUTES},
            {"name": "line", "group": "line@acme", "onError": list(reversed(ROUTES))},
            {"name": "pipeline", "requires": ["signals", "saga", "signals"]},
        ],
        "partition": "acme",
        "startedAt": 1752710400001,
    },
    {
        "instanceId": "announces-none",
        "runtime": "python",
        "registrations": [],
        "workflows": [],
        "startedAt": 5,
    },
    {
        "instanceId": "empty-routes",
        "runtime": "python",
        "workflows": ["w"],
        "registrations": [{"name": "w", "onError": []}],
    },
    {
        "instanceId": "nulls",
        "runtime": "node",
        "sdk": None,
        "protocol": None,
        "capabilities": None,
        "workflows": None,
        "steps": None,
        "registrations": None,
        "partition": None,
        "namespace": None,
        "startedAt": None,
    },
    {"instanceId": "empty-objects", "runtime": "node", "sdk": {}, "protocol": {}},
    {
        "instanceId": "partition-empty",
        "runtime": "python",
        "partition": "",
        "namespace": "",
        "steps": ["x"],
        "startedAt": 2**52,
    },
    {
        "instanceId": "astral-𝕏",
        "runtime": "python",
        "workflows": ["\U0001f600", "\uffff", "\ue000", "\U00010000"],
        "registrations": [{"name": "\U0001f600", "version": "𝟚", "origin": "\u2028\u2029"}],
    },
]

# Descriptors whose hash must match but whose published bytes legitimately differ: the SDK writes
# a route dict back exactly as it received it (keys reversed, an explicit null code, extra keys),
# durably writes every route in its one shape `{code?, workflow}`. Readers treat both the same,
# and the hash never sees the difference.
HASH_ONLY: list[dict[str, Any]] = [
    {
        "instanceId": "odd-routes",
        "runtime": "python",
        "workflows": ["line"],
        "registrations": [
            {
                "name": "line",
                "onError": [
                    {"workflow": "line-rejected", "code": "invalid_line"},
                    {"code": None, "workflow": "line-dlq"},
                    {"workflow": "line-dlq", "note": "extra"},
                ],
            }
        ],
        "futureField": {"ignored": True},
    },
]


def random_descriptor(rng: random.Random, i: int) -> dict[str, Any]:
    """A descriptor with random content drawn from characters that stress the hash: ASCII,
    Latin-1, BMP above the surrogates, astral (two UTF-16 code units), JSON escapes."""
    alphabet = [
        "a",
        "B",
        "z",
        "-",
        ":",
        "@",
        ".",
        "é",
        "ß",
        "€",
        "注",
        "\uffff",
        "😀",
        "𝕏",
        '"',
        "\\",
        "\n",
    ]

    def text(min_len: int = 1) -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(min_len, 6)))

    def strings(max_len: int = 5) -> list[str]:
        return [text() for _ in range(rng.randint(0, max_len))]

    raw: dict[str, Any] = {
        "instanceId": f"r{i}-{text()}",
        "runtime": rng.choice(["node", "python"]),
    }
    if rng.random() < 0.8:
        raw["sdk"] = {"name": text(), "version": text()}
    if rng.random() < 0.8:
        low = rng.randint(0, 3)
        raw["protocol"] = {"version": rng.randint(0, 4), "range": [low, low + rng.randint(0, 2)]}
    if rng.random() < 0.8:
        raw["capabilities"] = strings()
    workflows = strings()
    raw["workflows"] = workflows
    raw["steps"] = strings()
    if rng.random() < 0.6:
        regs = []
        for name in workflows + strings(2):
            reg: dict[str, Any] = {"name": name}
            for key in ("version", "group", "origin"):
                if rng.random() < 0.5:
                    reg[key] = text()
            if rng.random() < 0.5:
                reg["requires"] = strings(4)
            if rng.random() < 0.5:
                routes: list[dict[str, str]] = []
                for _ in range(rng.randint(0, 4)):
                    route = {"code": text()} if rng.random() < 0.6 else {}
                    route["workflow"] = text()
                    routes.append(route)
                reg["onError"] = routes
            regs.append(reg)
        rng.shuffle(regs)
        raw["registrations"] = regs
    if rng.random() < 0.5:
        raw["partition"] = text()
    if rng.random() < 0.5:
        raw["namespace"] = text()
    if rng.random() < 0.9:
        raw["startedAt"] = rng.randint(0, 2**53)
    return raw


RANDOM = [random_descriptor(random.Random(7), i) for i in range(400)]

CP = descriptor_to_wire(control_plane_descriptor("engine-1", "acme"))
PY_WORKER = {
    "instanceId": "py-w",
    "runtime": "python",
    "protocol": {"version": 1, "range": [1, 1]},
    "capabilities": list(LEGACY_V1_CAPABILITIES),
}
V2_WORKER = {
    "instanceId": "v2",
    "runtime": "node",
    "protocol": {"version": 2, "range": [2, 2]},
    "capabilities": ["saga", "search-attr-v2"],
}
MODERN = {
    **PY_WORKER,
    "instanceId": "modern",
    "capabilities": ["saga", "signals", "search-attr-v2"],
}

NEGOTIATIONS: list[dict[str, Any]] = [
    {"local": CP, "remote": PY_WORKER, "required": []},
    {"local": CP, "remote": V2_WORKER, "required": []},
    {"local": CP, "remote": PY_WORKER, "required": ["search-attr-v2", "saga", "entities"]},
    {"local": PY_WORKER, "remote": PY_WORKER, "required": ["saga"]},
    {"local": MODERN, "remote": PY_WORKER, "required": []},
    {"local": PY_WORKER, "remote": MODERN, "required": ["search-attr-v2"]},
    {
        "local": {"instanceId": "a", "runtime": "node"},
        "remote": {"instanceId": "b", "runtime": "python"},
        "required": [],
    },
    {
        "local": {**PY_WORKER, "protocol": {"version": 2, "range": [1, 2]}},
        "remote": {**PY_WORKER, "protocol": {"version": 3, "range": [1, 3]}},
        "required": [],
    },
]

# Protocol bands all overlap the control plane's, so the SDK's capability-only router and
# durably's planner must agree on every case.
ROUTING: list[dict[str, Any]] = [
    {"requires": ["search-attr-v2"], "workers": [PY_WORKER, MODERN]},
    {"requires": ["search-attr-v2", "saga", "search-attr-v2"], "workers": [PY_WORKER]},
    {"requires": [], "workers": [PY_WORKER, MODERN]},
    {"requires": ["entities"], "workers": [{"instanceId": "legacy", "runtime": "python"}]},
    {"requires": ["x", "y"], "workers": [MODERN]},
]


@pytest.fixture(scope="module")
def sdk() -> dict[str, Any]:
    cases = {
        "descriptors": DESCRIPTORS + HASH_ONLY,
        "random": RANDOM,
        "negotiations": NEGOTIATIONS,
        "routing": ROUTING,
    }
    proc = subprocess.run(
        [str(durable_worker_python()), "-c", SDK_PROGRAM],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    answers: dict[str, Any] = json.loads(proc.stdout)
    return answers


def test_the_sdk_answered_every_case(sdk: dict[str, Any]) -> None:
    assert len(sdk["descriptors"]) == len(DESCRIPTORS) + len(HASH_ONLY)
    assert len(sdk["random"]) == len(RANDOM)
    # The hash is over content, so distinct random descriptors must not all collapse to one value.
    assert len({answer["hash"] for answer in sdk["random"]}) == len(RANDOM)


@pytest.mark.parametrize("index", range(len(DESCRIPTORS)))
def test_hash_and_published_bytes_match_the_sdk(sdk: dict[str, Any], index: int) -> None:
    raw = DESCRIPTORS[index]
    answer = sdk["descriptors"][index]
    d = normalize_descriptor(raw)
    assert descriptor_hash(d) == answer["hash"] == answer["typedHash"]
    assert descriptor_to_json(d) == answer["published"]
    assert is_legacy_descriptor(raw) is answer["legacy"]
    # Read back from its JSON text, as a descriptor key's value arrives.
    assert descriptor_hash(normalize_descriptor(answer["published"].encode())) == answer["hash"]


@pytest.mark.parametrize("index", range(len(HASH_ONLY)))
def test_hash_matches_the_sdk_when_the_sdk_echoes_odd_routes(
    sdk: dict[str, Any], index: int
) -> None:
    answer = sdk["descriptors"][len(DESCRIPTORS) + index]
    d = normalize_descriptor(HASH_ONLY[index])
    assert descriptor_hash(d) == answer["hash"] == answer["typedHash"]
    assert descriptor_hash(normalize_descriptor(answer["published"])) == answer["hash"]


def test_random_descriptors_hash_and_publish_as_the_sdk_does(sdk: dict[str, Any]) -> None:
    mismatches = []
    for raw, answer in zip(RANDOM, sdk["random"], strict=True):
        d = normalize_descriptor(raw)
        if descriptor_hash(d) != answer["hash"] or descriptor_to_json(d) != answer["published"]:
            mismatches.append((raw, answer))
    assert mismatches == []


def test_descriptors_the_sdk_builds_read_back_with_the_same_hash_and_bytes(
    sdk: dict[str, Any],
) -> None:
    built = sdk["built"]
    assert len(built) == 4
    for answer in built:
        d = normalize_descriptor(answer["published"])
        assert descriptor_hash(d) == answer["hash"]
        assert descriptor_to_json(d) == answer["published"]

    unified = normalize_descriptor(built[0]["published"])
    assert unified.runtime == "python"
    assert unified.instance_id.startswith("py-")
    assert unified.capabilities == LEGACY_V1_CAPABILITIES
    assert unified.partition == "acme" and unified.namespace is None
    assert unified.steps == ("billing:charge", "Ünïcode.step")
    regs = {reg.name: reg for reg in unified.registrations or ()}
    assert regs["order"].version == "3"
    assert regs["order.onError.reject"].version == "3"
    assert regs["order.onError.reject"].origin == "shop"
    assert regs["order.onError.reject"].group == "order.onError.reject@acme"
    assert [(r.code, r.workflow) for r in regs["order"].on_error or ()] == [
        ("declined", "order.onError.reject"),
        (None, "order.onError.catch_all"),
    ]
    assert regs["pipeline"].requires == ("signals", "saga", "saga")
    assert regs["注文😀"].group == "注文😀@acme"

    namespaced = normalize_descriptor(built[1]["published"])
    assert namespaced.namespace == "dev" and namespaced.partition is None
    assert all(reg.group is None for reg in namespaced.registrations or ())

    split = normalize_descriptor(built[2]["published"])
    assert [(reg.name, reg.group) for reg in split.registrations or ()] == [
        ("split-wf", "wf-group")
    ]

    steps_only = normalize_descriptor(built[3]["published"])
    assert steps_only.registrations is None
    assert steps_only.partition is None and steps_only.namespace is None


def test_heartbeat_values_the_sdk_writes_parse(sdk: dict[str, Any]) -> None:
    beats = sdk["heartbeats"]
    expected_hash = beats["hash"]

    workflow_worker = parse_heartbeat_value(beats["workflowWorker"])
    assert workflow_worker.descriptor_hash == expected_hash
    assert workflow_worker.status is None
    assert workflow_worker.last_beat_ms > 1_600_000_000_000

    step_worker = parse_heartbeat_value(beats["stepWorker"].encode())
    assert step_worker.descriptor_hash == expected_hash
    assert step_worker.status is not None
    assert step_worker.status["concurrency"] == {"mode": "fixed", "limit": 4}
    assert step_worker.status["runtime"] == "python"

    compact = parse_heartbeat_value(beats["compact"])
    assert compact.last_beat_ms == 1752710460000
    assert compact.descriptor_hash == expected_hash
    # The compact form's status is a lifecycle word, not an execution-status object.
    assert compact.status is None


@pytest.mark.parametrize("index", range(len(NEGOTIATIONS)))
def test_negotiation_matches_the_sdk(sdk: dict[str, Any], index: int) -> None:
    case = NEGOTIATIONS[index]
    ours = negotiate(
        normalize_descriptor(case["local"]), normalize_descriptor(case["remote"]), case["required"]
    )
    assert ours.to_json() == sdk["negotiations"][index]


@pytest.mark.parametrize("index", range(len(ROUTING)))
def test_capability_routing_matches_the_sdk(sdk: dict[str, Any], index: int) -> None:
    case = ROUTING[index]
    workers = [normalize_descriptor(w) for w in case["workers"]]
    cp = normalize_descriptor(CP)
    plan = plan_dispatch(case["requires"], workers, cp, "token")
    answer = sdk["routing"][index]
    assert plan.status == answer["status"]
    if isinstance(plan, DispatchRoutable):
        assert [w.instance_id for w in plan.workers] == answer["instances"]
    else:
        assert isinstance(plan, DispatchBlocked)
        assert plan.reason == answer["reason"]
