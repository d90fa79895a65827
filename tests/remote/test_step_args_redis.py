"""Steps taking several arguments, dispatched over real Redis to a `durably worker` process.

The wire carries one JSON input per step: a call with several (or keyword) arguments travels
as `{"$durably.args": [...], "$durably.kwargs": {...}}`, and the worker serving the step
unpacks it back into the function's arguments, each validated by its parameter's type. The
run survives an engine restart without dispatching a finished step again. A step of the
published `durable-worker` SDK receives that object as its one input, and a single-input call
exactly as before.
"""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import Args, WorkflowCtx
from durably.transports import RedisTransport
from tests.engine_support import wait_waiting_on
from tests.remote import redis_support
from tests.remote.worker_process import running_worker, sdk_script

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(120)

RESULT_TIMEOUT = 30
ARGS, KWARGS = "$durably.args", "$durably.kwargs"

WORKER_APP = """
import dataclasses, json, threading

import durably
from durably.transports import RedisTransport

URL, PREFIX, TAG, CALLS = {url!r}, {prefix!r}, {tag!r}, {calls!r}


@dataclasses.dataclass
class Order:
    id: str
    amount: int


def _note(*what):
    with open(CALLS, "a") as f:
        f.write(json.dumps(what) + "\\n")


@durably.step(TAG + ".charge")
async def charge(order: Order, rate: float, fee: int, *, currency: str) -> dict:
    _note("charge", type(order).__name__, order.id, rate, fee, currency)
    return {{"receipt": f"{{order.id}}:{{order.amount * rate + fee}}{{currency}}"}}


@durably.step(TAG + ".record")
def record(invoice: str, rate: float, *, note: str = "-") -> dict:
    _note("record", invoice, rate, note)
    return {{"thread": threading.current_thread().name, "note": note}}


@durably.step(TAG + ".label")
def label(order: Order, n: int, *, sep: str = "-") -> str:
    _note("label", type(order).__name__, order.id, n, sep)
    return f"{{order.id}}{{sep}}{{n}}"


app = durably.Engine(
    "memory",
    transport=RedisTransport(URL, prefix=PREFIX),
    role="worker",
    steps=[charge, record, label],
)
"""


@dataclasses.dataclass
class Order:
    id: str
    amount: int


def _workflow(tag: str) -> Any:
    # The orchestrator's own declarations of the worker's steps: they type the calls and
    # check the arguments here; the engine registers no steps, so each one is dispatched.
    @durably.step(f"{tag}.charge")
    async def charge(order: Order, rate: float, fee: int, *, currency: str) -> dict[str, Any]:
        raise AssertionError("runs on the worker")

    @durably.step(f"{tag}.record")
    def record(invoice: str, rate: float, *, note: str = "-") -> dict[str, Any]:
        raise AssertionError("runs on the worker")

    @durably.workflow(f"{tag}.wf")
    async def wf(ctx: WorkflowCtx, order: Order) -> list[Any]:
        first = await ctx.step(charge, order, 1.5, 2, currency="EUR")
        kept = await ctx.step(record, first["receipt"], 0.5, note="sync")
        # by name, declared only on the worker: the arguments must already be JSON
        named = await ctx.step(f"{tag}.label", {"id": "n", "amount": 1}, 7, sep="#")
        fanned = await ctx.all(charge, [Args(order, 1.0, fee, currency="GBP") for fee in (0, 1)])
        await ctx.wait_for_signal(f"{tag}.go")
        last = await ctx.step(charge.options(retries=2), order, 3.0, 0, currency="CHF")
        return [first, kept["note"], kept["thread"], named, fanned, last]

    return wf


