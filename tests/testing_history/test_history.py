"""History export (`export_history` on Engine, Client and SyncClient) from a real SQLite
file, and `load_history`'s refusals of documents it cannot read."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import durably
from durably.testing import HistoryFormatError, RunHistory, load_history
from tests.testing_history.orders import STEPS, orders


@pytest.fixture
async def recorded(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    code = orders()
    url = f"sqlite:///{tmp_path / 'h.db'}"
    async with durably.Engine(url, workflows=[code.workflow]) as engine:
        await engine.start(code.workflow, STEPS, run_id="h-1")
        await engine.wait_for_run("h-1", timeout=30, until="terminal")
        return url, await engine.export_history("h-1")


async def test_the_document_holds_the_run_and_every_checkpoint(
    recorded: tuple[str, dict[str, Any]],
) -> None:
    _, doc = recorded
    assert doc["format"] == "durably.history" and doc["version"] == 1
    run = doc["run"]
    assert run["id"] == "h-1" and run["status"] == "completed"
    assert run["workflowVersion"] == "1" and run["input"] == STEPS
    assert run["output"] == sum(i * 10 for i in range(STEPS))
    cps = doc["checkpoints"]
    assert [cp["seq"] for cp in cps] == list(range(STEPS))
    assert {cp["name"] for cp in cps} == {f"{run['workflow']}.work"}
    assert [cp["output"] for cp in cps] == [i * 10 for i in range(STEPS)]
    assert all(cp["status"] == "completed" and cp["attempts"] == 1 for cp in cps)
    assert json.loads(json.dumps(doc)) == doc  # plain JSON
    loaded = load_history(doc)
    assert isinstance(loaded, RunHistory) and loaded.run.id == "h-1"
    assert [cp.output for cp in loaded.checkpoints] == [i * 10 for i in range(STEPS)]


async def test_a_client_exports_the_same_document(recorded: tuple[str, dict[str, Any]]) -> None:
    url, doc = recorded
    async with durably.Client(url) as client:
        assert await client.export_history("h-1") == doc
        with pytest.raises(durably.RunNotFoundError, match="'nope' not found"):
            await client.export_history("nope")


def test_a_sync_client_exports_it_too(recorded: tuple[str, dict[str, Any]]) -> None:
    url, doc = recorded
    with durably.SyncClient(url) as client:
        assert client.export_history("h-1") == doc


def _broken(doc: dict[str, Any], change: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    change(out)
    return out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format="temporal.history"), "format is 'temporal.history'"),
        (lambda d: d.pop("format"), "format is None"),
        (lambda d: d.update(version=2), "unknown history version 2"),
        (lambda d: d.update(version=True), "unknown history version True"),
        (lambda d: d.pop("checkpoints"), "has no 'checkpoints' field"),
        (lambda d: d.update(run=[]), "'run' is not an object"),
        (lambda d: d["run"].pop("workflow"), "run has no 'workflow' field"),
        (lambda d: d["run"].update(status="done"), "unknown status 'done'"),
        (lambda d: d.update(checkpoints={}), "'checkpoints' is not a list"),
        (lambda d: d["checkpoints"][3].pop("name"), "checkpoint 3 has no 'name' field"),
        (lambda d: d["checkpoints"][0].update(seq="0"), "checkpoint 0 has seq '0'"),
        (lambda d: d["checkpoints"][2].update(runId="other"), "belongs to run 'other'"),
        (lambda d: d["checkpoints"][2].update(status="ok"), "checkpoint 2 has status 'ok'"),
        (lambda d: d["checkpoints"].reverse(), "checkpoints are listed once each, in seq order"),
        (lambda d: d["checkpoints"][1].update(startedAt="yesterday"), "checkpoint 1 cannot be"),
    ],
)
async def test_load_history_names_what_is_wrong(
    recorded: tuple[str, dict[str, Any]], change: Any, message: str
) -> None:
    _, doc = recorded
    with pytest.raises(HistoryFormatError) as err:
        load_history(_broken(doc, change))
    assert message in str(err.value)


def test_load_history_refuses_a_file_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(HistoryFormatError, match=r"broken\.json: not JSON"):
        load_history(path)
    path.write_text("[1, 2]")
    with pytest.raises(HistoryFormatError, match=r"broken\.json: a history is a JSON object"):
        load_history(str(path))
    with pytest.raises(FileNotFoundError):
        load_history(tmp_path / "missing.json")
    with pytest.raises(TypeError, match="takes a path"):
        load_history(42)  # type: ignore[arg-type]
