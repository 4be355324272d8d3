"""Admission control: refuse a job with ``Overloaded`` before anything of it is written, when its
family has enough waiting or a pool that would run it is short of memory.

``client.submit`` and ``client.send_plan`` call :func:`admit` (so do the gateway and every other
producer, through them). Three checks, each with limits from ``config.admission``:

- **depth**: the jobs waiting in the family's queues (every priority list, its GPU affinity queues
  and the queue the job is sent to) against ``max_queued``. Read from the broker: one pipelined
  ``LLEN`` round trip on Redis, a passive ``queue_declare`` per queue on RabbitMQ; one reading is
  reused for ``depth_cache`` seconds in a process, counting the jobs this process takes meanwhile
  (under a lock), so the threads of one producer cannot overshoot the limit between two readings;
  several producer processes can, by at most what they send within ``depth_cache``.
- **tenant**: the jobs one tenant (a gateway token) submitted to the family that have not started,
  against ``max_queued_per_tenant`` (a sorted set per tenant and family, pruned of started and
  ended jobs atomically as it is read).
- **pressure**: each worker publishes its memory reading and the queues it consumes
  (``workers.pressure``, every second, with a TTL); a reading of a worker that consumes the job's
  queue below its pool's thresholds refuses the job (:func:`queue_under_pressure`; a pool's own
  state for its workers: :func:`pool_under_pressure`). The readings too are reused for
  ``depth_cache`` seconds in a process, 1 s at most. A family whose ladder steps down under pressure
  (``config.ladder_policy``) is not refused: its jobs start on a lighter rung instead.

A refusal writes only its count (``keys.refusals``, for the metrics); a job already accepted (an
idempotent re-submit of its id) is never refused, and nothing accepted is ever dropped. A limit
that cannot be read (the broker restarting) is not applied: the job's send waits for the broker as
before, rather than every blip becoming a refusal.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mediafarm.config.admission import Admission, PoolAdmission, get_admission
from mediafarm.config.pools import Pool, expand_queues, get_pools, gpu_queue, pool_queue
from mediafarm.config.priorities import redis_lists
from mediafarm.config.settings import get_settings
from mediafarm.tasks import registry
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.errors import Overloaded
from mediafarm.tasks.wire.family import FamilySpec

log = logging.getLogger("mediafarm.admission")
# Refusal reasons, the field names of ``keys.refusals``.
DEPTH, TENANT, PRESSURE = "depth", "tenant", "pressure"
# A tenant's job not started after this long no longer counts against it (a job lost outside the farm).
TENANT_HORIZON_S = 24 * 3600
# A pressure reading older than this is ignored (the worker writes one every second; a stopped
# worker's reading must not refuse work for ever). The key's own TTL is the same.
PRESSURE_STALE_S = 5.0
# The longest a producer process reuses the pools' memory readings (:class:`_Readings`), whatever
# ``depth_cache`` says: a worker publishes one a second.
READINGS_REUSE_MAX_S = 1.0

# Prune the tenant's set of jobs that started (their history exists) or ended (their result does),
# then refuse (return the count) or take the job (return -1). Atomic: racing submits of one tenant
# cannot both take the last place.
_TENANT_SCRIPT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[2]) - tonumber(ARGV[3]))
local waiting = 0
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if redis.call('EXISTS', ARGV[5] .. id, ARGV[6] .. id) > 0 then
    redis.call('ZREM', KEYS[1], id)
  elseif id ~= ARGV[4] then
    waiting = waiting + 1
  end
end
if waiting >= tonumber(ARGV[1]) then return waiting end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return -1
"""


