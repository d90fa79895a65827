"""`durably dashboard APP_OR_STORE_URL --port N`: serve the console alone.

APP (`module:attribute` naming an Engine) is served through a `drive=False` replica of it (the
app's workflows registered, so retry-with-input can start runs; runs are executed by your
workers). A store URL (`sqlite:///…`, `postgresql://…`) opens a `drive=False` engine on it.
Needs the `dashboard` extra (starlette, uvicorn).

The console can cancel and retry runs and read their inputs, so it is never exposed by
accident: bound beyond loopback (`--host 0.0.0.0`, a LAN address) it refuses to start
without sign-in, unless `--insecure-no-auth` says that is meant (a trusted network, a proxy
that authenticates). Sign-in comes from the environment, never the command line (which
other users of the machine can read in the process list): `--auth-secret-env VAR` names
the variable holding the session-signing secret, then `--auth-user-env` +
`--auth-password-env` (the login form's one user) and/or `--auth-token-env` (a shared
token: typed as the password in the login form, or sent as `Authorization: Bearer` to
`POST <base>/session` by a script, which gets the session cookie back).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from durably._cli.common import (
    EXIT_OK,
    Args,
    CliError,
    check_store_url,
    dispatch,
    display_url,
    echo,
    load_app,
    replica_of,
)
from durably._engine.engine import Engine
from durably._extras import EXTRA_HINT, missing_modules

__all__ = ["ConsoleOptions", "console_options", "is_loopback", "is_store_url", "register", "run"]

#: Host names a loopback console answers besides the bind address.
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
_WILDCARD_BINDS = ("0.0.0.0", "::", "")


_SIGN_IN = (
    "Sign-in (required beyond loopback, else --insecure-no-auth; values from the environment)"
)


def _env_var(flag: str, help: str) -> Any:
    return typer.Option(flag, metavar="VAR", help=help, rich_help_panel=_SIGN_IN)


def register(app: typer.Typer) -> None:
    @app.command(
        "dashboard",
        short_help="serve the web console (needs the dashboard extra)",
        help=(
            "Serve the durably console and its JSON API for APP (module:attribute naming a "
            "durably.Engine) or a store URL (sqlite:///path.db, postgresql://…). The engine "
            "is opened with drive=False: the console reads and controls runs, your workers "
            "execute them. Needs `" + EXTRA_HINT + "`. Sign-in is required when --host is "
            "not a loopback address (or pass --insecure-no-auth); its values are read from "
            "environment variables, named by the --auth-*-env options."
        ),
    )
    def _dashboard_cmd(
        target: Annotated[
            str,
            typer.Argument(metavar="APP_OR_STORE_URL", help="module:attribute, or a store URL"),
        ],
        port: Annotated[int, typer.Option("--port", help="port to listen on")] = 8000,
        host: Annotated[str, typer.Option("--host", help="interface to listen on")] = "127.0.0.1",
        read_only: Annotated[
            bool, typer.Option("--read-only", help="refuse every mutating endpoint (403)")
        ] = False,
        base_path: Annotated[
            str, typer.Option("--base-path", help="URL path of the console")
        ] = "/",
        allowed_host: Annotated[
            list[str] | None,
            typer.Option(
                "--allowed-host",
                metavar="NAME",
                help="a Host name the console answers besides localhost/127.0.0.1/[::1] and "
                "--host (repeatable; NAME:PORT for one port, .example.com for a domain, * for "
                "any)",
            ),
        ] = None,
        max_body_bytes: Annotated[
            int | None,
            typer.Option(
                "--max-body-bytes",
                metavar="N",
                help="refuse request bodies larger than N bytes with 413 (default 1 MiB)",
            ),
        ] = None,
        auth_secret_env: Annotated[
            str | None,
            _env_var("--auth-secret-env", "variable holding the session-signing secret"),
        ] = None,
        auth_user_env: Annotated[
            str | None, _env_var("--auth-user-env", "variable holding the login user")
        ] = None,
        auth_password_env: Annotated[
            str | None,
            _env_var("--auth-password-env", "variable holding that user's password"),
        ] = None,
        auth_token_env: Annotated[
            str | None,
            _env_var(
                "--auth-token-env",
                "variable holding a shared access token (login form password, or Bearer)",
            ),
        ] = None,
        auth_ttl: Annotated[
            str | None,
            typer.Option(
                "--auth-ttl",
                metavar="DURATION",
                help="session lifetime (default 8h)",
                rich_help_panel=_SIGN_IN,
            ),
        ] = None,
        insecure_no_auth: Annotated[
            bool,
            typer.Option(
                "--insecure-no-auth",
                help="serve without sign-in on a non-loopback address (anyone who reaches the "
                "port can cancel and retry runs)",
                rich_help_panel=_SIGN_IN,
            ),
        ] = False,
    ) -> None:
        dispatch(
            run,
            target=target,
            port=port,
            host=host,
            read_only=read_only,
            base_path=base_path,
            allowed_host=list(allowed_host or []),
            max_body_bytes=max_body_bytes,
            auth_secret_env=auth_secret_env,
            auth_user_env=auth_user_env,
            auth_password_env=auth_password_env,
            auth_token_env=auth_token_env,
            auth_ttl=auth_ttl,
            insecure_no_auth=insecure_no_auth,
        )


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


def is_loopback(host: str) -> bool:
    """Whether a bind address only accepts connections from this machine."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _same(given: str, expected: bytes) -> bool:
    # Digests of equal length: compare_digest then takes the same time whatever the input
    # (no early exit on the first differing byte, no length leak).
    return hmac.compare_digest(_digest(given), expected)


