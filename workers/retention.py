"""Retention of artifacts: a job's folder lives as long as its result, then ``farm gc`` removes it.

The rule: a job folder (one the farm made: its name encodes a job id and it holds the farm's
marker file) is removed when the result backend holds neither the job's result nor its attempt
history (both expire after ``result_expires``, 7 days by default), and nothing in the folder
changed for ``grace`` seconds (a job that is about to start, or whose result write is in flight,
keeps its folder). A job that has ended (its stored state is final) loses its checkpoint
(``tasks.wire.checkpoint``) and the media it fetched by URL (``.inputs``), should its worker have
died before removing them. Hidden partial files
left by killed writers are removed from any job folder once they are older than ``grace``. Nothing
else in the storage folder is touched, and ``farm gc`` refuses to run against a backend that holds
no farm keys at all (a wrong database number would otherwise make every job look expired).

With an object store (FARM_STORAGE_URL, ``tasks.wire.object_store``) the same rule holds for the
job folders under its prefix: a folder whose job's result and history have expired goes, with
every attempt's objects, once none of them changed for ``grace`` seconds; the stored checkpoint of
a job that has ended goes (its worker died before removing it). A store that cannot be reached
stops ``farm gc`` with a clear error after the local folders are done.

Uploads (the gateway's, ``tasks.wire.upload_store``) live as long as the jobs that named them: an
upload goes once no job that named it has a result, a history or a remembered submission left,
or, if no job ever named it, ``result_expires`` after it was made; one that never finished goes
after ``grace``. Nothing changed within ``grace`` goes in any case.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mediafarm.config.storage_url import S3Place
from mediafarm.tasks.wire import keys, object_store
from mediafarm.tasks.wire.artifacts import CHECKPOINT_FOLDER, INPUTS_FOLDER, MARKER, PARTIAL_MARK, job_id_of
from mediafarm.tasks.wire.object_store import ObjectStore
from mediafarm.tasks.wire.upload_objects import stored_uploads
from mediafarm.tasks.wire.upload_store import META, is_finished, jobs_naming, upload_folders


class WrongBackend(RuntimeError):
    """The backend holds no result and no farm key: probably not this farm's database."""


@dataclass(frozen=True)
class Removal:
    """Attributes: path (what goes: a file or folder, or ``s3://bucket/prefix/`` for the objects
    under a prefix of the object store), reason (why), size (bytes freed)."""

    path: Path | str
    reason: str
    size: int


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _newest_change(path: Path) -> float:
    return max([path.stat().st_mtime] + [p.stat().st_mtime for p in path.rglob("*")])


def expired(storage_dir: Path, backend: Any, *, grace: float = 3600.0, now: float | None = None) -> Iterator[Removal]:
    """What ``farm gc`` removes. ``backend`` is the Celery result backend (its ``client`` and key names)."""
    now = time.time() if now is None else now
    if not storage_dir.is_dir():
        return
    folders = [p for p in sorted(storage_dir.iterdir()) if p.is_dir() and (p / MARKER).is_file()]
    _check_backend(backend, bool(folders))
    for folder in folders:
        job_id = job_id_of(folder.name)
        if job_id is None or now - _newest_change(folder) < grace:
            continue
        known = backend.client.exists(backend.get_key_for_task(job_id), keys.history(job_id))
        if not known:
            yield Removal(folder, "result and history expired", _size(folder))
            continue
        checkpoint = folder / CHECKPOINT_FOLDER
        if checkpoint.is_dir() and _ended(backend, job_id):
            # The worker removes it as the job ends; one that died in between left it.
            yield Removal(checkpoint, "checkpoint of a job that has ended", _size(checkpoint))
        inputs = folder / INPUTS_FOLDER
        if inputs.is_dir() and _ended(backend, job_id):
            # Media fetched by URL (tasks.runtime.media_fetch): the attempt removes it as it
            # ends; a child killed on the job's last attempt left it.
            yield Removal(inputs, "media fetched for a job that has ended", _size(inputs))
        for partial in folder.rglob(f".*{PARTIAL_MARK}*"):
            if partial.is_relative_to(checkpoint) and checkpoint.is_dir() and _ended(backend, job_id):
                continue  # goes with its checkpoint above
            if now - partial.stat().st_mtime >= grace:
                yield Removal(partial, "partial file of an attempt that never finished", _size(partial))


