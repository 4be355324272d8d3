"""The producer API: submit a job, get a handle, wait for its result. No torch, no model imports.

    from tasks.client import submit
    handle = submit("vad", media="/media/cam/2026-11-29.mp4")
    envelope = handle.wait(timeout=600)       # raises JobRejected / LadderExhausted / JobFailed
    envelope["output"]["spans"], envelope["variant"], envelope["attempts"]

This is the one way to submit. The task names are stable too (``config.queues.TASK_NAMES``),
for producers that send with a plain Celery client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery.exceptions import TimeoutError as CeleryTimeout
from celery.result import AsyncResult

from config.queues import TASK_NAMES, Family
from tasks.app import app
from tasks.errors import JobFailed, JobRejected, LadderExhausted
from tasks.history import read_attempts

# Failures that mean "the input or the call was wrong": retrying would fail the same way.
_REJECTED = {"PermanentFailure", "MediaNotFound", "MediaOutsideRoots", "UnreadableMedia", "TypeError"}
# Failures that mean "it ran out of resources on every rung".
_EXHAUSTED = {"NoRungLeft", "ResourceFailure", "WorkerLostError"}


@dataclass(frozen=True)
class JobHandle:
    """A submitted job. Attributes: ``id`` (the Celery task id, stable across rungs), ``family``."""

    id: str
    family: str

    @property
    def _result(self) -> AsyncResult:
        return AsyncResult(self.id, app=app)

    def state(self) -> str:
        """PENDING, STARTED, RETRY (moving down a rung), SUCCESS or FAILURE.

        Farm tasks do not write Celery's STARTED state (``FarmTask.track_started``); a job whose
        attempt is running is STARTED.
        """
        state = self._result.state
        if state == "PENDING" and any(a.get("outcome") is None for a in read_attempts(app.backend.client, self.id)):
            return "STARTED"
        return state

    def attempts(self) -> list[dict[str, Any]]:
        """Every attempt so far, oldest first (see ``tasks.history.Attempt``)."""
        result = self._result
        envelope = result.result if result.state == "SUCCESS" else None
        return read_attempts(app.backend.client, self.id, envelope if isinstance(envelope, dict) else None)

    def wait(self, timeout: float | None = None, poll: float = 0.1) -> dict[str, Any]:
        """Block until the job ends; return its result envelope or raise a typed failure.

        Raises:
            TimeoutError: not finished within ``timeout`` seconds (the job goes on).
            JobRejected: bad input or options.
            LadderExhausted: every rung failed for lack of resources.
            JobFailed: any other failure.
        """
        result = self._result
        try:
            result.get(timeout=timeout, interval=poll, propagate=False, disable_sync_subtasks=False)
        except CeleryTimeout:
            raise TimeoutError(f"job {self.id} not finished after {timeout} s (state {result.state})") from None
        if result.successful():
            return result.result
        self._raise_failure(result)
        raise AssertionError("unreachable")  # pragma: no cover

    def _raise_failure(self, result: AsyncResult) -> None:
        exc = result.result
        name = type(exc).__name__
        reason = f"{name}: {exc}"
        attempts = self.attempts()
        if name in _REJECTED:
            raise JobRejected(self.id, reason, attempts)
        if name in _EXHAUSTED:
            raise LadderExhausted(self.id, reason, attempts)
        raise JobFailed(self.id, reason, attempts)


def submit(family: str, *, queue: str | None = None, **job: Any) -> JobHandle:
    """Send a job of ``family`` (vad, yolo, tts, subtitle) with JSON-safe keyword arguments.

    ``queue`` overrides the family queue, e.g. ``gpu0.tts`` for GPU affinity.
    """
    try:
        fam = Family(family)
    except ValueError:
        raise ValueError(f"unknown job family {family!r}; one of {[f.value for f in Family]}") from None
    options: dict[str, Any] = {}
    if queue is not None:
        options["queue"] = queue
    # Explicit None: the worker's limits rule. Otherwise Celery stamps the limits of a task that
    # happens to be registered in this process onto the message, and those override the worker's.
    async_result = app.send_task(TASK_NAMES[fam], kwargs=job, soft_time_limit=None, time_limit=None, **options)
    return JobHandle(id=async_result.id, family=fam.value)


def handle(job_id: str, family: str = "") -> JobHandle:
    """A handle for a job submitted elsewhere (by id)."""
    return JobHandle(id=job_id, family=family)
