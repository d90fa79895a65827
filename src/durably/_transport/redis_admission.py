"""Fleet-wide admission to flow-control queues on Redis (`RedisAdmission`).

Every engine that points a `RedisAdmission` at one Redis server and key prefix counts the same
slots. The rules are those of `durably._core.admission`, applied exactly as the PostgreSQL
backend applies them, so a queue behaves the same on every backend.

- **One script admits a slot.** An acquire is one Lua script (loaded once, then run by
  EVALSHA): Redis runs a script alone, so the callers of every queue take turns and each one
  counts the previous caller's slot.
- **Keys** (`P` is the prefix, `Q` the queue name):
  - `P:adm:Q:state` hash: the rate window and its count, the arrival and service counters,
    and the settings last used to ask (a release needs them to tell who ranks first);
  - `P:adm:Q:slots` hash: holder (step id) -> `"<slot ttl ms>|<owning process>"`, and
    `P:adm:Q:sexpire` zset: holder -> expiry (epoch ms);
  - `P:adm:Q:waiters` zset: holder -> minus its priority; `P:adm:Q:wmeta` hash: holder ->
    `"<arrival>|<fairness key>"`; `P:adm:Q:wexpire` zset: holder -> when it loses its place;
  - `P:adm:Q:keyserved` zset: fairness key -> the service tick it was last served at (a
    sorted set, so keys served too long ago are dropped in one command);
  - `P:adm:where` hash: holder -> its queue, because a release or a renew names holders only.
- **No slot leaks when a process dies.** Each slot carries its own expiry, renewed by the
  process that holds it (`renew`, every third of the queue's `slot_ttl`, by the engine); a
  dead process's slots lapse `slot_ttl` after their last renewal and the next acquire on
  their queue drops them. Liveness is per slot, not per process, so a slot this process lost
  track of lapses too, as on the other backends.
- **A release wakes the next in line.** The release script frees the slots and, for every
  queue where it freed one, PUBLISHes `"<queue>\\n<holder>\\n…"` (the best waiters) on the
  channel `P:adm:freed`. Every `RedisAdmission` with a listener subscribes to it; a lost
  message costs latency only (every waiter asks again at its `retry_at`).

Times are the callers' clocks (epoch ms passed in), never the server's: every backend reads
the same clock as the engine's run leases, and tests can drive it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any

import redis.exceptions
from redis.asyncio import Redis

from durably._core.admission import (
    ADMITTED,
    KEY_MEMORY,
    MAX_WAIT,
    NOTIFY_AT_MOST,
    Admission,
    FreedListener,
    Queue,
    QueueStats,
    window_count,
)
from durably._core.bounds import PayloadRejectedError
from durably._core.log_context import durably_logger
from durably._transport.redis_bullmq import redis_client

log = durably_logger("durably.transport")

__all__ = ["RedisAdmission"]

# Lua numbers are doubles; "%d" writes an epoch-ms value as digits (tostring could write an
# exponent), and every value here is a whole number well below 2^53.
_HELPERS = """
local function s(x) return string.format('%d', x) end
"""

# KEYS: state, slots, sexpire, waiters, wmeta, wexpire, keyserved, where.
# ARGV: holder, owner, key, priority, now, concurrency (-1: none), rate limit (-1: none),
# rate period, retry, slot ttl, fair (1/0), lifo (1/0), queue name.
# Answers 0 (admitted) or the epoch ms to ask again at.
_ACQUIRE = (
    _HELPERS
    + """
local state, slots, sexp, waiters, wmeta, wexp, keyserved, where =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local holder, owner, key, queue = ARGV[1], ARGV[2], ARGV[3], ARGV[13]
local priority, now = tonumber(ARGV[4]), tonumber(ARGV[5])
local conc, rlimit, rperiod = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local retry, ttl = tonumber(ARGV[9]), tonumber(ARGV[10])
local fair, lifo = ARGV[11] == '1', ARGV[12] == '1'

local function forget(h)
  if redis.call('HGET', where, h) == queue then redis.call('HDEL', where, h) end
end
-- Lapsed slots (their holder stopped renewing) and waiters that stopped asking.
for _, h in ipairs(redis.call('ZRANGEBYSCORE', sexp, '-inf', s(now))) do
  redis.call('HDEL', slots, h)
  redis.call('ZREM', sexp, h)
  forget(h)
end
for _, h in ipairs(redis.call('ZRANGEBYSCORE', wexp, '-inf', s(now))) do
  redis.call('ZREM', waiters, h)
  redis.call('HDEL', wmeta, h)
  redis.call('ZREM', wexp, h)
  forget(h)
