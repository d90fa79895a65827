"""`durably start … --run-id EXISTING`: the existing run is returned (or followed) as it is,
without its input being asked for again."""

from __future__ import annotations

from pathlib import Path

from tests.cli.support import durably, json_of, ok, write_app


def _start(tmp_path: Path, *args: str) -> str:
    first = ok(durably("start", "app:engine", *args, cwd=tmp_path))
    return first.stdout.strip()


def test_rerun_without_input_returns_the_existing_run(tmp_path: Path) -> None:
    write_app(tmp_path)
    assert _start(tmp_path, "hello", "--input", '"bob"', "--run-id", "h1", "--wait") == (
        '"hello BOB"'
    )
    again = ok(durably("start", "app:engine", "hello", "--run-id", "h1", "--wait", cwd=tmp_path))
    assert again.stdout.strip() == '"hello BOB"'
    assert "not applied" not in again.stderr  # nothing was given that is not applied
    shown = json_of(
        durably("start", "app:engine", "hello", "--run-id", "h1", "--wait", "--json", cwd=tmp_path)
    )
    assert (shown["id"], shown["status"], shown["input"]) == ("h1", "completed", "bob")
    # Without --wait: the id, as for a fresh start.
    assert _start(tmp_path, "hello", "--run-id", "h1") == "h1"


def test_a_different_input_is_not_applied_and_says_so(tmp_path: Path) -> None:
    write_app(tmp_path)
    _start(tmp_path, "hello", "--input", '"bob"', "--run-id", "h1", "--wait")
    # Even an input the workflow would refuse: nothing is started, nothing is checked.
    other = ok(
        durably(
            "start",
            "app:engine",
            "hello",
            "--input",
            "5",
            "--run-id",
            "h1",
            "--wait",
            cwd=tmp_path,
        )
    )
    assert other.stdout.strip() == '"hello BOB"'
    assert "run h1 already exists (completed)" in other.stderr
    assert "--input not applied" in other.stderr


def test_a_pending_existing_run_is_followed(tmp_path: Path) -> None:
    write_app(tmp_path)
    # Enqueued only (no worker): the re-run with --wait executes it in this process.
    assert _start(tmp_path, "hello", "--input", '"zed"', "--run-id", "q1") == "q1"
    done = ok(durably("start", "app:engine", "hello", "--run-id", "q1", "--wait", cwd=tmp_path))
    assert done.stdout.strip() == '"hello ZED"'


def test_the_id_of_another_workflows_run_is_refused(tmp_path: Path) -> None:
    write_app(tmp_path)
    _start(tmp_path, "hello", "--input", '"bob"', "--run-id", "h1", "--wait")
    clash = durably("start", "app:engine", "gated", "--run-id", "h1", "--wait", cwd=tmp_path)
    assert clash.returncode == 1
    assert "h1" in clash.stderr and "hello" in clash.stderr and "gated" in clash.stderr


def test_a_new_id_still_checks_the_input(tmp_path: Path) -> None:
    write_app(tmp_path)
    fresh = durably("start", "app:engine", "hello", "--run-id", "new1", "--wait", cwd=tmp_path)
    assert fresh.returncode == 2
    assert "invalid input for workflow 'hello'" in fresh.stderr
