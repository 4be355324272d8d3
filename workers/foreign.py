"""Jobs that a client with no farm configuration put on Celery's default queue, sent on to their family's.

A plain Celery app (``Celery(broker=..., backend=...)``, nothing configured) that sends a farm task by
name without a queue publishes it to Celery's default queue, ``celery``. No farm worker consumed
that queue (each consumes its families' queues), so the message waited there forever, with no error
anywhere. Every farm worker now also takes that queue (``FARM_FOREIGN_QUEUE``) through
:class:`ForeignRouter`, and never runs what it finds there:

- a farm task (``farm.vad.detect``) is published again, unchanged and under the same id, to its
  family's queue, then acked; the pools that serve that family take it from there like any other.
  Running it on whichever worker took the message would break pool pinning (a GPU family on a CPU
  worker, a job past the caps its pool sets);
- any other task name is acked and stored as a FAILURE with Celery's ``NotRegistered`` naming the
  tasks the farm runs (what Celery itself stores for a task no worker has), so the client's
  ``result.get()`` raises it at once;
- a message that is not a Celery task message of protocol 2 (Celery 4 and later: the task name and id
  in its headers) is dropped with a warning.

Published again before the ack: a worker killed between the two leaves the message to come back and
be sent on a second time, so that the job's family queue holds it twice under one id, which the
farm treats as a redelivery (its attempt history decides). Acked before, a kill would lose it.

Set ``FARM_FOREIGN_QUEUE`` empty when the broker is shared with another Celery app that uses its
default queue: farm workers would take that app's messages and fail them.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from celery.exceptions import ImproperlyConfigured, NotRegistered
from celery.utils.objects import Bunch
from kombu import Consumer, Exchange, Queue
from kombu.message import Message

from mediafarm.config.settings import get_settings
from mediafarm.tasks import registry

log = logging.getLogger("mediafarm.foreign")


def default_queue(name: str) -> Queue:
    """The queue as a client with Celery's defaults declares it (a classic queue bound to a direct
    exchange of its name, on RabbitMQ too), so that our declaration never conflicts with its."""
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


class ForeignRouter(bootsteps.ConsumerStep):
    """Consume ``FARM_FOREIGN_QUEUE`` and send each farm task on to its family's queue."""

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.app = c.app
        self.queue_name = get_settings().foreign_queue
        self.enabled = bool(self.queue_name)
        # A queue that farm jobs are sent to on purpose would be emptied into itself forever.
        taken = {spec.queue for spec in registry.load().values()} | set(self.app.amqp.queues.consume_from or ())
        if self.queue_name in taken:
            raise ImproperlyConfigured(
                f"FARM_FOREIGN_QUEUE={self.queue_name!r} is a queue the farm's jobs go to; it must name "
                "the queue of clients with no farm configuration (Celery's default: celery), or be empty"
            )

    def get_consumers(self, channel: Any) -> list[Consumer]:
        # One message at a time: each is sent on in a millisecond, and on Redis a message held
        # unacked by a worker that dies comes back only after the visibility timeout.
        queue = default_queue(self.queue_name)
        return [Consumer(channel, queues=[queue], on_message=self.on_message, prefetch_count=1)]

    def _close(self, c: Any, cancel_consumers: bool = True) -> None:
        # Celery closes a consumer step's channels through ignore_errors(c.connection, ...), which
        # raises AttributeError when the connection is already gone: at a broker restart the worker
        # logged 'Error on stopping ForeignRouter: AttributeError' with a traceback (the error gossip
        # logged, found by the Redis-restart test). A lost connection's channels are gone with it.
        if c.connection is None:
            self.consumers = None
            return
        super()._close(c, cancel_consumers)

    def on_message(self, message: Message) -> None:
        headers = message.headers or {}
        name, job_id = headers.get("task"), headers.get("id")
        if not name or not job_id:
            log.warning(
                "dropped a message on queue %r that is not a Celery task message (no task name or id): %r",
                self.queue_name, headers,
            )  # fmt: skip
            message.ack()
            return
        spec = registry.by_task_name(name)
        try:
            if spec is None:
                self.refuse(message, name, job_id)
            else:
                self.send_on(message, spec.queue)
        except Exception:  # both writes retry for a minute or two first: the broker or backend is down
            log.exception("could not pass on %s[%s] from queue %r; it goes back there", name, job_id, self.queue_name)
            message.requeue()
            return
        message.ack()
        if spec is not None:
            log.info(
                "%s[%s] came on queue %r (a client that named no queue): sent on to queue %r",
                name, job_id, self.queue_name, spec.queue,
            )  # fmt: skip

    def send_on(self, message: Message, queue_name: str) -> None:
        """Publish ``message`` as it came (body, headers, id) to ``queue_name``, declared as the farm's
        own producers declare it (a quorum queue on RabbitMQ)."""
        queue = self.app.amqp.queues[queue_name]
        properties = message.properties or {}
        with self.app.producer_or_acquire() as producer:
            producer.publish(
                message.body, exchange=queue.exchange, routing_key=queue.routing_key, declare=[queue],
                headers=message.headers, content_type=message.content_type,
                content_encoding=message.content_encoding, correlation_id=properties.get("correlation_id"),
                reply_to=properties.get("reply_to"), priority=properties.get("priority"),
                retry=True, retry_policy=self.app.conf.task_publish_retry_policy,
            )  # fmt: skip

    def refuse(self, message: Message, name: str, job_id: str) -> None:
        """Store the job as a FAILURE naming the tasks this farm runs."""
        known = sorted(spec.task_name for spec in registry.load().values())
        reason = f"{name!r} is not a task of this farm; it runs {', '.join(known)}"
        request = Bunch(
            name=name, chord=None, root_id=message.headers.get("root_id"), errbacks=None,
            correlation_id=(message.properties or {}).get("correlation_id"),
            reply_to=(message.properties or {}).get("reply_to"),
        )  # fmt: skip
        self.app.backend.mark_as_failure(job_id, NotRegistered(reason), request=request)
        log.warning("%s[%s] came on queue %r and was refused: %s", name, job_id, self.queue_name, reason)


def install(app: Any) -> None:
    """Add the router to the consumer of every worker of ``app``."""
    app.steps["consumer"].add(ForeignRouter)
