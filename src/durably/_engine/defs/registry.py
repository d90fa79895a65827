"""`@durably.step` / `@durably.workflow` and the registry."""

from __future__ import annotations

import copy
import difflib
import inspect
import random
import re
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, Generic, Literal, Self, TypeVar, overload

# A ParamSpec with a default (`...`, any arguments) keeps `Step[I, O]` a complete spelling.
from typing_extensions import ParamSpec

from durably._core.durations import (
    Duration,
    ms_keyword,
    ms_keyword_or_none,
    to_ms,
    to_ms_or_none,
)
from durably._core.errors import FatalError
from durably._core.models import StepError
from durably._core.quota import Concurrency, Singleton
from durably._core.triggers import (
    Accumulation,
    Batch,
    Debounce,
    EventTrigger,
    accumulation,
    event_triggers,
    is_engine_owned_workflow,
)
from durably._engine.defs.step_context import StepContext, step_context_param, with_step_context
from durably._engine.defs.typed_io import (
    PLAIN,
    PLAIN_ARGS,
    ArgCodecs,
    Args,
    codecs_for,
    refuse_reserved_keys,
    refuse_unbindable,
    signature_of,
)

if TYPE_CHECKING:
    from durably._engine.run.ctx import WorkflowCtx

I = TypeVar("I")
O = TypeVar("O")
P = ParamSpec("P", default=...)
Q = ParamSpec("Q")

BackoffKind = Literal["fixed", "exponential", "exp"]


ExceptionTypes = type[Exception] | Iterable[type[Exception]]

_POLICY_FIELDS = (
    "max_attempts",
    "backoff",
    "backoff_ms",
    "backoff_max_ms",
    "jitter",
    "retry_on",
    "dont_retry_on",
)


