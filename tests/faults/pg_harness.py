"""Shared machinery of the PostgreSQL fault suite (tests/faults/test_pg_*.py).

* `require_postgres()`: reach the server (tests/pg_support.py, `DURABLY_TEST_PG_URL`) or skip
  — fail under `DURABLY_REQUIRE_SERVICES=1`;
* `fresh_database()`: a new database `durably_fault_<hex>` per scenario, dropped afterwards
  (`DURABLY_FAULT_KEEP_DB=1` keeps it for inspection);
* `prepare()`: enqueue the runs through an API-only engine (`drive=False`), then install audit
  triggers (`install_audit`) that record every run status / lease-owner transition and every
  rewrite of a completed checkpoint, independently of durably;
* `Worker`: a real `fault_app.py` subprocess (SIGKILL, SIGTERM drain, readiness, logs);
* `wait_terminal()`: poll the database (bounded) until every run is terminal;
* `check_invariants()`: the invariants every scenario must satisfy, from the side-effect
  log, the tables and the audit, raising `InvariantViolation` with `checked <runs> runs and
  <steps> steps` in the message; `known_bug(*kinds)` turns violations of only those kinds
  into `KnownEngineBug` for a precise `xfail(raises=KnownEngineBug, strict=True)`;
* `own_postgres()` / `restart_postgres(server)`: a throw-away PostgreSQL server of the test's
  own (initdb into a temporary folder, a free port) that a test may restart; the machine's
  shared server is never restarted, stopped or reconfigured.

The database is read with plain asyncpg (not through durably's store), so the checks do not
depend on the code under test.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.faults.fault_app import expected_output
from tests.pg_support import PG_URL, require_pg, services_required

APP = Path(__file__).with_name("fault_app.py")
SRC = str(Path(__file__).resolve().parents[2] / "src")
TERMINAL = ("completed", "failed", "cancelled", "dead")
STEP_NAME = "fault.step"


def pg_admin_url() -> str:
    """The test server (`DURABLY_TEST_PG_URL`, tests/pg_support.py) as a plain asyncpg DSN;
    scenario databases are created through it."""
    scheme, sep, rest = PG_URL.partition("://")
    return f"postgresql{sep}{rest}" if scheme.startswith("postgres") else PG_URL


def _with_database(url: str, name: str) -> str:
    base, _, query = url.partition("?")
    head, _, _ = base.rpartition("/")
    return f"{head}/{name}" + (f"?{query}" if query else "")


async def _connect(url: str, timeout: float = 5.0, patience: float = 15.0) -> Any:
    """A plain asyncpg connection; retried while the server is (re)starting."""
    import asyncpg

    deadline = time.monotonic() + patience
    while True:
        try:
            return await asyncpg.connect(url, timeout=timeout)
        except (OSError, asyncpg.CannotConnectNowError, asyncpg.ConnectionDoesNotExistError):
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.2)


async def require_postgres() -> None:
    """Skip the test when PostgreSQL is unreachable; fail instead under
    `DURABLY_REQUIRE_SERVICES=1` (CI must not pass by skipping)."""
    await require_pg()


@contextlib.asynccontextmanager
async def fresh_database(admin: str | None = None) -> AsyncIterator[str]:
    """`CREATE DATABASE durably_fault_<uuid>` on the test server (or on the server of the
    `admin` URL, e.g. an `OwnPostgres`); yields its URL; terminates its connections and drops
    it afterwards."""
    if admin is None:
        await require_postgres()
        admin = pg_admin_url()
    name = f"durably_fault_{uuid.uuid4().hex[:12]}"
    conn = await _connect(admin)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        yield _with_database(admin, name)
    finally:
        if os.environ.get("DURABLY_FAULT_KEEP_DB") == "1":  # debugging: keep it to inspect
            print(f"kept database {name}")
        else:
            await drop_database(name, admin)


async def drop_database(name: str, admin: str | None = None) -> None:
    conn = await _connect(admin or pg_admin_url())
    try:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()",
            name,
        )
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


# ------------------------------------------------------------------ runs


def run_ids(n: int) -> list[str]:
    return [f"f{i:04d}" for i in range(n)]


async def seed(url: str, n: int, steps: int) -> list[str]:
    """Enqueue `n` runs of `fault.wf` (run `f<i>` has salt i) through an engine that does
    not drive, as an API replica would; returns their ids."""
    import durably
    from tests.faults.fault_app import fault_wf

    ids = run_ids(n)
    async with durably.Engine(
        store=url, workflows=[fault_wf], drive=False, instance_id="fault-api"
    ) as api:
        sem = asyncio.Semaphore(16)

        async def start(i: int, run_id: str) -> None:
            async with sem:
                await api.start(fault_wf, {"steps": steps, "salt": i}, run_id=run_id)

        await asyncio.gather(*(start(i, rid) for i, rid in enumerate(ids)))
    return ids


_AUDIT_SQL = """
CREATE TABLE fault_run_audit (
    n BIGSERIAL PRIMARY KEY, run_id TEXT, old_status TEXT, new_status TEXT, locked_by TEXT,
    at TIMESTAMPTZ DEFAULT clock_timestamp());
