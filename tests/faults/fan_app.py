"""The workload of the fan / onError / saga fault tests (run as a separate process by
test_fan_faults.py).

`python fan_app.py STORE LOG SCENARIO start` starts run `fan-run` of SCENARIO's workflow and
drives it until it is killed; `python fan_app.py STORE LOG SCENARIO recover` drives whatever
is in the store until `fan-run` is terminal, then prints one JSON line with its status,
output and error.

Scenarios (`SCENARIOS`):

* `child_fan`: `ctx.all(fan_child, range(n), concurrency=c)`; each child runs one step;
* `step_fan`: `ctx.all(fan_leaf, range(n), concurrency=c)`;
* `on_error`: a workflow that fails with `FatalError(code="declined")`, routed to a handler;
  with `FAN_KILL_HANDLER_START=1` the process SIGKILLs itself when the engine's store is asked
  to create the handler run `fan-run.onError.1`, BEFORE the insert (between the handoff and
  the handler's start);
* `saga`: three steps with `compensate=`, then a failure; the undo of step 2 SIGKILLs the
  process the first time it runs (a marker file created with O_EXCL makes it once).

Every side effect appends one line `<pid> <kind> <key> <i>` to LOG with one O_APPEND write
(which survives SIGKILL), before anything else the step does. With `FAN_BLOCK=i`, member i of
a fan blocks (after its `start` line) so the test can kill the process mid-wave; with
`FAN_SLOW_MS=ms` every member sleeps that long first, so many are in flight at the kill; with
`FAN_KILL_AFTER_SETTLE=<run id>` the process SIGKILLs itself as soon as the store write that
settles that run `completed` returned (before its parent is notified).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

import durably
from durably import FatalError, OnErrorInput, OnErrorRoute, WorkflowCtx

LOG = sys.argv[2] if len(sys.argv) > 2 else os.devnull
RUN_ID = "fan-run"
HANDLER_ID = f"{RUN_ID}.onError.1"
SCENARIOS = ("child_fan", "step_fan", "on_error", "saga")


def note(kind: str, key: str, i: int) -> None:
    """One O_APPEND write: the line is in the log or not at all, even across SIGKILL."""
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{os.getpid()} {kind} {key} {i}\n".encode())
    finally:
        os.close(fd)


def _maybe_block(i: int) -> None:
    if os.environ.get("FAN_BLOCK") == str(i):
        note("blocked", "fan", i)
        time.sleep(60)  # the test kills the process in here
    slow_ms = int(os.environ.get("FAN_SLOW_MS", "0"))
    if slow_ms:
        time.sleep(slow_ms / 1000)  # widen the window in which members are in flight


def _die(key: str, i: int) -> None:
    note("kill", key, i)
    os.kill(os.getpid(), signal.SIGKILL)


def member_output(i: int) -> int:
    return i * i + 1


# ------------------------------------------------------------------ child fan


@durably.step("fanfault.child_leaf")
def child_leaf(arg: dict[str, Any]) -> int:
    i = int(arg["i"])
    note("start", str(arg["run"]), i)
    _maybe_block(i)
    note("end", str(arg["run"]), i)
    return member_output(i)


@durably.workflow("fanfault.child")
async def fan_child(ctx: WorkflowCtx, i: int) -> int:
    return await ctx.step(child_leaf, {"run": ctx.run_id, "i": i})


@durably.workflow("fanfault.child_fan")
async def child_fan(ctx: WorkflowCtx, spec: dict[str, int]) -> dict[str, Any]:
    outputs = await ctx.all(fan_child, range(spec["n"]), concurrency=spec["c"])
    return {"outputs": outputs, "sum": sum(outputs)}


# ------------------------------------------------------------------ step fan


@durably.step("fanfault.leaf")
def fan_leaf(i: int) -> int:
    note("start", "step", i)
    _maybe_block(i)
    note("end", "step", i)
    return member_output(i)


@durably.workflow("fanfault.step_fan")
async def step_fan(ctx: WorkflowCtx, spec: dict[str, int]) -> dict[str, Any]:
    outputs = await ctx.all(fan_leaf, range(spec["n"]), concurrency=spec["c"])
    return {"outputs": outputs, "sum": sum(outputs)}


# ------------------------------------------------------------------ onError


@durably.step("fanfault.body")
def body_step(x: int) -> int:
    note("start", "body", x)
    return x


@durably.step("fanfault.handle")
def handle_step(arg: dict[str, Any]) -> str:
    note("start", "handler", 0)
    return f"handled {arg['code']} of {arg['of']}"


@durably.workflow("fanfault.handler")
async def on_error_handler(ctx: WorkflowCtx, failure: OnErrorInput) -> dict[str, Any]:
    out = await ctx.step(handle_step, {"code": failure.error.code, "of": failure.run_id})
    return {"handled": out, "input": failure.input}


@durably.workflow(
    "fanfault.routed",
    on_error=[OnErrorRoute(workflow="fanfault.handler", code="declined")],
)
async def routed(ctx: WorkflowCtx, x: int) -> None:
    await ctx.step(body_step, x)
    raise FatalError("card declined", code="declined", details={"x": x})


# ------------------------------------------------------------------ saga


@durably.step("fanfault.reserve")
def reserve(k: int) -> int:
    note("do", "saga", k)
    return k * 10


def _first_time(marker: str) -> bool:
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    return True


@durably.step("fanfault.unreserve")
def unreserve(undo: dict[str, Any]) -> None:
    k = int(undo["input"])
    note("start", "undo", k)
    marker = os.environ.get("FAN_MARKER")
    if k == 2 and marker and _first_time(marker):
        _die("undo", k)
    note("end", "undo", k)


@durably.workflow("fanfault.saga")
async def saga(ctx: WorkflowCtx, n: int) -> None:
    for k in range(1, n + 1):
        await ctx.step(reserve, k, compensate=unreserve)
    raise FatalError(f"the body failed after {n} steps", code="saga_failed")


# ------------------------------------------------------------------ driver


def _workload(scenario: str) -> tuple[Any, Any]:
    n = int(os.environ.get("FAN_N", "60"))
    c = int(os.environ.get("FAN_C", "20"))
    if scenario == "child_fan":
        return child_fan, {"n": n, "c": c}
    if scenario == "step_fan":
        return step_fan, {"n": n, "c": c}
    if scenario == "on_error":
        return routed, 7
    if scenario == "saga":
        return saga, 3
    raise SystemExit(f"unknown scenario {scenario!r}")


def _kill_on_handler_start(engine: durably.Engine) -> None:
    """Wrap the engine's store: creating the handler run SIGKILLs the process first."""
    store = engine.store
    create_run = store.create_run

    async def create_run_or_die(run: Any, *args: Any, **kwargs: Any) -> Any:
        if run.id == HANDLER_ID:
            _die("handler-start", 0)
        return await create_run(run, *args, **kwargs)

    store.create_run = create_run_or_die  # type: ignore[method-assign]
    create_runs = getattr(store, "create_runs", None)  # the bulk form (SupportsBulkFans)
    if create_runs is not None:

        async def create_runs_or_die(runs: Any, *args: Any, **kwargs: Any) -> Any:
            if any(run.id == HANDLER_ID for run in runs):
                _die("handler-start", 0)
            return await create_runs(runs, *args, **kwargs)

        bulk: Any = store
        bulk.create_runs = create_runs_or_die


