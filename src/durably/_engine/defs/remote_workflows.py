"""TODO docstring"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from durably._core.log_context import durably_logger
from durably._core.wire import sanitize_queue_token, tenant_group
from durably._engine.defs.registry import OnErrorRoute, Workflow

log = durably_logger("durably.engine")


async def _served_remotely(ctx: Any, input: Any) -> Any:
    # Only reached when an engine that cannot issue remote turns drives the run: say so
    # instead of running nothing.
    raise RuntimeError(
        "this workflow runs in remote workers: only an engine with a transport that carries "
        "workflow turns can drive it"
    )


class RemoteWorkflow(Workflow[Any, Any]):
    """A workflow whose body runs in remote workers; the engine holds its durable state.

    It is a `Workflow` (same registry, start, children and onError routes as a local one)
    whose body the engine never runs: every turn is sent to the workers on `token_for(...)`.
    Inputs are plain JSON (there is no annotation here to validate them against)."""

    def __init__(
        self,
        name: str,
        *,
        group: str | None = None,
        version: str = "1",
        on_error: Iterable[OnErrorRoute] = (),
        tags: Iterable[str] = (),
    ):
        if not isinstance(name, str) or not name:
            raise ValueError("a remote workflow needs a non-empty name")
        if group is not None and (not isinstance(group, str) or not group):
            raise ValueError(f"remote workflow {name!r}: group must be a non-empty string")
        super().__init__(
            _served_remotely, name, version, on_error=tuple(on_error), tags=tuple(tags)
        )
        self.group = group

    def __repr__(self) -> str:
        where = f" on {self.group!r}" if self.group is not None else ""
        return f"<durably.RemoteWorkflow {self.name!r} v{self.version}{where}>"

    def token_for(self, namespace: str | None) -> str:
        """The routing token a turn of a run in `namespace` is queued on."""
        if self.group is not None:
            return tenant_group(sanitize_queue_token(self.group), None)
        return tenant_group(sanitize_queue_token(self.name), namespace)


def remote_workflow(
    name: str,
    *,
    group: str | None = None,
    version: str = "1",
    on_error: Iterable[OnErrorRoute] = (),
    tags: Iterable[str] = (),
) -> RemoteWorkflow:
    """Declare a workflow served by remote workers: `Engine(workflows=[remote_workflow("x")])`.

    `group` is the queue its turns go to (a split `WorkflowWorker(group=...)`); without it
    they go to the workflow's own queue, suffixed with the run's namespace (a durable-worker
    `Worker(partition=...)` holding the workflow). Unlike `@durably.workflow`, a declaration
    is not added to the default registry: a remote workflow is served remotely only by the
    engines it is given to."""
    return RemoteWorkflow(name, group=group, version=version, on_error=on_error, tags=tags)
