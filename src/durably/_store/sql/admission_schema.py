"""The schema of fleet-wide admission (migration 5): four tables and, on PostgreSQL, the
two functions `PgAdmission` calls (`admission.py` explains how they work).

Kept apart from the backend because the migrations import it, and the backend imports the
store, which imports the migrations.
"""

from __future__ import annotations

from durably._core.admission import MAX_WAIT, NOTIFY_AT_MOST

__all__ = ["migration_v5"]

_V5_TABLES = """
CREATE TABLE IF NOT EXISTS durable_admission_queues (
  queue         TEXT NOT NULL,
  window_start  BIGINT NOT NULL,
  window_count  INTEGER NOT NULL,
  arrivals      BIGINT NOT NULL,
  served        BIGINT NOT NULL,
  concurrency   INTEGER,
  fair          INTEGER NOT NULL,
  lifo          INTEGER NOT NULL,
  PRIMARY KEY (queue)
);
CREATE TABLE IF NOT EXISTS durable_admission_slots (
  holder      TEXT NOT NULL,
  queue       TEXT NOT NULL,
  owner       TEXT NOT NULL,
  ttl_ms      BIGINT NOT NULL,
  expires_at  BIGINT NOT NULL,
  PRIMARY KEY (holder)
);
CREATE INDEX IF NOT EXISTS durable_admission_slots_queue_idx
  ON durable_admission_slots (queue, expires_at);
CREATE INDEX IF NOT EXISTS durable_admission_slots_owner_idx
  ON durable_admission_slots (owner);
CREATE TABLE IF NOT EXISTS durable_admission_waiters (
  holder      TEXT NOT NULL,
  queue       TEXT NOT NULL,
  priority    INTEGER NOT NULL,
  fair_key    TEXT NOT NULL,
  arrival     BIGINT NOT NULL,
  expires_at  BIGINT NOT NULL,
  PRIMARY KEY (holder)
);
CREATE INDEX IF NOT EXISTS durable_admission_waiters_queue_idx
  ON durable_admission_waiters (queue, expires_at);
CREATE TABLE IF NOT EXISTS durable_admission_keys (
  queue     TEXT NOT NULL,
  fair_key  TEXT NOT NULL,
  served    BIGINT NOT NULL,
  PRIMARY KEY (queue, fair_key)
);
CREATE INDEX IF NOT EXISTS durable_admission_keys_served_idx
  ON durable_admission_keys (queue, served)
"""

