"""Worker concurrency: how many step handlers this engine runs at once (`Engine(concurrency=…)`).

- **Fixed** (`concurrency=8`): at most 8 `ctx.step` handlers (fan members included) run in
  this process at once; the others wait for a permit, in arrival order. A step waiting for a
  permit has not started: its `step.started` event, its duration and its `timeout=` begin
  when it gets one. A step of a flow-control queue takes its queue slot first, then its
  permit, so a step parked in a queue's line never holds a permit.
- **Adaptive** (`concurrency="adaptive"` or `AdaptiveConcurrency(...)`): the limit starts at
  `start` (default `min`) and is adjusted every `tick`, additive increase and multiplicative
  decrease, on what the process measures:
  1. resident memory at or above `ram_ceiling_pct` of the memory limit (the cgroup's, else
     the machine's) halves the limit (`ram_ceiling`);
  2. process CPU at or above `cpu_ceiling_pct` of the machine cuts it by `decrease`
     (`cpu_ceiling`);
  3. the latency gradient: when the median step duration of the last tick is more than
     `latency_tolerance` times its slow-moving average, the steps got slower as more ran at
     once (a saturated downstream, a saturated event loop), and the limit is cut by
     `decrease` (`shrink`);
  4. otherwise, if steps waited for a permit during the tick (the limit was what held them
     back), it grows by one (`grow`).
  Independently of the limit, memory at or above `ram_admit_pct` stops new steps from
  starting until it falls below `ram_resume_pct` (running steps finish; a brake, not a
  limit change).

The current limit, the steps in flight and the last adjustment are reported in
`Engine.worker_health()` (this engine's own entry) and on the console's workers panel.

Steps served to other processes over a transport are not counted here (their servers take
`step_threads`); `ctx.local_step`, side effects and saga compensations are not steps of this
limit either.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from durably._core.log_context import durably_logger
from durably._engine.defs.concurrency import AdaptiveConcurrency, ConcurrencySpec
from durably._read.list_models import WorkerConcurrency, WorkerStatus

log = durably_logger("durably.flow")

__all__ = ["Resources", "StepLimiter", "read_resources", "step_limiter"]

Reason = Literal["ram_ceiling", "cpu_ceiling", "backpressure", "grow", "shrink"]


@dataclass(frozen=True, slots=True)
class Resources:
    """One reading of the process: resident memory and its limit (bytes), and the share of
    the machine's CPU the process used since the previous reading (percent). None: not
    measurable here."""

    rss_bytes: int | None = None
    rss_limit_bytes: int | None = None
    cpu_pct: float | None = None

    @property
    def rss_pct(self) -> float | None:
        if self.rss_bytes is None or not self.rss_limit_bytes:
            return None
        return 100.0 * self.rss_bytes / self.rss_limit_bytes


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def _memory_limit() -> int | None:
    """The cgroup's memory limit (v2, then v1) when it is below the machine's memory."""
    total: int | None = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        limit = _read_int(path)
        if limit is not None and (total is None or limit < total):
            return limit
    return total


class _ProcessReader:
    """The default probe: Linux's /proc and cgroup files; None where they are missing."""

    def __init__(self) -> None:
        self._limit = _memory_limit()
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._cpus = os.cpu_count() or 1
        self._last = (time.monotonic(), time.process_time())

    def __call__(self) -> Resources:
        rss: int | None = None
        try:
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * self._page
        except (OSError, ValueError, IndexError):
            pass
        wall, cpu = time.monotonic(), time.process_time()
        last_wall, last_cpu = self._last
        self._last = (wall, cpu)
        used = None
        if wall > last_wall:
            used = min(100.0, 100.0 * (cpu - last_cpu) / (wall - last_wall) / self._cpus)
        return Resources(rss, self._limit, used)


def read_resources() -> Callable[[], Resources]:
    """A fresh probe of this process (each probe measures CPU since its previous reading)."""
    return _ProcessReader()


