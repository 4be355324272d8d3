"""The graceful drain of a worker: ``farm drain WORKER``, and SIGTERM (an orchestrator's stop).

Celery's own stops do not fit an orchestrator. Its warm shutdown (SIGTERM) waits for running jobs
without end, so Kubernetes SIGKILLs the pod when its grace period is up and the jobs wait for the
handback or the visibility timeout; its cold shutdown (SIGQUIT) waits the whole
``worker_soft_shutdown_timeout`` whenever a job runs, even one that ends a second later, and exits 1.
A drain:

1. stops consuming every queue (deselected as well, so a reconnect to the broker does not consume
   them again) and hands each message this worker holds but has not started (a retry waiting out its
   countdown) back to its queue at once;
2. waits for the running jobs, up to ``FARM_DRAIN_SECONDS``, and goes on as soon as none runs;
3. hands each job still running back: writes why where its next attempt reads it (the kill record
   of ``tasks.wire.history``: the attempt is settled ``worker_lost``, cause ``drained``, not counted
   against the rung nor against the job's budget of lost workers), ends its child and requeues its
   message now. The job's checkpoint stays in its folder: the next attempt, on another worker,
   resumes from it on the same rung;
4. stops the worker (a warm stop with nothing left to wait for): exit status 0.

Everything runs on the worker's event loop, where Celery runs its own ``cancel_consumer``: the remote
control command is served there, and the SIGTERM handler only writes a byte to a pipe the loop reads.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

from celery import bootsteps
from celery.platforms import EX_OK
from celery.platforms import signals as platform_signals
from celery.worker import state as worker_state
from celery.worker.control import control_command

from mediafarm.config.settings import get_settings
from mediafarm.tasks.wire.history import record_kill
from mediafarm.tasks.wire.records import KillRecord, Outcome

log = logging.getLogger("mediafarm.drain")
# How often the loop looks whether the running jobs have ended.
TICK_S = 0.2
# The control command's name (``farm drain`` broadcasts it).
COMMAND = "farm_drain"


class Drain:
    """One worker's drain, driven from its event loop. ``consumer`` is Celery's worker consumer."""

    def __init__(self, consumer: Any, seconds: float) -> None:
        self.consumer, self.seconds = consumer, seconds
        self.began: float | None = None
        self.why = ""
        self._tick_entry: Any = None

    @property
    def deadline(self) -> float | None:
        return None if self.began is None else self.began + self.seconds

    def begin(self, why: str) -> dict[str, Any]:
        """Start the drain (once; a second request is told how far the first is); a summary."""
        if self.began is not None:
            return self.summary(already=True)
        c = self.consumer
        self.began, self.why = time.monotonic(), why
        queues = sorted(q.name for q in (c.task_consumer.queues if c.task_consumer else ()))
        for name in queues:
            c.cancel_task_queue(name)
        waiting = self._hand_back_waiting()
        running = self._running()
        log.warning(
            "drain (%s): stopped consuming %s; %d waiting message(s) handed back; %d running job(s) get up to %g s",
            why, ", ".join(queues) or "no queue", len(waiting), len(running), self.seconds,
        )  # fmt: skip
        self._tick_entry = c.timer.call_repeatedly(TICK_S, self._tick)
        self._tick()
        return self.summary(already=False, queues=queues, handed_back=waiting)

    def summary(self, *, already: bool, **more: Any) -> dict[str, Any]:
        deadline = self.deadline or 0.0
        return {
            "draining": True, "already": already, "why": self.why, "deadline_s": self.seconds,
            "left_s": round(max(0.0, deadline - time.monotonic()), 1),
            "running": sorted(r.id for r in self._running()), **more,
        }  # fmt: skip

    def _running(self) -> list[Any]:
        # A job that ended well but whose ack is still on its way is done, as in Celery's own
        # cancel_active_requests: it is neither waited for nor handed back.
        return [r for r in worker_state.active_requests if r.id not in worker_state.successful_requests]

    def _hand_back_waiting(self) -> list[str]:
        """Requeue every message held for later (an ETA or countdown) that has not started."""
        handed = []
        for request in list(worker_state.scheduled_requests):
            entry = getattr(request, "_eta_timer_entry", None)
            if entry is not None:
                entry.cancel()
            worker_state.scheduled_requests.discard(request)
            request.reject(requeue=True)
            self.consumer.qos.decrement_eventually()
            handed.append(request.id)
        return handed

    def _tick(self) -> None:
        deadline = self.deadline
        running = self._running()
        if running and deadline is not None and time.monotonic() < deadline:
            return
        if self._tick_entry is not None:
            self._tick_entry.cancel()
        for request in running:
            self._hand_back(request)
        log.warning("drain (%s): done after %.1f s; the worker stops", self.why, time.monotonic() - (self.began or 0))
        # Celery's warm stop, with exit status 0: nothing is left running to wait for.
        worker_state.should_stop = EX_OK

    def _hand_back(self, request: Any) -> None:
        """Record why, end the job's child, requeue its message now."""
        app = self.consumer.app
        reason = (
            f"handed back by the drain of worker {self.consumer.hostname} ({self.why}) after its "
            f"{self.seconds:g} s deadline (FARM_DRAIN_SECONDS); the same rung runs again elsewhere"
        )
        record = KillRecord(
            pid=request.worker_pid or 0, worker=self.consumer.hostname, at=time.time(),
            outcome=Outcome.WORKER_LOST, reason=reason,
        )  # fmt: skip
        try:
            record_kill(app.backend.client, request.id, record, ttl=int(app.conf.result_expires))
        except Exception:  # noqa: BLE001 - the handback matters more: the attempt then reads as a lost worker
            log.warning("drain: could not record why job %s is handed back", request.id, exc_info=True)
        # Celery's cancel: SIGTERM to the child, the request marked cancelled (its end is then no
        # failure and sends no retry); the message goes back to its queue at once, not at close.
        request.cancel(self.consumer.pool, emit_retry=False)
        request.reject(requeue=True)
        log.warning("drain: job %s handed back to its queue (its checkpoint stays)", request.id)


class DrainStep(bootsteps.StartStopStep):
    """Gives the consumer its :class:`Drain`, and SIGTERM to it (``FARM_DRAIN_ON_SIGTERM``)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        settings = get_settings()
        self.on_sigterm = settings.drain_on_sigterm
        c.farm_drain = Drain(c, settings.drain_seconds)
        # The signal handler's only act: a byte down this pipe, which the event loop reads.
        self._read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def start(self, c: Any) -> None:
        # After Celery installed its own handlers (the worker's start), and again after a reconnect.
        if self.on_sigterm:
            platform_signals["SIGTERM"] = self._on_sigterm

    def register_with_event_loop(self, c: Any, hub: Any) -> None:
        hub.add_reader(self._read_fd, self._on_wakeup, c)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        try:
            os.write(self._write_fd, b"\0")
        except OSError:  # a full pipe already holds a wakeup
            pass

    def _on_wakeup(self, c: Any) -> None:
        try:
            os.read(self._read_fd, 64)
        except OSError:
            pass
        c.farm_drain.begin(signal.Signals.SIGTERM.name)


@control_command(name=COMMAND)
def farm_drain(state: Any) -> dict[str, Any]:
    """Drain this worker (``farm drain``): what it stopped, what runs, how long it has."""
    return state.consumer.farm_drain.begin("farm drain")


def install(app: Any) -> None:
    app.steps["consumer"].add(DrainStep)
