"""The ledger of farm job messages sent and not yet ended: what the lost-message sweep sends again.

kombu's Redis transport takes a message off its list with ``BRPOP`` and records it in its unacked
hash only once the reply has been read. A reply lost in between (a Redis restart, a network cut,
a worker's connection dropped while its ``BRPOP`` was served) loses the message: the job has no
state, no history, nothing to redeliver, and its producer waits for ever. Redis offers no
blocking pop over many lists that also keeps what it pops, so the fetch itself cannot be made safe
without changing every producer's message format; the farm keeps its own copy instead:

- every app with the farm's configuration (:class:`LedgerAMQP`), as it publishes a farm task's
  message on Redis (a submit, a retry, a move to another pool, a pipeline's part), writes the
  message as published into ``keys.sent_messages`` and its time into ``keys.sent_times``: one
  pipelined round trip, after the publish went out (a send that failed records nothing, so nothing
  is ever sent twice for it);
- the step that stores a job's end (``tasks.result_backend``, SUCCESS, FAILURE or REVOKED) removes
  both in the same Lua script: no round trip of its own;
- a worker's sweep (``tasks.runtime.lost_messages``) sends again the message of a job found in no queue,
  not unacked and not ended, at two looks ``FARM_LOST_SWEEP`` apart.

A plain Celery client with no farm configuration records nothing: its jobs are not covered.
RabbitMQ, which acknowledges per delivery, has no such window: nothing is written there.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from celery.app.amqp import AMQP

from mediafarm.config.settings import get_settings, is_amqp
from mediafarm.tasks.wire import keys

log = logging.getLogger("mediafarm.sent_ledger")

# Only the farm's own tasks (``FamilySpec.task_name`` and the test families) are kept.
FARM_TASK_PREFIX = "farm."
# The header a message sent again carries: how many times the sweep has sent it.
RESENT_HEADER = "farm_resent"

# Lua, appended to the result backend's scripts that store an end: remove the job (ARGV[n], '' for
# none) from the ledger (KEYS[a], KEYS[b]). A function, so each script names its own slots.
LUA_FORGET = """
local function forget_sent(hash, times, job_id)
  if job_id ~= '' then
    redis.call('HDEL', hash, job_id)
    redis.call('ZREM', times, job_id)
  end
end
"""


@dataclass(frozen=True)
class SentMessage:
    """A farm task's message as it was published, enough to publish it again unchanged.

    Attributes:
        task: The task name (``farm.vad.detect``).
        queue: The queue it was published to (its routing key: every farm queue is named by it).
        headers: Celery's message headers, the farm's own among them.
        properties: The message properties (priority, correlation id, reply-to).
        body: Celery's body: ``[args, kwargs, embed]`` (embed: callbacks, chord, chain).
        sent: When it was published (``time.time()`` of the publisher).
    """

    task: str
    queue: str
    headers: dict[str, Any]
    properties: dict[str, Any]
    body: list[Any]
    sent: float

    @property
    def resent(self) -> int:
        """How often the sweep has sent this job's message again."""
        return int(self.headers.get(RESENT_HEADER) or 0)

    def to_json(self) -> str:
        """As JSON gives it back: tuples as lists, what JSON cannot carry as its text."""
        return json.dumps({"task": self.task, "queue": self.queue, "headers": self.headers,
                           "properties": self.properties, "body": self.body, "sent": self.sent},
                          default=str)  # fmt: skip

    @classmethod
    def from_json(cls, raw: bytes | str) -> SentMessage:
        data = json.loads(raw)
        return cls(data["task"], data["queue"], data["headers"], data["properties"], list(data["body"]), data["sent"])


def remember(client: Any, job_id: str, message: SentMessage) -> None:
    """Keep ``message`` as the job's last one sent (a later one of the same job replaces it)."""
    pipe = client.pipeline(transaction=False)
    pipe.hset(keys.sent_messages(), job_id, message.to_json())
    pipe.zadd(keys.sent_times(), {job_id: message.sent})
    pipe.execute()


def forget(client: Any, job_ids: list[str]) -> None:
    """Drop jobs from the ledger (ended, or too old to matter)."""
    if not job_ids:
        return
    pipe = client.pipeline(transaction=False)
    pipe.hdel(keys.sent_messages(), *job_ids)
    pipe.zrem(keys.sent_times(), *job_ids)
    pipe.zrem(keys.sent_suspects(), *job_ids)
    pipe.execute()


def sent_before(client: Any, before: float, most: int) -> list[str]:
    """The jobs whose last message was sent before ``before``, oldest first, ``most`` at most."""
    return [m.decode() if isinstance(m, bytes) else m
            for m in client.zrangebyscore(keys.sent_times(), "-inf", before, start=0, num=most)]  # fmt: skip


def messages(client: Any, job_ids: list[str]) -> dict[str, SentMessage]:
    """The ledger's message of each job that still has one."""
    if not job_ids:
        return {}
    raws = client.hmget(keys.sent_messages(), job_ids)
    return {job_id: SentMessage.from_json(raw) for job_id, raw in zip(job_ids, raws, strict=True) if raw is not None}


class LedgerAMQP(AMQP):
    """Celery's AMQP part of an app, whose task sender keeps each farm task's message it sent in
    the app's own result backend (so an app bound to another Redis keeps its ledger there).
    Named by ``Celery(amqp=...)`` for the farm's app (``tasks.app``) and every app with the farm's
    configuration."""

    def _create_task_sender(self) -> Any:
        send = super()._create_task_sender()

        def send_and_keep(producer: Any, name: str, message: Any, *args: Any, **kwargs: Any) -> Any:
            sent = send(producer, name, message, *args, **kwargs)
            # Only after a send that went out: one that failed must not be sent again later.
            self._keep(name, message, kwargs.get("queue"), kwargs.get("routing_key"))
            return sent

        return send_and_keep

    def _keep(self, name: str, message: Any, queue: Any, routing_key: str | None) -> None:
        headers, properties, body = message[0], message[1], message[2]
        job_id = headers.get("id") if isinstance(headers, dict) else None
        queue_name = getattr(queue, "name", queue) or routing_key
        if not (name.startswith(FARM_TASK_PREFIX) and job_id and queue_name and self._ledger_on()):
            return
        # The sender filled the properties in (the priority among them) as it published. Celery's
        # own objects, read once, as ``to_json`` writes them: every send pays this (issue #34).
        kept = SentMessage(task=name, queue=str(queue_name), headers=headers, properties=properties,
                           body=list(body or ()), sent=time.time())  # fmt: skip
        try:
            remember(self.app.backend.client, job_id, kept)
        except Exception as exc:  # noqa: BLE001 - the job is sent: only its cover against a lost fetch is missing
            log.warning("job %s: sent, but not kept for the lost-message sweep (%s: %s)", job_id,
                        type(exc).__name__, exc)  # fmt: skip

    def _ledger_on(self) -> bool:
        # This app's broker, not the process's settings: a test's or bench's app may have its own.
        return not is_amqp(str(self.app.conf.broker_url or "")) and get_settings().lost_sweep > 0 \
            and hasattr(self.app.backend, "client")  # fmt: skip

