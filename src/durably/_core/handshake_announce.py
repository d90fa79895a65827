"""What the live workers announce they can run, folded into one answer per workflow.

A worker lists the workflows it serves in its descriptor, optionally with a registration per
workflow (version, queue group, required capabilities, declaring package, onError routes). These
functions fold the descriptors the engine read into the deployment's workflow directory, and pick
the onError routes of a workflow the engine serves by convention (it has no registration of its
own, so the workers' announcement is the only source of its routes).

Every entry is something a live worker stated. Nothing is inferred: when two workers state
different values for the same workflow, every value is kept and the disagreement is reported,
and when nobody states a value it stays empty. Pure functions; the caller reads the descriptors.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from durably._core.handshake_descriptor import (
    OnErrorRouteWire,
    WorkerDescriptor,
    WorkflowRegistration,
    canonical_routes,
    route_set_json,
    routes_to_json,
)
from durably._core.wire import sanitize_queue_token, tenant_group

__all__ = [
    "AnnouncedWorkflow",
    "Disagreement",
    "DisagreementAxis",
    "Evidence",
    "HeartbeatSighting",
    "RouteDecision",
    "WorkflowAnnouncement",
    "aggregate",
    "announced_on_error_routes",
    "announcements_of",
    "covered_tokens",
    "observed_announcements",
]

DisagreementAxis = Literal["group", "origin", "requires", "onError"]
Evidence = Literal["declared", "observed"]


@dataclass(frozen=True, slots=True)
class WorkflowAnnouncement:
    """One worker's claim about one workflow: its registration and who made the claim."""

    registration: WorkflowRegistration
    instance_id: str
    runtime: str

    @property
    def name(self) -> str:
        return self.registration.name

    @property
    def version(self) -> str | None:
        return self.registration.version


def announcements_of(d: WorkerDescriptor) -> tuple[WorkflowAnnouncement, ...]:
    """What one descriptor announces: each of its registrations, plus a bare unversioned claim
    for every `workflows` name no registration covers (a worker may describe some workflows
    fully and others by name only, and both are served). A descriptor with neither announces
    nothing, as a control plane's does."""
    out = [
        WorkflowAnnouncement(registration=reg, instance_id=d.instance_id, runtime=d.runtime)
        for reg in d.registrations or ()
    ]
    covered = {a.name for a in out}
    for name in d.workflows:
        if name not in covered:
            covered.add(name)
            out.append(
                WorkflowAnnouncement(
                    registration=WorkflowRegistration(name=name),
                    instance_id=d.instance_id,
                    runtime=d.runtime,
                )
            )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Disagreement:
    """An axis on which the live announcers of one workflow differ, with every distinct value
    stated (sorted). A worker that states nothing on an axis does not disagree with one that
    does."""

    axis: DisagreementAxis
    values: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"axis": self.axis, "values": list(self.values)}


@dataclass(frozen=True, slots=True)
class AnnouncedWorkflow:
    """One workflow in the directory.

    `declared`: at least one live worker described it; every field is what some worker stated.
    `observed`: no descriptor names it, but a live heartbeat runs on a token of that name, which
    is enough for convention routing to dispatch to it; nothing else is known, so everything but
    the token and the instances is empty.

    `key` is `name@version`, or the bare name when unversioned. `on_error` holds every distinct
    route set stated (a stated empty list is a set too)."""

    evidence: Evidence
    key: str
    name: str
    version: str | None
    groups: tuple[str, ...]
    origins: tuple[str, ...]
    requires: tuple[tuple[str, ...], ...]
    on_error: tuple[tuple[OnErrorRouteWire, ...], ...]
    runtimes: tuple[str, ...]
    instances: tuple[str, ...]
    disagreements: tuple[Disagreement, ...]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"evidence": self.evidence, "key": self.key, "name": self.name}
        if self.version is not None:
            out["version"] = self.version
        out.update(
            groups=list(self.groups),
            origins=list(self.origins),
            requires=[list(r) for r in self.requires],
            onError=[routes_to_json(routes) for routes in self.on_error],
            runtimes=list(self.runtimes),
            instances=list(self.instances),
            disagreements=[d.to_json() for d in self.disagreements],
        )
        return out


def _stated(values: Iterable[str | None]) -> tuple[str, ...]:
    return tuple(sorted({v for v in values if v is not None}))


def _fold(name: str, version: str | None, items: list[WorkflowAnnouncement]) -> AnnouncedWorkflow:
    regs = [a.registration for a in items]
    groups = _stated(r.group for r in regs)
    origins = _stated(r.origin for r in regs)
    # A capability demand and a route list are sets: the same members written in another order
    # are the same statement, not a disagreement.
    requires_sets = {tuple(sorted(set(r.requires))) for r in regs if r.requires is not None}
    requires = tuple(sorted(requires_sets, key=",".join))
    routes_by_json = {
        route_set_json(r.on_error): canonical_routes(r.on_error)
        for r in regs
        if r.on_error is not None
    }
    route_keys = sorted(routes_by_json)

    disagreements: list[Disagreement] = []
    if len(groups) > 1:
        disagreements.append(Disagreement("group", groups))
    if len(origins) > 1:
        disagreements.append(Disagreement("origin", origins))
    if len(requires) > 1:
        disagreements.append(Disagreement("requires", tuple(",".join(r) for r in requires)))
    if len(route_keys) > 1:
        disagreements.append(Disagreement("onError", tuple(route_keys)))

    return AnnouncedWorkflow(
        evidence="declared",
        key=name if version is None else f"{name}@{version}",
        name=name,
        version=version,
        groups=groups,
        origins=origins,
        requires=requires,
        on_error=tuple(routes_by_json[k] for k in route_keys),
        runtimes=_stated(a.runtime for a in items),
        instances=_stated(a.instance_id for a in items),
        disagreements=tuple(disagreements),
    )


