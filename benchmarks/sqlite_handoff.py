"""What one SQLite checkpoint write costs on this machine, by where it runs (issue #7, W4).

Prints one JSON line: microseconds per autocommitted one-row insert (WAL, synchronous=NORMAL,
durably's pragmas) when it runs

* ``direct_us``: on the calling thread (what durably's loop lane does for a lone statement);
* ``thread_hop_us``: on a dedicated thread, the asyncio caller waiting for each one (a queue to
  the thread, ``call_soon_threadsafe`` back: what a writer thread costs per sequential write);
* ``aiosqlite_us``: through ``aiosqlite`` (the same hand-off, as SQLAlchemy's driver does it).

The difference between the last two and the first is the price of the two thread hand-offs;
on an idle VM each one wakes a halted vCPU, so it is larger on a quiet machine than on a busy
one (``loadavg_1m`` is recorded). Usage::

    python benchmarks/sqlite_handoff.py [--n 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common

from durably._store.sql.dialect import SQLITE_PRAGMAS

INSERT = "INSERT INTO t VALUES (?, ?, ?)"
PAYLOAD = '{"x": 1}'


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    for pragma in SQLITE_PRAGMAS:
        conn.execute(pragma).fetchall()
    conn.execute("CREATE TABLE IF NOT EXISTS t (run TEXT, seq INT, v TEXT, PRIMARY KEY (run, seq))")
    return conn


def direct(conn: sqlite3.Connection, n: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        conn.execute(INSERT, ("direct", i, PAYLOAD))
    return (time.perf_counter() - started) / n * 1e6


async def thread_hop(conn: sqlite3.Connection, n: int) -> float:
    loop = asyncio.get_running_loop()
    requests: queue.SimpleQueue[tuple[asyncio.Future[None], int] | None] = queue.SimpleQueue()

    def worker() -> None:
        while (item := requests.get()) is not None:
            future, i = item
            conn.execute(INSERT, ("hop", i, PAYLOAD))
            loop.call_soon_threadsafe(future.set_result, None)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    started = time.perf_counter()
    for i in range(n):
        future: asyncio.Future[None] = loop.create_future()
        requests.put((future, i))
        await future
    elapsed = time.perf_counter() - started
    requests.put(None)
    thread.join()
    return elapsed / n * 1e6


async def through_aiosqlite(path: str, n: int) -> float:
    import aiosqlite

    async with aiosqlite.connect(path, isolation_level=None) as db:
        for pragma in SQLITE_PRAGMAS:
            await db.execute_fetchall(pragma)
        started = time.perf_counter()
        for i in range(n):
            await db.execute(INSERT, ("aiosqlite", i, PAYLOAD))
        return (time.perf_counter() - started) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5000)
    args = parser.parse_args()
    report: dict[str, Any] = {"n": args.n, "loadavg_1m_start": bench_common.loadavg_1m()}
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "handoff.db")
        conn = _connect(path)
        report["direct_us"] = round(direct(conn, args.n), 1)
        report["thread_hop_us"] = round(asyncio.run(thread_hop(conn, args.n)), 1)
        conn.close()
        report["aiosqlite_us"] = round(asyncio.run(through_aiosqlite(path, args.n)), 1)
    report["sqlite"] = sqlite3.sqlite_version
    report["loadavg_1m"] = bench_common.loadavg_1m()
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
