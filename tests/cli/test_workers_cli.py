"""`durably runs workers`: worker health from the store (and, with `--transport`, from a
broker: see tests/remote/test_fleet_health.py), its refusals, and how it is drawn."""

# ruff: noqa: E501  (expected output lines are kept whole)

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import durably
from durably import GroupHealth
from durably._cli.health import directory_lines, group_lines, instances_of
from durably._core.handshake import Disagreement, OnErrorRouteWire
from durably._core.handshake_announce import AnnouncedWorkflow
from durably._read.list_models import (
    WorkerConcurrency,
    WorkerDescription,
    WorkerHeartbeat,
    WorkerStatus,
    WorkflowDirectory,
)
from tests.cli.support import durably as cli
from tests.cli.support import json_of, ok, sqlite_url, write_app


def test_a_pending_run_nobody_holds_is_a_backlog_without_workers(tmp_path: Path) -> None:
    url = write_app(tmp_path)

    async def start() -> None:
        async with durably.Engine(url, workflows=[], drive=False) as engine:
            now = datetime.now(UTC)
            run = durably.WorkflowRun(
                id="waiting-1",
                workflow="hello",
                workflow_version="1",
                status="pending",
                created_at=now,
                updated_at=now,
            )
            await engine.store.create_runs([run])

    asyncio.run(start())
    shown = json_of(cli("runs", "workers", "--app", "app:engine", "--json", cwd=tmp_path))
    assert shown["groups"] == [
        {"group": "runs@default", "depth": 1, "liveWorkers": [], "kind": "workflow"}
    ]
    assert shown["directory"]["supported"] is False
    text = ok(cli("runs", "workers", "--store", url, cwd=tmp_path)).stdout
    assert "runs@default  workflow  (store)      1        0  backlog, no workers" in text
    assert "No live workers." in text
    assert "Announced workflows: none." in text
    assert "No transport of this engine says which workers are live" in text


def test_a_transport_without_a_worker_directory_says_so(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "e.db")
    asyncio.run(_create(url))
    # The SQL transport carries steps but no liveness entries: nothing to read there, and
    # nothing is connected to just to find that out.
    shown = json_of(
        cli(
            "runs",
            "workers",
            "--store",
            url,
            "--transport",
            "postgresql://nobody@127.0.0.1:1/none",
            "--json",
            cwd=tmp_path,
        )
    )
    assert shown == {
        "groups": [],
        "directory": {
            "supported": False,
            "workflows": [],
            "otherPartitions": [],
            "detail": shown["directory"]["detail"],
        },
    }


async def _create(url: str) -> None:
    async with durably.Engine(url, workflows=[], drive=False):
        pass


def test_bad_usage_is_refused(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "e.db")
    asyncio.run(_create(url))
    alone = cli("runs", "workers", "--store", url, "--prefix", "p", cwd=tmp_path)
    assert alone.returncode == 2 and "--prefix needs --transport URL" in alone.stderr
    scheme = cli("runs", "workers", "--store", url, "--transport", "amqp://x", cwd=tmp_path)
    assert scheme.returncode == 2 and "unknown scheme 'amqp'" in scheme.stderr
    prefix = cli(
        "runs",
        "workers",
        "--store",
        url,
        "--transport",
        "postgresql://x/y",
        "--prefix",
        "p",
        cwd=tmp_path,
    )
    assert prefix.returncode == 2 and "redis:// transport only" in prefix.stderr


# ------------------------------------------------------------------ drawing


def _worker(group: str, at: int, in_flight: int, *, described: bool = True) -> WorkerHeartbeat:
    return WorkerHeartbeat(
        group=group,
        instance_id="py-1",
        last_beat_at=at,
        status=WorkerStatus(
            concurrency=WorkerConcurrency("adaptive", 6, min=1, max=16), in_flight=in_flight
        ),
        descriptor=WorkerDescription(
            runtime="node",
            sdk="durable-worker-ts",
            sdk_version="3.1",
            protocol=1,
            protocol_range=(1, 1),
            capabilities=tuple(f"c{i}" for i in range(14)),
            steps=("charge",),
            partition="acme",
        )
        if described
        else None,
    )


def test_a_worker_on_several_tokens_is_drawn_once_with_its_newest_report() -> None:
    groups = [
        GroupHealth("charge@acme", 0, (_worker("charge@acme", 1_000, 1),), "step", "default"),
        GroupHealth(
            "bill@acme", 5, (_worker("bill@acme", 4_000, 3, described=False),), None, "default"
        ),
        GroupHealth("ghost", 2, (), "workflow", "default"),
    ]
    [view] = instances_of(groups)
    assert view.groups == ["charge@acme", "bill@acme"]
    assert view.latest.last_beat_at == 4_000
    lines = group_lines(groups, now_ms=5_000)
    assert lines[0].split() == ["GROUP", "KIND", "FROM", "DEPTH", "WORKERS"]
    assert lines[3].split() == [
        "ghost",
        "workflow",
        "default",
        "2",
        "0",
        "backlog,",
        "no",
        "workers",
    ]
    assert "  py-1  in flight 3/6 (adaptive 1–16) · beat 1.0s ago · transport default" in lines
    # the newest beat carries no descriptor: what the worker serves is not known from it
    assert not any(line.startswith("    steps:") for line in lines)


def test_what_a_described_worker_serves_is_listed_and_cut() -> None:
    groups = [GroupHealth("charge@acme", 0, (_worker("charge@acme", 1_000, 1),), "step", "r")]
    lines = group_lines(groups, now_ms=1_500)
    assert (
        "  py-1  node · durable-worker-ts 3.1 · in flight 1/6 (adaptive 1–16) · beat 500ms ago · transport r"
        in lines
    )
    assert "    steps:        charge" in lines
    assert "    capabilities: c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, +2 more" in lines
    assert "    serves:       partition acme" in lines


def test_the_directory_is_drawn_with_its_disagreements() -> None:
    routes = ((OnErrorRouteWire("h", "E1"),), (OnErrorRouteWire("h", None),))
    entry = AnnouncedWorkflow(
        evidence="declared",
        key="orders@2",
        name="orders",
        version="2",
        groups=("orders",),
        origins=(),
        requires=(),
        on_error=routes,
        runtimes=("python",),
        instances=("a", "b"),
        disagreements=(Disagreement("onError", ('[{"code":"E1"}]', '[{"workflow":"h"}]')),),
    )
    lines = directory_lines(WorkflowDirectory(True, (entry,), detail="1 workflow."))
    assert lines[0] == "Announced workflows:"
    assert lines[2].split() == [
        "orders@2",
        "declared",
        "orders",
        "2",
        "E1",
        "→",
        "h",
        "|",
        "*",
        "→",
        "h",
    ]
    assert (
        lines[3]
        == '  ! orders@2: the workers disagree on onError: [{"code":"E1"}] | [{"workflow":"h"}]'
    )
    assert lines[-1] == "1 workflow."
