"""Handles: follow a submitted job (:class:`JobHandle`) or pipeline (:class:`PipelineHandle`).

A handle is the producer's view of a job by id: its state, progress, partial outputs, attempts,
artifacts and result, a wait with typed failures, a cancel. ``mediafarm.submit`` returns one;
``mediafarm.handle(job_id)`` makes one for a job submitted elsewhere. No torch, no model imports.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from billiard.exceptions import WorkerLostError
from celery.exceptions import ChordError, NotRegistered, TaskRevokedError
from celery.exceptions import TimeoutError as CeleryTimeout
from celery.result import AsyncResult
from pydantic import BaseModel

from mediafarm.config.settings import get_settings
from mediafarm.tasks import registry
from mediafarm.tasks.app import app
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.artifacts import ArtifactStore, missing_artifact, sha256_of
from mediafarm.tasks.wire.errors import (
    Cancelled,
    JobCancelled,
    JobFailed,
    JobRejected,
    LadderExhausted,
    NoRungLeft,
    PermanentFailure,
    ResourceFailure,
)
from mediafarm.tasks.wire.history import read_attempts
from mediafarm.tasks.wire.plan import READY, Plan, metas, read_plan, state_of
from mediafarm.tasks.wire.records import ArtifactInfo, Progress

# Failure classes (as the client rebuilds them) → what the producer gets. Sorted by class, so a
# family's own PermanentFailure subclass, sent as PermanentFailure, lands in the right place.
_FAILURES: tuple[tuple[tuple[type[BaseException], ...], type[JobFailed]], ...] = (
    # NotRegistered: a task name no worker runs (a foreign client's typo), rejected at intake.
    ((PermanentFailure, NotRegistered), JobRejected),
    ((Cancelled, TaskRevokedError), JobCancelled),
    ((NoRungLeft, ResourceFailure, WorkerLostError), LadderExhausted),
)


def part_states(plan: Plan) -> list[str]:
    """The Celery state of each part of ``plan``, in plan order (one MGET)."""
    return [state_of(m) for m in metas(app.backend, [p.job_id for p in plan.parts])]


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
        result = self._result
        state = result.state
        if state == "PENDING" and any(a.get("outcome") is None for a in read_attempts(app.backend.client, self.id)):
            return "STARTED"
        if state == "FAILURE" and isinstance(result.result, ChordError):
            return self._fan_in_state()
        return state

    def _fan_in_state(self) -> str:
        """A pipeline's fan-in job that never ran (Celery stores its ChordError as a FAILURE): REVOKED
        when every part that ended without success was cancelled, as the producer asked; else FAILURE."""
        plan = read_plan(app.backend, self.id)
        if plan is None:
            return "FAILURE"
        unsuccessful = [s for s in part_states(plan) if s in READY and s != "SUCCESS"]
        return "REVOKED" if unsuccessful and all(s == "REVOKED" for s in unsuccessful) else "FAILURE"

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

    def envelope(self) -> dict[str, Any] | None:
        """The result envelope of a job that succeeded, or None (waits for nothing)."""
        return self._envelope()

    def failure(self) -> JobFailed | None:
        """How a job that ended without success failed, as the typed failure :meth:`wait` would
        raise (``JobRejected`` ...); None while it runs or once it succeeded. Waits for nothing:
        unlike ``wait``, it never subscribes to the result, so any thread may call it."""
        result = self._result
        if result.state not in ("FAILURE", "REVOKED"):
            return None
        try:
            self._raise_failure(result)
        except JobFailed as exc:
            return exc
        return None  # pragma: no cover - _raise_failure always raises

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


@dataclass(frozen=True)
class PipelineHandle(JobHandle):
    """The handle of a pipeline: its fan-in job (``id``), with the stages of the whole.

    ``wait(on_progress=...)`` reports the parts first (``lines 3/6``, fraction counting each part
    and the fan-in job as one step each), then the fan-in job's own progress. A part that failed
    for good comes back as that part's failure (``JobRejected`` ...), its label in the reason.
    """

    def plan(self) -> Plan:
        plan = read_plan(app.backend, self.id)
        if plan is None:
            raise RuntimeError(f"no pipeline plan is stored for job {self.id} (expired, or not a pipeline)")
        return plan

    def stages(self) -> dict[str, Any]:
        """``{"parts": {"total", "done", "failed"}, "then": state}``: where the pipeline stands."""
        plan = self.plan()
        states = part_states(plan)
        return {
            "parts": {"total": len(states), "done": sum(s == "SUCCESS" for s in states),
                      "failed": sum(s in READY and s != "SUCCESS" for s in states)},
            "then": self.state(),
        }  # fmt: skip

    def cancel(self) -> None:
        """Cancel every part not finished, and the fan-in job."""
        plan = self.plan()
        for part, state in zip(plan.parts, part_states(plan), strict=True):
            if state not in READY:
                JobHandle(part.job_id, part.family).cancel()
        super().cancel()

    def _follow(self, result: AsyncResult, timeout: float | None, poll: float,
                on_progress: Callable[[Progress], Any]) -> None:  # fmt: skip
        deadline = None if timeout is None else time.monotonic() + timeout
        plan = self.plan()
        total = len(plan.parts)
        waiting = [p.job_id for p in plan.parts]
        seen: Progress | None = None
        while not result.ready():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} not finished after {timeout} s ({len(waiting)} of {total} "
                                   f"{plan.parts_stage} still running; state {result.state})")  # fmt: skip
            if waiting:
                stored = metas(app.backend, waiting)
                waiting = [i for i, m in zip(waiting, stored, strict=True) if state_of(m) not in READY]
            done = total - len(waiting)
            if waiting:
                progress = Progress(done / (total + 1), f"{plan.parts_stage} {done}/{total}")
            else:
                own = self.progress()
                fraction = (total + ((own.fraction or 0.0) if own else 0.0)) / (total + 1)
                stage = f"{plan.then_stage}" + (f" {own.stage}" if own and own.stage else "")
                progress = Progress(fraction, stage, own.media_seconds if own else None,
                                    variant=own.variant if own else "")  # fmt: skip
            if seen is None or (progress.fraction, progress.stage) != (seen.fraction, seen.stage):
                seen = progress
                on_progress(progress)
            time.sleep(poll)

    def _raise_failure(self, result: AsyncResult) -> None:
        if isinstance(result.result, ChordError):
            # The fan-in job never ran: a part failed. Raise that part's own failure.
            plan = self.plan()
            for part, state in zip(plan.parts, part_states(plan), strict=True):
                if state in READY and state != "SUCCESS":
                    try:
                        JobHandle(part.job_id, part.family)._raise_failure(AsyncResult(part.job_id, app=app))
                    except JobFailed as exc:
                        reason = f"{part.label} ({part.job_id}) failed, so {plan.then_stage} never ran: {exc.reason}"
                        raise type(exc)(self.id, reason, exc.attempts) from None
        super()._raise_failure(result)
