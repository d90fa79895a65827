"""Persisted schedule records beyond the store contract (whose cases are the suite's
`ScheduleCases`): the codec keeping a schedule's input encoded at rest, and the memory store
answering copies."""

from __future__ import annotations

import dataclasses
from typing import Any

from durably import InMemoryStateStore
from durably._core.schedules import ScheduleQuery, ScheduleState
from durably._store.codec import CodecStateStore
from durably.testing.conformance.state_store.schedules import schedule_record as rec
from tests.store.test_codec import TagCodec, enc


async def test_the_codec_encodes_the_input_and_nothing_else(store: Any) -> None:
    wrapped = CodecStateStore(store, TagCodec())
    written = rec("s", state=ScheduleState(note="kept readable"))
    assert await wrapped.put_schedule(written, if_absent=True) is True
    raw = await store.get_schedule("s")
    assert raw is not None
    assert raw.spec["input"] == enc({"team": "ops"})  # encoded at rest
    assert {k: v for k, v in raw.spec.items() if k != "input"} == {
        k: v for k, v in written.spec.items() if k != "input"
    }
    assert raw.state == {"note": "kept readable"}
    assert await wrapped.get_schedule("s") == written
    assert await wrapped.list_schedules(ScheduleQuery()) == [written]
    cas = dataclasses.replace(written, updated_at=2)
    assert await wrapped.put_schedule(cas, expected_updated_at=1_000) is True
    assert await wrapped.get_schedule("s") == cas


async def test_memory_reads_are_copies() -> None:
    store = InMemoryStateStore()
    await store.put_schedule(rec("s"))
    got = await store.get_schedule("s")
    assert got is not None
    got.spec["input"] = "changed"
    got.state["fired_count"] = 99
    again = await store.get_schedule("s")
    assert again is not None and again.spec["input"] == {"team": "ops"}
    assert again.state["fired_count"] == 0
