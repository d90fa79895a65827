"""The SQL transport's tables: the statements of one table prefix and the conversions between
their rows and the wire's tasks and results (the columns and their meaning are `durable-worker`'s
own; `sql.py` explains the protocol).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from durably._core.bounds import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    PayloadRejectedError,
    check_wire_int,
    loads_untrusted,
)
from durably._core.models import StepError
from durably._core.wire import (
    RemoteTask,
    StepResult,
    WireFormatError,
    error_to_wire,
    parse_remote_task,
    parse_step_result,
    step_id_of,
)

#: The longest prefix whose derived names (`<prefix>_transport_results_notify`) fit
#: PostgreSQL's 63-byte identifiers; longer ones would be silently truncated and could collide.
_MAX_PREFIX = 38
_PREFIX = re.compile(r"^[A-Za-z0-9_-]+$")

#: Ids are varchar(191) in the shared DDL.
MAX_ID = 191
#: The latest `started_at` a result row may carry: 9999-12-31T23:59:59.999Z in epoch ms, the
#: last instant a datetime holds. A time in micro- or nanoseconds is far beyond it (a worker's
#: unit bug), and settling it would fail on every try.
MAX_TIMESTAMP_MS = 253_402_300_799_999
#: The code of the failed attempt that stands in for a result row no sink can use.
MALFORMED_RESULT = "malformed_result"

__all__ = [
    "MALFORMED_RESULT",
    "MAX_ID",
    "MAX_TIMESTAMP_MS",
    "Connect",
    "SqlSettings",
    "Statements",
    "channel",
    "dumps",
    "now_ms",
    "result_of_row",
    "result_params",
    "stand_in_for",
    "task_of_row",
]


def now_ms() -> int:
    return int(time.time() * 1000)


def dumps(value: Any) -> str:
    # allow_nan=False: NaN is not JSON, and a worker in another language could not read it.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def channel(schema: str, table: str) -> str:
    """The NOTIFY channel of a table; the trigger computes the same name in SQL."""
    digest = hashlib.md5(f"{schema}.{table}".encode(), usedforsecurity=False).hexdigest()
    return "durably_transport_" + digest[:16]


class Statements:
    """The statements of one table prefix (identifiers quoted; values always bound)."""

    def __init__(self, prefix: str):
        if not _PREFIX.match(prefix) or len(prefix) > _MAX_PREFIX:
            raise ValueError(
                f"invalid transport table prefix {prefix!r}: use letters, digits, '_' and '-', "
                f"at most {_MAX_PREFIX} characters"
            )
        self.prefix = prefix
        self.tasks_name = f"{prefix}_transport_tasks"
        self.results_name = f"{prefix}_transport_results"
        t, r = f'"{self.tasks_name}"', f'"{self.results_name}"'
        # Column for column the SDK's DDL: a divergent table would be kept by its
        # IF NOT EXISTS and break its inserts.
        self.create_tables = [
            f'CREATE TABLE IF NOT EXISTS {t} ("step_id" varchar(191) PRIMARY KEY, '
            '"run_id" varchar(191) NOT NULL, "seq" integer NOT NULL, '
            '"name" varchar(191) NOT NULL, "grp" varchar(191) NOT NULL, "input" text, '
            '"attempt" integer NOT NULL, "status" varchar(32) NOT NULL, '
            '"claimed_by" varchar(191), "claimed_at" bigint, "created_at" bigint NOT NULL)',
            f'CREATE TABLE IF NOT EXISTS {r} ("step_id" varchar(191) PRIMARY KEY, '
            '"run_id" varchar(191) NOT NULL, "seq" integer NOT NULL, '
            '"status" varchar(32) NOT NULL, "output" text, "error" text, "started_at" bigint, '
            '"claimed_by" varchar(191), "claimed_at" bigint, "created_at" bigint NOT NULL)',
            f'CREATE INDEX IF NOT EXISTS "{self.tasks_name}_grp_idx" ON {t} '
            '("grp","status","created_at")',
        ]
        # A new task row, and in the same statement the removal of a result row of that step
        # under a live claim (see the module docstring); returns 1 when the row was inserted.
        self.insert_task = (
            f'WITH ins AS (INSERT INTO {t} ("step_id","run_id","seq","name","grp","input",'
            '"attempt","status","created_at") VALUES ($1,$2,$3,$4,$5,$6,$7,\'pending\',$8) '
            'ON CONFLICT ("step_id") DO NOTHING RETURNING "step_id"), '
            f'dropped AS (DELETE FROM {r} WHERE "step_id" IN (SELECT "step_id" FROM ins) '
            'AND "claimed_at" >= $9) SELECT count(*) FROM ins'
        )
        self.lock_task = f'SELECT "attempt","claimed_at" FROM {t} WHERE "step_id" = $1 FOR UPDATE'
        self.delete_task = f'DELETE FROM {t} WHERE "step_id" = $1'
        self.claim_results = self._claim(r, "TRUE", 1)
        self.claim_tasks = self._claim(t, '"grp" = ANY($1::varchar[])', 2)
        self.ack_results = (
            f'DELETE FROM {r} WHERE "step_id" = ANY($1::varchar[]) '
            'AND "claimed_by" = $2 AND "claimed_at" = $3'
        )
        self.release_results = (
            f'UPDATE {r} SET "claimed_by" = NULL, "claimed_at" = NULL '
            'WHERE "step_id" = ANY($1::varchar[]) AND "claimed_by" = $2 AND "claimed_at" = $3'
        )
        self.release_tasks = self.release_results.replace(r, t)
        self.renew_tasks = (
            f'UPDATE {t} SET "claimed_at" = $3 WHERE "step_id" = ANY($1::varchar[]) '
            'AND "claimed_by" = $2'
        )
        self.insert_result = (
            f'INSERT INTO {r} ("step_id","run_id","seq","status","output","error",'
            '"started_at","created_at") VALUES ($1,$2,$3,$4,$5,$6,$7,$8) '
            'ON CONFLICT ("step_id") DO NOTHING'
        )
        # Only the attempt that ran: a newer attempt that replaced the row must still run.
        self.finish_task = f'DELETE FROM {t} WHERE "step_id" = $1 AND "attempt" = $2'
        self.has_trigger = (
            "SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass($1) "
            f"AND tgname = '{prefix}_transport_notify'"
        )
        self.table_schema = (
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = to_regclass($1)"
        )

    @staticmethod
    def _claim(table: str, where: str, first: int) -> str:
        """The SDK's claim — the oldest rows whose lease is free or expired, locked with SKIP
        LOCKED and stamped — as one statement: one round trip, still one transaction.
        Parameters: [filter,] stale_before, limit, claimed_by, claimed_at."""
        a, b, c, d = (f"${first + i}" for i in range(4))
        return (
            f'UPDATE {table} SET "claimed_by" = {c}, "claimed_at" = {d} WHERE "step_id" IN '
            f'(SELECT "step_id" FROM {table} WHERE {where} AND ("claimed_at" IS NULL OR '
            f'"claimed_at" < {a}) ORDER BY "created_at" ASC LIMIT {b} FOR UPDATE SKIP LOCKED) '
            "RETURNING *"
        )

    def notify_ddl(self) -> list[tuple[str, str, str]]:
        """(function DDL, trigger DDL, table name) of the two NOTIFY triggers. The channel is
        computed in SQL exactly as `channel` does; tasks carry their routing token."""
        out = []
        for table, level, payload in (
            (self.tasks_name, "ROW", 'NEW."grp"'),
            (self.results_name, "STATEMENT", "''"),
        ):
            function = (
                f'CREATE OR REPLACE FUNCTION "{table}_notify"() RETURNS trigger LANGUAGE plpgsql '
                "AS $fn$ BEGIN PERFORM pg_notify('durably_transport_' || "
                f"left(md5(TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME), 16), {payload}); "
                "RETURN NULL; END $fn$"
            )
            trigger = (
                f'CREATE TRIGGER "{self.prefix}_transport_notify" AFTER INSERT ON "{table}" '
                f'FOR EACH {level} EXECUTE FUNCTION "{table}_notify"()'
            )
            out.append((function, trigger, table))
        return out


# ------------------------------------------------------------------ rows


@dataclass(frozen=True, slots=True)
class SqlSettings:
    """What the result drain and the step servers read of their transport's settings (fixed
    when the transport is made)."""

    sql: Statements
    instance_id: str
    poll_s: float
    lease_ms: int
    batch_size: int
    max_payload_bytes: int


class Connect(Protocol):
    """Lends one pooled connection of the transport for `doing`: a database failure inside
    becomes a `TransportUnavailableError` saying what was being done."""

    def __call__(self, doing: str) -> AbstractAsyncContextManager[Any]: ...


def task_of_row(row: Any, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> RemoteTask:
    """The task a row describes — the envelope the SDK builds — or WireFormatError (also for
    an `input` too big, too deep or holding a number that is not JSON)."""
    raw_input = row["input"]
    try:
        value = (
            None
            if raw_input is None
            else loads_untrusted(raw_input, what="`input`", max_bytes=max_bytes)
        )
    except PayloadRejectedError as exc:
        raise WireFormatError("step task", str(exc), row["step_id"]) from None
    ids = {"runId": row["run_id"], "seq": row["seq"], "stepId": row["step_id"]}
    routing = {"name": row["name"], "group": row["grp"], "attempt": row["attempt"]}
    return parse_remote_task({**ids, **routing, "input": value})


def result_of_row(row: Any, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> StepResult:
    """The result a row describes, or WireFormatError. Every column is checked here, at the
    boundary, so that what reaches the sink can be stored: `output` and `error` are JSON of at
    most `max_bytes` each, without NaN/Infinity, nested at most 128 levels and without lone
    surrogates (`loads_untrusted`); `started_at` is an epoch-ms time a datetime can hold.
    NULL reads as absent."""
    step_id = row["step_id"]
    data: dict[str, Any] = {"runId": row["run_id"], "seq": row["seq"], "stepId": step_id}
    data["status"] = row["status"]
    try:
        for column in ("output", "error"):
            if row[column] is not None:
                data[column] = loads_untrusted(row[column], what=f"`{column}`", max_bytes=max_bytes)
        started_at = row["started_at"]
        if started_at is not None:
            if started_at < 0:
                raise PayloadRejectedError("`started_at`", f"{started_at} is negative")
            what = "`started_at` (epoch milliseconds)"
            data["startedAt"] = check_wire_int(what, started_at, maximum=MAX_TIMESTAMP_MS)
    except PayloadRejectedError as exc:
        raise WireFormatError("step result", str(exc), step_id) from None
    return parse_step_result(data)


def stand_in_for(row: Any, problem: str) -> StepResult | None:
    """The failed, non-retryable attempt that settles the step of a result row that cannot be
    used, or None when the row does not name a step consistently (`step_id` = `run_id:seq`),
    so that it can only be removed. Re-running the step would most likely write the same
    row again, hence not retryable; the step's own code (onError, a catch) decides what
    follows, and the run does not wait for a result that never comes."""
    step_id, run_id, seq = row["step_id"], row["run_id"], row["seq"]
    if not isinstance(run_id, str) or not run_id or not isinstance(seq, int) or seq < 0:
        return None
    if not isinstance(step_id, str) or len(step_id) > MAX_ID or step_id != step_id_of(run_id, seq):
        return None
    error = StepError(message=problem, code=MALFORMED_RESULT, retryable=False)
    return StepResult(run_id, seq, step_id, "failed", error=error)


def result_params(result: StepResult) -> list[Any]:
    """A result as the SDK stores it: JSON text or NULL, events not stored."""
    output = result.output if result.status == "completed" else None
    error = None if result.error is None else error_to_wire(result.error)
    ids = [result.step_id, result.run_id, result.seq, result.status]
    text = [None if value is None else dumps(value) for value in (output, error)]
    return [*ids, *text, result.started_at, now_ms()]
