"""`TransportSuite`: the transport contract, for any transport.

Each case starts one engine on an in-memory store with the transport under test: the
engine sends its steps over the transport and serves them itself (its `steps=`), so every
step goes out as a task and comes back as a result through the broker. Step and workflow
names are fresh per case (`conf<hex>.…`), so a broker shared between cases, or with other
users, never mixes their tasks up.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any, ClassVar

import pytest
import pytest_asyncio

import durably
from durably import Engine, FatalError, InMemoryStateStore, RunFailedError, WorkflowCtx
from durably.transports import Transport, TransportUnavailableError


class TransportSuite:
    """The transport contract as pytest cases; each takes the `transport` fixture.

    Subclass it (the class name starts with `Test`) and define `open_transport()`: an async
    context manager yielding a fresh transport (the engine of the case closes it; exiting
    the context may clean up what the transport left behind, e.g. its broker keys). Or
    override the `transport` fixture. `TransportUnavailableError` from `open_transport`
    skips the cases. `result_timeout` bounds each run, in seconds.
    """

    # Every case is a coroutine: marked, so the suite runs under pytest-asyncio's strict
    # mode as well as its auto mode.
    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.asyncio]
    result_timeout: ClassVar[float] = 15.0

    def open_transport(self) -> AbstractAsyncContextManager[Transport]:
        """A fresh transport; override it (or the `transport` fixture)."""
        raise NotImplementedError(
            f"{type(self).__name__} must define open_transport() or override the transport fixture"
        )

    @pytest_asyncio.fixture
    async def transport(self) -> AsyncIterator[Transport]:
        """The transport of one case, from `open_transport` (skipped when unavailable)."""
        async with AsyncExitStack() as stack:
            try:
                transport = await stack.enter_async_context(self.open_transport())
            except TransportUnavailableError as exc:
                pytest.skip(f"the transport is unavailable: {exc}")
            yield transport

    def engine(self, transport: Transport, steps: Sequence[Any]) -> Engine:
        """The engine of one case: an in-memory store, the transport, serving `steps`."""
        return Engine(InMemoryStateStore(), transport=transport, steps=list(steps))

    async def test_a_step_goes_over_the_transport_and_its_result_completes_the_run(
        self, transport: Transport
    ) -> None:
        name = _fresh()

        @durably.step(f"{name}.echo")
        async def echo(n: int) -> int:
            return n * 2

        @durably.workflow(f"{name}.wf")
        async def wf(ctx: WorkflowCtx, n: int) -> int:
            return await ctx.step(echo, n)

        async with self.engine(transport, [echo]) as engine:
            run_id = f"{name}-ok"
            assert await engine.execute(wf, 21, run_id=run_id, timeout=self.result_timeout) == 42
            [row] = await engine.list_checkpoints(run_id)
        assert (row.kind, row.status, row.output) == ("remote", "completed", 42)

    async def test_a_step_that_raises_fails_the_run_with_its_error(
        self, transport: Transport
    ) -> None:
        name = _fresh()

        @durably.step(f"{name}.echo")
        async def echo(n: int) -> int:
            raise FatalError(f"refused {n}")

        @durably.workflow(f"{name}.wf")
        async def wf(ctx: WorkflowCtx, n: int) -> int:
            return await ctx.step(echo, n)

        async with self.engine(transport, [echo]) as engine:
            with pytest.raises(RunFailedError) as failed:
                await engine.execute(wf, 21, run_id=f"{name}-fail", timeout=self.result_timeout)
        assert failed.value.status == "failed"
        assert failed.value.error is not None and "refused 21" in failed.value.error.message

    async def test_a_failed_attempt_is_retried_over_the_transport(
        self, transport: Transport
    ) -> None:
        name = _fresh()
        attempts: list[int] = []

        @durably.step(f"{name}.flaky", retries=3, backoff_ms=10)
        async def flaky(n: int) -> int:
            attempts.append(n)
            if len(attempts) == 1:
                raise RuntimeError("the first attempt fails")
            return n + 1

        @durably.workflow(f"{name}.wf")
        async def wf(ctx: WorkflowCtx, n: int) -> int:
            return await ctx.step(flaky, n)

        async with self.engine(transport, [flaky]) as engine:
            run_id = f"{name}-retry"
            assert await engine.execute(wf, 1, run_id=run_id, timeout=self.result_timeout) == 2
            [row] = await engine.list_checkpoints(run_id)
        assert attempts == [1, 1]
        assert (row.status, row.attempts) == ("completed", 2)

    async def test_inputs_and_outputs_cross_as_json_unchanged(self, transport: Transport) -> None:
        name = _fresh()
        value = {"text": "naïve ☃ \u00e9", "nested": [1, 2.5, None, True, {"k": []}], "n": -7}

        @durably.step(f"{name}.same")
        async def same(v: dict[str, Any]) -> dict[str, Any]:
            return v

        @durably.workflow(f"{name}.wf")
        async def wf(ctx: WorkflowCtx, v: dict[str, Any]) -> dict[str, Any]:
            return await ctx.step(same, v)

        async with self.engine(transport, [same]) as engine:
            got = await engine.execute(
                wf, value, run_id=f"{name}-json", timeout=self.result_timeout
            )
        assert got == value

    async def test_every_member_of_a_fan_settles(self, transport: Transport) -> None:
        name = _fresh()

        @durably.step(f"{name}.square")
        async def square(n: int) -> int:
            return n * n

        @durably.workflow(f"{name}.wf")
        async def wf(ctx: WorkflowCtx, n: int) -> list[int]:
            return await ctx.all(square, list(range(n)))

        async with self.engine(transport, [square]) as engine:
            run_id = f"{name}-fan"
            got = await engine.execute(wf, 12, run_id=run_id, timeout=self.result_timeout)
            rows = await engine.list_checkpoints(run_id)
        assert got == [n * n for n in range(12)]
        members = [r for r in rows if r.kind == "remote"]
        assert len(members) == 12 and all(r.status == "completed" for r in members)


def _fresh() -> str:
    """Names of one case's own: the step registry is process-wide, a broker may be shared."""
    return f"conf{uuid.uuid4().hex[:10]}"
