"""`durably start --wait` progress, `durably runs watch`, `durably runs delete`, and plain
output when stdout is not a terminal (real SQLite files, real subprocesses)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.cli.support import (
    cli_env,
    durably,
    json_of,
    ok,
    run_status,
    sqlite_url,
    wait_until,
    write_app,
)

FAN_APP = """
import durably


@durably.step("fanapp.leaf")
def leaf(i: int) -> int:
    return i


@durably.workflow("fan")
async def fan(ctx: durably.WorkflowCtx, n: int) -> int:
    return sum(await ctx.all(leaf, range(n)))


engine = durably.Engine(STORE_URL, workflows=[fan])
"""

ANSI = re.compile(r"\x1b\[")


def test_start_wait_on_a_fan_prints_progress_lines_with_a_rising_count(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "fan.db")
    (tmp_path / "fanapp.py").write_text(textwrap.dedent(FAN_APP.replace("STORE_URL", repr(url))))
    done = ok(durably("start", "fanapp:engine", "fan", "--input", "300", "--wait", cwd=tmp_path))
    assert done.stdout.strip() == str(sum(range(300)))  # stdout: the result alone
    assert not ANSI.search(done.stdout) and not ANSI.search(done.stderr)
    lines = done.stderr.splitlines()
    counts = [int(m.group(1)) for line in lines if (m := re.search(r"… (\d+) steps? done", line))]
    assert len(counts) >= 5, done.stderr
    assert counts == sorted(counts) and len(set(counts)) == len(counts), counts
    assert counts[-1] == 300, done.stderr
    assert "fanapp.leaf 300/300" in lines[-1] or "fanapp.leaf 300/300" in done.stderr
    assert len(lines) < 60, done.stderr  # milestones, not a line per member

    quiet = ok(
        durably("start", "fanapp:engine", "fan", "--input", "30", "--wait", "-q", cwd=tmp_path)
    )
    assert quiet.stdout.strip() == str(sum(range(30))) and quiet.stderr == ""
    as_json = json_of(
        durably("start", "fanapp:engine", "fan", "--input", "3", "--wait", "--json", cwd=tmp_path)
    )
    assert as_json["status"] == "completed" and as_json["output"] == 3


def _spawn(tmp_path: Path, name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    out = tmp_path / f"{name}.out"
    with out.open("wb") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "durably._cli.main", *args],
            cwd=tmp_path,
            env=cli_env(),
            stdout=stdout,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    return proc, out


def _status_or_none(cwd: Path, store: str, run_id: str) -> str | None:
    """The run's status, None while the driver has not created the store or the run yet."""
    shown = durably("runs", "show", run_id, "--store", store, "--json", cwd=cwd)
    return str(json.loads(shown.stdout)["run"]["status"]) if shown.returncode == 0 else None


def test_watch_follows_a_run_until_it_settles(tmp_path: Path) -> None:
    store = write_app(tmp_path)
    # This `start --wait` executes the run (and waits for its signal): the store's worker.
    driver, driver_out = _spawn(
        tmp_path, "driver", "start", "app:engine", "gated", "--input", '"w"', "--run-id", "w1",
        "--wait", "-q",
    )  # fmt: skip
    watcher = None
    try:
        wait_until(
            lambda: _status_or_none(tmp_path, store, "w1") == "suspended",
            timeout=30,
            what="the driven run to wait for its signal",
        )
        watcher, watch_out = _spawn(
            tmp_path, "watch", "runs", "watch", "w1", "--store", store, "--interval", "100"
        )
        wait_until(lambda: "suspended" in watch_out.read_text(), what="watch to show the wait")
        assert watcher.poll() is None  # a suspended run has not settled: it keeps watching
        ok(
            durably(
                "runs", "signal", "go:w", "--payload", '{"ok": 1}', "--store", store, cwd=tmp_path
            )
        )
        assert watcher.wait(timeout=30) == 0
        assert driver.wait(timeout=30) == 0
    finally:
        for proc in (driver, watcher):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    text = watch_out.read_text()
    assert not ANSI.search(text)
    assert "run w1 (gated) suspended" in text and "completed" in text
    assert "seq 0 signal:go:w" in text or "signal:go:w" in text, text
    assert text.strip().splitlines()[-1].startswith("run w1 completed: {")
    assert json.loads(driver_out.read_text())["payload"] == {"ok": 1}

    # A settled run: the watch ends at once with the run's outcome, in JSON too.
    lines = ok(durably("runs", "watch", "w1", "--store", store, "--json", cwd=tmp_path))
    [last] = [json.loads(line) for line in lines.stdout.splitlines()]
    assert last["runId"] == "w1" and last["status"] == "completed"
    assert last["steps"].get("completed", 0) >= 1


def test_watch_exits_with_the_run_s_outcome(tmp_path: Path) -> None:
    store = write_app(tmp_path)
    failed = durably(
        "start", "app:engine", "flaky", "--input", "3", "--run-id", "f1", "--wait", cwd=tmp_path
    )
    assert failed.returncode == 1
    watched = durably("runs", "watch", "f1", "--store", store, cwd=tmp_path)
    assert watched.returncode == 1
    assert "run f1 failed: broken until ./fixed exists" in watched.stdout
    missing = durably("runs", "watch", "nope", "--store", store, cwd=tmp_path)
    assert missing.returncode == 1 and "Run nope not found." in missing.stderr
    # A pending run nobody executes: --timeout gives up (exit 1), the run is left as it was.
    ok(durably("start", "app:engine", "hello", "--input", '"p"', "--run-id", "p1", cwd=tmp_path))
    gave_up = durably(
        "runs", "watch", "p1", "--store", store, "--timeout", "0.3", "--interval", "50",
        cwd=tmp_path,
    )  # fmt: skip
    assert gave_up.returncode == 1 and "still pending after 0.3s" in gave_up.stderr
    assert run_status(tmp_path, store, "p1")["run"]["status"] == "pending"