@dataclass(frozen=True, slots=True, init=False)
class RetryPolicy:
    """How a step is retried: `@durably.step("charge", retry=RetryPolicy(max_attempts=5,
    backoff="exponential", backoff_ms=200, retry_on=(ConnectionError,)))`.

    - `max_attempts`: the MAXIMUM NUMBER OF ATTEMPTS, the first one included (1 = a single
      try). `retries=` is an alias of it (`retries=3` is three attempts, not four; the
      legacy `retries=0` is one attempt); giving both with different values is an error.
    - `backoff`: `"fixed"` or `"exponential"` (doubling per attempt), or the base delay as a
      duration; `backoff_ms`: the base delay (a bare number is milliseconds; 0 = retry at
      once); `backoff_max_ms` caps a delay; `jitter` scales each delay by a random factor
      in [0.5, 1.0].
    - `retry_on`: only failures raising one of these exception classes (or a subclass)
      are retried, any other fails at once; `dont_retry_on`: these fail at once. A
      `FatalError` (or an error marked `retryable: false`) is never retried.

    The exception classes are checked in the process that runs the step's handler, where
    the exception is a Python object: this process, or a durably worker serving the step
    over a transport (which applies its own declaration of the step and reports the failure
    as not retryable). Classes only, never names: a name could not tell a subclass.

    A policy remembers which fields were given (`given`): a policy given at a call site
    changes only those fields of the step's declared policy.
    """

    max_attempts: int
    backoff: BackoffKind
    backoff_ms: int
    backoff_max_ms: int | None
    jitter: bool
    retry_on: tuple[type[Exception], ...]
    dont_retry_on: tuple[type[Exception], ...]
    given: frozenset[str] = field(init=False, compare=False, repr=False)

    def __init__(
        self,
        max_attempts: int | None = None,
        *,
        retries: int | None = None,
        backoff: str | Duration | None = None,
        backoff_ms: Duration | None = None,
        backoff_max_ms: Duration | None = None,
        jitter: bool | None = None,
        retry_on: ExceptionTypes | None = None,
        dont_retry_on: ExceptionTypes | None = None,
    ) -> None:
        attempts = _attempts_from(max_attempts, retries, "RetryPolicy")
        kind, base = _policy_backoff(backoff, backoff_ms, "RetryPolicy")
        values: dict[str, Any] = {
            "max_attempts": attempts,
            "backoff": kind,
            "backoff_ms": base,
            "backoff_max_ms": ms_keyword_or_none(backoff_max_ms),
            "jitter": _jitter(jitter, "RetryPolicy"),
            "retry_on": _exception_types(retry_on, "retry_on", "RetryPolicy"),
            "dont_retry_on": _exception_types(dont_retry_on, "dont_retry_on", "RetryPolicy"),
        }
        _check_classes(values["retry_on"], values["dont_retry_on"], "RetryPolicy")
        given = frozenset(k for k, v in values.items() if v is not None)
        defaults = _DEFAULTS
        for key in _POLICY_FIELDS:
            object.__setattr__(self, key, defaults[key] if values[key] is None else values[key])
        object.__setattr__(self, "given", given)

    @property
    def retries(self) -> int:
        """Alias of `max_attempts` (the number of attempts, not of re-tries)."""
        return self.max_attempts

    @property
    def classifies(self) -> bool:
        """Whether the policy looks at the exception's class (`retry_on`/`dont_retry_on`)."""
        return bool(self.retry_on or self.dont_retry_on)

    def retries_exception(self, exc: BaseException) -> bool:
        """Whether a failure raising `exc` may be retried (the attempt count aside)."""
        if isinstance(exc, FatalError) or getattr(exc, "retryable", None) is False:
            return False
        if self.dont_retry_on and isinstance(exc, self.dont_retry_on):
            return False
        return not self.retry_on or isinstance(exc, self.retry_on)

    def delay_ms(self, attempt: int) -> int:
        """The delay after attempt `attempt` failed."""
        base = self.backoff_ms or 0
        if base <= 0:
            return 0
        raw = base * 2 ** (attempt - 1) if self.backoff in ("exponential", "exp") else base
        capped = min(raw, self.backoff_max_ms) if self.backoff_max_ms is not None else raw
        if self.jitter:
            return round(capped * (0.5 + random.random() * 0.5))
        return int(capped)

    def merged(self, other: RetryPolicy) -> RetryPolicy:
        """This policy with the fields `other` was given replaced by `other`'s."""
        values = {k: getattr(other if k in other.given else self, k) for k in _POLICY_FIELDS}
        return _policy_of(values, self.given | other.given)

    def overlay(
        self,
        *,
        retries: int | None = None,
        backoff: BackoffKind | None = None,
        backoff_ms: int | None = None,
        backoff_max_ms: int | None = None,
        jitter: bool | None = None,
    ) -> RetryPolicy:
        """This policy with the loose keywords that were given (not None) replacing it."""
        loose = {
            "max_attempts": None if retries is None else _attempts_from(None, retries, "retries"),
            "backoff": backoff,
            "backoff_ms": backoff_ms,
            "backoff_max_ms": backoff_max_ms,
            "jitter": jitter,
        }
        values = {k: getattr(self, k) for k in _POLICY_FIELDS}
        values.update({k: v for k, v in loose.items() if v is not None})
        return _policy_of(values, self.given | {k for k, v in loose.items() if v is not None})


def _policy_of(values: dict[str, Any], given: frozenset[str] | set[str]) -> RetryPolicy:
    policy = object.__new__(RetryPolicy)
    for key in _POLICY_FIELDS:
        object.__setattr__(policy, key, values[key])
    object.__setattr__(policy, "given", frozenset(given))
    return policy


_DEFAULTS: dict[str, Any] = {
    "max_attempts": 1,
    "backoff": "fixed",
    "backoff_ms": 0,
    "backoff_max_ms": None,
    "jitter": False,
    "retry_on": (),
    "dont_retry_on": (),
}


