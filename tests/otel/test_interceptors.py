"""`durably.Interceptor`: hooks around step attempts, turns and client calls, on a real SQLite
file (and over the in-process reference transport for dispatched and served steps).

- Interceptors compose outermost first, and a contextvar one sets before `call_next()` is
  visible in async steps, sync steps (run on the engine's thread pool), local steps and the
  workflow body.
- A step answered from its checkpoint on replay is not an attempt: no hook runs for it.
- Client verbs are intercepted with what they name; hostile `interceptors=` values are refused.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import ClientCallInfo, Interceptor, StepCallInfo, TurnInfo, WorkflowCtx
from durably.transports import InMemoryTransport
from tests.engine_support import FAST_TUNING

SCOPE: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("scope", default=())
RESULT_TIMEOUT = 20.0


class Recording(Interceptor):
    """Pushes its label on SCOPE around every hook and records what it saw."""

    def __init__(self, label: str, log: list[tuple[str, str, object]]):
        self.label = label
        self.log = log

    async def _around(
        self, where: str, info: object, call_next: Callable[[], Awaitable[Any]]
    ) -> Any:
        self.log.append((self.label, f"enter {where}", info))
        token = SCOPE.set((*SCOPE.get(), self.label))
        try:
            return await call_next()
        finally:
            SCOPE.reset(token)
            self.log.append((self.label, f"exit {where}", info))

    async def intercept_step(
        self, info: StepCallInfo, call_next: Callable[[], Awaitable[Any]]
    ) -> Any:
        return await self._around("step", info, call_next)

    async def intercept_turn(
        self, info: TurnInfo, call_next: Callable[[], Awaitable[None]]
    ) -> None:
        await self._around("turn", info, call_next)

    async def intercept_client(
        self, info: ClientCallInfo, call_next: Callable[[], Awaitable[Any]]
    ) -> Any:
        # Only recorded: a run the engine starts inline would inherit a scope set here.
        self.log.append((self.label, "enter client", info))
        return await call_next()


def _db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'durably.db'}"


async def test_interceptors_nest_outermost_first_and_their_context_reaches_every_body(
    tmp_path: Path, uid: str
) -> None:
    seen: dict[str, tuple[str, ...]] = {}
    log: list[tuple[str, str, object]] = []

    @durably.step(f"{uid}.async")
    async def async_step(x: int) -> int:
        seen["async"] = SCOPE.get()
        return x + 1

    @durably.step(f"{uid}.sync")
    def sync_step(x: int) -> int:  # runs on the engine's thread pool
        seen["sync"] = SCOPE.get()
        return x * 2

    def local(log: object) -> int:
        seen["local"] = SCOPE.get()
        return 7

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        seen["body"] = SCOPE.get()
        a = await ctx.step(async_step, x)
        b = await ctx.step(sync_step, a)
        c: int = await ctx.local_step("local", local)
        return a + b + c

    engine = durably.Engine(
        _db(tmp_path),
        workflows=[wf],
        steps=[async_step, sync_step],
        interceptors=[Recording("outer", log), Recording("inner", log)],
        **FAST_TUNING,
    )
    async with engine:
        assert await engine.execute(wf, 1, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 2 + 4 + 7
    assert seen == {
        "body": ("outer", "inner"),
        "async": ("outer", "inner", "outer", "inner"),  # the turn's scope, then the step's
        "sync": ("outer", "inner", "outer", "inner"),
        "local": ("outer", "inner", "outer", "inner"),
    }
    steps = [(label, what, i) for label, what, i in log if isinstance(i, StepCallInfo)]
    assert [(label, what) for label, what, _ in steps[:4]] == [
        ("outer", "enter step"),
        ("inner", "enter step"),
        ("inner", "exit step"),
        ("outer", "exit step"),
    ]
    infos = [i for label, what, i in steps if label == "outer" and what == "enter step"]
    assert [(i.step, i.seq, i.attempt, i.kind, i.run_id, i.workflow) for i in infos] == [
        (f"{uid}.async", 0, 1, "step", f"{uid}-r", f"{uid}.wf"),
        (f"{uid}.sync", 1, 1, "step", f"{uid}-r", f"{uid}.wf"),
        ("local", 2, 1, "local", f"{uid}-r", f"{uid}.wf"),
    ]
    assert all(i.namespace == "default" for i in infos)
    turns = [i for label, what, i in log if isinstance(i, TurnInfo) and what == "enter turn"]
    assert turns and turns[0] == TurnInfo(
        run_id=f"{uid}-r",
        workflow=f"{uid}.wf",
        namespace="default",
        parent_run_id=None,
        resumed=False,
    )
    starts = [i for _, what, i in log if isinstance(i, ClientCallInfo) and what == "enter client"]
    assert [(i.verb, i.run_id, i.workflow) for i in starts[:1]] == [
        ("start", f"{uid}-r", f"{uid}.wf")
    ]


async def test_a_step_replayed_from_its_checkpoint_is_not_intercepted_and_retries_are(
    tmp_path: Path, uid: str
) -> None:
    log: list[tuple[str, str, object]] = []
    failures = [1]

    @durably.step(f"{uid}.flaky", retries=2, backoff_ms=1)
    async def flaky(x: int) -> int:
        if failures:
            failures.pop()
            raise RuntimeError("once")
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        a = await ctx.step(flaky, x)
        await ctx.sleep("20ms")  # always_replay: the next turn replays `flaky` from its row
        return a + await ctx.step(flaky, x)

    engine = durably.Engine(
        _db(tmp_path),
        workflows=[wf],
        steps=[flaky],
        interceptors=[Recording("only", log)],
        always_replay=True,
        **FAST_TUNING,
    )
    async with engine:
        assert await engine.execute(wf, 3, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 6
    attempts = [
        (i.seq, i.attempt)
        for _, what, i in log
        if isinstance(i, StepCallInfo) and what == "enter step"
    ]
    assert attempts == [(0, 1), (0, 2), (2, 1)]  # seq 1 is the sleep
    turns = [i for _, what, i in log if isinstance(i, TurnInfo) and what == "enter turn"]
    assert len(turns) >= 2 and not turns[0].resumed and turns[-1].resumed


async def test_dispatched_and_served_steps_are_intercepted_on_both_ends(
    tmp_path: Path, uid: str
) -> None:
    log: list[tuple[str, str, object]] = []
    seen: list[tuple[str, ...]] = []

    class Carrier(Recording):
        def traceparent(self) -> str | None:
            return "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01" if SCOPE.get() else None

    @durably.step(f"{uid}.far")
    def far(x: int) -> int:
        seen.append(SCOPE.get())
        return x + 1

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(far, x)

    transport = InMemoryTransport()
    engine = durably.Engine(
        _db(tmp_path),
        transport=transport,
        workflows=[wf],
        steps=[far],
        interceptors=[Carrier("c", log)],
        **FAST_TUNING,
    )
    async with engine:
        assert await engine.execute(wf, 1, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 2
    kinds = [
        (i.kind, i.traceparent)
        for _, what, i in log
        if isinstance(i, StepCallInfo) and what == "enter step"
    ]
    tp = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    assert kinds == [("dispatch", None), ("served", tp)]
    assert [t.traceparent for t in transport.broker.dispatched] == [tp]
    assert seen == [("c",)]  # the served body sees the serving side's scope


async def test_client_verbs_are_intercepted_with_what_they_name(tmp_path: Path, uid: str) -> None:
    log: list[tuple[str, str, object]] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        return str(await ctx.wait_for_signal(f"{uid}:go"))

    async with durably.Engine(_db(tmp_path), workflows=[wf], **FAST_TUNING) as engine:
        handle = await engine.start(wf, run_id=f"{uid}-worked")
        async with durably.Client(_db(tmp_path), interceptors=[Recording("client", log)]) as client:
            await client.start(f"{uid}.wf", run_id=f"{uid}-r")
            await client.signal(f"{uid}:go", "yes")
            await client.cancel(f"{uid}-r")
            await client.delete_run(f"{uid}-r")
        assert await handle.result(timeout=RESULT_TIMEOUT) == "yes"
    calls = [
        (i.verb, i.run_id, i.workflow, i.token)
        for _, what, i in log
        if isinstance(i, ClientCallInfo) and what == "enter client"
    ]
    assert calls == [
        ("start", f"{uid}-r", f"{uid}.wf", None),
        ("signal", None, None, f"{uid}:go"),
        ("cancel", f"{uid}-r", None, None),
        ("delete_run", f"{uid}-r", None, None),
    ]


@pytest.mark.parametrize("bad", [Recording, object(), "x", [object()], (lambda: None,)])
def test_interceptors_must_be_a_list_of_interceptor_instances(bad: Any, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="interceptors"):
        durably.Engine(_db(tmp_path), interceptors=bad)
    with pytest.raises(TypeError, match="interceptors"):
        durably.Client(_db(tmp_path), interceptors=bad)


def test_no_interceptors_is_an_empty_chain() -> None:
    from durably._engine.defs.intercept import NO_INTERCEPTORS, Interceptors

    assert Interceptors.of([], "Engine") is NO_INTERCEPTORS
    assert Interceptors.of(None, "Engine") is NO_INTERCEPTORS
    assert not NO_INTERCEPTORS


def test_a_sync_client_passes_its_interceptors_on(tmp_path: Path, uid: str) -> None:
    log: list[tuple[str, str, object]] = []
    with durably.SyncClient(_db(tmp_path), interceptors=[Recording("sync", log)]) as client:
        client.signal(f"{uid}:nobody", 1)
    assert [(what, i.verb) for _, what, i in log if isinstance(i, ClientCallInfo)] == [
        ("enter client", "signal")
    ]
