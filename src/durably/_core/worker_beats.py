"""Worker heartbeats kept in the store: who serves what, as the fleet itself says.

Every engine that drives runs or serves steps writes one row about itself every
`BEAT_INTERVAL_MS` (one upsert, never per step): its namespace, instance id, the workflows
(name and version) and steps it serves, and when it beat. An engine with a transport that
carries worker liveness (Redis) also copies into its row what it sees there: the routing
tokens some live worker beats on, and the workflows their descriptors announce. So a process
that has only the store (a `durably.Client`, the console over a store URL, the CLI) can tell
which workflows the fleet serves and whether a remote step's token has a consumer.

A row is live while its last beat is younger than `LIVE_WINDOW_MS` (several intervals, so a
slow beat or a small clock skew between hosts does not make a worker look gone). Liveness is
judged by wall clocks (`time.time()`), never by an engine's injected clock: a test engine's
fake time must not make the fleet look dead or alive.

Rows are untrusted: anyone with store access can write one (another durably version, a
person with `psql`). `beat_from_row` reads a stored row leniently and bounds it: names that
are not short strings are dropped, every list is capped, and a row that cannot be read at all
is skipped — one odd row can neither break nor flood a check.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from durably._core.log_context import durably_logger
from durably._core.wire import sanitize_queue_token, tenant_group

__all__ = [
    "ALL_NAMESPACES",
    "BEAT_INTERVAL_MS",
    "LIVE_WINDOW_MS",
    "MAX_BEAT_ITEMS",
    "MAX_BEAT_ROWS",
    "MAX_NAME_CHARS",
    "PRUNE_AFTER_MS",
    "UNSERVED_CODE",
    "FleetView",
    "WorkerBeat",
    "beat_from_row",
    "beat_info_json",
    "wall_ms",
]

log = durably_logger("durably.worker")

BEAT_INTERVAL_MS = 5_000
"""How often a worker writes its row."""
LIVE_WINDOW_MS = 20_000
"""A row younger than this is a live worker (four beats: one late beat is not a death)."""
PRUNE_AFTER_MS = 24 * 3600 * 1000
"""Rows of workers silent for this long are deleted when an engine opens: a process without a
fixed instance id gets a fresh one per start, so rows of crashed processes would pile up."""
MAX_BEAT_ROWS = 1000
"""At most this many live rows are read for one check."""
MAX_BEAT_ITEMS = 1000
"""At most this many workflows, steps or tokens are kept from one row."""
MAX_NAME_CHARS = 512
"""A workflow, step, version or token name longer than this is dropped from a row."""

UNSERVED_CODE = "workflow.unserved"
"""The error code of a run parked because no worker serves its workflow (its `blocked`
reason), which the read side turns into the run's wait."""

ALL_NAMESPACES = ""
"""The namespace column of a worker that serves every namespace (`Engine(namespace=None)`)."""


def wall_ms() -> int:
    """Now in epoch milliseconds of the wall clock: what beats are written and judged by."""
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    """One worker's row. `tokens` is None when the worker sees no transport liveness (it
    cannot say which tokens have consumers); else the tokens live workers beat on there."""

    namespace: str
    instance_id: str
    beat_at: int
    started_at: int
    workflows: tuple[tuple[str, str], ...] = ()
    steps: tuple[str, ...] = ()
    tokens: tuple[str, ...] | None = None
    #: Workflows announced by live workers on the transport (remote workflow workers).
    announced: tuple[str, ...] = field(default=())


def beat_info_json(beat: WorkerBeat) -> str:
    """The JSON text of a row's `info` column (everything but the key and the times)."""
    info: dict[str, Any] = {
        "workflows": [{"name": n, "version": v} for n, v in beat.workflows],
        "steps": list(beat.steps),
        "announced": list(beat.announced),
    }
    if beat.tokens is not None:
        info["tokens"] = list(beat.tokens)
    return json.dumps(info, separators=(",", ":"), ensure_ascii=False)