def _attempts_from(max_attempts: Any, retries: Any, where: str) -> int | None:
    """`max_attempts` / its alias `retries` as one number of attempts (None: neither)."""
    for key, value in (("max_attempts", max_attempts), ("retries", retries)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise TypeError(f"{where}: {key} must be a whole number of attempts, not {value!r}")
    if max_attempts is not None and max_attempts < 1:
        raise ValueError(
            f"{where}: max_attempts must be at least 1 (the first attempt counts), "
            f"got {max_attempts}"
        )
    if retries is not None and retries < 0:
        raise ValueError(f"{where}: retries (the number of attempts) must be >= 0, got {retries}")
    # The legacy `retries=0` has always meant a single attempt.
    alias = None if retries is None else max(1, retries)
    if max_attempts is not None and alias is not None and alias != max_attempts:
        raise ValueError(
            f"{where}: retries={retries} and max_attempts={max_attempts} disagree — retries is "
            "an alias of max_attempts (the number of attempts): give one of them"
        )
    return max_attempts if max_attempts is not None else alias


def _policy_backoff(
    backoff: str | Duration | None, backoff_ms: Duration | None, where: str
) -> tuple[BackoffKind | None, int | None]:
    kind, base = _backoff_from(backoff)
    if base is not None and backoff_ms is not None:
        raise ValueError(
            f"{where}: backoff={backoff!r} is a delay and backoff_ms={backoff_ms!r} another: "
            "give the base delay once"
        )
    return kind, base if backoff_ms is None else ms_keyword(backoff_ms)


def _jitter(jitter: Any, where: str) -> bool | None:
    if jitter is not None and not isinstance(jitter, bool):
        raise TypeError(f"{where}: jitter must be True or False, not {jitter!r}")
    return jitter


def _exception_types(value: Any, key: str, where: str) -> tuple[type[Exception], ...] | None:
    """`retry_on=` / `dont_retry_on=`: one exception class or an iterable of them."""
    if value is None:
        return None
    items = (value,) if isinstance(value, type | str) else value
    try:
        found = tuple(items)
    except TypeError:
        raise TypeError(
            f"{where}: {key} takes exception classes (or a tuple of them), not {value!r}"
        ) from None
    for item in found:
        if isinstance(item, str):
            raise TypeError(
                f"{where}: {key} takes exception classes, not names ({item!r}): a name "
                "cannot match a subclass. The classes are checked where the handler runs "
                "(this process, or the worker serving the step)"
            )
        if not isinstance(item, type) or not issubclass(item, Exception):
            raise TypeError(
                f"{where}: {key} takes exception classes (subclasses of Exception), not {item!r}"
            )
    if key == "retry_on" and any(issubclass(t, FatalError) for t in found):
        raise ValueError(f"{where}: retry_on names FatalError, which is never retried")
    return found


def _check_classes(
    retry_on: tuple[type[Exception], ...] | None,
    dont_retry_on: tuple[type[Exception], ...] | None,
    where: str,
) -> None:
    shared = [t.__name__ for t in retry_on or () if t in (dont_retry_on or ())]
    if shared:
        raise ValueError(
            f"{where}: {', '.join(shared)} in both retry_on and dont_retry_on: say which it is"
        )


def resolve_policy(
    base: RetryPolicy,
    retry: RetryPolicy | None,
    where: str,
    *,
    retries: int | None = None,
    backoff: str | Duration | None = None,
    backoff_ms: Duration | None = None,
    backoff_max_ms: Duration | None = None,
    jitter: bool | None = None,
) -> RetryPolicy:
    """The policy a declaration or a call gives: `base` (the step's declared policy, or the
    defaults), the fields `retry` was given, then the loose keywords. A loose keyword that
    disagrees with a field the policy was given is an error naming both."""
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise TypeError(f"{where}: retry= takes a durably.RetryPolicy, not {retry!r}")
    kind, base_ms = _backoff_from(backoff)
    attempts = None if retries is None else _attempts_from(None, retries, where)
    delay = ms_keyword(backoff_ms) if backoff_ms is not None else base_ms
    cap = ms_keyword_or_none(backoff_max_ms)
    loose: dict[str, tuple[str, Any, Any]] = {
        "max_attempts": ("retries", retries, attempts),
        "backoff": ("backoff", backoff, kind),
        "backoff_ms": ("backoff_ms" if backoff_ms is not None else "backoff", backoff, delay),
        "backoff_max_ms": ("backoff_max_ms", backoff_max_ms, cap),
        "jitter": ("jitter", jitter, _jitter(jitter, where)),
    }
    policy = base
    if retry is not None:
        for key, (keyword, raw, value) in loose.items():
            if value is not None and key in retry.given and getattr(retry, key) != value:
                shown = backoff_ms if keyword == "backoff_ms" else raw
                raise ValueError(
                    f"{where}: {keyword}={shown!r} disagrees with the retry policy's "
                    f"{key}={getattr(retry, key)!r}: give it once"
                )
        policy = policy.merged(retry)
    return policy.overlay(
        retries=attempts,
        backoff=kind,
        backoff_ms=delay,
        backoff_max_ms=cap,
        jitter=jitter,
    )


def _declared(kind: str, name: str | None) -> str:
    """`@durably.step("charge")` / `@durably.workflow`: where a refused option was given."""
    return f"@durably.{kind}({name!r})" if name else f"@durably.{kind}"


def _backoff_from(backoff: str | Duration | None) -> tuple[BackoffKind | None, int | None]:
    """`backoff=` accepts a kind ("fixed"/"exponential") or a base delay duration."""
    if backoff is None:
        return None, None
    if isinstance(backoff, str) and backoff.lower() in ("fixed", "exponential", "exp"):
        kind: BackoffKind = "fixed" if backoff.lower() == "fixed" else "exponential"
        return kind, None
    return None, to_ms(backoff)


# ----------------------------------------------------------------------------- steps


class Step(Generic[I, O, P]):
    """A checkpointed unit of work returning one output.

    `I` is the type of its first (or only) input, `O` its output, `P` all its parameters:
    `ctx.step(step, *args, **kwargs)` is checked against `P`, `ctx.step(step, input,
    retries=...)` against `I`. `Step[I, O]` leaves `P` open (any arguments).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        policy: RetryPolicy,
        timeout_ms: int | None,
        requires: Sequence[str] | None,
        explicit_policy: frozenset[str],
    ):
        self.fn = fn
        self.name = name
        self.policy = policy
        self.timeout_ms = timeout_ms
        self.requires = tuple(requires or ())
        self.is_async = inspect.iscoroutinefunction(fn)
        # A parameter annotated `StepContext` is found here, once: the handler is called
        # through `_target`, which has the inputs' signature and passes the context.
        self.context_param = step_context_param(fn)
        self._target: Callable[..., Any] = (
            fn if self.context_param is None else with_step_context(fn, self.context_param, name)
        )
        self.input_codec, self.output_codec, self.arity = codecs_for(self._target, skip_first=False)
        self.explicit_policy = explicit_policy
        # Per-call options given with `.options(...)`; ctx.step reads them.
        self.call_options: dict[str, Any] = {}
        self._arg_codecs: ArgCodecs | None = None  # built on the first several-argument call
        self._single_ok = False  # whether one input was found to be enough (see below)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<durably.Step {self.name!r}>"

    @property
    def arg_codecs(self) -> ArgCodecs:
        """The codecs of every parameter (a call with several or keyword arguments)."""
        if self._arg_codecs is None:
            self._arg_codecs = ArgCodecs(self._target)
        return self._arg_codecs

    def check_single_input(self, what: str, reserved: Iterable[str] = ()) -> None:
        """A TypeError when the function cannot be called with one input (it requires more
        arguments): found before the call is stored, not by every attempt. Worked out once."""
        if self._single_ok:
            return
        if self.arity:
            refuse_unbindable(signature_of(self._target), Args(None), what, reserved)
        self._single_ok = True

    def invoke(self, input: Any) -> Any:
        """Call the user function with the step's single input (or none if it takes none)."""
        return self._target(input) if self.arity else self._target()

    def invoke_args(self, call: Args) -> Any:
        """Call the user function with several arguments."""
        return self._target(*call.args, **call.kwargs)

    def options(
        self,
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
    ) -> Self:
        """This step with `ctx.step` options attached, for calls that pass the step keyword
        arguments: `ctx.step(charge.options(retries=3), order, rate, currency="EUR")`
        (`ctx.step`'s own option keywords are typed only for a single-input call). The
        copy has the same name and is not registered again; giving an option both here and
        to `ctx.step` is a TypeError."""
        given = {
            "retry": retry,
            "retries": retries,
            "backoff": backoff,
            "backoff_ms": backoff_ms,
            "backoff_max_ms": backoff_max_ms,
            "jitter": jitter,
            "timeout": timeout,
            "queue": queue,
            "priority": priority,
            "fairness_key": fairness_key,
            "compensate": compensate,
        }
        clone = copy.copy(self)
        clone.call_options = {
            **self.call_options,
            **{k: v for k, v in given.items() if v is not None},
        }
        return clone


class AsyncStep(Step[I, O, P]):
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, O]:
        result: Coroutine[Any, Any, O] = _call(self, args, kwargs)
        return result


