"""Uploaded media on disk: one folder per upload, under its owner, inside the uploads folder.

    <uploads_dir>/<owner>/<upload id>/media.<ext>     the file, renamed into place once complete
                                     /meta.json        what the client said and what was counted
                                     /jobs/<job>       one empty file per job that named it

The uploads folder is one of the input roots (``FarmSettings.input_roots``), so a worker reads an
upload like any other media file, through the same checks.

Where the farm keeps its files in an object store (FARM_STORAGE_URL), the same layout lives in the
store (``tasks.wire.upload_objects``): the body is received here, counted and hashed as it
arrives, and moved there once whole; nothing of it stays here. ``farm gc`` removes an upload once the
results of every job that named it have expired (``workers.retention.expired_uploads``). No
FastAPI here: the gateway writes this layout and ``farm gc`` reads it, on an install without the
gateway extra, so it sits beside the artifact store rather than in the gateway.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mediafarm.tasks.wire.artifacts import folder_name, job_id_of, media_type_of

META = "meta.json"
JOBS = "jobs"
PARTIAL = ".partial-media"
# The id a job names after ``upload:``: 32 hex digits (a uuid4), so never a path.
UPLOAD_ID = re.compile(r"^[0-9a-f]{32}$")
_EXTENSION = re.compile(r"^\.[A-Za-z0-9]{1,12}$")


class UploadTooLarge(ValueError):
    """More bytes than FARM_UPLOAD_MAX_MB allows."""


class TooManyUploads(ValueError):
    """The owner holds FARM_UPLOAD_MAX_COUNT uploads already."""


class UnknownUpload(LookupError):
    """No finished upload of this owner has that id."""


@dataclass(frozen=True)
class Upload:
    """One finished upload.

    Attributes:
        id: 32 hex digits; a job names it as ``upload:<id>``.
        owner: Whose it is (``security.Caller.owner``); only the owner's jobs may name it.
        filename: The name the client gave (for people; the file on disk is ``media<ext>``).
        size: Bytes.
        sha256: Hex digest of the bytes received.
        media_type: What the client said it is, or what its name suggests.
        created: Unix time the upload finished.
        path: The file on disk, which the job is sent with (in the object store: its name).
        url: ``s3://`` URL of the media's object, which the job is sent with instead, where the
            farm keeps its files in an object store; None otherwise.
    """

    id: str
    owner: str
    filename: str
    size: int
    sha256: str
    media_type: str
    created: float
    path: Path
    url: str | None = None

    @property
    def media(self) -> str:
        """What a job is sent with: the object's URL, or the file's path."""
        return self.url or str(self.path)

    def to_json(self) -> dict[str, Any]:
        """What a client sees (the path on the farm's disk is none of its business)."""
        return {"id": self.id, "filename": self.filename, "size": self.size, "sha256": self.sha256,
                "media_type": self.media_type, "created": self.created, "ref": f"upload:{self.id}"}  # fmt: skip


def _clean_filename(name: str | None) -> str:
    name = Path(name or "").name  # a client's "../../x" is only ever a label, but keep it a plain one
    name = "".join(ch for ch in name if ch.isprintable())[:255]
    return name or "upload"


class UploadsElsewhere(Protocol):
    """Where uploads live when not in this folder: the object store (``upload_objects.UploadObjects``)."""

    def begin(self, owner: str, upload_id: str, max_count: int) -> None: ...
    def finish(self, path: Path, upload: Upload) -> Upload: ...
    def get(self, owner: str, upload_id: str) -> Upload: ...
    def attach(self, upload: Upload, job_id: str) -> None: ...
    def delete(self, owner: str, upload_id: str) -> None: ...


class UploadWriter:
    """One upload being received: bytes are counted and hashed as they are written."""

    def __init__(self, folder: Path, owner: str, filename: str, media_type: str, max_bytes: int,
                 objects: UploadsElsewhere | None = None) -> None:  # fmt: skip
        self.folder, self.owner, self.filename, self.max_bytes = folder, owner, filename, max_bytes
        self.objects = objects
        suffix = Path(filename).suffix
        self.extension = suffix.lower() if _EXTENSION.match(suffix) else ""
        self.media_type = media_type or media_type_of(filename)
        self.size = 0
        self._digest = hashlib.sha256()
        self._partial = folder / (PARTIAL + self.extension)
        self._file = self._partial.open("wb")

    def write(self, data: bytes) -> None:
        """Append ``data``; UploadTooLarge (and nothing kept) once the upload passes the limit."""
        self.size += len(data)
        if self.size > self.max_bytes:
            self.abort()
            raise UploadTooLarge(f"the upload is larger than this gateway takes: {self.max_bytes:,} bytes "
                                 "(FARM_UPLOAD_MAX_MB)")  # fmt: skip
        self._digest.update(data)
        self._file.write(data)

    def finish(self) -> Upload:
        """Put the file in place and write what is known about it; the upload is usable from now."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        if self.size == 0:
            self.abort()
            raise ValueError("the upload is empty (0 bytes)")
        path = self.folder / ("media" + self.extension)
        os.replace(self._partial, path)
        upload = Upload(self.folder.name, self.owner, self.filename, self.size, self._digest.hexdigest(),
                        self.media_type, time.time(), path)  # fmt: skip
        if self.objects is not None:
            try:
                return self.objects.finish(path, upload)
            except BaseException:
                self.abort()  # not stored: no upload, and the client is told why (503)
                raise
            finally:
                shutil.rmtree(self.folder, ignore_errors=True)  # received here only on its way there
        meta = {**upload.to_json(), "owner": self.owner, "file": path.name}
        temp = self.folder / (META + ".tmp")
        temp.write_text(json.dumps(meta))
        os.replace(temp, self.folder / META)
        return upload

    def abort(self) -> None:
        """Forget this upload: nothing of it is left on disk (nor in the store, if it can be
        reached; else ``farm gc`` removes what is left there as an upload that never finished)."""
        self._file.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.objects is not None:
            with contextlib.suppress(OSError):
                self.objects.delete(self.owner, self.folder.name)


class UploadStore:
    """The uploads folder. Attributes: root, max_bytes and max_count (per owner), and objects:
    where the media goes when the farm keeps its files in an object store (None: kept here)."""

    def __init__(self, root: Path, max_bytes: int, max_count: int, objects: UploadsElsewhere | None = None) -> None:
        self.root, self.max_bytes, self.max_count, self.objects = Path(root), max_bytes, max_count, objects

    def begin(self, owner: str, filename: str | None, media_type: str = "") -> UploadWriter:
        """Start an upload; TooManyUploads if the owner holds ``max_count`` already.

        The folder is made before the count, so two uploads racing past the bound both see the
        other: the bound is never passed (at worst both are refused).
        """
        folder = self.root / owner / uuid.uuid4().hex
        if self.objects is not None:  # counted in the store, where every gateway counts
            folder.mkdir(parents=True)
            try:
                self.objects.begin(owner, folder.name, self.max_count)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            return UploadWriter(folder, owner, _clean_filename(filename), media_type, self.max_bytes, self.objects)
        folder.mkdir(parents=True)
        held = sum(1 for p in folder.parent.iterdir() if p.is_dir())
        if held > self.max_count:
            shutil.rmtree(folder, ignore_errors=True)
            raise TooManyUploads(f"{self.max_count} uploads are held for this token already (FARM_UPLOAD_MAX_COUNT); "
                                 "they go as their jobs' results expire, or DELETE /v1/uploads/<id>")  # fmt: skip
        return UploadWriter(folder, owner, _clean_filename(filename), media_type, self.max_bytes)

    def get(self, owner: str, upload_id: str) -> Upload:
        """The owner's finished upload ``upload_id``; UnknownUpload otherwise."""
        if not UPLOAD_ID.match(upload_id):
            raise UnknownUpload(f"no upload {upload_id!r}: an upload id is 32 hex digits")
        if self.objects is not None:
            return self.objects.get(owner, upload_id)
        folder = self.root / owner / upload_id
        try:
            meta = json.loads((folder / META).read_text())
        except (OSError, ValueError):
            raise UnknownUpload(f"no upload {upload_id!r} (unknown, expired, or another token's)") from None
        return Upload(upload_id, owner, meta["filename"], meta["size"], meta["sha256"], meta["media_type"],
                      meta["created"], folder / meta["file"])  # fmt: skip

    def attach(self, upload: Upload, job_id: str) -> None:
        """Note that ``job_id`` names the upload: it is kept as long as that job's result."""
        if self.objects is not None:
            self.objects.attach(upload, job_id)
            return
        jobs = upload.path.parent / JOBS
        jobs.mkdir(exist_ok=True)
        (jobs / folder_name(job_id)).touch()

    def delete(self, owner: str, upload_id: str) -> None:
        """Remove the owner's upload (a job already sent with it then fails: its file is gone)."""
        self.get(owner, upload_id)
        if self.objects is not None:
            self.objects.delete(owner, upload_id)
            return
        shutil.rmtree(self.root / owner / upload_id, ignore_errors=True)


def upload_folders(root: Path) -> Iterator[Path]:
    """Every upload folder under ``root``, finished or not."""
    if not root.is_dir():
        return
    for owner in sorted(p for p in root.iterdir() if p.is_dir()):
        yield from sorted(p for p in owner.iterdir() if p.is_dir() and UPLOAD_ID.match(p.name))


def jobs_naming(folder: Path) -> list[str]:
    """The ids of the jobs sent with the upload in ``folder``."""
    jobs = folder / JOBS
    if not jobs.is_dir():
        return []
    return [job_id for job_id in map(job_id_of, sorted(p.name for p in jobs.iterdir())) if job_id is not None]


def is_finished(folder: Path) -> bool:
    return (folder / META).is_file()

