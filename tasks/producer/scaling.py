"""The scaling signal of each pool: the jobs it has to do, over the slots one replica brings.

The common recipe for Celery on an orchestrator (KEDA's Redis scaler on the queue's list length) is
wrong for long jobs. A job a worker has taken is no longer in the list: kombu's Redis transport
moves it to its ``unacked`` hash as it delivers it, and keeps it there while it runs (late acks),
and a prefetched job or a retry waiting out its countdown is there too. The list then reads 0
while every slot of the pool is busy, and the scaler scales the pool down under its running jobs
(kedacore/keda#6719), or a pool whose workers drain the list as fast as it fills never scales up.
The list also leaves out every priority but one (kombu keeps a list per priority step,
``config.priorities.redis_lists``). So the signal counts, for each pool:

    queued      the jobs waiting in every queue the pool consumes, over every priority list: its
                own queue of each family (``subtitle@gpu0``, where routing sends its jobs), its GPU
                affinity queues (``gpu0.subtitle``) and the families' shared queues it consumes
                (``subtitle``: where a job waits while no live worker advertises its family, a
                pool at zero replicas among them); on RabbitMQ, each queue's ready messages (one
                queue holds every priority); a queue every live worker of the pool leaves
                out (a family it can run no rung of) is not its work
    reserved    jobs its live workers took and have not started (``tasks.wire.worker_load``)
    running     jobs its live workers' children started
    slots       the slots of its live workers that take jobs (not draining): 0 at zero replicas

and the load: ``(queued + reserved + running) / slots per replica``, the replicas its work fills.
Slots per replica are those of its live workers on average, or the declared pool's
``concurrency`` when none is live, so a pool at zero replicas still has a load to scale from. A
scaler keeps ``ceil(load)`` replicas (KEDA's Prometheus scaler on ``mediafarm_pool_load`` with
threshold 1; docs/operating.md, "Scaling a pool by its load").

A pool at zero replicas gets no routed jobs (routing sends them to live pools), so its queues
alone would never wake it while another pool runs its families' lower rungs. The jobs that wanted
it within ``FARM_WAKE_WINDOW`` (``tasks.producer.wake``: it would have started them on a better rung) are
its ``wanted``; while it has no replica taking jobs and ``wanted`` is not 0, its load reads at
least 1, one replica to start.

A shared family queue counts in every pool that consumes it: its job goes to whichever pool is
free first, so the sum of the pools' queued jobs can exceed the jobs waiting in the farm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mediafarm.config.pools import Pool, expand_queues, get_pools, pool_queue
from mediafarm.config.priorities import redis_lists
from mediafarm.config.settings import get_settings
from mediafarm.tasks import registry
from mediafarm.tasks.producer import wake
from mediafarm.tasks.wire import capability, worker_load
from mediafarm.tasks.wire.capability import WorkerCapability
from mediafarm.tasks.wire.worker_load import WorkerLoad


@dataclass(frozen=True)
class PoolSignal:
    """One pool's scaling signal.

    Attributes:
        pool: The pool's name.
        queued: Jobs waiting in its queues, every priority list counted.
        reserved: Jobs its live workers took and have not started.
        running: Jobs its live workers run.
        slots: Slots of its live workers that take jobs (0: none live, or all draining).
        replicas: Its live workers that take jobs (not draining).
        slots_per_replica: What one more replica brings: its live workers' slots on average, else
            the declared pool's ``concurrency``.
        queues: Queue -> jobs waiting in it, for each queue counted in ``queued``.
        wanted: Jobs submitted within ``FARM_WAKE_WINDOW`` that it would have started on a better
            rung than the live pools, had it had a live worker (``tasks.producer.wake``).
    """

    pool: str
    queued: int
    reserved: int
    running: int
    slots: int
    replicas: int
    slots_per_replica: float
    queues: Mapping[str, int] = field(default_factory=dict)
    wanted: int = 0

    @property
    def jobs(self) -> int:
        return self.queued + self.reserved + self.running

    @property
    def load(self) -> float:
        """The replicas its jobs fill, ``jobs / slots_per_replica``; at least 1 while it has no
        replica taking jobs and jobs want it (``wanted``), so that one starts."""
        filled = self.jobs / self.slots_per_replica if self.slots_per_replica > 0 else 0.0
        return max(filled, 1.0) if self.replicas == 0 and self.wanted > 0 else filled

    def to_dict(self) -> dict[str, Any]:
        return {"queued": self.queued, "reserved": self.reserved, "running": self.running, "slots": self.slots,
                "replicas": self.replicas, "slots_per_replica": self.slots_per_replica, "load": round(self.load, 3),
                "queues": dict(self.queues), "wanted": self.wanted}  # fmt: skip


def pool_queues(
    name: str,
    pool: Pool | None,
    records: Sequence[WorkerCapability],
    family_queues: Mapping[str, str],
    default_queues: Sequence[str],
) -> tuple[str, ...]:
    """The queues whose waiting jobs are pool ``name``'s: those it declares (``*`` expanded) with its
    own queue of each family queue among them, and those its live workers consume (``records``: the
    live capability records of its workers), less the queues of a family its live workers leave
    out (they can run no rung of it) that none of them consumes."""
    declared = expand_queues(pool.queues, default_queues) if pool is not None else ()
    own = [pool_queue(name, q) for q in declared if q in set(family_queues.values())]
    consumed = {q for r in records for q in r.queues}
    # A family its workers left out: none of its queues is theirs (its pool queue neither), unless one consumes it.
    unable = {capability.family_of_queue(q, family_queues) for r in records for q in r.left_out} - {None}
    return tuple(q for q in dict.fromkeys((*declared, *own, *(q for r in records for q in r.queues)))
                 if q in consumed or capability.family_of_queue(q, family_queues) not in unable)  # fmt: skip


def pool_signals(
    pools: Mapping[str, Pool],
    records: Sequence[WorkerCapability],
    loads: Sequence[WorkerLoad],
    depths: Callable[[Sequence[str]], Mapping[str, int]],
    family_queues: Mapping[str, str],
    default_queues: Sequence[str],
    wanted: Callable[[Sequence[str]], Mapping[str, int]] | None = None,
) -> dict[str, PoolSignal]:
    """Pool -> its signal, for every declared pool and every pool a live worker names.

    ``records``: the live capability records (``tasks.wire.capability.live``); ``loads``: the live load
    records (``tasks.wire.worker_load.live``); ``depths``: queue names -> the jobs waiting in each, every
    priority list counted (``tasks.producer.admission.queue_depths``, or :func:`redis_depths`);
    ``family_queues``: family -> its queue; ``default_queues``: what ``*`` stands for; ``wanted``:
    pool names -> the jobs that wanted each (``tasks.producer.wake.wanted_counts``), or None for none."""
    names = list(dict.fromkeys([*pools, *sorted({r.pool for r in records} | {w.pool for w in loads})]))
    queues = {n: pool_queues(n, pools.get(n), [r for r in records if r.pool == n], family_queues, default_queues)
              for n in names}  # fmt: skip
    waiting = dict(depths(list(dict.fromkeys(q for qs in queues.values() for q in qs))))
    wants = dict(wanted(names)) if wanted is not None else {}
    out = {}
    for name in names:
        mine = [w for w in loads if w.pool == name]
        taking = [w for w in mine if not w.draining]
        slots = sum(w.slots for w in taking)
        declared = pools.get(name)
        per_replica = slots / len(taking) if taking else float(declared.concurrency if declared else 1)
        counted = {q: int(waiting.get(q, 0)) for q in queues[name]}
        out[name] = PoolSignal(name, sum(counted.values()), sum(w.reserved for w in mine), sum(w.running for w in mine),
                               slots, len(taking), per_replica, counted, int(wants.get(name, 0)))  # fmt: skip
    return out


def redis_depths(client: Any, queues: Sequence[str]) -> dict[str, int]:
    """Queue -> the jobs waiting in it on a Redis broker, every priority list, one round trip, on
    the caller's client (a scrape's, with short timeouts: a Redis away must not hold a scrape)."""
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        for name in redis_lists(queue):
            pipe.llen(name)
    lengths = iter(pipe.execute())
    return {queue: sum(int(next(lengths)) for _ in redis_lists(queue)) for queue in queues}


def read_signals(backend: Any, depths: Callable[[Sequence[str]], Mapping[str, int]]) -> dict[str, PoolSignal]:
    """The signals now: the declared pools, the live records in the result backend's Redis
    (``backend``, a redis-py client) and the queues' depths (``depths``)."""
    family_queues = {name: spec.queue for name, spec in registry.load().items()}
    window = get_settings().wake_window
    return pool_signals(get_pools(), capability.live(backend), worker_load.live(backend), depths, family_queues,
                        registry.default_queues(),
                        lambda pools: wake.wanted_counts(backend, pools, window))  # fmt: skip