end
-- A holder that already holds a slot keeps it (a replayed turn asking again).
if redis.call('HEXISTS', slots, holder) == 1 then
  redis.call('HSET', slots, holder, s(ttl) .. '|' .. owner)
  redis.call('ZADD', sexp, s(now + ttl), holder)
  return 0
end

local st = redis.call('HMGET', state, 'window_start', 'window_count', 'arrivals', 'served')
local wstart, wcount = tonumber(st[1]) or 0, tonumber(st[2]) or 0
local arrivals, served = tonumber(st[3]) or 0, tonumber(st[4]) or 0
local window = 0
local rate_left = nil
if rlimit >= 0 then
  -- Windows only move forward: a caller whose clock reads earlier than the last one's
  -- counts in the current window.
  window = math.max(now - math.fmod(now, rperiod), wstart)
  if wstart ~= window then
    wstart = window
    wcount = 0
  end
  rate_left = rlimit - wcount
end
local free
if conc < 0 then free = 2147483647 else free = conc - redis.call('HLEN', slots) end
if rate_left ~= nil then free = math.min(free, rate_left) end

local meta = redis.call('HGET', wmeta, holder)
local known = meta ~= false
local arrival
if known then arrival = tonumber(string.match(meta, '^(%d+)|')) else arrival = arrivals + 1 end
local function served_of(k)
  if not fair then return 0 end
  local v = redis.call('ZSCORE', keyserved, k)
  if v then return tonumber(v) end
  return 0
end
local mine = served_of(key)
-- Waiters that rank before this caller: higher priority, then (fair) the key served least
-- recently, then arrival.
local ahead = redis.call('ZCOUNT', waiters, '-inf', '(' .. s(-priority))
if known then
  local old = tonumber(redis.call('ZSCORE', waiters, holder))
  if old < -priority then ahead = ahead - 1 end
end
for _, h in ipairs(redis.call('ZRANGEBYSCORE', waiters, s(-priority), s(-priority))) do
  if h ~= holder then
    local a, k = string.match(redis.call('HGET', wmeta, h), '^(%d+)|(.*)$')
    a = tonumber(a)
    local sv = served_of(k)
    if sv < mine then
      ahead = ahead + 1
    elseif sv == mine and ((lifo and a > arrival) or (not lifo and a < arrival)) then
      ahead = ahead + 1
    end
  end
end

redis.call('HSET', state, 'concurrency', s(conc), 'fair', fair and '1' or '0',
  'lifo', lifo and '1' or '0')
if free > 0 and ahead < free then
  redis.call('HSET', slots, holder, s(ttl) .. '|' .. owner)
  redis.call('ZADD', sexp, s(now + ttl), holder)
  redis.call('HSET', where, holder, queue)
  if known then
    redis.call('ZREM', waiters, holder)
    redis.call('HDEL', wmeta, holder)
    redis.call('ZREM', wexp, holder)
  end
  served = served + 1
  if fair then
    redis.call('ZADD', keyserved, s(served), key)
    redis.call('ZREMRANGEBYSCORE', keyserved, '-inf', '(' .. s(served - KEY_MEMORY))
  end
  if rate_left ~= nil then wcount = wcount + 1 end
  redis.call('HSET', state, 'window_start', s(wstart), 'window_count', s(wcount),
    'served', s(served))
  return 0
end

-- Turned away: ask again when a place could be free for this rank (capped), and keep the
-- place in line until two retry intervals after that.
local retry_at
if rate_left ~= nil and rate_left <= 0 then
  retry_at = window + rperiod * math.min(MAX_WAIT, 1 + math.floor(ahead / rlimit))
else
  local per = 1
  if conc >= 0 then per = conc elseif rlimit >= 0 then per = rlimit end
  per = math.max(per, 1)
  retry_at = now + retry * math.min(MAX_WAIT, 1 + math.floor(ahead / per))
end
if not known then
  arrivals = arrivals + 1
  arrival = arrivals
  redis.call('HSET', where, holder, queue)
end
redis.call('HSET', wmeta, holder, s(arrival) .. '|' .. key)
redis.call('ZADD', waiters, s(-priority), holder)
redis.call('ZADD', wexp, s(retry_at + 2 * retry), holder)
redis.call('HSET', state, 'window_start', s(wstart), 'window_count', s(wcount),
  'arrivals', s(arrivals))
return retry_at
""".replace("KEY_MEMORY", str(KEY_MEMORY)).replace("MAX_WAIT", str(MAX_WAIT))
)

# KEYS: where. ARGV: now, the queues' key prefix (`P:adm:`), channel, holders...
# Frees the holders' slots, forgets their places in line, and names each touched queue's best
# waiters on the channel. Answers how many live slots were freed.
_RELEASE = (
    _HELPERS
    + """
