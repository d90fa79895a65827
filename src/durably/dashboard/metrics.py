"""The Prometheus text of `GET metrics`."""

from __future__ import annotations

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


async def metrics_text(engine: Engine) -> str:
    """Event counters since boot, then backlog gauges read now; ends with a newline."""
    lines = [engine.metrics().to_prometheus().rstrip("\n")]
    for status in ("pending", "running", "dead"):
        count = await engine.count_runs(status=status)
        lines.append(f"# TYPE durable_{status}_runs gauge")
        lines.append(f"durable_{status}_runs {min(count, GAUGE_CAP)}")
    groups = await engine.worker_health()
    if groups:
        lines.append("# TYPE durable_group_queue_depth gauge")
        for g in groups:
            lines.append(f"durable_group_queue_depth{{{_group_labels(g)}}} {g.depth}")
        lines.append("# TYPE durable_group_live_workers gauge")
        for g in groups:
            lines.append(f"durable_group_live_workers{{{_group_labels(g)}}} {len(g.live_workers)}")
    return "\n".join(line for line in lines if line) + "\n"