class SyncStep(Step[I, O, P]):
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> O:
        result: O = _call(self, args, kwargs)
        return result


def _call(step: Step[Any, Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # `step(None)` of a step taking no input ran it before steps took arguments: kept.
    if len(args) == 1 and not kwargs:
        return step.invoke(args[0])
    return step.invoke_args(Args(*args, **kwargs))


def step_input_json(step: Step[Any, Any, Any] | None, name: str, input: Any) -> Any:
    """The stored (and dispatched) JSON of a step call's input: a single input in its
    parameter's JSON form, exactly as before steps took arguments; `Args` (several or keyword
    arguments) as `{"$durably.args": [...], "$durably.kwargs": {...}}` (typed_io.ARGS_KEY)."""
    if isinstance(input, Args):
        return (step.arg_codecs if step is not None else PLAIN_ARGS).to_json(input)
    value = (step.input_codec if step is not None else PLAIN).to_json(input)
    refuse_reserved_keys(value, f"step {name!r}")
    return value


class _StepDecorator:
    def __init__(self, name: str | None, kwargs: dict[str, Any]):
        self._name = name
        self._kwargs = kwargs

    # A handler `(input, log: StepContext)` is called without the logger: its parameters are
    # its input alone. (Only this shape: any other place of the logger is typed as a
    # parameter, so such a handler reads it from `current_step()` in typed code.)
    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, fn: Callable[[I, StepContext], Coroutine[Any, Any, O]]
    ) -> AsyncStep[I, O, [I]]: ...
    @overload
    def __call__(self, fn: Callable[[I, StepContext], O]) -> SyncStep[I, O, [I]]: ...
    # `I` is the first parameter's type (the single input of `ctx.step(step, input)`), `Q`
    # the rest; the step's parameters are both (the first keeps its type, not its name).
    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, fn: Callable[Concatenate[I, Q], Coroutine[Any, Any, O]]
    ) -> AsyncStep[I, O, Concatenate[I, Q]]: ...
    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, fn: Callable[[], Coroutine[Any, Any, O]]
    ) -> AsyncStep[None, O, []]: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[I, Q], O]) -> SyncStep[I, O, Concatenate[I, Q]]: ...
    @overload
    def __call__(self, fn: Callable[[], O]) -> SyncStep[None, O, []]: ...
    def __call__(self, fn: Callable[..., Any]) -> Step[Any, Any, Any]:
        return _make_step(fn, self._name, **self._kwargs)


