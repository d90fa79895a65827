"""Event triggers: what a workflow declares with `on_event=`, `debounce=` and `batch=`.

Pure data and checks (no I/O): the runtime's end is `durably._engine.triggers.subscribers`.

- `on_event=["order.paid", EventTrigger("order.paid", match=...)]`: a plain name starts the
  workflow for every published event of that name; an `EventTrigger` starts it only for the
  events its `match` accepts. `match` is either a mapping (every key must equal the
  payload's value, compared as JSON — the rule `ctx.wait_for_event(match=)` uses) or a
  callable `match(payload) -> bool` on the event's JSON payload.
- `debounce="30s"` (or `Debounce("30s")`): the workflow is started once the events stop for
  that long, with the LAST payload.
- `batch=Batch(max_size=100, within="1m")`: the workflow is started with
  `{"events": [...]}` (publish order) once `max_size` events arrived or `within` passed
  since the first of them, whichever comes first.

Debounce and batch are mutually exclusive. Without `key=` they are per target workflow (every
event name it listens to feeds one accumulator); `Debounce(window, key=fn)` and
`Batch(max_size, within, key=fn)` keep one accumulator per key, `fn(payload)` being the key
of an event: a str is its key, None sends the event to the target's shared (unkeyed)
accumulator, anything else or an exception refuses the publish (`EventKeyError`).

An accumulator's id (`accumulator_id`) carries the engine's namespace, the target and the
key, each escaped so that no value of one part can pass for another, and kept short enough
for the run-id rule (a long part is replaced by its hash).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durably._core.durations import Duration, to_ms
from durably._core.errors import DurablyError

# Built-in workflows the engine registers for the accumulators. A name starting with two
# underscores belongs to the engine: `@durably.workflow` refuses such names and `start`
# refuses to start them from outside.
DEBOUNCE_WORKFLOW = "__evt_debounce"
BATCH_WORKFLOW = "__evt_batch"
ENGINE_OWNED_WORKFLOW_PREFIX = "__"

# The run ids of an accumulator chain (`__evtacc__:<namespace>:<target>[:<key>]`, then `~1`,
# `~2`, …), the name its events are stored under and the signal token that wakes it. The
# token prefix is reserved (`durably._core.tokens`), so nobody can signal an accumulator from
# outside, and event names and event ids with this prefix are refused by publish_event.
ACCUMULATOR_PREFIX = "__evtacc__:"

EventMatch = Mapping[str, Any] | Callable[[Any], bool]

# `key=` of Debounce and Batch: the accumulator key of an event's JSON payload.
EventKey = Callable[[Any], str | None]


@dataclass(frozen=True, slots=True)
class EventTrigger:
    """One entry of `on_event=`: the event `name`, and optionally which payloads start the
    workflow. `match` is a mapping (each key equals the payload's value, as JSON) or a
    callable on the JSON payload returning True to start; a callable that raises counts as
    no match (and is logged)."""

    name: str
    match: EventMatch | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(
                f"EventTrigger: the event name must be a non-empty str, not {self.name!r}"
            )
        if self.match is not None and not (callable(self.match) or isinstance(self.match, Mapping)):
            raise TypeError(
                f"EventTrigger({self.name!r}): match must be a mapping or a callable "
                f"payload -> bool, not {type(self.match).__name__}"
            )


class EventKeyError(DurablyError, ValueError):
    """The `key=` function of a workflow's debounce or batch raised, or returned something
    other than a str or None, for a published event. `publish_event` raises it before it
    delivered, started or stored anything for that publish (the cause is `__cause__`)."""

    def __init__(self, workflow: str, event: str, problem: str):
        super().__init__(
            f"publish_event({event!r}): the accumulator key= of workflow {workflow!r} {problem}; "
            "nothing was published (a key is a str, or None for the workflow's shared "
            "accumulator)"
        )
        self.workflow = workflow
        self.event = event


def _positive_ms(what: str, value: object) -> int:
    """`value` as a positive duration in ms, or a ValueError naming `what`."""
    try:
        window = to_ms(value)  # type: ignore[arg-type]  # checked here: any value may come in
    except (TypeError, ValueError, AttributeError):
        window = 0
    if window <= 0:
        raise ValueError(
            f"{what} must be a positive duration (seconds, a timedelta or a string such as "
            f'"30s"), not {value!r}'
        )
    return window


def _check_key(what: str, key: object) -> None:
    if key is not None and not callable(key):
        raise TypeError(
            f"{what}: key must be a callable payload -> str | None, not {type(key).__name__}"
        )


@dataclass(frozen=True, slots=True)
class Debounce:
    """`debounce=Debounce(window, key=None)`: start the workflow once no event came for
    `window` (seconds, a `timedelta` or a string such as "30s"), with the last payload.
    With `key=fn`, each key `fn(payload)` has its own quiet period and its own last payload.
    `debounce="30s"` is `Debounce("30s")`."""

    window: Duration
    key: EventKey | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        _positive_ms("Debounce window", self.window)
        _check_key(f"Debounce({self.window!r})", self.key)

    @property
    def window_ms(self) -> int:
        return to_ms(self.window)


@dataclass(frozen=True, slots=True)
class Batch:
    """`batch=Batch(max_size, within, key=None)`: deliver up to `max_size` events at once, at
    the latest `within` (a duration: seconds, a `timedelta` or a string such as "30s") after
    the first of them. With `key=fn`, each key `fn(payload)` is batched on its own."""

    max_size: int
    within: Duration
    key: EventKey | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        size = self.max_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"Batch.max_size must be an integer >= 1, not {size!r}")
        _positive_ms("Batch.within", self.within)
        _check_key(f"Batch({size}, {self.within!r})", self.key)

    @property
    def within_ms(self) -> int:
        return to_ms(self.within)


@dataclass(frozen=True, slots=True)
class Accumulation:
    """The checked accumulator of a workflow: `kind` is "debounce" or "batch"; `key` the
    optional key function (None: one accumulator for the workflow)."""

    kind: str
    window_ms: int
    max_size: int | None = None
    key: EventKey | None = field(default=None, compare=False)

    @property
    def workflow(self) -> str:
        return DEBOUNCE_WORKFLOW if self.kind == "debounce" else BATCH_WORKFLOW

    def input_for(self, target: str, chain: str, namespace: str, key: str | None) -> dict[str, Any]:
        """The accumulator run's input (camelCase JSON, like every stored shape): its
        settings, and which chain it is (the chain's first run id, also the name its events
        are stored under and its wake token), for which namespace and key."""
        out: dict[str, Any] = {"target": target, "windowMs": self.window_ms}
        if self.max_size is not None:
            out["maxSize"] = self.max_size
        out.update(chain_fields(chain, namespace, key))
        return out


def chain_fields(chain: str, namespace: str, key: str | None) -> dict[str, Any]:
    """The part of an accumulator's input that names its chain (kept across hand-overs)."""
    out: dict[str, Any] = {"chain": chain, "namespace": namespace}
    if key is not None:
        out["key"] = key
    return out


def key_of(acc: Accumulation, workflow: str, event: str, payload: Any) -> str | None:
    """The accumulator key of an event for `workflow` (None: its shared accumulator), or
    `EventKeyError`: a key function that fails must not drop the event silently."""
    if acc.key is None:
        return None
    try:
        key = acc.key(payload)
    except Exception as exc:
        raise EventKeyError(workflow, event, f"raised {type(exc).__name__}: {exc}") from exc
    if key is not None and not isinstance(key, str):
        raise EventKeyError(workflow, event, f"returned {type(key).__name__} {key!r:.60}")
    return key


def event_triggers(where: str, on_event: Iterable[str | EventTrigger]) -> tuple[EventTrigger, ...]:
    """`on_event=` as triggers; a bare str is a trigger without a match."""
    if isinstance(on_event, str):
        raise TypeError(f"{where} on_event=: give a list of event names, not the str {on_event!r}")
    out = []
    for item in on_event:
        if isinstance(item, EventTrigger):
            out.append(item)
        elif isinstance(item, str) and item:
            out.append(EventTrigger(item))
        else:
            raise TypeError(
                f"{where} on_event=: each entry is an event name or a durably.EventTrigger, "
                f"not {item!r}"
            )
    return tuple(out)


def accumulation(
    where: str,
    triggers: tuple[EventTrigger, ...],
    debounce: Duration | Debounce | None,
    batch: Batch | None,
) -> Accumulation | None:
    """The checked `debounce=`/`batch=` of a workflow (None: each event starts a run)."""
    if debounce is None and batch is None:
        return None
    if debounce is not None and batch is not None:
        raise ValueError(f"{where}: debounce= and batch= are mutually exclusive; give one")
    if not triggers:
        option = "debounce" if debounce is not None else "batch"
        raise ValueError(f"{where}: {option}= needs on_event=[...] (the events to accumulate)")
    if batch is not None:
        if not isinstance(batch, Batch):
            raise TypeError(
                f"{where}: batch= takes durably.Batch(max_size, within, key=None), not {batch!r}"
            )
        # Batch checked its fields when it was built
        return Accumulation("batch", batch.within_ms, batch.max_size, batch.key)
    assert debounce is not None
    if isinstance(debounce, Debounce):
        return Accumulation("debounce", debounce.window_ms, key=debounce.key)
    if callable(debounce) or isinstance(debounce, Batch):
        raise TypeError(
            f"{where}: debounce= takes a duration or durably.Debounce(window, key=None), "
            f"not {debounce!r}"
        )
    return Accumulation("debounce", _positive_ms(f"{where}: debounce=", debounce))


# Longest encoded part of an accumulator id (namespace, target, key); a longer part is
# replaced by its hash. The sum, with the prefix and separators, leaves room under the
# 255-byte run-id limit for the chain's `~<n>` suffixes.
_PART_LIMITS = {"namespace": 40, "target": 100, "key": 90}
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-_")


def _part(value: str, limit: int) -> str:
    """`value` escaped for an accumulator id: ASCII letters, digits, '.', '-' and '_' as they
    are, every other character as the %XX of its UTF-8 bytes ('%' included, so the escaping
    is one-to-one, and ':' '~' '#' never appear). Past `limit` characters: '#' and a hash of
    the value (an escaped part never contains '#', so the two forms cannot meet)."""
    out = "".join(
        c if c in _PLAIN else "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
        for c in value
    )
    if len(out) <= limit:
        return out
    return "#" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def accumulator_id(namespace: str | None, target: str, key: str | None = None) -> str:
    """The first run id of an accumulator chain, also the name its events are stored under
    and its wake token: `__evtacc__:<namespace>:<target>` for a target's shared accumulator,
    `__evtacc__:<namespace>:<target>:<key>` for a key's. Distinct (namespace, target, key)
    give distinct ids; every id obeys the run-id rule with room for `~<n>`."""
    parts = [_part(namespace or "default", _PART_LIMITS["namespace"])]
    parts.append(_part(target, _PART_LIMITS["target"]))
    if key is not None:
        parts.append(_part(key, _PART_LIMITS["key"]))
    return ACCUMULATOR_PREFIX + ":".join(parts)


def is_engine_owned_workflow(name: str) -> bool:
    return name.startswith(ENGINE_OWNED_WORKFLOW_PREFIX)


def refuse_engine_owned_start(workflow: object, run_id: str | None) -> None:
    """A start from outside (of a `Workflow` or by name) may neither name a built-in
    workflow nor take an accumulator's run id: either would let a caller feed, fork or
    block a target's event accumulator."""
    workflow = getattr(workflow, "name", workflow)
    if isinstance(workflow, str) and is_engine_owned_workflow(workflow):
        raise ValueError(
            f"workflow {workflow!r} belongs to the engine (names starting with "
            f"{ENGINE_OWNED_WORKFLOW_PREFIX!r} are reserved): the event accumulators are "
            "started by publish_event, never directly"
        )
    if run_id is not None and run_id.startswith(ACCUMULATOR_PREFIX):
        raise ValueError(
            f"run id {run_id!r} is reserved for the engine's event accumulators "
            f"(ids starting with {ACCUMULATOR_PREFIX!r})"
        )


def refuse_reserved_event(name: str, event_id: str | None = None) -> None:
    """The accumulators keep their events (and their chains' markers) under names and ids of
    their own: a publish (or a wait) on such a name would feed or rob one, a publish with
    such an id could take a marker's place."""
    for what, value in (("event name", name), ("event id", event_id)):
        if isinstance(value, str) and value.startswith(ACCUMULATOR_PREFIX):
            raise ValueError(
                f"{what} {value!r} is reserved for the engine's event accumulators "
                f"({what}s starting with {ACCUMULATOR_PREFIX!r})"
            )


__all__ = [
    "ACCUMULATOR_PREFIX",
    "BATCH_WORKFLOW",
    "DEBOUNCE_WORKFLOW",
    "Accumulation",
    "Batch",
    "Debounce",
    "EventKey",
    "EventKeyError",
    "EventTrigger",
    "accumulation",
    "accumulator_id",
    "chain_fields",
    "event_triggers",
    "is_engine_owned_workflow",
    "key_of",
    "refuse_engine_owned_start",
    "refuse_reserved_event",
]
