"""Job messages lost in kombu's fetch on Redis, found and sent again under the same job id.

A message taken off its list by a ``BRPOP`` whose reply never reached the worker (a Redis restart,
a network cut) is in no queue and not in kombu's unacked hash: nothing would ever deliver it again
(``tasks.sent_ledger`` says why the fetch cannot be made safe). The farm kept the message as it
was published; at each look (every ``FARM_LOST_SWEEP`` seconds, one worker of the farm at a time)
this sweep takes the ledger's jobs sent longer ago than that and:

    its result is stored as ended (SUCCESS, FAILURE, REVOKED)   → dropped from the ledger
    its message is in a list of a queue of its family           → waiting: nothing (a suspicion cleared)
    its message is in kombu's unacked hash                      → held or running: nothing (cleared)
    found nowhere, the first time                               → a suspect, with the time
    found nowhere again, a look at least the interval later     → sent again, as it was published
    ... and it was sent again MOST_RESENDS times already        → given up, logged as an error

Two looks, because a message can be between two places for an instant (its reply in flight to a
worker, moved between a pool's queue and its family's, restored from unacked) and must not be
sent twice for that. The lists are read before the unacked hash: a fetch, the common move, then
cannot hide a message from both. The one sweeper that takes a suspect out of the suspects' set
sends it, so two sweeps at once never send one job twice. A job sent again carries
``RESENT_HEADER`` and a note on its route (the job's first attempt keeps it); the worker that takes
it runs it as any delivery: its rung is read from its history. Redis only.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from celery import states
from celery.app.amqp import task_message

from mediafarm.config.priorities import redis_lists
from mediafarm.tasks.producer import routing
from mediafarm.tasks.sent_ledger import RESENT_HEADER, SentMessage, forget, messages, sent_before
from mediafarm.tasks.wire import keys

log = logging.getLogger("mediafarm.lost_messages")

# Jobs looked at in one look at most, oldest first: a large backlog goes over several looks.
MOST_PER_LOOK = 1000
# Messages read from a list per round trip.
CHUNK = 500
# A job sent again this often and lost again is given up on, logged: something other than a lost
# fetch takes its message (a worker that drops it as an unknown task, a queue emptied by hand).
MOST_RESENDS = 3


def message_id(raw: bytes | str) -> str | None:
    """The task id of a message as kombu keeps it in a list (its ``headers.id``), None if unreadable."""
    try:
        return _id_of(json.loads(raw))
    except (TypeError, ValueError):
        return None


def _id_of(message: Any) -> str | None:
    headers = message.get("headers") if isinstance(message, dict) else None
    job_id = headers.get("id") if isinstance(headers, dict) else None
    return job_id if isinstance(job_id, str) else None


def ids_in_lists(broker: Any, queues: Iterable[str]) -> set[str]:
    """The task ids of every message waiting in ``queues`` (each of their priority lists).

    Read from the left in chunks: kombu takes from the right end and a producer pushes at the left,
    so a message that stays in its list is never skipped (a push may show one twice)."""
    found: set[str] = set()
    for queue in queues:
        for name in redis_lists(queue):
            start = 0
            while chunk := broker.lrange(name, start, start + CHUNK - 1):
                found.update(i for i in map(message_id, chunk) if i is not None)
                if len(chunk) < CHUNK:
                    break
                start += CHUNK
    return found


def ids_unacked(broker: Any, unacked_key: str) -> set[str]:
    """The task ids of every message kombu holds as delivered and not acknowledged."""
    found = set()
    for raw in broker.hvals(unacked_key):
        try:
            job_id = _id_of(json.loads(raw)[0])  # kombu keeps [message, exchange, routing key]
        except (TypeError, ValueError, IndexError, KeyError):
            continue
        if job_id is not None:
            found.add(job_id)
    return found


class LostMessageSweep:
    """One look at a time over the ledger of messages sent (``run``)."""

    def __init__(
        self, interval: float, horizon: float, unacked_key: str,
        queues_of: Callable[[SentMessage], Iterable[str]], result_key: Callable[[str], str],
    ) -> None:  # fmt: skip
        self.interval = interval  # a message younger than this is not looked for; two looks this far apart
        self.horizon = horizon  # an entry older than this is dropped (its result has expired too)
        self.unacked_key = unacked_key
        self.queues_of = queues_of  # the queues a job's message may wait in (its family's, the one it was sent to)
        self.result_key = result_key  # the job's result key in the backend

    def run(self, client: Any, broker: Any, send: Callable[[str, SentMessage], None],
            now: float | None = None) -> list[str]:  # fmt: skip
        """One look; ``send(job_id, message)`` publishes a lost job's message again. The jobs sent again."""
        now = time.time() if now is None else now
        forget(client, sent_before(client, now - self.horizon, MOST_PER_LOOK))
        job_ids = sent_before(client, now - self.interval, MOST_PER_LOOK)
        if not job_ids:
            return []
        open_ids = self._drop_ended(client, job_ids)
        sent = messages(client, open_ids)
        forget(client, [i for i in open_ids if i not in sent])  # the message itself is gone: nothing to send
        if not sent:
            return []
        queues = dict.fromkeys(q for message in sent.values() for q in self.queues_of(message))
        found = ids_in_lists(broker, queues) | ids_unacked(broker, self.unacked_key)
        nowhere = [i for i in sent if i not in found]
        pipe = client.pipeline(transaction=False)
        for job_id in sent:
            if job_id in found:
                pipe.zrem(keys.sent_suspects(), job_id)
            else:
                pipe.zadd(keys.sent_suspects(), {job_id: now}, nx=True)
        pipe.execute()
        if not nowhere:
            return []
        since = client.zmscore(keys.sent_suspects(), nowhere)
        due = [i for i, at in zip(nowhere, since, strict=True) if at is not None and now - at >= self.interval]
        resent = []
        # Read again just before sending: a job may have ended since the first read of this look.
        for job_id in self._drop_ended(client, due):
            # The one sweeper that takes the suspect out sends it: never twice at once.
            if client.zrem(keys.sent_suspects(), job_id):
                message = sent[job_id]
                if message.resent >= MOST_RESENDS:
                    log.error("job %s: its message to queue %s was sent again %d times and is gone again: given up "
                              "(a worker that drops it, or a queue emptied by hand?)", job_id, message.queue,
                              message.resent)  # fmt: skip
                    forget(client, [job_id])
                    continue
                log.warning("job %s: its message to queue %s (sent %.0f s ago) is in no queue, not unacked and "
                            "not ended at two looks %.0f s apart: lost in the broker's fetch; sent again",
                            job_id, message.queue, now - message.sent, self.interval)  # fmt: skip
                send(job_id, message)
                resent.append(job_id)
        return resent

    def _drop_ended(self, client: Any, job_ids: list[str]) -> list[str]:
        """``job_ids`` less those whose result is stored as ended (those leave the ledger)."""
        if not job_ids:
            return []
        metas = client.mget([self.result_key(i) for i in job_ids])
        ended = {i for i, meta in zip(job_ids, metas, strict=True) if _state(meta) in states.READY_STATES}
        forget(client, sorted(ended))
        return [i for i in job_ids if i not in ended]


def _state(meta: bytes | None) -> str | None:
    if meta is None:
        return None
    try:
        data = json.loads(meta)
    except (TypeError, ValueError):
        return None
    return data.get("status") if isinstance(data, dict) else None


def resend(app: Any, job_id: str, message: SentMessage) -> None:
    """Publish ``message`` again as it was, to its queue, under the same id, marked as sent again."""
    headers = dict(message.headers)
    headers[RESENT_HEADER] = message.resent + 1
    note = f"sent again by the lost-message sweep: its message to queue {message.queue} never reached a worker"
    route = headers.get(routing.ROUTE_HEADER)
    headers[routing.ROUTE_HEADER] = f"{route}; {note}" if route else note
    args, kwargs, embed = (list(message.body) + [[], {}, {}])[:3]
    rebuilt = task_message(headers, dict(message.properties), (args, kwargs, embed), None)
    with app.producer_or_acquire() as producer:
        app.amqp.send_task_message(producer, message.task, rebuilt, queue=message.queue, retry=True)