@dataclass(frozen=True)
class Reading:
    """One worker's memory reading of its pool (``workers.pressure`` writes it as JSON).

    Attributes:
        worker: The worker's node name.
        at: Unix time of the reading.
        available_mb: Memory available to the pool: the host's, or the cgroup's limit minus its
            usage (inactive file pages counted free), whichever is smaller.
        total_mb: The host's memory, or the cgroup's limit when smaller.
        gpus: ``{"<index>": [free_mb, total_mb]}`` of the pool's GPUs (NVML), empty without one.
        queues: The queues the worker consumes (its pool's, or what ``farm worker --queues`` gave
            it); empty: not said, the pool's declared queues are taken instead.
    """

    worker: str
    at: float
    available_mb: float
    total_mb: float
    gpus: Mapping[str, Sequence[float]]
    queues: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, raw: bytes | str) -> Reading:
        data = json.loads(raw)
        return cls(str(data["worker"]), float(data["at"]), float(data["available_mb"]), float(data["total_mb"]),
                   dict(data.get("gpus") or {}), tuple(data.get("queues") or ()))  # fmt: skip

    def to_json(self) -> str:
        return json.dumps({"worker": self.worker, "at": self.at, "available_mb": round(self.available_mb, 1),
                           "total_mb": round(self.total_mb, 1), "gpus": dict(self.gpus),
                           "queues": list(self.queues)})  # fmt: skip

    def pressure(self, limits: PoolAdmission) -> str | None:
        """Why this reading is under the pool's thresholds, or None."""
        floor = max(limits.min_available_mb, limits.min_available_fraction * self.total_mb)
        if floor and self.available_mb < floor:
            return (f"{self.available_mb:.0f} MiB of {self.total_mb:.0f} MiB memory available on {self.worker}, "
                    f"below {floor:.0f} MiB")  # fmt: skip
        if limits.min_gpu_free_mb:
            for index, (free, total) in sorted(self.gpus.items()):
                if free < limits.min_gpu_free_mb:
                    return (f"GPU {index} of {self.worker} has {free:.0f} MiB free of {total:.0f} MiB, "
                            f"below {limits.min_gpu_free_mb:.0f} MiB")  # fmt: skip
        return None


def publish_reading(client: Any, pool: str, reading: Reading) -> None:
    """Store one worker's reading of ``pool`` (a field per worker of the pool's hash, which expires
    when no worker of the pool has written for :data:`PRESSURE_STALE_S`)."""
    pipe = client.pipeline(transaction=False)
    pipe.hset(keys.pressure(pool), reading.worker, reading.to_json())
    pipe.pexpire(keys.pressure(pool), int(PRESSURE_STALE_S * 1000))
    pipe.execute()


def readings(client: Any, pool: str, now: float | None = None) -> list[Reading]:
    """The fresh readings of ``pool``'s workers (stale and unreadable ones left out)."""
    return _fresh(client.hvals(keys.pressure(pool)), time.time() if now is None else now)


def _fresh(raws: Iterable[bytes], now: float) -> list[Reading]:
    out = []
    for raw in raws:
        try:
            reading = Reading.from_json(raw)
        except (ValueError, KeyError, TypeError):
            continue
        if now - reading.at <= PRESSURE_STALE_S:
            out.append(reading)
    return out


def pool_under_pressure(pool: str, client: Any) -> str | None:
    """Why ``pool`` is under memory pressure now (its name and the reading in words), or None.

    The pool is under pressure when any of its workers' fresh readings is below the pool's
    thresholds (``[admission.pools.<pool>]``): the farm cannot choose which of a pool's workers
    takes the next job, so one short of memory is enough. No fresh reading (no worker running, or
    one too old to publish): no pressure known, None. ``client``: a Redis client of the result
    backend.
    """
    limits = get_admission().pool(pool)
    for reading in readings(client, pool):
        why = reading.pressure(limits)
        if why is not None:
            return f"pool {pool!r} is under memory pressure: {why}"
    return None


