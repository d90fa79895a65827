"""The Prometheus exposition of an engine's events and state (`durably.prometheus`).

Above the runtime and below the entry points (the console's `metrics` endpoint and
`durably worker --metrics-port` use it); it needs the `prometheus` extra, which importing
this package checks first, so a missing library is a message naming what to install.
"""

from __future__ import annotations

from durably._extras import require_prometheus

require_prometheus("durably's Prometheus metrics")
