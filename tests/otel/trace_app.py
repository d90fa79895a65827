"""The workload of the SIGKILL tracing test (run as separate processes by test_tracing.py).

`python trace_app.py DB SPANS MARKS start` starts run `traced` and drives it;
`python trace_app.py DB SPANS MARKS recover` drives whatever is in the store until the run is
terminal, then prints its status.

Every finished span is appended to SPANS as one JSON line, with one O_APPEND write as it
ends (a SimpleSpanProcessor), so the spans of a process killed later are all on disk. Each
step appends `<step> <pid>` to MARKS before it does anything else; with TRACE_BLOCK=1 step
`c` then blocks so the test can kill the process inside it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import durably
from durably import WorkflowCtx
from durably.contrib.opentelemetry import TracingInterceptor

DB, SPANS, MARKS = sys.argv[1], sys.argv[2], sys.argv[3]
BLOCK = os.environ.get("TRACE_BLOCK") == "1"


class JsonLinesExporter(SpanExporter):
    """Writes each finished span as one JSON line (one write, so a kill never tears one)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            ctx = span.get_span_context()
            assert ctx is not None
            line = {
                "name": span.name,
                "trace_id": format(ctx.trace_id, "032x"),
                "span_id": format(ctx.span_id, "016x"),
                "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
                "attributes": dict(span.attributes or {}),
                "status": span.status.status_code.name,
                "pid": os.getpid(),
            }
            _append(SPANS, json.dumps(line) + "\n")
        return SpanExportResult.SUCCESS


def _append(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


@durably.step("trace.work")
def work(name: str) -> str:
    _append(MARKS, f"{name} {os.getpid()}\n")
    if BLOCK and name == "c":
        time.sleep(60)  # the test kills us in here
    return name


@durably.workflow("trace.wf")
async def trace_wf(ctx: WorkflowCtx) -> str:
    out = await ctx.step(work, "a")
    out += await ctx.step(work, "b")
    await ctx.sleep("300ms")  # max_resident_runs=0: the body is evicted and replayed
    out += await ctx.step(work, "c")
    out += await ctx.step(work, "d")
    return out


async def main() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter()))
    engine = durably.Engine(
        store=f"sqlite:///{DB}",
        workflows=[trace_wf],
        steps=[work],
        interceptors=[TracingInterceptor(tracer_provider=provider)],
        lease_ms=1500,
        timer_poll_ms=50,
        reconcile_ms=500,
        max_resident_runs=0,
    )
    async with engine:
        if sys.argv[4] == "start":
            await engine.start(trace_wf, run_id="traced")
            await asyncio.sleep(3600)
        run = await engine.wait_for_run("traced", timeout=60, until="terminal")
        print(json.dumps({"status": run.status, "output": run.output}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
