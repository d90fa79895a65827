"""`durably.RetryPolicy`: max_attempts (and its alias `retries`), retry_on / dont_retry_on,
validation at declaration, and the attempt history every step row keeps (`attempt_errors`).

Steps here run in-process; tests/remote/test_remote_retry_policy.py has the steps served over
a transport, tests/sql/test_attempt_history.py the history on a real SQLite file and
PostgreSQL across a restart.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import durably
from durably import FatalError, RetryPolicy, RunFailedError, StepCheckpoint, WorkflowCtx
from durably._core.models import ATTEMPT_ERRORS_FIRST, ATTEMPT_ERRORS_LAST, ATTEMPT_MESSAGE_MAX
from tests.engine_support import RESULT_TIMEOUT, EngineFactory


class Transient(Exception):
    pass


class Flaky(Transient):
    """A subclass: `retry_on=(Transient,)` retries it too."""


def _attempts(cp: StepCheckpoint) -> list[tuple[int, str]]:
    return [(e.attempt, e.message) for e in cp.attempt_errors or ()]


async def _failed(engine: durably.Engine, workflow: Any, run_id: str) -> RunFailedError:
    with pytest.raises(RunFailedError) as caught:
        await engine.execute(workflow, None, run_id=run_id, timeout=RESULT_TIMEOUT)
    return caught.value


# ------------------------------------------------------------------ declaration


def test_max_attempts_and_its_alias_retries_are_the_same_number(uid: str) -> None:
    assert RetryPolicy(max_attempts=3) == RetryPolicy(retries=3)
    assert RetryPolicy(retries=3).retries == 3
    assert RetryPolicy(max_attempts=3, retries=3).max_attempts == 3
    assert RetryPolicy(retries=0).max_attempts == 1  # the legacy "one attempt"

    @durably.step(f"{uid}.a", retries=4)
    def a() -> None: ...

    @durably.step(f"{uid}.b", retry=RetryPolicy(max_attempts=4))
    def b() -> None: ...

    @durably.step(f"{uid}.c", retry=RetryPolicy(max_attempts=4), retries=4)
    def c() -> None: ...

    assert a.policy.max_attempts == b.policy.max_attempts == c.policy.max_attempts == 4


def test_retries_disagreeing_with_the_policy_is_refused_naming_both(uid: str) -> None:
    with pytest.raises(ValueError, match=r"retries=2 disagrees .* max_attempts=5"):

        @durably.step(f"{uid}.s", retry=RetryPolicy(max_attempts=5), retries=2)
        def s() -> None: ...

    with pytest.raises(ValueError, match=r"retries=2 and max_attempts=5 disagree"):
        RetryPolicy(max_attempts=5, retries=2)


def test_loose_keywords_fill_what_the_policy_left_out(uid: str) -> None:
    @durably.step(f"{uid}.s", retry=RetryPolicy(retry_on=Transient), retries=3, backoff_ms=50)
    def s() -> None: ...

    assert s.policy.max_attempts == 3
    assert s.policy.backoff_ms == 50
    assert s.policy.retry_on == (Transient,)
    with pytest.raises(ValueError, match=r"backoff_ms=50 disagrees .* backoff_ms=10"):

        @durably.step(f"{uid}.t", retry=RetryPolicy(backoff_ms=10), backoff_ms=50)
        def t() -> None: ...


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_attempts": 0}, ValueError, "max_attempts must be at least 1"),
        ({"max_attempts": 2.5}, TypeError, "whole number of attempts"),
        ({"max_attempts": True}, TypeError, "whole number of attempts"),
        ({"retries": -1}, ValueError, "retries .* must be >= 0"),
        ({"retry_on": "TimeoutError"}, TypeError, "exception classes, not names"),
        ({"retry_on": ("TimeoutError", ValueError)}, TypeError, "not names"),
        ({"dont_retry_on": int}, TypeError, "subclasses of Exception"),
        ({"retry_on": KeyboardInterrupt}, TypeError, "subclasses of Exception"),
        ({"retry_on": 3}, TypeError, "exception classes"),
        ({"retry_on": FatalError}, ValueError, "FatalError, which is never retried"),
        (
            {"retry_on": (ValueError, KeyError), "dont_retry_on": KeyError},
            ValueError,
            "KeyError in both retry_on and dont_retry_on",
        ),
        ({"jitter": "yes"}, TypeError, "jitter must be True or False"),
        ({"backoff_ms": -5}, ValueError, "invalid duration"),
        ({"backoff": "1s", "backoff_ms": 100}, ValueError, "give the base delay once"),
    ],
)
def test_a_bad_policy_is_refused_when_declared(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        RetryPolicy(**kwargs)


def test_retry_takes_only_a_policy(uid: str) -> None:
    with pytest.raises(TypeError, match=r"retry= takes a durably\.RetryPolicy"):

        @durably.step(f"{uid}.s", retry=3)  # type: ignore[arg-type]
        def s() -> None: ...


def test_the_policy_decides_by_exception_class() -> None:
    only = RetryPolicy(max_attempts=3, retry_on=(Transient,))
    assert only.retries_exception(Transient())
    assert only.retries_exception(Flaky())  # a subclass
    assert not only.retries_exception(ValueError())
    never = RetryPolicy(max_attempts=3, dont_retry_on=Flaky)
    assert never.retries_exception(Transient())
    assert not never.retries_exception(Flaky())
    assert not RetryPolicy(max_attempts=3).retries_exception(FatalError("no"))


# ------------------------------------------------------------------ in-process steps


async def test_retry_on_retries_only_its_classes(engine_factory: EngineFactory, uid: str) -> None:
    raised: list[type[Exception]] = [Flaky, Transient, ValueError]

    @durably.step(f"{uid}.s", retry=RetryPolicy(max_attempts=5, retry_on=Transient))
    def s() -> None:
        raise raised.pop(0)("attempt failed")

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, _: None) -> None:
        await ctx.step(s)

    async with engine_factory() as engine:
        failed = await _failed(engine, wf, f"{uid}-r")
        [cp] = await engine.list_checkpoints(f"{uid}-r")
    # Flaky and Transient were retried; ValueError (not in retry_on) failed at once.
    assert raised == []
    assert cp.status == "failed" and cp.attempts == 3
    assert failed.error.message == "attempt failed"
    assert cp.error is not None and cp.error.retryable is False
    assert [e.attempt for e in cp.attempt_errors or ()] == [1, 2, 3]
    assert [e.retryable for e in cp.attempt_errors or ()] == [None, None, False]


async def test_dont_retry_on_fails_at_once(engine_factory: EngineFactory, uid: str) -> None:
    raised: list[type[Exception]] = [Transient, Flaky]

    @durably.step(f"{uid}.s", retry=RetryPolicy(max_attempts=5, dont_retry_on=(Flaky,)))
    def s() -> None:
        raise raised.pop(0)("nope")

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, _: None) -> None:
        await ctx.step(s)

    async with engine_factory() as engine:
        await _failed(engine, wf, f"{uid}-r")
        [cp] = await engine.list_checkpoints(f"{uid}-r")
    assert raised == []
    assert cp.attempts == 2


async def test_fatal_error_is_never_retried(engine_factory: EngineFactory, uid: str) -> None:
    calls: list[int] = []

    @durably.step(f"{uid}.s", retry=RetryPolicy(max_attempts=5))
    def s() -> None:
        calls.append(1)
        raise FatalError("for good", code="bad")

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, _: None) -> None:
        await ctx.step(s)

    async with engine_factory() as engine:
        await _failed(engine, wf, f"{uid}-r")
        [cp] = await engine.list_checkpoints(f"{uid}-r")
    assert calls == [1]
    assert [(e.attempt, e.code, e.retryable) for e in cp.attempt_errors or ()] == [
        (1, "bad", False)
    ]


async def test_a_call_site_policy_changes_the_declared_one(
    engine_factory: EngineFactory, uid: str
) -> None:
    calls: list[int] = []

    @durably.step(f"{uid}.s", retry=RetryPolicy(max_attempts=5, retry_on=Transient))
    def s() -> None:
        calls.append(1)
        raise Transient(f"try {len(calls)}")

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, _: None) -> None:
        # The call changes max_attempts only; retry_on stays the declared one.
        await ctx.step(s, retry=RetryPolicy(max_attempts=2))

    @durably.workflow(f"{uid}.wf2")
    async def wf2(ctx: WorkflowCtx, _: None) -> None:
        # A call-site class rule, applied in this process.
        await ctx.step(s, retry=RetryPolicy(dont_retry_on=Transient))

    async with engine_factory() as engine:
        await _failed(engine, wf, f"{uid}-r")
        [cp] = await engine.list_checkpoints(f"{uid}-r")
        assert _attempts(cp) == [(1, "try 1"), (2, "try 2")]
        calls.clear()
        await _failed(engine, wf2, f"{uid}-r2")
        [cp2] = await engine.list_checkpoints(f"{uid}-r2")
    assert calls == [1]
    assert cp2.attempts == 1


async def test_a_call_site_conflict_is_refused_before_the_position_is_claimed(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.step(f"{uid}.s")
    def s() -> int:
        return 7

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, _: None) -> int:
        try:
            await ctx.step(s, retry=RetryPolicy(max_attempts=3), retries=2)
        except ValueError as exc:
            assert "retries=2 disagrees" in str(exc)
        return await ctx.step(s)

    async with engine_factory() as engine:
        assert await engine.execute(wf, None, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 7
        cps = await engine.list_checkpoints(f"{uid}-r")
    assert [cp.seq for cp in cps] == [0]


async def test_a_step_deadline_counts_as_a_timeout_error(
    engine_factory: EngineFactory, uid: str
) -> None:
    calls: list[str] = []

    async def slow(tag: str) -> None:
        calls.append(tag)
        await asyncio.sleep(30)  # cancelled by the step's own deadline

    @durably.step(f"{uid}.a", retry=RetryPolicy(max_attempts=3, retry_on=Transient))
    async def a() -> None:
        await slow("a")

    @durably.step(f"{uid}.b", retry=RetryPolicy(max_attempts=2, retry_on=TimeoutError))
    async def b() -> None:
        await slow("b")

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, which: str) -> None:
        await ctx.step(a if which == "a" else b, timeout="50ms")

    async with engine_factory() as engine:
        for which in ("a", "b"):
            with pytest.raises(RunFailedError):
                await engine.execute(wf, which, run_id=f"{uid}-{which}", timeout=RESULT_TIMEOUT)
    assert calls == ["a", "b", "b"]


async def test_a_step_fan_takes_a_policy(engine_factory: EngineFactory, uid: str) -> None:
    calls: dict[int, int] = {}

    @durably.step(f"{uid}.s")
    def s(x: int) -> int:
        calls[x] = calls.get(x, 0) + 1
        if calls[x] < 2:
            raise Transient(f"{x} once")
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, _: None) -> list[int]:
        return await ctx.all(s, [1, 2], retry=RetryPolicy(max_attempts=2, retry_on=Transient))

    async with engine_factory() as engine:
        assert await engine.execute(wf, None, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == [1, 2]
        cps = await engine.list_checkpoints(f"{uid}-r")
    assert {cp.seq: _attempts(cp) for cp in cps} == {0: [(1, "1 once")], 1: [(1, "2 once")]}


# ------------------------------------------------------------------ local steps


async def test_local_step_takes_a_policy_and_keeps_its_attempts(
    engine_factory: EngineFactory, uid: str
) -> None:
    tries: list[int] = []

    def flaky(log: Any) -> str:
        tries.append(1)
        if len(tries) < 3:
            raise Flaky(f"local {len(tries)}")
        return "ok"

    def wrong(log: Any) -> str:
        raise ValueError("not retried")

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, _: None) -> str:
        policy = RetryPolicy(max_attempts=4, retry_on=Transient)
        out = await ctx.local_step("flaky", flaky, retry=policy)
        try:
            await ctx.local_step("wrong", wrong, retry=policy)
        except durably.StepFailedError:
            pass
        return out

    async with engine_factory() as engine:
        assert await engine.execute(wf, None, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == "ok"
        first, second = await engine.list_checkpoints(f"{uid}-r")
    assert first.status == "completed" and first.attempts == 3
    assert _attempts(first) == [(1, "local 1"), (2, "local 2")]
    assert second.status == "failed" and second.attempts == 1
    assert _attempts(second) == [(1, "not retried")]


# ------------------------------------------------------------------ the history


async def test_every_attempt_of_a_retried_step_is_kept(
    engine_factory: EngineFactory, uid: str
) -> None:
    calls: list[int] = []

    @durably.step(f"{uid}.s", retries=4, backoff_ms=5)
    def s() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise Transient(f"down {len(calls)}")
        return "up"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, _: None) -> str:
        return await ctx.step(s)

    async with engine_factory() as engine:
        assert await engine.execute(wf, None, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == "up"
        [cp] = await engine.list_checkpoints(f"{uid}-r")
        detail = await engine.get_run_detail(f"{uid}-r")
    assert cp.status == "completed" and cp.attempts == 3
    assert _attempts(cp) == [(1, "down 1"), (2, "down 2")]
    errors = cp.attempt_errors or ()
    assert errors[0].at <= errors[1].at
    assert detail is not None
    step = detail.to_json()["timeline"][0]
    assert [e["message"] for e in step["attemptErrors"]] == ["down 1", "down 2"]
    assert set(step["attemptErrors"][0]) == {"attempt", "at", "message"}
    assert "attemptErrorsOmitted" not in step


async def test_the_history_of_a_long_retried_step_is_bounded(
    engine_factory: EngineFactory, uid: str
) -> None:
    total = ATTEMPT_ERRORS_FIRST + ATTEMPT_ERRORS_LAST + 15
    calls: list[int] = []

    @durably.step(f"{uid}.s", retries=total)
    def s() -> None:
        calls.append(1)
        raise Transient(f"#{len(calls)} " + "x" * ATTEMPT_MESSAGE_MAX)

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, _: None) -> None:
        await ctx.step(s)

    async with engine_factory() as engine:
        await _failed(engine, wf, f"{uid}-r")
        [cp] = await engine.list_checkpoints(f"{uid}-r")
    errors = cp.attempt_errors or ()
    assert len(calls) == total and cp.attempts == total
    kept = [e.attempt for e in errors]
    assert kept == [
        *range(1, ATTEMPT_ERRORS_FIRST + 1),
        *range(total - ATTEMPT_ERRORS_LAST + 1, total + 1),
    ]
    assert cp.attempt_errors_omitted == 15
    assert all(len(e.message) == ATTEMPT_MESSAGE_MAX for e in errors)
    assert errors[-1].message.startswith(f"#{total} ") and errors[-1].message.endswith("…")
    # The row's own error keeps the last failure in full.
    assert cp.error is not None and len(cp.error.message) > ATTEMPT_MESSAGE_MAX


async def test_a_requeue_appends_to_the_history(engine_factory: EngineFactory, uid: str) -> None:
    state = {"fail": True, "n": 0}

    @durably.step(f"{uid}.s", retries=1)
    def s() -> str:
        state["n"] += 1
        if state["fail"]:
            raise Transient(f"round {state['n']}")
        return "done"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, _: None) -> str:
        return await ctx.step(s)

    async with engine_factory() as engine:
        handle = await engine.start(wf, None, run_id=f"{uid}-r")
        with pytest.raises(RunFailedError):
            await handle.result(timeout=RESULT_TIMEOUT)
        await engine.retry(handle.run_id)
        with pytest.raises(RunFailedError):
            await handle.result(timeout=RESULT_TIMEOUT)
        state["fail"] = False
        await engine.retry(handle.run_id)
        assert await handle.result(timeout=RESULT_TIMEOUT) == "done"
        [cp] = await engine.list_checkpoints(handle.run_id)
    # Each round's attempt is numbered 1 again; nothing is overwritten.
    assert _attempts(cp) == [(1, "round 1"), (1, "round 2")]
    assert cp.status == "completed"
