"""`PrometheusMetrics`: one engine's (or client's) Prometheus registry, its exposition, and
the HTTP port `durably worker --metrics-port` serves it on.

Each `PrometheusMetrics` holds its own `CollectorRegistry`, never the library's global
default: two engines in one process each get their own series, and nothing registered by
the application (or another library) on the default registry appears in, or clashes with,
durably's. The registry's one collector builds its families from `Readings` at every
scrape, so nothing is kept between scrapes.

Where a scrape runs decides how the readings are taken. On the engine's loop (the console's
endpoint) `exposition()` awaits them, then renders. From another thread (the library's HTTP
server, which answers each request on a thread of its own) the collector asks the engine's
loop for them and waits there, so the loop itself never blocks on a scrape.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from concurrent.futures import TimeoutError as FutureTimeout
from contextvars import ContextVar
from wsgiref.simple_server import WSGIServer

from prometheus_client.exposition import generate_latest, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from durably._engine.client.client import Client
from durably._engine.engine import Engine
from durably._observe.families import Readings, families, read

__all__ = ["CONTENT_TYPE", "MetricsServer", "PrometheusMetrics"]

#: The content type of `generate_latest`'s text (the Prometheus text format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: How long a scrape from another thread waits for the engine's loop to answer.
READ_TIMEOUT_S = 10.0

# The readings `exposition()` took for the render it is running (a scrape on the loop).
_taken: ContextVar[Readings | None] = ContextVar("durably_prometheus_readings", default=None)


class _Collector:
    """The registry's collector: builds every family from fresh readings at each scrape."""

    def __init__(self, metrics: PrometheusMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        # Registering must not scrape (the engine may not be open yet): no names declared.
        return ()

    def collect(self) -> Iterable[Metric]:
        readings = _taken.get()
        if readings is None:
            readings = self._metrics.read_from_thread()
        return list(families(readings))


class PrometheusMetrics:
    """The Prometheus exposition of `source` (an `Engine`, or a `Client`, which reports only
    its store's run counts) on a registry of its own (`registry`)."""

    def __init__(self, source: Engine | Client) -> None:
        if not isinstance(source, Engine | Client):
            raise TypeError(
                f"PrometheusMetrics needs a durably.Engine or durably.Client, not {source!r}"
            )
        self._source = source
        self._loop: asyncio.AbstractEventLoop | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    async def exposition(self) -> bytes:
        """The text a scrape returns (`generate_latest` of this registry), read now. Await it
        on the loop the engine runs on."""
        self._loop = asyncio.get_running_loop()
        token = _taken.set(await read(self._source))
        try:
            return generate_latest(self.registry)
        finally:
            _taken.reset(token)

    def read_from_thread(self) -> Readings:
        """The readings, taken on the engine's loop for a scrape on another thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            raise RuntimeError(
                "PrometheusMetrics has no running engine loop to read from: call serve() or "
                "await exposition() on the engine's loop first"
            )
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError(
                "a scrape on the engine's loop must await PrometheusMetrics.exposition() "
                "(rendering the registry synchronously there would wait on itself)"
            )
        future = asyncio.run_coroutine_threadsafe(read(self._source), loop)
        try:
            return future.result(timeout=READ_TIMEOUT_S)
        except FutureTimeout:
            future.cancel()
            raise TimeoutError(
                f"the engine's loop did not answer a metrics scrape within {READ_TIMEOUT_S}s"
            ) from None

    async def serve(self, port: int, host: str = "127.0.0.1") -> MetricsServer:
        """Serve the exposition over HTTP on `host:port` (port 0: a free one), from the
        library's HTTP server on a daemon thread; call it on the engine's loop."""
        self._loop = asyncio.get_running_loop()
        server, thread = await asyncio.to_thread(
            start_http_server, port, addr=host, registry=self.registry
        )
        return MetricsServer(server, thread)


class MetricsServer:
    """The HTTP server `PrometheusMetrics.serve` started; `close()` stops it."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    async def close(self) -> None:
        """Stop serving and wait for the server's thread (off the loop: shutting down
        waits for the server's poll)."""
        await asyncio.to_thread(self._server.shutdown)
        self._server.server_close()
        await asyncio.to_thread(self._thread.join)
