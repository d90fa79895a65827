"""Singleton workflows: runs of one key take turns, `limit` at a time, in creation order.

- **At each turn** (`line_tag`, then `admit`, from the turn driver before the body runs):
  a run that already holds a slot (the store's admission marker tag) goes on at once; any
  other asks the store (`try_admit_singleton`), which decides and writes in ONE
  transaction — admitted, it gets the marker; denied, it is written `suspended` with a
  jittered retry wake and its lease dropped, unless it is being cancelled (a concurrent
  cancel is never revived). A run being cancelled skips the gate: it only unwinds. The
  marker stays through sleeps, waits, recovery and lease moves, so a run that started its
  body is never stopped half-way.
- **On release** (`released`, from every path that ends a run: settle and cancel): the
  key's waiters whose turn it is now get `wake_at = now` (so the timer poll of any engine
  is a guaranteed pick-up) and a `ready` wake on the store's wake bus. Best effort: a
  waiter missed here still retries at its own wake, about a second later.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

from durably._core.log_context import durably_logger
from durably._core.models import RunPatch, replace
from durably._core.quota import SINGLETON_ADMITTED_TAG, SINGLETON_TAG_PREFIX, singleton_tag
from durably._engine.defs.registry import DEFAULT_REGISTRY
from durably._engine.flow.quotas import singleton_key

if TYPE_CHECKING:
    from durably._core.models import WorkflowRun
    from durably._engine.defs.registry import Workflow
    from durably._store.protocol import AdmissionStore

__all__ = [
    "RETRY_JITTER_MS",
    "RETRY_MS",
    "admit",
    "line_tag",
    "released",
    "retry_delay_ms",
    "without_marker",
]

log = durably_logger("durably.flow")

# A denied run looks again after about a second; the jitter keeps a line of waiters from
# asking in lockstep.
RETRY_MS = 1_000
RETRY_JITTER_MS = 250


def retry_delay_ms() -> int:
    return RETRY_MS + random.randint(-RETRY_JITTER_MS, RETRY_JITTER_MS)


def _tag_of(run: WorkflowRun) -> str | None:
    return next((t for t in run.tags or () if t.startswith(SINGLETON_TAG_PREFIX)), None)


def line_tag(run: WorkflowRun, workflow: Workflow[Any, Any]) -> str | None:
    """The singleton tag of the key `run` queues on (None: not serialised, or its key is
    None). A run created without its tag (a fan member, a start by name where the code is
    not loaded) gets it from its input now; raises what the key function raises — the
    caller fails the run with it (asking again would fail again)."""
    if workflow.singleton is None:
        return None
    tag = _tag_of(run)
    if tag is not None:
        return tag
    key = singleton_key(workflow, run.input)
    return singleton_tag(key) if key is not None else None


async def admit(
    store: AdmissionStore, run: WorkflowRun, workflow: Workflow[Any, Any], tag: str | None, now: int
) -> WorkflowRun | None:
    """`run` as this turn may run its body (with the tags the store gave it), or None: the
    store parked it until its turn. `tag`: the run's `line_tag` (the store adds it to a run
    created without it)."""
    config = workflow.singleton
    if config is None or tag is None or run.status == "cancelling":
        return run
    tags = run.tags or ()
    if tag in tags and SINGLETON_ADMITTED_TAG in tags:
        return run  # it holds a slot: only the store writes the marker, only to a holder
    if not await store.try_admit_singleton(
        run.id, tag, run.workflow, config.limit, now + retry_delay_ms()
    ):
        return None
    return replace(run, tags=tuple(dict.fromkeys([*tags, tag, SINGLETON_ADMITTED_TAG])))


def without_marker(run: WorkflowRun) -> RunPatch:
    """The part of a terminal write that drops the admission marker (none when the run
    holds none): a finished run holds no slot, and shows none."""
    if not run.tags or SINGLETON_ADMITTED_TAG not in run.tags:
        return {}
    return {"tags": tuple(t for t in run.tags if t != SINGLETON_ADMITTED_TAG)}


def _limit_of(run: WorkflowRun) -> int:
    """The key's limit, from the workflow's registration in this process (1 when it is not
    loaded here: at least the oldest waiter is woken, the others retry on their own)."""
    found = DEFAULT_REGISTRY.workflow(run.workflow, run.workflow_version or None)
    if found is None or found.singleton is None:
        found = DEFAULT_REGISTRY.workflow(run.workflow)
    return found.singleton.limit if found is not None and found.singleton is not None else 1


async def released(store: AdmissionStore, run: WorkflowRun, now: int | None = None) -> list[str]:
    """`run` ended (or was cancelled): make the waiters of its key whose turn it is due
    now, and return them for the caller to wake."""
    tag = _tag_of(run)
    if tag is None:
        return []
    try:
        return await store.wake_singleton_waiters(
            tag, run.workflow, _limit_of(run), int(time.time() * 1000) if now is None else now
        )
    except Exception:
        log.debug("waking the singleton waiters of %s failed", run.id, exc_info=True)
        return []