CREATE TABLE fault_checkpoint_audit (
    n BIGSERIAL PRIMARY KEY, run_id TEXT, seq INTEGER, old_status TEXT, new_status TEXT,
    at TIMESTAMPTZ DEFAULT clock_timestamp());
CREATE FUNCTION fault_run_audit_fn() RETURNS trigger AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status OR NEW.locked_by IS DISTINCT FROM OLD.locked_by
    THEN
        INSERT INTO fault_run_audit (run_id, old_status, new_status, locked_by)
        VALUES (NEW.id, OLD.status, NEW.status, NEW.locked_by);
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE FUNCTION fault_checkpoint_audit_fn() RETURNS trigger AS $$
BEGIN
    INSERT INTO fault_checkpoint_audit (run_id, seq, old_status, new_status)
    VALUES (NEW.run_id, NEW.seq, OLD.status, NEW.status);
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER fault_run_audit_tr AFTER UPDATE ON durable_workflow_runs
    FOR EACH ROW EXECUTE FUNCTION fault_run_audit_fn();
CREATE TRIGGER fault_checkpoint_audit_tr AFTER UPDATE ON durable_step_checkpoints
    FOR EACH ROW WHEN (OLD.status = 'completed') EXECUTE FUNCTION fault_checkpoint_audit_fn();
