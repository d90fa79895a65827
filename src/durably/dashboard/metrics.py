"""The Prometheus text of `GET metrics`."""

from __future__ import annotations

from durably._engine.engine import Engine

__all__ = ["GAUGE_CAP", "metrics_text"]

#: Each backlog gauge counts at most this many runs.
GAUGE_CAP = 10_000


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


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
            lines.append(f'durable_group_queue_depth{{group="{_label(g.group)}"}} {g.depth}')
        lines.append("# TYPE durable_group_live_workers gauge")
        for g in groups:
            lines.append(
                f'durable_group_live_workers{{group="{_label(g.group)}"}} {len(g.live_workers)}'
            )
    return "\n".join(line for line in lines if line) + "\n"
