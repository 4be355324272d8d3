"""Jobs left in the queue of a pool that has no live worker, sent on to their family's queue.

Routing sends a job only to a pool with a live worker (``tasks.producer.routing``), but a pool can die
whole with jobs waiting in its own queue (``subtitle@gpu0``), or take back jobs a peer handed back
(``tasks.runtime.handback``) after it died: only that pool's workers consume that queue, so those jobs
would wait for the pool to come back, however long. Each live worker looks, at each capability
beat, at the pool queues of the families it serves; one that holds jobs while its pool has had no
live worker for ``grace`` seconds is emptied into the family's queue, priority list by priority
list, one atomic ``LMOVE`` per message (a message is in one list or the other, never lost, never
twice). The worker that takes a job there routes it on (``tasks.producer.routing.move``), as it does a plain
Celery client's.

The grace keeps a pool's own restart (a rolling update, a container brought back) from giving its
backlog away. Redis only: RabbitMQ's queues are not moved from outside (the job waits for its pool).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from mediafarm.config.pools import pool_queue
from mediafarm.config.priorities import redis_lists
from mediafarm.tasks.wire.capability import WorkerCapability

# Messages moved from one list at one beat at most: a large backlog goes over a few beats, and a
# beat never holds the worker's Redis connection for long.
MOST_PER_BEAT = 200


class OrphanSweep:
    """Remembers since when each pool queue has held jobs with its pool absent; moves them after ``grace``."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.absent_since: dict[str, float] = {}

    def run(self, broker: Any, records: Iterable[WorkerCapability], pools: Iterable[str],
            family_queues: Mapping[str, str], now: float | None = None) -> dict[str, int]:  # fmt: skip
        """One look: ``pools`` (the declared ones) × ``family_queues`` (family -> queue, those this
        worker serves); the messages moved, by pool queue."""
        now = time.monotonic() if now is None else now
        live = {r.pool for r in records}
        candidates = [(pool_queue(p, q), q) for p in pools if p not in live for q in family_queues.values()]
        if not candidates:
            self.absent_since.clear()
            return {}
        pipe = broker.pipeline(transaction=False)
        for queue, _ in candidates:
            for name in redis_lists(queue):
                pipe.llen(name)
        lengths = iter(pipe.execute())
        moved: dict[str, int] = {}
        waiting = set()
        for queue, family_queue in candidates:
            if not sum(int(next(lengths)) for _ in redis_lists(queue)):
                continue
            waiting.add(queue)
            since = self.absent_since.setdefault(queue, now)
            if now - since < self.grace:
                continue
            count = 0
            for source, target in zip(redis_lists(queue), redis_lists(family_queue), strict=True):
                # kombu pops a list's messages from its right end: the oldest leaves first, and
                # goes to the left (newest) end of the family's list; order among them is kept.
                while count < MOST_PER_BEAT and broker.lmove(source, target, "RIGHT", "LEFT") is not None:
                    count += 1
            if count:
                moved[queue] = count
        for queue in list(self.absent_since):
            if queue not in waiting:
                del self.absent_since[queue]
        return moved
