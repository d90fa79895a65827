"""`durably.contrib.opentelemetry.TracingInterceptor` with the SDK's span exporters, on real
SQLite files.

- One trace per run: its turns before and after a sleep that evicted it, and after a
  SIGKILL and recovery by another process (`trace_app.py`), share the trace id derived from
  the run id, and every step span is there exactly once (a replayed step records none).
- A step sent over a transport: the `traceparent` on the wire names the dispatch span, and
  the served step's span is its child.
- A child run is its own trace, linked to its parent's; a failed attempt is an ERROR span.
- `import durably` loads no OpenTelemetry; without the extra the import says what to install.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import durably
from durably import WorkflowCtx
from durably._core.wire import parse_remote_task
from durably.contrib.opentelemetry import TracingInterceptor, run_trace_id
from durably.transports import InMemoryTransport
from tests.engine_support import FAST_TUNING
from tests.faults.kill_support import kill

APP = Path(__file__).with_name("trace_app.py")
RESULT_TIMEOUT = 20.0


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'durably.db'}"


def _named(found: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in found if s.name.startswith(prefix)]


def _ctx(span: ReadableSpan) -> Any:
    ctx = span.get_span_context()
    assert ctx is not None
    return ctx


async def test_the_turns_of_an_evicted_run_share_one_trace_and_replays_record_no_step_span(
    tmp_path: Path, uid: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    failures = [1]

    @durably.step(f"{uid}.work", retries=2, backoff_ms=1)
    async def work(x: int) -> int:
        if x == 2 and failures:
            failures.pop()
            raise RuntimeError("flaky")
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> int:
        total = await ctx.step(work, 1)
        await ctx.sleep("50ms")
        total += await ctx.step(work, 2)
        await ctx.sleep("50ms")
        return total + await ctx.step(work, 3)

    engine = durably.Engine(
        _db(tmp_path),
        workflows=[wf],
        steps=[work],
        interceptors=[TracingInterceptor(tracer_provider=provider)],
        max_resident_runs=0,  # every sleep evicts the body: later turns replay it
        **FAST_TUNING,
    )
    async with engine:
        assert await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 6
    found = exporter.get_finished_spans()
    trace_id = run_trace_id(f"{uid}-r")
    run_spans = [s for s in found if not s.name.startswith("durably.")]
    assert {_ctx(s).trace_id for s in run_spans} == {trace_id}
    turns = _named(found, "workflow ")
    assert len(turns) >= 3  # one per turn: before, between and after the sleeps
    steps = _named(found, "step ")
    attempts = [
        (s.attributes["durably.step.seq"], s.attributes["durably.step.attempt"]) for s in steps
    ]  # type: ignore[index]
    assert sorted(attempts) == [(0, 1), (2, 1), (2, 2), (4, 1)]  # type: ignore[type-var]
    failed = [s for s in steps if s.status.status_code is StatusCode.ERROR]
    assert len(failed) == 1 and failed[0].attributes["durably.step.attempt"] == 1  # type: ignore[index]
    assert "flaky" in (failed[0].status.description or "")
    turn_ids = {_ctx(t).span_id for t in turns}
    assert all(s.parent is not None and s.parent.span_id in turn_ids for s in steps)
    first = steps[0]
    assert first.attributes is not None
    assert first.attributes["durably.run_id"] == f"{uid}-r"
    assert first.attributes["durably.workflow"] == f"{uid}.wf"
    assert first.attributes["durably.step.kind"] == "step"
    start = _named(found, "durably.start")
    assert len(start) == 1 and start[0].attributes == {
        "durably.namespace": "default",
        "durably.run_id": f"{uid}-r",
        "durably.workflow": f"{uid}.wf",
    }


async def test_a_remote_step_span_is_a_child_of_the_dispatch_span_named_on_the_wire(
    tmp_path: Path, uid: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans

    @durably.step(f"{uid}.far")
    def far(x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(far, x)

    transport = InMemoryTransport()
    engine = durably.Engine(
        _db(tmp_path),
        transport=transport,
        workflows=[wf],
        steps=[far],
        interceptors=[TracingInterceptor(tracer_provider=provider)],
        **FAST_TUNING,
    )
    async with engine:
        assert await engine.execute(wf, 1, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 2
    found = exporter.get_finished_spans()
    (dispatch,) = _named(found, "dispatch ")
    (served,) = _named(found, "step ")
    (task,) = transport.broker.dispatched
    ctx = _ctx(dispatch)
    wire = task.to_json()  # the task as a broker carries it
    assert wire["traceparent"] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"
    assert parse_remote_task(json.loads(json.dumps(wire))).traceparent == wire["traceparent"]
    assert served.parent is not None and served.parent.span_id == ctx.span_id
    assert _ctx(served).trace_id == ctx.trace_id == run_trace_id(f"{uid}-r")
    assert served.attributes is not None and served.attributes["durably.step.kind"] == "served"


async def test_a_child_run_is_its_own_trace_linked_to_its_parents(
    tmp_path: Path, uid: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx) -> int:
        return 1

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> int:
        out: int = await ctx.child(child, id=f"{uid}-kid")
        return out

    engine = durably.Engine(
        _db(tmp_path),
        workflows=[parent, child],
        interceptors=[TracingInterceptor(tracer_provider=provider)],
        **FAST_TUNING,
    )
    async with engine:
        assert await engine.execute(parent, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT) == 1
    kid_turns = [
        s for s in _named(exporter.get_finished_spans(), "workflow ") if s.name.endswith("child")
    ]
    assert kid_turns
    for turn in kid_turns:
        assert _ctx(turn).trace_id == run_trace_id(f"{uid}-kid")
        assert [link.context.trace_id for link in turn.links] == [run_trace_id(f"{uid}-p")]


def _spawn(tmp_path: Path, mode: str, block: bool) -> subprocess.Popen[str]:
    args = [str(tmp_path / "t.db"), str(tmp_path / "spans.jsonl"), str(tmp_path / "marks")]
    return subprocess.Popen(
        [sys.executable, str(APP), *args, mode],
        env={**os.environ, "TRACE_BLOCK": "1" if block else "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _marks(tmp_path: Path) -> list[str]:
    path = tmp_path / "marks"
    return path.read_text().split("\n")[:-1] if path.exists() else []


@pytest.mark.timeout(120)
def test_a_run_killed_and_recovered_by_another_process_is_one_trace_with_each_step_once(
    tmp_path: Path,
) -> None:
    first = _spawn(tmp_path, "start", block=True)
    try:
        deadline = time.monotonic() + 60
        while not any(m.startswith("c ") for m in _marks(tmp_path)):
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            assert time.monotonic() < deadline, "the run never reached step c"
            time.sleep(0.05)
    finally:
        kill(first)
    second = _spawn(tmp_path, "recover", block=False)
    out, err = second.communicate(timeout=90)
    assert second.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {"status": "completed", "output": "abcd"}
    lines = [json.loads(x) for x in (tmp_path / "spans.jsonl").read_text().splitlines()]
    run_spans = [x for x in lines if not x["name"].startswith("durably.")]
    assert {x["trace_id"] for x in run_spans} == {format(run_trace_id("traced"), "032x")}
    steps = sorted(
        (x["attributes"]["durably.step.seq"], x["pid"])
        for x in run_spans
        if x["name"].startswith("step ")
    )
    # a and b by the killed process, c (its interrupted attempt never ended: no span) and d
    # by the one that recovered the run; seq 2 is the sleep.
    assert steps == [(0, first.pid), (1, first.pid), (3, second.pid), (4, second.pid)]
    turns = {x["pid"] for x in run_spans if x["name"].startswith("workflow ")}
    assert turns == {first.pid, second.pid}
    assert [m.split()[0] for m in _marks(tmp_path)] == ["a", "b", "c", "c", "d"]


def test_import_durably_loads_no_opentelemetry() -> None:
    code = (
        "import sys, durably\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_without_the_extra_the_import_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "try:\n    import durably.contrib.opentelemetry\n"
        "except ModuleNotFoundError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'durably[otel]'" in out.stdout


def test_the_tracer_provider_must_be_one() -> None:
    with pytest.raises(TypeError, match="TracerProvider"):
        TracingInterceptor(tracer_provider="console")  # type: ignore[arg-type]
