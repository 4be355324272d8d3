"""Files a job produces: ``<FARM_STORAGE_DIR>/<job id>/<name>``, each written atomically.

The folder's name is the job id, percent-encoded when the id holds anything but letters, digits,
``-`` and ``_`` (a producer may choose its own ids, ``cam1:2026-11-29``), so no id can name a path
outside the storage folder. A hidden marker file says the folder is a job's (``farm gc`` removes
nothing else). A file is written under a hidden temporary name in its final folder and renamed into place only
when it is complete (``os.replace`` is atomic within one file system), so a child SIGKILLed
mid-write leaves a hidden ``.*.partial-*`` file, never one that looks finished. A retried attempt
starts from an empty folder (:meth:`ArtifactStore.clear`) but for the job's checkpoint. Names are
relative paths inside the job's folder; anything that could leave it (``..``, absolute paths, NUL) is refused.

Retention: a job's folder lives as long as its result. ``farm gc`` removes the folders of jobs
whose result and history have expired (``workers.retention``).
"""

from __future__ import annotations

import contextlib
import hashlib
import mimetypes
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any
from urllib.parse import quote, unquote

from mediafarm.tasks.wire.errors import PermanentFailure
from mediafarm.tasks.wire.records import ArtifactInfo

PARTIAL_MARK = ".partial-"
# A job's checkpoint (``tasks.wire.checkpoint``): hidden, so no artifact, and kept between attempts.
CHECKPOINT_FOLDER = ".checkpoint"
# Media a job names by URL, fetched by the attempt (``tasks.runtime.media_fetch``): hidden, no artifact.
INPUTS_FOLDER = ".inputs"
# Present in every job folder the farm made: `farm gc` never touches a folder without it.
MARKER = ".mediafarm-job"
# A folder name stays under common file-system limits (255 bytes) after encoding.
MAX_JOB_ID = 200


class UnsafeArtifactName(PermanentFailure):
    """An artifact name or job id that cannot name a file inside the job's folder."""


def folder_name(job_id: str) -> str:
    """The job's folder name: the id itself for UUIDs, percent-encoded otherwise (no ``/``, no ``.``)."""
    if not isinstance(job_id, str) or not job_id or len(job_id) > MAX_JOB_ID:
        raise UnsafeArtifactName(f"job id {job_id!r} cannot name a storage folder (1 to {MAX_JOB_ID} characters)")
    return quote(job_id, safe="-_").replace(".", "%2E")


def job_id_of(name: str) -> str | None:
    """The job id a folder name encodes, or None if the name is not one the farm would write."""
    job_id = unquote(name)
    try:
        return job_id if folder_name(job_id) == name else None
    except UnsafeArtifactName:
        return None


def job_folder(storage_dir: Path, job_id: str) -> Path:
    """The folder of one job's artifacts."""
    return Path(storage_dir) / folder_name(job_id)


def missing_artifact(job_id: str, info: ArtifactInfo, looked_at: Path, storage_dir: Path) -> str:
    """Why a producer cannot find a finished job's artifact: where it looked (its own
    FARM_STORAGE_DIR) and where the worker wrote it, which the artifact's record carries."""
    message = (
        f"artifact {info.name!r} of job {job_id} is not at {looked_at} "
        f"(this process's FARM_STORAGE_DIR is {storage_dir})"
    )
    if info.path is None:
        return message + "; the job's record does not say where the worker wrote it"
    if Path(info.path) == Path(looked_at):
        return (
            message + "; the worker wrote it at that same path: it has been removed since (farm gc), "
            "or the worker ran on another machine whose folder is not shared with this one"
        )
    worker_storage = PurePosixPath(info.path).parents[len(PurePosixPath(info.name).parts)]
    return (
        message + f"; the worker wrote it at {info.path} (its FARM_STORAGE_DIR is {worker_storage}): "
        "give every process of the farm the same FARM_STORAGE_DIR, a folder they all reach"
    )


def check_name(name: str) -> PurePosixPath:
    """``name`` as a safe relative path, or UnsafeArtifactName saying why not."""
    if not isinstance(name, str) or not name or "\x00" in name or "\\" in name:
        raise UnsafeArtifactName(f"artifact name {name!r} must be a non-empty relative path with / separators")
    path = PurePosixPath(name)
    if path.is_absolute() or re.match(r"^[A-Za-z]:", name):
        raise UnsafeArtifactName(f"artifact name {name!r} is absolute; names are relative to the job's folder")
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise UnsafeArtifactName(f"artifact name {name!r} has an empty, '.' or '..' part")
    if any(part.startswith(".") for part in path.parts):
        raise UnsafeArtifactName(f"artifact name {name!r}: names starting with '.' are reserved for partial files")
    return path