"""


async def install_audit(url: str) -> None:
    """Triggers (independent of durably) recording every run status transition and every
    rewrite of a completed checkpoint, for `check_invariants`. Call after `seed` (the
    tables exist)."""
    conn = await _connect(url)
    try:
        await conn.execute(_AUDIT_SQL)
    finally:
        await conn.close()


async def prepare(url: str, n: int, steps: int) -> list[str]:
    """`seed` the runs, then `install_audit`."""
    ids = await seed(url, n, steps)
    await install_audit(url)
    return ids


async def fetch_audit(url: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    conn = await _connect(url)
    try:
        runs = await conn.fetch("SELECT * FROM fault_run_audit ORDER BY n")
        cps = await conn.fetch("SELECT * FROM fault_checkpoint_audit ORDER BY n")
    finally:
        await conn.close()
    return [dict(r) for r in runs], [dict(r) for r in cps]


async def fetch_runs(url: str) -> dict[str, dict[str, Any]]:
    conn = await _connect(url)
    try:
        rows = await conn.fetch(
            "SELECT id, status, output, error, locked_by, locked_until, recovery_attempts "
            "FROM durable_workflow_runs"
        )
    finally:
        await conn.close()
    return {row["id"]: dict(row) for row in rows}


async def fetch_step_checkpoints(url: str) -> list[dict[str, Any]]:
    conn = await _connect(url)
    try:
        rows = await conn.fetch(
            "SELECT run_id, seq, name, status, input FROM durable_step_checkpoints WHERE name = $1",
            STEP_NAME,
        )
    finally:
        await conn.close()
    return [dict(row) for row in rows]


async def wait_terminal(
    url: str, ids: Iterable[str], timeout: float, workers: Iterable[Worker] = ()
) -> float:
    """Poll (bounded) until every run is terminal; returns the seconds it took. On timeout
    the failure names the stuck runs and shows the workers' stderr."""
    wanted = set(ids)
    started = time.monotonic()
    deadline = started + timeout
    stuck: dict[str, dict[str, Any]] = {}
    while True:
        try:
            runs = await fetch_runs(url)
        except Exception:  # PostgreSQL restarting: try again
            runs = None
        if runs is not None:
            stuck = {rid: runs.get(rid, {"status": "missing"}) for rid in wanted}
            stuck = {rid: r for rid, r in stuck.items() if r["status"] not in TERMINAL}
            if not stuck:
                return time.monotonic() - started
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.1)
    sample = dict(sorted(stuck.items())[:5])
    details = "\n".join(w.describe() for w in workers)
    raise AssertionError(
        f"{len(stuck)} of {len(wanted)} runs are not terminal after {timeout:.0f}s "
        f"(stuck), e.g. {sample}\n{details}"
    )


# ------------------------------------------------------------------ worker processes


class Worker:
    """One `fault_app.py` process."""

    def __init__(
        self,
        url: str,
        log: Path,
        workdir: Path,
        name: str,
        *,
        instance: str | None,
        lease_ms: int = 1500,
        poll_ms: int = 100,
        step_ms: int = 0,
        kill: str | None = None,
        max_concurrent: int | None = None,
        drain_ms: int | None = None,
        start_at: float | None = None,
        db_latency_ms: int | None = None,
    ) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])),
            "FAULT_LEASE_MS": str(lease_ms),
            "FAULT_POLL_MS": str(poll_ms),
            "FAULT_STEP_MS": str(step_ms),
        }
        for key, value in (
            ("FAULT_INSTANCE", instance),
            ("FAULT_KILL", kill),
            ("FAULT_MAX_CONCURRENT", max_concurrent),
            ("FAULT_DRAIN_MS", drain_ms),
            ("FAULT_START_AT", start_at),
            ("FAULT_DB_LATENCY_MS", db_latency_ms),
        ):
            env.pop(key, None)
            if value is not None:
                env[key] = str(value)
        self.name = name
        self.instance = instance
        self.out_path = workdir / f"{name}.out"
        self.err_path = workdir / f"{name}.err"
        self._out = self.out_path.open("w")
        self._err = self.err_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(APP), url, str(log)],
            env=env,
            stdout=self._out,
            stderr=self._err,
        )
        self.pid = self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stdout(self) -> str:
        return self.out_path.read_text() if self.out_path.exists() else ""

    def stderr(self) -> str:
        return self.err_path.read_text() if self.err_path.exists() else ""

    def describe(self, tail: int = 3000) -> str:
        code = self.proc.poll()
        return (
            f"--- worker {self.name} (pid {self.pid}, instance {self.instance}, "
            f"exit {code}) stdout: {self.stdout()[-500:]!r}\n"
            f"stderr (tail): {self.stderr()[-tail:]}"
        )

    async def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while "READY" not in self.stdout():
            if not self.alive:
                raise AssertionError(f"worker died before it was ready\n{self.describe()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"worker not ready after {timeout}s\n{self.describe()}")
            await asyncio.sleep(0.02)

    async def wait_exit(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.alive:
            if time.monotonic() > deadline:
                raise AssertionError(f"worker did not exit within {timeout}s\n{self.describe()}")
            await asyncio.sleep(0.02)
        self._close_files()
        return self.proc.returncode

    async def wait_killed(self, timeout: float) -> None:
        """Wait for the worker's self-SIGKILL at its boundary."""
        code = await self.wait_exit(timeout)
        assert code == -signal.SIGKILL, f"expected a SIGKILL, got exit {code}\n{self.describe()}"

    def sigkill(self) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)

    def sigterm(self) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)

    async def drain_and_exit(self, timeout: float = 30.0) -> None:
        """SIGTERM (graceful drain, like `durably worker`) and require a clean exit."""
        self.sigterm()
        code = await self.wait_exit(timeout)
        assert code == 0 and "DRAINED" in self.stdout(), (
            f"worker did not drain cleanly (exit {code})\n{self.describe()}"
        )

    def stop(self) -> None:
        """Last-resort cleanup (finally blocks): SIGKILL this worker if it still runs."""
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=10)
        self._close_files()

    def _close_files(self) -> None:
        for f in (self._out, self._err):
            if not f.closed:
                f.close()


