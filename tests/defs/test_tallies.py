"""The event-fed tallies behind the metrics: `le` buckets, copies, and the cap on label
sets per family."""

from __future__ import annotations

from durably._engine.defs.tallies import OVERFLOW, SERIES_CAP, Tallies


def test_buckets_are_le_and_a_snapshot_is_a_copy() -> None:
    t = Tallies()
    bounds = (0.1, 1.0)
    for seconds in (0.1, 0.5, 1.0, 7.0):
        t.observe("h", ("wf",), seconds, bounds)
    t.add("c", ("wf",))
    snap = t.snapshot()
    h = snap.histograms["h"][("wf",)]
    assert h.buckets == [1, 2, 1]  # 0.1 is in le=0.1; 1.0 in le=1.0; 7.0 above every bound
    assert (h.count, h.sum) == (4, 8.6)
    t.observe("h", ("wf",), 0.05, bounds)
    t.add("c", ("wf",))
    assert snap.histograms["h"][("wf",)].count == 4 and snap.counters["c"][("wf",)] == 1


def test_past_the_cap_new_label_sets_count_under_overflow() -> None:
    t = Tallies()
    for i in range(SERIES_CAP + 5):
        t.add("c", (f"wf{i}", "code"))
    t.add("c", ("wf0", "code"))  # a known label set still counts as itself
    counters = t.snapshot().counters["c"]
    assert len(counters) == SERIES_CAP + 1
    assert counters[(OVERFLOW, OVERFLOW)] == 5
    assert counters[("wf0", "code")] == 2
    assert sum(counters.values()) == SERIES_CAP + 6  # nothing lost