def _name(value: object) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= MAX_NAME_CHARS and "\x00" not in value:
        return value
    return None


def _names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    kept: list[str] = []
    for item in value[:MAX_BEAT_ITEMS]:
        name = _name(item)
        if name is not None:
            kept.append(name)
    return tuple(dict.fromkeys(kept))


def _workflows(value: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list):
        return ()
    kept: list[tuple[str, str]] = []
    for item in value[:MAX_BEAT_ITEMS]:
        if not isinstance(item, Mapping):
            continue
        name, version = _name(item.get("name")), _name(item.get("version"))
        if name is not None and version is not None:
            kept.append((name, version))
    return tuple(dict.fromkeys(kept))


def _ms(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    number = int(value)
    return number if 0 <= number < 2**53 else None


def beat_from_row(
    namespace: object, instance_id: object, beat_at: object, started_at: object, info: object
) -> WorkerBeat | None:
    """A stored row as a `WorkerBeat`, bounded (module docstring); None when it cannot be
    read (a wrong-typed key, an `info` that is not a JSON object)."""
    ns = namespace if isinstance(namespace, str) and len(namespace) <= MAX_NAME_CHARS else None
    iid = _name(instance_id)
    at, since = _ms(beat_at), _ms(started_at)
    if ns is None or iid is None or at is None:
        return None
    try:
        data = json.loads(info) if isinstance(info, str | bytes) else info
    except ValueError:
        data = None
    if not isinstance(data, Mapping):
        log.debug("skipped the unreadable worker beat of %r", iid)
        return None
    tokens = data.get("tokens")
    return WorkerBeat(
        namespace=ns,
        instance_id=iid,
        beat_at=at,
        started_at=since if since is not None else at,
        workflows=_workflows(data.get("workflows")),
        steps=_names(data.get("steps")),
        tokens=_names(tokens) if isinstance(tokens, list) else None,
        announced=_names(data.get("announced")),
    )


@dataclass(frozen=True, slots=True)
class FleetView:
    """What the live rows of a namespace say together."""

    beats: tuple[WorkerBeat, ...]

    @classmethod
    def of(cls, beats: Iterable[WorkerBeat]) -> FleetView:
        return cls(tuple(beats))

    @property
    def visible(self) -> bool:
        """Whether any worker beats: only then can a name be judged unserved."""
        return bool(self.beats)

    @property
    def sees_transport(self) -> bool:
        """Whether a live worker reports the liveness of a transport's tokens."""
        return any(b.tokens is not None for b in self.beats)

    def live_tokens(self) -> set[str]:
        return {t for b in self.beats for t in (b.tokens or ())}

    def workflow_names(self) -> set[str]:
        """Every workflow name some live worker serves or sees announced."""
        return {n for b in self.beats for n, _ in b.workflows} | {
            n for b in self.beats for n in b.announced
        }

    def serves(self, workflow: str, version: str | None, namespace: str | None) -> bool:
        """Whether a live worker runs `workflow` (at `version` when given): registered on a
        worker, announced by a remote workflow worker, or served by convention (a live
        worker beats on the workflow's own token)."""
        for beat in self.beats:
            if any(n == workflow and version in (None, v) for n, v in beat.workflows):
                return True
            if version is None and workflow in beat.announced:
                return True
        token = tenant_group(sanitize_queue_token(workflow), namespace)
        return version is None and token in self.live_tokens()

    def token_consumed(self, token: str) -> bool | None:
        """Whether some live worker beats on `token`; None when no live worker can tell (no
        row reports a transport's liveness)."""
        if not self.sees_transport:
            return None
        return token in self.live_tokens()


def sorted_names(names: Sequence[str]) -> tuple[str, ...]:
    """Distinct names in a stable order, capped (what a worker writes)."""
    return tuple(sorted(set(names)))[:MAX_BEAT_ITEMS]
