"""The worker's share of the lost-message sweep (``tasks.runtime.lost_messages``): a thread of its main process.

Every ``FARM_LOST_SWEEP`` seconds each Redis worker tries to take the sweep's lock; the one that
does looks once at the ledger of messages sent (``tasks.sent_ledger``) and publishes again those
lost in kombu's fetch. One look a period for the whole farm, whichever worker makes it. The look
runs under the fork gate like every Redis call of a main-process thread (``workers.publishing``).
RabbitMQ: nothing runs (it acknowledges per delivery).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterable
from typing import Any

import redis
from celery import bootsteps

from mediafarm.config.pools import get_pools
from mediafarm.config.settings import get_settings
from mediafarm.tasks import registry
from mediafarm.tasks.producer import admission
from mediafarm.tasks.runtime import lost_messages
from mediafarm.tasks.sent_ledger import SentMessage
from mediafarm.tasks.wire import keys
from mediafarm.workers import fork_gate, publishing

log = logging.getLogger("mediafarm.lost_messages")


def queues_of(message: SentMessage) -> Iterable[str]:
    """Where a job's message may wait: the queue it was sent to and every queue of its family (a
    move, a reroute or the orphan sweep may have put it in another one)."""
    spec = _family_of(message.task)
    if spec is None:
        return (message.queue,)
    return admission.family_queues(spec, message.queue, get_pools())


@functools.lru_cache(maxsize=64)
def _family_of(task: str) -> Any:
    return next((spec for spec in registry.load().values() if spec.task_name == task), None)


class LostSweepStep(bootsteps.StartStopStep):
    """Takes the sweep's lock each period and, holding it, makes the farm's one look."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        settings = get_settings()
        self.interval = settings.lost_sweep
        self.enabled = bool(self.interval) and not settings.broker_is_rabbitmq
        self._stop = threading.Event()
        self._client: Any = None
        self._broker: Any = None
        self._sweep: lost_messages.LostMessageSweep | None = None
        self._app: Any = None
        self._node = ""

    def start(self, worker: Any) -> None:
        if not self.enabled:
            return
        settings = get_settings()
        self._app = worker.app
        self._node = worker.hostname
        self._client = redis.Redis.from_url(settings.backend_url, socket_timeout=5, socket_connect_timeout=2)
        self._broker = redis.Redis.from_url(settings.broker_url, socket_timeout=5, socket_connect_timeout=2)
        options = worker.app.conf.broker_transport_options or {}
        backend = worker.app.backend
        self._sweep = lost_messages.LostMessageSweep(
            interval=self.interval, horizon=float(worker.app.conf.result_expires or 86400),
            unacked_key=options.get("unacked_key", "unacked"), queues_of=queues_of,
            result_key=lambda job_id: backend.get_key_for_task(job_id).decode(),
        )  # fmt: skip
        fork_gate.start_thread(self._run, "farm-lost-sweep", ())

    def stop(self, worker: Any) -> None:
        self._stop.set()

    def _run(self) -> None:
        publishing.publish_every(self._stop, self.interval, self._look, "lost-message sweep", log)

    def _look(self) -> None:
        # One look a period for the farm: the lock lapses just before the next period's tries.
        if not self._client.set(keys.sent_sweep_lock(), self._node, nx=True, px=int(self.interval * 900)):
            return
        assert self._sweep is not None
        self._sweep.run(self._client, self._broker, self._resend)

    def _resend(self, job_id: str, message: SentMessage) -> None:
        lost_messages.resend(self._app, job_id, message)


def install(app: Any) -> None:
    app.steps["worker"].add(LostSweepStep)
