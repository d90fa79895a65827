"""The fresh schema of the SQL store, declared once as SQLAlchemy Core `MetaData`.

Column names are the cross-store contract (`DURABLE_CANONICAL_COLUMNS`): a row written by one
store implementation must be readable by another, so they never change. Timestamps are
BIGINT epoch milliseconds, JSON documents TEXT, `num_value` REAL (SQLite) / DOUBLE PRECISION
(PostgreSQL). There are no foreign keys: deletes are explicit and transactional.

This module describes the *current* schema. The versioned migrations in `migrations.py` are the
frozen history that produces it; `tests/sql/test_schema.py` proves the two agree.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    func,
    literal_column,
    text,
)

from durably._store.sql.dialect import double_type, identity_pk_column

metadata = MetaData()

# ------------------------------------------------------------------ durable_workflow_runs

runs = Table(
    "durable_workflow_runs",
    metadata,
    Column("id", Text, nullable=False),
    Column("workflow", Text, nullable=False),
    Column("workflow_version", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("input", Text),  # JSON
    Column("output", Text),  # JSON
    Column("error", Text),  # JSON StepError
    Column("wake_at", BigInteger),
    Column("locked_by", Text),
    Column("locked_until", BigInteger),
    Column("awaiting_decision_task_id", Text),
    Column("recovery_attempts", Integer),
    Column("tags", Text),  # JSON array of strings (canonical; durable_run_tags mirrors it)
    Column("search_attributes", Text),  # JSON object
    Column("priority", Integer),
    Column("namespace", Text, nullable=False, server_default=text("'default'")),
    Column("origin", Text),  # NULL = unknown; never defaulted
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("id"),
)
Index("durable_workflow_runs_status_wake_at_idx", runs.c.status, runs.c.wake_at)
Index("durable_workflow_runs_workflow_status_idx", runs.c.workflow, runs.c.status)
Index(
    "durable_workflow_runs_namespace_status_idx",
    runs.c.namespace,
    runs.c.status,
    runs.c.created_at,
)
Index("durable_workflow_runs_created_at_idx", runs.c.created_at)
Index("durable_workflow_runs_status_updated_at_idx", runs.c.status, runs.c.updated_at)
# durably (migration 4): the pick-up order of claim_pending_runs —
# higher priority first, a run without one counting as 0, then oldest (created_at, id). The
# index holds that exact order, so a claim reads the first `limit` pending entries instead of
# sorting the whole backlog. It replaced migration 2's (status, created_at, id).
PICKUP_PRIORITY = func.coalesce(runs.c.priority, literal_column("0", Integer))
Index(
    "durable_workflow_runs_pickup_idx",
    runs.c.status,
    PICKUP_PRIORITY.desc(),
    runs.c.created_at,
    runs.c.id,
)
# durably: bulk lease renewal / release by owner (SupportsBulkLeases)
Index("durable_workflow_runs_locked_by_idx", runs.c.locked_by)

# ------------------------------------------------------------------ durable_step_checkpoints

checkpoints = Table(
    "durable_step_checkpoints",
    metadata,
    Column("run_id", Text, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("name", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("step_id", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("input", Text),  # JSON
    Column("output", Text),  # JSON
    Column("error", Text),  # JSON
    Column("events", Text),  # JSON array of StepEvent
    Column("attempts", Integer, nullable=False),
    Column("worker_group", Text),
    Column("parallel_group", Text),
    Column("wake_at", BigInteger),
    Column("enqueued_at", BigInteger),  # NULL => read as started_at
    Column("started_at", BigInteger, nullable=False),
    Column("finished_at", BigInteger, nullable=False),
    # JSON {"errors": [AttemptError...], "omitted": n}: the step's failed attempts, bounded
    # (models.add_attempt_error); NULL = none. Last: migration 7 appended it.
    Column("attempt_errors", Text),
    PrimaryKeyConstraint("run_id", "seq"),
)
Index(
    "durable_step_checkpoints_group_idx",
    checkpoints.c.run_id,
    checkpoints.c.parallel_group,
    checkpoints.c.status,
    checkpoints.c.seq,
)

# ------------------------------------------------------------------ durable_run_attributes

attributes = Table(
    "durable_run_attributes",
    metadata,
    Column("run_id", Text, nullable=False),
    Column("key", Text, nullable=False),
    Column("str_value", Text),
    Column("num_value", double_type()),
    PrimaryKeyConstraint("run_id", "key"),
)
Index("durable_run_attributes_key_num_idx", attributes.c.key, attributes.c.num_value)
Index("durable_run_attributes_key_str_idx", attributes.c.key, attributes.c.str_value)

# ------------------------------------------------------------------ durable_run_tags

tags = Table(
    "durable_run_tags",
    metadata,
    Column("run_id", Text, nullable=False),
    Column("tag", Text, nullable=False),
    PrimaryKeyConstraint("run_id", "tag"),
)
Index("durable_run_tags_tag_idx", tags.c.tag, tags.c.run_id)

# ------------------------------------------------------------------ durable_signal_waiters

waiters = Table(
    "durable_signal_waiters",
    metadata,
    Column("token", Text, nullable=False),
    Column("run_id", Text, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("parallel_group", Text),
    PrimaryKeyConstraint("token"),
)
Index("durable_signal_waiters_run_id_idx", waiters.c.run_id, waiters.c.seq)

# ------------------------------------------------------------------ durable_buffered_signals

buffered_signals = Table(
    "durable_buffered_signals",
    metadata,
    identity_pk_column("id"),
    Column("token", Text, nullable=False),
    Column("payload", Text),  # JSON
    # durably (migration 3): the bounds of the signal buffer. `namespace` = the token's text
    # before its first ':' (the per-namespace cap counts by it); times are epoch ms of the
    # store's clock; `expires_at` NULL = the engine's own completion record (never expires).
    Column("namespace", Text),
    Column("buffered_at", BigInteger),
    Column("expires_at", BigInteger),
    sqlite_autoincrement=True,
)
Index("durable_buffered_signals_token_idx", buffered_signals.c.token, buffered_signals.c.id)
Index(
    "durable_buffered_signals_namespace_idx",
    buffered_signals.c.namespace,
    buffered_signals.c.expires_at,
)
Index("durable_buffered_signals_expires_at_idx", buffered_signals.c.expires_at)

# ------------------------------------------------------------------ durable_buffered_events

buffered_events = Table(
    "durable_buffered_events",
    metadata,
    Column("id", Text, nullable=False),  # caller-minted uuid
    Column("name", Text, nullable=False),
    Column("payload", Text),  # JSON
    Column("published_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("id"),
)
Index(
    "durable_buffered_events_name_published_at_idx",
    buffered_events.c.name,
    buffered_events.c.published_at,
)

# ------------------------------------------------------------------ flow-control admission

# durably (migration 5): the fleet-wide slots of flow-control queues (`admission.py`). Times
# are epoch ms of the engines' clocks; `fair` and `lifo` are 0/1.
admission_queues = Table(
    "durable_admission_queues",
    metadata,
    Column("queue", Text, nullable=False),
    Column("window_start", BigInteger, nullable=False),
    Column("window_count", Integer, nullable=False),
    Column("arrivals", BigInteger, nullable=False),
    Column("served", BigInteger, nullable=False),
    Column("concurrency", Integer),
    Column("fair", Integer, nullable=False),
    Column("lifo", Integer, nullable=False),
    PrimaryKeyConstraint("queue"),
)
admission_slots = Table(
    "durable_admission_slots",
    metadata,
    Column("holder", Text, nullable=False),  # the step id
    Column("queue", Text, nullable=False),
    Column("owner", Text, nullable=False),  # the instance id of the engine renewing it
    Column("ttl_ms", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("holder"),
)
Index("durable_admission_slots_queue_idx", admission_slots.c.queue, admission_slots.c.expires_at)
Index("durable_admission_slots_owner_idx", admission_slots.c.owner)
admission_waiters = Table(
    "durable_admission_waiters",
    metadata,
    Column("holder", Text, nullable=False),
    Column("queue", Text, nullable=False),
    Column("priority", Integer, nullable=False),
    Column("fair_key", Text, nullable=False),
    Column("arrival", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("holder"),
)
Index(
    "durable_admission_waiters_queue_idx",
    admission_waiters.c.queue,
    admission_waiters.c.expires_at,
)
admission_keys = Table(
    "durable_admission_keys",
    metadata,
    Column("queue", Text, nullable=False),
    Column("fair_key", Text, nullable=False),
    Column("served", BigInteger, nullable=False),
    PrimaryKeyConstraint("queue", "fair_key"),
)
Index("durable_admission_keys_served_idx", admission_keys.c.queue, admission_keys.c.served)

# ------------------------------------------------------------------ start dedup keys

# durably (migration 6): the run that took a start's dedup key last (`quota_schema.py`); the
# key is free again once that run is no longer live.
run_dedup = Table(
    "durable_run_dedup",
    metadata,
    Column("dedup_key", Text, nullable=False),
    Column("run_id", Text, nullable=False),
    PrimaryKeyConstraint("dedup_key"),
)

# ------------------------------------------------------------------ worker heartbeats

# durably (migration 8): one row per worker, upserted every few seconds (`beats.py`,
# `durably._core.worker_beats`). `namespace` is '' for a worker serving every namespace;
# `info` is the JSON of what it serves; times are wall-clock epoch ms.
worker_beats = Table(
    "durable_worker_beats",
    metadata,
    Column("namespace", Text, nullable=False),
    Column("instance_id", Text, nullable=False),
    Column("beat_at", BigInteger, nullable=False),
    Column("started_at", BigInteger, nullable=False),
    Column("info", Text, nullable=False),
    PrimaryKeyConstraint("namespace", "instance_id"),
)
Index("durable_worker_beats_beat_at_idx", worker_beats.c.beat_at)

# ------------------------------------------------------------------ persisted schedules

# durably (migration 9): one row per persisted schedule (`schedules.py`,
# `durably._core.schedules`). `paused` is BOOLEAN on PostgreSQL and INTEGER 0/1 on SQLite;
# `spec` and `state` are JSON documents; times are epoch ms, `next_fire_at` NULL = nothing due.
# `updated_at` is the compare-and-set token of an engine advancing the row.
schedules = Table(
    "durable_schedules",
    metadata,
    Column("id", Text, nullable=False),
    Column("workflow", Text, nullable=False),
    Column("namespace", Text, nullable=False, server_default=text("'default'")),
    Column("paused", Boolean().with_variant(Integer(), "sqlite"), nullable=False),
    Column("next_fire_at", BigInteger),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    Column("spec", Text, nullable=False),
    Column("state", Text),
    PrimaryKeyConstraint("id"),
)
Index(
    "durable_schedules_due_idx",
    schedules.c.namespace,
    schedules.c.paused,
    schedules.c.next_fire_at,
)

# ------------------------------------------------------------------ durable_schema_version

# One row per applied migration (migrations.py). Bootstrap table: never migrated itself.
schema_version = Table(
    "durable_schema_version",
    metadata,
    Column("version", Integer, nullable=False),
    Column("applied_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("version"),
)

# Column order used by every run / checkpoint SELECT (rows.py maps by position).
RUN_COLUMNS = tuple(runs.c)
CHECKPOINT_COLUMNS = tuple(checkpoints.c)


def durable_managed_tables() -> list[str]:
    """Names of every table the SQL store owns, for host migration tools."""
    return [t.name for t in metadata.sorted_tables]


__all__ = [
    "CHECKPOINT_COLUMNS",
    "PICKUP_PRIORITY",
    "RUN_COLUMNS",
    "attributes",
    "buffered_events",
    "buffered_signals",
    "checkpoints",
    "durable_managed_tables",
    "metadata",
    "run_dedup",
    "runs",
    "schedules",
    "schema_version",
    "tags",
    "waiters",
    "worker_beats",
]
