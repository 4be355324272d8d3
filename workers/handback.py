"""The heartbeat of a Redis worker, and the handback of a silent peer's jobs (``tasks.runtime.handback``).

A thread of the worker's main process beats once a second (the Redis server's clock, in
``keys.heartbeats``) and, in the same round trip, reads every worker's last beat. A peer silent
past ``FARM_HANDBACK_GRACE`` is dead, paused or cut off: the jobs it was running go back to their
queue at once rather than after the visibility timeout. The main process beats while its children
work, so a worker merely busy, however long its jobs, is never passed over; the grace is several
beats long so a slow beat or two (a loaded host, a Redis failover) is not silence.

A worker started under a node name whose beat is still in the hash (its predecessor under that
name died: a container brought back by its restart policy keeps its hostname) waits a few beats
without beating; if no other process renewed that beat, it hands back the jobs its predecessor left
open before it beats itself (``tasks.runtime.handback.predecessor``).

RabbitMQ redelivers a dead consumer's messages itself: there the step does nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis
from celery import bootsteps
from kombu import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from mediafarm.config.settings import get_settings
from mediafarm.tasks.runtime import handback
from mediafarm.workers import fork_gate

log = logging.getLogger("mediafarm.handback")
INTERVAL_S = 1.0
# A peer is looked for this long after it fell silent; a job of its found later (its attempt's
# record came late) waits for the visibility timeout as before.
LOOK_FOR_S = 120.0
# A live process beating under this node name renews its beat within this long.
PREDECESSOR_WAIT_S = 3 * INTERVAL_S


class HandbackStep(bootsteps.StartStopStep):
    """Beats, and hands back the jobs of peers silent past the grace."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        settings = get_settings()
        self.grace = settings.handback_grace
        self.enabled = bool(self.grace) and not settings.broker_is_rabbitmq
        self._stop = threading.Event()
        self._client: Any = None
        self._node = ""

    def start(self, worker: Any) -> None:
        if not self.enabled:
            return
        settings = get_settings()
        self._node = worker.hostname
        self._started = time.time()
        self._client = redis.Redis.from_url(settings.backend_url, socket_timeout=1, socket_connect_timeout=1)
        fork_gate.start_thread(self._run, "farm-handback", (worker.app,))

    def stop(self, worker: Any) -> None:
        self._stop.set()
        if self.enabled and self._client is not None:
            try:
                handback.forget(self._client, self._node)
            except Exception:  # noqa: BLE001 - a Redis away at shutdown: the field lapses in an hour
                pass

    def _run(self, app: Any) -> None:
        settings = get_settings()
        options = {**(app.conf.broker_transport_options or {}), "socket_timeout": 1, "socket_connect_timeout": 1}
        connection = Connection(settings.broker_url, transport_options=options)
        worker: handback.Handback | None = None
        failing = False
        try:
            self._hand_back_predecessor(app, connection)
        except Exception:  # noqa: BLE001 - a Redis away at start: its jobs wait for the visibility timeout
            log.warning("handback of a predecessor's jobs failed", exc_info=True)
        while not self._stop.is_set():
            with fork_gate.held():  # one beat, and at most one handback: Redis calls and log lines
                try:
                    now, beats = handback.beat(self._client, self._node)
                    dead = {
                        node: s for node, s in handback.silent(now, beats, self.grace, self._node).items()
                        if s < self.grace + LOOK_FOR_S
                    }  # fmt: skip
                    if dead:
                        if worker is None:
                            worker = handback.Handback(
                                self._client, connection.default_channel, app.backend.get_key_for_task,
                                int(app.conf.result_expires), settings.transient_retries,
                            )  # fmt: skip
                        worker.run(dead)
                    failing = False
                except (RedisConnectionError, RedisTimeoutError, OSError, *connection.connection_errors) as exc:
                    if not failing:  # one line per outage
                        log.warning("heartbeat: Redis unreachable: %s", exc)
                    failing = True
                    worker = None
                    connection.close()
                except Exception:  # a bug: its traceback, once until a beat goes out
                    if not failing:
                        log.warning("heartbeat or handback failed", exc_info=True)
                    failing = True
            self._stop.wait(INTERVAL_S)


    def _hand_back_predecessor(self, app: Any, connection: Any) -> None:
        """The jobs a dead predecessor under this node name left open, back to their queue."""
        settings = get_settings()
        with fork_gate.held():
            before = handback.last_beat(self._client, self._node)
        if before is None or self._stop.wait(PREDECESSOR_WAIT_S):
            return
        with fork_gate.held():
            silence = handback.predecessor(self._client, self._node, before)
            if silence is None:
                log.warning("another live worker beats as %s: its jobs are not handed back", self._node)
                return
            handed = handback.Handback(
                self._client, connection.default_channel, app.backend.get_key_for_task,
                int(app.conf.result_expires), settings.transient_retries,
            ).run({self._node: silence}, started_before=self._started)  # fmt: skip
            log.warning("%s started after a predecessor of its name died (silent %.0f s): %d job(s) handed back",
                        self._node, silence, len(handed))  # fmt: skip


def install(app: Any) -> None:
    app.steps["worker"].add(HandbackStep)
