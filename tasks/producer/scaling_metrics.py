"""The pools' scaling signal as Prometheus gauges, read at scrape (``tasks.producer.scaling``).

Served by the gateway's ``/metrics`` (always up, so a pool at zero replicas still has a signal
there) and by every worker's: the figures are the farm's, the same wherever they are read, so
aggregate with ``max by (pool)``, never ``sum``. Read from Redis when Prometheus scrapes, with
short timeouts; a Redis that does not answer leaves the gauges out of that scrape (logged once at
DEBUG) rather than failing it. Imports prometheus-client: only the gateway and the worker load it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import redis
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mediafarm.config.settings import get_settings
from mediafarm.tasks.producer import scaling
from mediafarm.tasks.producer.admission import queue_depths

log = logging.getLogger("mediafarm.metrics")
STATES = ("queued", "reserved", "running")


class PoolScaling(Collector):
    """``mediafarm_pool_jobs{pool,state}``, ``mediafarm_pool_slots{pool}``,
    ``mediafarm_pool_load{pool}`` and ``mediafarm_pool_wanted{pool}`` of every declared pool and every pool a live worker names.
    ``backend``: a redis-py client of the result backend; ``depths``: queue names -> jobs waiting."""

    def __init__(self, backend: Any, depths: Callable[[Sequence[str]], Mapping[str, int]]) -> None:
        self.backend, self.depths = backend, depths

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("mediafarm_pool_jobs", "", labels=["pool", "state"])
        yield GaugeMetricFamily("mediafarm_pool_slots", "", labels=["pool"])
        yield GaugeMetricFamily("mediafarm_pool_load", "", labels=["pool"])
        yield GaugeMetricFamily("mediafarm_pool_wanted", "", labels=["pool"])

    def collect(self) -> Iterator[Metric]:
        try:
            signals = scaling.read_signals(self.backend, self.depths)
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail for one source
            log.debug("pools' scaling signal unreadable: %s", exc)
            return
        jobs = GaugeMetricFamily(
            "mediafarm_pool_jobs", "A pool's jobs: queued (every priority list of its queues), reserved by its "
            "workers and not started, running on them", labels=["pool", "state"],
        )  # fmt: skip
        slots = GaugeMetricFamily(
            "mediafarm_pool_slots", "Slots of a pool's live workers that take jobs (0 at zero replicas)",
            labels=["pool"],
        )  # fmt: skip
        load = GaugeMetricFamily(
            "mediafarm_pool_load", "A pool's jobs (queued + reserved + running) over one replica's slots: the "
            "replicas its work fills", labels=["pool"],
        )  # fmt: skip
        wanted = GaugeMetricFamily(
            "mediafarm_pool_wanted", "Jobs submitted within FARM_WAKE_WINDOW that a pool would have started on a "
            "better rung had it had a live worker: while not 0 at zero replicas, its load reads at least 1",
            labels=["pool"],
        )  # fmt: skip
        for name, signal in signals.items():
            for state in STATES:
                jobs.add_metric([name, state], float(getattr(signal, state)))
            slots.add_metric([name], float(signal.slots))
            load.add_metric([name], signal.load)
            wanted.add_metric([name], float(signal.wanted))
        yield jobs
        yield slots
        yield load
        yield wanted


def for_this_farm() -> PoolScaling:
    """The collector on this farm's Redis (``FARM_RESULT_BACKEND`` for the records, the broker for
    the depths: its lists on Redis, a passive declare per queue on RabbitMQ)."""
    from mediafarm.tasks.app import app  # the farm's own, for RabbitMQ's passive declares

    settings = get_settings()
    backend = redis.Redis.from_url(settings.backend_url, socket_timeout=1, socket_connect_timeout=1)
    if settings.broker_is_rabbitmq:
        return PoolScaling(backend, lambda queues: queue_depths(queues, app))
    broker = redis.Redis.from_url(settings.broker_url, socket_timeout=1, socket_connect_timeout=1)
    return PoolScaling(backend, lambda queues: scaling.redis_depths(broker, queues))
