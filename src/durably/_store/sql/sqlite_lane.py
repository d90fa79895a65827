"""The loop lane: a lone SQLite statement of an idle writer, run on the event loop itself.

Why: a sequential workflow writes one checkpoint at a time and waits for it (nothing is
acknowledged before it is durable), so its writes never group, and each one paid two thread
hand-offs to the writer thread and back. On a quiet 2-vCPU VM a hand-off wakes an idle vCPU:
~30 µs each way, measured 80–90 µs for hop + insert against 19 µs for the same autocommitted
insert on the calling thread (the sequential benchmark). The statement itself is bounded work,
so running it inline keeps the loop responsive — "never block the event loop" is about
unbounded blocking, and the
lane excludes both ways a SQLite write can block for long:

* **lock waits**: the lane's connection has `busy_timeout = 0`. If another process (or
  anything) holds the write lock, SQLite answers SQLITE_BUSY at once, nothing was written, and
  the statement goes to the writer thread, which waits for the lock with the normal busy
  timeout;
* **fsync**: in WAL mode with `synchronous=NORMAL` a commit does not sync; checkpoints do. The
  lane's connection has `wal_autocheckpoint = 0`, and the connector runs a PASSIVE checkpoint
  on the writer thread every `CHECKPOINT_EVERY` lane commits (what SQLite's auto-checkpoint
  would have done inline). What is left on the loop is the WAL header sync when the first
  write after a checkpoint restarts the log (SQLite's rule for NORMAL): one fsync per
  `CHECKPOINT_EVERY` commits.

A safety valve covers the rest (a slow disk, memory pressure): a lane statement that took
longer than `STALL_S` turns the lane off for `BACKOFF_S`, and every statement goes through the
writer thread meanwhile. Durability is unchanged: the same database, the same WAL and the same
`synchronous` level; the caller is acknowledged after its autocommit returns.

Which requests take it (`SqliteConnector._dispatch`): a prebuilt statement that is alone in
its event-loop turn while the writer is idle (no writer task, so every earlier request has been
committed and settled: the lane never reorders writes). Requests of one turn — concurrent
workflows — still share a group commit on the writer thread, whose COMMIT then runs in
parallel with the loop (measured with many concurrent workflows: 18k steps/s that way, 11k
when each committed on the lane).
Transactions and `work` callbacks always use the writer thread.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

#: a lane statement slower than this turns the lane off for `BACKOFF_S` (seconds)
STALL_S = 0.005
BACKOFF_S = 1.0
#: lane commits between two PASSIVE checkpoints run on the writer thread (SQLite's default
#: auto-checkpoint is 1,000 WAL pages; a lane commit writes at least one)
CHECKPOINT_EVERY = 1000

_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class Busy:
    """The lane's answer when the database was locked: nothing was written."""


BUSY = Busy()


def is_busy(error: BaseException) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    if not isinstance(error, sqlite3.OperationalError):
        return False
    if code is None:
        return "locked" in str(error)
    return (code & 0xFF) in _BUSY_CODES


def open_lane_connection(path: str, pragmas: tuple[str, ...]) -> sqlite3.Connection:
    """The lane's own connection (opened on the writer thread; used from the loop's thread,
    hence `check_same_thread=False` — one thread at a time uses it)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=0)
    try:
        for pragma in pragmas:
            conn.execute(pragma).fetchall()
        conn.execute("PRAGMA busy_timeout = 0")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
    except BaseException:
        conn.close()
        raise
    return conn


class LoopLane:
    """One lane connection and its bookkeeping (see the module docstring)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._off_until = 0.0
        self._since_checkpoint = 0
        #: statements run on the loop / handed to the writer thread because the lane was
        #: busy / times the lane turned itself off (for tests and diagnostics)
        self.ran = 0
        self.busy = 0
        self.stalls = 0

    @property
    def open(self) -> bool:
        return self._conn is not None and time.monotonic() >= self._off_until

    def run(self, rows: bool, sql: str, args: Any) -> Any:
        """The statement's rows / row count / exception, or `BUSY` (nothing was written).
        Raises when the lane's connection cannot be used at all."""
        conn = self._conn
        assert conn is not None
        started = time.perf_counter()
        result: Any
        try:
            cursor = conn.execute(sql, args)
            result = cursor.fetchall() if rows else cursor.rowcount
        except sqlite3.ProgrammingError:
            raise  # the connection itself is unusable (closed): the lane broke, not the statement
        except Exception as error:
            result = error
        if time.perf_counter() - started > STALL_S:
            self.stalls += 1
            self._off_until = time.monotonic() + BACKOFF_S
        if isinstance(result, BaseException) and is_busy(result):
            if conn.in_transaction:  # (autocommit: never expected) leave nothing open
                conn.execute("ROLLBACK")
            self.busy += 1
            return BUSY
        self.ran += 1
        self._since_checkpoint += 1
        return result

    def checkpoint_due(self) -> bool:
        if self._since_checkpoint < CHECKPOINT_EVERY:
            return False
        self._since_checkpoint = 0
        return True

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
