"""`durably dashboard APP_OR_STORE_URL --port N`: serve the console alone (api.md §6).

APP (`module:attribute` naming an Engine) is served through a `drive=False` replica of it (the
app's workflows registered, so retry-with-input can start runs; runs are executed by your
workers). A store URL (`sqlite:///…`, `postgresql://…`) opens a `drive=False` engine on it.
Needs the `dashboard` extra (starlette, uvicorn).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from durably._cli.common import (
    EXIT_OK,
    CliError,
    check_store_url,
    display_url,
    echo,
    load_app,
    replica_of,
)
from durably._engine.engine import Engine
from durably._extras import EXTRA_HINT, missing_modules

__all__ = ["add_parser", "is_store_url", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "dashboard",
        help="serve the web console (needs the dashboard extra)",
        description=(
            "Serve the durably console and its JSON API for APP (module:attribute naming a "
            "durably.Engine) or a store URL (sqlite:///path.db, postgresql://…). The engine "
            "is opened with drive=False: the console reads and controls runs, your workers "
            "execute them. Needs `" + EXTRA_HINT + "`."
        ),
    )
    p.add_argument("target", metavar="APP_OR_STORE_URL", help="module:attribute, or a store URL")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--host", default="127.0.0.1", help="interface (default 127.0.0.1)")
    p.add_argument("--read-only", action="store_true", help="refuse every mutating endpoint (403)")
    p.add_argument("--base-path", default="/", help="URL path of the console (default /)")
    p.set_defaults(handler=run)


def is_store_url(target: str) -> bool:
    return "://" in target or target in ("memory",)


def _require_extra() -> None:
    missing = missing_modules()
    if missing:
        raise CliError(
            f"the dashboard needs the `dashboard` extra ({', '.join(missing)} not installed): "
            f"{EXTRA_HINT}"
        )


def _engine_for(target: str) -> tuple[Engine, Engine | None]:
    """(the engine to serve, an app engine to close afterwards)."""
    if is_store_url(target):
        check_store_url(target, must_exist=True)
        return Engine(target, workflows=[], drive=False), None
    app_engine = load_app(target)
    return replica_of(app_engine), app_engine


def run(args: argparse.Namespace) -> int:
    _require_extra()
    engine, app_engine = _engine_for(args.target)
    return asyncio.run(_serve(engine, app_engine, args))


async def _serve(engine: Engine, app_engine: Engine | None, args: argparse.Namespace) -> int:
    import uvicorn

    from durably.dashboard import create_app

    try:
        async with engine:
            app = create_app(engine, base_path=args.base_path, read_only=args.read_only)
            where = args.target if not is_store_url(args.target) else display_url(args.target)
            mode = " (read-only)" if args.read_only else ""
            base = app.state.durably_base_path
            echo(f"durably dashboard for {where}{mode}: http://{args.host}:{args.port}{base}")
            config = uvicorn.Config(
                app,
                host=args.host,
                port=args.port,
                log_level="warning",
                lifespan="off",
                timeout_graceful_shutdown=5,  # open event streams must not hold the exit
            )
            await uvicorn.Server(config).serve()
    finally:
        if app_engine is not None:
            await app_engine.close()
    return EXIT_OK
