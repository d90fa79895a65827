"""`durably.contrib.opentelemetry`: OpenTelemetry traces of runs (needs `durably[otel]`).

    engine = durably.Engine(interceptors=[TracingInterceptor()])

`TracingInterceptor` is a `durably.Interceptor` that records:

- one trace per run, across all its turns, suspends, evictions, crashes and the processes
  that drive it: the trace id is derived from the run's namespace and id, so every turn of
  the run — a week after its sleep began, or in the process that recovered it — lands in
  the same trace. The turns are children of a root that is never recorded itself (no
  process sees a whole run): its span id is derived from the run id too.
- a span per turn (`workflow <name>`), a span per step attempt (`step <name>`, with the run
  id, workflow, seq, kind and attempt as attributes and an ERROR status when the attempt
  failed) inside it. A step answered from its checkpoint on replay is not an attempt and
  records no span.
- a step sent to a step worker: a `dispatch <name>` span (PRODUCER) whose W3C `traceparent`
  rides on the task; durably's step workers with the interceptor record the step's span
  (CONSUMER) as its child.
- a child run is its own trace, whose turns carry a link to the parent run's trace.
- a client call that changes runs (`durably.start`, `durably.signal`, …) is a span in the
  caller's current trace, with the run id it names.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

from durably._extras import require_otel

require_otel("durably.contrib.opentelemetry")

from opentelemetry import context as otel_context  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.context import Context  # noqa: E402
from opentelemetry.trace import (  # noqa: E402
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    TracerProvider,
)
from opentelemetry.trace.propagation.tracecontext import (  # noqa: E402
    TraceContextTextMapPropagator,
)

from durably._core.errors import StepFailedError  # noqa: E402
from durably._engine.defs.intercept import (  # noqa: E402
    ClientCallInfo,
    Interceptor,
    StepCallInfo,
    TurnInfo,
)

__all__ = ["TracingInterceptor", "run_span_context", "run_trace_id"]

_W3C = TraceContextTextMapPropagator()
_KINDS = {
    "step": SpanKind.INTERNAL,
    "local": SpanKind.INTERNAL,
    "dispatch": SpanKind.PRODUCER,
    "served": SpanKind.CONSUMER,
}


@functools.lru_cache(maxsize=4096)  # every step of a run asks for its trace id
def _digest(namespace: str | None, run_id: str) -> bytes:
    # The namespace is part of the key: run ids are unique across namespaces, but a trace
    # id that also names the partition keeps two deployments sharing a backend apart.
    return hashlib.sha256(f"{namespace or ''}\x00{run_id}".encode()).digest()


def run_trace_id(run_id: str, namespace: str | None = "default") -> int:
    """The trace id of run `run_id` in `namespace`: the first 16 bytes of a SHA-256 of both
    (as every process computes it, so all the run's spans share one trace)."""
    return int.from_bytes(_digest(namespace, run_id)[:16], "big") or 1


def run_span_context(run_id: str, namespace: str | None = "default") -> SpanContext:
    """The (unrecorded) root of run `run_id`'s trace: a remote, sampled span context with
    the run's trace id and a span id derived from the run id."""
    digest = _digest(namespace, run_id)
    return SpanContext(
        trace_id=int.from_bytes(digest[:16], "big") or 1,
        span_id=int.from_bytes(digest[16:24], "big") or 1,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )


def _run_context(run_id: str, namespace: str | None) -> Context:
    return trace.set_span_in_context(NonRecordingSpan(run_span_context(run_id, namespace)))


class TracingInterceptor(Interceptor):
    """Records OpenTelemetry spans of turns, step attempts and client calls (module doc).
    `tracer_provider`: where the spans go (None: the global provider)."""

    def __init__(self, tracer_provider: TracerProvider | None = None):
        if tracer_provider is not None and not isinstance(tracer_provider, TracerProvider):
            raise TypeError(
                "TracingInterceptor(tracer_provider=...) must be an OpenTelemetry "
                f"TracerProvider, not {type(tracer_provider).__name__}"
            )
        self._tracer: Tracer = trace.get_tracer("durably", tracer_provider=tracer_provider)

    async def intercept_turn(
        self, info: TurnInfo, call_next: Callable[[], Awaitable[None]]
    ) -> None:
        links = []
        if info.parent_run_id is not None:
            links.append(
                Link(
                    run_span_context(info.parent_run_id, info.namespace),
                    {"durably.link": "parent_run"},
                )
            )
        attributes: dict[str, str | bool] = {
            "durably.run_id": info.run_id,
            "durably.workflow": info.workflow,
            "durably.namespace": info.namespace or "",
            "durably.turn.resumed": info.resumed,
        }
        if info.parent_run_id is not None:
            attributes["durably.parent_run_id"] = info.parent_run_id
        with self._tracer.start_as_current_span(
            f"workflow {info.workflow}",
            context=_run_context(info.run_id, info.namespace),
            attributes=attributes,
            links=links,
        ):
            await call_next()

    async def intercept_step(
        self, info: StepCallInfo, call_next: Callable[[], Awaitable[Any]]
    ) -> Any:
        # The step's name is the span's; the namespace is in the trace id. Fewer attributes
        # keep the span cheap: a step pays for this on every attempt.
        span = self._tracer.start_span(
            f"dispatch {info.step}" if info.kind == "dispatch" else f"step {info.step}",
            context=self._step_parent(info),
            kind=_KINDS[info.kind],
            attributes={
                "durably.run_id": info.run_id,
                "durably.workflow": info.workflow or "",
                "durably.step.seq": info.seq,
                "durably.step.kind": info.kind,
                "durably.step.attempt": info.attempt,
            },
            record_exception=False,
            set_status_on_exception=False,
        )
        return await _within(span, call_next)

    async def intercept_client(
        self, info: ClientCallInfo, call_next: Callable[[], Awaitable[Any]]
    ) -> Any:
        attributes: dict[str, str] = {"durably.namespace": info.namespace or ""}
        for key, value in (
            ("durably.run_id", info.run_id),
            ("durably.workflow", info.workflow),
            ("durably.token", info.token),
        ):
            if value is not None:
                attributes[key] = value
        span = self._tracer.start_span(
            f"durably.{info.verb}",
            kind=SpanKind.CLIENT,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )
        return await _within(span, call_next)

    def traceparent(self) -> str | None:
        carrier: dict[str, str] = {}
        _W3C.inject(carrier)
        return carrier.get("traceparent")

    def _step_parent(self, info: StepCallInfo) -> Context:
        """The parent of a step's span: the dispatching span for a served step that carries
        one; else the current span when it belongs to the run's trace (the turn); else the
        run's root."""
        if info.kind == "served" and info.traceparent is not None:
            carried = _W3C.extract({"traceparent": info.traceparent})
            if trace.get_current_span(carried).get_span_context().is_valid:
                return carried
        current = trace.get_current_span()
        if current.get_span_context().trace_id == run_trace_id(info.run_id, info.namespace):
            return otel_context.get_current()
        return _run_context(info.run_id, info.namespace)


async def _within(span: Span, call_next: Callable[[], Awaitable[Any]]) -> Any:
    """`call_next()` with `span` current, ended after it; a failure sets its ERROR status.
    Recorded by hand: a step's StepFailedError carries the error the engine recorded (its
    message and code), which is what the span should say."""
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        return await call_next()
    except StepFailedError as exc:
        error = exc.step_error
        span.set_attribute("durably.error.code", error.code or "")
        span.set_status(Status(StatusCode.ERROR, error.message))
        raise
    except Exception as exc:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        otel_context.detach(token)
        span.end()
