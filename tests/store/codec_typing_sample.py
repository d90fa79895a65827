"""Checked by mypy (test_codec_typing.py), never run: the derived `CodecStateStore` has the
`StateStore` method types, is accepted where a `StateStore` is expected and is usable as an
annotation. Each line marked with a mypy-error comment must be reported with its text."""

from __future__ import annotations

from durably import (
    AesGcmCodec,
    CodecStateStore,
    InMemoryStateStore,
    StateStore,
    StepCheckpoint,
    WorkflowRun,
)


def takes_store(store: StateStore) -> None: ...


async def sample(cp: StepCheckpoint) -> None:
    wrapped: CodecStateStore = CodecStateStore(InMemoryStateStore(), AesGcmCodec(b"k" * 32))
    takes_store(wrapped)
    run: WorkflowRun | None = await wrapped.get_run("r1")
    await wrapped.save_checkpoint(cp)
    saved: bool = await wrapped.save_checkpoint_if_pending(cp)
    bus = wrapped.wake_bus()
    print(run, saved, bus, wrapped.inner, wrapped.codec.encode(1), wrapped.converter)
    count: str = await wrapped.count_runs(1)  # mypy-error: Argument 1 to "count_runs"
    await wrapped.save_checkpoint("cp")  # mypy-error: Argument 1 to "save_checkpoint"
    wrong: int = await wrapped.get_run("r1")  # mypy-error: Incompatible types in assignment
    CodecStateStore(InMemoryStateStore())  # mypy-error: Missing positional argument "codec"
    print(count, wrong)
