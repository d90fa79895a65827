"""Shared helpers of the CLI: errors, JSON arguments, loading `APP`, store URLs, engines."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import os
import sys
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

from durably._engine.engine import Engine

DEFAULT_STORE = "sqlite:///durably.db"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CliError(Exception):
    """A message for the user and the process exit code (1 = failure, 2 = bad usage)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


# ------------------------------------------------------------------ output


def print_json(value: Any, stream: TextIO | None = None) -> None:
    out = stream or sys.stdout
    out.write(json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n")
    out.flush()


def compact_json(value: Any, limit: int | None = None) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    if limit is not None and len(text) > limit:
        return text[: max(1, limit - 1)] + "…"
    return text


def echo(message: str = "", stream: TextIO | None = None) -> None:
    out = stream or sys.stdout
    out.write(message + "\n")
    out.flush()


# ------------------------------------------------------------------ JSON arguments


def parse_json_arg(text: str | None, option: str) -> Any:
    """The JSON value of an option; `@path` reads a file, `-` reads stdin.

    Raises `CliError` (exit 2) naming the option and the problem.
    """
    if text is None:
        return None
    source = text
    where = ""
    if text == "-":
        source = sys.stdin.read()
        where = " (from stdin)"
    elif text.startswith("@"):
        path = text[1:]
        try:
            source = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise CliError(
                f"{option}: cannot read {path}: {exc.strerror or exc}", EXIT_USAGE
            ) from None
        where = f" (from {path})"
    try:
        return json.loads(source)
    except json.JSONDecodeError as exc:
        raise CliError(
            f"{option} is not valid JSON{where}: {exc.msg} at line {exc.lineno} column "
            f"{exc.colno} (got {source.strip()[:60]!r}; strings need quotes, e.g. "
            f"{option} '\"text\"' or {option} '{{\"key\": 1}}')",
            EXIT_USAGE,
        ) from None


# ------------------------------------------------------------------ stores


def default_store() -> str:
    return os.environ.get("DURABLY_STORE") or DEFAULT_STORE


def sqlite_file_of(url: str) -> Path | None:
    """The database file a `sqlite://` URL names (None for memory or another backend)."""
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    except Exception:
        return None
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    if parsed.query.get("mode") == "memory":
        return None
    return Path(database)


def display_url(url: str) -> str:
    """The URL with any password hidden."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def check_store_url(url: str, *, must_exist: bool) -> None:
    """Fail early with a clear message for URLs durably cannot open."""
    if url in ("memory", "memory://"):
        raise CliError(
            f"store {url!r} is in-memory: it only lives inside one process, so a command "
            "cannot see it; use a sqlite:/// or postgresql:// URL",
            EXIT_USAGE,
        )
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    except Exception as exc:
        raise CliError(f"invalid store URL {url!r}: {exc}", EXIT_USAGE) from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise CliError(
            f"unsupported store URL {display_url(url)!r}: use sqlite:///path.db or "
            "postgresql://user@host/db",
            EXIT_USAGE,
        )
    path = sqlite_file_of(url)
    if must_exist and path is not None and not path.exists():
        raise CliError(
            f"no durably database at {path} (store {display_url(url)}): start a run first, "
            "run `durably db upgrade`, or pass --store / set DURABLY_STORE"
        )


# ------------------------------------------------------------------ APP


def load_app(spec: str) -> Engine:
    """Import `module:attribute` (dotted attribute allowed) naming an `Engine`.

    The current directory is put on `sys.path` first. The attribute may also be a
    zero-argument callable returning an `Engine` (a factory). `module` alone means
    `module:engine`.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep:
        attr = "engine"
    if not module_name or not attr:
        raise CliError(
            f"invalid APP {spec!r}: expected module:attribute, e.g. myapp.workers:engine",
            EXIT_USAGE,
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise CliError(
                f"cannot import {module_name!r} (APP {spec!r}): no module named {exc.name!r} "
                f"on the path (cwd {cwd})"
            ) from None
        raise CliError(f"importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise CliError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CliError(f"module {module_name!r} has no attribute {attr!r}") from None
    if inspect.isfunction(target) or inspect.ismethod(target):  # a factory
        try:
            target = target()
        except Exception as exc:
            raise CliError(f"calling {spec} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(target, Engine):
        raise CliError(f"{spec} is a {type(target).__name__}, not a durably.Engine")
    return target


def replica_of(app: Engine) -> Engine:
    """A `drive=False` engine over the app engine's store and workflows: it starts, signals
    and controls runs but never executes one (the app engine stays unopened)."""
    # Every option of the app (a signal buffered from here obeys the app's own bounds).
    return Engine(
        app.store,
        workflows=app.registered_workflows(),
        namespace=app.namespace,
        drive=False,
        options=app.options,
    )


@asynccontextmanager
async def control_engine(store: str | None, app: str | None) -> Any:
    """An open `drive=False` engine for `--store URL` or `--app APP`."""
    if app is not None:
        app_engine = load_app(app)
        engine = replica_of(app_engine)
        try:
            async with engine:
                yield engine
        finally:
            await app_engine.close()  # never opened: just closes the store it owns
        return
    url = store or default_store()
    check_store_url(url, must_exist=True)
    async with Engine(url, workflows=[], drive=False) as engine:
        yield engine


# ------------------------------------------------------------------ control verbs
# `durably runs …` and `durably signals …` share how they name their store, print usage,
# parse bounded numbers and run an action on a drive=False engine.


def target_options(p: argparse.ArgumentParser) -> None:
    """`--store URL` or `--app APP` (one of them), and `--json`."""
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--store",
        metavar="URL",
        help="store URL (default: $DURABLY_STORE, else sqlite:///durably.db)",
    )
    where.add_argument(
        "--app", metavar="APP", help="module:attribute naming an Engine; uses its store"
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def show_usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return EXIT_OK


def bounded_int(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse `type=` for a whole number in `low..high` (no upper bound when None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            span = f"between {low} and {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"expected a number {span}, got {value}")
        return value

    return parse


def on_control_engine(
    action: Callable[[Engine, argparse.Namespace], Awaitable[int]],
) -> Callable[[argparse.Namespace], int]:
    """A verb handler: open the `--store`/`--app` engine (drive=False), run `action` on it."""

    def handler(args: argparse.Namespace) -> int:
        async def go() -> int:
            async with control_engine(args.store, args.app) as engine:
                return await action(engine, args)

        return asyncio.run(go())

    return handler
