"""What an engine knows about the attempt it runs in: :class:`EngineContext`.

Every engine call gets one: the job id, the attempt and rung, the device, the job's artifact
folder, the models folder, the settings, a progress callback and a cancellation check, the farm's
Redis (shared state such as the TTS speakers) and, for a pipeline's fan-in job, its parts' results
(:meth:`EngineContext.collect`; their files through ``artifacts.of_job``). An engine needs nothing
else of the farm: it never imports the Celery app or builds another job's store itself. Progress and
cancellation go through Redis, throttled so that an engine may call them in its inner loop: at
most one progress write every ``PROGRESS_INTERVAL`` seconds and one cancellation read every
``CANCEL_INTERVAL``. Neither may fail a job: a Redis error there is logged and forgotten.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from redis.exceptions import RedisError

from mediafarm.config.settings import FarmSettings, get_settings
from mediafarm.tasks.runtime import liveness
from mediafarm.tasks.wire import keys, object_store
from mediafarm.tasks.wire.artifacts import INPUTS_FOLDER, ArtifactStore, announced_file, folder_name
from mediafarm.tasks.wire.checkpoint import Checkpoint, CheckpointWriter
from mediafarm.tasks.wire.errors import Cancelled, PermanentFailure, RungUnavailable, TransientFailure
from mediafarm.tasks.wire.family import missing_model
from mediafarm.tasks.wire.plan import Collected, Part, collect
from mediafarm.tasks.wire.records import Progress

log = logging.getLogger("mediafarm.progress")
# A few writes a second at most: a progress bar needs no more, and Redis round trips are the
# farm's main per-job cost (measured: docs/benchmarks/overhead.md).
PROGRESS_INTERVAL = 0.25
CANCEL_INTERVAL = 0.5
# After a Redis error, stay quiet this long: redis-py retries for seconds against a Redis that is
# down, and the engine must not stall on every report.
BACKOFF_AFTER_ERROR = 5.0
# Unix time, for what other processes compare with the attempts' own start times.
wall_clock = time.time


class JobChannel:
    """The Redis side of a running attempt: progress, partial outputs, the cancel flag.

    ``send_event`` (optional) also tells Flower: it receives the progress fields and is sent as a
    ``task-progress`` event, which Flower shows as the job's state.
    """

    def __init__(
        self, client: Any, job_id: str, ttl: int, send_event: Callable[..., None] | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.client, self.job_id, self.ttl, self.send_event = client, job_id, ttl, send_event
        self.on_progress = on_progress  # the job's webhook (``tasks.producer.webhooks.JobEvents.progress``)
        self._last_write = 0.0
        self._last_cancel_check = 0.0
        self._cancelled = False
        self._published = False  # has this attempt published a partial output yet
        self._held: Progress | None = None  # reported to go out with the next partial output
        self._first_look: Callable[[], bool] | None = None
        self._first_look_at = 0.0

    def report(self, progress: Progress, *, with_next_output: bool = False) -> None:
        """Write the attempt's progress (throttled). ``with_next_output``: the engine yields a
        partial output next, and the progress goes in that output's round trip (:meth:`publish`)."""
        now = time.monotonic()
        if now - self._last_write < PROGRESS_INTERVAL:
            return
        self._last_write = now
        # A held report goes out with the next output; a newer one, written now, supersedes it.
        self._held = progress if with_next_output else None
        if with_next_output:
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            self._write_progress(pipe, progress)
            pipe.execute()
            self._tell_progress(progress)
        except Exception:  # noqa: BLE001 - progress must never fail a job
            self._last_write = time.monotonic() + BACKOFF_AFTER_ERROR
            log.warning("could not report progress of job %s", self.job_id, exc_info=True)

    def _write_progress(self, pipe: Any, progress: Progress) -> None:
        pipe.set(keys.progress(self.job_id), json.dumps(progress.to_json()), ex=self.ttl)
        pipe.publish(keys.bell(self.job_id), keys.BELL_PROGRESS)  # followers wake (``tasks.producer.bells``)

    def _tell_progress(self, progress: Progress) -> None:
        """The progress, once written, to the job's webhook and to Flower."""
        if self.on_progress is not None:
            self.on_progress(progress.to_json())
        if self.send_event is not None:
            self.send_event("task-progress", fraction=progress.fraction, stage=progress.stage,
                            media_seconds=progress.media_seconds)  # fmt: skip

    def publish(self, item: Any) -> None:
        """Append one partial output (a generator engine's yield) where the client reads it.

        Unlike progress, a partial output is part of what the client was promised: a Redis error
        here is a transient failure (the attempt runs again on the same rung, from a clean list).
        """
        held, self._held = self._held, None
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(keys.partials(self.job_id), json.dumps(to_jsonable(item)))
        pipe.expire(keys.partials(self.job_id), self.ttl)
        if not self._published:
            # The attempt's time to first output (the workers' metrics), in the same round trip.
            pipe.set(keys.first_output(self.job_id), repr(wall_clock()), ex=self.ttl)
        if held is not None:
            self._write_progress(pipe, held)
        pipe.publish(keys.bell(self.job_id), keys.BELL_PARTIAL)  # followers wake (``tasks.producer.bells``)
        try:
            pipe.execute()
        except RedisError as exc:
            raise TransientFailure(f"could not publish a partial output: {exc}") from exc
        self._published = True
        if held is not None:
            try:
                self._tell_progress(held)
            except Exception:  # noqa: BLE001 - progress must never fail a job
                log.warning("could not report progress of job %s", self.job_id, exc_info=True)

    def attempt_began(self, first_look: Callable[[], bool]) -> None:
        """A new attempt's record was sent, and read the cancel flag as it was written:
        ``first_look`` answers what it found (``PendingAppend.cancelled``). A cancel check within
        ``CANCEL_INTERVAL`` of it takes that answer, with no round trip of its own: a short job's
        one check then costs nothing, and a job cancelled while queued stops at once."""
        self._first_look, self._first_look_at = first_look, time.monotonic()

    def cancelled(self) -> bool:
        now = time.monotonic()
        look, self._first_look = self._first_look, None
        if look is not None and not self._cancelled and now - self._first_look_at < CANCEL_INTERVAL:
            self._last_cancel_check = self._first_look_at
            self._cancelled = look()
            return self._cancelled
        if not self._cancelled and now - self._last_cancel_check >= CANCEL_INTERVAL:
            self._last_cancel_check = now
            try:
                self._cancelled = bool(self.client.exists(keys.cancel(self.job_id)))
            except Exception:  # noqa: BLE001 - a Redis hiccup must not stop the job
                self._last_cancel_check = time.monotonic() + BACKOFF_AFTER_ERROR
                log.warning("could not read the cancel flag of job %s", self.job_id, exc_info=True)
        return self._cancelled

    def reset(self) -> None:
        """A new attempt: what an earlier one published is not this one's."""
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(keys.partials(self.job_id), keys.progress(self.job_id), keys.first_output(self.job_id))
        pipe.execute()
        self._published, self._held = False, None


