"""The worker's load record: what it holds, written to Redis every second (``tasks.wire.worker_load``).

A thread of the main process counts, from Celery's own worker state, the jobs this worker holds
and has not started (reserved for a child, or waiting out a retry's countdown) and those its
children run, and writes them with its slots (its concurrency; none while it drains) once a
second, so the pools' scaling signal (``tasks.producer.scaling``) sees what the queues' lists cannot: the
jobs already taken from them. The record goes as the worker stops.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis
from celery import bootsteps
from celery.worker import state as worker_state

from mediafarm.config.settings import get_settings
from mediafarm.tasks.wire import worker_load
from mediafarm.workers import fork_gate, publishing

log = logging.getLogger("mediafarm.load")


def held(state: Any = worker_state) -> tuple[int, int]:
    """(reserved, running): the jobs this process holds and has not started, and those started.

    Celery keeps a request in ``reserved_requests`` from its delivery to its end, in
    ``active_requests`` from a child's start to its end, and a countdown's in ``scheduled_requests``
    until it is due; a job that ended well whose ack is on its way (``successful_requests``) is
    done, as Celery's own ``cancel_active_requests`` counts it."""
    for _ in range(3):
        try:  # the sets are the event loop's: a copy may meet one changing, then look again
            active, reserved, scheduled = (list(state.active_requests), list(state.reserved_requests),
                                           list(state.scheduled_requests))  # fmt: skip
            break
        except RuntimeError:
            continue
    else:
        return 0, 0
    started = set(active)
    running = sum(1 for r in started if r.id not in state.successful_requests)
    waiting = {r for r in reserved if r not in started} | set(scheduled)
    return len(waiting), running


class LoadStep(bootsteps.StartStopStep):
    """Writes this worker's load record every ``worker_load.INTERVAL_S``."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self._stop = threading.Event()
        self._client: Any = None
        self._node = ""

    def start(self, worker: Any) -> None:
        self._node = worker.hostname
        self._client = redis.Redis.from_url(get_settings().backend_url, socket_timeout=1, socket_connect_timeout=1)
        fork_gate.start_thread(self._run, "farm-load", (worker,))

    def stop(self, worker: Any) -> None:
        self._stop.set()
        if self._client is not None:
            try:
                worker_load.forget(self._client, self._node)
            except Exception:  # noqa: BLE001 - a Redis away at shutdown: the record lapses in STALE_S
                pass

    def record(self, worker: Any) -> worker_load.WorkerLoad:
        reserved, running = held()
        drain = getattr(getattr(worker, "consumer", None), "farm_drain", None)
        draining = drain is not None and drain.began is not None
        slots = 0 if draining else int(worker.concurrency or 0)
        return worker_load.WorkerLoad(self._node, get_settings().pool, slots, reserved, running, draining)

    def _run(self, worker: Any) -> None:
        publishing.publish_every(self._stop, worker_load.INTERVAL_S,
                                 lambda: worker_load.write(self._client, self.record(worker)), "load", log)  # fmt: skip


def install(app: Any) -> None:
    app.steps["worker"].add(LoadStep)
