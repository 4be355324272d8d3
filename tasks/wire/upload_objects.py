"""Uploads kept in the object store, where the farm keeps its files there (FARM_STORAGE_URL):

    <prefix>/.gateway-uploads/<owner>/<upload id>/.receiving     while it is received
                                                 /media.<ext>    the file, create-only, its sha256 beside it
                                                 /meta.json      what the client said and what was counted
                                                 /jobs/<job>     one empty object per job that named it

The same layout as the uploads folder's (``tasks.wire.upload_store``), in the store: any gateway
that reaches the store reads, counts and removes any upload, so several gateways need share no
folder, and a gateway whose disk is new loses nothing. The gateway receives the body into its
uploads folder as before (counted and hashed as it arrives) and moves it here once whole. A job
naming ``upload:<id>`` is sent with the media's ``s3://`` URL, which the workers may always read
(``tasks.runtime.base``); the gateway refuses that folder by URL, so only the owner's
``upload:<id>`` reaches it. ``farm gc`` removes an upload here by the uploads folder's rule
(``workers.retention.expired_upload_objects``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from mediafarm.config.storage_url import S3Place
from mediafarm.tasks.wire import object_store
from mediafarm.tasks.wire.artifacts import folder_name, job_id_of
from mediafarm.tasks.wire.media_urls import S3, UrlNotAllowed, url_parts
from mediafarm.tasks.wire.upload_store import JOBS, META, UPLOAD_ID, TooManyUploads, UnknownUpload, Upload

# The folder of the store (under FARM_STORAGE_URL's prefix) that uploads go to. A leading dot: no
# job's folder has one (``artifacts.folder_name``). Not ``.uploads``: SeaweedFS keeps its multipart
# uploads in folders of that name and leaves them out of listings.
UPLOADS_FOLDER = ".gateway-uploads"
# Present while an upload is received: counted against the owner's bound from its first byte.
RECEIVING = ".receiving"


def uploads_place(storage_url: str) -> S3Place:
    """The folder of the object store at ``storage_url`` (FARM_STORAGE_URL) that uploads go to."""
    place = S3Place.parse(storage_url)
    return S3Place(place.bucket, place.key(UPLOADS_FOLDER))


@dataclass(frozen=True)
class UploadObjects:
    """The uploads in the store. Every call may raise StoreUnavailable (the gateway answers 503)."""

    store: object_store.ObjectStore
    place: S3Place  # :func:`uploads_place`

    def holds(self, url: str) -> bool:
        """Does ``url`` name an object among the uploads, however it is spelt (the scheme's and
        the bucket's case, an empty port, percent-encoding: as a worker would read it)?"""
        try:
            parts = url_parts(url)
        except UrlNotAllowed:
            return False  # not a URL any worker reads
        key = unquote(parts.path).lstrip("/")
        return (parts.scheme.lower() == S3 and (parts.hostname or "").lower() == self.place.bucket.lower()
                and (key + "/").startswith(self.place.prefix + "/"))  # fmt: skip

    def _key(self, owner: str, upload_id: str, *name: str) -> str:
        return self.place.key(owner, upload_id, *name)

    def begin(self, owner: str, upload_id: str, max_count: int) -> None:
        """Mark the upload begun, then count the owner's: two uploads racing past the bound both
        see the other, so it is never passed (at worst both are refused)."""
        self.store.put_bytes(b"", self.place.bucket, self._key(owner, upload_id, RECEIVING), "application/octet-stream")
        held = len(self.store.folders(self.place.bucket, self.place.key(owner)))
        if held > max_count:
            self.delete(owner, upload_id)
            raise TooManyUploads(f"{max_count} uploads are held for this token already (FARM_UPLOAD_MAX_COUNT); "
                                 "they go as their jobs' results expire, or DELETE /v1/uploads/<id>")  # fmt: skip

    def finish(self, path: Path, upload: Upload) -> Upload:
        """The received file (``path``) as the upload's media, create-only with its sha256, then
        its record: the upload is usable from the record on. The same upload with its ``url``."""
        bucket, key = self.place.bucket, self._key(upload.owner, upload.id, path.name)
        metadata = {"sha256": upload.sha256, "owner": upload.owner}
        if not self.store.put_new(path, bucket, key, metadata, upload.media_type):
            raise object_store.StoreUnavailable(f"{self.place.url(key)} is already in the object store")
        stored = Upload(upload.id, upload.owner, upload.filename, upload.size, upload.sha256, upload.media_type,
                        upload.created, Path(path.name), self.place.url(key))  # fmt: skip
        record = {**stored.to_json(), "owner": upload.owner, "file": path.name, "url": stored.url}
        self.store.put_bytes(json.dumps(record).encode(), bucket, self._key(upload.owner, upload.id, META),
                             "application/json")  # fmt: skip
        self.store.delete_prefix(bucket, self._key(upload.owner, upload.id, RECEIVING))
        return stored

    def get(self, owner: str, upload_id: str) -> Upload:
        """The owner's finished upload; UnknownUpload otherwise."""
        try:
            meta = json.loads(self.store.read(self.place.bucket, self._key(owner, upload_id, META)))
        except (object_store.ObjectMissing, ValueError):
            raise UnknownUpload(f"no upload {upload_id!r} (unknown, expired, or another token's)") from None
        return Upload(upload_id, owner, meta["filename"], meta["size"], meta["sha256"], meta["media_type"],
                      meta["created"], Path(meta["file"]), meta["url"])  # fmt: skip

    def attach(self, upload: Upload, job_id: str) -> None:
        """Note that ``job_id`` names the upload: it is kept as long as that job's result."""
        key = self._key(upload.owner, upload.id, JOBS, folder_name(job_id))
        self.store.put_bytes(b"", self.place.bucket, key, "application/octet-stream")

    def delete(self, owner: str, upload_id: str) -> None:
        self.store.delete_prefix(self.place.bucket, self._key(owner, upload_id) + "/")


@dataclass(frozen=True)
class StoredUpload:
    """One upload folder of the store, as ``farm gc`` sees it. Attributes: url (the folder's),
    size (bytes), changed (its newest object's last change, Unix time), finished (its record is
    there), recorded (its record's last change), jobs (the ids of the jobs that named it)."""

    url: str
    size: int
    changed: float
    finished: bool
    recorded: float
    jobs: tuple[str, ...]


def stored_uploads(place: S3Place, store: object_store.ObjectStore) -> Iterator[StoredUpload]:
    """Every upload folder under ``place`` (:func:`uploads_place`), finished or not, from one listing."""
    folders: dict[tuple[str, str], list[tuple[str, int, float]]] = {}
    start = f"{place.prefix}/" if place.prefix else ""
    for key, size, changed in store.objects(place.bucket, start):
        parts = key[len(start) :].split("/")
        if len(parts) >= 3 and UPLOAD_ID.match(parts[1]):
            folders.setdefault((parts[0], parts[1]), []).append(("/".join(parts[2:]), size, changed))
    for (owner, upload_id), objects in sorted(folders.items()):
        named = {name: changed for name, _, changed in objects}
        jobs = tuple(job_id for name in named if name.startswith(f"{JOBS}/")
                     if (job_id := job_id_of(name[len(JOBS) + 1 :])) is not None)  # fmt: skip
        yield StoredUpload(place.url(place.key(owner, upload_id)), sum(size for _, size, _ in objects),
                           max(named.values()), META in named, named.get(META, 0.0), jobs)  # fmt: skip
