"""`EngineOptions`: every tuning option of an `Engine`, typed, documented and validated.

An engine is tuned either with keywords (`Engine(lease_ms=5_000)`) or with one
`EngineOptions` value (`Engine(options=EngineOptions(lease_ms=5_000))`), which can be built
once and shared by the processes of a deployment. Both go through the same checks, so a bad
value is refused when the engine (or the options value) is built, with a `ValueError` that
names the option — never later, deep inside a poller.

Units: an option whose name ends in `_ms` is a whole number of milliseconds (the names are
part of the public API and stay as they are). Any other duration (`signal_buffer_ttl`) is a
number of SECONDS, a `timedelta`, or a string such as `"10s"` / `"24h"` — the same reading
every duration of the Python API has.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, TypeVar, cast

from durably._core.bounds import DEFAULT_MAX_PAYLOAD_BYTES
from durably._core.buffered_signals import (
    DEFAULT_SIGNAL_BUFFER_PER_NAMESPACE,
    DEFAULT_SIGNAL_BUFFER_PER_TOKEN,
    DEFAULT_SIGNAL_BUFFER_TTL_MS,
)
from durably._core.durations import Duration, to_ms
from durably._core.retention import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_SWEEP_INTERVAL_MS,
    MAX_BATCHES_PER_POLICY,
)
from durably._engine.defs.concurrency import ConcurrencySpec, check_concurrency

__all__ = [
    "ENV_PREFIX",
    "OPTION_NAMES",
    "UNSET",
    "EngineOptions",
    "Unset",
    "env_name",
    "merge_options",
]

T = TypeVar("T")

ENV_PREFIX: Final = "DURABLY_"


class Unset(enum.Enum):
    """The default of an `Engine(...)` / `Client(...)` option keyword: "not given here", so
    the value comes from `options=` (or the default). A sentinel rather than None because
    None is a meaningful value of some options (`max_recovery_attempts=None`: no limit)."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = Unset.UNSET


def env_name(option: str) -> str:
    """The environment variable that sets `option`: `DURABLY_LEASE_MS` for `lease_ms`."""
    return ENV_PREFIX + option.upper()


