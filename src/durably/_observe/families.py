"""What one scrape reports, read on the engine's loop, and the Prometheus metric families
built from it.

`Readings` is everything a scrape shows, read at once: the engine's event-fed counters and
histograms (a copy of plain dictionaries), and the gauges the store and the flow-control
backend answer with aggregate reads (run counts by status, worker groups, queues) — never a
scan of the runs themselves. `families` turns it into the library's metric families, which
write the `# HELP`/`# TYPE` lines and escape every label value.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric

from durably._engine.client.client import Client
from durably._engine.defs.tallies import COUNTERS, HISTOGRAMS, MetricSeries
from durably._engine.engine import Engine
from durably._engine.flow.queues import QueueReport
from durably._read.list_models import GroupHealth

__all__ = ["BACKLOG_STATUSES", "METRICS", "Readings", "families", "read"]

#: The run statuses whose counts `durable_runs` reports.
BACKLOG_STATUSES = ("pending", "running", "suspended", "blocked", "dead")

#: Every metric: (name as scraped, type, labels, help). The docs' table lists the same.
METRICS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("durable_runs_started_total", "counter", COUNTERS["runs_started"],
     "Runs this engine started driving (pending to running)."),
    ("durable_runs_completed_total", "counter", COUNTERS["runs_completed"],
     "Runs that completed here."),
    ("durable_runs_failed_total", "counter", COUNTERS["runs_failed"],
     "Runs that failed here (dead-lettered ones included), by the error's code."),
    ("durable_runs_cancelled_total", "counter", COUNTERS["runs_cancelled"],
     "Runs cancelled through this engine (a cancel, an execution timeout) or while it drove them."),
    ("durable_runs_routed_total", "counter", COUNTERS["runs_routed"],
     "Failed runs handed to an onError handler, by the error's code."),
    ("durable_runs_unrouted_total", "counter", COUNTERS["runs_unrouted"],
     "Failed runs not routed because the live workers disagree on the routes."),
    ("durable_runs_blocked_total", "counter", COUNTERS["runs_blocked"],
     "Times a run was parked because no live worker offers what its next step requires."),
    ("durable_steps_completed_total", "counter", COUNTERS["steps_completed"],
     "Step attempts that completed."),
    ("durable_steps_failed_total", "counter", COUNTERS["steps_failed"],
     "Step attempts that failed, by the error's code."),
    ("durable_step_retries_total", "counter", COUNTERS["step_retries"],
     "Step attempts after the first (retries)."),
    ("durable_step_duration_seconds", "histogram", HISTOGRAMS["step_seconds"][0],
     "Duration of completed step attempts."),
    ("durable_run_duration_seconds", "histogram", HISTOGRAMS["run_seconds"][0],
     "Life of runs that ended, from creation to their end (waits included)."),
    ("durable_runs", "gauge", ("status",),
     "Runs in the store by status, now."),
    ("durable_group_queue_depth", "gauge", ("group", "transport"),
     "Backlog of a worker group (a namespace's runs, or a transport's routing token)."),
    ("durable_group_live_workers", "gauge", ("group", "transport"),
     "Workers seen alive in a worker group."),
    ("durable_queue_in_flight", "gauge", ("queue",),
     "Slots of a flow-control queue held now."),
    ("durable_queue_waiting", "gauge", ("queue",),
     "Places in line for a flow-control queue now."),
    ("durable_queue_window_admissions", "gauge", ("queue",),
     "Admissions in a queue's current rate window."),
    ("durable_queue_admitted_total", "counter", ("queue",),
     "Admissions this engine was given by a queue."),
    ("durable_queue_denied_total", "counter", ("queue",),
     "Admissions this engine was refused by a queue."),
    ("durable_queue_blocked", "gauge", ("queue", "reason"),
     "1 for the reason a step asking a queue now is turned away, else 0."),
)  # fmt: skip

_BY_NAME = {name: (kind, labels, text) for name, kind, labels, text in METRICS}
# The series family each event-fed metric reads (`durably._engine.defs.tallies`).
_COUNTER_OF = {f"durable_{family}_total": family for family in COUNTERS}
_HISTOGRAM_OF = {
    "durable_step_duration_seconds": "step_seconds",
    "durable_run_duration_seconds": "run_seconds",
}


@dataclass(frozen=True, slots=True)
class Readings:
    """One scrape's values. `series` is None over a `Client` (no events), as are worker
    groups and queues (empty), which need an engine."""

    series: MetricSeries | None
    runs: dict[str, int]
    groups: list[GroupHealth]
    queues: list[QueueReport]


async def read(source: Engine | Client) -> Readings:
    """Read everything a scrape shows. Over an engine, call it on the engine's loop (the
    counters are copied there, consistent with the events that feed them)."""
    runs = {status: await source.count_runs(status=status) for status in BACKLOG_STATUSES}
    if not isinstance(source, Engine):
        return Readings(None, runs, [], [])
    series = source.metric_series()
    return Readings(series, runs, await source.worker_health(), await source.queue_stats())


def _counter(name: str) -> CounterMetricFamily:
    _, labels, text = _BY_NAME[name]
    return CounterMetricFamily(name, text, labels=labels)


def _gauge(name: str) -> GaugeMetricFamily:
    _, labels, text = _BY_NAME[name]
    return GaugeMetricFamily(name, text, labels=labels)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def _series_families(series: MetricSeries) -> Iterator[Metric]:
    for name, family in _COUNTER_OF.items():
        counter = _counter(name)
        for labels, value in sorted(series.counters.get(family, {}).items()):
            counter.add_metric(list(labels), value)
        yield counter
    for name, family in _HISTOGRAM_OF.items():
        _, labels_of, text = _BY_NAME[name]
        bounds = HISTOGRAMS[family][1]
        histogram = HistogramMetricFamily(name, text, labels=labels_of)
        for labels, h in sorted(series.histograms.get(family, {}).items()):
            cumulative, buckets = 0, []
            for bound, n in zip((*bounds, float("inf")), h.buckets, strict=True):
                cumulative += n
                buckets.append((_le(bound), float(cumulative)))
            histogram.add_metric(list(labels), buckets, h.sum)
        yield histogram


def _group_families(groups: list[GroupHealth]) -> Iterator[Metric]:
    depth = _gauge("durable_group_queue_depth")
    live = _gauge("durable_group_live_workers")
    for g in groups:
        # A token a transport reports carries that transport's id: the same token on two
        # members of a pool is two queues, so the transport is a label ("" for the store's).
        labels = [g.group, g.transport or ""]
        depth.add_metric(labels, g.depth)
        live.add_metric(labels, len(g.live_workers))
    yield depth
    yield live


def _queue_families(queues: list[QueueReport]) -> Iterator[Metric]:
    in_flight = _gauge("durable_queue_in_flight")
    waiting = _gauge("durable_queue_waiting")
    window = _gauge("durable_queue_window_admissions")
    for r in queues:
        in_flight.add_metric([r.queue.name], r.in_flight)
        waiting.add_metric([r.queue.name], r.waiting)
        window.add_metric([r.queue.name], r.window_count)
    yield in_flight
    yield waiting
    yield window
    admitted = _counter("durable_queue_admitted_total")
    denied = _counter("durable_queue_denied_total")
    blocked = _gauge("durable_queue_blocked")
    for r in queues:
        admitted.add_metric([r.queue.name], r.admitted)
        denied.add_metric([r.queue.name], r.denied)
        for reason in ("concurrency", "rate"):
            blocked.add_metric([r.queue.name, reason], 1 if r.blocked == reason else 0)
    yield admitted
    yield denied
    yield blocked


def families(readings: Readings) -> Iterator[Metric]:
    """The metric families of one scrape (over a `Client`: only `durable_runs`)."""
    runs = _gauge("durable_runs")
    for status, count in readings.runs.items():
        runs.add_metric([status], count)
    yield runs
    if readings.series is None:
        return
    yield from _series_families(readings.series)
    yield from _group_families(readings.groups)
    yield from _queue_families(readings.queues)