local where = KEYS[1]
local now, pfx, channel = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local freed, touched, total = {}, {}, 0
for i = 4, #ARGV do
  local h = ARGV[i]
  local q = redis.call('HGET', where, h)
  if q then
    redis.call('HDEL', where, h)
    local base = pfx .. q .. ':'
    redis.call('ZREM', base .. 'waiters', h)
    redis.call('HDEL', base .. 'wmeta', h)
    redis.call('ZREM', base .. 'wexpire', h)
    if redis.call('HDEL', base .. 'slots', h) == 1 then
      local exp = redis.call('ZSCORE', base .. 'sexpire', h)
      redis.call('ZREM', base .. 'sexpire', h)
      if exp and tonumber(exp) > now then
        if freed[q] == nil then
          freed[q] = 0
          table.insert(touched, q)
        end
        freed[q] = freed[q] + 1
        total = total + 1
      end
    end
  end
end
for _, q in ipairs(touched) do
  local base = pfx .. q .. ':'
  local st = redis.call('HMGET', base .. 'state', 'concurrency', 'fair', 'lifo')
  local conc = tonumber(st[1]) or -1
  local fair, lifo = st[2] == '1', st[3] == '1'
  local count = freed[q]
  if conc >= 0 then
    local live = redis.call('ZCOUNT', base .. 'sexpire', '(' .. s(now), '+inf')
    count = math.max(count, conc - live)
  end
  count = math.min(count, NOTIFY_AT_MOST)
  local line = {}
  local all = redis.call('ZRANGE', base .. 'waiters', 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    local h = all[i]
    local exp = redis.call('ZSCORE', base .. 'wexpire', h)
    if exp and tonumber(exp) > now then
      local a, k = string.match(redis.call('HGET', base .. 'wmeta', h), '^(%d+)|(.*)$')
      local sv = 0
      if fair then
        local v = redis.call('ZSCORE', base .. 'keyserved', k)
        if v then sv = tonumber(v) end
      end
      a = tonumber(a)
      if lifo then a = -a end
      table.insert(line, {tonumber(all[i + 1]), sv, a, h})
    end
  end
  table.sort(line, function(x, y)
    if x[1] ~= y[1] then return x[1] < y[1] end
    if x[2] ~= y[2] then return x[2] < y[2] end
    return x[3] < y[3]
  end)
  local payload = q
  for i = 1, math.min(count, #line) do payload = payload .. '\\n' .. line[i][4] end
  redis.call('PUBLISH', channel, payload)
end
return total
""".replace("NOTIFY_AT_MOST", str(NOTIFY_AT_MOST))
)

# KEYS: where. ARGV: now, the queues' key prefix, owner, holders...
# Extends the owner's live slots by their ttl; the holders that still hold one.
_RENEW = (
    _HELPERS
    + """
local where = KEYS[1]
local now, pfx, owner = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local held = {}
for i = 4, #ARGV do
  local h = ARGV[i]
  local q = redis.call('HGET', where, h)
  if q then
    local base = pfx .. q .. ':'
    local v = redis.call('HGET', base .. 'slots', h)
    if v then
      local ttl, o = string.match(v, '^(%d+)|(.*)$')
      local exp = redis.call('ZSCORE', base .. 'sexpire', h)
      if o == owner and exp and tonumber(exp) > now then
        redis.call('ZADD', base .. 'sexpire', s(now + tonumber(ttl)), h)
        table.insert(held, h)
      end
    end
  end
end
return held
"""
)


def _wall_ms() -> int:
    return int(time.time() * 1000)


class RedisAdmission:
    """The Redis admission backend (see the module docstring). One per process (engine):
    `owner` names the process whose slots `renew` keeps alive.

    `connection` is a Redis URL or a `redis.asyncio.Redis` client (which the caller keeps
    and closes; it must decode responses). `prefix` is the key prefix shared by the fleet —
    the Redis transport's prefix when both share a server. `clock` gives epoch ms (the
    engine's clock; wall time by default)."""

    def __init__(
        self,
        connection: str | Redis,
        *,
        prefix: str = "durable",
        owner: str | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        if isinstance(connection, str):
            self._client = redis_client(connection, patient=False)
            self._owns_client = True
        else:
            self._client = connection
            self._owns_client = False
        self._base = f"{prefix}:adm:"
        self._where = f"{prefix}:adm:where"
        self.channel = f"{prefix}:adm:freed"
        self._owner = owner or uuid.uuid4().hex
        self._clock = clock or _wall_ms
        self._acquire = self._client.register_script(_ACQUIRE)
        self._release = self._client.register_script(_RELEASE)
        self._renew = self._client.register_script(_RENEW)
        self._listeners: list[FreedListener] = []
        self._listening: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def owner(self) -> str:
        return self._owner

    def _keys(self, queue: str) -> list[str]:
        base = f"{self._base}{queue}:"
        names = ("state", "slots", "sexpire", "waiters", "wmeta", "wexpire", "keyserved")
        return [base + name for name in names] + [self._where]

    async def acquire(self, queue: Queue, holder: str, *, key: str, priority: int = 0) -> Admission:
        self._listen_soon()
        args: list[str | int] = [
            holder,
            self._owner,
            key,
            priority,
            self._clock(),
            -1 if queue.concurrency is None else queue.concurrency,
            -1 if queue.rate_limit is None else queue.rate_limit,
            queue.rate_period_ms or 0,
            queue.retry_ms,
            queue.slot_ttl_ms,
            1 if queue.fair else 0,
            1 if queue.lifo else 0,
            queue.name,
        ]
        try:
            answer: Any = await self._acquire(keys=self._keys(queue.name), args=args)
        except (UnicodeError, redis.exceptions.DataError) as exc:
            # The client could not encode the arguments (a lone surrogate in the fairness
            # key, say): asking again would fail the same way, so this is not an outage.
            raise PayloadRejectedError(
                f"flow-control admission to queue {queue.name!r}",
                f"the Redis client cannot send a value ({exc})",
            ) from exc
        retry_at = int(answer)
        return ADMITTED if retry_at == 0 else Admission(False, retry_at)

    async def release(self, *holders: str) -> int:
        if not holders:
            return 0
        args: list[str | int] = [self._clock(), self._base, self.channel, *holders]
        answer: Any = await self._release(keys=[self._where], args=args)
        return int(answer)

    async def renew(self, holders: Collection[str]) -> set[str]:
        if not holders:
            return set()
        args: list[str | int] = [self._clock(), self._base, self._owner, *holders]
        answer: Any = await self._renew(keys=[self._where], args=args)
        return {h.decode() if isinstance(h, bytes) else str(h) for h in answer}

    def on_freed(self, listener: FreedListener) -> None:
        self._listeners.append(listener)

    async def stats(self, queues: Sequence[Queue]) -> list[QueueStats]:
        """Three reads per queue in one pipeline (no script: a count may be a release
        behind; it changes nothing)."""
        if not queues:
            return []
        now = self._clock()
        pipe = self._client.pipeline(transaction=False)
        for queue in queues:
            base = f"{self._base}{queue.name}:"
            pipe.zcount(base + "sexpire", f"({now}", "+inf")
            pipe.zcount(base + "wexpire", f"({now}", "+inf")
            pipe.hmget(base + "state", ["window_start", "window_count", "served"])
        answers: list[Any] = await pipe.execute()
        out: list[QueueStats] = []
        for i, queue in enumerate(queues):
            held, waiting, state = answers[3 * i : 3 * i + 3]
            start, count, served = (int(v) if v is not None else 0 for v in state)
            out.append(
                QueueStats(
                    queue.name,
                    in_flight=int(held),
                    waiting=int(waiting),
                    window_count=window_count(queue, now, start, count),
                    admitted=served,
                )
            )
        return out

    def _listen_soon(self) -> None:
        """Subscribe once there is someone to tell (started by the first acquire, in the
        background: an acquire never waits for it)."""
        if self._listeners and self._listening is None and not self._closed:
            self._listening = asyncio.get_running_loop().create_task(self._listen())

    async def _listen(self) -> None:
        pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        try:
            while not self._closed:
                try:
                    if not pubsub.subscribed:
                        await pubsub.subscribe(self.channel)
                    message = await pubsub.get_message(timeout=1.0)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # The subscription comes back with the server; meanwhile waiters ask
                    # again at their retry_at.
                    log.warning("flow control: lost the Redis freed-slot channel (%s)", exc)
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                    await asyncio.sleep(1.0)
                    continue
                if message is not None and message.get("type") == "message":
                    self._on_message(message["data"])
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]

    def _on_message(self, data: str | bytes) -> None:
        text = data.decode() if isinstance(data, bytes) else data
        queue, *holders = text.split("\n")
        for listener in tuple(self._listeners):
            listener(queue, holders)

    async def close(self) -> None:
        self._closed = True
        task, self._listening = self._listening, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if self._owns_client:
            await self._client.aclose()
