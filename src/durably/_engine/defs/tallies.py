"""Labelled counters and duration histograms fed by the engine's events, for a metrics
exposition to read when it is scraped.

Plain dictionaries: feeding one event is a few dictionary updates and one bisect over a
fixed bucket list, so the per-step cost does not grow with the number of runs, and `import
durably` needs no metrics library (the Prometheus exposition is built from a snapshot).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "COUNTERS",
    "HISTOGRAMS",
    "OVERFLOW",
    "RUN_SECONDS",
    "SERIES_CAP",
    "STEP_SECONDS",
    "Histogram",
    "MetricSeries",
    "Tallies",
]

#: Upper bounds (seconds) of the step duration buckets: a step is usually one I/O call.
STEP_SECONDS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
)  # fmt: skip
#: Upper bounds (seconds) of the run duration buckets: a run's life includes its durable
#: sleeps and waits, so they reach a week.
RUN_SECONDS: tuple[float, ...] = (
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 6 * 3600.0,
    86400.0, 7 * 86400.0,
)  # fmt: skip

#: At most this many label sets per family; past it new label sets are counted under one
#: overflow series, so a flood of distinct names or error codes cannot grow the memory (or
#: the scrape) without bound, and no event goes uncounted.
SERIES_CAP = 2_000
#: The label value every label of the overflow series takes.
OVERFLOW = "__overflow__"


#: The counter families the event path feeds, with their label names (in order).
COUNTERS: dict[str, tuple[str, ...]] = {
    "runs_started": ("workflow",),
    "runs_completed": ("workflow",),
    "runs_failed": ("workflow", "code"),
    "runs_cancelled": ("workflow",),
    "runs_routed": ("workflow", "code"),
    "runs_unrouted": ("workflow",),
    "runs_blocked": ("workflow",),
    "steps_completed": ("workflow", "step"),
    "steps_failed": ("workflow", "step", "code"),
    "step_retries": ("workflow", "step"),
}
#: The histogram families, with their label names and bucket bounds.
HISTOGRAMS: dict[str, tuple[tuple[str, ...], tuple[float, ...]]] = {
    "step_seconds": (("workflow", "step"), STEP_SECONDS),
    "run_seconds": (("workflow", "outcome"), RUN_SECONDS),
}


@dataclass(slots=True)
class Histogram:
    """Observations per bucket (not cumulative; the last one is above every bound), their
    sum and count."""

    buckets: list[int]
    sum: float = 0.0
    count: int = 0

    def copy(self) -> Histogram:
        return Histogram(list(self.buckets), self.sum, self.count)


Labels = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MetricSeries:
    """A copy of the tallies at one moment: counters and histograms by family name, each a
    mapping from its label values (in the family's label order) to the value."""

    counters: dict[str, dict[Labels, int]]
    histograms: dict[str, dict[Labels, Histogram]]


def _capped(table: Mapping[Labels, object], labels: Labels) -> Labels:
    if labels in table or len(table) < SERIES_CAP:
        return labels
    return (OVERFLOW,) * len(labels)


class Tallies:
    """Counters and histograms by family and label values, fed on the event path."""

    def __init__(self) -> None:
        self._counters: dict[str, dict[Labels, int]] = {}
        self._histograms: dict[str, dict[Labels, Histogram]] = {}

    def add(self, family: str, labels: Labels) -> None:
        table = self._counters.setdefault(family, {})
        labels = _capped(table, labels)
        table[labels] = table.get(labels, 0) + 1

    def observe(
        self, family: str, labels: Labels, seconds: float, bounds: tuple[float, ...]
    ) -> None:
        table = self._histograms.setdefault(family, {})
        labels = _capped(table, labels)
        histogram = table.get(labels)
        if histogram is None:
            histogram = table[labels] = Histogram([0] * (len(bounds) + 1))
        # `le` buckets: the first bound at or above the value holds it.
        histogram.buckets[bisect_left(bounds, seconds)] += 1
        histogram.sum += seconds
        histogram.count += 1

    def snapshot(self) -> MetricSeries:
        return MetricSeries(
            counters={family: dict(table) for family, table in self._counters.items()},
            histograms={
                family: {labels: h.copy() for labels, h in table.items()}
                for family, table in self._histograms.items()
            },
        )
