"""`StartRequest`: what one start of a run asks for, besides its input.

Every start enters the engine through one public verb (`Client.start`, `Engine.start`,
`signal_with_start`, a fix-and-replay, a start-run message of the gateway) or is derived by
the runtime (a child, a continuation, a run an event starts). Each builds ONE request and
hands it down unchanged to `ControlPlane.create_run`, the one place that writes a run, so
the start's options are spelled once instead of in every signature of the way down.

A request is checked when it is built (`__post_init__`): an invalid one never exists, so a
refused start fails before the store is even opened and nothing below checks it again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from durably._core.bounds import PayloadRejectedError, check_json_value, check_text
from durably._core.ids import given_run_id
from durably._core.quota import ConcurrencyQuota
from durably._engine.defs.vocab import check_priority
from durably._engine.flow.quotas import OnDuplicate, check_start_options

__all__ = ["SearchAttributes", "StartRequest", "check_run_text"]

SearchAttributes = Mapping[str, str | int | float | bool]


def check_run_text(
    workflow: str,
    tags: Sequence[str] | None,
    search_attributes: SearchAttributes | None,
) -> None:
    """Refuse, before anything is written, a start whose workflow name, tags or search
    attributes a store cannot hold: a NUL (PostgreSQL's text refuses it, SQLite and the memory
    store keep it), a lone surrogate, a number that is not finite. Refused here, the same
    start fails the same way on every store, with a `PayloadRejectedError` naming the value,
    instead of a driver error on one store only."""
    check_text("workflow name", workflow)
    for tag in tags or ():
        if not isinstance(tag, str):
            raise PayloadRejectedError("run tag", f"{type(tag).__name__} is not a string")
        check_text("run tag", tag)
    for key, value in (search_attributes or {}).items():
        if not isinstance(key, str):
            raise PayloadRejectedError("search attribute name", f"{key!r} is not a string")
        check_text("search attribute name", key)
        if isinstance(value, str):
            check_text(f"search attribute {key!r}", value)
        else:
            check_json_value(f"search attribute {key!r}", value)


@dataclass(frozen=True, slots=True, kw_only=True)
class StartRequest:
    """One start of `workflow` (its name) and the options the caller gave it.

    - `run_id`: the run's id (None: a random one); a start is idempotent by it.
    - `tags`, `search_attributes`: what the run carries (a registered workflow's own tags are
      added in front of `tags` where the run is created).
    - `priority`: pending runs are picked up higher first, then oldest (None counts as 0).
    - `version`: the version to run; None runs the workflow object's, or the newest
      registered one (decided by whoever executes the run when the starter has no code).
    - `namespace`: where the run lives (None: the starter's namespace).
    - `concurrency`, `dedup_id`, `on_duplicate`: the start's own quota and dedup id, checked
      with the insert (`durably._engine.flow.quotas`).
    """

    workflow: str
    run_id: str | None = None
    tags: tuple[str, ...] = ()
    search_attributes: SearchAttributes | None = None
    priority: int | None = None
    version: str | None = None
    namespace: str | None = None
    concurrency: ConcurrencyQuota | None = None
    dedup_id: str | None = None
    on_duplicate: OnDuplicate = "return"

    def __post_init__(self) -> None:
        given_run_id(self.run_id)  # every start, derived ids included
        check_priority(self.priority, f"start of {self.workflow}")
        check_start_options(self.concurrency, self.dedup_id, self.on_duplicate)
        check_run_text(self.workflow, self.tags, self.search_attributes)
