"""Checked by `mypy --strict` in test_client_typing.py: `Client.start` keeps the workflow's
output type when given the `Workflow` object, takes it from `output_type=` by name, and is
`Any` by name without one."""

from __future__ import annotations

from typing import Any, assert_type

import durably
from durably import Client, RunHandle, WorkflowCtx


@durably.workflow("typed.client.double")
async def double(ctx: WorkflowCtx, n: int) -> int:
    return n * 2


async def main() -> None:
    async with Client("memory") as client:
        typed = await client.start(double, 2)
        assert_type(typed, RunHandle[int])
        assert_type(await typed.result(), int)
        by_name = await client.start("typed.client.double", 2)
        assert_type(by_name, RunHandle[Any])
        by_type = await client.start("typed.client.double", 2, output_type=int)
        assert_type(by_type, RunHandle[int])
        assert_type(await by_type.result(), int)
        both = await client.signal_with_start(double, 1, run_id="r", token="t")
        assert_type(both, RunHandle[int])