def queue_under_pressure(
    queue: str, pools: Mapping[str, Pool], client: Any, reuse_s: float = 0.0
) -> tuple[str, str] | None:
    """(pool, why) when a worker that consumes ``queue`` is under its pool's memory thresholds, or
    None. Every declared pool's readings in one round trip, reused for ``reuse_s`` seconds by this
    process (:class:`_Readings`); a worker that consumes ``queue`` is one whose reading lists it
    (its pool's queues, or ``farm worker --queues``), else one of a pool that declares it."""
    names = tuple(pools)
    admission, now = get_admission(), time.time()
    family_queues = None
    for name, raws in zip(names, _readings.of(client, names, reuse_s), strict=True):
        for reading in _fresh(raws, now):
            if reading.queues:
                serves = queue in reading.queues
            else:
                family_queues = registry.default_queues() if family_queues is None else family_queues
                serves = queue in expand_queues(pools[name].queues, family_queues)
            why = reading.pressure(admission.pool(name)) if serves else None
            if why is not None:
                return name, f"pool {name!r} is under memory pressure: {why}"
    return None


def family_queues(spec: FamilySpec, queue: str | None, pools: Mapping[str, Pool]) -> tuple[str, ...]:
    """The queues whose waiting jobs count as ``spec``'s: the one the job goes to, the family
    queue, every pool's own queue of it (``tasks.producer.routing``) and its GPU affinity queue on every
    pool with GPUs."""
    names = [queue or spec.queue, spec.queue]
    for pool in pools.values():
        names += [pool_queue(pool.name, spec.queue), *(gpu_queue(g, spec.queue) for g in pool.gpus)]
    return tuple(dict.fromkeys(names))