@dataclass(frozen=True)
class _EnvCredentials:
    """The hooks behind `--auth-*-env`: one login user and/or one shared token."""

    user: bytes | None
    password: bytes | None
    token: bytes | None

    def login(self, username: str, password: str) -> dict[str, Any] | None:
        if self.user is not None and self.password is not None:
            # both compared every time: which one was wrong is not observable
            user_ok = _same(username, self.user)
            password_ok = _same(password, self.password)
            if user_ok and password_ok:
                return {"id": username, "name": username}
        if self.token is not None and _same(password, self.token):
            return {"id": "token", "name": username or "token"}
        return None

    def session(self, request: Any) -> dict[str, Any] | None:
        """`POST <base>/session` with `Authorization: Bearer <token>` → a session cookie."""
        if self.token is None:
            return None
        scheme, _, value = (request.headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not _same(value.strip(), self.token):
            return None
        return {"id": "token"}


@dataclass(frozen=True)
class ConsoleOptions:
    """What `durably dashboard` passes to `create_app` besides the engine."""

    auth: Mapping[str, Any] | None
    allowed_hosts: tuple[str, ...]
    sign_in: str  # for the start-up line


def _from_env(environ: Mapping[str, str], var: str, flag: str) -> str:
    value = environ.get(var)
    if not value:
        raise CliError(f"{flag} {var}: the environment variable {var} is not set or is empty")
    return value


def console_options(args: Args, environ: Mapping[str, str]) -> ConsoleOptions:
    """Sign-in and allowed hosts from the arguments; `CliError` for a console that would be
    exposed without sign-in, or for an incomplete or contradictory sign-in setup."""
    given = {
        "--auth-user-env": args.auth_user_env,
        "--auth-password-env": args.auth_password_env,
        "--auth-token-env": args.auth_token_env,
        "--auth-ttl": args.auth_ttl,
    }
    named = [flag for flag, value in given.items() if value]
    wants_auth = bool(args.auth_secret_env or named)
    if args.insecure_no_auth and wants_auth:
        flags = (["--auth-secret-env"] if args.auth_secret_env else []) + named
        raise CliError(f"--insecure-no-auth contradicts {', '.join(flags)}: choose one", 2)
    auth: dict[str, Any] | None = None
    sign_in = "none"
    if wants_auth:
        if not args.auth_secret_env:
            raise CliError(
                f"{named[0]} needs --auth-secret-env VAR (the secret that signs sessions)", 2
            )
        if bool(args.auth_user_env) != bool(args.auth_password_env):
            raise CliError("--auth-user-env and --auth-password-env go together", 2)
        if not (args.auth_user_env or args.auth_token_env):
            raise CliError(
                "--auth-secret-env needs a way to sign in: --auth-user-env with "
                "--auth-password-env, and/or --auth-token-env",
                2,
            )
        # Imported here: the dashboard package needs its extra, checked before this runs.
        from durably.dashboard.cookie import parse_ttl, secret_problem

        secret = _from_env(environ, args.auth_secret_env, "--auth-secret-env")
        problem = secret_problem(secret)
        if problem is not None:
            raise CliError(
                f"--auth-secret-env {args.auth_secret_env}: the session-signing secret is "
                f"too weak: {problem} (e.g. `openssl rand -hex 32`)",
                2,
            )
        user = password = token = None
        if args.auth_user_env:
            user = _digest(_from_env(environ, args.auth_user_env, "--auth-user-env"))
            password = _digest(_from_env(environ, args.auth_password_env, "--auth-password-env"))
        if args.auth_token_env:
            token = _digest(_from_env(environ, args.auth_token_env, "--auth-token-env"))
        hooks = _EnvCredentials(user, password, token)
        auth = {"secret": secret, "login": hooks.login}
        if token is not None:
            auth["session"] = hooks.session
        if args.auth_ttl:
            try:
                parse_ttl(args.auth_ttl)
            except ValueError as exc:
                raise CliError(f"--auth-ttl: {exc}", 2) from None
            auth["ttl"] = args.auth_ttl
        sign_in = " + ".join(
            kind for kind, on in (("login form", user), ("token", token)) if on is not None
        )
    elif not is_loopback(args.host) and not args.insecure_no_auth:
        raise CliError(
            f"refusing to serve the console on {args.host} without sign-in: anyone who "
            "reaches that address could cancel and retry runs and read their data. Add "
            "--auth-secret-env VAR with --auth-user-env/--auth-password-env or "
            "--auth-token-env, or pass --insecure-no-auth if another layer (a VPN, an "
            "authenticating proxy) already guards it",
            2,
        )
    hosts = list(_LOOPBACK_NAMES)
    bind = args.host.strip()
    if bind not in _WILDCARD_BINDS and not is_loopback(bind):
        hosts.append(f"[{bind}]" if ":" in bind else bind)
    hosts += args.allowed_host
    return ConsoleOptions(auth, tuple(dict.fromkeys(hosts)), sign_in)


def run(args: Args) -> int:
    _require_extra()
    options = console_options(args, os.environ)  # refused before the store is opened
    engine, app_engine = _engine_for(args.target)
    return asyncio.run(_serve(engine, app_engine, args, options))


async def _serve(
    engine: Engine, app_engine: Engine | None, args: Args, options: ConsoleOptions
) -> int:
    import uvicorn

    from durably.dashboard import DashboardConfigError, create_app
    from durably.dashboard.security import DEFAULT_MAX_BODY_BYTES

    try:
        async with engine:
            try:
                app = create_app(
                    engine,
                    base_path=args.base_path,
                    read_only=args.read_only,
                    auth=options.auth,
                    allowed_hosts=options.allowed_hosts,
                    max_body_bytes=(
                        DEFAULT_MAX_BODY_BYTES
                        if args.max_body_bytes is None
                        else args.max_body_bytes
                    ),
                )
            except DashboardConfigError as exc:
                raise CliError(str(exc), 2) from None
            where = args.target if not is_store_url(args.target) else display_url(args.target)
            mode = " (read-only)" if args.read_only else ""
            base = app.state.durably_base_path
            shown = f"[{args.host}]" if ":" in args.host else args.host
            echo(f"durably dashboard for {where}{mode}: http://{shown}:{args.port}{base}")
            echo(
                f"  sign-in: {options.sign_in}; Host names answered: "
                f"{', '.join(options.allowed_hosts)}"
            )
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
