"""The cost of the Prometheus metrics: feeding the event-fed counters per step, and rendering
a scrape, for a growing number of label sets.

Feeds `--events` step events (a started, a completed with a duration, every tenth a failed
one) through the engine's `EventBus` on its no-subscriber path, spread over `W × S`
(workflow, step) label sets, and times it per event; then renders the exposition of those
series (`prometheus_client.generate_latest` over the collector's families, the gauges
empty) and times one render. Prints one JSON line per label-set count: ``label_sets``,
``ns_per_step_event``, ``render_ms``, ``exposition_bytes``. Usage::

    python benchmarks/metrics_feed.py [--events 200000]

No store is involved: the scrape's store reads are aggregate counts whose cost is the
store's, not the number of series.
"""

from __future__ import annotations

import argparse
import json
import time

from prometheus_client.exposition import generate_latest

from durably._core.models import StepError
from durably._engine.defs.events import EventBus
from durably._observe.families import Readings, families

ERROR = StepError(message="boom", code="declined")


class _Families:
    def __init__(self, readings: Readings) -> None:
        self._readings = readings

    def collect(self) -> list[object]:
        return list(families(self._readings))


def measure(events: int, workflows: int, steps: int) -> dict[str, object]:
    bus = EventBus()
    names = [(f"wf{w}", f"step{s}") for w in range(workflows) for s in range(steps)]
    t0 = time.perf_counter_ns()
    for i in range(events):
        workflow, step = names[i % len(names)]
        bus.count_step("started", workflow, step, attempt=1)
        if i % 10 == 9:
            bus.count_step("failed", workflow, step, duration_ms=3.0, error=ERROR)
        else:
            bus.count_step("completed", workflow, step, duration_ms=3.0)
    feed_ns = time.perf_counter_ns() - t0
    readings = Readings(bus.series(), {"pending": 0}, [], [])
    t1 = time.perf_counter_ns()
    text = generate_latest(_Families(readings))  # type: ignore[arg-type]
    render_ns = time.perf_counter_ns() - t1
    return {
        "label_sets": len(names),
        "ns_per_step_event": round(feed_ns / (2 * events), 1),
        "render_ms": round(render_ns / 1e6, 2),
        "exposition_bytes": len(text),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args()
    for workflows, steps in ((1, 1), (10, 10), (20, 50)):
        print(json.dumps({"bench": "metrics_feed", **measure(args.events, workflows, steps)}))


if __name__ == "__main__":
    main()