def _make_step(
    fn: Callable[..., Any],
    name: str | None,
    *,
    retry: RetryPolicy | None = None,
    retries: int | None = None,
    backoff: str | Duration | None = None,
    backoff_ms: Duration | None = None,
    backoff_max_ms: Duration | None = None,
    jitter: bool | None = None,
    timeout: Duration | None = None,
    requires: Sequence[str] | None = None,
) -> Step[Any, Any, Any]:
    policy = resolve_policy(
        RetryPolicy(),
        retry,
        _declared("step", name or getattr(fn, "__qualname__", None)),
        retries=retries,
        backoff=backoff,
        backoff_ms=backoff_ms,
        backoff_max_ms=backoff_max_ms,
        jitter=jitter,
    )
    step_name = name or getattr(fn, "__qualname__", None) or fn.__name__
    cls: type[Step[Any, Any, Any]] = AsyncStep if inspect.iscoroutinefunction(fn) else SyncStep
    made = cls(fn, step_name, policy, to_ms_or_none(timeout), requires, policy.given)
    DEFAULT_REGISTRY.add_step(made)
    return made


def step(
    name: str | None = None,
    *,
    retry: RetryPolicy | None = None,
    retries: int | None = None,
    backoff: str | Duration | None = None,
    backoff_ms: Duration | None = None,
    backoff_max_ms: Duration | None = None,
    jitter: bool | None = None,
    timeout: Duration | None = None,
    requires: Sequence[str] | None = None,
) -> _StepDecorator:
    """Declare a step: `@durably.step("payments.charge", retries=3, backoff="exponential")`.

    Durations: a number is seconds, a `timedelta` is itself, a string like `"500ms"`/`"30s"`.
    `backoff` is either the kind (`"fixed"`, `"exponential"`) or the base delay; `backoff_ms`
    sets the base delay explicitly; `retries` is the number of attempts (an alias of
    `RetryPolicy.max_attempts`). `retry=RetryPolicy(...)` gives the whole policy, with
    `retry_on` / `dont_retry_on` exception classes; a loose keyword that disagrees with a
    field the policy gives is an error. The decorated object stays a plain callable.
    The function may take any parameters: `ctx.step(step, *args, **kwargs)` is typed by them
    (docs/steps-arguments.md: reserved option keywords, `step.options(...)`, stored form).
    `requires` names capabilities (`["gpu"]`): the step goes only to a worker, reached over
    the engine's transport, that declares them all; with none live the run is parked
    `blocked` (its error says why) and resumes when one appears. An engine without a
    transport runs steps in-process and declares nothing, so there such a step blocks.
    """
    return _StepDecorator(
        name,
        {
            "retry": retry,
            "retries": retries,
            "backoff": backoff,
            "backoff_ms": backoff_ms,
            "backoff_max_ms": backoff_max_ms,
            "jitter": jitter,
            "timeout": timeout,
            "requires": requires,
        },
    )


