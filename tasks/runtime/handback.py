"""A dead Redis worker's jobs, handed back to their queue within seconds (the guarded writes).

RabbitMQ redelivers a dead consumer's messages as soon as its connection drops. kombu's Redis
transport keeps a delivered message in its ``unacked`` hash (and ``unacked_index``, scored by
delivery time) and puts it back only once it is older than the visibility timeout (hours here;
celery/celery#4984). The farm knows more: each running attempt names its worker
(``records.Attempt.worker``), and each worker beats (``keys.heartbeats``, ``workers.handback``).
A live worker that sees a peer silent past ``FARM_HANDBACK_GRACE`` hands that peer's jobs back:

1. The lease. The job's newest attempt is settled ``worker_lost`` by the same conditional write a
   worker finishing its own attempt uses (``AttemptLog.finish``: still open, still the newest, the
   same child, worker and start, no SUCCESS stored). Only one writer can win it, so a job is
   handed back once however many workers look; the paused owner that wakes finds its attempt
   settled and writes nothing (``errors.StaleAttempt``).
2. The message. One Lua script on the broker takes it out of ``unacked`` and ``unacked_index``
   only if it is still there byte for byte and was delivered before the attempt began (else a
   live worker holds a copy the visibility sweep put back), and puts it at the head of its queue's priority list,
   as kombu's own restore does, marked redelivered and under a **new delivery tag**. The dead
   worker's tag then names nothing: neither the visibility sweep nor that worker's own restore at
   shutdown (``restore_unacked``, by tag) can find it again, and its late ack cannot remove the
   new delivery's entry.

A worker brought back under its own node name (a container's restart policy after a SIGKILL
keeps its hostname) beats again before any peer sees it silent past the grace, and no peer may be
there at all: as it starts it hands back what its predecessor under that name left open
(``predecessor``: the name's beat is in the hash, never forgotten by a clean stop, and no live
process renews it), the jobs whose attempts began before it started.

The two steps may lie on two Redis servers (a result backend apart from the broker). A handback
cut between them leaves the message in ``unacked``, where the visibility timeout still finds it.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from kombu.utils.json import dumps, loads

from mediafarm.tasks.runtime.downgrade import settle_open_attempts
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.tasks.wire.records import Outcome

log = logging.getLogger("mediafarm.handback")
# A dead worker's field is dropped this long after its last beat.
FORGET_AFTER_S = 3600
# kombu scores a delivery before the child starts its attempt; this much later still counts as before.
DELIVERY_SLACK_S = 1.0

# KEYS[1]: the heartbeat hash. ARGV[1]: this worker's node name ('' to beat for nobody),
# ARGV[2]: seconds after which a field is dropped. Beats with the server's clock and answers
# {server time, node, last beat, node, last beat ...} of every worker.
_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
if ARGV[1] ~= '' then redis.call('HSET', KEYS[1], ARGV[1], tostring(now)) end
local all = redis.call('HGETALL', KEYS[1])
local out = {tostring(now)}
for i = 1, #all, 2 do
  if now - tonumber(all[i + 1]) > tonumber(ARGV[2]) then
    redis.call('HDEL', KEYS[1], all[i])
  else
    table.insert(out, all[i]); table.insert(out, all[i + 1])
  end
end
return out
"""

# KEYS[1]: kombu's unacked hash, KEYS[2]: its index, KEYS[3...]: the lists to put the message on.
# ARGV[1]: the dead delivery's tag, ARGV[2]: its payload as stored, ARGV[3]: the new payload,
# ARGV[4]: the new tag, ARGV[5]: the latest delivery time that can be the dead worker's. Moves it
# only if it is still there unchanged, delivered no later than that; 1 if moved.
_MOVE_BACK = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
local delivered = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not delivered or tonumber(delivered) > tonumber(ARGV[5]) then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
for i = 3, #KEYS do redis.call('RPUSH', KEYS[i], ARGV[3]) end
return 1
"""


def beat(client: Any, node: str) -> tuple[float, dict[str, float]]:
    """Write ``node``'s beat (none for ``""``); (the server's time, every worker's last beat)."""
    raw = client.eval(_BEAT, 1, keys.heartbeats(), node, FORGET_AFTER_S)
    now = float(raw[0])
    fields = raw[1:]
    return now, {_text(fields[i]): float(fields[i + 1]) for i in range(0, len(fields), 2)}


def forget(client: Any, node: str) -> None:
    """A worker stopping cleanly: it is not silent, it is gone (its messages were restored by kombu)."""
    client.hdel(keys.heartbeats(), node)


def last_beat(client: Any, node: str) -> float | None:
    """``node``'s last beat as the hash keeps it (None: it never beat, or stopped cleanly)."""
    return beat(client, "")[1].get(node)