def _calls(path: Path) -> list[list[Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_several_arguments_over_redis_to_a_durably_worker_and_after_a_restart(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"args{os.getpid()}"
    calls = tmp_path / "calls.jsonl"
    module = tmp_path / f"argsapp_{tag}.py"
    module.write_text(
        textwrap.dedent(
            WORKER_APP.format(url=redis_url, prefix=redis_prefix, tag=tag, calls=str(calls))
        )
    )
    wf = _workflow(tag)
    token = f"{tag}.go"

    def engine() -> durably.Engine:
        return durably.Engine(
            f"sqlite:///{tmp_path / 'engine.db'}",
            transport=RedisTransport(redis_url, prefix=redis_prefix),
            workflows=[wf],
            steps=[],  # an orchestrator: every step runs on the worker
            timer_poll_ms=50,
        )

    async with running_worker(f"{module.stem}:app", tmp_path / "worker.log", cwd=tmp_path):
        async with engine() as first:
            handle = await first.start(wf, Order("o1", 10))
            await wait_waiting_on(first, handle.run_id, token)
            before = await first.list_checkpoints(handle.run_id)
        ran_before_restart = _calls(calls)
        async with engine() as second:
            await second.signal(token, None)
            out = await second.get_handle(handle.run_id).result(timeout=RESULT_TIMEOUT)
            after = await second.list_checkpoints(handle.run_id)

    first_out, note, thread, named, fanned, last = out
    assert first_out == {"receipt": "o1:17.0EUR"}
    assert (note, thread.startswith("durably-step")) == ("sync", True)
    assert named == "n#7"
    assert fanned == [{"receipt": "o1:10.0GBP"}, {"receipt": "o1:11.0GBP"}]
    assert last == {"receipt": "o1:30.0CHF"}
    # On the worker each argument arrived rebuilt by its parameter's type (a dataclass).
    assert ran_before_restart[:3] == [
        ["charge", "Order", "o1", 1.5, 2, "EUR"],
        ["record", "o1:17.0EUR", 0.5, "sync"],
        ["label", "Order", "n", 7, "#"],
    ]
    fan_calls = sorted(ran_before_restart[3:], key=lambda call: int(call[4]))
    assert fan_calls == [["charge", "Order", "o1", 1.0, fee, "GBP"] for fee in (0, 1)]
    # After the restart only the step after the signal ran: nothing finished ran again.
    assert _calls(calls)[len(ran_before_restart) :] == [["charge", "Order", "o1", 3.0, 0, "CHF"]]
    assert [(cp.seq, cp.input, cp.output) for cp in after[: len(before)]] == [
        (cp.seq, cp.input, cp.output) for cp in before
    ]
    steps = [cp for cp in after if cp.kind == "remote"]
    assert [cp.input for cp in steps] == [
        {ARGS: [{"id": "o1", "amount": 10}, 1.5, 2], KWARGS: {"currency": "EUR"}},
        {ARGS: ["o1:17.0EUR", 0.5], KWARGS: {"note": "sync"}},
        {ARGS: [{"id": "n", "amount": 1}, 7], KWARGS: {"sep": "#"}},
        {ARGS: [{"id": "o1", "amount": 10}, 1.0, 0], KWARGS: {"currency": "GBP"}},
        {ARGS: [{"id": "o1", "amount": 10}, 1.0, 1], KWARGS: {"currency": "GBP"}},
        {ARGS: [{"id": "o1", "amount": 10}, 3.0, 0], KWARGS: {"currency": "CHF"}},
    ]
    assert all(cp.status == "completed" and cp.attempts == 1 for cp in steps)


SDK_WORKER = """
import asyncio, sys
from durable_worker import Worker, run_redis_worker

url, prefix, tag = sys.argv[1], sys.argv[2], sys.argv[3]
worker = Worker(auto_register=False)


@worker.step(tag + ".total")
async def total(data, ctx):
    # A step called with several arguments receives them as its one input.
    args, kwargs = data["$durably.args"], data["$durably.kwargs"]
    return {"total": sum(args) * kwargs.get("scale", 1), "single": False}


@worker.step(tag + ".single")
async def single(data, ctx):
    return {"got": data}


async def main():
    await run_redis_worker(worker, connection=url, prefix=prefix, concurrency=2)
    print("ready", flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
"""


async def test_a_durable_worker_sdk_step_receives_several_arguments_as_one_input(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"sdkargs{os.getpid()}"
    script = tmp_path / "sdk_worker.py"
    script.write_text(SDK_WORKER)

    @durably.workflow(f"{tag}.wf")
    async def wf(ctx: WorkflowCtx) -> list[Any]:
        return [
            await ctx.step(f"{tag}.total", 1, 2, 3, scale=10),
            await ctx.step(f"{tag}.single", [1, 2, 3]),
        ]

    engine = durably.Engine(
        f"sqlite:///{tmp_path / 'engine.db'}",
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=[wf],
        steps=[],
        timer_poll_ms=50,
    )
    with sdk_script(script, [redis_url, redis_prefix, tag], tmp_path / "sdk.log"):
        async with engine:
            out = await engine.execute(wf, timeout=RESULT_TIMEOUT)

    # the single-input call reaches the SDK exactly as before steps took arguments
    assert out == [{"total": 60, "single": False}, {"got": [1, 2, 3]}]