# ------------------------------------------------------------------------- workflows


@dataclass(frozen=True, slots=True)
class OnErrorRoute:
    """Route a failed run to a handler workflow by error code (`code=None`: catch-all)."""

    workflow: str
    code: str | None = None


@dataclass(frozen=True, slots=True)
class OnErrorInput:
    """What an onError handler workflow receives.

    `error` is the failed run's error as the same typed `StepError` that `run.error`
    holds (`message`, `code`, `details`, `retryable`, `stack`), so a handler reads
    `inp.error.code`. The handler run's stored input stays the camelCase JSON
    `{runId, workflow, input, error}`; a handler annotated with `OnErrorInput` gets it
    rebuilt, an unannotated one the plain JSON dict.
    """

    run_id: str
    workflow: str
    input: Any
    error: StepError

    def to_json(self) -> dict[str, Any]:
        """The handler's stored input, with camelCase keys like every stored shape."""
        return {
            "runId": self.run_id,
            "workflow": self.workflow,
            "input": self.input,
            "error": self.error.to_json(),
        }

    @classmethod
    def from_json(cls, data: Any) -> OnErrorInput:
        if isinstance(data, OnErrorInput):
            return data
        if not isinstance(data, dict):
            raise ValueError("OnErrorInput must be an object {runId, workflow, input, error}")
        return cls(
            run_id=str(data.get("runId", data.get("run_id", ""))),
            workflow=str(data.get("workflow", "")),
            input=data.get("input"),
            error=_step_error(data.get("error")),
        )

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        # A handler annotating its input with OnErrorInput receives it rebuilt from the
        # camelCase JSON; unannotated handlers receive the plain dict.
        from pydantic_core import core_schema

        return core_schema.no_info_plain_validator_function(
            cls.from_json,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda v: v.to_json() if isinstance(v, OnErrorInput) else v
            ),
        )


def _step_error(value: Any) -> StepError:
    if isinstance(value, StepError):
        return value
    if not isinstance(value, dict):
        raise ValueError("OnErrorInput.error must be an object {message, code?, details?}")
    return StepError.from_json(value)


def dead_letter_ref(where: str, ref: Any) -> Workflow[Any, Any] | str | None:
    """A dead-letter handler is a workflow or a workflow's name; anything else is a mistake
    that would only show when a run dies, so it is refused where it is declared."""
    if ref is None or isinstance(ref, Workflow):
        return ref
    if isinstance(ref, str) and ref.strip():
        return ref
    raise TypeError(f"{where}: dead_letter takes a workflow or a workflow's name, not {ref!r}")


def assert_routes(workflow: str, routes: Sequence[OnErrorRoute]) -> tuple[OnErrorRoute, ...]:
    """Two routes for one code, or two catch-alls, are rejected."""
    seen: set[str | None] = set()
    for route in routes:
        if not route.workflow:
            raise ValueError(f"workflow {workflow!r}: an onError route names no handler workflow")
        if route.code in seen:
            which = "catch-all routes" if route.code is None else f"routes for code {route.code!r}"
            raise ValueError(f"workflow {workflow!r} declares two onError {which}")
        seen.add(route.code)
    return tuple(routes)


WorkflowFn = Callable[..., Awaitable[Any]]


