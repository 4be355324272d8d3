"""The worker's capability: which family queues it leaves out, and the record it keeps in Redis.

As the worker is set up, before its consumer starts, each rung of each family whose queues the
pool names is judged (``tasks.wire.capability.judge_rungs``); the queue of a family of which no rung
can run here is left out (Celery's own ``deselect``, as ``-X`` does), with one log line naming the
queue and why, so such a worker never takes those jobs. A thread of the main process then writes
the worker's record every ``capability.INTERVAL_S``, judged afresh each time, with the languages
each rung handles here (a model folder added, a package removed, a GPU that no longer answers the
driver, shows within one beat); the queues consumed stay those chosen at start, with
the pool's own queue of each family whose queue it consumes (``subtitle@gpu0``: where jobs routed
to this pool go, ``tasks.producer.routing``). At each beat it also sends on the jobs left in another pool's
queue of those families when that pool has had no live worker for ``FARM_HANDBACK_GRACE``
(``tasks.runtime.orphans``). The
record goes as the worker stops. The main process judges without importing any engine
(``EngineSpec.missing`` looks packages up, ``importlib.util.find_spec``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis
from celery import bootsteps

from mediafarm.config.pools import POOL_QUEUE_SEP, get_pools, pool_queue
from mediafarm.config.settings import get_settings
from mediafarm.tasks import registry
from mediafarm.tasks.runtime import orphans
from mediafarm.tasks.wire import capability
from mediafarm.workers import fork_gate, nvml, publishing

log = logging.getLogger("mediafarm.capability")


def family_queues() -> dict[str, str]:
    return {name: spec.queue for name, spec in registry.load().items()}


def judge(queues: tuple[str, ...], gpu_lost: str | None = None) -> dict[str, dict[str, dict[str, str]]]:
    """The rungs of the families whose queues are among ``queues``, judged on this process
    (``gpu_lost``: why its GPU cannot be used now, the reason of every ``cuda`` rung)."""
    return capability.judge_rungs(_specs(queues), registry.ladders_of, get_settings().models_dir, gpu_lost)


def judge_languages(queues: tuple[str, ...]) -> dict[str, dict[str, dict[str, tuple[str, ...]]]]:
    """The languages of those families' rungs, as this process's models tell them."""
    return capability.judge_languages(_specs(queues), registry.ladders_of, get_settings().models_dir)


def _specs(queues: tuple[str, ...]) -> list[Any]:
    return [registry.get(name) for name in capability.served_families(queues, family_queues())]


class CapabilityStep(bootsteps.StartStopStep):
    """Leaves out the queues of families this worker cannot run, and keeps its record in Redis."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self._stop = threading.Event()
        self._client: Any = None
        self._broker: Any = None
        self._sweep: orphans.OrphanSweep | None = None
        self._node = ""
        # A GPU the driver no longer answers for (fallen off the bus, reset) takes its rungs out of
        # the record at the next beat, so routing sends their jobs elsewhere (``workers.nvml``).
        declared = get_pools().get(get_settings().pool)
        self.gpus = declared.gpus if declared is not None else ()
        self.gpu_lost = nvml.lost_gpu(self.gpus)
        if self.gpu_lost:
            log.warning("not advertising this worker's GPU rungs: %s", self.gpu_lost)
        queues = worker.app.amqp.queues
        configured = tuple(queues.consume_from)
        rungs = judge(configured, self.gpu_lost)
        self.left_out = capability.left_out_queues(configured, rungs, family_queues())
        for queue, why in self.left_out.items():
            log.warning("not consuming queue %s: %s", queue, why)
        if self.left_out:
            queues.deselect(list(self.left_out))
        kept = tuple(q for q in configured if q not in self.left_out)
        # The pool's own queue of each family whose queue it consumes: where jobs routed to this
        # pool go (``tasks.producer.routing``), consumed by this pool's workers alone.
        own_queues = set(family_queues().values())
        own = [pool_queue(get_settings().pool, q) for q in kept if q in own_queues]
        for queue in own:
            if queue not in kept:
                queues.select_add(queue)
        self.queues = tuple(dict.fromkeys((*kept, *own)))
        if not self.queues:
            log.warning("this worker consumes no queue: it can run no rung of any family its pool names")
        # Served: the families whose queues it still consumes; judged again at each beat.
        self.configured = configured
        self.served = capability.served_families(self.queues, family_queues())

    def record(self, node: str) -> capability.WorkerCapability:
        lost = nvml.lost_gpu(self.gpus)
        if lost != self.gpu_lost:
            if lost:
                log.warning("not advertising this worker's GPU rungs: %s", lost)
            else:
                log.warning("GPU rungs advertised again: the pool's GPUs %s answer the driver", list(self.gpus))
            self.gpu_lost = lost
        rungs = judge(self.configured, lost)
        return capability.WorkerCapability(node, get_settings().pool, self.queues, self.left_out, self.served, rungs,
                                           languages=judge_languages(self.configured))  # fmt: skip

    def start(self, worker: Any) -> None:
        self._node = worker.hostname
        settings = get_settings()
        self._client = redis.Redis.from_url(settings.backend_url, socket_timeout=2, socket_connect_timeout=2)
        # Jobs left in the queue of a pool with no live worker go on to their family's queue (Redis only).
        if settings.handback_grace and not settings.broker_is_rabbitmq and self.served:
            self._broker = redis.Redis.from_url(settings.broker_url, socket_timeout=2, socket_connect_timeout=2)
            self._sweep = orphans.OrphanSweep(settings.handback_grace)
        fork_gate.start_thread(self._run, "farm-capability", ())

    def stop(self, worker: Any) -> None:
        self._stop.set()
        if self._client is not None:
            try:
                capability.forget(self._client, self._node)
            except Exception:  # noqa: BLE001 - a Redis away at shutdown: the record lapses in STALE_S
                pass

    def _run(self) -> None:
        publishing.publish_every(self._stop, capability.INTERVAL_S, self._beat, "capability", log)

    def _beat(self) -> None:
        record = self.record(self._node)
        capability.advertise(self._client, record, remember=not self.gpu_lost)
        if self._sweep is not None:
            self._sweep_orphans()

    def _sweep_orphans(self) -> None:
        own = {name: q for name, q in family_queues().items() if name in self.served}
        pools = [name for name in get_pools() if name != get_settings().pool]
        moved = self._sweep.run(self._broker, capability.live(self._client), pools, own)
        for queue, count in moved.items():
            log.warning("moved %d job(s) from queue %s, whose pool has had no live worker for %.0f s, to %s",
                        count, queue, self._sweep.grace, queue.split(POOL_QUEUE_SEP, 1)[0])  # fmt: skip


def install(app: Any) -> None:
    app.steps["worker"].add(CapabilityStep)
