"""Event triggers: what a workflow declares with `on_event=`, `debounce=` and `batch=`.

Pure data and checks (no I/O): the runtime's end is `durably._engine.triggers`.

- `on_event=["order.paid", EventTrigger("order.paid", match=...)]`: a plain name starts the
  workflow for every published event of that name; an `EventTrigger` starts it only for the
  events its `match` accepts. `match` is either a mapping (every key must equal the
  payload's value, compared as JSON — the rule `ctx.wait_for_event(match=)` uses) or a
  callable `match(payload) -> bool` on the event's JSON payload.
- `debounce="30s"`: the workflow is started once the events stop for that long, with the
  LAST payload.
- `batch=Batch(max_size=100, within="1m")`: the workflow is started with
  `{"events": [...]}` (publish order) once `max_size` events arrived or `within` passed
  since the first of them, whichever comes first.

Debounce and batch are per target workflow (every event name it listens to feeds one
accumulator) and are mutually exclusive.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durably._core.durations import Duration, to_ms

# Built-in workflows the engine registers for the accumulators. A name starting with two
# underscores belongs to the engine: `@durably.workflow` refuses such names and `start`
# refuses to start them from outside.
DEBOUNCE_WORKFLOW = "__evt_debounce"
BATCH_WORKFLOW = "__evt_batch"
ENGINE_OWNED_WORKFLOW_PREFIX = "__"

# The run id of a target's accumulator chain (`__evtacc__:<target>`, then `~1`, `~2`, …)
# and the signal token its events travel on. The token prefix is reserved
# (`durably._core.tokens`), so nobody can signal an accumulator from outside.
ACCUMULATOR_PREFIX = "__evtacc__:"

EventMatch = Mapping[str, Any] | Callable[[Any], bool]


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


@dataclass(frozen=True, slots=True)
class Batch:
    """`batch=Batch(max_size, within)`: deliver up to `max_size` events at once, at the
    latest `within` (a duration: seconds, a `timedelta` or a string such as "30s") after
    the first of them."""

    max_size: int
    within: Duration

    @property
    def within_ms(self) -> int:
        return to_ms(self.within)


@dataclass(frozen=True, slots=True)
class Accumulation:
    """The checked accumulator of a workflow: `kind` is "debounce" or "batch"."""

    kind: str
    window_ms: int
    max_size: int | None = None

    @property
    def workflow(self) -> str:
        return DEBOUNCE_WORKFLOW if self.kind == "debounce" else BATCH_WORKFLOW

    def input_for(self, target: str) -> dict[str, Any]:
        """The accumulator run's input (camelCase JSON, like every stored shape)."""
        out: dict[str, Any] = {"target": target, "windowMs": self.window_ms}
        if self.max_size is not None:
            out["maxSize"] = self.max_size
        return out


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
    debounce: Duration | None,
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
            raise TypeError(f"{where}: batch= takes durably.Batch(max_size, within), not {batch!r}")
        size = batch.max_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{where}: Batch.max_size must be an integer >= 1, not {size!r}")
        window = batch.within_ms
        if window <= 0:
            raise ValueError(
                f"{where}: Batch.within must be a positive duration, not {batch.within!r}"
            )
        return Accumulation("batch", window, size)
    assert debounce is not None
    window = to_ms(debounce)
    if window <= 0:
        raise ValueError(f"{where}: debounce= must be a positive duration, not {debounce!r}")
    return Accumulation("debounce", window)


def accumulator_id(target: str) -> str:
    """The first run id of `target`'s accumulator chain, which is also its signal token."""
    return f"{ACCUMULATOR_PREFIX}{target}"


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


__all__ = [
    "ACCUMULATOR_PREFIX",
    "BATCH_WORKFLOW",
    "DEBOUNCE_WORKFLOW",
    "Accumulation",
    "Batch",
    "EventTrigger",
    "accumulation",
    "accumulator_id",
    "event_triggers",
    "is_engine_owned_workflow",
    "refuse_engine_owned_start",
]
