"""A buffered signal survives a SIGKILL while it is being consumed, on SQLite and PostgreSQL:
the run receives it exactly once.

* `wait`: a signal is sent before its run waits, so it is buffered. The engine process
  (signal_buffer_app.py) starts the run and SIGKILLs itself where the wait consumes the row:
  just before the store call (`before-take`), or just after it committed (`after-take`). At
  the kill the signal must be in exactly one place, still buffered or in the wait's
  checkpoint — the engine used to delete the row with one statement and write the checkpoint
  with the next, and a kill between them lost the signal: the run waited forever. A second
  process with the same instance id takes the run back; it completes with the payload once.
* `send`: the run waits (its body parked in a live engine process) and another process
  signals it, SIGKILLing itself right after the store call that took the waiter. The waiter
  must not be gone without the delivery written (the old sender took the waiter with one
  statement and wrote the delivery with the next). The sender dies before it wakes the run,
  so the live engine finds the delivery at its re-check (`reconcile_ms`).

In both, the workflow waits a second time (for one second): a signal delivered twice would
show up there. The same two tests run for named events (`ctx.wait_for_event`, `publish_event`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import durably
from durably._engine.defs.event_tokens import event_token_prefix
from durably._store.sql import SqlStateStore
from tests.faults.kill_support import kill, store_url

APP = Path(__file__).with_name("signal_buffer_app.py")
SRC = str(Path(__file__).resolve().parents[2] / "src")
ROOT = str(Path(__file__).resolve().parents[2])
PAYLOAD = "approved"


def _spawn(store: str, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(APP), store, *args],
        env={
            **os.environ,
            **env,
            "PYTHONPATH": os.pathsep.join([SRC, ROOT, os.environ.get("PYTHONPATH", "")]),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _line(proc: subprocess.Popen[str], expected: str) -> None:
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=60)
    if line.strip() != expected:
        kill(proc)
        _, err = proc.communicate(timeout=10)
        pytest.fail(f"expected {expected!r} from the process, got {line!r}\n{err}")


async def _killed_itself(proc: subprocess.Popen[str]) -> None:
    try:
        await asyncio.wait_for(asyncio.to_thread(proc.wait), timeout=60)
    except TimeoutError:
        kill(proc)
        _, err = proc.communicate(timeout=10)
        pytest.fail(f"the process never reached its kill point\n{err}")
    if proc.returncode != -signal.SIGKILL:
        _, err = proc.communicate(timeout=10)
        pytest.fail(f"the process ended with {proc.returncode}, not SIGKILL\n{err}")


async def _where_is_the_signal(store: SqlStateStore, token: str, run_id: str) -> dict[str, Any]:
    """Where the signal is right after the kill: still buffered, delivered into a checkpoint
    of the run, and whether a waiter still waits for it at the first wait. (The run may
    already be at its second wait, whose waiter is another matter: a live engine's
    re-check can find the delivery at any moment.)"""
    cps = await store.list_checkpoints(run_id)
    delivered = [
        cp.output for cp in cps if cp.name == f"signal:{token}" and cp.status == "completed"
    ]
    first = min((cp.seq for cp in cps if cp.name == f"signal:{token}"), default=None)
    return {
        "buffered": await store.count_buffered_signals(prefix=token),
        "delivered": delivered,
        "waiting": [
            w.token
            for w in await store.list_signal_waiters(token)
            if first is None or w.seq == first
        ],
    }


async def _result(client: durably.Client, run_id: str) -> Any:
    try:
        return await client.result(run_id, timeout=60)
    except TimeoutError:
        run = await client.get_run(run_id)
        raise AssertionError(
            f"run {run_id} did not complete within 60 s: {run and (run.status, run.error)}"
        ) from None


async def _run_to_its_kill(store: str, *args: str, **env: str) -> None:
    """Run the app until it SIGKILLs itself at its kill point."""
    proc = _spawn(store, *args, **env)
    try:
        await _killed_itself(proc)
    finally:
        kill(proc)


async def _take_back(client: durably.Client, store: str, run_id: str, *args: str) -> Any:
    """A second engine process with the killed one's instance id: the run's output."""
    proc = _spawn(store, *args, SIGBUF_INSTANCE="sb-a")
    try:
        await _line(proc, "STARTED")
        return await _result(client, run_id)
    finally:
        kill(proc)


async def _until_waiting(store: SqlStateStore, prefix: str) -> None:
    """Until a waiter of `prefix` is registered (the run waits, parked)."""
    deadline = asyncio.get_running_loop().time() + 30
    while not await store.list_signal_waiters(prefix):
        assert asyncio.get_running_loop().time() < deadline, "the run never waited"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("die", ["before-take", "after-take"])
@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
async def test_sigkill_while_a_wait_takes_a_buffered_signal_delivers_it_once(
    tmp_path: Path, store_kind: str, die: str
) -> None:
    token, run_id = f"sigbuf:{uuid.uuid4().hex[:8]}", f"sigbuf-{uuid.uuid4().hex[:8]}"
    async with store_url(store_kind, tmp_path, "sigbuf") as url:
        client = durably.Client(url)
        inspect = SqlStateStore.from_url(url)
        try:
            await client.signal(token, PAYLOAD)  # nobody waits yet: buffered
            assert await inspect.count_buffered_signals(prefix=token) == 1
            await _run_to_its_kill(
                url, "wait", token, run_id, SIGBUF_DIE=die, SIGBUF_INSTANCE="sb-a"
            )
            where = await _where_is_the_signal(inspect, token, run_id)
            if die == "before-take":
                assert where == {"buffered": 1, "delivered": [], "waiting": []}, where
            else:
                # committed together: the row left the buffer into the wait's checkpoint
                assert where == {"buffered": 0, "delivered": [PAYLOAD], "waiting": []}, where

            output = await _take_back(client, url, run_id, "wait", token, run_id)
            assert output == [PAYLOAD, None]  # received once, and only once
            assert await inspect.count_buffered_signals(prefix=token) == 0
        finally:
            await inspect.close()
            await client.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
async def test_sigkill_of_a_sender_that_took_the_waiter_loses_no_delivery(
    tmp_path: Path, store_kind: str
) -> None:
    token, run_id = f"sigbuf:{uuid.uuid4().hex[:8]}", f"sigbuf-{uuid.uuid4().hex[:8]}"
    async with store_url(store_kind, tmp_path, "sigbuf") as url:
        client = durably.Client(url)
        inspect = SqlStateStore.from_url(url)
        engine = _spawn(url, "wait", token, run_id, SIGBUF_INSTANCE="sb-engine")
        try:
            await _line(engine, "STARTED")
            await _until_waiting(inspect, token)
            await _run_to_its_kill(url, "send", token, PAYLOAD, SIGBUF_DIE="after-waiter-taken")
            where = await _where_is_the_signal(inspect, token, run_id)
            # The waiter left in the transaction that wrote the delivery.
            assert where == {"buffered": 0, "delivered": [PAYLOAD], "waiting": []}, where

            output = await _result(client, run_id)  # the engine's re-check finds it
            assert output == [PAYLOAD, None]
            assert engine.poll() is None  # the engine itself was never killed
        finally:
            kill(engine)
            await inspect.close()
            await client.close()


# ------------------------------------------------------------------ named events
#
# The same two kill points for `ctx.wait_for_event` and `publish_event`: the old wait removed
# the buffered event with one statement and wrote its checkpoint with the next, and the old
# publisher took a waiter with one statement and wrote the delivery with the next.


async def _where_is_the_event(store: SqlStateStore, name: str, run_id: str) -> dict[str, Any]:
    """As `_where_is_the_signal`, for the event `name`."""
    prefix = event_token_prefix(name)
    cps = await store.list_checkpoints(run_id)
    delivered = [
        cp.output
        for cp in cps
        if cp.name.startswith(f"signal:{prefix}") and cp.status == "completed"
    ]
    first = min((cp.seq for cp in cps if cp.name.startswith(f"signal:{prefix}")), default=None)
    waiters = await store.list_signal_waiters(prefix)
    return {
        "buffered": len(await store.list_buffered_events(name, 10)),
        "delivered": delivered,
        "waiting": len([w for w in waiters if first is None or w.seq == first]),
    }


@pytest.mark.timeout(180)
@pytest.mark.parametrize("die", ["before-take", "after-take"])
@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
async def test_sigkill_while_a_wait_takes_a_buffered_event_delivers_it_once(
    tmp_path: Path, store_kind: str, die: str
) -> None:
    name, run_id = f"sigbuf.ev.{uuid.uuid4().hex[:8]}", f"sigbuf-{uuid.uuid4().hex[:8]}"
    event_id = f"ev-{uuid.uuid4().hex[:8]}"
    async with store_url(store_kind, tmp_path, "sigbuf") as url:
        client = durably.Client(url)
        inspect = SqlStateStore.from_url(url)
        try:
            async with durably.Engine(store=url, workflows=[], drive=False) as publisher:
                # nobody waits yet: buffered
                assert await publisher.publish_event(name, PAYLOAD, id=event_id) == 0
            assert len(await inspect.list_buffered_events(name, 10)) == 1
            await _run_to_its_kill(
                url, "evwait", name, run_id, event_id, SIGBUF_DIE=die, SIGBUF_INSTANCE="sb-a"
            )
            where = await _where_is_the_event(inspect, name, run_id)
            if die == "before-take":
                # the wait registered its waiter, then died before it looked
                assert where == {"buffered": 1, "delivered": [], "waiting": 1}, where
            else:
                # committed together: the event left the buffer into the wait's checkpoint
                assert where == {"buffered": 0, "delivered": [PAYLOAD], "waiting": 0}, where

            output = await _take_back(client, url, run_id, "evwait", name, run_id, event_id)
            assert output == [PAYLOAD, None]  # received once, and only once
            assert await inspect.list_buffered_events(name, 10) == []
        finally:
            await inspect.close()
            await client.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
async def test_sigkill_of_a_publisher_that_took_the_waiter_loses_no_delivery(
    tmp_path: Path, store_kind: str
) -> None:
    name, run_id = f"sigbuf.ev.{uuid.uuid4().hex[:8]}", f"sigbuf-{uuid.uuid4().hex[:8]}"
    event_id = f"ev-{uuid.uuid4().hex[:8]}"
    async with store_url(store_kind, tmp_path, "sigbuf") as url:
        client = durably.Client(url)
        inspect = SqlStateStore.from_url(url)
        engine = _spawn(url, "evwait", name, run_id, event_id, SIGBUF_INSTANCE="sb-ev-engine")
        try:
            await _line(engine, "STARTED")
            await _until_waiting(inspect, event_token_prefix(name))
            await _run_to_its_kill(
                url, "publish", name, PAYLOAD, event_id, SIGBUF_DIE="after-waiter-taken"
            )
            where = await _where_is_the_event(inspect, name, run_id)
            # The waiter left in the transaction that wrote the delivery.
            assert where == {"buffered": 0, "delivered": [PAYLOAD], "waiting": 0}, where

            output = await _result(client, run_id)  # the engine's re-check finds it
            assert output == [PAYLOAD, None]
            assert engine.poll() is None  # the engine itself was never killed
        finally:
            kill(engine)
            await inspect.close()
            await client.close()
