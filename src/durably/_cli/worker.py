"""`durably worker APP`: drive runs until SIGTERM/SIGINT, then drain and exit 0."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from durably._cli.common import EXIT_OK, EXIT_USAGE, Args, CliError, dispatch, echo, load_app
from durably._cli.render import format_duration
from durably._cli.worker_identity import SlotHold, claim_default_id
from durably._engine.defs.concurrency import ConcurrencySpec
from durably._engine.defs.events import EngineEvent
from durably._engine.defs.options import env_name
from durably._engine.engine import INSTANCE_ID_ENV, Engine
from durably._engine.worker.roles import ROLE_ENV, ROLES
from durably._extras import PROMETHEUS_HINT, missing_modules

if TYPE_CHECKING:
    from durably.prometheus import MetricsServer

CONCURRENCY_ENV = env_name("concurrency")


def register(app: typer.Typer) -> None:
    @app.command(
        "worker",
        short_help="run a worker: drive runs until SIGTERM/SIGINT, then drain",
        help=(
            "Open APP's engine (module:attribute naming a durably.Engine; the current "
            "directory is importable) and drive runs: pick up pending runs, recover runs whose "
            "owner died, wake timers, execute steps. SIGTERM or SIGINT drains in-flight turns "
            "(up to the engine's drain timeout) and exits 0; a second signal exits at once."
        ),
    )
    def _worker_cmd(
        app_spec: Annotated[
            str, typer.Argument(metavar="APP", help="module:attribute naming a durably.Engine")
        ],
        quiet: Annotated[
            bool, typer.Option("-q", "--quiet", help="do not print run events")
        ] = False,
        steps: Annotated[bool, typer.Option("--steps", help="also print step events")] = False,
        role: Annotated[
            str | None,
            typer.Option(
                "--role",
                metavar="|".join(ROLES),
                callback=_role,
                help="what the engine takes from its transport: worker (serves its steps "
                "only, drives no run), control (drives runs, takes step results and workflow "
                "decisions, serves no step) or both; sets DURABLY_ROLE for an app whose "
                "Engine(...) leaves role= out",
            ),
        ] = None,
        instance_id: Annotated[
            str | None,
            typer.Option(
                "--instance-id",
                metavar="ID",
                help="this worker's name in the store (default: DURABLY_INSTANCE_ID, else "
                "<hostname>:<APP>, with #2, #3, … for a second, third worker of APP alive on "
                "this host). A worker restarted with the same id takes its previous life's "
                "runs back at once instead of waiting out their leases",
            ),
        ] = None,
        concurrency: Annotated[
            str | None,
            typer.Option(
                "--concurrency",
                metavar="N",
                callback=_concurrency_option,
                help="step handlers run at once (Engine(concurrency=N); 'adaptive' for an "
                "adjusted limit); sets DURABLY_CONCURRENCY for an app whose Engine(...) leaves "
                "it out",
            ),
        ] = None,
        metrics_port: Annotated[
            int | None,
            typer.Option(
                "--metrics-port",
                metavar="N",
                min=0,
                max=65535,
                help="serve this engine's Prometheus metrics on http://HOST:N/metrics (0: a "
                "free port, printed when ready); needs the `prometheus` extra",
            ),
        ] = None,
        metrics_host: Annotated[
            str,
            typer.Option(
                "--metrics-host",
                metavar="HOST",
                help="the address --metrics-port binds (0.0.0.0 to let other hosts scrape)",
            ),
        ] = "127.0.0.1",
    ) -> None:
        dispatch(
            run,
            app=app_spec,
            quiet=quiet,
            steps=steps,
            role=role,
            instance_id=instance_id,
            concurrency=None if concurrency is None else _concurrency(concurrency),
            metrics_port=metrics_port,
            metrics_host=metrics_host,
        )


def _role(value: str | None) -> str | None:
    if value is not None and value not in ROLES:
        raise typer.BadParameter(f"expected one of {', '.join(ROLES)}, not {value!r}")
    return value


def _concurrency_option(value: str | None) -> str | None:
    if value is not None:
        _concurrency(value)
    return value


def _concurrency(text: str) -> ConcurrencySpec:
    if text == "adaptive":
        return "adaptive"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise typer.BadParameter(f"expected a whole number >= 1 or 'adaptive', not {text!r}")
    return value


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in `os.environ` while the app is imported (its module builds the engine, which
    reads them), then the previous environment again: processes the app's steps start must
    not inherit this worker's instance id."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _instance_id(args: Args) -> tuple[str, SlotHold | None]:
    """--instance-id, else DURABLY_INSTANCE_ID, else this host's default id for the app (held
    by a lock file for the life of the process, see worker_identity.py)."""
    if args.instance_id is not None:
        if not args.instance_id.strip():
            raise CliError("--instance-id must not be empty", EXIT_USAGE)
        return args.instance_id.strip(), None
    given = os.environ.get(INSTANCE_ID_ENV, "").strip()
    if given:
        return given, None
    try:
        hold = claim_default_id(args.app)
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    return hold.instance_id, hold


def run(args: Args) -> int:
    if args.metrics_port is not None and missing_modules(("prometheus_client",)):
        raise CliError(f"--metrics-port needs prometheus_client: {PROMETHEUS_HINT}", EXIT_USAGE)
    if not args.metrics_host.strip():
        raise CliError("--metrics-host must not be empty", EXIT_USAGE)
    if args.role is not None:
        # Read by Engine(...) when role= is left out: the app module builds its engine as
        # it is imported, so the role has to be in place before.
        os.environ[ROLE_ENV] = args.role
    instance_id, slot = _instance_id(args)
    values = {INSTANCE_ID_ENV: instance_id}
    if args.concurrency is not None:
        values[CONCURRENCY_ENV] = str(args.concurrency)
    with _environment(values):
        app = load_app(args.app)  # a role contradicting the app's engine fails its import
    if args.instance_id is not None and app.instance_id != instance_id:
        raise CliError(
            f"{args.app} builds its engine with instance_id={app.instance_id!r}, which "
            f"contradicts --instance-id {instance_id}: drop one of them",
            2,
        )
    if slot is not None and app.instance_id != slot.instance_id:
        slot.release()  # the app names its engine itself: the default id is not used
    if args.concurrency is not None and app.options.concurrency != args.concurrency:
        raise CliError(
            f"{args.app} builds its engine with concurrency={app.options.concurrency!r}, "
            f"which contradicts --concurrency {args.concurrency}: drop one of them",
            2,
        )
    if args.role is not None and app.role != args.role:
        raise CliError(
            f"{args.app} builds its engine with role={app.role!r}, which contradicts "
            f"--role {args.role}: drop one of them",
            2,
        )
    if not (app.drive_runs or app.serves_steps):
        raise CliError(
            f"{args.app} was built with drive=False: a worker needs an engine that drives runs "
            "or serves steps"
        )
    return asyncio.run(_work(app, args))


def _printer(show_steps: bool) -> Any:
    def on_event(event: EngineEvent) -> None:
        kind = event.type
        if kind.startswith("step.") and not show_steps:
            return
        if kind in ("step.started", "step.progress"):
            return
        parts = [time.strftime("%H:%M:%S"), kind.ljust(14), event.run_id]
        if event.workflow:
            parts.append(f"({event.workflow})")
        if event.name:
            parts.append(event.name)
        if event.duration_ms is not None:
            parts.append(format_duration(event.duration_ms))
        if event.error is not None:
            parts.append(f"error: {event.error.message}")
        echo("  ".join(parts))

    return on_event


async def _work(app: Engine, args: Args) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    main_task = asyncio.current_task()
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            echo(f"received {signal.Signals(signum).name}: draining…", sys.stderr)
            stop.set()
        elif main_task is not None:
            echo("second signal: exiting without waiting for the drain", sys.stderr)
            main_task.cancel()

    handled = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, on_signal, signum)
            handled.append(signum)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - non-Unix loops
            signal.signal(signum, lambda n, _f: loop.call_soon_threadsafe(on_signal, n))
    unsubscribe = app.subscribe(_printer(args.steps)) if not args.quiet else None
    server = None
    try:
        await app.open()
        if args.metrics_port is not None:
            server = await _serve_metrics(app, args.metrics_host, args.metrics_port)
        names = sorted({wf.name for wf in app.registered_workflows()})
        echo(
            f"durably worker {app.instance_id} ready: role {app.role}, store {app.store!r}, "
            f"workflows: {', '.join(names) or '(none)'}",
            sys.stderr,
        )
        await stop.wait()
        if server is not None:
            await server.close()  # before the drain: a scrape reads the open engine
            server = None
        await app.close()
        echo("worker drained; bye", sys.stderr)
        return EXIT_OK
    except asyncio.CancelledError:
        return 1
    finally:
        if server is not None:
            await server.close()
        if unsubscribe is not None:
            unsubscribe()
        for signum in handled:
            loop.remove_signal_handler(signum)


async def _serve_metrics(app: Engine, host: str, port: int) -> MetricsServer:
    """Serve the engine's Prometheus exposition from prometheus_client's HTTP server. It
    answers on a daemon thread of its own; each scrape asks the engine's loop for its
    readings and waits there, so the loop never blocks on a scrape."""
    # Imported here: the `prometheus` extra is optional, and checked before the engine opens.
    from durably.prometheus import PrometheusMetrics

    try:
        server = await PrometheusMetrics(app).serve(port, host)
    except OSError as exc:
        await app.close()
        raise CliError(f"--metrics-port {port} on {host}: {exc.strerror or exc}") from None
    echo(f"metrics on http://{_url_host(server.host)}:{server.port}/metrics", sys.stderr)
    return server


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