def _kill_after_settle(engine: durably.Engine, run_id: str) -> None:
    """Wrap the engine's store: once the write that settles `run_id` as `completed` has
    returned (committed), SIGKILL the process, before the parent is notified."""
    store = engine.store
    for method in ("update_run_if_status", "update_run"):
        original = getattr(store, method, None)
        if original is None:
            continue

        def wrap(original: Any) -> Any:
            async def update_then_die(rid: str, patch: Any, *args: Any, **kwargs: Any) -> Any:
                result = await original(rid, patch, *args, **kwargs)
                if rid == run_id and patch.get("status") == "completed" and result is not False:
                    _die("after-settle", 0)
                return result

            return update_then_die

        setattr(store, method, wrap(original))


async def main() -> None:
    store, _log, scenario, mode = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    workflow, arg = _workload(scenario)
    engine = durably.Engine(
        store=store,
        workflows=[child_fan, fan_child, step_fan, routed, on_error_handler, saga],
        steps=[child_leaf, fan_leaf, body_step, handle_step, reserve, unreserve],
        instance_id=os.environ.get("FAN_INSTANCE_ID") or None,
        lease_ms=int(os.environ.get("FAN_LEASE_MS", "1500")),
        reconcile_ms=int(os.environ.get("FAN_RECONCILE_MS", "1000")),
        timer_poll_ms=100,
        drain_timeout_ms=2000,
    )
    if os.environ.get("FAN_KILL_HANDLER_START") == "1":
        _kill_on_handler_start(engine)
    if os.environ.get("FAN_KILL_AFTER_SETTLE"):
        _kill_after_settle(engine, os.environ["FAN_KILL_AFTER_SETTLE"])
    async with engine:
        if mode == "start":
            await engine.start(workflow, arg, run_id=RUN_ID)
            print("STARTED", flush=True)
            await asyncio.sleep(3600)  # killed in here (by the test or by itself)
            return
        run = await engine.wait_for_run(RUN_ID, timeout=45, until="terminal")
        result = {
            "status": run.status,
            "output": run.output,
            "error": run.error.to_json() if run.error is not None else None,
        }
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
