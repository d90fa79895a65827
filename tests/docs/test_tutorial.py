"""The tutorial (docs/guide/tutorial.md) works as written.

Its files (`shop.py`, `web.py`) and its `durably …` commands are read from the page, so the
page and this test cannot drift: the test creates the tables with the page's `durably db
upgrade`, starts the page's two `durably worker shop:engine` processes on a fresh PostgreSQL
schema, drives the page's FastAPI app in-process (its lifespan included) to place and approve
orders by workflow name, and checks that every order completes and that both workers charged
some of them — as the page says.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shlex
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.docs.blocks import DOCS, commands, page_files, read_blocks
from tests.pg_support import fresh_schema, schema_url

PAGE = DOCS / "guide" / "tutorial.md"
ORDERS = 8
DEADLINE_S = 25


def _argv(command: str) -> list[str]:
    # The page's `durably …` run by this interpreter's durably (the console script's module).
    words = shlex.split(command)
    assert words[0] == "durably"
    return [sys.executable, "-m", "durably", *words[1:]]


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"tutorial_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.ready = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            self.lines.append(line)
            if " ready: " in line:
                self.ready.set()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    async def stop(self) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.proc.wait(), 20)
        await self._reader
        return code


@asynccontextmanager
async def _workers(
    argvs: list[list[str]], env: dict[str, str], cwd: Path
) -> AsyncIterator[list[Worker]]:
    workers: list[Worker] = []
    try:
        for argv in argvs:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            workers.append(Worker(proc))
        yield workers
    finally:
        for w in workers:
            if w.proc.returncode is None:
                w.proc.kill()
                await w.proc.wait()


async def test_tutorial_app_and_two_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = read_blocks(PAGE)
    files = page_files(blocks)
    assert set(files) == {"shop.py", "web.py"}, files.keys()
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    durably_commands = commands(blocks, "durably")
    upgrade = [c for c in durably_commands if c.startswith("durably db upgrade")]
    workers = [c for c in durably_commands if c.startswith("durably worker")]
    assert upgrade == ["durably db upgrade"]
    assert workers == ["durably worker shop:engine"] * 2, durably_commands

    async with fresh_schema(create=False) as schema:
        store = schema_url(schema)
        env = {
            **os.environ,
            "DURABLY_STORE": store,
            "TMPDIR": str(tmp_path),  # the default instance ids' lock files
            "PYTHONPATH": str(tmp_path),
            # One run per pick-up, so that orders placed one by one are shared out (the
            # default leases up to 16 at once; either way each worker takes what it leases).
            "DURABLY_CLAIM_BATCH": "1",
        }
        done = await asyncio.create_subprocess_exec(
            *_argv(upgrade[0]),
            cwd=tmp_path,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(done.communicate(), 30)
        assert done.returncode == 0, out.decode()

        async with _workers([_argv(c) for c in workers], env, tmp_path) as procs:
            for w in procs:
                try:
                    await asyncio.wait_for(w.ready.wait(), 20)
                except TimeoutError:
                    pytest.fail(f"worker never became ready:\n{w.output}")
            ids = sorted(w.output.split("durably worker ", 1)[1].split(" ready")[0] for w in procs)
            assert ids[0].endswith(":shop:engine") and ids[1] == f"{ids[0]}#2", ids

            monkeypatch.setenv("DURABLY_STORE", store)
            web = _load(tmp_path / "web.py")
            async with web.app.router.lifespan_context(web.app):
                transport = httpx.ASGITransport(app=web.app)
                async with httpx.AsyncClient(transport=transport, base_url="http://shop") as http:
                    for i in range(ORDERS):
                        r = await http.post("/orders", json={"id": f"o-{i}", "amount": 42})
                        assert r.status_code == 202, r.text
                        assert r.json() == {"run_id": f"order-o-{i}"}
                    again = await http.post("/orders", json={"id": "o-0", "amount": 42})
                    assert again.json() == {"run_id": "order-o-0"}  # idempotent by run id
                    for i in range(ORDERS):
                        r = await http.post(f"/orders/o-{i}/approve", params={"by": "alice"})
                        assert r.status_code == 200, r.text
                    results = await _until_completed(http, procs)
                    assert (await http.get("/orders/nope")).status_code == 404

            for i, result in enumerate(results):
                assert result["error"] is None
                assert result["output"]["approved_by"] == "alice"
                assert result["output"]["receipt"] == f"receipt for ch-o-{i} sent"
            pids = {r["output"]["worker_pid"] for r in results}
            assert pids == {w.proc.pid for w in procs}, "both workers should have charged orders"

            for w in procs:  # SIGTERM drains and exits 0, as the page says
                assert await w.stop() == 0, w.output


async def _until_completed(http: httpx.AsyncClient, procs: list[Worker]) -> list[dict[str, Any]]:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        results = [(await http.get(f"/orders/o-{i}")).json() for i in range(ORDERS)]
        if all(r["status"] == "completed" for r in results):
            return results
        failed = [r for r in results if r["status"] in ("failed", "dead", "cancelled")]
        if failed or time.monotonic() > deadline:
            logs = "\n---\n".join(w.output for w in procs)
            pytest.fail(f"orders not completed: {results}\nworkers:\n{logs}")
        await asyncio.sleep(0.1)
