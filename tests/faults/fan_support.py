"""Machinery of test_fan_faults.py: the two backends, the worker processes, the side-effect log.

* `backend(kind, tmp_path)`: a fresh store per scenario — a new SQLite file, or a fresh
  PostgreSQL schema (tests/pg_support.py: skipped when the server is unreachable, FAILED under
  `DURABLY_REQUIRE_SERVICES=1`) — read back with plain `sqlite3` / `asyncpg`, not through
  durably's store, so the checks do not depend on the code under test;
* `Proc`: a real `fan_app.py` subprocess (bounded waits, SIGKILL, stderr on failure);
* `read_log()`: the O_APPEND side-effect log as `Line`s, in append order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.faults.fan_app import RUN_ID
from tests.pg_support import PG_URL, connect, fresh_schema, schema_url

APP = Path(__file__).with_name("fan_app.py")
# FAN_FAULT_SRC: run the worker processes against another checkout's src (bisecting).
SRC = os.environ.get("FAN_FAULT_SRC") or str(Path(__file__).resolve().parents[2] / "src")
TERMINAL = ("completed", "failed", "cancelled", "dead")
BACKENDS = ("sqlite", "postgres")
# The recovering engine's reconcile_ms is 1000, so a delivered child is never stranded past a
# few re-drives; the bound is ten of them because a loaded 2-core CI machine can starve the
# recovering process for seconds. The detector only makes a real stranding fail early instead
# of waiting out the whole timeout, so a looser bound delays a true failure, never hides one.
STRANDED_S = 10.0


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


@dataclass
class Backend:
    kind: str
    url: str
    sqlite_path: Path | None = None
    schema: str | None = None

    async def _rows(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        if self.sqlite_path is not None:
            conn = sqlite3.connect(str(self.sqlite_path), timeout=10)
            try:
                conn.row_factory = sqlite3.Row
                q = sql
                for n in range(len(args), 0, -1):
                    q = q.replace(f"${n}", "?")
                return [dict(r) for r in conn.execute(q, args).fetchall()]
            finally:
                conn.close()
        conn = await connect(server_settings={"search_path": str(self.schema)})
        try:
            return [dict(r) for r in await conn.fetch(sql, *args)]
        finally:
            await conn.close()

    async def runs(self) -> dict[str, dict[str, Any]]:
        rows = await self._rows("SELECT id, status, output, error FROM durable_workflow_runs")
        for row in rows:
            row["output"], row["error"] = _json(row["output"]), _json(row["error"])
        return {row["id"]: row for row in rows}

    async def checkpoints(self, run_id: str) -> list[dict[str, Any]]:
        rows = await self._rows(
            "SELECT seq, name, kind, status, output FROM durable_step_checkpoints "
            "WHERE run_id = $1 ORDER BY seq",
            run_id,
        )
        for row in rows:
            row["output"] = _json(row["output"])
        return rows

    async def completed_step_rows(self, name: str) -> list[dict[str, Any]]:
        """Completed checkpoints named `name` (a step) or `fan:…` (a folded fan record)."""
        rows = await self._rows(
            "SELECT run_id, seq, name, status, output FROM durable_step_checkpoints "
            "WHERE status = 'completed' AND (name = $1 OR name LIKE 'fan:%')",
            name,
        )
        for row in rows:
            row["output"] = _json(row["output"])
        return rows


@contextlib.asynccontextmanager
async def backend(kind: str, tmp_path: Path) -> AsyncIterator[Backend]:
    if kind == "sqlite":
        db = tmp_path / "fan.db"
        yield Backend(kind, f"sqlite:///{db}", sqlite_path=db)
        return
    async with fresh_schema() as schema:
        yield Backend(kind, schema_url(schema, PG_URL), schema=schema)


@dataclass(frozen=True)
class Line:
    pid: int
    kind: str
    key: str
    i: int


def read_log(log: Path) -> list[Line]:
    if not log.exists():
        return []
    out = []
    for raw in log.read_text().splitlines():
        pid, kind, key, i = raw.split()
        out.append(Line(int(pid), kind, key, int(i)))
    return out


class Proc:
    """One `fan_app.py` process."""

    def __init__(
        self, b: Backend, log: Path, scenario: str, mode: str, env: dict[str, str]
    ) -> None:
        self.label = f"{scenario}/{mode}"
        self.p = subprocess.Popen(
            [sys.executable, str(APP), b.url, str(log), scenario, mode],
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])),
                **env,
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.pid = self.p.pid
        self.killed_at_ms: int | None = None  # wall clock (ms) of our SIGKILL

    def stderr(self) -> str:
        if self.p.poll() is None or self.p.stderr is None:
            return ""
        return self.p.stderr.read()[-4000:]

    def alive(self) -> bool:
        return self.p.poll() is None

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.killed_at_ms = int(time.time() * 1000)
        self.p.wait(timeout=10)

    async def wait_exit(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.p.poll() is None:
            if time.monotonic() >= deadline:
                self.kill()
                pytest.fail(f"{self.label} did not exit within {timeout}s")
            await asyncio.sleep(0.05)
        return self.p.returncode

    async def result(
        self, timeout: float, b: Backend | None = None, context: str = ""
    ) -> dict[str, Any]:
        """Wait (bounded) for a `recover` process; its JSON result line. On timeout the
        failure shows the runs left non-terminal (from `b`) and the process's stderr.

        With `b`, the wait also watches `RUN_ID` for stranded children (`stranded_children`):
        one stranded for `STRANDED_S` (several reconcile re-drives of the recovering engine)
        raises `StrandedRun` at once instead of waiting out the timeout."""
        comm = asyncio.ensure_future(asyncio.to_thread(self.p.communicate, timeout=timeout))
        since: dict[str, float] = {}
        while b is not None and not comm.done():
            await asyncio.wait([comm], timeout=0.3)
            if comm.done():
                break
            now = time.monotonic()
            current = set(await stranded_children(b, RUN_ID))
            since = {c: since.get(c, now) for c in current}
            if since and now - min(since.values()) >= STRANDED_S:
                self.kill()
                await asyncio.wait([comm], timeout=10)
                stuck = await describe_stuck(b)
                raise StrandedRun(
                    f"{self.label}: {len(since)} terminal child(ren) of {RUN_ID} not delivered "
                    f"for {STRANDED_S}s {context}: {sorted(since)[:6]}\n{stuck}"
                )
        try:
            out, err = await comm
        except subprocess.TimeoutExpired:
            self.kill()
            err = self.p.stderr.read()[-3000:] if self.p.stderr is not None else ""
            stuck = await describe_stuck(b) if b is not None else ""
            pytest.fail(f"{self.label} did not finish within {timeout}s {context}\n{stuck}\n{err}")
        assert self.p.returncode == 0, f"{self.label} exited {self.p.returncode}:\n{err[-4000:]}"
        lines = out.strip().splitlines()
        assert lines, f"{self.label} printed nothing:\n{err[-4000:]}"
        result: dict[str, Any] = json.loads(lines[-1])
        return result


class StrandedRun(AssertionError):
    """A parent left waiting on a child that is already terminal: the child's completion
    was neither delivered (its placeholder is not `completed`, the `child:` waiter is
    still there) nor buffered, and the parent's reconcile re-drives do not repair it."""


