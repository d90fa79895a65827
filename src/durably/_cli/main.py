"""`durably` console script: argument parsing and dispatch."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from durably._cli import dashboard, db, demo, runs, signals, start, worker
from durably._cli.common import EXIT_FAILED, EXIT_USAGE, CliError


def build_parser() -> argparse.ArgumentParser:
    from durably import __version__

    parser = argparse.ArgumentParser(
        prog="durably",
        description="Durable workflows for asyncio Python — command line.",
        epilog="Store URLs: sqlite:///path.db (default: $DURABLY_STORE, else "
        "sqlite:///durably.db) or postgresql://user@host/db.",
    )
    parser.add_argument("--version", action="version", version=f"durably {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo.add_parser(sub)
    worker.add_parser(sub)
    start.add_parser(sub)
    runs.add_parser(sub)
    signals.add_parser(sub)
    db.add_parser(sub)
    dashboard.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    level = (
        logging.DEBUG if args.verbose >= 2 else logging.INFO if args.verbose else logging.WARNING
    )
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code: int = handler(args)
        return code
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


__all__ = ["EXIT_USAGE", "build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
