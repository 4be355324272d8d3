"""The producer API: submit a job, get a handle, follow it, fetch what it made. No torch, no model imports.

    from mediafarm import submit
    job = submit("vad", media="/media/cam/2026-11-29.mp4")    # InvalidRequest at once if malformed
    envelope = job.wait(timeout=600, on_progress=print)      # raises JobRejected / LadderExhausted / ...
    envelope["output"]["spans"], envelope["variant"], envelope["attempts"], envelope["artifacts"]

This is the one way to submit. Task names are the wire contract (``FamilySpec.task_name``), for
producers that send with a plain Celery client.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from billiard.exceptions import WorkerLostError
from celery.exceptions import NotRegistered, TaskRevokedError
from celery.exceptions import TimeoutError as CeleryTimeout
from celery.result import AsyncResult
from pydantic import BaseModel

from mediafarm.config.settings import get_settings
from mediafarm.tasks import families as registry
from mediafarm.tasks import keys
from mediafarm.tasks.app import app
from mediafarm.tasks.artifacts import ArtifactStore, UnsafeArtifactName, missing_artifact, sha256_of
from mediafarm.tasks.errors import (
    Cancelled,
    JobCancelled,
    JobFailed,
    JobRejected,
    LadderExhausted,
    NoRungLeft,
    PermanentFailure,
    ResourceFailure,
)
from mediafarm.tasks.family import FamilySpec
from mediafarm.tasks.history import read_attempts
from mediafarm.tasks.records import ArtifactInfo, Progress

# Failure classes (as the client rebuilds them) → what the producer gets. Sorted by class, so a
# family's own PermanentFailure subclass, sent as PermanentFailure, lands in the right place.
_FAILURES: tuple[tuple[tuple[type[BaseException], ...], type[JobFailed]], ...] = (
    # NotRegistered: a task name no worker runs (a foreign client's typo), rejected at intake.
    ((PermanentFailure, NotRegistered), JobRejected),
    ((Cancelled, TaskRevokedError), JobCancelled),
    ((NoRungLeft, ResourceFailure, WorkerLostError), LadderExhausted),
)


def known_families() -> Mapping[str, FamilySpec]:
    """The job families this farm knows, by name."""
    return registry.load()


@dataclass(frozen=True)
class JobHandle:
    """A submitted job. Attributes: ``id`` (the Celery task id, stable across rungs), ``family``."""

    id: str
    family: str

    @property
    def _result(self) -> AsyncResult:
        return AsyncResult(self.id, app=app)

    def state(self) -> str:
        """PENDING, STARTED, RETRY (moving down a rung), SUCCESS, FAILURE or REVOKED.

        Farm tasks do not write Celery's STARTED state (``FarmTask.track_started``); a job whose
        attempt is running is STARTED.
        """
        state = self._result.state
        if state == "PENDING" and any(a.get("outcome") is None for a in read_attempts(app.backend.client, self.id)):
            return "STARTED"
        return state

    def attempts(self) -> list[dict[str, Any]]:
        """Every attempt so far, oldest first (see ``records.Attempt``)."""
        return read_attempts(app.backend.client, self.id, self._envelope())

    def progress(self) -> Progress | None:
        """The running attempt's latest progress, or None before the engine first reports."""
        raw = app.backend.client.get(keys.progress(self.id))
        return Progress.from_json(json.loads(raw)) if raw else None

    def partials(self) -> list[Any]:
        """What the running (or finished) attempt of a streaming engine has yielded so far, in order."""
        return [json.loads(r) for r in app.backend.client.lrange(keys.partials(self.id), 0, -1)]

    def artifacts(self) -> list[ArtifactInfo]:
        """The files the job made (empty until it succeeds)."""
        envelope = self._envelope() or {}
        return [ArtifactInfo.from_json(a) for a in envelope.get("artifacts", [])]

    def download(self, name: str, dest: Path | str) -> Path:
        """Copy artifact ``name`` to ``dest`` (a file, or a folder to put it in); checks its sha256.

        Artifacts live in ``FARM_STORAGE_DIR`` on the workers; a producer reads them through the
        same shared volume (``docker-compose.yml`` mounts one), so its FARM_STORAGE_DIR must name it.
        """
        info = next((a for a in self.artifacts() if a.name == name), None)
        if info is None:
            raise FileNotFoundError(f"job {self.id} has no artifact {name!r}")
        storage_dir = get_settings().storage_dir
        source = ArtifactStore(storage_dir, self.id).path(name)
        if not source.is_file():
            raise FileNotFoundError(missing_artifact(self.id, info, source, storage_dir))
        dest = Path(dest)
        target = dest / Path(name).name if dest.is_dir() else dest
        target.parent.mkdir(parents=True, exist_ok=True)
        # Copied beside the target and checked before it replaces anything that is already there.
        temp = target.with_name(f".{target.name}.download-{os.getpid()}")
        try:
            shutil.copyfile(source, temp)
            if sha256_of(temp) != info.sha256:
                raise OSError(f"artifact {name!r} of job {self.id} does not match its sha256: changed since it ended")
            os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)
        return target

    def output(self) -> BaseModel:
        """The finished job's output as its family's result model (waits for nothing: SUCCESS only)."""
        envelope = self._envelope()
        if envelope is None:
            raise RuntimeError(f"job {self.id} has not succeeded (state {self.state()})")
        return registry.get(envelope["family"]).parse_result(envelope["output"])

    def cancel(self) -> None:
        """Stop the job; it ends as ``JobCancelled``. A queued one is revoked (a worker that missed
        the revoke runs it but discards its output); a running one stops at its engine's next
        cancellation check (VAD: every 10 s of media). An engine that never checks runs to its end."""
        ttl = int(app.conf.result_expires)
        app.backend.client.set(keys.cancel(self.id), "1", ex=ttl)
        app.control.revoke(self.id)

    def wait(
        self, timeout: float | None = None, poll: float = 0.1, on_progress: Callable[[Progress], Any] | None = None
    ) -> dict[str, Any]:
        """Block until the job ends; return its result envelope or raise a typed failure.

        ``on_progress`` is called with each new :class:`Progress` while the job runs.

        Raises:
            TimeoutError: not finished within ``timeout`` seconds (the job goes on).
            JobRejected: bad input or options.
            JobCancelled: cancelled.
            LadderExhausted: every rung failed for lack of resources.
            JobFailed: any other failure.
        """
        result = self._result
        if on_progress is None:
            try:
                result.get(timeout=timeout, interval=poll, propagate=False, disable_sync_subtasks=False)
            except CeleryTimeout:
                raise TimeoutError(f"job {self.id} not finished after {timeout} s (state {result.state})") from None
        else:
            self._follow(result, timeout, poll, on_progress)
        if result.successful():
            return result.result
        self._raise_failure(result)
        raise AssertionError("unreachable")  # pragma: no cover

    def _follow(
        self, result: AsyncResult, timeout: float | None, poll: float, on_progress: Callable[[Progress], Any]
    ) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        seen: Progress | None = None
        while not result.ready():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} not finished after {timeout} s (state {result.state})")
            progress = self.progress()
            if progress is not None and progress != seen:
                seen = progress
                on_progress(progress)
            time.sleep(poll)

    def _envelope(self) -> dict[str, Any] | None:
        result = self._result
        if result.state != "SUCCESS" or not isinstance(result.result, dict):
            return None
        return result.result

    def _raise_failure(self, result: AsyncResult) -> None:
        exc = result.result
        reason = f"{type(exc).__name__}: {exc}"
        attempts = self.attempts()
        for classes, failure in _FAILURES:
            if isinstance(exc, classes):
                raise failure(self.id, reason, attempts)
        raise JobFailed(self.id, reason, attempts)