def to_jsonable(item: Any) -> Any:
    """A partial output as JSON: pydantic models and the farm's records are dumped, the rest kept."""
    if isinstance(item, BaseModel):
        return item.model_dump(mode="json")
    if hasattr(item, "to_json"):
        return item.to_json()
    return item


@dataclass
class EngineContext:
    """The attempt an engine runs in.

    Attributes:
        job_id: The job's id, the same on every rung.
        attempt: Index of this attempt in the job's history.
        rung_index: The place in the ladder of the rung being run.
        rung: The rung's name (what results, the history and the wire call it).
        device: ``cpu`` or ``cuda``, as the rung declares.
        artifacts: The job's artifact folder (``ArtifactStore``); write output files there.
        models_dir: Where local model weights live (``FARM_MODELS_DIR``).
        channel: Redis side of progress, partials and cancellation; None outside a worker.
        share: The part of the job's progress this context reports into (see :meth:`part`).
        redis: The farm's Redis (the result backend's client), for state that outlives jobs (the
            TTS speaker store); None in a local context not given one.
        backend: The result backend (Celery's: its ``client`` and key names), from which a fan-in
            job reads its parts (:meth:`collect`); None in a local context not given one.
        settings: The farm's settings (``FARM_*``).
        resume: The checkpoint this attempt goes on from (its kept files are back in
            ``artifacts``), or None: start from the beginning. Only for a family that declares
            ``resume``.
        checkpoints: Where :meth:`checkpoint` writes; None: the family does not resume, or no
            worker runs this (a local context), and checkpoints are not kept.
        uploads: Where the farm keeps its files in an object store (FARM_STORAGE_URL), what copies
            this attempt's files there; a file a partial output announces is copied before the
            announcement, which then carries its ``url``. None with a storage folder.
    """

    job_id: str
    attempt: int
    rung_index: int
    rung: str
    device: str
    artifacts: ArtifactStore
    models_dir: Path
    channel: JobChannel | None = field(default=None, repr=False)
    share: tuple[float, float] = (0.0, 1.0)
    redis: Any = field(default=None, repr=False)
    backend: Any = field(default=None, repr=False)
    settings: FarmSettings = field(default_factory=get_settings, repr=False)
    resume: Checkpoint | None = None
    checkpoints: CheckpointWriter | None = field(default=None, repr=False)
    uploads: object_store.AttemptPublisher | None = field(default=None, repr=False)

    @classmethod
    def local(cls, *, storage_dir: Path | None = None, models_dir: Path | None = None, job_id: str = "local",
              device: str = "cpu", redis: Any = None, backend: Any = None) -> EngineContext:  # fmt: skip
        """A context for calling an engine as a plain function: no broker, progress dropped.

        ``redis`` (a Redis client) lets an engine read the farm's shared state, such as registered
        speakers; ``backend`` (a Celery result backend) lets a fan-in engine read its parts. The
        backend's client is the Redis when only the backend is given.
        """
        storage = storage_dir or Path(tempfile.mkdtemp(prefix="mediafarm-local-"))
        if redis is None and backend is not None:
            redis = backend.client
        return cls(job_id, 0, 0, "local", device, ArtifactStore(storage, job_id), models_dir or Path("models"),
                   redis=redis, backend=backend)  # fmt: skip

    def alive(self) -> None:
        """Say the attempt is alive and working (``tasks.runtime.liveness``): a memory write, cheap in any
        loop. Progress, partial outputs, checkpoints and cancel checks say it too; an engine step
        or model load longer than the family's stall timeout without one is taken for a stuck child."""
        liveness.beat()

    def progress(self, fraction: float | None = None, *, stage: str = "", media_seconds: float | None = None,
                 with_next_output: bool = False) -> None:  # fmt: skip
        """Report how far the attempt is (throttled; cheap enough for an inner loop).

        ``with_next_output``: a generator engine that yields a partial output right after this
        report says so, and both go to Redis in one round trip instead of two. A report so held
        that no output follows is dropped (the attempt failed, or the engine returned)."""
        liveness.beat()
        if self.channel is None:
            return
        if fraction is not None:
            low, high = self.share
            fraction = low + (high - low) * min(1.0, max(0.0, fraction))
        progress = Progress(fraction, stage, media_seconds, self.attempt, self.rung_index, self.rung)
        self.channel.report(progress, with_next_output=with_next_output)

    def part(self, start: float, end: float) -> EngineContext:
        """The same context for one stage of a multi-stage engine: the stage reports its own
        fraction 0..1, the job's progress moves from ``start`` to ``end`` of this context's share."""
        low, high = self.share
        return replace(self, share=(low + (high - low) * start, low + (high - low) * end))

    def cancelled(self) -> bool:
        """Has the producer cancelled the job? (Throttled Redis read.)"""
        liveness.beat()
        return self.channel is not None and self.channel.cancelled()

    def check_cancelled(self) -> None:
        """Raise :class:`Cancelled` if the producer cancelled the job; call it between units of work."""
        if self.cancelled():
            raise Cancelled(f"job {self.job_id} was cancelled by its producer")

    def publish(self, item: Any) -> None:
        """Make one partial output visible to the client before the job ends. A file it announces
        (``artifacts.ANNOUNCING_KEYS``) is in the object store first, where the farm keeps one, so
        a reader on another host finds it by the ``url`` the output then carries."""
        liveness.beat()
        if self.channel is None:
            return
        name = announced_file(item) if self.uploads is not None else None
        if name is not None:
            item = {**item, "url": self.uploads.file(self.artifacts.info(name)).url}
        self.channel.publish(item)

    def store_now(self, names: list[str]) -> None:
        """Where the farm keeps its files in an object store, copy these artifacts there now, ahead
        of the partial outputs that will announce them (which then do not copy them again): so a
        file that lists them (``share_live``) never reaches a reader before they do."""
        liveness.beat()
        if self.uploads is not None:
            for name in names:
                self.uploads.file(self.artifacts.info(name))

    def share_live(self, name: str) -> str | None:
        """Where the farm keeps its files in an object store, copy artifact ``name`` as it is now,
        a file the engine rewrites as it runs (a live playlist), and return the copy's URL, to put
        in the partial output that announces what the file lists; None with a storage folder,
        where readers take the file itself."""
        liveness.beat()
        return self.uploads.live(name) if self.uploads is not None else None

    def collect(self, *, timeout: float = 30.0, on_wait: Callable[[Part], Any] | None = None) -> list[Collected]:
        """This fan-in job's parts, finished, in plan order: each part and its result envelope.

        A part's files are ``self.artifacts.of_job(part.job_id)``. ``on_wait`` is called with the
        part being waited for, should one still be running (``plan.collect`` says when).

        Raises:
            PermanentFailure: No plan is stored for this job; a part failed or did not finish; no
                result backend in this context.
        """
        if self.backend is None:
            raise PermanentFailure(
                f"job {self.job_id} reads its pipeline's parts, but its context has no result backend "
                "(EngineContext.local(backend=...))"
            )
        def waiting(part: Part) -> Any:
            liveness.beat()  # waiting for a part is no stall
            return on_wait(part) if on_wait is not None else None

        return collect(self.backend, self.job_id, timeout=timeout, on_wait=waiting)

    def checkpoint_due(self) -> bool:
        """Is it time for a checkpoint (``FARM_CHECKPOINT_INTERVAL`` since the last one or the
        attempt's start)? Always False where checkpoints are not kept: cheap in an inner loop."""
        return self.checkpoints is not None and self.checkpoints.due()

    def checkpoint(self, position: float, state: dict[str, Any], files: Sequence[str] = ()) -> None:
        """Record how far the output goes (``position``, in the family's unit), the engine's JSON
        ``state`` to go on from there, and the finished artifacts (``files``, names) that hold the
        output so far. Written atomically; call it when :meth:`checkpoint_due` says so, at a
        point the engine can resume from exactly. A no-op where checkpoints are not kept."""
        liveness.beat()
        if self.checkpoints is None:
            return
        try:
            self.checkpoints.write(position, state, files)
        except OSError:  # a checkpoint saves work; failing to keep one must not fail the job
            log.warning("could not write a checkpoint of job %s", self.job_id, exc_info=True)

    def read_artifact_of(self, job_id: str, name: str) -> bytes:
        """Another job's artifact ``name``: from this worker's storage folder, else (the farm keeps
        its files in an object store, FARM_STORAGE_URL) from the store, as that job's stored
        envelope names it. FileNotFoundError when neither has it; a TransientFailure (the attempt
        runs again, not the job's fault) when the store cannot be reached."""
        path = self.artifacts.of_job(job_id).path(name)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            if not self.settings.storage_url or self.backend is None:
                raise
        try:
            return object_store.store_at().read(*object_store.split_url(self._stored_url(job_id, name)))
        except object_store.StoreUnavailable as exc:
            raise TransientFailure(str(exc)) from exc

    def artifact_path_of(self, job_id: str, name: str) -> Path:
        """A path to another job's artifact ``name`` (a pipeline part's, for its fan-in): its file
        in this worker's storage folder, else, where the farm keeps its files in an object store,
        a copy of its object in this job's hidden inputs folder (the part ran on another host).
        The path may not exist (neither has it: the caller says what is gone); a TransientFailure
        when the store cannot be reached."""
        path = self.artifacts.of_job(job_id).path(name)
        if path.is_file() or not self.settings.storage_url or self.backend is None:
            return path
        try:
            url = self._stored_url(job_id, name)
        except FileNotFoundError:
            return path
        target = self.artifacts.folder / INPUTS_FOLDER / folder_name(job_id) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            object_store.store_at().download(*object_store.split_url(url), target)
        except object_store.ObjectMissing:
            return path
        except object_store.StoreUnavailable as exc:
            raise TransientFailure(str(exc)) from exc
        return target

    def _stored_url(self, job_id: str, name: str) -> str:
        """The object of another job's artifact, as its stored envelope names it."""
        result = self.backend.get_task_meta(job_id).get("result") if self.backend is not None else None
        artifacts = result.get("artifacts") if isinstance(result, dict) and result.get("job_id") == job_id else None
        url = next((a.get("url") for a in artifacts or [] if isinstance(a, dict) and a.get("name") == name), None)
        if not url:
            raise FileNotFoundError(f"job {job_id!r} has no artifact {name!r} here or in the object store")
        return str(url)

    def model_path(self, relative: str) -> Path:
        """A model file or folder under the models dir; RungUnavailable (recorded, skipped) if absent."""
        missing = missing_model(self.models_dir, relative)
        if missing:
            raise RungUnavailable(missing)
        return self.models_dir / relative
