"""The start request: every start verb builds one `StartRequest`, checked as it is built, so a
bad option is refused before the store is opened and no request below it is ever invalid."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from durably import Client, ConcurrencyQuota, Engine, PayloadRejectedError
from durably._engine.control.start import StartRequest


def test_a_request_is_checked_as_it_is_built() -> None:
    with pytest.raises(ValueError, match=r"^start of wf: priority must be an integer"):
        StartRequest(workflow="wf", priority=True)
    with pytest.raises(ValueError, match="dedup_id must be a non-empty string"):
        StartRequest(workflow="wf", dedup_id="")
    with pytest.raises(ValueError, match='on_duplicate must be "return" or "raise"'):
        StartRequest(workflow="wf", on_duplicate="ignore")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"concurrency= takes a durably\.ConcurrencyQuota"):
        StartRequest(workflow="wf", concurrency=3)  # type: ignore[arg-type]
    with pytest.raises(PayloadRejectedError):
        StartRequest(workflow="wf", tags=("a\x00b",))
    with pytest.raises(PayloadRejectedError):
        StartRequest(workflow="w\x00f")
    with pytest.raises(ValueError, match="run id"):
        StartRequest(workflow="wf", run_id="")
    # A derived request is checked as well: there is no way to an invalid one.
    good = StartRequest(workflow="wf", concurrency=ConcurrencyQuota("k", 2), priority=3)
    with pytest.raises(ValueError, match="priority must be between"):
        dataclasses.replace(good, priority=2**31)


def test_a_request_is_frozen() -> None:
    request = StartRequest(workflow="wf", run_id="r1", tags=("a",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.run_id = "r2"  # type: ignore[misc]


@pytest.mark.parametrize("kind", ["client", "engine"])
async def test_a_bad_start_option_is_refused_before_the_store_is_opened(
    tmp_path: Path, kind: str
) -> None:
    db = tmp_path / "never.db"
    url = f"sqlite:///{db}"
    starter = Client(url) if kind == "client" else Engine(url, workflows=[])
    try:
        with pytest.raises(ValueError, match="priority must be"):
            await starter.start("wf", priority=True)
        with pytest.raises(ValueError, match="dedup_id must be"):
            await starter.start("wf", dedup_id="")
        assert not db.exists()  # nothing opened, so nothing created
    finally:
        await starter.close()
