"""Worker health and the workflow directory from what live workers say about themselves.

A transport that carries liveness entries and descriptors (Redis) answers, per routing token,
which workers beat on it, what each reports about its load, and what each one's descriptor
says it serves. The engine reads that (`durably._engine.client.reads`); the functions here turn
one answer into `GroupHealth` rows and all answers into the `WorkflowDirectory`. Pure: no
transport, no store, no clock.

Everything a worker published is untrusted (other SDKs, older versions, a person with
`redis-cli`): a status field of the wrong type reads as absent, a descriptor that cannot be
read is skipped, and every list taken from a worker is capped, so one odd worker can neither
break nor flood the answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from durably._core.bounds import MAX_WIRE_INT
from durably._core.handshake import (
    AnnouncedWorkflow,
    HeartbeatSighting,
    WorkerDescriptor,
    aggregate,
    covered_tokens,
    descriptor_hash,
    normalize_descriptor,
    observed_announcements,
)
from durably._core.log_context import durably_logger
from durably._core.wire import (
    WireFormatError,
    partition_of_token,
    sanitize_queue_token,
    tenant_group,
)
from durably._read.list_models import (
    GroupHealth,
    PartitionSighting,
    WorkerConcurrency,
    WorkerDescription,
    WorkerHeartbeat,
    WorkerStatus,
    WorkflowDirectory,
)

log = durably_logger("durably.read")

__all__ = [
    "MAX_FLEET_GROUPS",
    "MAX_LISTED",
    "FleetRead",
    "LiveBeat",
    "description_of",
    "fleet_groups",
    "parse_descriptors",
    "tokens_to_measure",
    "worker_status_of",
    "workflow_directory",
]

MAX_FLEET_GROUPS = 1000
"""At most this many tokens of one transport are listed (and have their queue measured): the
console polls worker health every few seconds, and each token costs a broker round trip."""
MAX_LISTED = 1000
"""At most this many capabilities, workflows or steps of one worker are listed."""


class LiveBeat(Protocol):
    """One live worker's liveness entry on one token, as a transport read it."""

    @property
    def token(self) -> str: ...

    @property
    def instance_id(self) -> str: ...

    @property
    def last_beat_at(self) -> int: ...

    @property
    def status(self) -> Mapping[str, Any] | None: ...

    @property
    def descriptor_hash(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class FleetRead:
    """What one member of the engine's transport pool answered: its live entries, the
    descriptors its workers publish (already read), and the depth of each token measured.
    `error` says why the member could not be read (then nothing else is known)."""

    transport: str
    beats: tuple[LiveBeat, ...] = ()
    descriptors: tuple[WorkerDescriptor, ...] = ()
    depths: Mapping[str, int] = field(default_factory=dict)
    error: str | None = None


# ---------------------------------------------------------------- reading what workers say


def parse_descriptors(raw: Iterable[object]) -> tuple[WorkerDescriptor, ...]:
    """The descriptors that can be read; the others are skipped (a garbled one must not hide
    every other worker)."""
    found: list[WorkerDescriptor] = []
    for item in raw:
        try:
            found.append(normalize_descriptor(item))
        except WireFormatError as exc:
            log.debug("skipped a garbled worker descriptor: %s", exc)
    return tuple(found)


def _count(value: object) -> int | None:
    # A count on the wire is a whole JSON number; bool is an int in Python but not on the wire.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    # Beyond 2**53 no worker means a count (a 1e300 would be shown as a 301-digit number).
    return int(value) if abs(value) <= MAX_WIRE_INT else None


def _measure(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


_ADJUST_KEYS = ("at", "from", "to", "reason")


def _last_adjust(value: object) -> dict[str, Any] | None:
    # Only the documented keys, each a plain scalar: the console shows them as text.
    if not isinstance(value, Mapping):
        return None
    kept = {
        key: value[key]
        for key in _ADJUST_KEYS
        if isinstance(value.get(key), str | int | float) and not isinstance(value[key], bool)
    }
    return kept or None


def worker_status_of(raw: Mapping[str, Any] | None) -> WorkerStatus | None:
    """A worker's self-reported status, with every field of the wrong type dropped; None when
    it states neither its concurrency nor its in-flight count (then nothing it says about its
    load can be shown). Extra keys (durable-worker's `memory`) are left out."""
    if not isinstance(raw, Mapping):
        return None
    conc = raw.get("concurrency")
    conc = conc if isinstance(conc, Mapping) else {}
    limit = _count(conc.get("limit"))
    in_flight = _count(raw.get("inFlight"))
    if limit is None and in_flight is None:
        return None
    mode = conc.get("mode")
    runtime = raw.get("runtime")
    return WorkerStatus(
        concurrency=WorkerConcurrency(
            mode="adaptive" if mode == "adaptive" else "fixed",
            limit=limit or 0,
            min=_count(conc.get("min")),
            max=_count(conc.get("max")),
        ),
        in_flight=in_flight or 0,
        runtime=runtime if runtime in ("node", "python") else None,
        rss_bytes=_count(raw.get("rssBytes")),
        rss_limit_bytes=_count(raw.get("rssLimitBytes")),
        rss_pct=_measure(raw.get("rssPct")),
        cpu_pct=_measure(raw.get("cpuPct")),
        throughput_per_min=_measure(raw.get("throughputPerMin")),
        p95_ms=_measure(raw.get("p95Ms")),
        last_adjust=_last_adjust(raw.get("lastAdjust")),
    )


def description_of(d: WorkerDescriptor) -> WorkerDescription:
    """The operator's view of a descriptor (its announcements go to the workflow directory)."""
    return WorkerDescription(
        runtime=d.runtime,
        sdk=d.sdk.name,
        sdk_version=d.sdk.version,
        protocol=d.protocol.version,
        protocol_range=(d.protocol.low, d.protocol.high),
        capabilities=d.capabilities[:MAX_LISTED],
        workflows=d.workflows[:MAX_LISTED],
        steps=d.steps[:MAX_LISTED],
        partition=d.partition,
        namespace=d.namespace,
        started_at=d.started_at,
    )


# ---------------------------------------------------------------- worker health


def tokens_to_measure(beats: Iterable[LiveBeat], known: Iterable[str] = ()) -> list[str]:
    """The tokens whose queues are measured: every token a live worker beats on and the
    tokens the engine knows it dispatches to (a queue with a backlog and nobody serving it is
    the case worker health exists for), sorted and capped at `MAX_FLEET_GROUPS`."""
    tokens = sorted({b.token for b in beats} | set(known))
    if len(tokens) > MAX_FLEET_GROUPS:
        log.warning(
            "worker health lists the first %d of %d live tokens", MAX_FLEET_GROUPS, len(tokens)
        )
    return tokens[:MAX_FLEET_GROUPS]


def _forms(name: str, d: WorkerDescriptor) -> set[str]:
    """The tokens a worker may consume `name` on: bare, with its partition (durable-worker)
    or with its namespace (a durably step server in a namespace)."""
    base = sanitize_queue_token(name)
    return {base, tenant_group(base, d.partition), tenant_group(base, d.namespace)}


def _kind(
    token: str, descriptors: Iterable[WorkerDescriptor], workflow_tokens: frozenset[str]
) -> Literal["workflow", "step"] | None:
    described = list(descriptors)
    if token in workflow_tokens:
        return "workflow"
    for d in described:
        if any(r.group == token for r in d.registrations or ()):
            return "workflow"
        if any(token in _forms(w, d) for w in d.workflows):
            return "workflow"
    for d in described:
        if any(token in _forms(s, d) for s in d.steps):
            return "step"
    return None


class _Descriptors:
    """The descriptor behind each liveness entry: the one whose content hash the entry
    carries (exact even when the liveness key and the descriptor name the worker
    differently), else the one its instance id names."""

    def __init__(self, descriptors: Iterable[WorkerDescriptor]):
        self._by_hash: dict[str, WorkerDescriptor] = {}
        self._by_instance: dict[str, WorkerDescriptor] = {}
        for d in descriptors:
            self._by_hash.setdefault(descriptor_hash(d), d)
            self._by_instance.setdefault(d.instance_id, d)

    def of(self, beat: LiveBeat) -> WorkerDescriptor | None:
        if beat.descriptor_hash is not None and beat.descriptor_hash in self._by_hash:
            return self._by_hash[beat.descriptor_hash]
        return self._by_instance.get(beat.instance_id)


def fleet_groups(read: FleetRead, *, workflow_tokens: Iterable[str] = ()) -> list[GroupHealth]:
    """One `GroupHealth` per measured token of one transport member (see `tokens_to_measure`):
    its queue depth and the workers beating on it, each with its reported status and what its
    descriptor says. A token the engine knows but nobody beats on is listed only while its
    queue holds tasks. `workflow_tokens`: tokens the engine itself sends workflow turns to."""
    if read.error is not None:
        return []
    known = frozenset(workflow_tokens)
    descriptors = _Descriptors(read.descriptors)
    by_token: dict[str, list[LiveBeat]] = {}
    for beat in read.beats:
        by_token.setdefault(beat.token, []).append(beat)
    out: list[GroupHealth] = []
    for token in sorted(read.depths):
        beats = sorted(by_token.get(token, ()), key=lambda b: b.instance_id)
        depth = read.depths[token]
        if not beats and depth <= 0:
            continue
        workers: list[WorkerHeartbeat] = []
        described: list[WorkerDescriptor] = []
        for beat in beats:
            d = descriptors.of(beat)
            if d is not None:
                described.append(d)
            workers.append(
                WorkerHeartbeat(
                    group=token,
                    instance_id=beat.instance_id,
                    last_beat_at=beat.last_beat_at,
                    status=worker_status_of(beat.status),
                    descriptor=description_of(d) if d is not None else None,
                )
            )
        out.append(
            GroupHealth(
                group=token,
                depth=depth,
                live_workers=tuple(workers),
                kind=_kind(token, described, known),
                transport=read.transport,
            )
        )
    return out


# ---------------------------------------------------------------- the workflow directory


def _in_namespace(d: WorkerDescriptor, namespace: str) -> bool:
    return (d.namespace or "default") == namespace


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _detail(
    reads: Sequence[FleetRead],
    workflows: Sequence[AnnouncedWorkflow],
    others: Sequence[PartitionSighting],
    instances: int,
) -> str:
    parts: list[str] = []
    if not reads:
        return (
            "No transport of this engine says which workers are live (the Redis transport "
            "does), so no announcement can be read here."
        )
    if workflows:
        declared = sum(1 for w in workflows if w.evidence == "declared")
        sentence = (
            f"{_plural(len(workflows), 'workflow')} served by {_plural(instances, 'live worker')}"
        )
        if declared < len(workflows):
            sentence += f" ({len(workflows) - declared} only seen beating, not announced)"
        disagreeing = [w.key for w in workflows if w.disagreements]
        if disagreeing:
            sentence += f"; the workers disagree on {', '.join(disagreeing)}"
        parts.append(sentence + ".")
    else:
        parts.append("No live worker announces a workflow.")
    if others:
        seen = ", ".join(
            f"{o.partition} ({_plural(len(o.groups), 'token')}, "
            f"{_plural(len(o.instances), 'worker')})"
            for o in others
        )
        parts.append(f"Workers were also seen on other partitions: {seen}.")
    for read in reads:
        if read.error is not None:
            parts.append(f"Transport {read.transport!r} could not be read: {read.error}")
    return " ".join(parts)


def workflow_directory(reads: Sequence[FleetRead], *, namespace: str | None) -> WorkflowDirectory:
    """The deployment's workflow directory from every member's answer.

    An engine with a namespace keeps the descriptors of that namespace (a descriptor without
    one belongs to `default`) and the liveness entries on that partition's tokens; entries on
    other partitions are summed up in `other_partitions`. An engine without a namespace (an
    operator's) keeps everything. Workers that beat on a token no descriptor accounts for are
    listed as `observed` (an older worker still serves what it beats for)."""
    kept: list[WorkerDescriptor] = []
    sightings: list[HeartbeatSighting] = []
    elsewhere: dict[str, tuple[set[str], set[str]]] = {}
    for read in reads:
        for d in read.descriptors:
            if namespace is None or _in_namespace(d, namespace):
                kept.append(d)
        for beat in read.beats:
            partition = partition_of_token(beat.token)
            if namespace is None or partition == namespace:
                sightings.append(HeartbeatSighting(beat.token, beat.instance_id))
            else:
                groups, instances = elsewhere.setdefault(partition, (set(), set()))
                groups.add(beat.token)
                instances.add(beat.instance_id)
    announced = aggregate(kept)
    observed = observed_announcements(sightings, covered_tokens(announced, kept))
    workflows = announced + observed
    others = tuple(
        PartitionSighting(partition=p, groups=tuple(sorted(g)), instances=tuple(sorted(i)))
        for p, (g, i) in sorted(elsewhere.items())
    )
    serving = len({i for w in workflows for i in w.instances})
    return WorkflowDirectory(
        supported=bool(reads),
        workflows=workflows,
        other_partitions=others,
        detail=_detail(reads, workflows, others, serving),
    )