def test_delete_asks_refuses_unsettled_runs_and_deletes(tmp_path: Path) -> None:
    store = write_app(tmp_path)
    ok(
        durably(
            "start",
            "app:engine",
            "hello",
            "--input",
            '"d"',
            "--run-id",
            "d1",
            "--wait",
            cwd=tmp_path,
        )
    )

    kept = durably("runs", "delete", "d1", "--store", store, cwd=tmp_path, stdin="n\n")
    assert kept.returncode == 1 and "Delete run d1 (hello, completed)" in kept.stderr
    assert kept.stdout == ""
    assert run_status(tmp_path, store, "d1")["run"]["status"] == "completed"
    no_answer = durably("runs", "delete", "d1", "--store", store, cwd=tmp_path, stdin="")
    assert no_answer.returncode != 0
    assert run_status(tmp_path, store, "d1")["run"]["status"] == "completed"

    gone = ok(durably("runs", "delete", "d1", "--store", store, cwd=tmp_path, stdin="y\n"))
    assert "Run d1 deleted" in gone.stdout
    missing = durably("runs", "show", "d1", "--store", store, cwd=tmp_path)
    assert missing.returncode == 1 and "Run d1 not found." in missing.stderr
    again = durably("runs", "delete", "d1", "--store", store, "--yes", cwd=tmp_path)
    assert again.returncode == 1 and "Run d1 not found." in again.stderr

    # Not settled (enqueued, nobody executes it): refused even with --yes; --force deletes.
    ok(durably("start", "app:engine", "gated", "--input", '"x"', "--run-id", "g1", cwd=tmp_path))
    refused = durably("runs", "delete", "g1", "--store", store, "--yes", cwd=tmp_path)
    assert refused.returncode == 1
    assert "g1 is pending, not settled" in refused.stderr and "--force" in refused.stderr
    assert run_status(tmp_path, store, "g1")["run"]["status"] == "pending"
    forced = json_of(
        durably(
            "runs", "delete", "g1", "--store", store, "--yes", "--force", "--json", cwd=tmp_path
        )
    )
    assert forced == {"runId": "g1", "deleted": 1, "status": "pending"}
    listed = json_of(durably("runs", "list", "--store", store, "--json", cwd=tmp_path))
    assert [r["id"] for r in listed] == []


def test_text_output_has_no_control_codes_when_not_a_terminal(tmp_path: Path) -> None:
    store = write_app(tmp_path)
    ok(
        durably(
            "start",
            "app:engine",
            "hello",
            "--input",
            '"t"',
            "--run-id",
            "t1",
            "--wait",
            cwd=tmp_path,
        )
    )
    for args in (
        ("--help",),
        ("runs", "--help"),
        ("runs", "list", "--store", store),
        ("runs", "show", "t1", "--store", store),
    ):
        result = ok(durably(*args, cwd=tmp_path))
        assert result.stdout.strip() and not ANSI.search(result.stdout), args
    usage = durably("runs", "list", "--limit", "0", "--store", store, cwd=tmp_path)
    assert usage.returncode == 2 and "--limit" in usage.stderr
    assert not ANSI.search(usage.stderr)
    both = durably("runs", "list", "--store", store, "--app", "app:engine", cwd=tmp_path)
    assert both.returncode == 2 and "--store and --app exclude each other" in both.stderr


NO_RICH = """
import sys
from durably._cli.main import main

code = main(sys.argv[1:])
assert "rich" not in sys.modules, sorted(m for m in sys.modules if m.startswith("rich"))
sys.exit(code)
"""


def test_help_and_listings_never_import_rich(tmp_path: Path) -> None:
    """rich (and the markdown parser typer's rich help pulls in) is imported only for a live
    display: `--help` and plain listings stay quick to start."""
    store = write_app(tmp_path)
    ok(durably("db", "upgrade", "--store", store, cwd=tmp_path))
    for args in (["--help"], ["runs", "--help"], ["runs", "list", "--store", store]):
        done = subprocess.run(
            [sys.executable, "-c", NO_RICH, *args],
            cwd=tmp_path,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (args, done.stderr)


def test_start_wait_on_a_non_driving_app_follows_the_store(tmp_path: Path) -> None:
    """APP built with drive=False: the run is executed by a worker of the store, and the
    progress on stderr is read from the store (the watch view) instead of engine events."""
    store = write_app(tmp_path)
    (tmp_path / "client.py").write_text(
        "import durably\nimport app\n\n"
        f"engine = durably.Engine({store!r}, workflows=[app.hello], drive=False)\n"
    )
    worker, worker_out = _spawn(tmp_path, "worker", "worker", "app:engine", "--instance-id", "w")
    try:
        wait_until(lambda: "ready" in worker_out.read_text(), timeout=30, what="the worker")
        done = ok(
            durably("start", "client:engine", "hello", "--input", '"x"', "--run-id", "c1",
                    "--wait", cwd=tmp_path)
        )  # fmt: skip
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert done.stdout.strip() == '"hello X"'
    assert "run c1 (hello)" in done.stderr and "completed" in done.stderr, done.stderr
    assert not ANSI.search(done.stderr)
