"""Shared helpers of the CLI: errors, JSON arguments, loading `APP`, store URLs, engines."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, TextIO

import typer
from typer.core import TyperGroup

from durably._engine.engine import Engine

# typer carries its own copy of click: its usage error is the base of `typer.BadParameter`.
_UsageError: type[Exception] = typer.BadParameter.__mro__[1]

DEFAULT_STORE = "sqlite:///durably.db"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CommandGroup(TyperGroup):
    """The `durably` application and its groups: an unknown command name exits 1 (a failed
    call, like a run that does not exist); a malformed call (a bad option or number) stays
    a usage error, exit 2."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except _UsageError as exc:
            if args and self.get_command(ctx, args[0]) is None:
                exc.exit_code = EXIT_FAILED  # type: ignore[attr-defined]
            raise


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


def confirm(question: str) -> bool:
    """Ask `question` on stderr and read the answer from stdin: yes only for y/yes. The
    answer's line never reaches stdout (which a script may be parsing); no answer (end of
    input) is a no."""
    sys.stderr.write(f"{question} [y/N]: ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    if not answer:
        sys.stderr.write("\n")
    return answer.strip().lower() in ("y", "yes")


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
        # Listed and described beside the persisted ones; a drive=False engine fires none.
        schedules=app.schedules.declared,
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


# ------------------------------------------------------------------ commands
# Every command is a typer function that gathers its parameters into an `Args` namespace and
# hands it to a handler returning the exit code: the handlers do not depend on how the
# command line was parsed, and `run_handler` gives every command the same error contract.

Args = SimpleNamespace

STORE_HELP = "store URL (default: $DURABLY_STORE, else sqlite:///durably.db)"
StoreOpt = Annotated[str | None, typer.Option("--store", metavar="URL", help=STORE_HELP)]
AppOpt = Annotated[
    str | None,
    typer.Option("--app", metavar="APP", help="module:attribute naming an Engine; uses its store"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]


def run_handler(handler: Callable[[Args], int], args: Args) -> int:
    """The handler's exit code; a `CliError` is its message on stderr and its code."""
    try:
        return handler(args)
    except CliError as exc:
        print(f"durably: error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("durably: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("DURABLY_DEBUG"):
            raise
        print(f"durably: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED


# Set by `main.parse_args`: the parsed parameters are handed to it instead of the handler.
CAPTURE: ContextVar[Callable[[Args], None] | None] = ContextVar("durably_cli_capture", default=None)


def dispatch(handler: Callable[[Args], int], **params: Any) -> None:
    """Run `handler` on the command's parameters; a non-zero code ends the process with it."""
    capture = CAPTURE.get()
    if capture is not None:
        capture(Args(**params))
        return
    code = run_handler(handler, Args(**params))
    if code != EXIT_OK:
        raise typer.Exit(code)


def usage_group(
    app: typer.Typer, name: str, help: str, description: str | None = None
) -> typer.Typer:
    """A command group (`durably runs …`) that prints its usage when given no action."""
    group = typer.Typer(
        help=description or help, short_help=help, add_completion=False, cls=CommandGroup
    )

    @group.callback(invoke_without_command=True)
    def _usage(ctx: typer.Context) -> None:
        if ctx.invoked_subcommand is None:
            typer.echo(ctx.get_help())
            raise typer.Exit(EXIT_OK)

    app.add_typer(group, name=name)
    return group


def bounded_int(low: int, high: int | None = None) -> Callable[[int | None], int | None]:
    """A typer `callback=` refusing a whole number outside `low..high` (no upper bound when
    None), naming the range."""

    def check(value: int | None) -> int | None:
        if value is not None and (value < low or (high is not None and value > high)):
            span = f"between {low} and {high}" if high is not None else f">= {low}"
            raise typer.BadParameter(f"expected a number {span}, got {value}")
        return value

    return check


def exclusive(**given: object) -> None:
    """Refuse two options of which only one may be given (exit 2), naming them."""
    named = [name for name, value in given.items() if value not in (None, False)]
    if len(named) > 1:
        raise CliError(f"{' and '.join(named)} exclude each other: give one", EXIT_USAGE)


def on_control_engine(
    action: Callable[[Engine, Args], Awaitable[int]],
) -> Callable[[Args], int]:
    """A verb handler: open the `--store`/`--app` engine (drive=False), run `action` on it."""

    def handler(args: Args) -> int:
        exclusive(**{"--store": args.store, "--app": args.app})

        async def go() -> int:
            async with control_engine(args.store, args.app) as engine:
                return await action(engine, args)

        return asyncio.run(go())

    return handler
