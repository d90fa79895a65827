"""`durably signals list|purge` — the signal buffer, on a `drive=False` engine.

A signal sent before any run waits on its token is buffered (bounded: it expires after the
engine's `signal_buffer_ttl`, and per-token / per-namespace caps refuse new ones). These
commands let an operator see what is buffered — token, size, age, expiry, never the payload —
and delete it. The engine's own completion records (a child's completion waiting for its
parent to join) are listed with no expiry and are never purged.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

from durably._cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    AppOpt,
    Args,
    CliError,
    JsonOpt,
    StoreOpt,
    bounded_int,
    dispatch,
    echo,
    exclusive,
    on_control_engine,
    print_json,
    usage_group,
)
from durably._cli.render import relative_time, table
from durably._core.buffered_signals import DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT, BufferedSignalInfo
from durably._core.models import now_utc
from durably._engine.engine import Engine


def human_duration(ms: int) -> str:
    """`86400000` → `24h`, `5400000` → `90m`, `1500` → `1.5s` (the largest exact unit)."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0 and not (unit == "d" and ms < 3 * size):
            return f"{ms // size}{unit}"
    if ms >= 1000:
        return f"{ms / 1000:g}s"
    return f"{ms}ms"


def approx_duration(ms: int) -> str:
    """A rough reading for a time left: `86397000` → `24h`, `150000` → `3m`, `800` → `1s`."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000)):
        if ms >= (2 * size if unit == "d" else size):
            return f"{round(ms / size)}{unit}"
    return f"{max(1, round(ms / 1000))}s"


def register(app: typer.Typer) -> None:
    signals = usage_group(
        app,
        "signals",
        "list and purge buffered signals (signals no run waits on yet)",
        "Signals sent before any run waits on their token are buffered for the next wait "
        "on that token, for the engine's signal_buffer_ttl at most. List them (token, "
        "size, age, expiry — never the payload) or delete them. The engine's own "
        "completion records (no expiry) are listed but never purged.",
    )

    @signals.command("list", help="buffered signals, oldest first")
    def _list_cmd(
        store: StoreOpt = None,
        app: AppOpt = None,
        json: JsonOpt = False,
        prefix: Annotated[
            str | None, typer.Option("--prefix", metavar="P", help="only tokens starting with P")
        ] = None,
        limit: Annotated[
            int,
            typer.Option(
                "--limit",
                metavar="N",
                callback=bounded_int(1, MAX_LIST_LIMIT),
                help=f"at most N (up to {MAX_LIST_LIMIT})",
            ),
        ] = DEFAULT_LIST_LIMIT,
        offset: Annotated[
            int,
            typer.Option(
                "--offset", metavar="N", callback=bounded_int(0, 2**31 - 1), help="skip N"
            ),
        ] = 0,
    ) -> None:
        dispatch(
            on_control_engine(_list),
            store=store,
            app=app,
            json=json,
            prefix=prefix,
            limit=limit,
            offset=offset,
        )

    @signals.command(
        "purge",
        help="delete buffered signals (say which: --token, --prefix, --expired or --all)",
    )
    def _purge_cmd(
        store: StoreOpt = None,
        app: AppOpt = None,
        json: JsonOpt = False,
        token: Annotated[
            str | None,
            typer.Option("--token", metavar="T", help="the signals buffered on exactly T"),
        ] = None,
        prefix: Annotated[
            str | None,
            typer.Option("--prefix", metavar="P", help="the signals of tokens starting with P"),
        ] = None,
        expired: Annotated[bool, typer.Option("--expired", help="every expired signal")] = False,
        all: Annotated[bool, typer.Option("--all", help="every buffered signal")] = False,
    ) -> None:
        dispatch(
            _purge_handler,
            store=store,
            app=app,
            json=json,
            token=token,
            prefix=prefix,
            expired=expired,
            all=all,
        )


def _non_empty(value: str | None, option: str) -> str | None:
    if value is not None and not value:
        raise CliError(f"{option} must not be empty", EXIT_USAGE)
    return value


def _expiry(info: BufferedSignalInfo, now: datetime) -> str:
    if info.expires_at is None:
        return "never (engine)"
    if info.expires_at <= now:
        return "expired"
    return "in " + approx_duration(round((info.expires_at - now).total_seconds() * 1000))


async def _list(engine: Engine, args: Args) -> int:
    prefix = _non_empty(args.prefix, "--prefix")
    rows = await engine.list_buffered_signals(prefix=prefix, limit=args.limit, offset=args.offset)
    total = await engine.count_buffered_signals(prefix=prefix)
    if args.json:
        print_json(
            {
                "total": total,
                "offset": args.offset,
                "limit": args.limit,
                "signals": [row.to_json() for row in rows],
            }
        )
        return EXIT_OK
    if not rows:
        echo("No buffered signals." if total == 0 else f"No buffered signals past {args.offset}.")
        return EXIT_OK
    now = now_utc()
    lines = table(
        ["TOKEN", "BYTES", "BUFFERED", "EXPIRES"],
        [
            [
                row.token,
                str(row.size_bytes),
                relative_time(row.buffered_at, now) if row.buffered_at else "",
                _expiry(row, now),
            ]
            for row in rows
        ],
        right=(1,),
    )
    for line in lines:
        echo(line)
    shown = f"{args.offset + 1}–{args.offset + len(rows)}"
    echo(f"{shown} of {total} buffered signal(s); payloads are never shown.")
    return EXIT_OK


def _which(args: Args) -> None:
    """Exactly one of --token, --prefix, --expired, --all: a purge says what it deletes."""
    given = {
        "--token": args.token,
        "--prefix": args.prefix,
        "--expired": args.expired,
        "--all": args.all,
    }
    exclusive(**given)
    if all(value in (None, False) for value in given.values()):
        raise CliError(
            "say what to purge: one of --token, --prefix, --expired or --all", EXIT_USAGE
        )


def _purge_handler(args: Args) -> int:
    _which(args)  # before the store is opened
    return on_control_engine(_purge)(args)


async def _purge(engine: Engine, args: Args) -> int:
    token = _non_empty(args.token, "--token")
    prefix = _non_empty(args.prefix, "--prefix")
    removed = await engine.purge_buffered_signals(
        token=token, prefix=prefix, expired_only=args.expired, all=args.all
    )
    if args.json:
        print_json({"purged": removed})
        return EXIT_OK
    what = (
        f"on {token!r}"
        if token is not None
        else f"of tokens starting with {prefix!r}"
        if prefix is not None
        else "expired"
        if args.expired
        else "in total"
    )
    echo(
        f"Purged {removed} buffered signal(s) {what} (the engine's own completion records "
        "are kept)."
    )
    return EXIT_OK


__all__ = ["human_duration", "register"]
