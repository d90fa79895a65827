"""The Prometheus exposition (`durably.prometheus`), on the console's `metrics` endpoint:
valid text for names and error codes that need escaping, counts equal to the runs made, one
registry per engine."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest

import durably
from durably import RunFailedError
from durably.dashboard import create_app
from durably.prometheus import CONTENT_TYPE, METRICS, PrometheusMetrics
from tests.cli.support import cli_env
from tests.dashboard.conftest import client_for
from tests.engine_support import wait_status, wait_waiting_on
from tests.observe.hostile_app import CODE, NAME, STEP, WORKFLOWS, payments, waits
from tests.observe.support import samples, types, value

FAST = {"timer_poll_ms": 20}


async def _make_runs(engine: durably.Engine, completed: int) -> None:
    for i in range(completed):
        assert await engine.execute(payments, i) == i * 2
    handle = await engine.start(payments, -1)
    with pytest.raises(RunFailedError):
        await handle.result(timeout=30)
    parked = await engine.start(waits)
    await wait_waiting_on(engine, parked.run_id, "never")
    await engine.cancel(parked.run_id)
    await wait_status(engine, parked.run_id, "cancelled")


@pytest.mark.parametrize("subscribed", [False, True], ids=["counted", "emitted"])
async def test_console_metrics_parse_and_count_the_runs_made(
    tmp_path: Path, subscribed: bool
) -> None:
    """Counted the same whether step events are only counted (nobody subscribes) or built
    and emitted to a subscriber."""
    url = f"sqlite:///{tmp_path / 'm.db'}"
    async with durably.Engine(url, workflows=WORKFLOWS, **FAST) as engine:
        seen: list[str] = []
        if subscribed:
            engine.subscribe(lambda event: seen.append(event.type))
        await _make_runs(engine, completed=3)
        assert ("step.completed" in seen) is subscribed
        async with client_for(create_app(engine)) as http:
            res = await http.get("/api/metrics")
    assert res.status_code == 200
    assert res.headers["content-type"] == CONTENT_TYPE
    text = res.text
    samples(text)  # parses, and no series twice
    assert value(text, "durable_runs_started_total", workflow=NAME) == 4
    assert value(text, "durable_runs_started_total", workflow=NAME + ".wait") == 1
    assert value(text, "durable_runs_completed_total", workflow=NAME) == 3
    assert value(text, "durable_runs_failed_total", workflow=NAME, code=CODE) == 1
    assert value(text, "durable_runs_cancelled_total", workflow=NAME + ".wait") == 1
    assert value(text, "durable_runs_failed_total", workflow=NAME + ".wait", code="") is None
    assert value(text, "durable_steps_completed_total", workflow=NAME, step=STEP) == 3
    # two attempts of the failing step (one retry), both failed with the hostile code
    assert value(text, "durable_steps_failed_total", workflow=NAME, step=STEP, code=CODE) == 2
    assert value(text, "durable_step_retries_total", workflow=NAME, step=STEP) == 1
    step = {"workflow": NAME, "step": STEP}
    assert value(text, "durable_step_duration_seconds_count", **step) == 3
    assert value(text, "durable_step_duration_seconds_bucket", **step, le="+Inf") == 3
    run = {"workflow": NAME, "outcome": "completed"}
    assert value(text, "durable_run_duration_seconds_count", **run) == 3
    cancelled = {"workflow": NAME + ".wait", "outcome": "cancelled"}
    assert value(text, "durable_run_duration_seconds_count", **cancelled) == 1
    assert value(text, "durable_runs", status="cancelled") is None  # not a backlog status
    assert value(text, "durable_runs", status="pending") == 0
    assert value(text, "durable_group_live_workers", group="runs@default", transport="") == 1
    declared = types(text)
    for name, kind, _, _ in METRICS:
        assert declared[name.removesuffix("_total")] == kind, name


async def test_each_engine_has_its_own_registry(tmp_path: Path) -> None:
    async with (
        durably.Engine(f"sqlite:///{tmp_path / 'a.db'}", workflows=WORKFLOWS, **FAST) as a,
        durably.Engine(f"sqlite:///{tmp_path / 'b.db'}", workflows=WORKFLOWS, **FAST) as b,
    ):
        await a.execute(payments, 1)
        for i in range(2):
            await b.execute(payments, i)
        ma, mb = PrometheusMetrics(a), PrometheusMetrics(b)
        assert ma.registry is not mb.registry
        ta, tb = (await ma.exposition()).decode(), (await mb.exposition()).decode()
    assert value(ta, "durable_runs_completed_total", workflow=NAME) == 1
    assert value(tb, "durable_runs_completed_total", workflow=NAME) == 2
    # nothing of durably's is on the library's global default registry
    assert b"durable_" not in generate_latest()


async def test_a_scrape_from_another_thread_reads_on_the_engines_loop(tmp_path: Path) -> None:
    async with durably.Engine(f"sqlite:///{tmp_path / 't.db'}", workflows=WORKFLOWS) as engine:
        await engine.execute(payments, 2)
        metrics = PrometheusMetrics(engine)
        await metrics.exposition()  # binds the loop
        text = (await asyncio.to_thread(generate_latest, metrics.registry)).decode()
        assert value(text, "durable_runs_completed_total", workflow=NAME) == 1
        # rendering synchronously on the loop itself would wait on itself: refused clearly
        with pytest.raises(RuntimeError, match=r"must await PrometheusMetrics\.exposition"):
            generate_latest(metrics.registry)


async def test_over_a_client_only_the_store_gauges(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    async with durably.Client(url) as client:
        await client.start(NAME, 1)
        text = (await PrometheusMetrics(client).exposition()).decode()
    assert value(text, "durable_runs", status="pending") == 1
    assert "durable_runs_started_total" not in text


def test_it_refuses_what_is_neither_an_engine_nor_a_client() -> None:
    with pytest.raises(TypeError, match=r"durably\.Engine or durably\.Client"):
        PrometheusMetrics("sqlite:///x.db")  # type: ignore[arg-type]


def test_import_durably_does_not_load_prometheus_client() -> None:
    code = (
        "import sys, durably\n"
        "durably.Engine, durably.WorkflowCtx\n"
        "assert 'prometheus_client' not in sys.modules, 'loaded by import durably'\n"
        "import durably.prometheus\n"
        "assert 'prometheus_client' in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_without_the_extra_durably_prometheus_names_it() -> None:
    code = "import sys; sys.modules['prometheus_client'] = None\nimport durably.prometheus\n"
    done = subprocess.run(
        [sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "pip install 'durably[prometheus]'" in done.stderr, done.stderr


async def test_an_execution_timeout_counts_as_a_cancel(tmp_path: Path) -> None:
    @durably.workflow("metrics.slow", execution_timeout="200ms")
    async def slow(ctx: durably.WorkflowCtx) -> str:
        value: str = await ctx.wait_for_signal("metrics.never")
        return value

    async with durably.Engine(f"sqlite:///{tmp_path / 'x.db'}", workflows=[slow]) as engine:
        handle = await engine.start(slow)
        await wait_status(engine, handle.run_id, "cancelled")
        text = (await PrometheusMetrics(engine).exposition()).decode()
    assert value(text, "durable_runs_cancelled_total", workflow="metrics.slow") == 1
    assert "durable_runs_failed_total{" not in text