@contextlib.asynccontextmanager
async def workers_cleanup() -> AsyncIterator[list[Worker]]:
    """Collects the scenario's workers; every one still alive at the end is killed."""
    procs: list[Worker] = []
    try:
        yield procs
    finally:
        for w in procs:
            w.stop()


# ------------------------------------------------------------------ the side-effect log


@dataclass(frozen=True, slots=True)
class Line:
    index: int
    run: str
    n: int  # step index (effect) or checkpoint seq (committed, kill)
    kind: str  # effect | committed | kill
    pid: int
    extra: str = ""


def read_log(log: Path) -> list[Line]:
    if not log.exists():
        return []
    text = log.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        # The last line is still being written (a read racing a worker's append sees part of
        # it); it is read whole on the next look. A torn line anywhere else is a real tear.
        lines.pop()
    out = []
    for index, raw in enumerate(lines):
        parts = raw.split()
        if len(parts) < 4:
            raise AssertionError(f"torn side-effect log line {index}: {raw!r}")
        out.append(
            Line(index, parts[0], int(parts[1]), parts[2], int(parts[3]), " ".join(parts[4:]))
        )
    return out


def kill_line(log: Path, pid: int) -> Line | None:
    found = [ln for ln in read_log(log) if ln.kind == "kill" and ln.pid == pid]
    return found[0] if found else None


async def wait_for_lines(log: Path, predicate: Any, timeout: float, what: str) -> list[Line]:
    deadline = time.monotonic() + timeout
    while True:
        lines = read_log(log)
        if predicate(lines):
            return lines
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


# ------------------------------------------------------------------ invariants

# Kinds of invariant violation (`InvariantViolation.kinds`).
NOT_COMPLETED = "not-completed"  # a run not completed, or with the wrong output
RESURRECTED = "resurrected"  # a run left a terminal status
RERUN_AFTER_COMMIT = "rerun-after-commit"  # an effect after the step's committed line
CHECKPOINT_REWRITTEN = "checkpoint-rewritten"  # a completed checkpoint written again
CONCURRENT = "concurrent"  # a run executed in two processes at once
LOST = "lost"  # a step with no effect or no completed checkpoint
MALFORMED = "malformed"  # anything else inconsistent (unknown runs, bad step inputs)


class InvariantViolation(AssertionError):
    """`check_invariants` failed; `kinds` names the kinds of violation found."""

    def __init__(self, message: str, kinds: frozenset[str]):
        super().__init__(message)
        self.kinds = kinds


class KnownEngineBug(AssertionError):
    """Raised by `known_bug` for violations that are all of the kinds a known engine bug
    produces; tests mark exactly this with `xfail(raises=KnownEngineBug, strict=True)`, so
    any other failure still fails them."""


@contextlib.contextmanager
def known_bug(*kinds: str) -> Iterator[None]:
    try:
        yield
    except InvariantViolation as exc:
        if exc.kinds <= set(kinds):
            raise KnownEngineBug(str(exc)) from exc
        raise