def submit(family: str, *, queue: str | None = None, job_id: str | None = None, **fields: Any) -> JobHandle:
    """Send a job of ``family`` with its request fields as keywords (JSON-safe).

    The fields are checked against the family's request model before anything is sent:
    ``ValueError`` for an unknown family, ``InvalidRequest`` (a ValueError) naming each field
    that does not fit. ``queue`` overrides the family queue, e.g. ``gpu0.vad`` for GPU affinity.

    ``job_id`` is an idempotency key: the first submit with it sends the job, every later one
    (racing or not) returns that job's handle and sends nothing, so the job never runs twice for
    it. Reusing a key for another family or other fields raises ValueError. Keys are remembered
    as long as results (``result_expires``). Without ``job_id`` every job gets a fresh UUID.

    A family whose request has ``as_pipeline`` (``dialogue``) is sent as its plan: several jobs
    and a fan-in job (``tasks.pipeline``); the handle returned is a ``PipelineHandle``.
    """
    spec = registry.get(family)
    request = spec.parse_request(fields)
    kwargs = request.model_dump(mode="json", exclude_unset=True, by_alias=True)
    as_pipeline = getattr(request, "as_pipeline", None)
    if job_id is not None:
        try:
            ArtifactStore(get_settings().storage_dir, job_id)
        except UnsafeArtifactName as exc:
            raise ValueError(str(exc)) from None
        fingerprint = json.dumps({"family": spec.name, "fields": kwargs}, sort_keys=True)
        key = keys.submitted(job_id)
        if not app.backend.client.set(key, fingerprint, nx=True, ex=int(app.conf.result_expires)):
            first = app.backend.client.get(key)
            if first is not None and first.decode() != fingerprint:
                raise ValueError(f"job id {job_id!r} was already submitted with another family or other fields")
            if callable(as_pipeline):
                from mediafarm.tasks.pipeline import PipelineHandle

                return PipelineHandle(id=job_id, family=spec.name)
            return JobHandle(id=job_id, family=spec.name)
    try:
        if callable(as_pipeline):
            # A pipeline family (the dialogue): its parts and fan-in job go as one chord, the
            # handle is the fan-in job's. Imported here: tasks.pipeline imports this module.
            from mediafarm.tasks.pipeline import send_plan

            return send_plan(as_pipeline(job_id or str(uuid.uuid4())), queue=queue)
        # Explicit None: the worker's limits rule. Otherwise Celery stamps the limits of a task
        # registered in this process onto the message, and those override the worker's.
        async_result = app.send_task(
            spec.task_name, kwargs=kwargs, task_id=job_id, queue=queue or spec.queue,
            soft_time_limit=None, time_limit=None,
        )  # fmt: skip
    except BaseException:
        if job_id is not None:  # nothing was sent: the key must not stand for a job that never was
            app.backend.client.delete(keys.submitted(job_id))
        raise
    return JobHandle(id=async_result.id, family=spec.name)


def handle(job_id: str, family: str = "") -> JobHandle:
    """A handle for a job submitted elsewhere (by id)."""
    return JobHandle(id=job_id, family=family)
