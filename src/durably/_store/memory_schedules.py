"""Persisted schedules in the memory store (`ScheduleStore`), kept as the SQL store keeps them.

Each record is held as its columns with the two JSON documents as text, so a value JSON
cannot hold is refused here as it is by SQL, and every read builds a fresh record (nothing
the caller changes reaches the store). No method awaits, so the compare-and-set write is
atomic with respect to other tasks.
"""

from __future__ import annotations

from durably._core.schedules import (
    ScheduleQuery,
    ScheduleRecord,
    check_put,
    check_query,
    record_from_row,
    spec_json,
    state_json,
)
from durably._store.memory_tables import MemoryTables

__all__ = ["MemorySchedules"]

# id -> (workflow, namespace, paused, next_fire_at, created_at, updated_at, spec, state)
_Row = tuple[str, str, bool, int | None, int, int, str, str]


class MemorySchedules:
    def __init__(self, tables: MemoryTables) -> None:
        self._tables = tables
        self._rows: dict[str, _Row] = {}

    async def put_schedule(
        self,
        record: ScheduleRecord,
        *,
        if_absent: bool = False,
        expected_updated_at: int | None = None,
    ) -> bool:
        self._tables.tick()
        check_put(record, if_absent, expected_updated_at)
        row: _Row = (
            record.workflow,
            record.namespace,
            bool(record.paused),
            record.next_fire_at,
            record.created_at,
            record.updated_at,
            spec_json(record),
            state_json(record),
        )
        held = self._rows.get(record.id)
        if if_absent and held is not None:
            return False
        if expected_updated_at is not None and (held is None or held[5] != expected_updated_at):
            return False
        self._rows[record.id] = row
        return True

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        self._tables.tick()
        row = self._rows.get(schedule_id)
        return None if row is None else record_from_row(schedule_id, *row)

    async def delete_schedule(self, schedule_id: str) -> bool:
        self._tables.tick()
        return self._rows.pop(schedule_id, None) is not None

    async def list_schedules(self, query: ScheduleQuery) -> list[ScheduleRecord]:
        self._tables.tick()
        check_query(query)
        found = [
            (sid, row)
            for sid, row in self._rows.items()
            if (query.workflow is None or row[0] == query.workflow)
            and (query.namespace is None or row[1] == query.namespace)
            and (query.paused is None or row[2] == query.paused)
            and (query.due_before is None or (row[3] is not None and row[3] <= query.due_before))
        ]
        found.sort(key=lambda item: (item[1][3] is None, item[1][3] or 0, item[0]))
        chosen = found[query.offset : query.offset + query.limit]
        return [record_from_row(sid, *row) for sid, row in chosen]