@dataclass
class Report:
    runs: int = 0
    steps: int = 0
    effects: int = 0
    reruns: int = 0  # (run, step) pairs whose effect ran more than once
    moved: int = 0  # runs executed by more than one process (one after the other)
    recoveries: int = 0  # running -> pending transitions (recover_incomplete)
    pids: collections.Counter[int] = field(default_factory=collections.Counter)

    @property
    def summary(self) -> str:
        return f"checked {self.runs} runs and {self.steps} steps"

    def details(self) -> str:
        return (
            f"{self.effects} effects, {self.reruns} steps re-executed (interrupted before "
            f"their checkpoint), {self.moved} runs moved between processes; runs per pid: "
            f"{dict(self.pids)}; {self.recoveries} running->pending recoveries"
        )


async def check_invariants(
    url: str,
    log: Path,
    ids: list[str],
    steps: int,
    *,
    workers: Iterable[Worker] = (),
    label: str = "",
) -> Report:
    """The invariants of every scenario:

    1. every run ends terminal — `completed` with the right output (none stuck is checked
       before, by `wait_terminal`, with a bounded wait);
    2. no step ran again after its checkpoint committed: no `effect` line for (run, step)
       after a `committed` line of (run, seq) — step i is checkpoint seq i, which is checked
       against the stored checkpoints' inputs — and (audit trigger) no completed checkpoint
       was ever written again; no run left a terminal status;
    3. no run executed in two processes at once: per run, the pids of its effect/committed
       lines form contiguous blocks in log order (A…A B…B, never A B A);
    4. nothing lost: every (run, step) has at least one effect line and a completed
       checkpoint in the database. (Not necessarily a `committed` line: a SIGKILL can land
       after the database committed a checkpoint and before the process read the reply.)
    Raises `InvariantViolation` (an AssertionError) whose message starts with
    `checked <runs> runs and <steps> steps`.
    """
    report = Report()
    problems: list[tuple[str, str]] = []

    def problem(kind: str, message: str) -> None:
        problems.append((kind, message))

    runs = await fetch_runs(url)
    cps = await fetch_step_checkpoints(url)
    run_audit, cp_audit = await fetch_audit(url)
    lines = read_log(log)
    known = set(ids)

    # terminal is final: no run left a terminal status (resurrection)
    for row in run_audit:
        if row["old_status"] in TERMINAL and row["new_status"] != row["old_status"]:
            problem(
                RESURRECTED,
                f"{row['run_id']}: resurrected {row['old_status']} -> {row['new_status']} "
                f"(locked_by {row['locked_by']}, at {row['at']:%H:%M:%S.%f})",
            )
        if row["old_status"] == "running" and row["new_status"] == "pending":
            report.recoveries += 1
    # a committed checkpoint is never written again (catches a re-run step even when the
    # kill hid its `committed` line)
    for row in cp_audit:
        if row["run_id"] in known:
            problem(
                CHECKPOINT_REWRITTEN,
                f"{row['run_id']} step {row['seq']}: its completed checkpoint was written "
                f"again ({row['old_status']} -> {row['new_status']}, at {row['at']:%H:%M:%S.%f})",
            )

    salt = {rid: i for i, rid in enumerate(ids)}
    for rid in ids:
        report.runs += 1
        run = runs.get(rid)
        if run is None:
            problem(LOST, f"{rid}: missing from the database")
            continue
        output = json.loads(run["output"]) if run["output"] is not None else None
        want = expected_output(steps, salt[rid])
        if run["status"] != "completed" or output != want:
            problem(
                NOT_COMPLETED,
                f"{rid}: status {run['status']} output {output!r} (want completed {want}); "
                f"error {run['error']}",
            )
    extra = sorted(set(runs) - known)
    if extra:
        problem(MALFORMED, f"unexpected runs in the database: {extra[:5]}")

    stored: dict[tuple[str, int], dict[str, Any]] = {}
    for cp in cps:
        stored[(cp["run_id"], cp["seq"])] = cp
        step_input = json.loads(cp["input"]) if cp["input"] else None
        if not isinstance(step_input, dict) or step_input.get("i") != cp["seq"]:
            problem(MALFORMED, f"checkpoint {cp['run_id']}#{cp['seq']} has input {step_input!r}")

    by_run: dict[str, list[Line]] = collections.defaultdict(list)
    for ln in lines:
        if ln.kind in ("effect", "committed"):
            by_run[ln.run].append(ln)
    for rid in by_run:
        if rid not in known:
            problem(MALFORMED, f"log lines for an unknown run {rid}")

    for rid in ids:
        mine = by_run.get(rid, [])
        committed_at: dict[int, Line] = {}
        effects: collections.Counter[int] = collections.Counter()
        for ln in mine:
            if ln.kind == "committed":
                committed_at.setdefault(ln.n, ln)
                continue
            effects[ln.n] += 1
            report.effects += 1
            first_commit = committed_at.get(ln.n)
            if first_commit is not None:
                problem(
                    RERUN_AFTER_COMMIT,
                    f"{rid} step {ln.n}: ran again (pid {ln.pid}, log line {ln.index}) after "
                    f"its checkpoint committed (pid {first_commit.pid}, log line "
                    f"{first_commit.index})",
                )
        # contiguous pid blocks: once a process handed the run over it never comes back
        blocks: list[int] = []
        for ln in mine:
            if not blocks or blocks[-1] != ln.pid:
                blocks.append(ln.pid)
        if len(blocks) != len(set(blocks)):
            problem(
                CONCURRENT,
                f"{rid}: executed by two processes at once: pid sequence {blocks} "
                f"(log lines {[(ln.index, ln.n, ln.kind, ln.pid) for ln in mine]})",
            )
        if len(set(blocks)) > 1:
            report.moved += 1
        for pid in set(blocks):
            report.pids[pid] += 1
        for i in range(steps):
            report.steps += 1
            if effects[i] == 0:
                problem(LOST, f"{rid} step {i}: lost — no effect line")
            if effects[i] > 1:
                report.reruns += 1
            cp = stored.get((rid, i))
            if cp is None or cp["status"] != "completed":
                problem(LOST, f"{rid} step {i}: stored checkpoint {cp}")
        unexpected = sorted(set(effects) - set(range(steps)))
        if unexpected:
            problem(MALFORMED, f"{rid}: effects of steps that do not exist: {unexpected}")

    head = f"{label + ': ' if label else ''}{report.summary}"
    print(f"{head} ({report.details()})")
    if problems:
        kinds = frozenset(kind for kind, _ in problems)
        messages = [f"[{kind}] {message}" for kind, message in problems]
        log.with_name(log.name + ".violations").write_text("\n".join(messages) + "\n")
        counts = collections.Counter(kind for kind, _ in problems)
        shown = "\n".join(messages[:25])
        more = f"\n… and {len(problems) - 25} more" if len(problems) > 25 else ""
        ctx = "\n".join(w.describe(1500) for w in workers)
        raise InvariantViolation(
            f"{head}: {len(problems)} invariant violations {dict(counts)}\n{shown}{more}\n{ctx}",
            kinds,
        )
    return report


