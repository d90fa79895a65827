"""The console's static assets: the shell and every asset are served by
the ASGI app, reference nothing outside the app, parse as JavaScript modules, stay small, and
carry the `data-testid` hooks the browser tests drive."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from durably import Engine
from durably.dashboard import create_app

from .conftest import client_for

ASSETS = resources.files("durably.dashboard").joinpath("static", "assets")
ASSET_NAMES = sorted(p.name for p in ASSETS.iterdir() if p.is_file())
JS_NAMES = [n for n in ASSET_NAMES if n.endswith(".js")]
#: The whole console, uncompressed (the 40,000-member fan page must transfer < 200 KB, which
#: tests/browser weighs): room for the row kinds, the engine-row toggle, delete, the fork
#: lineage, the schedules page, the waterfall, the runs-over-time chart and routing by path.
ASSET_BUDGET = 96 * 1024

TESTIDS = set(
    # the shell
    "app nav-runs nav-workers read-only-banner flash confirm-dialog confirm-button "
    "confirm-cancel "
    # the run list
    "status-chips status-chip origin-chips origin-chip chip-count filters filter-tag "
    "filter-workflow filter-namespace filter-attr-key filter-attr-op filter-attr-value "
    "filter-apply active-filter run-table run-row run-link run-status run-count pager-prev "
    "pager-next pager-range page-size "
    # the run detail
    "run-header run-id status-badge run-error run-input run-output relations rel-parent "
    "rel-child rel-handler child-link live-indicator timeline timeline-row step-status "
    "step-detail step-input step-output step-error step-events event-log event-key event-read "
    "step-attempts step-attempt "
    "fan-node fan-expand fan-label fan-counts fan-count fan-progress fan-failures fan-failure "
    "fan-members fan-failed-only fan-member-rows fan-member-row fan-prev fan-next fan-range "
    "controls confirm-json confirm-token engine-rows-toggle engine-row-count step-kind "
    "step-duration step-timeout step-detail-kind "
    # the workers panel
    "workers worker-group worker-row "
    # the buffered-signals panel
    "nav-signals signals signals-count signals-prefix signals-filter signal-row signal-purge "
    "signals-purge-expired signals-purge-all no-signals "
    # the dead-letter links between a dead run and its dlq: run
    "rel-dead-run rel-dead-letter".split()
)
CONTROLS = set(
    "cancel cancel-compensate retry retry-input continue redispatch signal delete".split()
)


def _text(name: str) -> str:
    return ASSETS.joinpath(name).read_text(encoding="utf-8")


def _config(page: str) -> dict[str, str]:
    start = page.index('id="durable-config">') + len('id="durable-config">')
    value: dict[str, str] = json.loads(page[start : page.index("</script>", start)])
    return value


def test_the_console_is_more_than_a_stylesheet() -> None:
    assert {
        "app.js",
        "api.js",
        "runs.js",
        "run.js",
        "workers.js",
        "signals.js",
        "schedules.js",
        "console.css",
    } <= set(ASSET_NAMES)


async def test_shell_and_every_asset_are_served(engine: Engine) -> None:
    async with client_for(create_app(engine, base_path="/durable")) as client:
        page = await client.get("/durable")
        assert page.status_code == 200
        assert _config(page.text) == {"base": "/durable", "api": "/durable/api", "readOnly": False}
        assert 'href="/durable/assets/console.css"' in page.text
        assert '<script type="module" src="/durable/assets/app.js"></script>' in page.text
        assert '"./assets/' not in page.text
        for name in ASSET_NAMES:
            res = await client.get(f"/durable/assets/{name}")
            assert res.status_code == 200, name
            assert res.content == ASSETS.joinpath(name).read_bytes()
            expected = "text/css" if name.endswith(".css") else "application/javascript"
            assert res.headers["content-type"].startswith(expected), name


async def test_every_module_import_is_a_served_asset(engine: Engine) -> None:
    imports = re.compile(r"""^import\s.*?from\s+["']\./([\w.-]+)["'];?$""", re.M)
    for name in JS_NAMES:
        for target in imports.findall(_text(name)):
            assert target in ASSET_NAMES, f"{name} imports missing {target}"
        assert "import(" not in _text(name)  # nothing loaded from a computed URL


async def test_nothing_is_fetched_from_outside_the_app(engine: Engine) -> None:
    async with client_for(create_app(engine)) as client:
        bodies = {"index.html": (await client.get("/")).text}
        for name in ASSET_NAMES:
            bodies[name] = (await client.get(f"/assets/{name}")).text
    for name, text in bodies.items():
        assert not re.search(r"https?:", text, re.I), name
        assert not re.search(r"""(src|href)\s*=\s*["']?//""", text, re.I), name
        if name.endswith(".css"):
            assert "@import" not in text and "url(" not in text, name


def test_the_assets_stay_small() -> None:
    total = sum(len(ASSETS.joinpath(n).read_bytes()) for n in ASSET_NAMES)
    total += len(resources.files("durably.dashboard").joinpath("static", "index.html").read_bytes())
    assert total < ASSET_BUDGET, total


@pytest.mark.parametrize("name", JS_NAMES)
def test_javascript_parses(name: str, tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH")
    module = tmp_path / (Path(name).stem + ".mjs")  # .mjs: parsed as an ES module
    module.write_text(_text(name), encoding="utf-8")
    check = subprocess.run([node, "--check", str(module)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_the_data_testid_hooks_exist() -> None:
    sources = "\n".join(_text(n) for n in JS_NAMES)
    shell = resources.files("durably.dashboard").joinpath("static", "index.html")
    found = set(re.findall(r'data-testid="([\w-]+)"', shell.read_text(encoding="utf-8")))
    found |= set(re.findall(r"""testid:\s*["']([\w-]+)["']""", sources))
    found |= set(re.findall(r'"([\w-]+)"', sources))  # ids handed to helpers
    missing = TESTIDS - found
    assert not missing, sorted(missing)
    # the control buttons are "control-" + id
    controls = set(re.findall(r'\[\s*"([\w-]+)",\s*"[^"]+",', _text("run.js")))
    assert CONTROLS <= controls, sorted(CONTROLS - controls)
    assert '"control-" + id' in _text("run.js")


async def test_read_only_probe_is_answered_without_side_effects(engine: Engine) -> None:
    probe = "/api/runs/__console_probe__/continue"
    async with client_for(create_app(engine, read_only=True)) as client:
        assert (await client.post(probe)).status_code == 403
    async with client_for(create_app(engine)) as client:
        assert (await client.post(probe)).status_code == 404
        assert (await client.get("/api/runs")).json() == []
