"""Metrics read at scrape time, not counted: queue depths, breaker states, admission refusals, GPU
memory (NVML) and the GPU children's allocator figures.

Each is a Prometheus custom collector on the worker's main process (``describe`` names what it
serves, without reading anything): it asks Redis (or NVML) when Prometheus scrapes, with short timeouts, and a source that does not answer leaves its metrics out
of that scrape (logged once at DEBUG) instead of failing the whole scrape. What they read is
shared by the whole farm (a queue's depth is the same for every worker consuming it): aggregate
with ``max by (queue)``, not ``sum``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mediafarm.config.priorities import redis_lists
from mediafarm.tasks.wire import keys
from mediafarm.workers import nvml

log = logging.getLogger("mediafarm.metrics")
class QueueDepth(Collector):
    """``mediafarm_queue_depth{queue}``: messages waiting in each queue this worker consumes
    (Redis: LLEN of the queue's priority lists, one round trip; RabbitMQ: a passive declare)."""

    def __init__(self, app: Any, queues: Callable[[], Sequence[str]]) -> None:
        self.app, self.queues = app, queues
        self._redis: Any = None

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("mediafarm_queue_depth", "", labels=["queue"])

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "mediafarm_queue_depth", "Messages waiting in the queue (read at scrape)", labels=["queue"]
        )
        try:
            for queue, n in self._depths(list(self.queues())):
                depth.add_metric([queue], n)
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail for one source
            log.debug("queue depth unreadable: %s", exc)
            return
        yield depth

    def _depths(self, queues: list[str]) -> Iterable[tuple[str, int]]:
        url = self.app.conf.broker_url or ""
        if url.startswith(("redis://", "rediss://", "unix://")):
            if self._redis is None:
                import redis

                self._redis = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
            lists = [redis_lists(q) for q in queues]
            pipe = self._redis.pipeline(transaction=False)
            for names in lists:
                for name in names:
                    pipe.llen(name)
            counts = iter(pipe.execute())
            return [(q, sum(next(counts) for _ in names)) for q, names in zip(queues, lists, strict=True)]
        out = []
        with self.app.connection_for_read() as conn:
            channel = conn.default_channel
            for q in queues:
                out.append((q, int(channel.queue_declare(queue=q, passive=True).message_count)))
        return out