class Workflow(Generic[I, O]):
    """A registered workflow body `async def body(ctx, input) -> output`."""

    def __init__(
        self,
        fn: WorkflowFn,
        name: str,
        version: str,
        *,
        on_error: Sequence[OnErrorRoute] = (),
        tags: Sequence[str] = (),
        execution_timeout_ms: int | None = None,
        search_attributes: Any = None,
        on_event: Sequence[str | EventTrigger] = (),
        validate_input: Callable[[Any], Any] | None = None,
        accumulate: Accumulation | None = None,
        singleton: Singleton | None = None,
        concurrency: Concurrency | None = None,
        dead_letter: Workflow[Any, Any] | str | None = None,
    ):
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"workflow {name!r} must be an `async def` function")
        self.fn = fn
        self.name = name
        self.version = str(version)
        self.on_error = assert_routes(name, on_error)
        self.tags = tuple(tags)
        self.execution_timeout_ms = execution_timeout_ms
        self.search_attributes_schema = search_attributes
        # `on_event` keeps the event names; `event_triggers` adds each one's match, and
        # `accumulate` the debounce or batch that collects them (the triggers package).
        self.event_triggers = event_triggers(f"workflow {name!r}", on_event)
        self.on_event = tuple(dict.fromkeys(t.name for t in self.event_triggers))
        self.accumulate = accumulate
        self.validate_input = validate_input
        self.singleton = singleton  # runs of one key take turns (durably._engine.flow.singleton)
        self.concurrency = concurrency  # starts beyond a key's limit are refused (quotas.py)
        # The workflow started (`dlq:<runId>`) when a run of this one is dead-lettered; it
        # beats the engine's `dead_letter_workflow=` (worker/dead_letters.py).
        self.dead_letter = dead_letter_ref(f"workflow {name!r}", dead_letter)
        self.input_codec, self.output_codec, self.arity = codecs_for(fn, skip_first=True)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<durably.Workflow {self.name!r} v{self.version}>"

    def __call__(self, ctx: WorkflowCtx, input: I) -> Coroutine[Any, Any, O]:
        """Run the body directly (for unit tests with a test ctx)."""
        return self.invoke(ctx, input)

    def invoke(self, ctx: WorkflowCtx, input: Any) -> Coroutine[Any, Any, O]:
        coro: Coroutine[Any, Any, O]
        coro = self.fn(ctx, input) if self.arity else self.fn(ctx)
        return coro


class _WorkflowDecorator:
    def __init__(self, name: str | None, kwargs: dict[str, Any]):
        self._name = name
        self._kwargs = kwargs

    @overload
    def __call__(
        self, fn: Callable[[WorkflowCtx, I], Coroutine[Any, Any, O]]
    ) -> Workflow[I, O]: ...
    @overload
    def __call__(
        self, fn: Callable[[WorkflowCtx], Coroutine[Any, Any, O]]
    ) -> Workflow[None, O]: ...
    def __call__(self, fn: Callable[..., Coroutine[Any, Any, Any]]) -> Workflow[Any, Any]:
        name = self._name or getattr(fn, "__qualname__", None) or fn.__name__
        wf: Workflow[Any, Any] = Workflow(fn, name, **self._kwargs)
        DEFAULT_REGISTRY.add_workflow(wf)
        return wf


def workflow(
    name: str | None = None,
    *,
    version: str = "1",
    on_error: Iterable[OnErrorRoute] = (),
    tags: Iterable[str] = (),
    execution_timeout: Duration | None = None,
    singleton: Singleton | None = None,
    concurrency: Concurrency | None = None,
    search_attributes: Any = None,
    on_event: Iterable[str | EventTrigger] = (),
    event_batch: Batch | None = None,
    validate_input: Callable[[Any], Any] | None = None,
    debounce: Duration | Debounce | None = None,
    batch: Batch | None = None,
    dead_letter: Workflow[Any, Any] | str | None = None,
) -> _WorkflowDecorator:
    """Declare a workflow: `@durably.workflow("checkout", version="2")`.

    `validate_input(input)` raises (or returns a non-empty string) to reject a start.
    `search_attributes` is a schema for `ctx.upsert_search_attributes`: a pydantic model or a
    callable that raises on invalid attributes.
    `on_event` names the events that start the workflow (`durably.EventTrigger(name,
    match=...)` for a payload predicate); `debounce="30s"` starts it once those events
    stop for that long, with the last payload; `batch=durably.Batch(max_size, within)`
    with `{"events": [...]}` (`event_batch=` is the same option under its other name).
    `debounce=durably.Debounce("30s", key=fn)` and `durably.Batch(..., key=fn)` accumulate
    per key `fn(payload)` (a str; None: the workflow's shared accumulator).
    `singleton=durably.Singleton(key=..., limit=1, max_queue_depth=None)`: runs of one key
    run their bodies `limit` at a time, in creation order. `concurrency=durably.Concurrency(
    key=..., limit=...)`: a start beyond a key's limit raises `ConcurrencyLimitError`.
    `dead_letter=` (a workflow or its name) is started once, as run `dlq:<runId>`, for a run
    of this workflow that crash recovery gave up on (`max_recovery_attempts`); it beats the
    engine's `dead_letter_workflow=`.
    """
    for option, value, kind in (
        ("singleton", singleton, Singleton),
        ("concurrency", concurrency, Concurrency),
    ):
        if value is not None and not isinstance(value, kind):
            raise TypeError(
                f"{_declared('workflow', name)} {option}= takes a durably.{kind.__name__}"
                f"(...), not {value!r}"
            )
    where = _declared("workflow", name)
    if name is not None and is_engine_owned_workflow(name):
        raise ValueError(f"{where}: workflow names starting with '__' are reserved for the engine")
    if event_batch is not None and batch is not None:
        raise ValueError(f"{where}: give batch= or event_batch= (the same option), not both")
    triggers = event_triggers(where, on_event)
    accumulate = accumulation(where, triggers, debounce, batch or event_batch)
    return _WorkflowDecorator(
        name,
        {
            "version": version,
            "on_error": tuple(on_error),
            "tags": tuple(tags),
            "execution_timeout_ms": to_ms_or_none(execution_timeout),
            "search_attributes": search_attributes,
            "on_event": triggers,
            "validate_input": validate_input,
            "accumulate": accumulate,
            "singleton": singleton,
            "concurrency": concurrency,
            "dead_letter": dead_letter_ref(where, dead_letter),
        },
    )


