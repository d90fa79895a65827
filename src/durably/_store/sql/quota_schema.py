"""The schema of workflow start admission (migration 6): the dedup table.

Concurrency quotas and singleton keys need no table of their own: they count runs through
the tag index (`durable_run_tags (tag, run_id)`). A start's dedup id is remembered in
`durable_run_dedup`: one row per key naming the run that took it last; the key is free
again as soon as that run is no longer live (the check reads the run's status, so no write
is needed when a run ends).

Kept apart from the store module because the migrations import it, and the store imports the
migrations.
"""

from __future__ import annotations

__all__ = ["migration_v6"]

_V6 = """
CREATE TABLE IF NOT EXISTS durable_run_dedup (
  dedup_key  TEXT NOT NULL,
  run_id     TEXT NOT NULL,
  PRIMARY KEY (dedup_key)
)
"""


def migration_v6(dialect_name: str) -> list[str]:
    """The same table on every dialect (frozen: a published migration never changes)."""
    return [s.strip() for s in _V6.split(";") if s.strip()]
