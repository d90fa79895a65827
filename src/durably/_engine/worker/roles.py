"""What an engine with a transport takes from the fleet's queues: its role, said explicitly.

- `"worker"`: a step worker. It serves the steps registered in it (`steps=`, or every decorated
  step) and nothing else: it never takes a step result, a remote workflow's decision or a
  tenant's request, and it drives no run (so it needs no shared store: `Engine("memory",
  transport=…, role="worker", steps=[…])`). With `drive=False` it serves nothing either: an
  observer that reads the fleet's health and starts runs, consuming nothing.
- `"control"`: a control plane. It drives runs, takes the fleet's step results and remote
  workflow decisions and answers tenants; it serves no step (steps go to workers).
- `"both"` (the default): drives runs, takes results and decisions, and serves its steps.

Results and decisions come back on queues the whole fleet shares, and whoever takes one
acknowledges it, so only engines on the fleet's shared store may take them. The role used to be
inferred from `workflows=[]` ("no workflows: a pure step worker"), which made a control plane
that serves only remote workflows routed by convention — configured the natural way, with
`workflows=[]` — silently ignore every decision: its runs stayed `suspended` for ever. The
role is now one option, and a contradictory combination is refused when the engine is built.

Decision on the default: `"both"`, so an engine given workflows keeps working unchanged and an
engine given `workflows=[]` takes results and decisions. An existing pure step worker written
the old way (`workflows=[]` on a store of its own) would now take results it can only drop:
that shape — no role given, `workflows=[]`, a transport and the in-memory store — is refused
with a message asking for `role="worker"` (or `"both"` for a single process that is the whole
fleet), and `workflows=[]` with a transport and no role on a shared store is warned about at
open. `DURABLY_ROLE` in the environment gives the role when `role=` is left out (what `durably
worker --role` sets).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Final, Literal, get_args

from durably._core.log_context import durably_logger

__all__ = ["ROLES", "ROLE_ENV", "Role", "announce_role", "resolve_role"]

log = durably_logger("durably.worker")

Role = Literal["worker", "control", "both"]
ROLES: Final[tuple[Role, ...]] = get_args(Role)
ROLE_ENV: Final = "DURABLY_ROLE"


def _named(value: object, source: str) -> Role:
    for role in ROLES:
        if value == role:
            return role
    shown = " or ".join(repr(r) for r in ROLES)
    raise ValueError(f"{source} must be {shown}, not {value!r}")


def resolve_role(
    role: object,
    *,
    drive: bool,
    workflows: int | None,
    steps: int | None,
    transport: bool,
    memory_store: bool,
) -> tuple[Role, bool]:
    """(the role, whether it was given) for an engine built with these options; ValueError
    for an unknown role or a contradictory combination.

    `workflows` / `steps`: how many were given (None: the default registry)."""
    given = role is not None
    if role is None:
        env = os.environ.get(ROLE_ENV, "").strip()
        if env:
            role = _named(env, f"the environment variable {ROLE_ENV}")
    resolved = _named(role, "Engine(role=…)") if role is not None else "both"
    given = given or role is not None
    if resolved == "worker":
        if not transport:
            raise ValueError(
                "Engine(role='worker') serves steps over a transport, and none was given: "
                "pass transport=…, or leave role= out for an engine that runs everything here"
            )
        if drive and workflows:
            raise ValueError(
                "Engine(role='worker') takes no step result and drives no run, so the "
                f"{workflows} workflow(s) given in workflows=[…] could never run here: give "
                "them to a control plane (role='control' or 'both') and leave them out here, "
                "or pass drive=False for an observer that only starts and reads runs"
            )
    elif resolved == "control":
        if not transport:
            raise ValueError(
                "Engine(role='control') hands every step to workers over a transport, and none "
                "was given: pass transport=…, or leave role= out (without a transport every "
                "step runs in this process)"
            )
        if steps:
            raise ValueError(
                f"Engine(role='control') serves no step, but steps=[…] names {steps}: use "
                "role='both' for an engine that also serves them, or leave steps= out"
            )
    elif not given and transport and workflows == 0 and memory_store:
        raise ValueError(
            "Engine(workflows=[]) with a transport on the in-memory store: say which role it "
            "has. role='worker' makes a pure step worker (it serves steps and takes no step "
            "result or workflow decision, which a store of its own could only drop); "
            "role='both' or 'control' takes them, for a process that is the whole fleet's "
            "store. (workflows=[] alone no longer makes a step worker.)"
        )
    return resolved, given


def announce_role(
    instance_id: str,
    role: Role,
    *,
    given: bool,
    namespace: str | None,
    transports: Sequence[tuple[str, object]] | None,
    no_workflows: bool,
) -> None:
    """At open: one INFO line naming what this process is, and a WARNING for the shape whose
    meaning changed — `workflows=[]` with a transport and no role used to make a pure step
    worker, and now takes the fleet's step results and decisions too."""
    where = (
        ", ".join(f"{mid} ({type(member).__name__})" for mid, member in transports)
        if transports is not None
        else "none (steps run in this process)"
    )
    default = "" if given else " (the default)"
    log.info(
        "durably engine %s: role=%s%s, namespace=%s, transport=%s",
        instance_id,
        role,
        default,
        namespace,
        where,
    )
    if transports is not None and not given and no_workflows:
        log.warning(
            "durably engine %s was given workflows=[] and a transport but no role: it takes "
            "the fleet's step results and workflow decisions (role='both'). A pure step "
            "worker must say role='worker'; say role='both' or role='control' to silence this",
            instance_id,
        )
