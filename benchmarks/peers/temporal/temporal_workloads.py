"""Workflows and activities of W1–W5 for the Temporal runner (``run.py`` beside this file).

A module of its own because Temporal's workflow sandbox re-imports the module that defines a
workflow: this one imports only the standard library, ``temporalio`` and ``bench_common``
(stdlib-only; passed through the sandbox, found on ``sys.path`` as ``run.py`` set it up).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    import bench_common

# Temporal requires a timeout on every activity (there is no default): the one setting the
# workloads need to be expressible. It also bounds how long the server waits before it retries
# an activity whose worker was SIGKILLed (W5).
ACTIVITY_TIMEOUT = timedelta(seconds=10)
LEAF_CALLS = [0]


@activity.defn
async def inc(x: int) -> int:
    return x + 1


@activity.defn
async def leaf(i: int) -> int:
    LEAF_CALLS[0] += 1
    return i + 1


@activity.defn
def w5_step(log_path: str, wf: str, i: int, x: int) -> int:
    """Log ``<wf> <i>`` with one O_APPEND write (survives SIGKILL), block 2 s in step 5."""
    return bench_common.w5_step_effect(log_path, wf, i, x)


async def _call(fn: object, *args: object, local: bool) -> int:
    if local:
        return await workflow.execute_local_activity(  # type: ignore[no-any-return]
            fn, args=list(args), start_to_close_timeout=ACTIVITY_TIMEOUT
        )
    return await workflow.execute_activity(  # type: ignore[no-any-return]
        fn, args=list(args), start_to_close_timeout=ACTIVITY_TIMEOUT
    )


@workflow.defn
class SeqWf:
    @workflow.run
    async def run(self, n: int, local: bool) -> int:
        x = 0
        for _ in range(n):
            x = await _call(inc, x, local=local)
        return x


@workflow.defn
class FanWf:
    @workflow.run
    async def run(self, n: int, local: bool) -> int:
        results = await asyncio.gather(*[_call(leaf, i, local=local) for i in range(n)])
        return sum(results)


@workflow.defn
class TimerWf:
    @workflow.run
    async def run(self, local: bool) -> int:
        await asyncio.sleep(1)  # a durable server timer
        return await _call(inc, 0, local=local)


@workflow.defn
class CrashWf:
    @workflow.run
    async def run(self, log_path: str, steps: int, local: bool) -> int:
        wf = workflow.info().workflow_id
        x = 0
        for i in range(1, steps + 1):
            x = await _call(w5_step, log_path, wf, i, x, local=local)
        return x


WORKFLOWS = [SeqWf, FanWf, TimerWf, CrashWf]
ACTIVITIES = [inc, leaf, w5_step]