# ------------------------------------------------------------------ a PostgreSQL server of our own


def _version_key(path: str) -> tuple[int, ...]:
    # /usr/lib/postgresql/<version>/bin: the newest installed version wins
    part = Path(path).parent.name
    return tuple(int(p) for p in part.split(".") if p.isdigit())


def postgres_bin_dir() -> Path | None:
    """The folder holding `initdb` and `pg_ctl`: `DURABLY_PG_BIN`, else the newest
    `/usr/lib/postgresql/*/bin` (Debian's layout, where they are not on PATH), else PATH."""
    configured = os.environ.get("DURABLY_PG_BIN")
    candidates = [configured] if configured else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for folder in candidates:
        if (Path(folder) / "initdb").is_file() and (Path(folder) / "pg_ctl").is_file():
            return Path(folder)
    return None


def _own_postgres_refusal() -> str | None:
    if postgres_bin_dir() is None:
        return (
            "the PostgreSQL server binaries (initdb, pg_ctl) are not installed "
            "(set DURABLY_PG_BIN to their folder)"
        )
    if os.geteuid() == 0:
        # initdb refuses root: the server runs as the `postgres` OS user
        if shutil.which("runuser") is None:
            return "running as root, and runuser is missing to start PostgreSQL as postgres"
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no postgres OS user to run PostgreSQL as"
    return None