# The rules of durably._core.admission, in one call per acquire (see the module docstring).
_ACQUIRE_FN = f"""
CREATE OR REPLACE FUNCTION durable_admission_acquire(
  p_queue TEXT, p_holder TEXT, p_owner TEXT, p_key TEXT, p_priority INTEGER, p_now BIGINT,
  p_concurrency INTEGER, p_rate_limit INTEGER, p_rate_period BIGINT, p_retry BIGINT,
  p_slot_ttl BIGINT, p_fair BOOLEAN, p_lifo BOOLEAN
) RETURNS BIGINT LANGUAGE plpgsql AS $fn$
DECLARE
  q RECORD;
  v_window BIGINT := 0;
  v_rate_left INTEGER;
  v_free INTEGER;
  v_arrival BIGINT;
  v_known BOOLEAN;
  v_served BIGINT := 0;
  v_ahead INTEGER;
  v_retry_at BIGINT;
BEGIN
  -- Admission state is soft (see the module docstring): its commit need not wait for the
  -- WAL flush, which would otherwise be most of the time the queue's lock is held.
  SET LOCAL synchronous_commit = off;
  SELECT * INTO q FROM durable_admission_queues WHERE queue = p_queue FOR UPDATE;
  IF NOT FOUND THEN
    INSERT INTO durable_admission_queues
      (queue, window_start, window_count, arrivals, served, concurrency, fair, lifo)
      VALUES (p_queue, 0, 0, 0, 0, p_concurrency, 0, 0)
      ON CONFLICT (queue) DO NOTHING;
    SELECT * INTO q FROM durable_admission_queues WHERE queue = p_queue FOR UPDATE;
  END IF;
  DELETE FROM durable_admission_slots WHERE queue = p_queue AND expires_at <= p_now;
  DELETE FROM durable_admission_waiters WHERE queue = p_queue AND expires_at <= p_now;
  UPDATE durable_admission_slots
    SET owner = p_owner, ttl_ms = p_slot_ttl, expires_at = p_now + p_slot_ttl
    WHERE holder = p_holder AND queue = p_queue;
  IF FOUND THEN
    RETURN 0;
  END IF;
  IF p_rate_limit IS NOT NULL THEN
    -- Windows only move forward: a call whose clock reading is older than the last
    -- caller's (it waited for the lock, or its host's clock lags) counts in the current one.
    v_window := greatest(p_now - mod(p_now, p_rate_period), q.window_start);
    IF q.window_start <> v_window THEN
      q.window_start := v_window;
      q.window_count := 0;
    END IF;
    v_rate_left := p_rate_limit - q.window_count;
  END IF;
  IF p_concurrency IS NULL THEN
    v_free := 2147483647;
  ELSE
    v_free := p_concurrency
      - (SELECT count(*) FROM durable_admission_slots WHERE queue = p_queue);
  END IF;
  IF v_rate_left IS NOT NULL THEN
    v_free := least(v_free, v_rate_left);
  END IF;
  SELECT arrival INTO v_arrival FROM durable_admission_waiters
    WHERE holder = p_holder AND queue = p_queue;
  v_known := FOUND;
  IF NOT v_known THEN
    v_arrival := q.arrivals + 1;
  END IF;
  IF p_fair THEN
    SELECT served INTO v_served FROM durable_admission_keys
      WHERE queue = p_queue AND fair_key = p_key;
    v_served := coalesce(v_served, 0);
  END IF;
  SELECT count(*) INTO v_ahead
    FROM durable_admission_waiters w
    LEFT JOIN durable_admission_keys k
      ON p_fair AND k.queue = w.queue AND k.fair_key = w.fair_key
    WHERE w.queue = p_queue AND w.holder <> p_holder
      AND (w.priority > p_priority OR (w.priority = p_priority AND (
            (p_fair AND coalesce(k.served, 0) < v_served)
            OR ((NOT p_fair OR coalesce(k.served, 0) = v_served) AND
                CASE WHEN p_lifo THEN w.arrival > v_arrival
                     ELSE w.arrival < v_arrival END))));
  IF v_free > 0 THEN
    IF v_ahead < v_free THEN
      INSERT INTO durable_admission_slots (holder, queue, owner, ttl_ms, expires_at)
        VALUES (p_holder, p_queue, p_owner, p_slot_ttl, p_now + p_slot_ttl)
        ON CONFLICT (holder) DO UPDATE SET queue = EXCLUDED.queue, owner = EXCLUDED.owner,
          ttl_ms = EXCLUDED.ttl_ms, expires_at = EXCLUDED.expires_at;
      IF v_known THEN
        DELETE FROM durable_admission_waiters WHERE holder = p_holder;
      END IF;
      q.served := q.served + 1;
      IF p_fair THEN
        INSERT INTO durable_admission_keys (queue, fair_key, served)
          VALUES (p_queue, p_key, q.served)
          ON CONFLICT (queue, fair_key) DO UPDATE SET served = EXCLUDED.served;
        DELETE FROM durable_admission_keys
          WHERE queue = p_queue AND served < q.served - 10000;
      END IF;
      IF p_rate_limit IS NOT NULL THEN
        q.window_count := q.window_count + 1;
      END IF;
      UPDATE durable_admission_queues
        SET window_start = q.window_start, window_count = q.window_count,
            served = q.served, concurrency = p_concurrency,
            fair = CASE WHEN p_fair THEN 1 ELSE 0 END, lifo = CASE WHEN p_lifo THEN 1 ELSE 0 END
        WHERE queue = p_queue;
      RETURN 0;
    END IF;
  END IF;
  -- Turned away: ask again when a place could be free for this rank (capped), and keep
  -- the place in line until two retry intervals after that.
  IF v_rate_left IS NOT NULL AND v_rate_left <= 0 THEN
    v_retry_at := v_window + p_rate_period * least({MAX_WAIT}, 1 + v_ahead / p_rate_limit);
  ELSE
    v_retry_at := p_now + p_retry
      * least({MAX_WAIT}, 1 + v_ahead / greatest(coalesce(p_concurrency, p_rate_limit, 1), 1));
  END IF;
  IF v_known THEN
    UPDATE durable_admission_waiters
      SET priority = p_priority, fair_key = p_key, expires_at = v_retry_at + 2 * p_retry
      WHERE holder = p_holder;
  ELSE
    q.arrivals := q.arrivals + 1;
    INSERT INTO durable_admission_waiters
      (holder, queue, priority, fair_key, arrival, expires_at)
      VALUES (p_holder, p_queue, p_priority, p_key, q.arrivals, v_retry_at + 2 * p_retry)
      ON CONFLICT (holder) DO UPDATE SET queue = EXCLUDED.queue,
        priority = EXCLUDED.priority, fair_key = EXCLUDED.fair_key,
        arrival = EXCLUDED.arrival, expires_at = EXCLUDED.expires_at;
  END IF;
  UPDATE durable_admission_queues
    SET window_start = q.window_start, window_count = q.window_count,
        arrivals = q.arrivals, concurrency = p_concurrency,
        fair = CASE WHEN p_fair THEN 1 ELSE 0 END, lifo = CASE WHEN p_lifo THEN 1 ELSE 0 END
    WHERE queue = p_queue;
  RETURN v_retry_at;
END
$fn$
"""

