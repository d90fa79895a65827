"""The Prometheus text of `GET metrics`."""

from __future__ import annotations

from durably._engine.client.client import Client
from durably._engine.engine import Engine
from durably._read.list_models import GroupHealth

__all__ = ["GAUGE_CAP", "metrics_text"]

#: Each backlog gauge counts at most this many runs.
GAUGE_CAP = 10_000


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _group_labels(g: GroupHealth) -> str:
    # A token a transport reports carries that transport's id: the same token on two members
    # of a pool is two queues, and two series with one label set would be refused by a scraper.
    labels = f'group="{_label(g.group)}"'
    if g.transport is not None:
        labels += f',transport="{_label(g.transport)}"'
    return labels


async def metrics_text(reads: Client | Engine) -> str:
    """Event counters since boot, then backlog gauges read now, then the flow-control
    queues'; ends with a newline. Over a `Client` (no worker, so no events, worker health or
    queues) only the backlog gauges, which the store answers."""
    engine = reads if isinstance(reads, Engine) else None
    lines = [engine.metrics().to_prometheus().rstrip("\n")] if engine is not None else []
    for status in ("pending", "running", "dead"):
        count = await reads.count_runs(status=status)
        lines.append(f"# TYPE durable_{status}_runs gauge")
        lines.append(f"durable_{status}_runs {min(count, GAUGE_CAP)}")
    if engine is None:
        return "\n".join(lines) + "\n"
    groups = await engine.worker_health()
    if groups:
        lines.append("# TYPE durable_group_queue_depth gauge")
        for g in groups:
            lines.append(f"durable_group_queue_depth{{{_group_labels(g)}}} {g.depth}")
        lines.append("# TYPE durable_group_live_workers gauge")
        for g in groups:
            lines.append(f"durable_group_live_workers{{{_group_labels(g)}}} {len(g.live_workers)}")
    lines.extend(await queue_lines(engine))
    return "\n".join(line for line in lines if line) + "\n"


#: The queue series: (name, type, the QueueReport attribute it reads).
_QUEUE_SERIES = (
    ("durable_queue_in_flight", "gauge", "in_flight"),
    ("durable_queue_waiting", "gauge", "waiting"),
    ("durable_queue_window_admissions", "gauge", "window_count"),
    ("durable_queue_admitted_total", "counter", "admitted"),
    ("durable_queue_denied_total", "counter", "denied"),
)


async def queue_lines(engine: Engine) -> list[str]:
    """One series per registered queue: slots held and places in line (on the admission
    backend, so fleet-wide when it is shared), admissions in the current rate window, this
    engine's admitted and denied answers, and `durable_queue_blocked{queue,reason}` (1 for
    the reason a step asking now is turned away, 0 for the other)."""
    reports = await engine.queue_stats()
    if not reports:
        return []
    lines: list[str] = []
    for name, kind, attr in _QUEUE_SERIES:
        lines.append(f"# TYPE {name} {kind}")
        for r in reports:
            lines.append(f'{name}{{queue="{_label(r.queue.name)}"}} {getattr(r, attr)}')
    lines.append("# TYPE durable_queue_blocked gauge")
    for r in reports:
        for reason in ("concurrency", "rate"):
            on = 1 if r.blocked == reason else 0
            lines.append(
                f'durable_queue_blocked{{queue="{_label(r.queue.name)}",reason="{reason}"}} {on}'
            )
    return lines