def aggregate(descriptors: Iterable[WorkerDescriptor]) -> tuple[AnnouncedWorkflow, ...]:
    """Every announced workflow, one entry per name and version, sorted by key. The same worker
    announcing a workflow several times (it publishes its descriptor under every token it
    consumes) counts once: `instances` counts workers, not keys."""
    buckets: dict[tuple[str, str | None], list[WorkflowAnnouncement]] = {}
    for d in descriptors:
        for a in announcements_of(d):
            buckets.setdefault((a.name, a.version), []).append(a)
    # Grouped by (name, version) rather than by the key text, so an unversioned workflow named
    # `a@1` is never folded into version 1 of `a`.
    folded = [_fold(name, version, items) for (name, version), items in buckets.items()]
    return tuple(sorted(folded, key=lambda w: (w.key, w.name)))


class HeartbeatSighting(NamedTuple):
    """A live heartbeat key: the token it was published under and the worker that wrote it."""

    token: str
    instance_id: str


def covered_tokens(
    announced: Iterable[AnnouncedWorkflow], descriptors: Iterable[WorkerDescriptor]
) -> frozenset[str]:
    """The tokens the descriptors already account for: each announced name as a queue token,
    each announced group, and each step's token bare and with the worker's partition (a worker
    beats on one token per name it serves, steps included). A heartbeat on any of these is not a
    separate workflow."""
    tokens: set[str] = set()
    for entry in announced:
        tokens.add(sanitize_queue_token(entry.name))
        tokens.update(entry.groups)
    for d in descriptors:
        for step in d.steps:
            token = sanitize_queue_token(step)
            tokens.add(token)
            tokens.add(tenant_group(token, d.partition))
    return frozenset(tokens)


def observed_announcements(
    sightings: Iterable[HeartbeatSighting], covered: frozenset[str]
) -> tuple[AnnouncedWorkflow, ...]:
    """One `observed` entry per live token no descriptor accounts for, named by the token itself
    (a workflow `orders:fulfill` is observed as `orders-fulfill`: the sanitized name cannot be
    turned back). A worker too old to publish a descriptor still serves what it beats for, and
    convention routing would dispatch there, so the directory lists it rather than hide it."""
    by_token: dict[str, set[str]] = {}
    for beat in sightings:
        if beat.token and beat.token not in covered:
            by_token.setdefault(beat.token, set()).add(beat.instance_id)
    return tuple(
        AnnouncedWorkflow(
            evidence="observed",
            key=token,
            name=token,
            version=None,
            groups=(token,),
            origins=(),
            requires=(),
            on_error=(),
            runtimes=(),
            instances=tuple(sorted(instances)),
            disagreements=(),
        )
        for token, instances in sorted(by_token.items())
    )


# ------------------------------------------------------------------ onError routes


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The onError routes the live workers announce for one workflow version. Empty `routes`
    means nothing is routed; `unrouted` is set when workers disagree, so the failure is reported
    as unrouted with that reason instead of silently failing."""

    routes: tuple[OnErrorRouteWire, ...] = ()
    unrouted: str | None = None


def announced_on_error_routes(
    descriptors: Iterable[WorkerDescriptor], workflow: str, version: str
) -> RouteDecision:
    """The routes for a failed run of `workflow` at `version`, for a workflow served by
    convention (no local registration), from the descriptors live on its group.

    Registrations of this workflow count when they state `version` or state no version at all:
    durable-worker states a version only when told one, and a convention run's version is a
    placeholder, so ignoring unversioned announcements would disable onError for those workers.
    Registrations of another stated version are ignored. If the counted registrations state
    exactly one distinct route set (as a set: order and duplicates do not matter) it is used;
    none → no routing; several (a rollout in progress) → no routing, with a reason, because
    routing by either set would act on a claim other live workers contradict."""
    stated: dict[str, tuple[tuple[OnErrorRouteWire, ...], set[str]]] = {}
    for d in descriptors:
        for a in announcements_of(d):
            reg = a.registration
            if reg.name != workflow or reg.on_error is None:
                continue
            if reg.version is not None and reg.version != version:
                continue
            key = route_set_json(reg.on_error)
            routes, instances = stated.setdefault(key, (canonical_routes(reg.on_error), set()))
            instances.add(a.instance_id)
    if not stated:
        return RouteDecision()
    if len(stated) == 1:
        ((routes, _),) = stated.values()
        return RouteDecision(routes=routes)
    claims = "; ".join(
        f"{key} from {', '.join(sorted(instances))}"
        for key, (_, instances) in sorted(stated.items())
    )
    return RouteDecision(
        unrouted=(
            f"the live workers of {workflow} (version {version}) announce {len(stated)} "
            f"different onError route sets: {claims}; not routing until they agree"
        )
    )
