"""Tracing across the Redis transport: the orchestrator and the step worker are two engines
with tracer providers of their own (as two processes would be). The `traceparent` in the
BullMQ job names the orchestrator's dispatch span, and the worker's span of the step is its
child, in the run's trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bullmq import Queue
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import durably
from durably import WorkflowCtx
from durably.contrib.opentelemetry import TracingInterceptor, run_trace_id
from durably.transports import RedisTransport
from tests.engine_support import wait_until
from tests.remote import redis_support

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(90)


def _tracing() -> tuple[TracingInterceptor, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return TracingInterceptor(tracer_provider=provider), exporter


async def _waiting_jobs(url: str, queue: str) -> list[Any]:
    q = Queue(queue, {"connection": url})
    try:
        return list(await q.getJobs(["wait", "prioritized"]))
    finally:
        await q.close()


async def test_the_traceparent_in_the_job_names_the_dispatch_span_and_the_worker_continues_it(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"ot-{redis_prefix}"

    @durably.step(f"{tag}.double")
    async def double(x: int) -> int:
        return x * 2

    @durably.workflow(f"{tag}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(double, x)

    orchestrating, sent = _tracing()
    serving, served = _tracing()
    orchestrator = durably.Engine(
        f"sqlite:///{tmp_path / 'e.db'}",
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=[wf],
        steps=[],
        interceptors=[orchestrating],
        timer_poll_ms=50,
    )
    worker = durably.Engine(
        "memory",
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        role="worker",
        steps=[double],
        interceptors=[serving],
    )
    queue = f"{redis_prefix}-tasks-{tag}.double"
    jobs: list[Any] = []
    async with orchestrator:
        handle = await orchestrator.start(wf, 21, run_id=f"{tag}-r")

        async def dispatched() -> bool:
            jobs[:] = await _waiting_jobs(redis_url, queue)
            return len(jobs) == 1

        await wait_until(dispatched, timeout=20)
        async with worker:
            assert await handle.result(timeout=30) == 42
    (dispatch,) = [s for s in sent.get_finished_spans() if s.name.startswith("dispatch ")]
    ctx = dispatch.get_span_context()
    assert ctx is not None and ctx.trace_id == run_trace_id(f"{tag}-r")
    assert jobs[0].data["traceparent"] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"
    (step,) = [s for s in served.get_finished_spans() if s.name.startswith("step ")]
    assert step.parent is not None and step.parent.span_id == ctx.span_id
    step_ctx = step.get_span_context()
    assert step_ctx is not None and step_ctx.trace_id == ctx.trace_id
