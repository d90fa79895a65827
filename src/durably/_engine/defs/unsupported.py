"""Options the public API declares that durably does not implement yet, refused loudly.

An option that is accepted and then ignored is worse than an error: the caller believes a
step is prioritised, rate limited or routed to a GPU worker while nothing of the kind happens.
So every such option raises `NotImplementedError` where it is given (the decorator, the
`Engine(...)` call, `start`, the ctx call), and the message names the feature in plain words
and says what durably does instead. `None` (the default) is always accepted, so code written
against the full API runs as long as it does not rely on the missing feature.

When a feature is implemented, delete its refusal here and the test that pins it in
tests/defs/test_refusals.py.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

PRIORITY = (
    "step priority is not supported yet outside a flow-control queue: a step without a "
    "queue runs as soon as its workflow calls it (a step sent to another machine carries "
    "its run's priority); within a queue, ctx.step(..., queue=..., priority=...) orders "
    "its waiters. Give the run a priority instead "
    "(start(..., priority=...), ctx.child(..., priority=...)), or omit it here"
)

CONCURRENCY_OVER_TRANSPORT = (
    "worker concurrency over a transport is not supported yet: with a transport this "
    "engine's steps run in the processes serving them (a durably engine serves up to "
    "step_threads at once); concurrency= limits the step handlers an engine without a "
    "transport runs itself"
)

TOPOLOGY = (
    "topology roles are given as role=: Engine(role='worker') serves steps only, "
    "role='control' drives runs and serves no step, role='both' (the default) does both"
)

# Engine options of planned features that durably does not implement yet: each is refused
# with a message naming the feature (never silently ignored). Any other keyword the engine
# does not declare is a typo and gets a plain TypeError with a suggestion.
_ENGINE_OPTIONS: dict[str, str] = {
    "control_plane": TOPOLOGY,
    "topology": TOPOLOGY,
    "partition": (
        "serving partitions are not supported yet: a worker serves its steps on the tokens of "
        "its engine's namespace (`<step>@<namespace>`); a separate partition is planned"
    ),
    "remote_advance_silence_ms": (
        "a separate silence window for remote turns is not supported yet: a turn with no "
        "decision is issued again at the reconcile wake (reconcile_ms)"
    ),
    "blocked_poll_ms": (
        "a configurable re-check of blocked runs is not supported yet: a blocked run is "
        "re-checked every 5 seconds"
    ),
}

# Names other engines use for an option durably has under another name.
_RENAMED: dict[str, str] = {
    "shutdown_timeout_ms": "drain_timeout_ms",
    # one keyword takes a transport, a URL or an ordered pool [(id, transport), …]
    "transports": "transport",
    "connection": "transport",
    # debounce and batch belong to the workflow whose events they collect
    "debounce": "@durably.workflow(debounce=...)",
    "batch": "@durably.workflow(batch=...)",
    "event_batch": "@durably.workflow(batch=...)",
}


def refuse_priority(priority: int | None, where: str) -> None:
    """A step's `priority=` is part of the API but nothing orders steps by it yet (runs are
    ordered by theirs)."""
    if priority is not None:
        raise NotImplementedError(f"{where}: {PRIORITY}")


def refuse_engine_options(given: Iterable[str], known: Iterable[str]) -> None:
    """Refuse the keywords `Engine(...)` does not declare (its `**unsupported`, which mypy
    already rejects): a NotImplementedError naming the feature for an option of a feature
    durably lacks, a TypeError with the closest option name for anything else."""
    known = sorted(known)
    unknown = sorted(set(given) - set(known))
    for option in unknown:
        feature = _ENGINE_OPTIONS.get(option)
        if feature is not None:
            raise NotImplementedError(f"Engine({option}=...): {feature}")
    if unknown:
        hints = []
        for option in unknown:
            close = _RENAMED.get(option) or next(
                iter(difflib.get_close_matches(option, known, n=1)), None
            )
            hints.append(f"{option} (did you mean {close}?)" if close else option)
        raise TypeError(
            f"unknown Engine option(s): {', '.join(hints)}; the tuning options are "
            f"{', '.join(known)}"
        )
