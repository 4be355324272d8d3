"""A Celery app with the farm's configuration bound to a broker and backend of the caller's
choosing: a producer for a test's or a bench's own Redis or RabbitMQ vhost (the session's app is
bound to the session's Redis)."""

from __future__ import annotations

import contextlib
import uuid

from celery import Celery

from mediafarm.config.celery import celery_config
from mediafarm.config.settings import FarmSettings
from mediafarm.tasks.sent_ledger import LedgerAMQP


def farm_app(broker_url: str, backend_url: str | None = None, name: str = "producer") -> Celery:
    """The app for ``broker_url``, results in ``backend_url`` (default: the broker)."""
    app = Celery(f"{name}-{uuid.uuid4().hex[:6]}", amqp=LedgerAMQP)
    settings = FarmSettings(broker_url=broker_url, result_backend=backend_url or broker_url)
    app.config_from_object(celery_config(settings))
    return app


def release(app: Celery) -> None:
    """Let go of ``app``'s result subscriptions and connections while its Redis still runs.

    A producer's Redis result backend subscribes to each task it sends (pub/sub), and an
    ``AsyncResult`` unsubscribes when it is garbage-collected. One collected after the test's own
    Redis is gone (a result kept alive by a failed test's traceback, or by a reference cycle until
    the collector runs, in some later test) tries to reconnect from ``__del__``, and Celery raises
    "Retry limit exceeded while trying to reconnect to the Celery result store" there: pytest's
    PytestUnraisableExceptionWarning in another test's log. Unsubscribed and forgotten here, a late
    ``__del__`` has nothing left to send."""
    consumer = app.backend.result_consumer
    if consumer is not None and getattr(consumer, "_pubsub", None) is not None:
        with contextlib.suppress(Exception):  # a connection already lost has nothing to unsubscribe
            consumer._pubsub.unsubscribe()
        consumer.subscribed_to.clear()
        consumer.stop()
    app.close()
