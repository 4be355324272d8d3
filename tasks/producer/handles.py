"""Handles: follow a submitted job (:class:`JobHandle`) or pipeline (:class:`PipelineHandle`).

A handle is the producer's view of a job by id: its state, progress, partial outputs, attempts,
artifacts and result, a wait with typed failures, a cancel. ``mediafarm.submit`` returns one;
``mediafarm.handle(job_id)`` makes one for a job submitted elsewhere, and :func:`find_job` one for
an id only if the farm knows it. It is the producer side's one reader of a job's keys: the
gateway's followers (SSE, streamed speech, rooms, live subtitles) read a job through it, with
:meth:`JobHandle.signature` to tell cheaply whether anything moved and :meth:`JobHandle.snapshot`
to read it whole (``tasks.producer.job_feed`` turns snapshots into a follower's events). No torch,
no model imports.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
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
from mediafarm.tasks.producer.webhooks import Outbox
from mediafarm.tasks.wire import keys, object_store
from mediafarm.tasks.wire.artifacts import MAX_JOB_ID, ArtifactStore, announced_file, missing_artifact, sha256_of
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
from mediafarm.tasks.wire.records import ArtifactInfo, Progress, envelope_in_current_names, in_current_names
from mediafarm.tasks.wire.trace import Trace

# How long ``JobHandle.wait`` trusts the result's publish before it reads the stored state again.
REREAD_S = 5.0

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


def find_job(job_id: str) -> JobHandle | None:
    """The job called ``job_id`` if the farm knows it: submitted with an id (every gateway job is),
    started, or ended and not yet expired; a :class:`PipelineHandle` for a pipeline. None for an id
    the farm never saw (Celery calls any such id PENDING forever). One Redis round trip."""
    if not job_id or len(job_id) > MAX_JOB_ID:
        return None
    pipe = app.backend.client.pipeline(transaction=False)
    pipe.get(keys.submitted(job_id))
    pipe.exists(keys.pipeline_plan(job_id))
    pipe.exists(keys.history(job_id), app.backend.get_key_for_task(job_id))
    submitted, is_pipeline, known = pipe.execute()
    if not (submitted or is_pipeline or known):
        return None
    family = json.loads(submitted).get("family", "") if submitted else ""
    return (PipelineHandle if is_pipeline else JobHandle)(id=job_id, family=family)


# A failure's kind as followers tell it (``{"kind", "reason"}``); tried in this order: a subclass
# before JobFailed itself.
_FAILURE_KINDS: tuple[tuple[type[JobFailed], str], ...] = (
    (JobRejected, "rejected"),
    (JobCancelled, "cancelled"),
    (LadderExhausted, "ladder_exhausted"),
    (JobFailed, "failed"),
)


@dataclass(frozen=True)
class Snapshot:
    """A job as read at one moment (:meth:`JobHandle.snapshot`): the one view every follower reads.

    Attributes:
        state: ``JobHandle.state()``, read first: once terminal, what is read after it is final.
        attempts: The history, read with the partial outputs in one transaction (an attempt that
            has ended had published all of them).
        partials: The newest attempt's partial outputs.
        progress: The running attempt's progress (JSON), or None.
        stages: A pipeline's stages (``PipelineHandle.stages()``), None for a single job.
        envelope: The result envelope once SUCCESS.
        failure: ``{"kind", "reason"}`` once the job failed or was cancelled.
    """

    state: str
    attempts: tuple[dict[str, Any], ...]
    partials: tuple[Any, ...]
    progress: dict[str, Any] | None = None
    stages: dict[str, Any] | None = None
    envelope: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None

    @property
    def owner(self) -> int:
        """The attempt the partial outputs belong to: the newest one."""
        return max(len(self.attempts) - 1, 0)

    @property
    def settled(self) -> bool:
        """Has the job ended with its history complete? (A cancelled job can read REVOKED a
        moment before its running attempt is recorded as cancelled.)"""
        return self.state in READY and not (self.attempts and self.attempts[-1].get("outcome") is None)


def describe_failure(failure: JobFailed | None) -> dict[str, Any] | None:
    """A typed failure as followers tell it: ``{"kind": "rejected" | "cancelled" | "ladder_exhausted"
    | "failed", "reason"}``; None for none."""
    if failure is None:
        return None
    kind = next(name for cls, name in _FAILURE_KINDS if isinstance(failure, cls))
    return {"kind": kind, "reason": failure.reason}


@dataclass(frozen=True)
class JobHandle:
    """A submitted job. Attributes: ``id`` (the Celery task id, stable across rungs), ``family``;
    ``trace``: the submit's side of the job's trace (``tasks.wire.trace``) on the handle ``submit``
    returned, else None."""

    id: str
    family: str
    trace: Trace | None = field(default=None, compare=False, repr=False)

    @property
    def _result(self) -> AsyncResult:
        return AsyncResult(self.id, app=app)

    def state(self) -> str:
        """PENDING, STARTED, RETRY (moving down a rung), SUCCESS, FAILURE or REVOKED.

        Farm tasks do not write Celery's STARTED state (``FarmTask.track_started``); a job whose
        attempt is running is STARTED.
        """
        result = self._result
        stored = result.state
        return self._state_of(result, stored, read_attempts(app.backend.client, self.id) if stored == "PENDING" else ())

    def _state_of(self, result: AsyncResult, stored: str, attempts: Iterable[dict[str, Any]]) -> str:
        """The job's state from Celery's ``stored`` one (of ``result``) and its ``attempts``."""
        if stored == "PENDING" and any(a.get("outcome") is None for a in attempts):
            return "STARTED"
        if stored == "FAILURE" and isinstance(result.result, ChordError):
            return self._fan_in_state()
        return stored

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

    def attempt_count(self) -> int:
        """How many attempts have started (a new one means the job moved on: a retry, a lower rung)."""
        return int(app.backend.client.llen(keys.history(self.id)))

    def snapshot(self, detail: bool = True) -> Snapshot:
        """The job now (:class:`Snapshot`): the state first, then the attempts and the partial
        outputs in one Redis transaction, so the partials are those of the newest attempt listed
        (an attempt's record clears the ones before in the same step, ``tasks.wire.history``).
        ``detail``: also the progress, a pipeline's stages, and the envelope or failure once it
        ended; without it, a follower that needs only the chunks saves those reads."""
        result = self._result
        stored = result.state  # read first; the history read after it tells a running job (state())
        pipe = app.backend.client.pipeline(transaction=True)
        pipe.lrange(keys.history(self.id), 0, -1)
        pipe.lrange(keys.partials(self.id), 0, -1)
        history, partials = pipe.execute()
        logged = [in_current_names(json.loads(a)) for a in history]
        state = self._state_of(result, stored, logged)
        outputs = tuple(json.loads(p) for p in partials)
        envelope = self._envelope(result) if state == "SUCCESS" else None
        # A success's attempts are its envelope's (read_attempts): the history expires on its own.
        kept = envelope.get("attempts") if envelope else None
        attempts = tuple(kept) if isinstance(kept, list) else tuple(logged)
        if not detail:
            return Snapshot(state, attempts, outputs)
        progress = self.progress()
        stages = None
        if isinstance(self, PipelineHandle):
            try:
                stages = self.stages()
            except RuntimeError:  # the plan expired with the job's result
                stages = None
        failure = describe_failure(self.failure()) if state in READY else None
        return Snapshot(state, attempts, outputs, progress.to_json() if progress else None, stages, envelope, failure)

    def signature(self) -> tuple[int, int, int]:
        """What changes whenever the job moves, in one round trip: how many partial outputs and
        attempts it has, and the size of its stored state. Equal signatures mean nothing was
        appended and the state is the same; an attempt's outcome and the progress are written in
        place, so a follower reads the job in full now and then anyway (``job_feed.JobWatch``)."""
        pipe = app.backend.client.pipeline(transaction=False)
        pipe.llen(keys.partials(self.id))
        pipe.llen(keys.history(self.id))
        pipe.strlen(app.backend.get_key_for_task(self.id))
        partials, attempts, stored = pipe.execute()
        return int(partials), int(attempts), int(stored)

    def partial_file(self, partial: dict[str, Any], attempts: int | None,
                     storage_dir: Path | None = None) -> bytes | None:  # fmt: skip
        """The bytes of the file a partial output announces (a TTS chunk's ``artifact``, a live
        subtitle ``segment``), if they are still the announcing attempt's: None once the job has
        more than ``attempts`` attempts (None: whichever attempt's).

        Read from the object store where the partial output names the file's object (``url``:
        the farm keeps its files in one, and the attempt copied it there before announcing it);
        else from the job's folder. A newer attempt clears that folder only after its record is
        written (``tasks.runtime.base``), so a file read while the job still has the attempts the
        partial output was seen with is that attempt's own; the count is read after the file, for
        that. FileNotFoundError (or another OSError: StoreUnavailable, after
        ``STORE_READ_WAIT_S`` of a store away) if the file is not there while no newer attempt
        began: ``storage_dir`` (default ``FARM_STORAGE_DIR``) is not the workers' shared folder,
        or the object is gone. UnsafeArtifactName for a name that leaves
        the job's folder.
        """
        url = partial.get("url")
        try:
            if isinstance(url, str) and url:
                data: bytes | None = _read_object(url)
            else:
                folder = ArtifactStore(storage_dir or get_settings().storage_dir, self.id)
                data = folder.path(announced_file(partial) or "").read_bytes()
            unread: OSError | None = None
        except OSError as exc:
            data, unread = None, exc
        if attempts is not None and self.attempt_count() != attempts:
            return None
        if unread is not None:
            raise unread
        return data

    def webhook_deliveries(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The job's webhook deliveries: every try made (status, latency) and the events still due."""
        outbox = Outbox(app.backend.client)
        return outbox.tries(self.id), outbox.pending(self.id)

    def artifacts(self) -> list[ArtifactInfo]:
        """The files the job made (empty until it succeeds)."""
        envelope = self._envelope() or {}
        return [ArtifactInfo.from_json(a) for a in envelope.get("artifacts", [])]

    def download(self, name: str, dest: Path | str) -> Path:
        """Copy artifact ``name`` to ``dest`` (a file, or a folder to put it in); checks its sha256.

        An artifact kept in the object store (FARM_STORAGE_URL, ``tasks.wire.object_store``) is
        read from there: no folder shared with the workers. Otherwise from ``FARM_STORAGE_DIR``,
        which must name the workers' shared folder (``docker-compose.yml`` mounts one).
        StoreUnavailable (an OSError) names the store when it cannot be reached.
        """
        info = self._artifact(name)
        dest = Path(dest)
        target = dest / Path(name).name if dest.is_dir() else dest
        source = self._artifact_source(info)
        target.parent.mkdir(parents=True, exist_ok=True)
        # Copied beside the target and checked before it replaces anything that is already there.
        temp = target.with_name(f".{target.name}.download-{os.getpid()}")
        try:
            if source is None:
                bucket, key = object_store.split_url(str(info.url))
                object_store.store_at().download(bucket, key, temp)
            else:
                shutil.copyfile(source, temp)
            self._check(info, sha256_of(temp))
            os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)
        return target

    def read_artifact(self, artifact: str | ArtifactInfo, storage_dir: Path | None = None) -> bytes:
        """An artifact's bytes (by name, or its record from the envelope), from the object store or
        the storage folder (``storage_dir``, default FARM_STORAGE_DIR) as :meth:`download` reads it."""
        info = artifact if isinstance(artifact, ArtifactInfo) else self._artifact(artifact)
        source = self._artifact_source(info, storage_dir)
        if source is None:
            data = object_store.store_at().read(*object_store.split_url(str(info.url)))
        else:
            data = source.read_bytes()
        self._check(info, hashlib.sha256(data).hexdigest())
        return data

    def _artifact(self, name: str) -> ArtifactInfo:
        info = next((a for a in self.artifacts() if a.name == name), None)
        if info is None:
            raise FileNotFoundError(f"job {self.id} has no artifact {name!r}")
        return info

    def _artifact_source(self, info: ArtifactInfo, storage_dir: Path | None = None) -> Path | None:
        """The file to read ``info`` from in the storage folder; None: read its object."""
        if info.url:
            return None
        storage_dir = storage_dir or get_settings().storage_dir
        source = ArtifactStore(storage_dir, self.id).path(info.name)
        if not source.is_file():
            raise FileNotFoundError(missing_artifact(self.id, info, source, storage_dir))
        return source

    def _check(self, info: ArtifactInfo, digest: str) -> None:
        """OSError when what was read (its sha256, ``digest``) is not what the job made."""
        if digest != info.sha256:
            raise OSError(f"artifact {info.name!r} of job {self.id} does not match its sha256: changed since it ended")

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
            self._wait_for_result(result, timeout, poll)
        else:
            self._follow(result, timeout, poll, on_progress)
        if result.successful():
            return envelope_in_current_names(result.result)
        self._raise_failure(result)
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait_for_result(self, result: AsyncResult, timeout: float | None, poll: float) -> None:
        """Celery's wait (subscribe to the result, read it once, then wait for its publish), in
        slices of :data:`REREAD_S` that each read the stored state again: a publish the
        subscription missed (its connection was down as the result went out, or the SUBSCRIBE
        reached Redis after the GET) costs at most one slice, never the whole wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = REREAD_S if deadline is None else min(REREAD_S, max(0.0, deadline - time.monotonic()))
            try:
                result.get(timeout=left, interval=poll, propagate=False, disable_sync_subtasks=False)
                return
            except CeleryTimeout:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"job {self.id} not finished after {timeout} s (state {result.state})") \
                        from None  # fmt: skip

    def _follow(
        self, result: AsyncResult, timeout: float | None, poll: float, on_progress: Callable[[Progress], Any]
    ) -> None:
        from mediafarm.tasks.producer.bells import bell  # a thread of its own: only for who follows

        deadline = None if timeout is None else time.monotonic() + timeout
        seen: Progress | None = None
        with bell(self.id, kinds=("progress",)) as ring:  # before the first look: progress and the end ring it
            while not result.ready():
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {self.id} not finished after {timeout} s (state {result.state})")
                progress = self.progress()
                if progress is not None and progress != seen:
                    seen = progress
                    on_progress(progress)
                ring.wait(poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic())))

    def _envelope(self, result: AsyncResult | None = None) -> dict[str, Any] | None:
        result = self._result if result is None else result
        if result.state != "SUCCESS" or not isinstance(result.result, dict):
            return None
        return envelope_in_current_names(result.result)  # stored by this release or the one before

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
                                    own.attempt if own else 0, own.rung_index if own else 0,
                                    own.rung if own else "")  # fmt: skip
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


# Seconds a reader of a partial output's object waits out a store that cannot be reached (the
# worker that wrote it waits up to two minutes for the same store: a blip must not end a stream).
STORE_READ_WAIT_S = 10.0


def _read_object(url: str) -> bytes:
    deadline, pause = time.monotonic() + STORE_READ_WAIT_S, 0.2
    while True:
        try:
            return object_store.store_at().read(*object_store.split_url(url))
        except object_store.StoreUnavailable:
            if time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 2.0)
