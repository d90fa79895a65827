"""Type-checked by tests/typing/test_testing_typing.py: the testing kit keeps a workflow's
output type under `mypy --strict`."""

from __future__ import annotations

from typing import assert_type

import durably
from durably import RunHandle, WorkflowCtx
from durably.testing import TestClock, WorkflowEnvironment


@durably.workflow("typing.testing.double")
async def double(ctx: WorkflowCtx, n: int) -> int:
    return n * 2


async def main() -> None:
    async with WorkflowEnvironment(workflows=[double], store="sqlite", lease_ms=5_000) as env:
        assert_type(env, WorkflowEnvironment)
        assert_type(await env.run(double, 2), int)
        handle = await env.start(double, 3)
        assert_type(handle, RunHandle[int])
        assert_type(await env.result(handle), int)
        assert_type(env.clock, TestClock)
        assert_type(env.clock.advance("5m"), int)
        assert_type(env.engine, durably.Engine)
        assert_type(env.client, durably.Client)
        env.crash_after(3, kind="checkpoint")
        assert_type(await env.restart(), durably.Engine)