def expired_objects(
    place: S3Place, store: ObjectStore, backend: Any, *, grace: float = 3600.0, now: float | None = None
) -> Iterator[Removal]:
    """What ``farm gc`` removes from the object store (the rule is in the module's docstring)."""
    now = time.time() if now is None else now
    jobs = [(name, job_id) for name in store.folders(place.bucket, place.prefix) if (job_id := job_id_of(name))]
    _check_backend(backend, bool(jobs))
    for name, job_id in jobs:
        folder = place.key(name) + "/"
        objects = store.objects(place.bucket, folder)
        if not objects or now - max(changed for _, _, changed in objects) < grace:
            continue
        if not backend.client.exists(backend.get_key_for_task(job_id), keys.history(job_id)):
            yield Removal(place.url(folder), "result and history expired", sum(size for _, size, _ in objects))
            continue
        checkpoint = [size for key, size, _ in objects if key.startswith(f"{folder}{CHECKPOINT_FOLDER}/")]
        if checkpoint and _ended(backend, job_id):
            yield Removal(place.url(f"{folder}{CHECKPOINT_FOLDER}/"), "stored checkpoint of a job that has ended",
                          sum(checkpoint))  # fmt: skip


def expired_uploads(
    uploads_dir: Path, backend: Any, *, ttl: float, grace: float = 3600.0, now: float | None = None
) -> Iterator[Removal]:
    """The uploads ``farm gc`` removes (the rule is in the module's docstring). ``ttl``: the
    backend's ``result_expires``."""
    now = time.time() if now is None else now
    folders = list(upload_folders(uploads_dir))
    _check_backend(backend, any(jobs_naming(f) for f in folders))
    for folder in folders:
        try:
            if now - _newest_change(folder) < grace:  # in use: nothing else of it is read
                continue
            finished = is_finished(folder)
            recorded = (folder / META).stat().st_mtime if finished else 0.0
            why = _upload_expired(backend, finished=finished, recorded=recorded, jobs=jobs_naming(folder), now=now,
                                  ttl=ttl)  # fmt: skip
            if why is not None:
                yield Removal(folder, why, _size(folder))
        except FileNotFoundError:  # removed meanwhile (the gateway's DELETE): nothing left to collect
            continue


def expired_upload_objects(
    place: S3Place, store: ObjectStore, backend: Any, *, ttl: float, grace: float = 3600.0, now: float | None = None
) -> Iterator[Removal]:
    """The uploads ``farm gc`` removes from the object store (``place``: ``upload_objects.uploads_place``),
    by the uploads folder's rule (the module's docstring)."""
    now = time.time() if now is None else now
    uploads = list(stored_uploads(place, store))
    _check_backend(backend, any(u.jobs for u in uploads))
    for upload in uploads:
        if now - upload.changed < grace:
            continue
        why = _upload_expired(backend, finished=upload.finished, recorded=upload.recorded, jobs=upload.jobs, now=now,
                              ttl=ttl)  # fmt: skip
        if why is not None:
            yield Removal(upload.url, why, upload.size)


def _upload_expired(
    backend: Any, *, finished: bool, recorded: float, jobs: Sequence[str], now: float, ttl: float
) -> str | None:
    """Why an upload unchanged for its grace goes, wherever it is kept, or None: the uploads' rule
    (the module's docstring). ``recorded``: its record's last change (when finished); ``jobs``: the
    ids of the jobs that named it."""
    if not finished:
        return "an upload that never finished"
    if jobs:
        return None if any(_job_known(backend, job_id) for job_id in jobs) else "upload whose jobs' results expired"
    return "upload no job named within result_expires" if now - recorded >= ttl else None


def _check_backend(backend: Any, looks_up_jobs: bool) -> None:
    """Refuse a backend with no farm key at all when jobs are to be looked up in it
    (``looks_up_jobs``): a wrong database would make every job look expired."""
    if looks_up_jobs and not _holds_farm_keys(backend.client):
        raise WrongBackend("the result backend holds no job results or farm keys: is FARM_RESULT_BACKEND right?")


def _ended(backend: Any, job_id: str) -> bool:
    """Is the job's stored state a final one (a retried job's is RETRY until it ends)?"""
    return backend.get_task_meta(job_id).get("status") in ("SUCCESS", "FAILURE", "REVOKED")


def _job_known(backend: Any, job_id: str) -> bool:
    return bool(backend.client.exists(backend.get_key_for_task(job_id), keys.history(job_id), keys.submitted(job_id)))


def _holds_farm_keys(client: Any) -> bool:
    for pattern in (keys.every_key(), "celery-task-meta-*"):
        if next(iter(client.scan_iter(match=pattern, count=1000)), None) is not None:
            return True
    return False


def remove(removal: Removal, store: ObjectStore | None = None) -> None:
    """Remove what ``removal`` names (objects through ``store``, the object store's)."""
    if isinstance(removal.path, str):
        place = S3Place.parse(removal.path)
        (store or object_store.store_at()).delete_prefix(place.bucket, place.prefix + "/")
        return
    if removal.path.is_dir():
        shutil.rmtree(removal.path, ignore_errors=True)
    else:
        removal.path.unlink(missing_ok=True)
