"""A Celery app with the farm's configuration bound to a broker and backend of the caller's
choosing: a producer for a test's or a bench's own Redis or RabbitMQ vhost (the session's app is
bound to the session's Redis)."""

from __future__ import annotations

import uuid

from celery import Celery

from mediafarm.config.celery import celery_config
from mediafarm.config.settings import FarmSettings


def farm_app(broker_url: str, backend_url: str | None = None, name: str = "producer") -> Celery:
    """The app for ``broker_url``, results in ``backend_url`` (default: the broker)."""
    app = Celery(f"{name}-{uuid.uuid4().hex[:6]}")
    settings = FarmSettings(broker_url=broker_url, result_backend=backend_url or broker_url)
    app.config_from_object(celery_config(settings))
    return app
