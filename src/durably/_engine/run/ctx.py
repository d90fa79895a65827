"""`WorkflowCtx`: the primitives a workflow body calls.

Every primitive is a plain method that claims its checkpoint position(s) synchronously and
returns a coroutine (the position is claimed before the first await), so
`asyncio.gather(ctx.step(a, 1), ctx.step(b, 2))` numbers the calls in issue order no matter
which completes first.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, NoReturn, ParamSpec, TypeVar, overload

from durably._core.admission import QueueCall
from durably._core.durations import (
    Duration,
    to_ms,
    to_ms_or_none,
)
from durably._core.errors import (
    ContinueAsNew,
    FatalError,
    NestedWorkflowCallError,
    NonDeterminismError,
    SignalTimeoutError,
)
from durably._core.ids import given_run_id
from durably._core.log_context import durably_logger
from durably._core.models import (
    ChildWait,
    JSONValue,
    SignalWaiter,
    StepCheckpoint,
    ms_from_utc,
    replace,
)
from durably._core.triggers import refuse_reserved_event
from durably._engine.defs import unsupported
from durably._engine.defs.event_tokens import event_matches, event_token
from durably._engine.defs.registry import (
    BackoffKind,
    RetryPolicy,
    Step,
    Workflow,
    resolve_policy,
    validate_attributes,
)
from durably._engine.defs.typed_io import PLAIN, Args, ValueCodec
from durably._engine.defs.vocab import check_priority
from durably._engine.flow.queues import queue_call
from durably._engine.run import children, fans, saga
from durably._engine.run.execution import STEP_SCOPE, Execution
from durably._engine.run.fans import FanMode, Settled
from durably._engine.run.host import RunHost
from durably._engine.run.steps import run_local, run_step

I = TypeVar("I")
O = TypeVar("O")
P = ParamSpec("P")


class _ReplayAwareLogger(logging.LoggerAdapter[logging.Logger]):
    """`ctx.logger`: drops records while the body replays recorded history."""

    def __init__(self, logger: logging.Logger, execution: Execution):
        super().__init__(logger, {"run_id": execution.run_id})
        self._execution = execution

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if not self._execution.replaying:
            super().log(level, msg, *args, **kwargs)

    def isEnabledFor(self, level: int) -> bool:
        return not self._execution.replaying and super().isEnabledFor(level)


class WorkflowCtx:
    """What a workflow body receives. Deterministic: all outside work goes through it."""

    def __init__(self, execution: Execution):
        self._ex = execution
        self._host: RunHost = execution.host
        self.logger: logging.LoggerAdapter[logging.Logger] = _ReplayAwareLogger(
            durably_logger(f"durably.workflow.{execution.workflow.name}"), execution
        )

    # ------------------------------------------------------------------ identity

    @property
    def run_id(self) -> str:
        return self._ex.run_id

    @property
    def workflow(self) -> str:
        return self._ex.workflow.name

    @property
    def version(self) -> str:
        return self._ex.run.workflow_version

    @property
    def is_replaying(self) -> bool:
        return self._ex.replaying

    def _guard(self, primitive: str) -> None:
        scope = STEP_SCOPE.get()
        if scope is not None and scope[0] is self._ex:
            raise NestedWorkflowCallError(self._ex.run_id, primitive, scope[1])

    def _claim(self, primitive: str, count: int = 1) -> int:
        self._guard(primitive)
        return self._ex.claim(count)

    # ------------------------------------------------------------------ steps

    # The single-input forms (with option keywords) come first; then the forms with any
    # arguments, checked against the step's parameters (`P`), which cannot carry option
    # keywords next to `*args: P.args, **kwargs: P.kwargs`: those calls give options with
    # `step.options(...)`. The `[I]` in the first form keeps a step of several required
    # parameters out of it.
    @overload
    def step(
        self,
        step: Step[I, O, [I]],
        input: I,
        *,
        retry: RetryPolicy | None = ...,
        retries: int | None = ...,
        backoff: str | Duration | None = ...,
        backoff_ms: Duration | None = ...,
        backoff_max_ms: Duration | None = ...,
        jitter: bool | None = ...,
        timeout: Duration | None = ...,
        queue: str | None = ...,
        priority: int | None = ...,
        fairness_key: str | None = ...,
        compensate: Any = ...,
    ) -> Coroutine[Any, Any, O]: ...
    @overload
    def step(
        self,
        step: Step[None, O, []],
        input: None = ...,
        *,
        retry: RetryPolicy | None = ...,
        retries: int | None = ...,
        backoff: str | Duration | None = ...,
        backoff_ms: Duration | None = ...,
        backoff_max_ms: Duration | None = ...,
        jitter: bool | None = ...,
        timeout: Duration | None = ...,
        queue: str | None = ...,
        priority: int | None = ...,
        fairness_key: str | None = ...,
        compensate: Any = ...,
    ) -> Coroutine[Any, Any, O]: ...
    @overload
    def step(
        self,
        step: str,
        input: Any = ...,
        *,
        retry: RetryPolicy | None = ...,
        retries: int | None = ...,
        backoff: str | Duration | None = ...,
        backoff_ms: Duration | None = ...,
        backoff_max_ms: Duration | None = ...,
        jitter: bool | None = ...,
        timeout: Duration | None = ...,
        queue: str | None = ...,
        priority: int | None = ...,
        fairness_key: str | None = ...,
        compensate: Any = ...,
    ) -> Coroutine[Any, Any, Any]: ...
    @overload
    def step(self, step: str, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]: ...
    @overload
    def step(
        self, step: Step[Any, O, P], *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, O]: ...
    def step(
        self, step: Step[Any, Any, Any] | str, *args: Any, **kwargs: Any
    ) -> Coroutine[Any, Any, Any]:
        """Run a step through the engine's transport and checkpoint its result.

        `ctx.step(step, input)` passes one input; `ctx.step(step, a, b, c=1)` calls the step
        as `step(a, b, c=1)`. The option keywords (`retry`, `retries`, `backoff`, `backoff_ms`,
        `backoff_max_ms`, `jitter`, `timeout`, `queue`, `priority`, `fairness_key`,
        `compensate`) are reserved: given to `ctx.step` they are always its options, never
        the step's arguments, so a step parameter with one of those names is passed
        positionally; `input=` alone (no other argument) is the single input, as it always
        was. Options for a call with several arguments type-check only through
        `step.options(...)`: `ctx.step(charge.options(retries=3), order, rate, currency="EUR")`.
        One positional argument is stored exactly as a single input always was; several
        (or keyword) arguments as `{"$durably.args": [...], "$durably.kwargs": {...}}`, each in
        its parameter's JSON form (docs/steps-arguments.md). The arguments are checked
        against the step's parameters before the position is claimed (a TypeError).

        With `queue`, each attempt first waits for a slot of that flow-control queue
        (`durably.Queue`, registered on the engine) and holds it until its result is
        recorded; `priority` (higher first, default 0) and `fairness_key` (default: the run
        id) order the queue's waiters. Without a queue, `priority` is refused
        (NotImplementedError) and `fairness_key` is a ValueError; the checks come before the
        position is claimed, so a body that catches the error keeps its numbering.
        """
        options = _options_of(step, kwargs)
        input = _input_of(args, kwargs)
        return self._step(step, input, **options)

    def _step(
        self,
        step: Step[Any, Any, Any] | str,
        input: Any = None,
        *,
        retry: RetryPolicy | None = None,
        retries: int | None = None,
        backoff: str | Duration | None = None,
        backoff_ms: Duration | None = None,
        backoff_max_ms: Duration | None = None,
        jitter: bool | None = None,
        timeout: Duration | None = None,
        queue: str | None = None,
        priority: int | None = None,
        fairness_key: str | None = None,
        compensate: Any = None,
    ) -> Coroutine[Any, Any, Any]:
        admission = queue_call(queue, priority, fairness_key)
        self._guard("step")
        if isinstance(step, Step):
            definition: Step[Any, Any, Any] | None = step
            name = step.name
        elif isinstance(step, str):
            name = step
            definition = self._host.step_definition(name)
        else:
            raise TypeError(
                f"ctx.step() takes a @durably.step function or a step name, not {step!r}"
            )
        if definition is not None and isinstance(input, Args):
            definition.arg_codecs.check(input, f"ctx.step({name!r})", STEP_OPTIONS)
        elif definition is not None:
            definition.check_single_input(f"ctx.step({name!r})", STEP_OPTIONS)
        # The policy is checked before the position is claimed (like the queue options).
        policy = self._call_policy(
            f"ctx.step({name!r})",
            definition,
            retry,
            retries=retries,
            backoff=backoff,
            backoff_ms=backoff_ms,
            backoff_max_ms=backoff_max_ms,
            jitter=jitter,
        )
        seq = self._claim("step")
        timeout_ms = (
            to_ms(timeout)
            if timeout is not None
            else (definition.timeout_ms if definition is not None else None)
        )
        call = run_step(self._ex, seq, name, definition, input, policy, timeout_ms, queue=admission)
        if compensate is None:
            return call
        return saga.with_step_undo(self._ex, call, seq, name, compensate)

    def _call_policy(
        self,
        where: str,
        definition: Step[Any, Any] | None,
        retry: RetryPolicy | None,
        **loose: Any,
    ) -> RetryPolicy:
        """A remote step's policy at a call: the declared one, changed by the call's.

        Exception classes given at the call cannot reach a worker over a transport (the
        worker checks its own declaration of the step), so an engine with a transport
        refuses them rather than ignore them."""
        base = definition.policy if definition is not None else RetryPolicy()
        if (
            retry is not None
            and isinstance(retry, RetryPolicy)
            and retry.classifies
            and self._host.remote is not None
        ):
            raise ValueError(
                f"{where}: retry_on / dont_retry_on given at the call cannot apply to a step "
                "run by a worker over a transport (the exception is raised there); declare "
                "them on @durably.step(retry=RetryPolicy(...)), which the worker applies"
            )
        return resolve_policy(base, retry, where, **loose)

    def local_step(
        self,
        name: str,
        fn: Callable[..., Awaitable[O] | O],
        *,
        retry: RetryPolicy | None = None,
        retries: int | None = None,
        backoff: BackoffKind | None = None,
        backoff_ms: Duration | None = None,
        backoff_max_ms: Duration | None = None,
        jitter: bool | None = None,
        compensate: Any = None,
    ) -> Coroutine[Any, Any, O]:
        """A checkpointed step executed in this process; `fn(log)` gets its `StepContext`.
        `retry=RetryPolicy(...)` (or the loose keywords) retries it in memory; its
        `retry_on` / `dont_retry_on` classes are checked against what `fn` raised."""
        policy = resolve_policy(
            RetryPolicy(),
            retry,
            f"ctx.local_step({name!r})",
            retries=retries,
            backoff=backoff,
            backoff_ms=backoff_ms,
            backoff_max_ms=backoff_max_ms,
            jitter=jitter,
        )
        seq = self._claim("local_step")
        call = run_local(
            self._ex,
            seq,
            name,
            fn,
            pass_logger=True,
            policy=policy,
            track_start=self._host.options.track_step_start,
        )
        return (
            call if compensate is None else saga.with_local_undo(self._ex, call, name, compensate)
        )

    def side_effect(self, fn: Callable[[], Awaitable[O] | O]) -> Coroutine[Any, Any, O]:
        """Run `fn()` once and replay its recorded value."""
        seq = self._claim("side_effect")
        return run_local(
            self._ex,
            seq,
            "sideEffect",
            fn,
            pass_logger=False,
            policy=RetryPolicy(),
            track_start=False,
        )

    async def _now(self, seq: int) -> datetime:
        ms = await run_local(
            self._ex,
            seq,
            "now",
            self._host.clock,
            pass_logger=False,
            policy=RetryPolicy(),
            track_start=False,
        )
        return datetime.fromtimestamp(int(ms) / 1000.0, tz=UTC)

    def now(self) -> Coroutine[Any, Any, datetime]:
        """The recorded current time (aware UTC); the same value on every replay."""
        return self._now(self._claim("now"))

    # ------------------------------------------------------------------ timers

    def sleep(self, duration: Duration) -> Coroutine[Any, Any, None]:
        """A durable sleep: survives restarts; the deadline is computed once."""
        seq = self._claim("sleep")
        ms = to_ms(duration)
        return self._sleep(seq, lambda: self._ex.now() + ms)

    def sleep_until(self, when: datetime | int | float) -> Coroutine[Any, Any, None]:
        """Sleep until an aware datetime (or epoch seconds)."""
        seq = self._claim("sleep_until")
        deadline = ms_from_utc(when) if isinstance(when, datetime) else int(when * 1000)
        return self._sleep(seq, lambda: deadline)

    async def _sleep(self, seq: int, deadline_of: Callable[[], int]) -> None:
        ex = self._ex
        cp = ex.snapshot.get(seq)
        if cp is None:
            wake_at = deadline_of()
            await ex.save(ex.instant(seq, "sleep", "sleep", wake_at=wake_at))
        else:
            wake_at = cp.wake_at if cp.wake_at is not None else ex.now()
        await ex.wait(None, wake_at, frees_slot=True)

    # ------------------------------------------------------------------ signals

    def wait_for_signal(
        self, token: str, *, timeout: Duration | None = None
    ) -> Coroutine[Any, Any, Any]:
        """Wait for `engine.signal(token, payload)`; returns the payload."""
        timeout_ms = to_ms_or_none(timeout)
        if timeout_ms is None:
            seq = self._claim("wait_for_signal")
            return self._wait_token(seq, token, None, None, f"timeout:{token}")
        deadline_seq = self._claim("wait_for_signal", 2)
        return self._wait_token(
            deadline_seq + 1, token, timeout_ms, deadline_seq, f"timeout:{token}"
        )

    def on_update(self, name: str, *, timeout: Duration | None = None) -> Coroutine[Any, Any, Any]:
        """Wait for `engine.update(run_id, name, arg)`; returns the argument."""
        return self.wait_for_signal(f"update:{self.run_id}:{name}", timeout=timeout)

    async def _deadline(self, seq: int, name: str, timeout_ms: int) -> int:
        ex = self._ex
        cp = ex.snapshot.get(seq)
        if cp is not None and cp.wake_at is not None:
            return cp.wake_at
        deadline = ex.now() + timeout_ms
        await ex.save(ex.instant(seq, name, "sleep", wake_at=deadline))
        return deadline

    async def _wait_token(
        self,
        seq: int,
        token: str,
        timeout_ms: int | None,
        deadline_seq: int | None,
        deadline_name: str,
        timeout_token: str | None = None,
    ) -> Any:
        ex = self._ex
        store = self._ex.store
        deadline = None
        if timeout_ms is not None and deadline_seq is not None:
            deadline = await self._deadline(deadline_seq, deadline_name, timeout_ms)
        cp = ex.snapshot.get(seq)
        if cp is not None and cp.status == "completed":
            return cp.output
        waiter = SignalWaiter(token=token, run_id=ex.run_id, seq=seq)
        row = ex.instant(seq, f"signal:{token}", "signal")  # written with the take, atomically
        # A wait whose deadline has passed timed out (a replay of it, above all): a signal
        # buffered since belongs to a later wait on the token, and taking it here would
        # change what the run did.
        expired = deadline is not None and ex.now() >= deadline
        hit = None if expired else await store.take_buffered_signal_into(token, row)
        if hit is None and not expired:
            await store.put_signal_waiter(waiter)
            # Check, register, then check again: a signal buffered between the first
            # check and the waiter's insert would otherwise never be delivered.
            hit = await store.take_buffered_signal_into(token, row, waiting=True)
        if hit is not None:
            ex.snapshot[seq] = replace(row, output=hit.payload)
            return hit.payload
        done = await ex.wait(seq, deadline, frees_slot=True)
        if done is not None:
            return done.output
        # The deadline passed: remove only OUR waiter row, then take a last look in case a
        # delivery raced the deadline.
        await store.remove_signal_waiter(waiter)
        fresh = await store.get_checkpoint(ex.run_id, seq)
        if fresh is not None and fresh.status == "completed":
            ex.snapshot[seq] = fresh
            return fresh.output
        assert timeout_ms is not None
        raise SignalTimeoutError(timeout_token or token, timeout_ms)

    # ------------------------------------------------------------------ events

    def wait_for_event(
        self,
        name: str,
        *,
        match: Mapping[str, Any] | None = None,
        timeout: Duration | None = None,
    ) -> Coroutine[Any, Any, Any]:
        """Wait for `engine.publish_event(name, payload)` whose payload matches."""
        refuse_reserved_event(name)  # before the position is claimed
        timeout_ms = to_ms_or_none(timeout)
        if timeout_ms is None:
            seq = self._claim("wait_for_event")
            deadline_seq = None
        else:
            deadline_seq = self._claim("wait_for_event", 2)
            seq = deadline_seq + 1
        return self._wait_event(seq, name, dict(match or {}), timeout_ms, deadline_seq)

    async def _wait_event(
        self,
        seq: int,
        name: str,
        match: dict[str, Any],
        timeout_ms: int | None,
        deadline_seq: int | None,
    ) -> Any:
        ex = self._ex
        store = self._ex.store
        deadline = None
        if timeout_ms is not None and deadline_seq is not None:
            deadline = await self._deadline(deadline_seq, f"timeout:event:{name}", timeout_ms)
        cp = ex.snapshot.get(seq)
        if cp is not None and cp.status == "completed":
            return cp.output
        token = event_token(name, match, ex.run_id, seq)
        waiter = SignalWaiter(token=token, run_id=ex.run_id, seq=seq)
        if deadline is not None and ex.now() >= deadline:
            # Timed out (a replay, above all): neither a new waiter nor an event published
            # since, which belongs to a later wait (as for a signal wait).
            return await self._finish_wait(
                seq, token, waiter, deadline, timeout_ms, f"event:{name}"
            )
        await store.put_signal_waiter(waiter)  # register FIRST, then scan the buffer
        row = ex.instant(seq, f"signal:{token}", "signal")
        options = self._host.options
        expired_by = ex.now() - options.signal_buffer_ttl_ms  # published then or earlier
        for event in await store.list_buffered_events(name, options.event_scan_limit):
            if event.published_at <= expired_by:
                continue  # expired (the sweep deletes it): never delivered
            # The event leaves the buffer in the transaction that writes the checkpoint
            # holding it (and removes our waiter): a crash between two statements lost it.
            if event_matches(event.payload, match) and await store.take_buffered_event_into(
                event.id, token, row
            ):
                ex.snapshot[seq] = replace(row, output=event.payload)
                return event.payload
        return await self._finish_wait(seq, token, waiter, deadline, timeout_ms, f"event:{name}")

    async def _finish_wait(
        self,
        seq: int,
        token: str,
        waiter: SignalWaiter,
        deadline: int | None,
        timeout_ms: int | None,
        timeout_token: str,
    ) -> Any:
        ex = self._ex
        done = await ex.wait(seq, deadline, frees_slot=True)
        if done is not None:
            return done.output
        await self._ex.store.remove_signal_waiter(waiter)
        fresh = await self._ex.store.get_checkpoint(ex.run_id, seq)
        if fresh is not None and fresh.status == "completed":
            ex.snapshot[seq] = fresh
            return fresh.output
        assert timeout_ms is not None
        raise SignalTimeoutError(timeout_token, timeout_ms)

    def set_event(self, key: str, value: JSONValue) -> Coroutine[Any, Any, None]:
        """Publish a value readable with `engine.get_event(run_id, key)`."""
        seq = self._claim("set_event")
        return self._set_event(seq, key, PLAIN.to_json(value))

    async def _set_event(self, seq: int, key: str, value: JSONValue) -> None:
        ex = self._ex
        name = f"event:{key}"
        cp = ex.snapshot.get(seq)
        ex.expect_name(seq, cp, name)
        if cp is not None and cp.status == "completed":
            return
        await ex.save(ex.instant(seq, name, "local", output=value))

    # ------------------------------------------------------------------ children

    def child(
        self,
        workflow: Workflow[I, O] | str,
        input: Any = None,
        *,
        id: str | None = None,
        version: str | None = None,
        priority: int | None = None,
    ) -> Coroutine[Any, Any, O]:
        """Start a child workflow and wait for its output; FatalError if it failed.

        The child run carries `priority`, else this run's (higher is picked up first)."""
        check_priority(priority, "ctx.child")  # before the position is claimed
        seq = self._claim("child")
        return self._child(seq, workflow, input, id, version, priority)

    async def _child(
        self,
        seq: int,
        workflow: Workflow[Any, Any] | str,
        input: Any,
        child_id: str | None,
        version: str | None,
        priority: int | None,
    ) -> Any:
        ex = self._ex
        store = self._ex.store
        child_id = given_run_id(child_id, what="child run id") or f"{ex.run_id}.child.{seq}"
        codec = workflow.output_codec if isinstance(workflow, Workflow) else PLAIN
        token = f"child:{child_id}"
        name = f"signal:{token}"
        cp = ex.snapshot.get(seq)
        if cp is not None and cp.status == "completed":
            return _unwrap(child_id, cp.output, codec)
        waiter = SignalWaiter(token=token, run_id=ex.run_id, seq=seq)
        # Waiter and `running` placeholder in one transaction, the placeholder only where no
        # row exists: a completion delivered right after the waiter is in place can never be
        # overwritten by the placeholder (found by tests/run/test_fan_rules.py).
        placeholder = ex.instant(seq, name, "signal", status="running") if cp is None else None
        await children.register_waits(store, [ChildWait(waiter, placeholder)])
        if placeholder is not None:
            ex.snapshot.setdefault(seq, placeholder)
        # Lost-wake guard: the child may have completed before our waiter existed.
        row = ex.instant(seq, name, "signal")
        hit = await store.take_buffered_signal_into(token, row, waiting=True)
        if hit is not None:
            ex.snapshot[seq] = replace(row, output=hit.payload)
            return _unwrap(child_id, hit.payload, codec)
        if cp is not None:
            # A replay: the child may have finished while its announcement was lost.
            for recovered in await children.recover_completions(ex, {child_id: seq}):
                return _unwrap(child_id, recovered.output, codec)
        if cp is None and not children.adoptable(await store.get_run(child_id), workflow, ex.run):
            child_priority = priority if priority is not None else ex.run.priority
            self._host.start_child_soon(workflow, input, child_id, ex.run, version, child_priority)
        done = await ex.wait(seq, None, frees_slot=True)
        assert done is not None
        return _unwrap(child_id, done.output, codec)

    def start_child(
        self,
        workflow: Workflow[Any, Any] | str,
        input: Any = None,
        *,
        id: str | None = None,
        version: str | None = None,
        priority: int | None = None,
    ) -> Coroutine[Any, Any, str]:
        """Start a child fire-and-forget; returns its run id (join later with `child`).

        The child run carries `priority`, else this run's (higher is picked up first)."""
        check_priority(priority, "ctx.start_child")  # before the position is claimed
        seq = self._claim("start_child")
        return self._start_child(seq, workflow, input, id, version, priority)

    async def _start_child(
        self,
        seq: int,
        workflow: Workflow[Any, Any] | str,
        input: Any,
        child_id: str | None,
        version: str | None,
        priority: int | None,
    ) -> str:
        ex = self._ex
        cp = ex.snapshot.get(seq)
        if cp is not None and cp.status == "completed":
            return str(cp.output)
        child_id = given_run_id(child_id, what="child run id") or f"{ex.run_id}.child.{seq}"
        if not children.adoptable(await self._ex.store.get_run(child_id), workflow, ex.run):
            child_priority = priority if priority is not None else ex.run.priority
            self._host.start_child_soon(workflow, input, child_id, ex.run, version, child_priority)
        await ex.save(ex.instant(seq, f"spawn:{child_id}", "local", output=child_id))
        return child_id

    def all(
        self,
        target: Workflow[Any, O] | Step[Any, O] | str,
        inputs: Iterable[Any],
        *,
        mode: FanMode = "wait_all",
        concurrency: int | None = None,
        **step_opts: Any,
    ) -> Coroutine[Any, Any, list[O]]:
        """Fan out one workflow or step over `inputs`; outputs in input order.

        A `durably.Args(*args, **kwargs)` item calls a step with those arguments; any other
        item (a tuple too) is one input."""
        if mode not in ("wait_all", "fail_fast"):
            raise ValueError(f'ctx.all: mode must be "wait_all" or "fail_fast", not {mode!r}')
        return self._fan("all", target, list(inputs), mode, concurrency, step_opts, False)

    def all_settled(
        self,
        target: Workflow[Any, O] | Step[Any, O] | str,
        inputs: Iterable[Any],
        *,
        concurrency: int | None = None,
        **step_opts: Any,
    ) -> Coroutine[Any, Any, list[Settled[O]]]:
        """Like `all` in wait_all mode, but returns `Fulfilled`/`Rejected` items."""
        return self._fan(
            "all_settled", target, list(inputs), "wait_all", concurrency, step_opts, True
        )

    def _fan(
        self,
        primitive: str,
        target: Workflow[Any, Any] | Step[Any, Any] | str,
        inputs: list[Any],
        mode: FanMode,
        concurrency: int | None,
        step_opts: dict[str, Any],
        settled: bool,
    ) -> Coroutine[Any, Any, Any]:
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"ctx.{primitive}: concurrency must be >= 1, not {concurrency}")
        is_step = isinstance(target, Step) or (
            # Decision: a name is a workflow fan when a workflow is
            # registered under it, else a step fan by step name.
            isinstance(target, str) and self._host.registration(target) is None
        )
        if not isinstance(target, Workflow | Step | str):
            raise TypeError(f"ctx.{primitive}() takes a workflow or a step, not {target!r}")
        if is_step:
            step_opts = _fan_options_of(primitive, target, step_opts)
        member_step = None if isinstance(target, Workflow) or not is_step else target
        _check_fan_items(primitive, member_step, self._host, inputs)
        # A workflow fan takes mode, concurrency and `priority` (its member runs'; by default
        # the parent's), no step options.
        fan_priority = step_opts.pop("priority", None) if not is_step else None
        if not is_step and step_opts:
            raise TypeError(f"ctx.{primitive}: step options {sorted(step_opts)} on a workflow fan")
        unknown = sorted(set(step_opts) - _STEP_FAN_OPTIONS)
        if unknown:
            raise TypeError(f"ctx.{primitive}: unsupported step fan options {unknown}")
        check_priority(fan_priority, f"ctx.{primitive}")
        admission = None
        policy: RetryPolicy | None = None
        if is_step:
            definition = (
                target if isinstance(target, Step) else self._host.step_definition(str(target))
            )
            label = target.name if isinstance(target, Step) else target
            policy = self._call_policy(
                f"ctx.{primitive}({label!r})",
                definition,
                step_opts.pop("retry", None),
                **{k: step_opts.pop(k, None) for k in _POLICY_OPTIONS},
            )
            # Each member waits for a slot of `queue`, as `ctx.step(queue=...)` does; outside a
            # queue a step's priority orders nothing, so it is refused.
            queue = step_opts.pop("queue", None)
            priority = step_opts.pop("priority", None)
            fairness_key = step_opts.pop("fairness_key", None)
            if queue is None:
                unsupported.refuse_priority(priority, f"ctx.{primitive}")
            admission = queue_call(queue, priority, fairness_key)
        self._guard(primitive)
        if not inputs:
            return _empty()  # [] with no seqs claimed, no side effects
        first = self._claim(primitive, len(inputs))  # N contiguous seqs, synchronously
        if is_step:
            assert not isinstance(target, Workflow) and policy is not None
            return _step_fan(
                self._ex,
                self._host,
                target,
                inputs,
                first,
                mode,
                concurrency,
                policy,
                settled,
                admission,
            )
        assert not isinstance(target, Step)
        return fans.workflow_fan(
            self._ex,
            target,
            inputs,
            first,
            mode=mode,
            concurrency=concurrency,
            settled=settled,
            priority=fan_priority,
        )

    # ------------------------------------------------------------------ operator hooks

    def breakpoint(self, label: str | None = None) -> Coroutine[Any, Any, None]:
        """Pause until an operator calls `engine.continue_run(run_id)`."""
        seq = self._claim("breakpoint")
        return self._breakpoint(seq, label)

    async def _breakpoint(self, seq: int, label: str | None) -> None:
        ex = self._ex
        cp = ex.snapshot.get(seq)
        if cp is not None and cp.status == "completed":
            return
        if cp is None:
            name = "breakpoint" if label is None else f"breakpoint:{label}"
            await ex.save(ex.instant(seq, name, "signal", status="pending"))
        await self._ex.store.put_signal_waiter(
            SignalWaiter(token=f"bp:{ex.run_id}:{seq}", run_id=ex.run_id, seq=seq)
        )
        await ex.wait(seq, None, frees_slot=True)

    def patched(self, patch_id: str) -> Coroutine[Any, Any, bool]:
        """True for runs that reach this point on new code, False for older runs."""
        seq = self._claim("patched")
        ex = self._ex
        name = f"patch:{patch_id}"
        cp = ex.snapshot.get(seq)
        if cp is not None:
            if cp.name == name:
                return _value(True)
            if cp.name.startswith("patch:"):
                raise NonDeterminismError(ex.run_id, seq, name, cp.name)
            ex.position -= 1  # an old run: the marker is transparent
            return _value(False)
        return self._write_patch(seq, name)

    async def _write_patch(self, seq: int, name: str) -> bool:
        await self._ex.save(self._ex.instant(seq, name, "local", output=True))
        return True

    def continue_as_new(self, input: Any = None) -> NoReturn:
        """Complete this run and start a fresh one (`<id>~1`) with `input`."""
        self._guard("continue_as_new")
        children.check_continuation_id(self._ex.run_id)  # refuse here, not after completing
        raise ContinueAsNew(self._ex.workflow.input_codec.to_json(input))

    def upsert_search_attributes(
        self, attrs: Mapping[str, str | int | float | bool]
    ) -> Coroutine[Any, Any, None]:
        """Merge typed, queryable attributes into the run."""
        seq = self._claim("upsert_search_attributes")
        return self._upsert(seq, dict(attrs))

    async def _upsert(self, seq: int, attrs: dict[str, Any]) -> None:
        ex = self._ex
        cp = ex.snapshot.get(seq)
        ex.expect_name(seq, cp, "searchAttributes")
        if cp is not None:
            return
        merged = {**(ex.run.search_attributes or {}), **attrs}
        validate_attributes(ex.workflow, merged)
        await self._ex.store.update_run(ex.run_id, {"search_attributes": merged})
        ex.run = replace(ex.run, search_attributes=merged)
        await ex.save(ex.instant(seq, "searchAttributes", "local", output=attrs))