def predecessor(client: Any, node: str, before: float | None) -> float | None:
    """Seconds since a dead predecessor under ``node`` last beat, or None. ``before``: its beat
    read (``last_beat``) a few beats' time earlier, before this process beat under that name; a
    beat since then is a live process of the same name (a duplicate node name), not a dead one."""
    if before is None:
        return None
    now, beats = beat(client, "")
    return now - before if beats.get(node) == before else None


def silent(now: float, beats: dict[str, float], grace: float, me: str) -> dict[str, float]:
    """Workers other than ``me`` silent for more than ``grace`` seconds, with their silence."""
    return {node: now - at for node, at in beats.items() if node != me and now - at > grace}


class Handback:
    """Hands back the jobs of silent workers. ``backend``: a redis-py client of the result
    backend; ``channel``: a kombu Redis channel of the broker (its client, its exchange lookup
    and priority lists); ``result_key``: the Celery result key of a job id."""

    def __init__(self, backend: Any, channel: Any, result_key: Any, ttl: int, transient_budget: int) -> None:
        self.backend, self.channel, self.result_key = backend, channel, result_key
        self.ttl, self.transient_budget = ttl, transient_budget
        self._move: Any = None

    def run(self, dead: dict[str, float], started_before: float | None = None) -> list[str]:
        """Hand back what the ``dead`` workers (node → seconds silent) hold; the job ids handed back.
        ``started_before``: only attempts that began before then (a worker handing back its own
        predecessor's jobs under the same node name, not the ones it runs itself)."""
        client = self.channel.client
        handed = []
        for tag, raw in client.hgetall(self.channel.unacked_key).items():
            try:
                message, exchange, routing_key = loads(_text(raw))
                headers = message.get("headers") or {}
                job_id, retries = str(headers["id"]), int(headers.get("retries") or 0)
            except (ValueError, KeyError, TypeError):
                continue  # not a Celery message of protocol 2: not the farm's to judge
            if self._hand_back(job_id, retries, dead, _text(tag), raw, message, exchange, routing_key, started_before):
                handed.append(job_id)
        return handed

    def _hand_back(
        self, job_id: str, retries: int, dead: dict[str, float], tag: str, raw: Any, message: dict[str, Any],
        exchange: str, routing_key: str, started_before: float | None = None,
    ) -> bool:
        attempt_log = AttemptLog(self.backend, job_id, self.ttl)
        attempts, _ = attempt_log.read()
        if not attempts:
            return False  # not started, or not a farm job: nobody can say whose it is
        newest = attempts[-1]
        # The message of that very attempt: a retry of the same job carries a higher count.
        if newest.outcome is not None or newest.worker not in dead or newest.retries != retries:
            return False
        if started_before is not None and newest.started >= started_before:
            return False
        settle_open_attempts(attempts, None, retries, self.transient_budget)
        silence = dead[newest.worker]
        said = f"handed back: its worker {newest.worker} was silent {silence:.0f} s"
        newest.reason = said if newest.outcome == Outcome.WORKER_LOST else f"{newest.reason}; {said}"
        result_key = self.result_key(job_id)
        # The dead worker's own delivery came before its child began the attempt (one host's
        # clock). A later one is another worker's: the visibility sweep put the message back and
        # a live worker took it, and holds it unstarted; that copy is not the dead worker's to hand back.
        latest = newest.started + DELIVERY_SLACK_S
        delivered = self.channel.client.zscore(self.channel.unacked_index_key, tag)
        if delivered is None or delivered > latest:
            return False
        if not attempt_log.finish(len(attempts) - 1, newest, _text(result_key)):
            return False  # another worker handed it back, or its owner woke and wrote first
        if not self._move_message(tag, raw, message, exchange, routing_key, latest):
            log.info("job %s: attempt settled, its message was no longer unacked (%s)", job_id, said)
            return False
        log.warning("job %s handed back to its queue: %s", job_id, said)
        return True

    def _move_message(
        self, tag: str, raw: Any, message: dict[str, Any], exchange: str, routing_key: str, latest: float
    ) -> bool:
        channel = self.channel
        new_tag = str(uuid.uuid4())
        properties = message.setdefault("properties", {})
        properties["delivery_tag"] = new_tag
        properties.setdefault("delivery_info", {})["redelivered"] = True
        message.setdefault("headers", {})["redelivered"] = True
        priority = channel._get_message_priority(message, reverse=False)
        lists = [channel._q_for_pri(queue, priority) for queue in channel._lookup(exchange, routing_key)]
        if self._move is None:
            self._move = channel.client.register_script(_MOVE_BACK)
        moved = self._move(
            keys=[channel.unacked_key, channel.unacked_index_key, *lists],
            args=[tag, raw, dumps(message), new_tag, repr(latest)],
        )
        return bool(moved)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