async def stranded_children(b: Backend, run_id: str) -> list[str]:
    """Children `run_id` still waits on although they are terminal, with their completion
    neither delivered nor buffered (a lost parent notification)."""
    runs = await b.runs()
    if run_id not in runs or runs[run_id]["status"] in TERMINAL:
        return []
    prefix = "signal:child:"
    open_children = [
        cp["name"][len(prefix) :]
        for cp in await b.checkpoints(run_id)
        if cp["name"].startswith(prefix) and cp["status"] != "completed"
    ]
    if not open_children:
        return []
    waiters = {
        w["token"]
        for w in await b._rows("SELECT token FROM durable_signal_waiters WHERE run_id = $1", run_id)
    }
    buffered = {r["token"] for r in await b._rows("SELECT token FROM durable_buffered_signals")}
    return [
        c
        for c in open_children
        if runs.get(c, {}).get("status") in TERMINAL
        and f"child:{c}" in waiters
        and f"child:{c}" not in buffered
    ]


async def describe_stuck(b: Backend) -> str:
    """The non-terminal runs and their non-completed checkpoints (for a failure message)."""
    runs = await b.runs()
    stuck = {rid: r for rid, r in runs.items() if r["status"] not in TERMINAL}
    lines = [f"{len(stuck)} of {len(runs)} runs non-terminal:"]
    for rid in sorted(stuck)[:8]:
        open_cps = [
            (cp["seq"], cp["name"], cp["status"])
            for cp in await b.checkpoints(rid)
            if cp["status"] != "completed"
        ]
        extra = await b._rows(
            "SELECT wake_at, locked_by, locked_until FROM durable_workflow_runs WHERE id = $1",
            rid,
        )
        lines.append(f"  {rid}: {stuck[rid]['status']} {extra[0]} open rows {open_cps[:6]}")
        for _seq, name, _status in open_cps[:6]:
            if name.startswith("signal:child:"):
                child = name[len("signal:child:") :]
                row = await b._rows(
                    "SELECT status, updated_at, locked_by FROM durable_workflow_runs WHERE id = $1",
                    child,
                )
                lines.append(f"    awaited child {child}: {row[0] if row else 'missing'}")
    waiters = await b._rows("SELECT token, run_id, seq FROM durable_signal_waiters")
    buffered = await b._rows("SELECT token FROM durable_buffered_signals")
    lines.append(f"  {len(waiters)} signal waiters, e.g. {waiters[:4]}")
    lines.append(f"  {len(buffered)} buffered signals, e.g. {buffered[:4]}")
    return "\n".join(lines)


async def wait_until(
    what: str, cond: Callable[[], bool], proc: Proc | None = None, timeout: float = 20.0
) -> None:
    """Poll `cond` (bounded); fail early when `proc` died."""
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and not proc.alive():
            pytest.fail(f"{proc.label} exited {proc.p.returncode} before {what}:\n{proc.stderr()}")
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out ({timeout}s) waiting for {what}")
        await asyncio.sleep(0.02)


@contextlib.contextmanager
def reaping() -> Any:
    """Every process appended to the yielded list is SIGKILLed when the test ends."""
    procs: list[Proc] = []
    try:
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.kill()
