"""`fork(run_id, from_seq=...)` on a real SQLite file and PostgreSQL (and the memory
reference): a run that failed at a step because of a bug is forked from that step after the
fix and completes, without the steps before it running again; the original stays as it was."""

from __future__ import annotations

from typing import Any

import pytest

import durably
from durably import (
    Client,
    Engine,
    FatalError,
    InputValidationError,
    RunIdConflictError,
    RunNotFoundError,
)
from tests.client.conftest import FAST

WAIT = 20.0

# The "bug": while set, step 7 raises. The test flips it to deploy the fix.
BUGGY = {"on": True}


def ten_steps(uid: str, executed: list[int]) -> durably.Workflow[Any, Any]:
    @durably.step(f"{uid}.work", retries=0)
    async def work(i: int) -> int:
        executed.append(i)  # the side-effect log: which steps really ran
        if i == 7 and BUGGY["on"]:
            raise FatalError("step 7 has a bug", code="BUG")
        return i * 10

    @durably.workflow(f"{uid}-ten")
    async def ten(ctx: durably.WorkflowCtx, n: int) -> list[int]:
        return [await ctx.step(work, i) for i in range(n)]

    return ten


async def failed_run(engine: Engine, wf: durably.Workflow[Any, Any], run_id: str) -> None:
    handle = await engine.start(wf, 10, run_id=run_id)
    run = await handle.wait(timeout=WAIT)
    assert run.status == "failed"


@pytest.fixture(autouse=True)
def _buggy() -> Any:
    BUGGY["on"] = True
    yield
    BUGGY["on"] = True


async def test_a_fork_from_the_failed_step_completes_without_rerunning_earlier_steps(
    store: Any, uid: str
) -> None:
    executed: list[int] = []
    wf = ten_steps(uid, executed)
    async with Engine(store=store, workflows=[wf], **FAST) as engine:
        await failed_run(engine, wf, f"{uid}-r")
        assert executed == list(range(8))
        before = await engine.list_checkpoints(f"{uid}-r")
        executed.clear()
        BUGGY["on"] = False  # the fix is deployed
        async with Client(store) as client:
            handle = await client.fork(f"{uid}-r", from_seq=7)
            assert handle.run_id == f"{uid}-r~fork~7"
            assert await handle.result(timeout=WAIT) == [i * 10 for i in range(10)]
        assert executed == [7, 8, 9]  # steps 0-6 were reused, not executed again
        original = await engine.get_run(f"{uid}-r")
        assert original is not None and original.status == "failed"
        assert await engine.list_checkpoints(f"{uid}-r") == before
        fork = await engine.get_run(f"{uid}-r~fork~7")
        assert fork is not None and f"forked-from:{uid}-r@7" in (fork.tags or ())
        detail = await engine.get_run_detail(f"{uid}-r~fork~7")
        assert detail is not None
        forks = await engine.list_runs(tags=[f"forked-from:{uid}-r@7"])
        assert [r.id for r in forks] == [f"{uid}-r~fork~7"]


async def test_every_fork_of_a_run_is_found_by_one_tag_and_names_its_direct_original(
    store: Any, uid: str
) -> None:
    executed: list[int] = []
    wf = ten_steps(uid, executed)
    async with Engine(store=store, workflows=[wf], **FAST) as engine:
        await failed_run(engine, wf, f"{uid}-r")
        first = await engine.fork(f"{uid}-r", from_seq=7)
        assert (await first.wait(timeout=WAIT)).status == "failed"  # the bug is still there
        second = await engine.fork(f"{uid}-r", from_seq=3)
        await second.wait(timeout=WAIT)
        forks = await engine.list_runs(tags=[f"forked-from:{uid}-r"])
        assert sorted(r.id for r in forks) == [f"{uid}-r~fork~3", f"{uid}-r~fork~7"]
        # A fork of a fork: linked to the fork it was made from, not to the first run.
        BUGGY["on"] = False
        grand = await engine.fork(first.run_id, from_seq=7)
        await grand.result(timeout=WAIT)
        run = await engine.get_run(grand.run_id)
        assert run is not None
        assert sorted(t for t in run.tags or () if t.startswith("forked-from:")) == [
            f"forked-from:{uid}-r~fork~7",
            f"forked-from:{uid}-r~fork~7@7",
        ]
        assert sorted(r.id for r in await engine.list_runs(tags=[f"forked-from:{uid}-r"])) == [
            f"{uid}-r~fork~3",
            f"{uid}-r~fork~7",
        ]


async def test_forking_again_to_the_same_id_returns_the_first_fork(store: Any, uid: str) -> None:
    executed: list[int] = []
    wf = ten_steps(uid, executed)
    async with Engine(store=store, workflows=[wf], **FAST) as engine:
        await failed_run(engine, wf, f"{uid}-r")
        BUGGY["on"] = False
        first = await engine.fork(f"{uid}-r", from_seq=5, new_run_id=f"{uid}-f")
        await first.result(timeout=WAIT)
        executed.clear()
        again = await engine.fork(f"{uid}-r", from_seq=5, new_run_id=f"{uid}-f")
        assert again.run_id == f"{uid}-f"
        assert await again.result(timeout=WAIT) == [i * 10 for i in range(10)]
        assert executed == []  # nothing ran again
        with pytest.raises(RunIdConflictError):
            await engine.fork(f"{uid}-r", from_seq=3, new_run_id=f"{uid}-f")


async def test_fork_refusals_name_the_problem_and_write_nothing(store: Any, uid: str) -> None:
    executed: list[int] = []
    wf = ten_steps(uid, executed)

    @durably.workflow(f"{uid}-waits")
    async def waits(ctx: durably.WorkflowCtx) -> Any:
        return await ctx.wait_for_signal(f"{uid}:never")

    async with Engine(store=store, workflows=[wf, waits], **FAST) as engine:
        await failed_run(engine, wf, f"{uid}-r")
        with pytest.raises(RunNotFoundError, match="nothing to fork"):
            await engine.fork(f"{uid}-missing", from_seq=0)
        with pytest.raises(ValueError, match=r"from_seq=9 is out of range.*0\.\.7"):
            await engine.fork(f"{uid}-r", from_seq=9)
        with pytest.raises(ValueError, match="out of range"):
            await engine.fork(f"{uid}-r", from_seq=-1)
        with pytest.raises(InputValidationError):
            await engine.fork(f"{uid}-r", from_seq=7, input="not an int")
        live = await engine.start(waits, None, run_id=f"{uid}-live")
        await live.wait(timeout=WAIT)  # suspended on its signal
        with pytest.raises(ValueError, match="only a settled run"):
            await engine.fork(f"{uid}-live", from_seq=0)
        assert await engine.get_run(f"{uid}-r~fork~9") is None
        assert await engine.get_run(f"{uid}-r~fork~7") is None
        assert await engine.list_checkpoints(f"{uid}-r~fork~7") == []


async def test_a_fork_takes_a_new_input(store: Any, uid: str) -> None:
    executed: list[int] = []
    wf = ten_steps(uid, executed)
    async with Engine(store=store, workflows=[wf], **FAST) as engine:
        await failed_run(engine, wf, f"{uid}-r")
        executed.clear()
        BUGGY["on"] = False
        handle = await engine.fork(f"{uid}-r", from_seq=7, input=8)
        assert await handle.result(timeout=WAIT) == [i * 10 for i in range(8)]
        assert executed == [7]
