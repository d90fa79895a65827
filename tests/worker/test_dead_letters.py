"""Dead-letter workflows on a real SQLite file: a run that crash recovery gives up on is
marked `dead` and its handler is started once, as `dlq:<runId>`.

The crashed owner is staged in the store: a `running` run leased by an instance whose
lease has lapsed and that was already recovered `max_recovery_attempts` times. The
engine's poller then finds it, as it would after the last crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import durably
from durably import WorkflowCtx, WorkflowRun
from tests.engine_support import FAST_TUNING, wait_until

from .fakes import pending_run

CAP = 2

handled: list[dict[str, Any]] = []


@durably.workflow("dl.handler")
async def dl_handler(ctx: WorkflowCtx, dead: dict[str, Any]) -> str:
    handled.append({"by": "workflow-level", **dead})
    return "handled"


@durably.workflow("dl.engine_handler")
async def dl_engine_handler(ctx: WorkflowCtx, dead: dict[str, Any]) -> str:
    handled.append({"by": "engine", **dead})
    return "handled"


@durably.workflow("dl.poison", dead_letter=dl_handler)
async def dl_poison(ctx: WorkflowCtx, x: int) -> int:
    return x


@durably.workflow("dl.plain")
async def dl_plain(ctx: WorkflowCtx, x: int) -> int:
    return x


WORKFLOWS = [dl_handler, dl_engine_handler, dl_poison, dl_plain]


def engine(tmp_path: Path, **options: Any) -> durably.Engine:
    return durably.Engine(
        f"sqlite:///{tmp_path / 'dl.db'}",
        workflows=WORKFLOWS,
        max_recovery_attempts=CAP,
        **{**FAST_TUNING, **options},
    )


async def orphan(eng: durably.Engine, run_id: str, workflow: str, x: Any = 7) -> None:
    """A run whose owner crashed for the last time it may: recovered CAP times already."""
    await eng.store.create_run(
        pending_run(
            run_id,
            workflow,
            status="running",
            input=x,
            locked_by="crashed",
            locked_until=1,
            recovery_attempts=CAP,
        )
    )


async def settled(eng: durably.Engine, run_id: str) -> WorkflowRun:
    async def done() -> bool:
        run = await eng.get_run(run_id)
        return run is not None and run.status in ("completed", "failed", "dead")

    await wait_until(done)
    found = await eng.get_run(run_id)
    assert found is not None
    return found


@pytest.fixture(autouse=True)
def _clear() -> None:
    handled.clear()


async def test_the_workflow_level_handler_beats_the_engines_and_runs_once(
    tmp_path: Path,
) -> None:
    async with engine(tmp_path, dead_letter_workflow=dl_engine_handler) as eng:
        dead_seen: list[str] = []
        eng.on_dead(lambda run: dead_seen.append(run.id))
        await orphan(eng, "p1", "dl.poison")
        dead = await settled(eng, "p1")
        assert dead.status == "dead" and dead.error is not None
        assert dead.error.code == "max_recovery_attempts"
        assert dead.error.details == {"deadLetterRun": "dlq:p1"}
        assert dead.recovery_attempts == CAP + 1
        handler = await settled(eng, "dlq:p1")
        assert (handler.workflow, handler.status, handler.output) == (
            "dl.handler",
            "completed",
            "handled",
        )
        assert handler.input == {
            "deadRunId": "p1",
            "workflow": "dl.poison",
            "input": 7,
            "error": {
                "message": f"run exceeded maxRecoveryAttempts ({CAP}) — moved to dead-letter",
                "code": "max_recovery_attempts",
            },
        }
        assert dead_seen == ["p1"]

        # Retried and given up on again: the handler that already ran is not started anew.
        await eng.store.update_run(
            "p1",
            {"status": "running", "locked_by": "crashed", "locked_until": 1, "error": None},
        )
        again = await settled(eng, "p1")
        assert again.status == "dead" and dead_seen == ["p1", "p1"]
        assert [h["by"] for h in handled] == ["workflow-level"]


async def test_the_engines_handler_serves_workflows_without_their_own(tmp_path: Path) -> None:
    async with engine(tmp_path, dead_letter_workflow="dl.engine_handler") as eng:
        await orphan(eng, "p2", "dl.plain", {"order": 3})
        await settled(eng, "p2")
        handler = await settled(eng, "dlq:p2")
        assert handler.workflow == "dl.engine_handler"
        assert [(h["by"], h["deadRunId"], h["input"]) for h in handled] == [
            ("engine", "p2", {"order": 3})
        ]


async def test_without_a_handler_the_run_is_only_dead(tmp_path: Path) -> None:
    async with engine(tmp_path) as eng:
        await orphan(eng, "p3", "dl.plain")
        dead = await settled(eng, "p3")
        assert dead.status == "dead" and dead.error is not None
        assert dead.error.details is None
        assert await eng.get_run("dlq:p3") is None


async def test_a_dead_letter_run_that_dies_gets_no_handler(tmp_path: Path) -> None:
    async with engine(tmp_path, dead_letter_workflow=dl_engine_handler) as eng:
        await orphan(eng, "dlq:p4", "dl.engine_handler", {"deadRunId": "p4"})
        dead = await settled(eng, "dlq:p4")
        assert dead.status == "dead"
        assert await eng.get_run("dlq:dlq:p4") is None


async def test_a_handler_that_cannot_start_leaves_the_run_dead(tmp_path: Path) -> None:
    async with engine(tmp_path, dead_letter_workflow="dl.no_such_handler") as eng:
        await orphan(eng, "p5", "dl.plain")
        dead = await settled(eng, "p5")
        assert dead.status == "dead" and dead.error is not None
        assert dead.error.details is None
        assert await eng.get_run("dlq:p5") is None


def test_a_dead_letter_that_is_no_workflow_is_refused_where_it_is_declared() -> None:
    with pytest.raises(TypeError, match="dead_letter takes a workflow"):
        durably.workflow("dl.bad", dead_letter=42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dead_letter_workflow"):
        durably.Engine("memory", dead_letter_workflow=3.5)  # type: ignore[arg-type]