class _Readings:
    """The pools' memory readings as stored (a list of raw readings per pool), reused for a while
    by every thread of a process. A worker publishes its reading once a second
    (``workers.pressure``), so a look a quarter of a second old is about as fresh as any, and each
    submit no longer pays a round trip for it (issue #34). Never reused for longer than
    :data:`READINGS_REUSE_MAX_S`, whatever ``depth_cache`` says: pressure must be seen within a
    reading or so."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[tuple[tuple[Any, ...], tuple[str, ...]], tuple[float, list[list[bytes]]]] = {}

    def of(self, client: Any, pools: tuple[str, ...], reuse_s: float) -> list[list[bytes]]:
        """The readings of ``pools`` through ``client``, read again when older than ``reuse_s``
        (at most :data:`READINGS_REUSE_MAX_S`; 0: always)."""
        reuse_s = min(reuse_s, READINGS_REUSE_MAX_S)
        # By the server the client talks to: Celery keeps a backend, so a client, per thread.
        key = (_server_of(client), pools)
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None and now - cached[0] < reuse_s:
            return cached[1]
        pipe = client.pipeline(transaction=False)
        for name in pools:
            pipe.hvals(keys.pressure(name))
        raws = pipe.execute()
        if reuse_s > 0:
            with self._lock:
                for old in [k for k, (at, _) in self._cache.items() if now - at >= READINGS_REUSE_MAX_S]:
                    del self._cache[old]
                self._cache[key] = (now, raws)
        return raws


def _server_of(client: Any) -> tuple[Any, ...]:
    """Which Redis server and database ``client`` reads (its pool's connection settings)."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None) or {}
    return tuple(kwargs.get(k) for k in ("host", "port", "path", "db", "username"))


_readings = _Readings()


class _Depths:
    """Queue depths read from the broker, reused for ``depth_cache`` seconds per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, ...], tuple[float, int]] = {}
        self._pid = os.getpid()
        self._redis: Any = None

    def _broker_redis(self) -> Any:
        if self._redis is None or self._pid != os.getpid():  # a client must not cross a fork
            import redis

            self._redis, self._pid = redis.Redis.from_url(get_settings().broker_url), os.getpid()
        return self._redis

    def take(self, queues: tuple[str, ...], limit: int, ttl: float, app: Any) -> int | None:
        """Count one more job on ``queues`` unless ``limit`` are waiting there: None when taken,
        else the depth that refuses it. Under one lock, so that the producer threads of one process
        (the gateway's) cannot all take the last place between two readings."""
        with self._lock:
            now = time.monotonic()
            cached = self._cache.get(queues)
            if cached is None or now - cached[0] >= ttl:
                cached = (now, self._read(queues, app))
            if cached[1] >= limit:
                self._cache[queues] = cached
                return cached[1]
            self._cache[queues] = (cached[0], cached[1] + 1)
            return None

    def give_back(self, queues: tuple[str, ...]) -> None:
        """A job counted by :meth:`take` that was not sent after all."""
        with self._lock:
            cached = self._cache.get(queues)
            if cached is not None:
                self._cache[queues] = (cached[0], max(0, cached[1] - 1))

    def _read(self, queues: tuple[str, ...], app: Any) -> int:
        return sum(self.each(queues, app).values())

    def each(self, queues: Sequence[str], app: Any) -> dict[str, int]:
        """Queue -> the jobs waiting in it (every priority list), read now in one round trip on Redis."""
        return self._amqp(queues, app) if get_settings().broker_is_rabbitmq else self._redis_depth(queues)

    def _redis_depth(self, queues: Sequence[str]) -> dict[str, int]:
        pipe = self._broker_redis().pipeline(transaction=False)
        for queue in queues:
            for name in redis_lists(queue):
                pipe.llen(name)
        lengths = iter(pipe.execute())
        return {queue: sum(int(next(lengths)) for _ in redis_lists(queue)) for queue in queues}

    def _amqp(self, queues: Sequence[str], app: Any) -> dict[str, int]:
        from kombu.exceptions import OperationalError

        out = {}
        with app.pool.acquire(block=True) as conn:
            try:
                for queue in queues:
                    out[queue] = 0
                    channel = conn.channel()
                    try:
                        out[queue] = channel.queue_declare(queue=queue, passive=True).message_count
                    except conn.channel_errors:
                        pass  # not declared yet (404): nothing waits on it
                    finally:
                        try:
                            channel.close()
                        except Exception:  # a channel the 404 closed
                            pass
            except conn.connection_errors as exc:  # py-amqp's own (CONNECTION_FORCED ...) are no OSError
                raise OperationalError(f"RabbitMQ: {exc}") from exc
        return out


_depths = _Depths()


def queue_depths(queues: Sequence[str], app: Any) -> dict[str, int]:
    """Queue -> the jobs waiting in it now (``tasks.producer.routing`` compares pools' queues by it)."""
    return _depths.each(queues, app)


@dataclass(frozen=True)
class Admitted:
    """What :func:`admit` took: give it back with :meth:`release` if the job is not sent after all."""

    tenant_keys: tuple[str, ...] = ()
    job_id: str = ""
    queue_sets: tuple[tuple[str, ...], ...] = ()

    def release(self, client: Any) -> None:
        """The jobs were not sent after all: give their places back."""
        for queues in self.queue_sets:
            _depths.give_back(queues)
        for key in self.tenant_keys:
            client.zrem(key, self.job_id)


def _refuse(client: Any, family: str, reason: str, message: str, retry_after: float) -> Overloaded:
    try:
        client.hincrby(keys.refusals(family), reason, 1)
    except Exception:  # the count is for the metrics; the refusal stands without it
        pass
    return Overloaded(message, retry_after=retry_after, family=family, reason=reason)


def away_errors() -> tuple[type[BaseException], ...]:
    """What a read of the broker or the result backend raises while it is away (a restart, a cut)."""
    from kombu.exceptions import OperationalError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    return (RedisConnectionError, RedisTimeoutError, OperationalError, OSError)


_last_warning = [0.0]


def _unread(what: str, exc: BaseException) -> None:
    """A limit that could not be read is not applied: the job is taken, and its send waits for the
    broker as it always did (``task_publish_retry_policy``: a restart of up to a minute). Refusing
    instead would turn every broker blip into refusals; a warning at most every 10 s says so."""
    now = time.monotonic()
    if now - _last_warning[0] >= 10:
        _last_warning[0] = now
        log.warning("admission control could not read %s (%s); jobs are taken without that check", what, exc)


def _steps_down(spec: FamilySpec, ladder_name: str | None) -> bool:
    """Does the ladder the job will run (its family's, or the one its ladder field names) step down
    under pressure instead of being refused? The worker reads the same policy (``tasks.runtime.base``)."""
    from mediafarm.config.ladder_policy import ladder_policy
    from mediafarm.tasks.wire.errors import InvalidRequest

    try:
        ladder = registry.ladder_for(spec, ladder_name)
    except InvalidRequest:  # the worker rejects the job; pressure is judged as for its family
        ladder = registry.ladder_for(spec)
    return ladder_policy(ladder.identity).step_down_under_pressure


def admit(
    jobs: Iterable[tuple[FamilySpec, str | None] | tuple[FamilySpec, str | None, str | None]],
    *,
    job_id: str,
    tenant: str | None = None,
    app: Any,
    admission: Admission | None = None,
) -> Admitted:
    """Take the jobs, or raise :class:`Overloaded` naming the first limit they pass.

    ``jobs``: (family, queue override[, the ladder its request names]) of each job sent together
    (one for ``submit``, every part and the fan-in of a plan); ``job_id``: the id the tenant's
    place is held under (a plan's fan-in); ``app``: the Celery app (its broker and result backend).
    """
    client = app.backend.client
    admission = admission or get_admission()
    if not admission.enabled:
        return Admitted()
    pools = get_pools()
    named = [(job[0], job[1], job[2] if len(job) > 2 else None) for job in jobs]
    away = away_errors()
    for spec, queue, ladder_name in named:
        if not _steps_down(spec, ladder_name):
            try:
                pressed = queue_under_pressure(queue or spec.queue, pools, client, admission.depth_cache)
            except away as exc:
                _unread("the workers' memory readings", exc)
                pressed = None
            if pressed is not None:
                pool, why = pressed
                retry = admission.pool(pool).pressure_retry_after
                raise _refuse(client, spec.name, PRESSURE,
                              f"{spec.name}: {why}; try again in {retry:g} s", retry)  # fmt: skip
    jobs = list({(spec.name, queue): (spec, queue) for spec, queue, _ in named}.values())
    queue_sets: list[tuple[str, ...]] = []
    for spec, queue in jobs:
        limits = admission.family(spec.name)
        if not limits.max_queued:
            continue
        queues = family_queues(spec, queue, pools)
        try:
            depth = _depths.take(queues, limits.max_queued, admission.depth_cache, app)
        except away as exc:
            _unread(f"the depth of {', '.join(queues)}", exc)
            continue
        if depth is not None:
            Admitted(queue_sets=tuple(queue_sets)).release(client)
            raise _refuse(client, spec.name, DEPTH,
                          f"{spec.name}: {depth} jobs are waiting, the limit is {limits.max_queued}; "
                          f"try again in {limits.retry_after:g} s", limits.retry_after)  # fmt: skip
        queue_sets.append(queues)
    taken: list[str] = []
    if tenant:
        meta_prefix = app.backend.task_keyprefix.decode()  # "celery-task-meta-"
        for spec, _ in jobs:
            limit = admission.family(spec.name).max_queued_per_tenant
            if not limit:
                continue
            key = keys.tenant_jobs(spec.name, tenant)
            try:
                waiting = client.eval(_TENANT_SCRIPT, 1, key, limit, time.time(), TENANT_HORIZON_S, job_id,
                                      keys.history(""), meta_prefix)  # fmt: skip
            except away as exc:
                _unread(f"the jobs of tenant {tenant!r}", exc)
                continue
            if int(waiting) >= 0:
                Admitted(tuple(taken), job_id, tuple(queue_sets)).release(client)
                retry = admission.family(spec.name).retry_after
                raise _refuse(client, spec.name, TENANT,
                              f"{spec.name}: this caller has {waiting} jobs waiting, the limit is {limit}; "
                              f"try again in {retry:g} s", retry)  # fmt: skip
            taken.append(key)
    return Admitted(tuple(taken), job_id, tuple(queue_sets))
