"""The Celery app of the remote-step comparison: one no-op task, Redis as broker AND result backend.

Configured from the environment so that `run.py` and the `celery worker` process it starts
share one broker, one queue and one result prefix:

* ``DURABLY_BENCH_REDIS``: the Redis URL (broker and result backend);
* ``DURABLY_BENCH_QUEUE``: the queue (a fresh name per run, so runs never see each other's
  tasks on a shared server).

Settings other than Celery's defaults: the queue name, JSON only (Celery's default serializer
too), results expire after 10 minutes (they are read at once; the default keeps them a day),
and no gossip/mingle/heartbeat events (a single worker has nobody to talk to).
"""

from __future__ import annotations

import os

from celery import Celery

REDIS = os.environ.get("DURABLY_BENCH_REDIS", "redis://127.0.0.1:6379/0")
QUEUE = os.environ.get("DURABLY_BENCH_QUEUE", "bench-remote")

app = Celery("bench_remote", broker=REDIS, backend=REDIS)
app.conf.update(
    task_default_queue=QUEUE,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_expires=600,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="bench.remote.noop")
def noop(x: int) -> int:
    return x
