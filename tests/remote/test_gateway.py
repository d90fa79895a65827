"""The tenant gateway over real Redis: a store-less `TenantGateway` asks a control plane (an
engine on SQLite with the gateway responder wired in) to read and control runs.

What must hold whatever a tenant sends: its verbs work on its own runs; every verb on one run
is refused `cross-tenant` for another tenant's run, and the verb is NOT applied; a run list
never shows another tenant's runs, even when the request names another namespace; malformed
and oversized requests are answered with an error (or dropped when there is no id to answer)
and the responder keeps serving; with a token secret, a forged tenant is refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import EngineEvent, TenantGateway, WorkflowCtx
from durably._engine.gateway.server import Gateway
from durably._engine.gateway.wire import GatewaySettings
from durably._transport.redis_gateway import RedisGatewayChannel
from durably.tenant import TenantRequestError
from tests.remote import redis_support
from tests.remote.redis_support import eventually

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

SECRET = "a-test-secret-of-enough-length"


@asynccontextmanager
async def control_plane(
    tmp_path: Path,
    url: str,
    prefix: str,
    workflows: list[Any],
    steps: list[Any] = (),  # type: ignore[assignment]
    settings: GatewaySettings | None = None,
) -> AsyncIterator[durably.Engine]:
    """An operator engine (every namespace) with the gateway responder wired in as the
    worker will wire it: over the worker's own control plane."""
    engine = durably.Engine(
        f"sqlite:///{tmp_path / 'control.db'}",
        namespace=None,
        workflows=workflows,
        steps=list(steps),
        timer_poll_ms=50,
    )
    async with engine:
        worker = engine._worker
        gateway = Gateway.for_plane(
            worker.plane,
            worker.watchers,
            RedisGatewayChannel(url, prefix=prefix),
            settings=settings,
            subscribe=engine.subscribe,
            worker_health=engine.worker_health,
        )
        await gateway.start()
        try:
            yield engine
        finally:
            await gateway.close(1.0)


class Fixture:
    """Runs of two tenants in every state the verbs need."""

    def __init__(self, uid: str):
        self.uid = uid
        self.release = asyncio.Event()

        @durably.step(f"{uid}.hold")
        async def hold(x: int) -> int:
            await self.release.wait()
            return x

        @durably.workflow(f"{uid}.wait")
        async def wait(ctx: WorkflowCtx, x: int) -> Any:
            return await ctx.wait_for_signal(f"{uid}:go:{ctx.run_id}")

        @durably.workflow(f"{uid}.fail")
        async def fail(ctx: WorkflowCtx, x: int) -> int:
            if x < 0:
                raise durably.FatalError("negative input", code="negative")
            return x

        @durably.workflow(f"{uid}.busy")
        async def busy(ctx: WorkflowCtx, x: int) -> int:
            return await ctx.step(hold, x)

        self.workflows = [wait, fail, busy]
        self.steps = [hold]

    async def seed(self, engine: durably.Engine) -> None:
        uid = self.uid
        for tenant in ("acme", "globex"):
            await engine.start(f"{uid}.wait", 1, run_id=f"{tenant}-wait", namespace=tenant)
            await engine.start(f"{uid}.fail", -1, run_id=f"{tenant}-fail", namespace=tenant)
            await engine.start(f"{uid}.busy", 1, run_id=f"{tenant}-busy", namespace=tenant)
        await engine.start(f"{uid}.wait", 1, run_id="default-wait")
        for run_id, status in (
            ("acme-wait", "suspended"),
            ("globex-wait", "suspended"),
            ("acme-fail", "failed"),
            ("globex-fail", "failed"),
            ("acme-busy", "running"),
            ("globex-busy", "running"),
            ("default-wait", "suspended"),
        ):
            await _status(engine, run_id, status)


