"""Which runs are remote workflows, and which routing token each of their turns is queued on.

A run is driven by remote turns when, in this order:

1. its workflow is registered here as a `RemoteWorkflow` (`durably.remote_workflow(...)`): the
   token is the registration's group (`tenant_group(sanitize(group), None)`), or without one
   the workflow's own name suffixed with the run's namespace, which is the queue a
   durable-worker `Worker(partition=<namespace>)` consumes for it;
2. it has no registration here and an ancestor run (a parent named by its parent tag, and so
   on up) is a registered remote workflow: the child goes where the ancestor goes (a split
   `WorkflowWorker(group=G)` serves every workflow it holds on G);
3. it has no registration here, and a live worker beats on the convention token
   `tenant_group(sanitize(workflow), run.namespace)`: a workflow served by convention.

A workflow registered here with a body (`@durably.workflow`) always runs here, and a run none of
these matches is not a remote run (the turn driver reports it as unregistered). Convention is
recomputed on every drive from what the live workers say; nothing is cached into the registry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from durably._core.handshake import (
    RouteDecision,
    WorkerDescriptor,
    aggregate,
    announced_on_error_routes,
    normalize_descriptor,
)
from durably._core.log_context import durably_logger
from durably._core.models import WorkflowRun
from durably._core.wire import WireFormatError, sanitize_queue_token, tenant_group
from durably._engine.defs.registry import OnErrorRoute
from durably._engine.defs.remote_workflows import RemoteWorkflow
from durably._engine.defs.vocab import PARENT_TAG_PREFIX
from durably._transport.protocol import WorkerDirectory

log = durably_logger("durably.remote")

__all__ = [
    "MAX_ANCESTORS",
    "UNDECLARED_VERSION_TAG",
    "LiveWorkers",
    "TurnRoute",
    "WorkerDirectory",
    "as_routes",
    "call_group_refusal",
    "convention_token",
    "parent_of",
    "start_version",
]

# A run served by convention whose workers announce no single version starts on "1" and is
# tagged with this, so an operator can tell a placeholder version from a declared one.
UNDECLARED_VERSION_TAG = "version:undeclared"

# How far up the parent chain a child looks for a remote ancestor to inherit from.
MAX_ANCESTORS = 16

# Live tokens change when workers start or stop (their keys expire within ~35 s); re-reading
# them for every drive of every unregistered run would cost a broker scan each time.
_LIVE_TTL_S = 1.0
# The onError routes workers announce change only with a deploy.
_DESCRIPTORS_TTL_S = 5.0


def convention_token(workflow: str, namespace: str | None) -> str:
    """The token a workflow without a registration is served on by convention."""
    return tenant_group(sanitize_queue_token(workflow), namespace)


def call_group_refusal(group: str, namespace: str | None, route_group: str | None) -> str | None:
    """Why a `call` of a run in `namespace` may not name the partition `group`, else None.

    A call's step task goes to `tenant_group(sanitize(step name), group)`, so whoever writes a
    decision picks the queue. Decision: a call stays inside its run's namespace.

    - A run in a named namespace N: `group` is N (the unified worker's partition, `<step>@N`)
      or ends with `@N` (a partition within N, `<step>@<g>@N`); so every token it can reach
      ends with `@N`. `"default"` is refused too: that is the default namespace's queue.
    - A run in the default namespace: `group` is `"default"` (the bare `<step>` queue), or the
      group this engine registered the run's remote workflow with (`remote_workflow(...,
      group=G)`: its split `WorkflowWorker(group=G)` sends G, so `<step>@G`); any other group
      could name another namespace's partition and is refused.
    """
    if namespace in (None, "", "default"):
        if group == "default":
            return None
        if route_group is not None and sanitize_queue_token(group) == sanitize_queue_token(
            route_group
        ):
            return None
        return (
            f"group {group!r} is not a partition of the default namespace (only 'default'"
            + (f" or the workflow's group {route_group!r}" if route_group else "")
            + ")"
        )
    if group == namespace or group.endswith(f"@{namespace}"):
        return None
    return f"group {group!r} is outside the run's namespace {namespace!r} (use {namespace!r})"


def parent_of(run: WorkflowRun) -> str | None:
    """The id of the run that started `run` (its parent tag), else None."""
    for tag in run.tags or ():
        if tag.startswith(PARENT_TAG_PREFIX):
            return tag[len(PARENT_TAG_PREFIX) :]
    return None


@dataclass(frozen=True, slots=True)
class TurnRoute:
    """Where a remote run's turns go, and why."""

    token: str
    how: Literal["registered", "inherited", "convention"]
    registration: RemoteWorkflow | None = None


class LiveWorkers:
    """Reads of the worker directory, cached briefly (see the TTLs above). A read that fails
    counts as "no live worker": the run is then simply not dispatched this time."""

    def __init__(
        self, directory: WorkerDirectory | None, *, now: Callable[[], float] = time.monotonic
    ):
        self._directory = directory
        self._now = now
        self._tokens: tuple[float, frozenset[str]] | None = None
        self._descriptors: dict[str, tuple[float, tuple[WorkerDescriptor, ...]]] = {}

    async def serves(self, token: str) -> bool:
        if self._directory is None:
            return False
        now = self._now()
        if self._tokens is None or now - self._tokens[0] > _LIVE_TTL_S:
            try:
                tokens = frozenset(await self._directory.list_worker_groups())
            except Exception as exc:
                log.warning("could not read which worker groups are live: %s", exc)
                tokens = frozenset()
            self._tokens = (now, tokens)
        return token in self._tokens[1]

    async def descriptors(self, token: str) -> tuple[WorkerDescriptor, ...]:
        if self._directory is None:
            return ()
        now = self._now()
        cached = self._descriptors.get(token)
        if cached is not None and now - cached[0] <= _DESCRIPTORS_TTL_S:
            return cached[1]
        try:
            raw = await self._directory.read_worker_descriptors(token)
        except Exception as exc:
            log.warning("could not read the worker descriptors of %s: %s", token, exc)
            raw = []
        parsed: list[WorkerDescriptor] = []
        for item in raw:
            try:
                parsed.append(normalize_descriptor(item))
            except WireFormatError as exc:
                log.debug("skipped a garbled worker descriptor on %s: %s", token, exc)
        found = tuple(parsed)
        self._descriptors[token] = (now, found)
        return found

    async def announced_version(self, workflow: str, token: str) -> str | None:
        """The one version the workers on `token` announce for `workflow`, else None (none
        stated, or several: a rollout in progress)."""
        versions = {
            entry.version
            for entry in aggregate(await self.descriptors(token))
            if entry.name == workflow and entry.version is not None
        }
        return versions.pop() if len(versions) == 1 else None

    async def announced_routes(self, workflow: str, version: str, token: str) -> RouteDecision:
        return announced_on_error_routes(await self.descriptors(token), workflow, version)


def as_routes(decision: RouteDecision) -> tuple[OnErrorRoute, ...]:
    """Announced routes as the engine's own route type."""
    return tuple(OnErrorRoute(workflow=r.workflow, code=r.code) for r in decision.routes)


async def start_version(live: LiveWorkers, workflow: str, token: str) -> tuple[str, Sequence[str]]:
    """The version a run served by convention starts on, and the tags that go with it."""
    announced = await live.announced_version(workflow, token)
    if announced is not None:
        return announced, ()
    return "1", (UNDECLARED_VERSION_TAG,)
