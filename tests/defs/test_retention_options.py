"""The retention sweep's knobs are engine options: `retention_batch_size` and
`retention_max_batches` bound what one sweep deletes, whether given as keywords, in an
`EngineOptions` value or through `DURABLY_RETENTION_*`, on a real SQLite file."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import durably
from durably import EngineOptions, RetentionPolicy, RunQuery, WorkflowRun
from tests.engine_support import FAST_TUNING, wait_until

POLICY = RetentionPolicy(["completed"], max_age="1d")


def _old(run_id: str) -> WorkflowRun:
    when = datetime.now(UTC) - timedelta(days=5)
    return WorkflowRun(
        id=run_id,
        workflow="report",
        workflow_version="1",
        status="completed",
        created_at=when,
        updated_at=when,
    )


async def _seed(url: str, uid: str, n: int) -> None:
    async with durably.Engine(url, workflows=[], **FAST_TUNING) as seeder:
        for i in range(n):
            await seeder.store.create_run(_old(f"{uid}-{i}"))


async def _left(engine: durably.Engine) -> int:
    return len(await engine.store.list_runs(RunQuery(limit=100)))


async def test_one_sweep_deletes_at_most_batch_size_times_max_batches(
    tmp_path: Path, uid: str
) -> None:
    url = f"sqlite:///{tmp_path / 'durably.db'}"
    await _seed(url, uid, 5)
    engine = durably.Engine(
        url,
        workflows=[],
        retention=[POLICY],
        retention_sweep_ms=0,  # at open only
        retention_batch_size=2,
        retention_max_batches=2,
        **FAST_TUNING,
    )
    assert (engine.options.retention_batch_size, engine.options.retention_max_batches) == (2, 2)
    async with engine:
        await wait_until(lambda: _swept(engine))
        [result] = engine.retention.last
        assert (result.count, result.batches) == (4, 2)
        assert await _left(engine) == 1  # the rest waits for the next sweep
        assert engine.retention.sweeps == 1  # 0: no sweep after the one at open
        [again] = await engine.retention.sweep() or []
        assert (again.count, again.batches) == (1, 1)
        assert await _left(engine) == 0


async def test_the_sweep_reads_its_options_from_the_environment(
    tmp_path: Path, uid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'durably.db'}"
    await _seed(url, uid, 5)
    monkeypatch.setenv("DURABLY_RETENTION_SWEEP_MS", "0")
    monkeypatch.setenv("DURABLY_RETENTION_BATCH_SIZE", "1")
    monkeypatch.setenv("DURABLY_RETENTION_MAX_BATCHES", "3")
    engine = durably.Engine(url, workflows=[], retention=POLICY, **FAST_TUNING)
    assert engine.options.retention_sweep_ms == 0
    async with engine:
        await wait_until(lambda: _swept(engine))
        [result] = engine.retention.last
        assert (result.count, result.batches) == (3, 3)
        assert await _left(engine) == 2


async def test_an_options_value_carries_the_sweep_options(tmp_path: Path, uid: str) -> None:
    url = f"sqlite:///{tmp_path / 'durably.db'}"
    await _seed(url, uid, 3)
    shared = EngineOptions(retention_sweep_ms=0, retention_batch_size=1, retention_max_batches=1)
    async with durably.Engine(url, workflows=[], retention=POLICY, options=shared) as engine:
        await wait_until(lambda: _swept(engine))
        assert [r.count for r in engine.retention.last] == [1]
        assert await _left(engine) == 2


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("retention_batch_size", 0, r"Engine\(retention_batch_size=…\) must be >= 1, not 0"),
        ("retention_max_batches", -3, r"Engine\(retention_max_batches=…\) must be >= 1"),
        ("retention_sweep_ms", -1, r"Engine\(retention_sweep_ms=…\) must be >= 0"),
        ("retention_sweep_ms", 1.5, r"retention_sweep_ms=…\) must be a whole number of millis"),
    ],
)
def test_bad_sweep_options_are_refused_naming_them(
    option: str, value: object, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        durably.Engine("memory", retention=POLICY, **{option: value})  # type: ignore[arg-type]


async def _swept(engine: durably.Engine) -> bool:
    return engine.retention.sweeps > 0
