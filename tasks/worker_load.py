"""What each live worker holds: its slots, the jobs it reserved and has not started, the jobs it runs.

A job a worker has taken from the broker is no longer in any queue's list: kombu's Redis transport
keeps it in its ``unacked`` hash until the late ack, and RabbitMQ counts it as unacknowledged, not
ready. Only the worker knows which of those it runs and which wait (a retry's countdown, a message
prefetched for a child about to be free). So each worker's main process writes what it holds, read
from Celery's own worker state, every :data:`INTERVAL_S` (``workers.load``), in the broker's Redis
beside its capability record (``keys.worker_loads``), with the Redis server's time, so readers on
other hosts compare it with the server's clock. A record not rewritten for :data:`STALE_S` is a
dead worker's: its jobs come back through the handback (``tasks.handback``) and count as queued then.

The pools' scaling signal (``tasks.scaling``) sums these records by pool.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mediafarm.tasks import keys

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


# KEYS[1]: the load hash. ARGV[1]: the node, ARGV[2]: its record as JSON, ARGV[3]: seconds after
# which any field is dropped. Writes the record with the server's time (``"at"`` set inside the
# JSON object) and drops fields older than ARGV[3].
_WRITE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local record = cjson.decode(ARGV[2])
record['at'] = now
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(record))
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local ok, other = pcall(cjson.decode, all[i + 1])
  if not ok or type(other) ~= 'table' or now - (tonumber(other['at']) or 0) > tonumber(ARGV[3]) then
    redis.call('HDEL', KEYS[1], all[i])
  end
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return tostring(now)
"""


def write(client: Any, record: WorkerLoad) -> None:
    """Write ``record``, its time the Redis server's now."""
    client.eval(_WRITE, 1, keys.worker_loads(), record.node, record.to_json(), FORGET_AFTER_S)


def forget(client: Any, node: str) -> None:
    """Remove a worker's record (it stops: it holds nothing any more)."""
    client.hdel(keys.worker_loads(), node)


def live(client: Any) -> list[WorkerLoad]:
    """The records written within :data:`STALE_S` (by the Redis server's clock), by node name;
    unreadable ones left out."""
    pipe = client.pipeline(transaction=False)
    pipe.time()
    pipe.hvals(keys.worker_loads())
    (seconds, micros), raws = pipe.execute()
    return fresh(raws, seconds + micros / 1e6)


def fresh(raws: Any, now: float) -> list[WorkerLoad]:
    """The readable records of ``raws`` no older than :data:`STALE_S` at ``now``, by node name."""
    out = []
    for raw in raws:
        try:
            record = WorkerLoad.from_json(raw)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if now - record.at <= STALE_S:
            out.append(record)
    return sorted(out, key=lambda r: r.node)