def sync_file(path: Path) -> None:
    """``path``'s data on disk (fsync)."""
    with path.open("rb+") as fh:
        os.fsync(fh.fileno())


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class ArtifactStore:
    """The artifacts of one job. Created lazily: a job that writes nothing leaves no folder."""

    def __init__(self, storage_dir: Path, job_id: str) -> None:
        self.job_id = job_id
        self.folder = job_folder(storage_dir, job_id)

    def of_job(self, job_id: str) -> ArtifactStore:
        """Another job's artifacts in the same storage folder (to read what it made)."""
        return ArtifactStore(self.folder.parent, job_id)

    def path(self, name: str) -> Path:
        """Where artifact ``name`` lives (it may not exist yet)."""
        target = self.folder.joinpath(*check_name(name).parts)
        # A symlinked folder inside the job's folder must not lead out of it either.
        if not target.resolve().is_relative_to(self.folder.resolve()):
            raise UnsafeArtifactName(f"artifact name {name!r} resolves outside the job's folder")
        return target

    @contextlib.contextmanager
    def writing(self, name: str, *, durable: bool = True) -> Iterator[Path]:
        """A temporary path to write ``name`` to; renamed into place when the block ends cleanly.

        The temporary name keeps the extension, for libraries that pick a format from it (PyAV,
        soundfile). On an exception the partial file is removed and the exception goes on.

        ``durable`` (the default): the file is on disk (fsync) before the rename makes it visible.
        False for a partial output that the job's final file supersedes (a TTS chunk): a host that
        loses power loses the attempt anyway, and a checkpoint that keeps such a file syncs it
        before its manifest names it (``checkpoint.CheckpointStore.save``). An fsync cost about as
        much as writing a short chunk's file, 0.3 ms median and 2.5 ms p90 here (issue #34).
        """
        final = self.path(name)
        self.ensure_folder()
        final.parent.mkdir(parents=True, exist_ok=True)
        temp = final.with_name(f".{final.stem}{PARTIAL_MARK}{os.getpid()}{final.suffix}")
        try:
            yield temp
            if durable:
                sync_file(temp)  # on disk before the rename makes it visible
            os.replace(temp, final)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise

    @contextlib.contextmanager
    def open(self, name: str, mode: str = "wb", **kwargs: Any) -> Iterator[IO[Any]]:
        """A file object for ``name`` (``wb`` or ``w``), atomic as :meth:`writing`."""
        if mode not in ("wb", "w"):
            raise ValueError("artifacts are opened for writing only, mode 'wb' or 'w'")
        with self.writing(name) as temp, temp.open(mode, **kwargs) as fh:
            yield fh

    def write_bytes(self, name: str, data: bytes) -> Path:
        with self.open(name, "wb") as fh:
            fh.write(data)
        return self.path(name)

    def write_text(self, name: str, text: str) -> Path:
        with self.open(name, "w", encoding="utf-8") as fh:
            fh.write(text)
        return self.path(name)

    def ensure_folder(self) -> None:
        """Make the job's folder, with the marker that tells ``farm gc`` it is a job's."""
        if not self.folder.is_dir():
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / MARKER).touch()

    def clear(self) -> None:
        """Remove everything a previous attempt left, finished or partial, but the job's
        checkpoint (``tasks.wire.checkpoint``), which the next attempt may resume from."""
        if not (self.folder / CHECKPOINT_FOLDER).is_dir():
            shutil.rmtree(self.folder, ignore_errors=True)
            return
        for entry in self.folder.iterdir():
            if entry.name in (CHECKPOINT_FOLDER, MARKER):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def list(self) -> list[ArtifactInfo]:
        """The finished artifacts, sorted by name (partial files are not artifacts)."""
        if not self.folder.is_dir():
            return []
        infos = []
        for path in sorted(p for p in self.folder.rglob("*") if p.is_file()):
            relative = path.relative_to(self.folder)
            if any(part.startswith(".") for part in relative.parts):
                continue
            infos.append(_info(relative.as_posix(), path))
        return infos

    def info(self, name: str) -> ArtifactInfo:
        """One finished file's record (FileNotFoundError if it is not there)."""
        return _info(check_name(name).as_posix(), self.path(name))


def _info(name: str, path: Path) -> ArtifactInfo:
    return ArtifactInfo(name, path.stat().st_size, media_type_of(path.name), sha256_of(path), str(path.absolute()))


def media_type_of(name: str) -> str:
    """The MIME type a file name suggests, ``application/octet-stream`` when it suggests none."""
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


# The keys by which a streaming engine's partial output announces a file it wrote: a TTS chunk's
# ``artifact``, a live subtitle ``segment``. Readers take the file (or its object, ``url``) by these.
ANNOUNCING_KEYS = ("artifact", "segment")


def announced_file(item: Any) -> str | None:
    """The artifact name a partial output announces, or None."""
    if not isinstance(item, dict):
        return None
    return next((item[k] for k in ANNOUNCING_KEYS if isinstance(item.get(k), str)), None)
