"""SqlStateStore: the StateStore on SQLAlchemy 2 async Core, for SQLite and PostgreSQL.

One implementation serves both databases: the SQL that differs lives in `dialect.py`, the
way connections are used (one group-committing SQLite writer vs. the PostgreSQL pool) in
`connection.py`. Every method is one statement where the contract allows it (autocommitted by
itself); work that must be atomic across several statements (side-table rewrites, deletes,
batched compare-and-set) runs in one transaction. `statement_count` counts every SQL statement
the store executes (an `executemany` counts once; BEGIN/COMMIT and schema DDL are not counted).

Hot-path statements are built once per store with named bind parameters (`_q_*`) and
registered with the connector: on SQLite each runs in ONE aiosqlite call (concurrent ones
share one call and one COMMIT) with SQL compiled once by SQLAlchemy; dynamic list queries go
through SQLAlchemy's regular (cached) path.

The store is assembled from part objects, each in a module of its own: bulk operations for
fans (`bulk.py`), checkpoint aggregates (`aggregates.py`), run facets (`facets.py`), start
admission (`quota.py`) and the signal buffer (`signal_buffer.py`). Each is handed, when the
store is built, what it uses: the `StatementRunner` (`runner.py`: every statement of the
store runs and is counted there, parts' and store's alike), the prebuilt `Statements`, the
`SqlDialect`, the clock, and, for admission, the store's `get_run`. The store forwards those
contract methods to the parts in one line each; no part sees the store itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import bindparam
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from durably._core.aggregates import CheckpointQuery, CheckpointStat
from durably._core.buffered_signals import BufferedSignalInfo, BufferScope
from durably._core.models import (
    BufferedEvent,
    BufferedSignal,
    ChildWait,
    JSONValue,
    RunPatch,
    RunQuery,
    RunStatus,
    SignalWaiter,
    StepCheckpoint,
    WorkflowRun,
    now_utc,
)
from durably._core.quota import StartGate, StartOutcome
from durably._core.retention import RetentionPolicy
from durably._core.run_activity import ActivityBucket, ActivityWindow
from durably._core.run_facets import (
    LeaseOwnerRow,
    RunFacetRow,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
)
from durably._core.schedules import ScheduleQuery, ScheduleRecord
from durably._core.worker_beats import WorkerBeat
from durably._store.derived import DerivedStoreMethods
from durably._store.protocol import InstanceHold, StateStore, WakeBus
from durably._store.query import DEFAULT_NAMESPACE, pickup_order
from durably._store.sql import instance as _instance
from durably._store.sql import pg as _pg
from durably._store.sql import rows as _rows
from durably._store.sql.aggregates import SqlCheckpointAggregates
from durably._store.sql.beats import SqlWorkerBeats
from durably._store.sql.bulk import BulkOps
from durably._store.sql.connection import Connector, Session
from durably._store.sql.connectors import connector_for
from durably._store.sql.dialect import SqlDialect, create_engine, install_sqlite_pragmas
from durably._store.sql.facets import SqlRunFacets
from durably._store.sql.leases import release_retrying
from durably._store.sql.migrations import apply_on
from durably._store.sql.predicates import run_query_predicates
from durably._store.sql.quota import SqlStartAdmission
from durably._store.sql.retention import SqlRetention, run_side_deletes
from durably._store.sql.runner import StatementRunner
from durably._store.sql.schedules import SqlSchedules
from durably._store.sql.schema import (
    RUN_COLUMNS,
    runs,
)
from durably._store.sql.signal_buffer import SqlSignalBuffer
from durably._store.sql.statements import CP_KEYS, Statements
from durably._store.sql.wakebus import PgWakeBus

Row = Sequence[Any]

_KEY_CHUNK = 1000  # (run_id, seq) pairs per lookup when lists expand into binds


def _cas_params(row: dict[str, Any]) -> dict[str, Any]:
    """Parameters of the compare-and-set UPDATE: every non-key column + the key binds."""
    params = {k: v for k, v in row.items() if k not in CP_KEYS}
    params["w_run_id"] = row["run_id"]
    params["w_seq"] = row["seq"]
    return params


class SqlStateStore(DerivedStoreMethods):
    """The SQL StateStore for SQLite (aiosqlite) and PostgreSQL (asyncpg).

    Construct with an `AsyncEngine` (`owns_engine=True` makes `close()` dispose it) or with
    `SqlStateStore.from_url(url, **engine_options)`. Call `ensure_schema()` once at boot.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        owns_engine: bool = False,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.engine = engine
        self._owns_engine = owns_engine
        self._clock: Callable[[], datetime] = clock or now_utc
        self.dialect = SqlDialect(engine.dialect.name)
        install_sqlite_pragmas(engine)
        self._cx = connector_for(self.dialect, engine)
        self._runner = StatementRunner(self._cx)
        self._cx.on_rerun = self._runner.rerun
        self._schema_ready = False
        #: PostgreSQL schema of the tables when the engine was made by durably with one
        #: (`?schema=` / `schema=`); None: the connections' default `search_path`.
        self.schema: str | None = None
        self._channel: str | None = None
        self._buses: set[PgWakeBus] = set()
        if not self.dialect.is_sqlite:
            self.schema = _pg.schema_of(engine)
            _pg.install_liveness_check(engine)
        self._update_if_status_stmts: dict[tuple[str, ...], sa.Update] = {}
        self._assemble(self.dialect)

    def _assemble(self, dialect: SqlDialect) -> None:
        """Build the prebuilt statements of `dialect` and the part objects that share them
        (a test builds the store again for a dialect without RETURNING this way)."""
        self.dialect = dialect
        self._q = q = Statements(dialect)
        self._cx.register(*q.prebuilt())
        runner = self._runner
        self._bulk = BulkOps(runner, q, dialect)
        self._aggregates = SqlCheckpointAggregates(runner, q, dialect)
        self._facets = SqlRunFacets(runner)
        self._admission = SqlStartAdmission(
            runner, q, dialect, clock=self._clock, get_run=self.get_run
        )
        self._signal_buffer = SqlSignalBuffer(runner, q, dialect, clock=self._clock)
        self._beats = SqlWorkerBeats(runner, dialect)
        self._schedules = SqlSchedules(runner, dialect)
        self._retention = SqlRetention(runner)

    # ------------------------------------------------------------------ test hooks

    @property
    def statement_count(self) -> int:
        """SQL statements executed so far (benchmarks divide it by the number of steps)."""
        return self._runner.statement_count

    @property
    def checkpoint_rows_read(self) -> int:
        return self._aggregates.checkpoint_rows_read

    @property
    def last_checkpoint_rows_read(self) -> int:
        return self._aggregates.last_checkpoint_rows_read

    @property
    def checkpoint_stats_rows_read(self) -> int:
        return self._aggregates.checkpoint_stats_rows_read

    @property
    def facet_rows_read(self) -> int:
        return self._facets.facet_rows_read

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        clock: Callable[[], datetime] | None = None,
        **options: Any,
    ) -> SqlStateStore:
        """A store on a new engine for `url`, which the store owns (and disposes on close).

        URLs: `sqlite:///rel.db`, `sqlite:////abs.db`, `sqlite://` (memory),
        `sqlite+aiosqlite://…`, or `postgresql://user:pass@host:5432/db` (also
        `postgres://`, `postgresql+asyncpg://`; asyncpg is required: `pip install
        durably[postgres]`).

        SQLite runs in WAL mode, and its durability is the caller's choice, given as the URL
        query parameter `synchronous` (or the keyword, which wins):

        - `synchronous=normal` (the default): a commit is acknowledged once it is in the WAL
          file, before the file is fsynced. It survives a crash of the process, but the last
          acknowledged commits can be lost on power loss or an OS crash (the database stays
          consistent: it is as of an earlier commit).
        - `synchronous=full`: every commit is fsynced before it is acknowledged, so it
          survives power loss too; each group commit pays one fsync.

        Anything else is a ValueError naming the option. Example:
        `SqlStateStore.from_url("sqlite:///app.db?synchronous=full")`. Every connection the
        store opens (its pool's, its writer's) runs with the chosen mode. A store built on an
        `AsyncEngine` of your own runs `synchronous=NORMAL`.

        PostgreSQL options, given as keywords or as URL query parameters (keywords win; see
        docs/postgresql.md):

        - `schema`: the PostgreSQL schema of the tables (connections get
          `search_path=<schema>`; `ensure_schema()` creates it). Stores on different
          schemas of one database are independent, wake-up channels included.
        - `pool_size` (10), `max_overflow` (10), `pool_timeout` (30 s), `pool_recycle`
          (never): the connection pool. Each store call holds a connection for one
          statement, so `pool_size + max_overflow` bounds the concurrent statements.
        - `statement_timeout` (ms, server side; 0 = none), `command_timeout` (s, client
          side, asyncpg), `connect_timeout` (s, default 10), `application_name` (`durably`),
          `synchronous_commit` (server default; `off` is faster and loses the last commits
          on a server crash, never on a restart).
        - `pool_pre_ping` (false): a server-closed connection is replaced at checkout for
          free anyway (asyncpg knows); the ping (one extra round trip per call) also catches
          silently dropped ones. A statement in flight when the server restarts fails with
          `sqlalchemy.exc.DBAPIError` (`connection_invalidated=True`); the next call
          reconnects.

        Any other keyword goes to `sqlalchemy.ext.asyncio.create_async_engine`
        (e.g. `echo=True`, `connect_args={...}`, merged with durably's).

        Example: `SqlStateStore.from_url("postgresql://app@db/app?schema=durably&pool_size=20")`
        """
        return cls(create_engine(url, **options), owns_engine=True, clock=clock)

    @property
    def connector(self) -> Connector:
        """How this store reaches its database (`connection.py`): what runs on the same
        database beside the contract (the PostgreSQL admission backend) shares it, with its
        pool and prepared statements."""
        return self._cx

    async def __aenter__(self) -> SqlStateStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"SqlStateStore({self.engine.url.render_as_string(hide_password=True)!r})"

    # ------------------------------------------------------------------ lifecycle (optional)

    async def ensure_schema(self) -> None:
        """Apply pending migrations (`migrations.upgrade` to `HEAD`); idempotent and safe to
        run concurrently from several processes."""
        if self._schema_ready:
            return

        async def work(conn: AsyncConnection) -> list[str]:
            return await apply_on(conn, self.dialect, schema=self.schema)

        await self._cx.schema_transaction(work)
        self._schema_ready = True

    async def close(self) -> None:
        for bus in list(self._buses):
            await bus.close()
        await self._cx.close()
        if self._owns_engine:
            await self.engine.dispose()

    # ------------------------------------------------------------------ runs

    async def create_run(self, run: WorkflowRun) -> None:
        params = _rows.run_to_sql(run)
        attr_rows = _rows.attribute_rows(run.id, run.search_attributes)
        tag_rows = _rows.tag_rows(run.id, run.tags)
        if not attr_rows and not tag_rows:
            await self._runner.write(self._q.insert_run, params)
            return

        async def work(s: Session) -> None:
            await self._runner.run(s, self._q.insert_run, params)
            if tag_rows:
                await self._runner.many(s, self._q.insert_tags, tag_rows)
            if attr_rows:
                await self._runner.many(s, self._q.insert_attrs, attr_rows)

        await self._runner.transaction(work)

    async def update_run(self, run_id: str, patch: RunPatch) -> None:
        """Presence-based patch (a key absent from `patch` is left alone); a missing run is a
        silent no-op."""
        await self._update_run(run_id, patch, self._q.update_run)

    async def update_run_if_status(
        self, run_id: str, patch: RunPatch, statuses: Sequence[RunStatus]
    ) -> bool:
        """`update_run` only while the status is one of `statuses`: one
        conditional UPDATE whose row count is the answer (the engine's settle writes)."""
        key = tuple(statuses)
        stmt = self._update_if_status_stmts.get(key)
        if stmt is None:
            r = runs.c
            # literal binds, not an expanding IN: eligible for the one-hop fast path
            allowed = [sa.literal(status) for status in key]
            stmt = sa.update(runs).where(r.id == bindparam("w_id"), r.status.in_(allowed))
            self._update_if_status_stmts[key] = stmt
            self._cx.register(stmt)
        return await self._update_run(run_id, patch, stmt) > 0

    async def _update_run(self, run_id: str, patch: RunPatch, update: sa.Update) -> int:
        converters = _rows.PATCH_CONVERTERS
        unknown = [k for k in patch if k not in converters]
        if unknown:
            raise ValueError(f"unknown RunPatch key(s): {sorted(unknown)}")
        values: dict[str, Any] = {}
        items: dict[str, Any] = dict(patch)
        for key, value in items.items():
            if key in ("created_at", "updated_at") and value is None:
                continue  # written only when non-None
            convert = converters[key]
            values[key] = convert(value) if convert is not None else value
        if not values:
            return 0  # an empty effective patch issues no UPDATE
        if "updated_at" not in values:
            values["updated_at"] = _rows.ms(self._clock())
        rewrite_attrs = "search_attributes" in items
        rewrite_tags = "tags" in items
        attr_rows = (
            _rows.attribute_rows(run_id, items["search_attributes"]) if rewrite_attrs else []
        )
        tag_rows = _rows.tag_rows(run_id, items["tags"]) if rewrite_tags else []
        values["w_id"] = run_id
        if not rewrite_attrs and not rewrite_tags:
            return await self._runner.write(update, values)

        async def work(s: Session) -> int:
            if await self._runner.run(s, update, values) == 0:
                return 0  # missing run (or status guard failed): no orphan side rows
            key = {"run_id": run_id}
            if rewrite_attrs:
                await self._runner.run(s, self._q.delete_attrs, key)
                if attr_rows:
                    await self._runner.many(s, self._q.insert_attrs, attr_rows)
            if rewrite_tags:
                await self._runner.run(s, self._q.delete_tags, key)
                if tag_rows:
                    await self._runner.many(s, self._q.insert_tags, tag_rows)
            return 1

        return int(await self._runner.transaction(work))

    async def get_run(self, run_id: str) -> WorkflowRun | None:
        row = await self._runner.read_first(self._q.get_run, {"id": run_id})
        return _rows.run_from_row(row) if row is not None else None

    async def delete_run(self, run_id: str) -> None:
        """The run and its checkpoints, waiters, attribute, tag and start dedup rows, in one
        transaction (children first). Buffered signals/events are token/name keyed and kept."""
        params = {"run_id": run_id}

        async def work(s: Session) -> None:
            for stmt in self._q.delete_run_rows:
                await self._runner.run(s, stmt, params)
            # the dedup row naming the run (no index on run_id: the table holds one row per
            # dedup key in use, and a key whose run is gone is free anyway)
            await self._runner.run(s, run_side_deletes([run_id])[-1])

        await self._runner.transaction(work)

    # ------------------------------------------------------------------ checkpoints

    async def get_checkpoint(self, run_id: str, seq: int) -> StepCheckpoint | None:
        row = await self._runner.read_first(self._q.get_cp, {"run_id": run_id, "seq": seq})
        self._aggregates.count_checkpoint_rows(0 if row is None else 1, last=False)
        return _rows.checkpoint_from_row(row) if row is not None else None

    async def save_checkpoint(self, cp: StepCheckpoint) -> None:
        """Upsert on (run_id, seq): the whole row is replaced. (The hot path of a step:
        concurrent ones share a round trip and a commit on PostgreSQL.)"""
        await self._runner.write_idempotent(self._q.save_cp, _rows.checkpoint_to_sql(cp))

    async def save_checkpoints(self, cps: Sequence[StepCheckpoint]) -> None:
        await self._bulk.save_checkpoints(cps)

    async def save_checkpoints_if_pending(self, cps: Sequence[StepCheckpoint]) -> list[bool]:
        """Batched compare-and-set: per-entry results in input order, each entry compared
        against what the earlier entries wrote; one transaction (all or nothing).

        Two statements for any batch size: one SELECT of the keys still `pending` (locked
        `FOR UPDATE` on PostgreSQL; SQLite holds its write lock from `BEGIN IMMEDIATE`), then
        one `executemany` of the conditional UPDATE with each key's final row.
        """
        if not cps:
            return []
        rows = [_rows.checkpoint_to_sql(cp) for cp in cps]  # validate all before writing
        if len(rows) == 1:
            return [await self._runner.write(self._q.cas_cp, _cas_params(rows[0])) == 1]
        keys = list(dict.fromkeys((row["run_id"], row["seq"]) for row in rows))

        async def work(s: Session) -> list[bool]:
            status: dict[tuple[str, int], str] = {}
            step = _KEY_CHUNK if self.dialect.expands_lists else len(keys)
            for start in range(0, len(keys), step):
                chunk = keys[start : start + step]
                params = self.dialect.pairs_params("keys", chunk)
                found = await self._runner.fetch(s, self._q.pending_keys, params)
                for found_row in found:
                    status[(found_row[0], int(found_row[1]))] = "pending"
            results: list[bool] = []
            final: dict[tuple[str, int], dict[str, Any]] = {}
            for row in rows:
                key = (row["run_id"], row["seq"])
                won = status.get(key) == "pending"
                if won:
                    status[key] = row["status"]  # a later entry sees this write
                    final[key] = row
                results.append(won)
            if final:
                await self._runner.many(s, self._q.cas_cp, [_cas_params(r) for r in final.values()])
            return results

        return await self._runner.transaction(work)

    async def list_checkpoints(self, run_id: str) -> list[StepCheckpoint]:
        found = await self._runner.read_all(self._q.list_cps, {"run_id": run_id}, point=True)
        self._aggregates.count_checkpoint_rows(len(found))
        return [_rows.checkpoint_from_row(row) for row in found]

    async def get_latest_checkpoint_by_name(self, run_id: str, name: str) -> StepCheckpoint | None:
        row = await self._runner.read_first(self._q.latest_cp, {"run_id": run_id, "name": name})
        self._aggregates.count_checkpoint_rows(0 if row is None else 1)
        return _rows.checkpoint_from_row(row) if row is not None else None

    async def count_checkpoints(
        self, run_id: str, from_seq: int, to_seq: int, statuses: Sequence[str]
    ) -> int:
        """Rows with `from_seq <= seq <= to_seq` (inclusive) and a listed status."""
        if not statuses:
            return 0
        params = {
            "run_id": run_id,
            "lo": from_seq,
            "hi": to_seq,
            "statuses": self.dialect.list_value(list(dict.fromkeys(statuses))),
        }
        return await self._runner.read_scalar(self._q.count_cps, params, point=True)

    # ------------------------------------------------------------------ pick-up scans

    async def _scan(
        self,
        variants: tuple[sa.Select[Any], sa.Select[Any], sa.Select[Any]],
        namespace: str | None,
        params: dict[str, Any],
    ) -> list[WorkflowRun]:
        if namespace is None:
            stmt = variants[0]
        else:
            stmt = variants[1] if namespace == DEFAULT_NAMESPACE else variants[2]
            params = {**params, "ns": namespace}
        return [_rows.run_from_row(row) for row in await self._runner.read_all(stmt, params)]

    async def list_incomplete_runs(self, namespace: str | None = None) -> list[WorkflowRun]:
        """Runs in `running` or `cancelling` (ordered by created_at, id for stability)."""
        return await self._scan(self._q.incomplete, namespace, {})

    async def list_due_timers(
        self, now_ms: int, namespace: str | None = None, limit: int | None = None
    ) -> list[WorkflowRun]:
        """Suspended and blocked runs with `wake_at <= now_ms`, ordered by (wake_at, id)."""
        if limit is None:
            return await self._scan(self._q.due, namespace, {"now": int(now_ms)})
        params = {"now": int(now_ms), "lim": max(int(limit), 0)}
        return await self._scan(self._q.due_limited, namespace, params)

    async def list_orphaned_suspended(
        self, now_ms: int, namespace: str | None = None, limit: int = 100
    ) -> list[WorkflowRun]:
        """Suspended runs still leased by an owner whose lease lapsed: a process
        died while their bodies were parked in its memory."""
        params = {"now": int(now_ms), "lim": max(int(limit), 0)}
        return await self._scan(self._q.orphaned, namespace, params)

    # ------------------------------------------------------------------ leases

    async def release_run_lock(self, run_id: str) -> None:
        # Retried while no connection can be had; logged at ERROR if it still fails
        # (`leases.py`): a silently failed release leaves the run waiting out its lease.
        await release_retrying(
            lambda: self._runner.write(self._q.release, {"w_id": run_id}), run_id
        )

    async def renew_run_locks(self, owner: str, lease_until_ms: int) -> int:
        """Extend every lease held by `owner` in one UPDATE; rows touched."""
        return await self._runner.write(
            self._q.renew_all, {"w_owner": owner, "w_until": lease_until_ms}
        )

    async def release_locks_of(self, owner: str) -> int:
        """Clear every lease held by `owner` in one UPDATE; rows touched."""
        return await self._runner.write(self._q.release_all, {"w_owner": owner})

    async def claim_run(
        self, run_id: str, owner: str, lease_until_ms: int, now_ms: int
    ) -> WorkflowRun | None:
        """Lease the run when its lease is free or expired (`locked_until <= now_ms`) and
        return the locked row: one `UPDATE … RETURNING`."""
        params = {"w_id": run_id, "w_owner": owner, "w_until": lease_until_ms, "w_now": now_ms}
        if self._q.claim is not None:
            row = await self._runner.write_first(self._q.claim, params)
            return _rows.run_from_row(row) if row is not None else None

        async def work(s: Session) -> WorkflowRun | None:
            if await self._runner.run(s, self._q.try_lock, params) != 1:
                return None
            found = await self._runner.fetch(s, self._q.get_run, {"id": run_id})
            return _rows.run_from_row(found[0]) if found else None

        return await self._runner.transaction(work)

    async def claim_pending_runs(
        self,
        owner: str,
        lease_until_ms: int,
        now_ms: int,
        limit: int,
        namespace: str | None = None,
    ) -> list[WorkflowRun]:
        """Lease up to `limit` pending runs whose lease is free or expired, higher priority
        first (a NULL priority counts as 0), then oldest (`created_at`, `id`; the namespace
        filter applies before the limit), in ONE statement:
        `UPDATE … WHERE id IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED) RETURNING *` on
        PostgreSQL, so concurrent claimers never get the same run and never wait on each
        other; SQLite has a single writer and needs no row locks. The pick-up index holds
        exactly that order, so the statement reads only the rows it takes."""
        if limit <= 0:
            return []
        variants = self._q.claim_pending
        params: dict[str, Any] = {
            "w_owner": owner,
            "w_until": int(lease_until_ms),
            "w_now": int(now_ms),
            "lim": int(limit),
        }
        if namespace is None:
            stmt = variants[0]
        else:
            stmt = variants[1] if namespace == DEFAULT_NAMESPACE else variants[2]
            params["ns"] = namespace
        if self.dialect.supports_returning:
            found = await self._runner.write_returning(stmt, params)
            claimed = [_rows.run_from_row(row) for row in found]
        else:
            claimed = await self._runner.transaction(
                lambda s: self._claim_without_returning(s, stmt, params)
            )
        # RETURNING promises no order: hand the runs back in the order they were picked.
        claimed.sort(key=pickup_order)
        return claimed

    async def _claim_without_returning(
        self, s: Session, pick: sa.Executable, params: dict[str, Any]
    ) -> list[WorkflowRun]:
        """SQLite < 3.35: SELECT the candidates, then lease them (one transaction holding the
        write lock, so nobody else can take them in between)."""
        found = [_rows.run_from_row(row) for row in await self._runner.fetch(s, pick, params)]
        if not found:
            return []
        lock = {k: params[k] for k in ("w_owner", "w_until", "w_now")}
        await self._runner.many(s, self._q.try_lock, [{**lock, "w_id": run.id} for run in found])
        owner, until = params["w_owner"], params["w_until"]
        return [replace(run, locked_by=owner, locked_until=until) for run in found]

    # ------------------------------------------------------------------ one live process per id

    async def hold_instance(self, instance_id: str) -> InstanceHold | None:
        """Hold `instance_id` for this process's life (see `instance.py`); None
        while a live incarnation holds it."""
        if not self.dialect.is_sqlite:
            return await _instance.hold_pg(
                self.engine, f"durably:instance:{self.schema or ''}:{instance_id}"
            )
        database = self.engine.url.database
        if database and database != ":memory:":
            return await _instance.hold_file(database, instance_id)
        return _instance.hold_local(self.engine, instance_id)

    # ------------------------------------------------------------------ wake-ups

    def wake_bus(self) -> WakeBus | None:
        """A new LISTEN/NOTIFY `WakeBus` on PostgreSQL (see `wakebus.py`), closed
        with the store at the latest. None on SQLite (no cross-process channel: processes
        sharing a file rely on the engine's polling) and for PostgreSQL drivers other than
        asyncpg (likewise)."""
        if self.dialect.is_sqlite or self.engine.dialect.driver != "asyncpg":
            return None
        bus = PgWakeBus(
            self.engine,
            channel=self._wake_channel,
            notify=self._notify,
            on_close=self._buses.discard,
        )
        self._buses.add(bus)
        return bus

    async def _wake_channel(self) -> str:
        """The channel of this store's schema (the connections' `current_schema()` when the
        engine was not made with an explicit schema: one statement, once)."""
        if self._channel is None:
            schema = self.schema
            if schema is None:
                row = await self._runner.read_first(self._q.current_schema)
                schema = str(row[0]) if row is not None and row[0] is not None else "public"
            self._channel = _pg.wake_channel(schema)
        return self._channel

    async def _notify(self, channel: str, payload: str) -> None:
        await self._runner.write(self._q.notify, {"channel": channel, "payload": payload})

    # ------------------------------------------------------------------ waiters

    async def put_signal_waiter(self, waiter: SignalWaiter) -> None:
        """Upsert by token (replaces run_id, seq, parallel_group)."""
        params = {
            "token": waiter.token,
            "run_id": waiter.run_id,
            "seq": waiter.seq,
            "parallel_group": waiter.parallel_group,
        }
        await self._runner.write(self._q.put_waiter, params)

    async def list_signal_waiters(self, prefix: str) -> list[SignalWaiter]:
        """Tokens starting with `prefix` (exact, case-sensitive), by (run_id, seq, token)."""
        if prefix == "":
            found = await self._runner.read_all(self._q.all_waiters)
        else:
            ranged, params = self.dialect.prefix_params(prefix)
            stmt = self._q.waiters_ranged if ranged else self._q.waiters_plain
            found = await self._runner.read_all(stmt, params, point=True)
        return [_rows.waiter_from_row(row) for row in found]

    async def remove_signal_waiter(self, waiter: SignalWaiter) -> None:
        """Delete only the row matching token AND run_id AND seq."""
        params = {"token": waiter.token, "run_id": waiter.run_id, "seq": waiter.seq}
        await self._runner.write(self._q.remove_waiter, params)

    # ------------------------------------------------------------------ buffers

    # Buffered signals and bounded events: signal_buffer.SqlSignalBuffer (below).

    async def buffer_event(self, event: BufferedEvent) -> None:
        params = {
            "id": event.id,
            "name": event.name,
            "payload": _rows.json_or_null(event.payload),
            "published_at": int(event.published_at),
        }
        await self._runner.write(self._q.buffer_event, params)

    async def list_buffered_events(self, name: str, limit: int) -> list[BufferedEvent]:
        """Oldest `published_at` first (ties by id), at most `limit`, not consuming."""
        params = {"name": name, "lim": max(limit, 0)}
        found = await self._runner.read_all(self._q.list_events, params, point=True)
        return [_rows.event_from_row(row) for row in found]

    async def remove_buffered_event(self, event_id: str) -> bool:
        return await self._runner.write(self._q.remove_event, {"id": event_id}) == 1

    # ------------------------------------------------------------------ listing

    async def list_runs(self, query: RunQuery) -> list[WorkflowRun]:
        """Matching runs, newest first (created_at DESC, id DESC), paged in SQL."""
        r = runs.c
        stmt = (
            sa.select(*RUN_COLUMNS)
            .where(*run_query_predicates(query))
            .order_by(r.created_at.desc(), r.id.desc())
        )
        if query.limit is not None:
            stmt = stmt.limit(max(int(query.limit), 0))
        if query.offset:
            stmt = stmt.offset(max(int(query.offset), 0))
        return [_rows.run_from_row(row) for row in await self._runner.read_all(stmt)]

    async def count_runs(self, query: RunQuery) -> int:
        """Runs matching `query`; `limit`/`offset` are ignored."""
        stmt = sa.select(sa.func.count()).select_from(runs).where(*run_query_predicates(query))
        return await self._runner.read_scalar(stmt)

    # ------------------------------------------------------------------ bulk, for fans
    # Forwards to `bulk.BulkOps`.

    async def register_child_waits(self, waits: Sequence[ChildWait]) -> None:
        """In ONE transaction, upsert every waiter and
        insert each placeholder whose `(run_id, seq)` has no row yet (an existing row, e.g. a
        completion already delivered, is never overwritten)."""
        await self._bulk.register_child_waits(waits)

    async def create_runs(self, new_runs: Sequence[WorkflowRun]) -> list[str | None]:
        """Insert every run whose id is free, in ONE transaction; for each entry,
        `None` when this call created it, else the workflow name of the run already holding
        the id (the caller decides between idempotent and conflicting)."""
        return await self._bulk.create_runs(new_runs)

    async def deliver_signals(
        self, payloads: Sequence[tuple[str, JSONValue]], at: datetime
    ) -> list[StepCheckpoint]:
        """Signal delivery for many tokens in ONE transaction: take every
        existing waiter (`DELETE … WHERE token IN … RETURNING`) and upsert its `signal:<token>`
        checkpoint; a crash can't take a waiter without writing its row. Returns the rows
        written (tokens without a waiter are left to the caller)."""
        return await self._bulk.deliver_signals(payloads, at)

    async def fold_checkpoints(
        self, run_id: str, first_seq: int, last_seq: int, cp: StepCheckpoint
    ) -> None:
        """Replace the rows of `first_seq..last_seq` by ONE folded
        `fan:` row (`cp`, at `first_seq`), in one transaction."""
        await self._bulk.fold_checkpoints(run_id, first_seq, last_seq, cp)

    async def claim_runs(
        self, ids: Sequence[str], owner: str, lease_until_ms: int, now_ms: int
    ) -> list[WorkflowRun]:
        """`claim_pending_runs` for known ids (the children this engine just
        created): lease those still `pending` with a free or expired lease, by primary key
        (no scan of the pending backlog, whose plan degrades while a wide fan churns it)."""
        return await self._bulk.claim_runs(ids, owner, lease_until_ms, now_ms)

    # ------------------------------------------------------------------ checkpoint aggregates
    # Forwards to `aggregates.SqlCheckpointAggregates`.

    async def checkpoint_stats(self, run_id: str, group: str | None = None) -> list[CheckpointStat]:
        """One bucket per `(parallelGroup, status, nameKind)` , ordered by
        `min_seq`; only `group`'s checkpoints when given. One `GROUP BY` statement."""
        return await self._aggregates.checkpoint_stats(run_id, group)

    async def query_checkpoints(
        self, run_id: str, query: CheckpointQuery | Mapping[str, Any] | None = None
    ) -> list[StepCheckpoint]:
        """The run's checkpoints matching `query` (a `CheckpointQuery` or its camelCase JSON
        mapping), by seq, then `offset`/`limit`: one statement, filtered and paged in SQL."""
        return await self._aggregates.query_checkpoints(run_id, query)

    # ------------------------------------------------------------------ facets
    # Forwards to `facets.SqlRunFacets`.

    async def run_facets(self, query: RunQuery) -> list[RunFacetRow]:
        """`(status, origin, count)` cells over every run matching `query` minus its
        status/origin predicates and page; one `GROUP BY`."""
        return await self._facets.run_facets(query)

    async def run_value_facets(
        self,
        axis: RunValueAxis | Mapping[str, Any] | str,
        query: RunQuery,
        opts: RunValueFacetOptions | Mapping[str, Any] | None = None,
    ) -> list[RunValueFacetRow]:
        """Values of `axis` over the runs matching `query` (page ignored) with their counts,
        most frequent first, at most `opts.limit` (100); one `GROUP BY`."""
        return await self._facets.run_value_facets(axis, query, opts)

    async def run_activity(self, query: RunQuery, window: ActivityWindow) -> list[ActivityBucket]:
        """Runs started, completed and failed per bucket of `window` among those matching
        `query` (page ignored); two `GROUP BY`s over indexed columns."""
        return await self._facets.run_activity(query, window)

    async def lease_owners(self, now_ms: int, namespace: str | None = None) -> list[LeaseOwnerRow]:
        """Unexpired leases grouped by `(namespace, owner)`; one `GROUP BY`."""
        return await self._facets.lease_owners(now_ms, namespace)

    # ------------------------------------------------------------------ worker heartbeats
    # Forwards to `beats.SqlWorkerBeats`: each call one statement.

    async def beat_worker(self, beat: WorkerBeat) -> None:
        await self._beats.beat_worker(beat)

    async def list_worker_beats(
        self, namespace: str | None, since_ms: int, limit: int
    ) -> list[WorkerBeat]:
        return await self._beats.list_worker_beats(namespace, since_ms, limit)

    async def forget_worker(self, namespace: str, instance_id: str) -> None:
        await self._beats.forget_worker(namespace, instance_id)

    async def prune_worker_beats(self, before_ms: int) -> int:
        return await self._beats.prune_worker_beats(before_ms)

    # ------------------------------------------------------------------ schedules
    # Forwards to `schedules.SqlSchedules`: each call one statement.

    async def put_schedule(
        self,
        record: ScheduleRecord,
        *,
        if_absent: bool = False,
        expected_updated_at: int | None = None,
    ) -> bool:
        return await self._schedules.put_schedule(
            record, if_absent=if_absent, expected_updated_at=expected_updated_at
        )

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        return await self._schedules.get_schedule(schedule_id)

    async def delete_schedule(self, schedule_id: str) -> bool:
        return await self._schedules.delete_schedule(schedule_id)

    async def list_schedules(self, query: ScheduleQuery) -> list[ScheduleRecord]:
        return await self._schedules.list_schedules(query)

    async def prune_terminal_runs(
        self, policy: RetentionPolicy, now_ms: int, limit: int, *, dry_run: bool = False
    ) -> list[str]:
        return await self._retention.prune_terminal_runs(policy, now_ms, limit, dry_run=dry_run)

    # ------------------------------------------------------------------ start admission
    # Forwards to `quota.SqlStartAdmission`: each call ONE transaction.

    async def create_run_gated(self, run: WorkflowRun, gate: StartGate) -> StartOutcome:
        return await self._admission.create_run_gated(run, gate)

    async def gate_untagged_run(
        self, run_id: str, new_tags: Sequence[str], gate: StartGate
    ) -> StartOutcome:
        return await self._admission.gate_untagged_run(run_id, new_tags, gate)

    async def try_admit_singleton(
        self, run_id: str, tag: str, workflow: str, limit: int, retry_wake_at_ms: int
    ) -> bool:
        return await self._admission.try_admit_singleton(
            run_id, tag, workflow, limit, retry_wake_at_ms
        )

    async def wake_singleton_waiters(
        self, tag: str, workflow: str, limit: int, now_ms: int
    ) -> list[str]:
        return await self._admission.wake_singleton_waiters(tag, workflow, limit, now_ms)

    # ------------------------------------------------------------------ signal buffer
    # Forwards to `signal_buffer.SqlSignalBuffer`.

    async def buffer_signal(self, token: str, payload: JSONValue) -> None:
        await self._signal_buffer.buffer_signal(token, payload)

    async def buffer_signal_bounded(
        self, token: str, payload: JSONValue, *, ttl_ms: int, per_token: int, per_namespace: int
    ) -> BufferScope | None:
        return await self._signal_buffer.buffer_signal_bounded(
            token, payload, ttl_ms=ttl_ms, per_token=per_token, per_namespace=per_namespace
        )

    async def peek_buffered_signals(self, token: str, limit: int) -> list[BufferedSignal]:
        return await self._signal_buffer.peek_buffered_signals(token, limit)

    async def take_buffered_signal_into(
        self, token: str, cp: StepCheckpoint, *, waiting: bool = False
    ) -> BufferedSignal | None:
        """The oldest live row of `token` becomes `cp`'s output in ONE transaction (the
        contract: `StateStore`). The stored payload text is copied as is."""
        return await self._signal_buffer.take_buffered_signal_into(token, cp, waiting=waiting)

    async def deliver_buffered_signal(self, token: str, at: datetime) -> StepCheckpoint | None:
        """The token's waiter and its oldest live row, taken together into the waiter's
        checkpoint in ONE transaction (the contract: `StateStore`)."""
        return await self._signal_buffer.deliver_buffered_signal(token, at)

    async def buffer_event_bounded(
        self, event: BufferedEvent, *, ttl_ms: int, per_name: int, per_namespace: int
    ) -> BufferScope | None:
        """ONE statement: the insert happens only while the event's name holds fewer than
        `per_name` live events and all external events fewer than `per_namespace` (as
        `buffer_signal_bounded`: on PostgreSQL N concurrent publishers may pass a cap by
        at most N - 1). Live: published less than `ttl_ms` before this event."""
        return await self._signal_buffer.buffer_event_bounded(
            event, ttl_ms=ttl_ms, per_name=per_name, per_namespace=per_namespace
        )

    async def purge_expired_events(self, published_before_ms: int) -> int:
        """Delete the external buffered events published at or before the given time (the
        engine's own accumulator events never expire)."""
        return await self._signal_buffer.purge_expired_events(published_before_ms)

    async def take_buffered_event_into(self, event_id: str, token: str, cp: StepCheckpoint) -> bool:
        """The event becomes `cp`'s output and the wait's waiter row goes, in ONE
        transaction (the contract: `StateStore`). Locks as `take_buffered_signal_into`."""
        return await self._signal_buffer.take_buffered_event_into(event_id, token, cp)

    async def deliver_buffered_event(
        self, event_id: str, token: str, at: datetime
    ) -> StepCheckpoint | None:
        """The token's waiter and the buffered event, taken together into the waiter's
        checkpoint in ONE transaction (the contract: `StateStore`)."""
        return await self._signal_buffer.deliver_buffered_event(event_id, token, at)

    async def list_buffered_signals(
        self, *, prefix: str | None, limit: int, offset: int
    ) -> list[BufferedSignalInfo]:
        return await self._signal_buffer.list_buffered_signals(
            prefix=prefix, limit=limit, offset=offset
        )

    async def count_buffered_signals(self, *, prefix: str | None = None) -> int:
        return await self._signal_buffer.count_buffered_signals(prefix=prefix)

    async def purge_buffered_signals(
        self, *, token: str | None = None, prefix: str | None = None, expired_only: bool = False
    ) -> int:
        return await self._signal_buffer.purge_buffered_signals(
            token=token, prefix=prefix, expired_only=expired_only
        )


__all__ = ["SqlStateStore"]


if TYPE_CHECKING:
    # mypy proves the SQL store implements the whole contract.
    _as_state_store: StateStore = SqlStateStore(create_engine("sqlite://"))