# The keywords `ctx.step` keeps for itself: never passed on to the step (see `ctx.step`).
STEP_OPTIONS = (
    "retry",
    "retries",
    "backoff",
    "backoff_ms",
    "backoff_max_ms",
    "jitter",
    "timeout",
    "queue",
    "priority",
    "fairness_key",
    "compensate",
)


_OPTION_NAMES = frozenset(STEP_OPTIONS)
_NO_OPTIONS: dict[str, Any] = {}


def _options_of(step: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take `ctx.step`'s option keywords out of `kwargs`, joined with those the step carries
    from `.options(...)`; an option given both ways is a TypeError. (Read-only result: it is
    only ever unpacked into `_step`.)"""
    attached: dict[str, Any] = step.call_options if isinstance(step, Step) else _NO_OPTIONS
    if not kwargs:
        return attached
    given = {k: kwargs.pop(k) for k in [k for k in kwargs if k in _OPTION_NAMES]}
    if not attached:
        return given
    both = sorted(k for k, v in given.items() if k in attached and v is not None)
    if both:
        raise TypeError(
            f"ctx.step: option {', '.join(both)} given both to ctx.step and to "
            f"{step.name!r}.options(...); give it once"
        )
    return {**attached, **{k: v for k, v in given.items() if v is not None}}


def _input_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A call's arguments as the step's input: nothing is None, one positional argument (or
    `input=` alone, the keyword of the single-input form) is that value as it always was, and
    anything else is `Args` (several arguments, stored in their own form)."""
    if not kwargs:
        return args[0] if len(args) == 1 else (None if not args else Args(*args))
    if not args and len(kwargs) == 1 and "input" in kwargs:
        return kwargs["input"]
    return Args(*args, **kwargs)


# Step fan options: the step dispatch options minus timeout. A step's `priority` orders the
# waiters of its `queue` and is refused without one (unsupported.PRIORITY); a workflow fan's
# `priority` is its member runs' and is taken before this check.
_POLICY_OPTIONS = ("retries", "backoff", "backoff_ms", "backoff_max_ms", "jitter")
_STEP_FAN_OPTIONS = frozenset(
    {
        "retry",
        "retries",
        "backoff",
        "backoff_ms",
        "backoff_max_ms",
        "jitter",
        "priority",
        "queue",
        "fairness_key",
    }
)


def _fan_options_of(primitive: str, target: Any, opts: dict[str, Any]) -> dict[str, Any]:
    """A step fan's options joined with those its step carries from `.options(...)`."""
    attached: dict[str, Any] = target.call_options if isinstance(target, Step) else {}
    both = sorted(k for k, v in opts.items() if k in attached and v is not None)
    if both:
        raise TypeError(
            f"ctx.{primitive}: option {', '.join(both)} given both to ctx.{primitive} and to "
            f"{target.name!r}.options(...); give it once"
        )
    return {**attached, **opts}


def _check_fan_items(
    primitive: str, step: Step[Any, Any, Any] | str | None, host: RunHost, inputs: list[Any]
) -> None:
    """`durably.Args` items call a step with several arguments: checked against the step's
    parameters before any position is claimed; a workflow takes one input, so there they
    are refused."""
    calls = [(i, item) for i, item in enumerate(inputs) if isinstance(item, Args)]
    if step is not None and len(calls) < len(inputs):
        definition = step if isinstance(step, Step) else host.step_definition(step)
        if definition is not None:  # the other items are single inputs
            definition.check_single_input(f"ctx.{primitive}({definition.name!r})")
    if not calls:
        return
    if step is None:
        raise TypeError(
            f"ctx.{primitive}: durably.Args items (item {calls[0][0]}) call a step with "
            "several arguments; a workflow takes one input"
        )
    definition = step if isinstance(step, Step) else host.step_definition(step)
    if definition is None:
        return  # a step served elsewhere: its worker checks the arguments
    for i, item in calls:
        definition.arg_codecs.check(item, f"ctx.{primitive}({definition.name!r}) item {i}")


async def _empty() -> list[Any]:
    return []


def _step_fan(
    ex: Execution,
    host: RunHost,
    step: Step[Any, Any] | str,
    inputs: list[Any],
    first: int,
    mode: FanMode,
    concurrency: int | None,
    policy: RetryPolicy,
    settled: bool,
    queue: QueueCall | None,
) -> Coroutine[Any, Any, list[Any]]:
    definition = step if isinstance(step, Step) else host.step_definition(step)
    name = step.name if isinstance(step, Step) else step
    return fans.step_fan(
        ex,
        name,
        definition,
        inputs,
        first,
        policy,
        mode=mode,
        concurrency=concurrency,
        settled=settled,
        queue=queue,
    )


def _unwrap(child_id: str, completion: Any, codec: ValueCodec) -> Any:
    """A child's Completion as the child's output; FatalError (with the child's code and
    details) when it failed."""
    if isinstance(completion, dict) and completion.get("ok") is True:
        value = completion.get("value")
        # a child that continued-as-new resolves None at that run
        return None if value is None else codec.from_json(value)
    error = completion.get("error") if isinstance(completion, dict) else completion
    code = completion.get("code") if isinstance(completion, dict) else None
    details = completion.get("details") if isinstance(completion, dict) else None
    raise FatalError(f'child "{child_id}" failed: {error}', code=code, details=details)


async def _value(value: bool) -> bool:
    return value


_ = StepCheckpoint  # re-exported type used in annotations elsewhere
