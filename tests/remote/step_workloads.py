"""The workloads both engine-level transport tests run (over Redis and over the SQL transport):
the same workflows, the same durably step-worker app, the same expectations — results,
`FatalError` code and details never retried, retries by failed result, and the onError handoff
behave as with in-process steps."""

from __future__ import annotations

from typing import Any

import pytest

import durably
from durably import OnErrorRoute, WorkflowCtx

RESULT_TIMEOUT = 30

SDK_STEPS = """
worker = Worker(auto_register=False)
attempts = {"n": 0}


@worker.step(tag + ".echo")
async def echo(data, ctx):
    return {"echo": data, "by": "durable-worker"}


@worker.step(tag + ".fatal")
def fatal(data):
    raise FatalError("card declined", code="E1", details={"k": data})


@worker.step(tag + ".flaky")
def flaky(data):
    attempts["n"] += 1
    if attempts["n"] < 3:
        raise RuntimeError("try %d" % attempts["n"])
    return attempts["n"]
"""
"""The same three steps for the published durable-worker SDK (the script around them names
`worker`'s module-level `tag`, imports `FatalError` and `Worker`, and runs the SDK's runner)."""

DURABLY_WORKER_APP = """
import durably
from durably import FatalError
{transport_import}

URL, PREFIX, TAG = {url!r}, {prefix!r}, {tag!r}
attempts = {{"n": 0}}


@durably.step(TAG + ".echo")
async def echo(data):
    return {{"echo": data, "by": "durably"}}


@durably.step(TAG + ".fatal")
def fatal(data):
    raise FatalError("card declined", code="E1", details={{"k": data}})


@durably.step(TAG + ".flaky")
def flaky(data):
    attempts["n"] += 1
    if attempts["n"] < 3:
        raise RuntimeError("try %d" % attempts["n"])
    return attempts["n"]


# A step worker for other engines' runs: no workflows of its own, an in-memory store.
app = durably.Engine(
    "memory",
    transport={transport},
    role="worker",
    steps=[echo, fatal, flaky],
)
"""


def worker_app(*, transport_import: str, transport: str, url: str, prefix: str, tag: str) -> str:
    """The source of a durably step-worker app module serving the three steps."""
    return DURABLY_WORKER_APP.format(
        transport_import=transport_import, transport=transport, url=url, prefix=prefix, tag=tag
    )


def workflows(tag: str) -> dict[str, Any]:
    @durably.workflow(f"{tag}.handler")
    async def handler(ctx: WorkflowCtx, failure: dict[str, Any]) -> dict[str, Any]:
        return {"handled": failure["error"]["code"], "details": failure["error"].get("details")}

    @durably.workflow(f"{tag}.ok")
    async def ok(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.step(f"{tag}.echo", {"x": x})

    @durably.workflow(f"{tag}.bad")
    async def bad(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.step(f"{tag}.fatal", x, retries=5)

    @durably.workflow(f"{tag}.retried")
    async def retried(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.step(f"{tag}.flaky", x, retries=3)

    @durably.workflow(
        f"{tag}.routed", on_error=[OnErrorRoute(code="E1", workflow=f"{tag}.handler")]
    )
    async def routed(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.step(f"{tag}.fatal", x)

    return {"handler": handler, "ok": ok, "bad": bad, "retried": retried, "routed": routed}


async def behaves_as_in_process(
    engine: durably.Engine, wfs: dict[str, Any], tag: str, server: str
) -> None:
    """Run the workloads on an open engine whose steps a worker (`server`) serves."""
    assert await engine.execute(wfs["ok"], 1, timeout=RESULT_TIMEOUT) == {
        "echo": {"x": 1},
        "by": server,
    }
    with pytest.raises(durably.RunFailedError) as info:
        await engine.execute(wfs["bad"], 7, run_id=f"{tag}-bad", timeout=RESULT_TIMEOUT)
    error = info.value.error
    assert error is not None
    assert (error.message, error.code, error.details) == ("card declined", "E1", {"k": 7})
    bad_rows = await engine.list_checkpoints(f"{tag}-bad")
    assert [(r.attempts, r.status) for r in bad_rows] == [(1, "failed")]  # never retried

    retried = await engine.execute(wfs["retried"], 0, run_id=f"{tag}-flaky", timeout=RESULT_TIMEOUT)
    assert retried == 3
    retried_rows = await engine.list_checkpoints(f"{tag}-flaky")
    assert [(r.attempts, r.status) for r in retried_rows] == [(3, "completed")]

    routed = await engine.execute(wfs["routed"], 9, run_id=f"{tag}-r", timeout=60)
    assert routed == {"handled": "E1", "details": {"k": 9}}
    run = await engine.get_run(f"{tag}-r")
    assert run is not None and run.status == "completed"
