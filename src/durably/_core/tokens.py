"""Signal tokens: the engine's own (reserved) waiter namespaces and a token's namespace.

A `SignalWaiter` is keyed by its token alone, so whoever can call `Engine.signal(token, …)`
can complete any wait whose token they can guess. The engine mints tokens for its own waits
(a parent awaiting a child, a breakpoint, an update, an event wait, …); those are delivered
by the engine itself, through its internal path, after it checked that the thing really
happened. External signals (`Engine.signal`, `durably runs signal`, the console's webhook)
must never address them — `reserved_token_kind` names the kind so the refusal can say why.

Not reserved, deliberately:
- `wh:<runId>:<seq>` (a `ctx.webhook()` token): it exists to be delivered from outside.
- any other token: a plain signal name chosen by the workflow author.
"""

from __future__ import annotations

# (prefix, human name of the kind, how to reach such a wait the supported way)
_RESERVED: tuple[tuple[str, str, str], ...] = (
    (
        "child:",
        "child-workflow completion",
        "the engine delivers it when the child run settles",
    ),
    ("bp:", "breakpoint", "release a breakpoint with engine.continue_run(run_id)"),
    ("update:", "workflow update", "deliver an update with engine.update(run_id, name, arg)"),
    ("event:", "named-event wait", "publish the event with engine.publish_event(name, payload)"),
    ("task:", "external-task completion", "the engine delivers task completions itself"),
    ("entityreply:", "entity reply", "the engine delivers entity replies itself"),
    ("__evtacc__:", "event accumulator", "publish the event with engine.publish_event(name, …)"),
    # Durable timers are checkpoint rows with a wake time (`sleep`, `timeout:<token>`), never
    # waiter tokens; these prefixes are still kept for the engine so that no caller-chosen
    # token can ever be mistaken for one of its timers.
    ("timer:", "durable timer", "timers fire on their own"),
    ("sleep:", "durable timer", "timers fire on their own"),
    ("timeout:", "durable timer", "timers fire on their own"),
)

# An onError handler's completion travels on `child:<runId>.onError.<attempt>` (the handler
# is started like a child); it is named separately so the refusal is precise.
_HANDOFF_MARK = ".onError."


def reserved_token_kind(token: str) -> str | None:
    """The human name of the engine-owned kind `token` belongs to, else None (a plain
    signal token that external callers may use)."""
    for prefix, kind, _hint in _RESERVED:
        if token.startswith(prefix):
            if prefix == "child:" and _HANDOFF_MARK in token:
                return "onError handler completion"
            return kind
    return None


def reserved_token_hint(token: str) -> str | None:
    """The supported way to reach the wait a reserved `token` names (for error messages)."""
    for prefix, _kind, hint in _RESERVED:
        if token.startswith(prefix):
            return hint
    return None


def reserved_prefixes() -> tuple[str, ...]:
    """Every reserved token prefix (for documentation and tests)."""
    return tuple(prefix for prefix, _kind, _hint in _RESERVED)


def token_namespace(token: str) -> str:
    """The namespace a signal buffer cap counts a token in: the text before its first ':'.

    Decision: a token without ':' is its own namespace (`"approve-42"` → `"approve-42"`),
    so such tokens are bounded by the per-token cap only; `"approve:42"` and `"approve"`
    share the namespace `"approve"`.
    """
    head, sep, _rest = token.partition(":")
    return head if sep else token


__all__ = ["reserved_prefixes", "reserved_token_hint", "reserved_token_kind", "token_namespace"]
