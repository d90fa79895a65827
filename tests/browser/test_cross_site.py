"""Another site cannot steer the console through a visitor's browser.

A page served from a second local port (another origin) tries what a hostile page can do
without the console's cooperation: an HTML form POST and `fetch(..., {mode: "no-cors"})`
against the console's cancel and webhook endpoints (credentials included, a JSON content
type asked for). The console sees every attempt and refuses it; afterwards the run is still
waiting and no signal was stored. The console's own pages keep working under its
Content-Security-Policy: the built-in login page (its script is an asset now) signs in and
the run list renders with no CSP violation.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import durably
from durably import Engine, WorkflowCtx
from durably.dashboard import create_app

from .conftest import csp_watch, serve
from .test_console import FAST, TIMEOUT_MS, VIEWPORT, _wait_status

TOKEN = "wh:planted-by-another-site"
WAITED = "browser-go"


class Recorder:
    """ASGI wrapper noting (method, path, status) of every answer the console gives."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, str, int]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.seen.append((scope["method"], scope["path"], message["status"]))
            await send(message)

        await self.app(scope, receive, sending)


def attacker_page(console: str, run_id: str) -> str:
    cancel = f"{console}api/runs/{run_id}/cancel"
    webhook = f"{console}api/webhooks/{TOKEN}"
    waited = f"{console}api/webhooks/{WAITED}"  # the token the run waits on: would complete it
    targets = json.dumps({"cancel": cancel, "webhook": webhook, "waited": waited})
    return f"""<!doctype html><html><body>
<iframe name="sink-a"></iframe><iframe name="sink-b"></iframe>
<form id="cancel" method="post" action="{cancel}" target="sink-a">
  <input name="compensate" value="true"></form>
<form id="signal" method="post" action="{webhook}" target="sink-b"
  enctype="text/plain"><input name='{{"ok":true,"value":"FORGED","x":"' value='"}}'></form>
<script>
const t = {targets};
const attempts = [];
const noCors = (url, init) => attempts.push(
  fetch(url, {{method: "POST", mode: "no-cors", credentials: "include", ...init}})
    .then(() => "sent", (e) => "error " + e));
noCors(t.cancel, {{}});
noCors(t.cancel, {{headers: {{"Content-Type": "application/json"}}, body: "{{}}"}});
noCors(t.webhook, {{headers: {{"Content-Type": "application/json"}},
  body: JSON.stringify({{ok: true, value: "FORGED"}})}});
noCors(t.webhook, {{body: new URLSearchParams({{ok: "true"}})}});
noCors(t.waited, {{headers: {{"Content-Type": "application/json"}}, body: '"FORGED"'}});
let loaded = 0;
for (const f of document.querySelectorAll("iframe")) f.addEventListener("load", () => loaded++);
document.getElementById("cancel").submit();
document.getElementById("signal").submit();
window.attack = Promise.all(attempts);
window.framesLoaded = () => loaded;
</script></body></html>"""


async def test_another_origin_cannot_cancel_or_plant_a_signal(
    browser: Any, shots: Path, tmp_path: Path
) -> None:
    @durably.workflow("browser.patient")
    async def patient(ctx: WorkflowCtx, token: str) -> Any:
        return await ctx.wait_for_signal(token)

    async with Engine(f"sqlite:///{tmp_path / 'xsite.db'}", **FAST) as engine:
        await engine.start(patient, WAITED, run_id="patient-1")
        await _wait_status(engine, "patient-1", "suspended")
        console = Recorder(create_app(engine))
        async with serve(console) as console_url:
            evil_html = attacker_page(console_url, "patient-1")

            async def evil(scope: Any, receive: Any, send: Any) -> None:
                assert scope["type"] == "http"
                body = evil_html.encode()
                headers = [(b"content-type", b"text/html; charset=utf-8")]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": body})

            async with serve(evil) as evil_url:
                assert evil_url != console_url  # another port: another origin
                context = await browser.new_context(viewport=VIEWPORT)
                page = await context.new_page()
                page.set_default_timeout(TIMEOUT_MS)
                await page.goto(evil_url)
                outcomes = await page.evaluate("() => window.attack")
                await page.wait_for_function("() => window.framesLoaded() >= 2")
                await page.screenshot(path=shots / "09-cross-site-attempts.png")
                await context.close()

        posts = [(m, p, s) for m, p, s in console.seen if m == "POST"]
        # every attempt reached the console (the browser sent it) and was refused
        assert len(outcomes) == 5, outcomes
        assert len(posts) == 7, console.seen
        assert all(status in (403, 415) for _, _, status in posts), posts
        run = await engine.get_run("patient-1")
        assert run is not None and run.status == "suspended", run
        assert run.output is None
        assert await engine.count_buffered_signals() == 0

        # the run still answers its real signal
        await engine.signal(WAITED, "released")
        await _wait_status(engine, "patient-1", "completed")


async def test_login_page_and_console_work_under_the_csp(browser: Any, tmp_path: Path) -> None:
    def login(username: str, password: str) -> Any:
        return {"id": username} if password == "pw" else None

    async with Engine(f"sqlite:///{tmp_path / 'login.db'}", **FAST) as engine:
        app = create_app(engine, auth={"secret": "s3cret-0123456789abcdef", "login": login})
        async with serve(app) as base:
            context = await browser.new_context(viewport=VIEWPORT)
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            violations = csp_watch(page)
            await page.goto(base + "#/runs")
            await page.wait_for_url(re.compile(r"/login\?returnTo="))
            await page.fill("#username", "ops")
            await page.fill("#password", "wrong")
            await page.click("button[type=submit]")
            await page.wait_for_function(
                "() => document.getElementById('error').textContent.includes('Invalid')"
            )
            await page.fill("#password", "pw")
            await page.click("button[type=submit]")
            await page.wait_for_selector("[data-testid=run-count]")
            assert await page.get_by_test_id("read-only-banner").is_hidden()
            await context.close()
        assert violations == [], violations
