"""SQLite durability is the user's choice: `sqlite:///app.db?synchronous=full` (or `normal`,
the default). The chosen `synchronous` must be in force on EVERY connection the store opens —
the pool's, the writer's and the writer loop's lane — since a single connection committing
with NORMAL would acknowledge commits that power loss can take. Anything but `normal`/`full`
is refused with a ValueError naming the option.

`PRAGMA synchronous` is per connection, so it is read back through the store's own
connections (the only place it can be read): 1 is NORMAL, 2 is FULL.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import durably
from durably import WorkflowCtx
from durably._store.sql import SqlStateStore

NORMAL, FULL = 1, 2


def _sql_store(store: Any) -> SqlStateStore:
    """The SqlStateStore under the engine's store (a codec wraps it)."""
    seen = store
    for _ in range(5):
        if isinstance(seen, SqlStateStore):
            return seen
        seen = next(
            (v for v in vars(seen).values() if isinstance(v, SqlStateStore)),
            getattr(seen, "_inner", None) or getattr(seen, "inner", None),
        )
    raise AssertionError(f"no SqlStateStore under {store!r}")


async def _synchronous_everywhere(store: SqlStateStore) -> dict[str, list[int]]:
    """`PRAGMA synchronous` on the writer, on its lane, and on several pool connections
    open at once (so more than one pooled connection is made)."""
    cx: Any = store._cx
    writer = [int(r[0]) for r in await cx.fetch(sa.text("PRAGMA synchronous"), write=True)]
    lane = cx._lane
    assert lane is not None, "the writer's loop lane is open for a database file"
    on_lane = [int(r[0]) for r in lane._conn.execute("PRAGMA synchronous").fetchall()]

    pool = []
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(3):  # held open together: three pooled connections
            conn = await stack.enter_async_context(store.engine.connect())
            pool.append(int((await conn.exec_driver_sql("PRAGMA synchronous")).scalar_one()))
    return {"writer": writer, "lane": on_lane, "pool": pool}


@pytest.mark.parametrize(
    ("query", "want"),
    [("", NORMAL), ("?synchronous=normal", NORMAL), ("?synchronous=full", FULL),
     ("?synchronous=FULL", FULL)],
)  # fmt: skip
async def test_the_chosen_synchronous_is_on_every_connection_of_an_engine(
    tmp_path: Path, query: str, want: int
) -> None:
    @durably.step(f"sync.step{want}{len(query)}")
    def step(x: int) -> int:
        return x + 1

    @durably.workflow(f"sync.wf{want}{len(query)}")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(step, x)

    async with durably.Engine(store=f"sqlite:///{tmp_path / 'app.db'}{query}") as engine:
        assert await engine.execute(wf, 1, timeout=30) == 2
        found = await _synchronous_everywhere(_sql_store(engine.store))
    assert found == {"writer": [want], "lane": [want], "pool": [want] * 3}


async def test_the_keyword_wins_over_the_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}?synchronous=normal"
    async with SqlStateStore.from_url(url, synchronous="full") as store:
        await store.ensure_schema()
        found = await _synchronous_everywhere(store)
    assert found == {"writer": [FULL], "lane": [FULL], "pool": [FULL] * 3}


@pytest.mark.parametrize(
    "query",
    ["?synchronous=off", "?synchronous=extra", "?synchronous=1", "?synchronous=",
     "?synchronous=full&synchronous=normal"],
)  # fmt: skip
def test_any_other_synchronous_is_refused_naming_the_option(tmp_path: Path, query: str) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}{query}"
    with pytest.raises(ValueError, match="synchronous"):
        SqlStateStore.from_url(url)
    with pytest.raises(ValueError, match="synchronous"):
        durably.Engine(store=url)
    assert not (tmp_path / "app.db").exists()