def require_own_postgres() -> None:
    """Skip (fail under `DURABLY_REQUIRE_SERVICES=1`) when this machine cannot run a
    PostgreSQL server of the test's own."""
    reason = _own_postgres_refusal()
    if reason is None:
        return
    if services_required():
        pytest.fail(f"DURABLY_REQUIRE_SERVICES=1 but {reason}", pytrace=False)
    pytest.skip(reason)


class OwnPostgres:
    """A throw-away PostgreSQL server on a free port, in a temporary folder, for tests that
    restart the database. The machine's shared server (the one every other test and whatever
    else runs on the machine use) is never restarted: a restart drops every connection it
    holds, someone else's too.

    The folder is made with `tempfile.mkdtemp` (not pytest's tmp_path, which only root can
    enter) and, under root, handed to the `postgres` OS user, since initdb refuses to run as
    root. The server listens on 127.0.0.1 and on a socket in that folder (never the shared
    /var/run/postgresql), trusts local connections, and is stopped and deleted by `stop()`."""

    def __init__(self) -> None:
        bin_dir = postgres_bin_dir()
        assert bin_dir is not None, "call require_own_postgres() first"
        self.bin = bin_dir
        self.port = _free_port()
        # short: the socket path (folder + /.s.PGSQL.<port>) must fit in 107 bytes
        self.folder = Path(tempfile.mkdtemp(prefix="durably-pg-"))
        self.data = self.folder / "data"
        self.log = self.folder / "server.log"
        self.admin_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            entry = pwd.getpwnam("postgres")
            os.chown(self.folder, entry.pw_uid, entry.pw_gid)
        self.folder.chmod(0o700)

    def _run(self, *args: str, timeout: float = 120.0) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise AssertionError(
                f"{' '.join(command)} exited {result.returncode}\n{result.stdout}"
                f"{result.stderr}\nserver log (tail): {log}"
            )

    def _options(self) -> str:
        return f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1"

    def start(self) -> None:
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
            "-E", "UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", self._options(),
            "-w", "-t", "60", "start",
        )  # fmt: skip

    def restart(self) -> None:
        """`pg_ctl restart -m fast`, as a service manager restarts PostgreSQL: every
        connection is dropped and the server is back when it returns."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", self._options(),
            "-m", "fast", "-w", "-t", "60", "restart",
        )  # fmt: skip

    def stop(self) -> None:
        """Stop the server (immediately: it is thrown away) and delete its folder."""
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def own_postgres() -> AsyncIterator[OwnPostgres]:
    """A started `OwnPostgres`, stopped and deleted when the block ends, whatever happened."""
    require_own_postgres()
    server = OwnPostgres()
    try:
        await asyncio.to_thread(server.start)
        yield server
    finally:
        await asyncio.to_thread(server.stop)


async def restart_postgres(server: OwnPostgres) -> float:
    """Restart the test's own server (in a thread, so the test's loop keeps running);
    returns the seconds it took until it accepted connections again."""
    started = time.monotonic()
    await asyncio.to_thread(server.restart)
    return time.monotonic() - started