# -------------------------------------------------------------------------- registry

_NUM = re.compile(r"(\d+)")


def _natural_key(version: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in _NUM.split(version))


def is_newer_version(a: str, b: str) -> bool:
    """Whether version `a` is newer than `b`: numeric when both parse, else natural order."""
    try:
        return float(a) > float(b)
    except ValueError:
        return _natural_key(a) > _natural_key(b)


def close_matches(name: str, names: Iterable[str]) -> str:
    """A "did you mean" suffix for an error naming an unknown workflow: the known names
    closest to `name` (a typo is the usual cause), or "" when none is close."""
    found = difflib.get_close_matches(name, sorted(set(names)), n=3)
    if not found:
        return ""
    return "; did you mean " + " or ".join(repr(n) for n in found) + "?"


class Registry:
    """Workflows keyed `name@version` (all versions runnable) and steps keyed by name."""

    def __init__(self) -> None:
        self.workflows: dict[str, Workflow[Any, Any]] = {}
        self.latest: dict[str, Workflow[Any, Any]] = {}
        self.steps: dict[str, Step[Any, Any]] = {}

    def add_workflow(self, wf: Workflow[Any, Any]) -> None:
        self.workflows[f"{wf.name}@{wf.version}"] = wf
        current = self.latest.get(wf.name)
        if (
            current is None
            or current.version == wf.version
            or is_newer_version(wf.version, current.version)
        ):
            self.latest[wf.name] = wf

    def add_step(self, st: Step[Any, Any]) -> None:
        self.steps[st.name] = st

    def workflow(self, name: str, version: str | None = None) -> Workflow[Any, Any] | None:
        if version is not None:
            return self.workflows.get(f"{name}@{version}")
        return self.latest.get(name)

    def versions_of(self, name: str) -> list[str]:
        return sorted(wf.version for wf in self.workflows.values() if wf.name == name)

    def step(self, name: str) -> Step[Any, Any] | None:
        return self.steps.get(name)


DEFAULT_REGISTRY = Registry()
"""Everything decorated in imported modules; an Engine without explicit lists uses it."""


def validate_attributes(workflow: Workflow[Any, Any], merged: dict[str, Any]) -> None:
    """Check a run's search attributes (`ctx.upsert_search_attributes`): plain scalars, and
    the workflow's `search_attributes` schema when it declares one; `FatalError` if not."""
    for key, value in merged.items():
        if not isinstance(value, str | int | float | bool) or value is None:
            raise FatalError(
                f"workflow {workflow.name!r}: search attribute {key!r} must be a str, int, "
                f"float or bool, not {type(value).__name__}",
                code="invalid_search_attributes",
            )
    schema = workflow.search_attributes_schema
    if schema is None:
        return
    try:
        if hasattr(schema, "model_validate"):
            schema.model_validate(merged)
            return
        result = schema(merged)
        if isinstance(result, Awaitable):
            raise FatalError("search attribute validators must be synchronous")
        if isinstance(result, str) and result:
            raise ValueError(result)
    except FatalError:
        raise
    except Exception as exc:
        raise FatalError(
            f"workflow {workflow.name!r}: invalid search attributes {sorted(merged)}: {exc}",
            code="invalid_search_attributes",
        ) from exc
