"""`durably.prometheus`: the Prometheus exposition of an engine (needs `durably[prometheus]`).

    metrics = PrometheusMetrics(engine)      # a CollectorRegistry of its own
    text = await metrics.exposition()        # on the engine's loop: generate_latest(...)
    server = await metrics.serve(9464)       # or over HTTP, from a daemon thread

`PrometheusMetrics.registry` is a `prometheus_client.CollectorRegistry` owned by this object,
never the library's global default, so two engines in one process never clash; register
it with anything that renders a registry. `METRICS` lists every metric with its type, labels
and help text. The console's `metrics` endpoint and `durably worker --metrics-port` serve the
same text.

This module sits above the runtime, beside `durably.transports`: `import durably` never
imports prometheus_client.
"""

from __future__ import annotations

from durably._observe.families import METRICS, Readings
from durably._observe.prometheus import CONTENT_TYPE, MetricsServer, PrometheusMetrics

__all__ = ["CONTENT_TYPE", "METRICS", "MetricsServer", "PrometheusMetrics", "Readings"]