async def _status(engine: durably.Engine, run_id: str, status: str, timeout: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        run = await engine.get_run(run_id)
        if run is not None and run.status == status:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{run_id} is {run.status if run else None}, not {status}")
        await asyncio.sleep(0.05)


@pytest.fixture
def uid() -> str:
    return f"gw{uuid.uuid4().hex[:8]}"


async def test_a_tenant_reads_and_controls_its_own_runs(
    redis_url: str, redis_prefix: str, tmp_path: Path, uid: str
) -> None:
    fx = Fixture(uid)
    async with (
        control_plane(tmp_path, redis_url, redis_prefix, fx.workflows, fx.steps) as engine,
        TenantGateway(redis_url, tenant="acme", prefix=redis_prefix) as gw,
    ):
        await fx.seed(engine)
        assert gw.topology() == {"role": "tenant", "tenant": "acme"}

        detail = await gw.get_run_detail("acme-fail")
        assert detail is not None and detail.run.id == "acme-fail"
        assert detail.run.status == "failed" and detail.run.namespace == "acme"
        assert await gw.get_run_detail("no-such-run") is None
        page = await gw.get_fan_members("acme-fail", "no-such-group")
        assert page is not None and page.total == 0

        listed = {r.id for r in await gw.list_runs()}
        assert listed == {"acme-wait", "acme-fail", "acme-busy"}
        assert {r.id for r in await gw.list_runs(status="failed")} == {"acme-fail"}
        facets = {(f.status, f.count) for f in await gw.run_facets()}
        assert facets == {("suspended", 1), ("failed", 1), ("running", 1)}
        # Value facets see the tenant's runs only, whatever namespace the query names.
        by_namespace = await gw.run_value_facets("namespace", namespace="globex")
        assert {(v.value, v.count) for v in by_namespace} == {("acme", 3)}
        failed = await gw.run_value_facets("workflow", status="failed")
        assert {(v.value, v.count) for v in failed} == {(f"{uid}.fail", 1)}
        with pytest.raises(ValueError, match="unknown run value facet field"):
            await gw.run_value_facets("nope")  # refused before any round trip
        with pytest.raises(TenantRequestError, match="scan must be an integer from 1 to 5000"):
            await gw.run_value_facets("tag", {"scan": 10**9})

        fetched = await gw.get_run("acme-fail")
        assert fetched is not None and (fetched.id, fetched.status) == ("acme-fail", "failed")
        assert await gw.get_run("no-such-run") is None
        rows = await gw.list_run_items(status="suspended")
        assert [(i.run.id, i.waiting.on if i.waiting else None) for i in rows] == [
            ("acme-wait", "signal")
        ]

        health = await gw.worker_health()
        assert [g.group for g in health] == ["runs@acme"]
        assert {g.group for g in await engine.worker_health()} >= {"runs@acme", "runs@globex"}

        waiting = await gw.waiting_for(["acme-wait", "globex-wait", "default-wait"])
        assert set(waiting) == {"acme-wait"}
        assert waiting["acme-wait"].on == "signal"

        assert await gw.continue_run("acme-wait") is None  # no breakpoint to release
        redispatched = await gw.redispatch_pending("acme-busy")
        assert redispatched is not None and redispatched["runId"] == "acme-busy"
        with pytest.warns(
            DeprecationWarning, match=r"TenantGateway\.redispatch .*redispatch_pending"
        ):
            old_name = await gw.redispatch("acme-busy")
        assert old_name is not None and old_name["runId"] == "acme-busy"

        new_id = await gw.retry_with_input("acme-fail", 5)
        assert new_id is not None and new_id.startswith("acme-fail~retry~")
        await _status(engine, new_id, "completed")
        replay = await engine.get_run(new_id)
        assert replay is not None and replay.namespace == "acme" and replay.output == 5

        retried = await gw.retry("acme-fail")
        assert retried is not None and retried.run_id == "acme-fail"
        await _status(engine, "acme-fail", "failed")  # its input is still negative

        cancelled = await gw.cancel("acme-wait")
        assert cancelled is not None and cancelled.status == "cancelled"
        fx.release.set()


async def test_every_run_verb_is_refused_for_another_tenants_run(
    redis_url: str, redis_prefix: str, tmp_path: Path, uid: str
) -> None:
    fx = Fixture(uid)
    async with (
        control_plane(tmp_path, redis_url, redis_prefix, fx.workflows, fx.steps) as engine,
        TenantGateway(redis_url, tenant="acme", prefix=redis_prefix) as gw,
    ):
        await fx.seed(engine)
        before = {r.id: r.status for r in await engine.list_runs()}
        attempts = {
            "getRunDetail": gw.get_run_detail("globex-fail"),
            "getRun": gw.get_run("globex-fail"),
            "getFanMembers": gw.get_fan_members("globex-fail", "any"),
            "cancel": gw.cancel("globex-wait"),
            "retry": gw.retry("globex-fail"),
            "continue": gw.continue_run("globex-wait"),
            "redispatch": gw.redispatch_pending("globex-busy"),
            "retryWithInput": gw.retry_with_input("globex-fail", 5),
            # a run of the default namespace is not any tenant's but the default one's
            "cancel-default": gw.cancel("default-wait"),
        }
        for verb, call in attempts.items():
            with pytest.raises(TenantRequestError) as refused:
                await call
            assert refused.value.code == "cross-tenant", verb
            assert refused.value.message == "run belongs to another tenant", verb

        # Nothing was applied: same runs, same states (no retry run, nothing cancelled).
        await asyncio.sleep(0.3)
        assert {r.id: r.status for r in await engine.list_runs()} == before
        fx.release.set()


async def test_a_run_list_never_shows_another_tenants_runs(
    redis_url: str, redis_prefix: str, tmp_path: Path, uid: str
) -> None:
    fx = Fixture(uid)
    settings = GatewaySettings(max_list_limit=2, default_list_limit=2)
    async with (
        control_plane(
            tmp_path, redis_url, redis_prefix, fx.workflows, fx.steps, settings
        ) as engine,
        TenantGateway(redis_url, tenant="acme", prefix=redis_prefix) as gw,
    ):
        await fx.seed(engine)
        for query in (
            {"namespace": "globex"},
            {"namespaces": ["globex", "default"]},
            {"namespace": None},
            {"workflow": f"{uid}.wait"},
        ):
            runs = await gw.list_runs(**query, limit=100)
            assert runs and all(r.namespace == "acme" for r in runs), query
            assert len(runs) <= 2, query  # the control plane's bound, not the asked 100
            facets = await gw.run_facets(**query)
            assert sum(f.count for f in facets) <= 3, query
        assert len(await gw.list_runs(offset=2)) == 1
        fx.release.set()


async def test_malformed_and_oversized_requests_are_answered_or_dropped(
    redis_url: str,
    redis_prefix: str,
    tmp_path: Path,
    uid: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fx = Fixture(uid)
    settings = GatewaySettings(max_message_bytes=2_000)
    raw = RedisGatewayChannel(redis_url, prefix=redis_prefix)
    replies: dict[str, dict[str, Any]] = {}

    def keep(reply: dict[str, Any]) -> None:
        replies[str(reply.get("requestId"))] = reply["result"]

    caplog.set_level(logging.WARNING, logger="durably")
    async with control_plane(tmp_path, redis_url, redis_prefix, fx.workflows, fx.steps, settings):
        stop = await raw.subscribe_replies(keep)
        try:
            cases: dict[str, dict[str, Any]] = {
                "huge": {"tenant": "acme", "body": {"kind": "listRuns", "pad": "x" * 5_000}},
                "unknown": {"tenant": "acme", "body": {"kind": "dropTables"}},
                "nobody": {"tenant": "acme", "body": "listRuns"},
                "tenant": {"tenant": "a:b", "body": {"kind": "listRuns"}},
                "notenant": {"body": {"kind": "listRuns"}},
                "query": {
                    "tenant": "acme",
                    "body": {"kind": "listRuns", "query": {"limit": "all"}},
                },
                "status": {"tenant": "acme", "body": {"kind": "listRuns", "query": {"status": 5}}},
                "runid": {"tenant": "acme", "body": {"kind": "cancel", "runId": ["x"]}},
                "ids": {"tenant": "acme", "body": {"kind": "waitingFor", "runIds": "acme-wait"}},
            }
            for request_id, request in cases.items():
                await raw.send_request({"requestId": request_id, **request})
            # Without a usable id nothing can be answered: logged and dropped.
            await raw.send_request({"tenant": "acme", "body": {"kind": "listRuns"}})
            await raw.send_request({"requestId": 42, "tenant": "acme", "body": {"kind": "x"}})
            await raw.start_run({"not": "a start"})  # the other consumer survives it too
            await raw.send_request(
                {"requestId": "fine", "tenant": "acme", "body": {"kind": "listRuns"}}
            )
            await eventually(lambda: len(replies) == len(cases) + 1, 10, "every reply")
        finally:
            await stop()
            await raw.close()
    codes = {rid: result["error"].get("code") for rid, result in replies.items() if rid != "fine"}
    assert all(not result["ok"] for rid, result in replies.items() if rid != "fine")
    assert codes == {
        "huge": "too-large",
        "unknown": "unknown-kind",
        "nobody": "bad-request",
        "tenant": "bad-request",
        "notenant": "bad-request",
        "query": "bad-request",
        "status": "bad-request",
        "runid": "bad-request",
        "ids": "bad-request",
    }
    assert replies["fine"] == {"ok": True, "data": []}
    assert "42" not in replies and "None" not in replies
    logged = caplog.text
    assert "dropped run request job" in logged and "no usable requestId" in logged
    assert "refused run request huge" in logged


async def test_a_forged_tenant_is_refused_when_tokens_are_required(
    redis_url: str, redis_prefix: str, tmp_path: Path, uid: str
) -> None:
    fx = Fixture(uid)
    settings = GatewaySettings(secret=SECRET)
    acme_token = TenantGateway.mint_token(SECRET, "acme")
    async with control_plane(
        tmp_path, redis_url, redis_prefix, fx.workflows, fx.steps, settings
    ) as engine:
        await fx.seed(engine)
        async with TenantGateway(redis_url, token=acme_token, prefix=redis_prefix) as gw:
            assert gw.tenant == "acme"
            assert {r.id for r in await gw.list_runs()} == {"acme-wait", "acme-fail", "acme-busy"}
            with pytest.raises(TenantRequestError) as cross:
                await gw.get_run_detail("globex-fail")
            assert cross.value.code == "cross-tenant"

        forgeries = {
            "unsigned": TenantGateway(redis_url, tenant="globex", prefix=redis_prefix),
            "other secret": TenantGateway(
                redis_url,
                token=TenantGateway.mint_token("not-the-control-planes-secret", "globex"),
                prefix=redis_prefix,
            ),
            "expired": TenantGateway(
                redis_url,
                token=TenantGateway.mint_token(SECRET, "globex", ttl_s=0.001),
                prefix=redis_prefix,
            ),
            "tampered": TenantGateway(
                redis_url, token=_retarget(acme_token, "globex"), prefix=redis_prefix
            ),
        }
        await asyncio.sleep(0.01)  # past the expired token's lifetime
        for name, forged in forgeries.items():
            async with forged:
                with pytest.raises(TenantRequestError) as refused:
                    await forged.list_runs()
                assert refused.value.code == "unauthorized", name

        # A valid acme token next to a globex claim: the claim is not believed.
        raw = RedisGatewayChannel(redis_url, prefix=redis_prefix)
        replies: list[dict[str, Any]] = []
        stop = await raw.subscribe_replies(replies.append)
        try:
            await raw.send_request(
                {
                    "requestId": "claim",
                    "tenant": "globex",
                    "token": acme_token,
                    "body": {"kind": "listRuns"},
                }
            )
            await eventually(lambda: bool(replies), 10, "the reply")
        finally:
            await stop()
            await raw.close()
        assert replies[0]["result"]["error"]["code"] == "unauthorized"
        fx.release.set()


def _retarget(token: str, tenant: str) -> str:
    """`token` with its tenant replaced and the signature kept (what a forger would try)."""
    import base64

    version, _, expiry, signature = token.split(".")
    name = base64.urlsafe_b64encode(tenant.encode()).rstrip(b"=").decode()
    return ".".join((version, name, expiry, signature))


async def test_a_request_nobody_answers_times_out_with_the_kind(
    redis_url: str, redis_prefix: str
) -> None:
    async with TenantGateway(redis_url, tenant="acme", prefix=redis_prefix, timeout_ms=300) as gw:
        with pytest.raises(
            TimeoutError, match="control plane did not respond to listRuns within 300ms"
        ):
            await gw.list_runs()


async def test_a_tenant_sees_the_live_events_of_its_runs_only(
    redis_url: str, redis_prefix: str, tmp_path: Path, uid: str
) -> None:
    fx = Fixture(uid)
    async with (
        control_plane(tmp_path, redis_url, redis_prefix, fx.workflows, fx.steps) as engine,
        TenantGateway(redis_url, tenant="acme", prefix=redis_prefix) as acme,
        TenantGateway(redis_url, tenant="globex", prefix=redis_prefix) as globex,
    ):
        seen_acme: list[EngineEvent] = []
        seen_globex: list[EngineEvent] = []
        await acme.subscribe("acme-ok", seen_acme.append)
        await globex.subscribe("acme-ok", seen_globex.append)  # not globex's run
        await engine.start(f"{uid}.fail", 3, run_id="acme-ok", namespace="acme")
        await eventually(
            lambda: any(e.type == "run.completed" for e in seen_acme), 10, "acme's completion"
        )
        assert {e.type for e in seen_acme} >= {"run.started", "run.completed"}
        assert all(e.run_id == "acme-ok" and e.at is not None for e in seen_acme)
        await asyncio.sleep(0.2)
        assert seen_globex == []
        fx.release.set()


def test_reply_data_is_json_with_iso_dates() -> None:
    from datetime import UTC, datetime

    from durably._engine.gateway.wire import ok_reply

    at = datetime(2026, 3, 4, 5, 6, 7, 891234, tzinfo=UTC)
    reply = ok_reply("r1", {"when": at, "items": (1, "a")})
    assert json.loads(json.dumps(reply)) == {
        "requestId": "r1",
        "result": {"ok": True, "data": {"when": "2026-03-04T05:06:07.891Z", "items": [1, "a"]}},
    }
