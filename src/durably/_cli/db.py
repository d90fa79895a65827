"""`durably db upgrade [--store URL] [--sql]`: apply (or print) the SQL schema migrations."""

from __future__ import annotations

from typing import Annotated

import typer

from durably._cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    Args,
    CliError,
    JsonOpt,
    StoreOpt,
    check_store_url,
    default_store,
    dispatch,
    display_url,
    echo,
    print_json,
    usage_group,
)
from durably._core.errors import SchemaVersionError, StoreConnectionError


def register(app: typer.Typer) -> None:
    db = usage_group(app, "db", "database schema management")

    @db.command(
        "upgrade",
        short_help="apply pending schema migrations (or print them with --sql)",
        help=(
            "Bring the store's schema to the current version. Safe to run concurrently and "
            "repeatedly. With --sql, print the SQL that would run and change nothing. A "
            "schema written by a newer durably is refused (exit 1): upgrade durably instead."
        ),
    )
    def _upgrade(
        store: StoreOpt = None,
        sql: Annotated[
            bool, typer.Option("--sql", help="print the SQL without applying it")
        ] = False,
        json: JsonOpt = False,
    ) -> None:
        dispatch(upgrade, store=store, sql=sql, json=json)


def upgrade(args: Args) -> int:
    url: str = args.store or default_store()
    check_store_url(url, must_exist=False)
    try:
        from durably._store.sql import migrations
    except ImportError as exc:  # pragma: no cover - the SQL store ships with durably
        raise CliError(f"the SQL store is unavailable: {exc}") from exc
    try:
        statements = migrations.upgrade_sync(url, sql_only=args.sql)
    except ModuleNotFoundError as exc:
        hint = " (pip install 'durably[postgres]')" if exc.name == "asyncpg" else ""
        raise CliError(f"cannot open {display_url(url)}: {exc}{hint}") from None
    except (SchemaVersionError, StoreConnectionError) as exc:
        # Both name the database and the remedy; the schema was left as it was.
        raise CliError(str(exc)) from None
    except ValueError as exc:
        raise CliError(f"{display_url(url)}: {exc}", EXIT_USAGE) from None
    head = getattr(migrations, "HEAD", None)
    if args.json:
        print_json(
            {
                "store": display_url(url),
                "applied": not args.sql and bool(statements),
                "schemaVersion": head,
                "statements": statements,
            }
        )
        return EXIT_OK
    if args.sql:
        if not statements:
            echo(f"-- {display_url(url)} is up to date (schema version {head}); nothing to run")
        else:
            echo(f"-- durably schema migrations for {display_url(url)} (to version {head})")
            for statement in statements:
                echo(statement.rstrip().rstrip(";") + ";")
                echo()
        return EXIT_OK
    if statements:
        echo(f"{display_url(url)}: applied {len(statements)} statements; schema at version {head}")
    else:
        echo(f"{display_url(url)}: already up to date (schema version {head})")
    return EXIT_OK