# Frees the holders' slots, forgets their places in line, and names each touched queue's
# best waiters on the channel (payload: "freed:<queue>" then one holder per line).
_RELEASE_FN = f"""
CREATE OR REPLACE FUNCTION durable_admission_release(
  p_holders TEXT[], p_now BIGINT, p_channel TEXT
) RETURNS INTEGER LANGUAGE plpgsql AS $fn$
DECLARE
  r RECORD;
  q RECORD;
  v_freed INTEGER := 0;
  v_count INTEGER;
  v_best TEXT;
BEGIN
  SET LOCAL synchronous_commit = off;
  DELETE FROM durable_admission_waiters WHERE holder = ANY(p_holders);
  FOR r IN
    WITH gone AS (
      DELETE FROM durable_admission_slots WHERE holder = ANY(p_holders)
      RETURNING queue, expires_at
    )
    SELECT queue, count(*)::INTEGER AS n FROM gone WHERE expires_at > p_now GROUP BY queue
  LOOP
    v_freed := v_freed + r.n;
    IF p_channel IS NOT NULL THEN
      SELECT * INTO q FROM durable_admission_queues WHERE queue = r.queue;
      v_count := r.n;
      IF q.concurrency IS NOT NULL THEN
        v_count := greatest(r.n, q.concurrency - (SELECT count(*) FROM durable_admission_slots
                                                  WHERE queue = r.queue AND expires_at > p_now));
      END IF;
      SELECT string_agg(b.holder, chr(10)) INTO v_best FROM (
        SELECT w.holder FROM durable_admission_waiters w
          LEFT JOIN durable_admission_keys k
            ON q.fair = 1 AND k.queue = w.queue AND k.fair_key = w.fair_key
          WHERE w.queue = r.queue AND w.expires_at > p_now
          ORDER BY w.priority DESC,
                   CASE WHEN q.fair = 1 THEN coalesce(k.served, 0) ELSE 0 END,
                   CASE WHEN q.lifo = 1 THEN -w.arrival ELSE w.arrival END
          LIMIT least(v_count, {NOTIFY_AT_MOST})
      ) b;
      PERFORM pg_notify(p_channel, 'freed:' || r.queue || coalesce(chr(10) || v_best, ''));
    END IF;
  END LOOP;
  RETURN v_freed;
END
$fn$
"""


def migration_v5(dialect_name: str) -> list[str]:
    """The admission tables (on every dialect, so a fresh schema equals a migrated one) and,
    on PostgreSQL, the two functions that admit and release."""
    tables = [s.strip() for s in _V5_TABLES.split(";") if s.strip()]
    if dialect_name != "postgresql":
        return tables
    return [*tables, _ACQUIRE_FN.strip(), _RELEASE_FN.strip()]