class FarmState(Collector):
    """What the farm keeps in Redis about one pool and the families: the pool's rung circuit
    breakers (``tasks.runtime.breaker``, ``keys.breakers``) and the admission refusals of each family
    (``tasks.producer.admission``, ``keys.refusals``), read at scrape in one round trip."""

    def __init__(self, client: Any, pool: str, families: Callable[[], Sequence[str]]) -> None:
        self.client, self.pool, self.families = client, pool, families

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("mediafarm_breaker_state", "", labels=["pool", "ladder", "rung", "state"])
        yield GaugeMetricFamily("mediafarm_breaker_openings", "", labels=["pool", "ladder", "rung"])
        yield CounterMetricFamily("mediafarm_admission_refusals", "", labels=["family", "reason"])

    def collect(self) -> Iterator[Metric]:
        names = list(self.families())
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.hgetall(keys.breakers(self.pool))
            for name in names:
                pipe.hgetall(keys.refusals(name))
            breakers, *refusals = pipe.execute()
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail for one source
            log.debug("breakers and refusals unreadable: %s", exc)
            return
        yield from self._breakers(breakers)
        refused = CounterMetricFamily(
            "mediafarm_admission_refusals", "Submits refused by admission control (Overloaded), by family and reason",
            labels=["family", "reason"],
        )  # fmt: skip
        for name, counts in zip(names, refusals, strict=True):
            for reason, count in counts.items():
                refused.add_metric([name, _text(reason)], float(count))
        yield refused

    def _breakers(self, raw: dict[Any, Any]) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "mediafarm_breaker_state",
            "1 for a rung breaker's state on the pool (open or half_open; a closed breaker is absent)",
            labels=["pool", "ladder", "rung", "state"],
        )  # fmt: skip
        opened = GaugeMetricFamily(
            "mediafarm_breaker_openings", "Times a rung's breaker opened since it last closed (absent when closed)",
            labels=["pool", "ladder", "rung"],
        )  # fmt: skip
        for field, value in raw.items():
            ladder, _, rung = _text(field).partition("/")
            try:
                data = json.loads(value)
            except ValueError:
                continue
            state.add_metric([self.pool, ladder, rung, str(data.get("state", "open"))], 1)
            opened.add_metric([self.pool, ladder, rung], float(data.get("opened") or 1))
        yield state
        yield opened


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuMemory(Collector):
    """``mediafarm_gpu_memory_{used,total}_bytes{gpu}`` from NVML for the GPUs this pool uses,
    where the NVIDIA driver and ``nvidia-ml-py`` are present; nothing otherwise. NVML reads the
    driver, not CUDA: the main process stays without a CUDA context."""

    def __init__(self, gpus: Sequence[int]) -> None:
        self.gpus = tuple(gpus)
        self._nvml: Any = nvml.nvml() if self.gpus else None

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("mediafarm_gpu_memory_used_bytes", "", labels=["gpu"])
        yield GaugeMetricFamily("mediafarm_gpu_memory_total_bytes", "", labels=["gpu"])

    def collect(self) -> Iterator[Metric]:
        if self._nvml is None:
            return
        used = GaugeMetricFamily("mediafarm_gpu_memory_used_bytes", "GPU memory in use (NVML)", labels=["gpu"])
        total = GaugeMetricFamily("mediafarm_gpu_memory_total_bytes", "GPU memory (NVML)", labels=["gpu"])
        for gpu in self.gpus:
            try:
                info = nvml.memory(gpu)
            except Exception as exc:  # noqa: BLE001
                log.debug("NVML: GPU %s unreadable: %s", gpu, exc)
                continue
            used.add_metric([str(gpu)], float(info.used))
            total.add_metric([str(gpu)], float(info.total))
        yield used
        yield total


class GpuChildren(Collector):
    """The CUDA caching allocator of each live GPU child (``workers.gpu_hygiene``): reserved bytes
    and the fragmentation index, as the child measured them after its last job."""

    def __init__(self, client: Any, worker: Callable[[], str], pool: str) -> None:
        self.client, self.worker, self.pool = client, worker, pool

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("mediafarm_gpu_allocator_fragmentation", "", labels=["pool", "pid", "device"])
        yield GaugeMetricFamily("mediafarm_gpu_allocator_reserved_bytes", "", labels=["pool", "pid", "device"])

    def collect(self) -> Iterator[Metric]:
        from mediafarm.workers.gpu_hygiene import read_children

        frag = GaugeMetricFamily(
            "mediafarm_gpu_allocator_fragmentation",
            "Inactive split bytes / reserved bytes of a GPU child's CUDA caching allocator, after its last job",
            labels=["pool", "pid", "device"],
        )  # fmt: skip
        reserved = GaugeMetricFamily(
            "mediafarm_gpu_allocator_reserved_bytes", "Bytes a GPU child's CUDA caching allocator holds",
            labels=["pool", "pid", "device"],
        )  # fmt: skip
        try:
            alive = {c.pid for c in psutil.Process().children()}
            children = read_children(self.client, self.worker(), alive)
        except Exception as exc:  # noqa: BLE001
            log.debug("GPU children unreadable: %s", exc)
            return
        for pid, entry in children.items():
            labels = [self.pool, str(pid), str(entry.get("device", ""))]
            if entry.get("fragmentation") is not None:
                frag.add_metric(labels, float(entry["fragmentation"]))
            reserved.add_metric(labels, float(entry.get("reserved_bytes", 0)))
        yield frag
        yield reserved
