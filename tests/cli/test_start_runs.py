"""`durably start` and `durably runs …` (no worker: these never execute runs themselves)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.support import durably, json_of, ok, write_app


def test_start_wait_runs_in_process_and_round_trips(tmp_path: Path) -> None:
    store = write_app(tmp_path)
    done = json_of(
        durably(
            "start",
            "app:engine",
            "hello",
            "--input",
            '"bob"',
            "--run-id",
            "h1",
            "--wait",
            "--json",
            cwd=tmp_path,
        )
    )
    assert done["id"] == "h1" and done["status"] == "completed"
    assert done["output"] == "hello BOB"
    plain = ok(durably("start", "app:engine", "hello", "--input", '"amy"', "--wait", cwd=tmp_path))
    assert plain.stdout.strip() == '"hello AMY"'

    # Without --wait the run is only enqueued: nothing executes it (no worker is running).
    queued = ok(
        durably("start", "app:engine", "hello", "--input", '"zed"', "--run-id", "q1", cwd=tmp_path)
    )
    assert queued.stdout.strip() == "q1"

    listed = json_of(durably("runs", "list", "--store", store, "--json", cwd=tmp_path))
    by_id = {r["id"]: r for r in listed}
    assert by_id["h1"]["status"] == "completed"
    assert by_id["q1"]["status"] == "pending"
    assert len(listed) == 3
    assert all("workflowVersion" in r for r in listed)  # camelCase JSON

    pending = json_of(
        durably("runs", "list", "--store", store, "--status", "pending", "--json", cwd=tmp_path)
    )
    assert [r["id"] for r in pending] == ["q1"]
    limited = json_of(
        durably("runs", "list", "--store", store, "--limit", "1", "--json", cwd=tmp_path)
    )
    assert len(limited) == 1
    by_wf = json_of(
        durably("runs", "list", "--store", store, "--workflow", "gated", "--json", cwd=tmp_path)
    )
    assert by_wf == []

    shown = json_of(durably("runs", "show", "h1", "--store", store, "--json", cwd=tmp_path))
    assert shown["run"]["output"] == "hello BOB"
    [cp] = shown["timeline"]
    assert (cp["seq"], cp["name"], cp["kind"], cp["status"], cp["attempts"]) == (
        0,
        "greet.shout",
        "remote",
        "completed",
        1,
    )

    table = ok(durably("runs", "list", "--store", store, cwd=tmp_path)).stdout.splitlines()
    assert table[0].split() == ["RUN", "WORKFLOW", "STATUS", "UPDATED"]
    human = ok(durably("runs", "show", "h1", "--store", store, cwd=tmp_path)).stdout
    assert human.startswith("hello  [completed]  v1\nh1\n")
    assert "greet.shout" in human and 'output: "hello BOB"' in human

    # --app resolves the store through the app's engine; still never executes q1.
    via_app = json_of(durably("runs", "show", "q1", "--app", "app:engine", "--json", cwd=tmp_path))
    assert via_app["run"]["status"] == "pending"

    # Idempotent start by run id.
    again = ok(
        durably(
            "start",
            "app:engine",
            "hello",
            "--input",
            '"other"',
            "--run-id",
            "h1",
            "--wait",
            cwd=tmp_path,
        )
    )
    assert again.stdout.strip() == '"hello BOB"'


def test_input_errors(tmp_path: Path) -> None:
    write_app(tmp_path)
    bad = durably("start", "app:engine", "hello", "--input", "bob", cwd=tmp_path)
    assert bad.returncode == 2
    assert "--input is not valid JSON" in bad.stderr
    invalid = durably("start", "app:engine", "hello", "--input", "5", cwd=tmp_path)
    assert invalid.returncode == 2
    assert "invalid input for workflow 'hello'" in invalid.stderr
    (tmp_path / "in.json").write_text('"from file"')
    from_file = json_of(
        durably(
            "start", "app:engine", "hello", "--input", "@in.json", "--wait", "--json", cwd=tmp_path
        )
    )
    assert from_file["output"] == "hello FROM FILE"
    from_stdin = json_of(
        durably(
            "start",
            "app:engine",
            "hello",
            "--input",
            "-",
            "--wait",
            "--json",
            cwd=tmp_path,
            stdin='"piped"',
        )
    )
    assert from_stdin["output"] == "hello PIPED"


def test_unknown_things(tmp_path: Path) -> None:
    store = write_app(tmp_path)
    wf = durably("start", "app:engine", "nope", "--input", "1", cwd=tmp_path)
    assert wf.returncode == 1
    assert "workflow nope is not registered" in wf.stderr
    assert "hello" in wf.stderr  # lists what is registered

    ok(durably("start", "app:engine", "hello", "--input", '"x"', cwd=tmp_path))
    for verb in ("show", "cancel", "retry", "continue", "redispatch"):
        missing = durably("runs", verb, "no-such-run", "--store", store, cwd=tmp_path)
        assert missing.returncode == 1, verb
        assert "Run no-such-run not found." in missing.stderr, verb

    nodb = durably("runs", "list", "--store", f"sqlite:///{tmp_path / 'absent.db'}", cwd=tmp_path)
    assert nodb.returncode == 1 and "no durably database" in nodb.stderr
    assert not (tmp_path / "absent.db").exists()

    app = durably("start", "missing_module:engine", "hello", cwd=tmp_path)
    assert app.returncode == 1 and "missing_module" in app.stderr
    attr = durably("start", "app:nothing", "hello", cwd=tmp_path)
    assert attr.returncode == 1 and "no attribute 'nothing'" in attr.stderr
    notengine = durably("start", "app:hello", "hello", cwd=tmp_path)
    assert notengine.returncode == 1 and "not a durably.Engine" in notengine.stderr


def test_failed_run_exits_non_zero(tmp_path: Path) -> None:
    store = write_app(tmp_path)
    failed = durably(
        "start", "app:engine", "flaky", "--input", "3", "--run-id", "f1", "--wait", cwd=tmp_path
    )
    assert failed.returncode == 1
    assert "broken until ./fixed exists" in failed.stderr
    shown = json.loads(
        ok(durably("runs", "show", "f1", "--store", store, "--json", cwd=tmp_path)).stdout
    )
    assert shown["run"]["status"] == "failed"
    human = ok(durably("runs", "show", "f1", "--store", store, cwd=tmp_path)).stdout
    assert "error: broken until ./fixed exists" in human


def test_retry_with_a_new_input_starts_a_fresh_run(tmp_path: Path) -> None:
    store = write_app(tmp_path)
    failed = durably(
        "start", "app:engine", "flaky", "--input", "3", "--run-id", "r1", "--wait", cwd=tmp_path
    )
    assert failed.returncode == 1
    retried = json_of(
        durably("runs", "retry", "r1", "--input", "5", "--store", store, "--json", cwd=tmp_path)
    )
    assert retried["retriedRunId"] == "r1" and retried["runId"] != "r1"
    fresh = json_of(
        durably("runs", "show", retried["runId"], "--store", store, "--json", cwd=tmp_path)
    )
    assert (fresh["run"]["workflow"], fresh["run"]["input"]) == ("flaky", 5)
    bad = durably("runs", "retry", "r1", "--input", "{nope", "--store", store, cwd=tmp_path)
    assert bad.returncode == 2 and "--input" in bad.stderr


def test_cancel_a_waiting_run(tmp_path: Path) -> None:
    store = write_app(tmp_path)
    ok(durably("start", "app:engine", "gated", "--input", '"c"', "--run-id", "c1", cwd=tmp_path))
    cancelled = json_of(durably("runs", "cancel", "c1", "--store", store, "--json", cwd=tmp_path))
    assert cancelled["status"] == "cancelled" and cancelled["changed"] is True
    again = ok(durably("runs", "cancel", "c1", "--store", store, cwd=tmp_path))
    assert "already cancelled" in again.stdout


def test_redispatch_a_run_without_remote_steps(tmp_path: Path) -> None:
    store = write_app(tmp_path)
    ok(durably("start", "app:engine", "gated", "--input", '"c"', "--run-id", "d1", cwd=tmp_path))
    sent = json_of(durably("runs", "redispatch", "d1", "--store", store, "--json", cwd=tmp_path))
    assert sent["runId"] == "d1" and sent["redispatched"] == 0
    human = ok(durably("runs", "redispatch", "d1", "--store", store, cwd=tmp_path))
    assert "nothing re-dispatched" in human.stdout


def test_no_command_prints_usage(tmp_path: Path) -> None:
    result = ok(durably(cwd=tmp_path))
    assert "usage: durably" in result.stdout.lower()
    for command in ("demo", "worker", "start", "runs", "db"):
        assert command in result.stdout
    # An unknown command is a failed call (1); a malformed one stays a usage error (2).
    unknown = durably("frobnicate", cwd=tmp_path)
    assert unknown.returncode == 1 and "No such command 'frobnicate'" in unknown.stderr
    sub = durably("runs", "frobnicate", cwd=tmp_path)
    assert sub.returncode == 1 and "No such command 'frobnicate'" in sub.stderr
    assert durably("runs", "list", "--no-such-option", cwd=tmp_path).returncode == 2
