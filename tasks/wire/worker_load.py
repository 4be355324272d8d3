"""What each live worker holds: its slots, the jobs it reserved and has not started, the jobs it runs.

A job a worker has taken from the broker is no longer in any queue's list: kombu's Redis transport
keeps it in its ``unacked`` hash until the late ack, and RabbitMQ counts it as unacknowledged, not
ready. Only the worker knows which of those it runs and which wait (a retry's countdown, a message
prefetched for a child about to be free). So each worker's main process writes what it holds, read
from Celery's own worker state, every :data:`INTERVAL_S` (``workers.load``), in the broker's Redis
beside its capability record (``keys.worker_loads``), with the Redis server's time, so readers on
other hosts compare it with the server's clock. A record not rewritten for :data:`STALE_S` is a
dead worker's: its jobs come back through the handback (``tasks.runtime.handback``) and count as queued then.

The pools' scaling signal (``tasks.producer.scaling``) sums these records by pool.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mediafarm.tasks.wire import keys, timed_records

# A worker writes its record this often; a record not rewritten for STALE_S is a dead worker's.
INTERVAL_S = 1.0
STALE_S = 5 * INTERVAL_S
# A field this old is removed by the next writer (a worker killed without its stop step).
FORGET_AFTER_S = 3600


@dataclass(frozen=True)
class WorkerLoad:
    """One worker's record.

    Attributes:
        node: The worker's node name (``gpu0@host``).
        pool: Its pool.
        slots: Its pool children (``--concurrency``): the jobs it runs at once.
        reserved: Jobs it took from the broker and has not started: a retry waiting out its
            countdown (``FARM_RETRY_DELAY``), a message prefetched for a child not yet free.
        running: Jobs a child of it started and that have not ended.
        draining: It stopped taking jobs (``farm drain``, SIGTERM): its slots are going away.
        at: The Redis server's time of the write; 0 before it is written.
    """

    node: str
    pool: str
    slots: int
    reserved: int = 0
    running: int = 0
    draining: bool = False
    at: float = 0.0

    def to_json(self) -> str:
        return json.dumps({"node": self.node, "pool": self.pool, "slots": self.slots, "reserved": self.reserved,
                           "running": self.running, "draining": self.draining, "at": self.at})  # fmt: skip

    @classmethod
    def from_json(cls, raw: bytes | str) -> WorkerLoad:
        data = json.loads(raw)
        return cls(str(data["node"]), str(data["pool"]), int(data["slots"]), int(data.get("reserved") or 0),
                   int(data.get("running") or 0), bool(data.get("draining")), float(data.get("at") or 0))  # fmt: skip


def write(client: Any, record: WorkerLoad) -> None:
    """Write ``record``, its time the Redis server's now."""
    timed_records.write(client, keys.worker_loads(), record.node, record.to_json(), FORGET_AFTER_S)


def forget(client: Any, node: str) -> None:
    """Remove a worker's record (it stops: it holds nothing any more)."""
    client.hdel(keys.worker_loads(), node)


def live(client: Any) -> list[WorkerLoad]:
    """The records written within :data:`STALE_S` (by the Redis server's clock), by node name;
    unreadable ones left out."""
    return timed_records.live(client, keys.worker_loads(), WorkerLoad.from_json, STALE_S)


def fresh(raws: Any, now: float) -> list[WorkerLoad]:
    """The readable records of ``raws`` no older than :data:`STALE_S` at ``now``, by node name."""
    return timed_records.fresh(raws, now, WorkerLoad.from_json, STALE_S)
