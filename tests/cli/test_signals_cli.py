"""`durably signals list|purge` and the refusals of `durably runs signal` (real console
script in subprocesses, SQLite files in tmp_path)."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import durably
from tests.cli.support import durably as cli
from tests.cli.support import json_of, ok, sqlite_url

APP = """
import durably

engine = durably.Engine(
    STORE_URL,
    workflows=[],
    signal_buffer_ttl="2h",
    signal_buffer_per_token=2,
    signal_buffer_per_namespace=3,
)
"""


def _write_app(tmp_path: Path) -> str:
    url = sqlite_url(tmp_path / "caps.db")
    (tmp_path / "capsapp.py").write_text(
        textwrap.dedent(APP.replace("STORE_URL", repr(url))), encoding="utf-8"
    )
    return url


def _buffer(url: str, *signals: tuple[str, object]) -> None:
    async def go() -> None:
        async with durably.Engine(url, workflows=[], drive=False) as engine:
            for token, payload in signals:
                await engine.signal(token, payload)
            await engine.store.buffer_signal("child:kid-1", {"ok": True})  # an engine record

    asyncio.run(go())


def test_list_shows_tokens_sizes_and_expiry_never_payloads(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "s.db")
    _buffer(url, ("approve:1", {"card": "SECRET-4242"}), ("approve:2", None), ("other", "é"))

    listed = json_of(cli("signals", "list", "--store", url, "--json", cwd=tmp_path))
    assert listed["total"] == 4 and listed["offset"] == 0 and listed["limit"] == 50
    rows = listed["signals"]
    assert [r["token"] for r in rows] == ["approve:1", "approve:2", "other", "child:kid-1"]
    assert [r["sizeBytes"] for r in rows] == [len('{"card":"SECRET-4242"}'), 0, 4, 11]
    assert all(set(r) <= {"token", "sizeBytes", "bufferedAt", "expiresAt"} for r in rows)
    assert "expiresAt" not in rows[3]  # the engine's own record never expires
    assert "SECRET" not in ok(cli("signals", "list", "--store", url, "--json", cwd=tmp_path)).stdout

    human = ok(cli("signals", "list", "--store", url, cwd=tmp_path)).stdout
    assert "TOKEN" in human and "approve:1" in human and "in 24h" in human
    assert "never (engine)" in human and "SECRET" not in human
    assert "1–4 of 4 buffered signal(s)" in human

    page = json_of(
        cli(
            "signals",
            "list",
            "--store",
            url,
            "--prefix",
            "approve:",
            "--limit",
            "1",
            "--offset",
            "1",
            "--json",
            cwd=tmp_path,
        )
    )
    assert page["total"] == 2 and [r["token"] for r in page["signals"]] == ["approve:2"]


def test_list_refuses_bad_numbers(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "s.db")
    _buffer(url)
    for args in (["--limit", "0"], ["--limit", "1001"], ["--limit", "x"], ["--offset", "-1"]):
        result = cli("signals", "list", "--store", url, *args, cwd=tmp_path)
        assert result.returncode == 2, result
        assert args[0] in result.stderr
    empty = cli("signals", "list", "--store", url, "--prefix", "", cwd=tmp_path)
    assert empty.returncode == 2 and "--prefix must not be empty" in empty.stderr


def test_purge_needs_an_explicit_choice_and_keeps_engine_records(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "s.db")
    _buffer(url, ("a:1", 1), ("a:1", 2), ("a:2", 3), ("b", 4))

    bare = cli("signals", "purge", "--store", url, cwd=tmp_path)
    assert bare.returncode == 2
    assert "--token" in bare.stderr and "--all" in bare.stderr
    both = cli("signals", "purge", "--store", url, "--token", "a:1", "--all", cwd=tmp_path)
    assert both.returncode == 2

    purged = json_of(
        cli("signals", "purge", "--store", url, "--token", "a:1", "--json", cwd=tmp_path)
    )
    assert purged == {"purged": 2}
    said = ok(cli("signals", "purge", "--store", url, "--expired", cwd=tmp_path)).stdout
    assert "Purged 0 buffered signal(s) expired" in said
    said = ok(cli("signals", "purge", "--store", url, "--prefix", "a:", cwd=tmp_path)).stdout
    assert "Purged 1 buffered signal(s) of tokens starting with 'a:'" in said
    everything = json_of(cli("signals", "purge", "--store", url, "--all", "--json", cwd=tmp_path))
    assert everything == {"purged": 1}
    left = json_of(cli("signals", "list", "--store", url, "--json", cwd=tmp_path))
    assert [r["token"] for r in left["signals"]] == ["child:kid-1"]


def test_runs_signal_refuses_reserved_tokens_and_a_full_buffer(tmp_path: Path) -> None:
    url = _write_app(tmp_path)
    _buffer(url)
    for token, kind in (
        ("child:kid-1", "child-workflow completion"),
        ("bp:r1:3", "breakpoint"),
        ("update:r1:limit", "workflow update"),
    ):
        refused = cli("runs", "signal", token, "--app", "capsapp:engine", cwd=tmp_path)
        assert refused.returncode == 1, refused
        assert kind in refused.stderr and "external signals cannot address it" in refused.stderr

    # The app's own caps apply to a signal buffered from the command line.
    for n in (1, 2):
        sent = ok(
            cli(
                "runs",
                "signal",
                "go:7",
                "--payload",
                str(n),
                "--app",
                "capsapp:engine",
                cwd=tmp_path,
            )
        )
        assert "buffered for 2h" in sent.stdout
    full = cli("runs", "signal", "go:7", "--payload", "3", "--app", "capsapp:engine", cwd=tmp_path)
    assert full.returncode == 1
    assert "'go:7' refused" in full.stderr and "signal_buffer_per_token" in full.stderr
    listed = json_of(
        cli("signals", "list", "--store", url, "--prefix", "go:", "--json", cwd=tmp_path)
    )
    assert listed["total"] == 2  # nothing stored for the refused one

    cli("runs", "signal", "go:8", "--app", "capsapp:engine", cwd=tmp_path)
    ns_full = cli("runs", "signal", "go:9", "--app", "capsapp:engine", cwd=tmp_path)
    assert ns_full.returncode == 1 and "signal_buffer_per_namespace" in ns_full.stderr


def test_runs_signal_no_buffer_stores_nothing(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "s.db")
    _buffer(url)
    result = cli("runs", "signal", "nobody:1", "--no-buffer", "--store", url, cwd=tmp_path)
    assert result.returncode == 1
    assert "nothing was delivered or stored" in result.stderr
    listed = json_of(
        cli("signals", "list", "--store", url, "--prefix", "nobody", "--json", cwd=tmp_path)
    )
    assert listed["total"] == 0