class StepLimiter:
    """Permits for step handlers: a fixed limit, or an adaptive one (module docstring)."""

    def __init__(
        self,
        limit: int | AdaptiveConcurrency,
        *,
        probe: Callable[[], Resources] | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.adaptive = limit if isinstance(limit, AdaptiveConcurrency) else None
        a = self.adaptive
        if a is None:
            assert isinstance(limit, int)
            self.limit = limit
        else:
            self.limit = a.start if a.start is not None else a.min
        self.in_flight = 0
        self.last_adjust: dict[str, Any] | None = None
        self.braking = False  # memory above ram_admit_pct: no new step starts
        self._probe = probe or (read_resources() if a is not None else None)
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._waited = False  # a step waited for a permit since the last tick
        self._durations: list[float] = []  # ms, of the steps that ended since the last tick
        self._recent: deque[tuple[int, float]] = deque(maxlen=1000)  # (ended at, ms)
        self._average: float | None = None  # slow-moving average of the tick medians (ms)
        self._resources = Resources()
        self._ticker: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ permits

    async def acquire(self) -> None:
        """Wait for a permit (first come, first served)."""
        self._tick_soon()
        if not self._waiters and self._has_room():
            self.in_flight += 1
            return
        self._waited = True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._give_back()  # granted just as it was cancelled: pass it on
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def release(self, duration_ms: float) -> None:
        """A step that held a permit ended after `duration_ms`."""
        self._durations.append(duration_ms)
        self._recent.append((self._clock(), duration_ms))
        self._give_back()

    def _give_back(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _has_room(self) -> bool:
        return self.in_flight < self.limit and not self.braking

    def _wake(self) -> None:
        while self._waiters and self._has_room():
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_flight += 1
                waiter.set_result(None)

    # ------------------------------------------------------------------ adapting

    def tick(self) -> None:
        """One adjustment of an adaptive limit (every `tick`; tests call it directly)."""
        a = self.adaptive
        if a is None or self._probe is None:
            return
        res = self._resources = self._probe()
        rss_pct = res.rss_pct
        if rss_pct is not None:
            if rss_pct >= a.ram_admit_pct:
                self.braking = True
            elif rss_pct < a.ram_resume_pct:
                self.braking = False
        durations, self._durations = self._durations, []
        # Steps that asked for a permit and had to wait since the last tick, or still wait.
        waited = self._waited or bool(self._waiters)
        self._waited = False
        median = statistics.median(durations) if len(durations) >= 3 else None
        slower = (
            median is not None
            and self._average is not None
            and median > a.latency_tolerance * self._average
        )
        if median is not None:
            self._average = median if self._average is None else 0.9 * self._average + 0.1 * median
        if rss_pct is not None and rss_pct >= a.ram_ceiling_pct:
            self._set(max(a.min, self.limit // 2), "ram_ceiling")
        elif res.cpu_pct is not None and res.cpu_pct >= a.cpu_ceiling_pct:
            self._set(max(a.min, int(self.limit * a.decrease)), "cpu_ceiling")
        elif slower:
            self._set(max(a.min, int(self.limit * a.decrease)), "shrink")
        elif waited and not self.braking:
            self._set(min(a.max, self.limit + 1), "grow")
        self._wake()

    def _set(self, limit: int, reason: Reason) -> None:
        if limit == self.limit:
            return
        self.last_adjust = {"at": self._clock(), "from": self.limit, "to": limit, "reason": reason}
        log.debug("worker concurrency %d -> %d (%s)", self.limit, limit, reason)
        self.limit = limit

    def _tick_soon(self) -> None:
        # Started by the first step (on the engine's loop) and again after `close` when the
        # engine is opened again.
        if self.adaptive is not None and self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(
                self._tick_loop(), name="durably-concurrency"
            )

    async def _tick_loop(self) -> None:
        assert self.adaptive is not None
        while True:
            await asyncio.sleep(self.adaptive.tick_ms / 1000.0)
            try:
                self.tick()
            except Exception:
                log.exception("worker concurrency: adjusting the limit failed")

    # ------------------------------------------------------------------ reporting

    def status(self) -> WorkerStatus:
        """What `worker_health` reports for this engine."""
        a = self.adaptive
        now = self._clock()
        last_minute = [ms for at, ms in self._recent if at > now - 60_000]
        p95 = None
        if last_minute:
            ordered = sorted(last_minute)
            p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        res = self._resources
        return WorkerStatus(
            runtime="python",
            concurrency=WorkerConcurrency(
                mode="adaptive" if a else "fixed",
                limit=self.limit,
                min=a.min if a else None,
                max=a.max if a else None,
            ),
            in_flight=self.in_flight,
            rss_bytes=res.rss_bytes,
            rss_limit_bytes=res.rss_limit_bytes,
            rss_pct=None if res.rss_pct is None else round(res.rss_pct, 1),
            cpu_pct=None if res.cpu_pct is None else round(res.cpu_pct, 1),
            throughput_per_min=float(len(last_minute)),
            p95_ms=None if p95 is None else round(p95, 1),
            last_adjust=self.last_adjust,
        )

    async def close(self) -> None:
        """Stop adjusting (the limit and the permits stay as they are)."""
        task, self._ticker = self._ticker, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass


def step_limiter(spec: ConcurrencySpec) -> StepLimiter | None:
    """The limiter `Engine(concurrency=spec)` asks for; None for no limit of its own."""
    if spec is None:
        return None
    if spec == "adaptive":
        return StepLimiter(AdaptiveConcurrency())
    assert isinstance(spec, int | AdaptiveConcurrency)
    return StepLimiter(spec)
