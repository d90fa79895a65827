"""The in-process transport: steps run in the engine's own process.

`Engine(transport=None)` uses it. Remote transports (Redis/BullMQ, SQL tables) that hand
steps to `durable-worker` processes would plug in at this seam.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from durably._core.errors import SerializationError, error_of
from durably._core.models import JSONValue, StepError, replace
from durably._engine.defs.registry import RetryPolicy, Step
from durably._engine.defs.typed_io import (
    ArgumentValidationError,
    ValueCodec,
    is_args_envelope,
)
from durably._engine.run.execution import AMBIENT_CTX, STEP_SCOPE, Execution

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor


class InProcessTransport:
    """Executes step handlers registered on this engine, in this process."""

    name = "in-process"

    def __init__(self, executor: Callable[[], ThreadPoolExecutor]):
        # The pool exists only while the engine is open, hence a getter.
        self._executor = executor

    async def execute(
        self,
        execution: Execution,
        step: Step[Any, Any] | None,
        name: str,
        json_input: JSONValue,
        in_codec: ValueCodec,
        timeout_ms: int | None,
        *,
        policy: RetryPolicy | None = None,
    ) -> tuple[JSONValue, StepError | None]:
        """Run a step handler in this process; (output JSON, None) or (None, error).
        With `policy`, a failure its `retry_on` / `dont_retry_on` rule out is not retryable.

        Async handlers run on the loop; sync handlers on the engine's own thread pool,
        never the loop's default executor. Handlers run outside the ambient workflow ctx
        (a workflow started in a step is a top-level run), inside the nested-call guard scope.
        """
        if step is None:
            return None, StepError(message=f"no handler for {name}", retryable=False)
        scope = STEP_SCOPE.set((execution, name))
        ambient = AMBIENT_CTX.set(None)
        try:
            return await run_handler(
                step, name, json_input, in_codec, timeout_ms, self._executor(), policy=policy
            )
        finally:
            AMBIENT_CTX.reset(ambient)
            STEP_SCOPE.reset(scope)


async def run_handler(
    step: Step[Any, Any],
    name: str,
    json_input: JSONValue,
    in_codec: ValueCodec,
    timeout_ms: int | None,
    executor: ThreadPoolExecutor,
    *,
    policy: RetryPolicy | None = None,
) -> tuple[JSONValue, StepError | None]:
    """Run a step's handler on its JSON input; (output JSON, None) or (None, error). Never
    raises for the handler's own failures: they become the error (a `FatalError` keeps its
    code and details and is not retryable). Shared by the in-process transport and by a
    process serving steps over a remote transport. `policy` (default: the step's declared
    one) classifies the exception: one its `retry_on` / `dont_retry_on` rule out is
    reported `retryable: false`, which the engine never retries."""
    rules = step.policy if policy is None else policy
    try:
        # A call with several (or keyword) arguments is stored as one JSON object of them
        # (typed_io.ARGS_KEY); anything else is the single input, as before.
        if is_args_envelope(json_input):
            assert isinstance(json_input, dict)
            arguments = step.arg_codecs.from_json(json_input)
            try:
                step.arg_codecs.check(arguments, f'step "{name}"')
            except TypeError as exc:  # the same arguments would fail every attempt
                return None, StepError(message=str(exc), code="invalid_arguments", retryable=False)
            call: Callable[[], Any] = functools.partial(step.invoke_args, arguments)
        else:
            call = functools.partial(step.invoke, in_codec.from_json(json_input))
        if step.is_async:
            awaitable: Any = call()
        else:
            context = contextvars.copy_context()
            awaitable = asyncio.get_running_loop().run_in_executor(executor, context.run, call)
        if timeout_ms is None:
            result = await awaitable
        else:
            try:
                async with asyncio.timeout(timeout_ms / 1000.0) as window:
                    result = await awaitable
            except TimeoutError:
                if not window.expired():
                    raise  # the step's own TimeoutError, not our deadline
                return None, StepError(
                    message=f'step "{name}" timed out after {timeout_ms}ms',
                    code="timeout",
                    # The step's own deadline counts as a TimeoutError for the policy.
                    retryable=rules.retries_exception(TimeoutError()),
                )
        return step.output_codec.to_json(result), None
    except SerializationError as exc:
        return None, StepError(
            message=f'step "{name}" returned a value that cannot be stored: {exc}',
            code="serialization",
            retryable=False,
        )
    except (ValidationError, ArgumentValidationError) as exc:
        return None, StepError(message=f'step "{name}": {exc}', code="validation", retryable=False)
    except Exception as exc:
        error = error_of(exc)
        if error.retryable is not False and not rules.retries_exception(exc):
            error = replace(error, retryable=False)
        return None, error