def _default(name: str, default: T) -> T:
    """A field whose default is `DURABLY_<NAME>` when that is set, else `default`.

    Read when an `EngineOptions` is built, and only for the fields its caller left out, so a
    value written in code (a keyword, a field of `options=`) always wins over the
    environment, and the environment over the built-in default."""
    return field(
        default_factory=lambda: cast(T, _from_env(name, default)),
        metadata={"default": default},
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineOptions:
    """The tuning options of an `Engine`; every field has a working default.

    Each field left out is read from the environment when set: `DURABLY_` + the field's
    name upper-cased (`DURABLY_LEASE_MS=5000`), parsed by the field's type (a whole number;
    `1`/`0`/`true`/`false` for a flag; `none` for an option that takes None; seconds or
    `"24h"` for `signal_buffer_ttl`; a number, `adaptive` or `none` for `concurrency`). A
    value that does not parse, or is out of range, raises `ValueError` naming the variable.

    Frozen: derive a variant with `dataclasses.replace(options, lease_ms=5_000)`. Building
    one checks every field and raises `ValueError` naming the first bad one.
    """

    # ------------------------------------------------------------ leases and polling
    lease_ms: int = _default("lease_ms", 30_000)
    """How long a claim on a run lasts without renewal (ms). A process that dies holding a
    run loses it after this long and another process recovers the run; the owner renews it
    well before then. Lower it to recover faster, at the price of more renewal writes. A
    lease is timed on each process's own clock: processes sharing a store need clocks that
    agree well within it, or one whose clock runs ahead takes runs others still execute."""

    timer_poll_ms: int = _default("timer_poll_ms", 1_000)
    """How often the poller looks for due timers (`ctx.sleep`, deadlines) and runs waiting
    to be picked up (ms). Where the store has a wake bus (PostgreSQL) most work is announced
    at once and this is only the fallback."""

    reconcile_ms: int = _default("reconcile_ms", 300_000)
    """How often the slow sweep runs (ms): it recovers runs whose owner's lease expired and
    purges expired buffered signals."""

    max_recovery_attempts: int | None = _default("max_recovery_attempts", None)
    """How many times a run may be recovered after its owner crashed before it is marked
    `dead` (a poison pill that keeps killing its process). None: no limit."""

    drain_timeout_ms: int = _default("drain_timeout_ms", 10_000)
    """On close, how long in-flight turns get to finish before they are interrupted (ms);
    an interrupted run is recovered by whichever process claims it next."""

    instance_wait_ms: int | None = _default("instance_wait_ms", None)
    """With an explicit `instance_id`: how long opening waits for a live predecessor with
    the same id to let go (ms) before giving up. None: `drain_timeout_ms + 2 * lease_ms`,
    enough for a predecessor that is draining or has just died."""

    remote_redispatch_ms: int | None = _default("remote_redispatch_ms", None)
    """Opt-in self-heal of lost dispatches (ms). A step sent over a transport whose row is
    still `pending` this long after it was (last) dispatched is dispatched again under the
    same step id, by the run waiting on it (it wakes at that time like at a timer), and
    logged at INFO. The re-dispatch counts as a new attempt of the step: the row's attempt
    number goes up, so the answer of the lost dispatch, should it arrive late, is dropped and
    the row is settled once, by the re-dispatch's answer. A step that is only slow is run
    twice, so choose a window well above the step's running time (steps must be idempotent).
    None: never; a pending step waits for its answer (or its `timeout=`). In-process steps
    are never re-dispatched."""

    remote_redispatch_max: int = _default("remote_redispatch_max", 10)
    """With `remote_redispatch_ms`: re-dispatches of one step before it fails with
    `remote_step_lost` (not retried). Re-dispatches and retries share the step's attempt
    number: the step is given up as lost when a window passes with that number already past
    this value."""

    # ------------------------------------------------------------ capacity
    max_concurrent_runs: int = _default("max_concurrent_runs", 1_000)
    """Runs this engine drives at once: it picks up pending runs only while fewer execute
    here. A run whose body waits only for something outside it (a signal, an event, a
    timer, a child run) holds no slot — `max_resident_runs` bounds those — and one woken
    from such a wait carries on even when the slots are full. A run waiting on its own
    step (in flight elsewhere, waiting for a flow-control slot, between retries) holds its
    slot."""

    claim_batch: int = _default("claim_batch", 16)
    """Runs leased per pick-up statement when claiming from the backlog."""

    pending_batch: int = _default("pending_batch", 100)
    """Runs the poller lists per pass when looking for pending runs to pick up."""

    max_resident_runs: int = _default("max_resident_runs", 10_000)
    """Parked workflow bodies kept in memory. Past it the longest-parked run is evicted and
    replayed from its checkpoints when it wakes. 0 keeps none."""

    step_threads: int = _default("step_threads", 256)
    """Size of the engine's thread pool for synchronous steps (started lazily; a blocking
    sync step holds a thread while it blocks)."""

    concurrency: ConcurrencySpec = _default("concurrency", None)
    """Worker concurrency: how many step handlers (`ctx.step`, step-fan members) this engine
    runs at once; the others wait for a permit, and their `step.started` and `timeout=` begin
    when they get one. None: no limit of its own. A whole number: that fixed limit.
    `"adaptive"` or `AdaptiveConcurrency(min=, max=, …)`: a limit adjusted every tick on the
    steps' latency, the process's memory and CPU. The current limit is reported in
    `worker_health()`. Refused with a transport (steps then run in other processes)."""

    fan_window: int = _default("fan_window", 1_000)
    """In-process members of one step fan (`ctx.map`, `ctx.all`, …) in flight at once."""

    fold_fans_over: int = _default("fold_fans_over", 1_000)
    """Workflow fans at least this wide fold each settled wave into a summary instead of
    keeping one record per member in memory."""

    event_scan_limit: int = _default("event_scan_limit", 50)
    """Buffered events read per scan when a workflow waits for an event."""

    compensation_retries: int = _default("compensation_retries", 1)
    """Tries of each local compensation (saga undo) before it is reported failed; 1 means
    one try, no retry."""

    max_payload_bytes: int = _default("max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES)
    """Largest JSON value (bytes, encoded) accepted from outside the engine's own code: a
    remote step's result or event, a remote workflow's decision or step event, a signal's
    payload, a tenant's start-run input. A bigger one is refused at the boundary with
    `PayloadTooLargeError` (an API call), or fails the step attempt / is dropped and logged
    once (a wire message), and nothing of it is stored. Default 4 MiB; pass references to
    bigger data (a URL, an object-store key) instead of the data itself."""

    # ------------------------------------------------------------ behaviour
    track_step_start: bool = _default("track_step_start", True)
    """Record when each step starts (a `started` checkpoint), so the dashboard and the read
    API show running steps; False saves one write per step."""

    always_replay: bool = _default("always_replay", False)
    """Test mode: evict every run after every step and replay it from its checkpoints, which
    flushes out workflow code that is not deterministic."""

    # ------------------------------------------------------------ buffered signals
    signal_buffer_ttl: Duration = _default(
        "signal_buffer_ttl", DEFAULT_SIGNAL_BUFFER_TTL_MS / 1000.0
    )
    """How long a signal sent before any run waits on its token stays buffered: seconds, a
    `timedelta` or a string such as `"24h"` (default 24 hours). An expired signal is never
    delivered and is purged."""

    signal_buffer_per_token: int = _default(
        "signal_buffer_per_token", DEFAULT_SIGNAL_BUFFER_PER_TOKEN
    )
    """Most signals buffered for one token; past it a new one is refused with
    `SignalBufferFullError`."""

    signal_buffer_per_namespace: int = _default(
        "signal_buffer_per_namespace", DEFAULT_SIGNAL_BUFFER_PER_NAMESPACE
    )
    """Most signals buffered for one token namespace (a token's text before its first
    ':'); past it a new one is refused with `SignalBufferFullError`."""

    # ------------------------------------------------------------ retention sweep
    retention_sweep_ms: int = _default("retention_sweep_ms", DEFAULT_SWEEP_INTERVAL_MS)
    """With `Engine(retention=[...])`: how often the retention sweep runs (ms). It runs once
    when the engine opens, then every this long; 0 sweeps at open only. Default one minute."""

    retention_batch_size: int = _default("retention_batch_size", DEFAULT_BATCH_SIZE)
    """Finished runs the retention sweep deletes per transaction (with their checkpoints
    and other rows). Smaller batches hold the store's locks for less time per statement;
    larger ones delete a backlog in fewer statements."""

    retention_max_batches: int = _default("retention_max_batches", MAX_BATCHES_PER_POLICY)
    """Batches each retention policy deletes per sweep at most. A backlog larger than
    `retention_batch_size * retention_max_batches` runs drains over several sweeps, so one
    sweep never runs for long."""

    def __post_init__(self) -> None:
        for name in OPTION_NAMES:
            check_option("EngineOptions", name, getattr(self, name))

    @property
    def signal_buffer_ttl_ms(self) -> int:
        """`signal_buffer_ttl` in milliseconds."""
        return to_ms(self.signal_buffer_ttl)

    @property
    def effective_instance_wait_ms(self) -> int:
        """`instance_wait_ms`, or its default derived from the drain timeout and lease."""
        if self.instance_wait_ms is not None:
            return self.instance_wait_ms
        return self.drain_timeout_ms + 2 * self.lease_ms


OPTION_NAMES: Final[tuple[str, ...]] = tuple(f.name for f in dataclasses.fields(EngineOptions))

# Smallest value of each whole-number option. A value that the engine would have to clamp
# (a window of 0, a lease of 0 ms) is refused instead: clamping hides the caller's mistake.
_MINIMUM: Final[dict[str, int]] = {
    "lease_ms": 1,
    "timer_poll_ms": 1,
    "reconcile_ms": 1,
    "remote_redispatch_ms": 1,
    "remote_redispatch_max": 1,
    "max_recovery_attempts": 0,  # 0: the first crash of its owner makes a run dead
    "drain_timeout_ms": 0,  # 0: interrupt in-flight turns at once on close
    "instance_wait_ms": 0,
    "max_concurrent_runs": 1,
    "claim_batch": 1,
    "pending_batch": 1,
    "max_resident_runs": 0,
    "step_threads": 1,
    "fan_window": 1,
    "fold_fans_over": 1,
    "event_scan_limit": 1,
    "compensation_retries": 1,
    "max_payload_bytes": 1024,
    "signal_buffer_per_token": 1,
    "signal_buffer_per_namespace": 1,
    "retention_sweep_ms": 0,  # 0: sweep at open only
    "retention_batch_size": 1,
    "retention_max_batches": 1,
}
_OPTIONAL: Final = frozenset({"max_recovery_attempts", "instance_wait_ms", "remote_redispatch_ms"})
_FLAGS: Final = frozenset({"track_step_start", "always_replay"})


_TRUE: Final = frozenset({"1", "true"})
_FALSE: Final = frozenset({"0", "false"})


def _from_env(name: str, default: object) -> object:
    """`name`'s value from its environment variable, parsed and checked; `default` when the
    variable is not set."""
    var = env_name(name)
    raw = os.environ.get(var)
    if raw is None:
        return default
    value = _parse(name, raw.strip())
    try:
        check_option("EngineOptions", name, value)
    except ValueError as exc:
        raise ValueError(f"{var}={raw!r}: {exc}") from None
    return value


def _parse(name: str, text: str) -> object:
    var = env_name(name)
    lowered = text.lower()
    if name in _FLAGS:
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError(f"{var}={text!r}: a flag is 1, 0, true or false")
    if name == "signal_buffer_ttl":
        try:
            return float(text)  # a bare number is seconds, as in the Python API
        except ValueError:
            return text  # "24h", "10s": read (and checked) like a duration string
    if lowered == "none" and (name in _OPTIONAL or name == "concurrency"):
        return None
    try:
        return int(text)
    except ValueError:
        if name == "concurrency":
            return text  # "adaptive", checked with the other concurrency values
        none = " or none" if name in _OPTIONAL else ""
        raise ValueError(f"{var}={text!r}: not a whole number{none}") from None


def check_option(owner: str, name: str, value: object) -> None:
    """Raise `ValueError` naming `owner(name=…)` when `value` is not a valid `name`.

    Wrong types are a ValueError too (not TypeError), so one `except ValueError` catches
    every bad option value, whichever way it is bad."""
    if name == "signal_buffer_ttl":
        try:
            if value is None:
                raise ValueError("a duration is required")
            ttl_ms = to_ms(value)  # type: ignore[arg-type]  # checked at run time
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{owner}(signal_buffer_ttl={value!r}): {exc} (a number of seconds, a "
                'timedelta, or a string such as "24h")'
            ) from None
        if ttl_ms < 1:
            raise ValueError(f"{owner}(signal_buffer_ttl={value!r}) must be a positive duration")
        return
    if name == "concurrency":
        check_concurrency(owner, value)
        return
    if name in _FLAGS:
        if not isinstance(value, bool):
            raise ValueError(f"{owner}({name}=…) must be True or False, not {value!r}")
        return
    if value is None and name in _OPTIONAL:
        return
    low = _MINIMUM[name]
    unit = " of milliseconds" if name.endswith("_ms") else ""
    if isinstance(value, bool) or not isinstance(value, int):
        none = " or None" if name in _OPTIONAL else ""
        raise ValueError(
            f"{owner}({name}=…) must be a whole number{unit} >= {low}{none}, not {value!r}"
        )
    if value < low:
        raise ValueError(f"{owner}({name}=…) must be >= {low}, not {value}")


def merge_options(
    owner: str, options: EngineOptions | None, given: Mapping[str, object]
) -> EngineOptions:
    """`options` with the keywords `given` explicitly laid over it: a keyword that is not
    UNSET wins over the same field of `options`. Without `options`, the fields no keyword
    gives come from the environment (`DURABLY_<NAME>`), else their defaults — the same
    precedence as everywhere: code > environment > default. Each given value is checked
    first so its error names `owner` (`Engine(lease_ms=…)`), the call the user wrote."""
    if options is not None and not isinstance(options, EngineOptions):
        raise ValueError(f"{owner}(options=…) must be an EngineOptions, not {options!r}")
    changes = {name: value for name, value in given.items() if value is not UNSET}
    for name, value in changes.items():
        check_option(owner, name, value)
    if options is None:
        # Built with the keywords, so a variable is read only for a field they leave out.
        return EngineOptions(**changes)  # type: ignore[arg-type]
    return dataclasses.replace(options, **changes) if changes else options  # type: ignore[arg-type]
