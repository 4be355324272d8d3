"""Job artifacts in an S3-compatible object store (``FARM_STORAGE_URL=s3://bucket/prefix``).

A worker still writes each file into its own job folder first (``tasks.wire.artifacts``: atomic,
checked names); :class:`AttemptPublisher` copies them to the store (as a streaming job announces
them, and every artifact when the attempt has succeeded),
and the envelope's ``ArtifactInfo.url`` names each object. Readers (``JobHandle.download``, the
gateway's artifact route) read the object, so a producer, a gateway and the workers need share
no folder, only the broker and the store.

Each attempt writes under its own key, ``<prefix>/<job folder>/<attempt>/<name>``, create-only
(``If-None-Match: *``, on the single PUT or on the multipart upload's completion). A stale copy of
the job (a paused worker's, after a redelivery) writes under its own attempt and can never
replace the files the job's stored SUCCESS names; an upload cut off midway leaves no object
(a multipart upload is visible only once completed). Each object carries the sha256 and the
attempt that wrote it as metadata.

The client is boto3: the reference S3 client, which every S3-compatible store tests against, with
the standard AWS settings for endpoint and credentials (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, profiles, instance roles) and presigned URLs. An
artifact goes up in one PUT up to :data:`MULTIPART_BYTES`, in parts past it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from mediafarm.config.storage_url import S3Place
from mediafarm.tasks.wire.artifacts import folder_name, media_type_of
from mediafarm.tasks.wire.errors import TransientFailure
from mediafarm.tasks.wire.records import ArtifactInfo

# One PUT up to this size; past it a multipart upload of parts this size (S3: 5 MiB to 5 GiB each).
MULTIPART_BYTES = 64 * 1024 * 1024
# Uploads of one attempt's artifacts in flight at once.
PARALLEL_PUTS = 8
# Under an attempt's key: copies of files the attempt rewrites as it runs (``AttemptPublisher.live``).
LIVE_FOLDER = ".live"
# Seconds an attempt waits for a store that cannot be reached before it fails by infrastructure.
STORE_WAIT_S = 120.0
# Seconds a store may take to accept a connection, and to answer once connected.
CONNECT_TIMEOUT, READ_TIMEOUT = 5, 60


class StoreUnavailable(OSError):
    """The object store could not be reached or answered with a server error."""


class StoreRefused(StoreUnavailable):
    """The store answered, and refused: no such bucket, access denied, a bad signature. A setting
    to fix (FARM_STORAGE_URL, the AWS credentials), not an outage to wait out."""


class NoBucket(StoreRefused):
    """The store answers and has no such bucket (yet: a store just started may make it soon)."""


class ObjectMissing(FileNotFoundError):
    """No object under that key (removed by retention, or another store)."""


class RangeNotSatisfiable(ValueError):
    """A byte range that starts past the object's end (HTTP 416)."""


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/key`` as (bucket, key)."""
    place = S3Place.parse(url)
    if not place.prefix:
        raise ValueError(f"object URL {url!r} names a bucket but no object")
    return place.bucket, place.prefix


def attempt_key(place: S3Place, job_id: str, attempt: int, name: str) -> str:
    """Where attempt ``attempt`` of job ``job_id`` puts artifact ``name`` (already a checked name)."""
    return place.key(folder_name(job_id), str(attempt), name)


@dataclass(frozen=True)
class Body:
    """An object read, or a byte range of one: its bytes come from ``chunks()``."""

    stream: Any
    length: int
    content_range: str | None  # ``bytes a-b/total`` for a range

    def chunks(self, size: int = 1 << 20) -> Iterator[bytes]:
        """The bytes, a block at a time; a store lost midway is StoreUnavailable."""
        from botocore.exceptions import BotoCoreError

        try:
            yield from self.stream.iter_chunks(size)
        except (BotoCoreError, OSError) as exc:
            raise StoreUnavailable(f"object store connection lost while reading: {exc}") from exc
        finally:
            self.stream.close()


class ObjectStore:
    """One S3-compatible store. Its boto3 client is made on first use in each process (a client
    is thread-safe, but not to be carried across a fork)."""

    def __init__(self, endpoint_url: str | None = None) -> None:
        self.endpoint_url = endpoint_url or None
        self._client: Any = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        if self._pid != os.getpid():  # a forked child: nothing of the parent's client or lock is used
            self._lock, self._client, self._pid = threading.Lock(), None, os.getpid()
        if self._client is None:
            with self._lock:
                if self._client is None:
                    try:  # only a farm that keeps its files in an object store needs it
                        import boto3
                        from botocore.config import Config
                    except ImportError as exc:
                        raise RuntimeError("FARM_STORAGE_URL needs boto3: pip install 'mediafarm[s3]'") from exc

                    # SigV4 for presigned URLs too (boto3 may presign with V2, which S3 has retired
                    # in new regions and which stores check badly with response headers).
                    # Checksums only where S3 requires them: boto3's default CRC32 headers on every
                    # PUT are refused by some S3-compatible stores.
                    config = Config(connect_timeout=CONNECT_TIMEOUT, read_timeout=READ_TIMEOUT,
                                    signature_version="s3v4", retries={"mode": "standard", "max_attempts": 3},
                                    request_checksum_calculation="when_required",
                                    response_checksum_validation="when_required")  # fmt: skip
                    self._client = boto3.session.Session().client("s3", endpoint_url=self.endpoint_url, config=config)
        return self._client

    def where(self) -> str:
        """The store, in words, for errors: its endpoint, or the one the AWS settings name."""
        return self.endpoint_url or getattr(self.client.meta, "endpoint_url", "") or "the AWS default endpoint"

    def put_new(self, path: Path, bucket: str, key: str, metadata: Mapping[str, str], media_type: str,
                each_part: Callable[[], None] | None = None) -> bool:  # fmt: skip
        """Upload ``path`` as a new object; False (nothing written) when an object is already there.
        ``each_part`` is called before each part of a multipart upload (a sign of life)."""
        size = path.stat().st_size
        extra = {"Metadata": {k: quote(str(v), safe=" /:@-_.") for k, v in metadata.items()}, "ContentType": media_type}
        with self._errors(f"s3://{bucket}/{key}"):
            if size <= MULTIPART_BYTES:
                with path.open("rb") as fh:
                    return self._created(lambda: self.client.put_object(
                        Bucket=bucket, Key=key, Body=fh, IfNoneMatch="*", **extra))  # fmt: skip
            return self._put_parts(path, bucket, key, extra, each_part)

    def put_bytes(self, data: bytes, bucket: str, key: str, media_type: str) -> None:
        """Write (or replace) a small object."""
        with self._errors(f"s3://{bucket}/{key}"):
            self.client.put_object(Bucket=bucket, Key=key, Body=data, ContentType=media_type)

    def _put_parts(self, path: Path, bucket: str, key: str, extra: dict[str, Any],
                   each_part: Callable[[], None] | None) -> bool:  # fmt: skip
        upload = self.client.create_multipart_upload(Bucket=bucket, Key=key, **extra)["UploadId"]
        try:
            parts = []
            with path.open("rb") as fh:
                for number, block in enumerate(iter(lambda: fh.read(MULTIPART_BYTES), b""), start=1):
                    if each_part is not None:
                        each_part()
                    sent = self.client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number,
                                                   Body=block)  # fmt: skip
                    parts.append({"PartNumber": number, "ETag": sent["ETag"]})
            whole = {"Parts": parts}
            done = self._created(lambda: self.client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload, MultipartUpload=whole, IfNoneMatch="*"))  # fmt: skip
        except BaseException:
            self._abort(bucket, key, upload)
            raise
        if not done:
            self._abort(bucket, key, upload)
        return done

    def _abort(self, bucket: str, key: str, upload: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
        except Exception:  # noqa: BLE001 - the store's lifecycle removes an upload left incomplete
            pass

    @staticmethod
    def _created(put: Any) -> bool:
        from botocore.exceptions import ClientError

        try:
            put()
        except ClientError as exc:
            if _code(exc) in ("PreconditionFailed", "412"):
                return False
            raise  # a 409 (another conditional write to the key in flight) is an outage: tried again
        return True

    def metadata(self, bucket: str, key: str) -> dict[str, str]:
        with self._errors(f"s3://{bucket}/{key}"):
            return dict(self.client.head_object(Bucket=bucket, Key=key).get("Metadata", {}))

    def get(self, bucket: str, key: str, byte_range: str | None = None) -> Body:
        """The object, or the ``Range`` header's bytes of it (``bytes=a-b``, passed to the store)."""
        with self._errors(f"s3://{bucket}/{key}"):
            answer = self.client.get_object(Bucket=bucket, Key=key, **({"Range": byte_range} if byte_range else {}))
        return Body(answer["Body"], int(answer["ContentLength"]), answer.get("ContentRange"))

    def read(self, bucket: str, key: str) -> bytes:
        """A small object's bytes (a manifest, a document)."""
        return b"".join(self.get(bucket, key).chunks())

    def download(self, bucket: str, key: str, target: Path) -> None:
        """The object into ``target``, a block at a time."""
        with target.open("wb") as fh:
            for chunk in self.get(bucket, key).chunks():
                fh.write(chunk)

    def presigned(self, bucket: str, key: str, seconds: int, filename: str, media_type: str) -> str:
        """A URL anyone holding it may GET the object with, for ``seconds``."""
        disposition = f"attachment; filename*=UTF-8''{quote(filename)}"
        params = {"Bucket": bucket, "Key": key, "ResponseContentDisposition": disposition,
                  "ResponseContentType": media_type}  # fmt: skip
        with self._errors(f"s3://{bucket}/{key}"):
            return str(self.client.generate_presigned_url("get_object", Params=params, ExpiresIn=seconds))

    def check(self, place: S3Place) -> None:
        """That the bucket is there and these credentials may use it: StoreRefused naming the
        problem, StoreUnavailable when the store cannot be reached."""
        try:
            with self._errors(place.url(place.prefix)):
                self.client.head_bucket(Bucket=place.bucket)
        except ObjectMissing:  # a HEAD's 404 says no more than that
            raise NoBucket(f"object store {self.where()} has no bucket {place.bucket!r}") from None

    def delete_prefix(self, bucket: str, prefix: str) -> int:
        """Remove every object under ``prefix`` (a job's folder); how many went."""
        gone = 0
        with self._errors(f"s3://{bucket}/{prefix}"):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                objects = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if objects:
                    self.client.delete_objects(Bucket=bucket, Delete={"Objects": objects, "Quiet": True})
                    gone += len(objects)
        return gone

    def folders(self, bucket: str, prefix: str) -> list[str]:
        """The names of the folders right under ``prefix`` (a farm's job folders)."""
        start = f"{prefix}/" if prefix else ""
        found: list[str] = []
        with self._errors(f"s3://{bucket}/{start}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=start, Delimiter="/")
            for page in pages:
                found += [p["Prefix"][len(start) :].rstrip("/") for p in page.get("CommonPrefixes", [])]
        return found

    def objects(self, bucket: str, prefix: str) -> list[tuple[str, int, float]]:
        """Every object under ``prefix``: its key, size and last change (Unix time)."""
        with self._errors(f"s3://{bucket}/{prefix}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            return [(o["Key"], int(o["Size"]), o["LastModified"].timestamp())
                    for page in pages for o in page.get("Contents", [])]  # fmt: skip

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """botocore's errors as the farm's: a missing object is ObjectMissing; an unreachable store
        or a server error is StoreUnavailable; both name the object and the store."""
        from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

        try:
            yield
        except ClientError as exc:
            code = _code(exc)
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if code in ("NoSuchKey", "NotFound") or (status == 404 and code != "NoSuchBucket"):
                raise ObjectMissing(f"{what} is not in the object store (removed by retention?)") from exc
            if status == 416 or code == "InvalidRange":
                raise RangeNotSatisfiable(f"{what}: {code}") from exc
            if status >= 500 or status in (408, 409, 429) or code in ("SlowDown", "RequestTimeout"):
                raise StoreUnavailable(f"object store {self.where()} failed on {what}: {code}") from exc
            raise StoreRefused(f"object store {self.where()} refused {what}: {code} (HTTP {status}); "
                               "check FARM_STORAGE_URL and the AWS credentials") from exc  # fmt: skip
        except ParamValidationError:
            raise  # a request this code made wrong: a bug to see, not an outage to wait out
        except BotoCoreError as exc:
            raise StoreUnavailable(f"object store {self.where()} unreachable for {what}: {exc}") from exc


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


_stores: dict[str | None, ObjectStore] = {}


def store_at(endpoint_url: str | None = None) -> ObjectStore:
    """The process's store for an endpoint (None: the AWS settings'), one client per process."""
    if endpoint_url not in _stores:
        _stores[endpoint_url] = ObjectStore(endpoint_url)
    return _stores[endpoint_url]


class AttemptPublisher:
    """Copies one attempt's files into the store, each once: a streaming engine's files as it
    announces them (a TTS chunk, a live subtitle segment: :meth:`file`, before the announcement
    reaches a client), and at the attempt's success every artifact not copied already
    (:meth:`artifacts`).

    Each object goes under the attempt's own key, create-only, with its sha256 and ``writer`` (the
    attempt: rung, worker) as metadata. A store that cannot be reached is waited for, ``wait_s``
    seconds at most for each call (backing off to 5 s, ``waiting`` called on each try: the
    worker's sign of life), as the result backend waits out a short Redis outage; past it, a
    TransientFailure: the attempt fails by infrastructure and runs again, never a rejection of the
    job's input.

    An object already under this attempt's key with the same sha256 is this attempt's own (a copy
    that ran before): kept. One with another sha256 was written by another process under this
    attempt's number, which the attempt log makes unlikely but a store shared by two farms does
    not: a TransientFailure too, so the next attempt writes under its own number.
    """

    def __init__(self, folder: Path, place: S3Place, job_id: str, attempt: int, writer: Mapping[str, str],
                 store: ObjectStore, wait_s: float = STORE_WAIT_S,
                 waiting: Callable[[], None] | None = None) -> None:  # fmt: skip
        self.folder, self.place, self.job_id, self.attempt = folder, place, job_id, attempt
        self.writer, self.store, self.wait_s, self.waiting = dict(writer), store, wait_s, waiting
        self._copied: dict[tuple[str, str], str] = {}  # (name, sha256) -> url

    def file(self, info: ArtifactInfo) -> ArtifactInfo:
        """One file (``info``, under ``folder``) copied; the same info with its ``url``."""
        return self._one(info, time.monotonic() + self.wait_s)

    def artifacts(self, infos: list[ArtifactInfo]) -> list[ArtifactInfo]:
        """The attempt's finished artifacts, each with its ``url``; those copied as they were
        announced (same name, same bytes) are not sent again."""
        deadline = time.monotonic() + self.wait_s
        if len(infos) < 2:
            return [self._one(info, deadline) for info in infos]
        # A job of many small files (a subtitle job's segments) waits on round trips, not bandwidth:
        # several in flight at once (boto3's client is thread-safe; its pool holds 10 connections).
        with ThreadPoolExecutor(max_workers=min(PARALLEL_PUTS, len(infos))) as pool:
            return list(pool.map(lambda info: self._one(info, deadline), infos))

    def live(self, name: str) -> str:
        """The file ``name`` as it is now, for a file the attempt rewrites as it runs (a live
        subtitle job's playlist): copied to ``<attempt key>/.live/<name>``, replacing the copy
        before, apart from the create-only artifacts (the finished file goes there at the
        attempt's success); its URL."""
        key = attempt_key(self.place, self.job_id, self.attempt, f"{LIVE_FOLDER}/{name}")
        data = (self.folder / name).read_bytes()
        media_type = media_type_of(name)
        self._retrying(lambda: self.store.put_bytes(data, self.place.bucket, key, media_type),
                       time.monotonic() + self.wait_s)  # fmt: skip
        return self.place.url(key)

    def _one(self, info: ArtifactInfo, deadline: float) -> ArtifactInfo:
        copied = self._copied.get((info.name, info.sha256))
        if copied is not None:
            return dataclasses.replace(info, url=copied)
        place, store, attempt = self.place, self.store, self.attempt
        key = attempt_key(place, self.job_id, attempt, info.name)
        metadata = {"sha256": info.sha256, "job": folder_name(self.job_id), "attempt": str(attempt), **self.writer}

        def put() -> None:
            if not store.put_new(self.folder / info.name, place.bucket, key, metadata, info.media_type, self.waiting):
                if store.metadata(place.bucket, key).get("sha256") != info.sha256:
                    raise TransientFailure(f"{place.url(key)} was written by another process as attempt {attempt}")

        self._retrying(put, deadline)
        self._copied[(info.name, info.sha256)] = place.url(key)
        return dataclasses.replace(info, url=place.url(key))

    def _retrying(self, put: Callable[[], None], deadline: float) -> None:
        """``put`` until it works: a store away is tried again until ``deadline``, a refusal is not."""
        pause = 0.1
        while True:
            try:
                put()
                return
            except StoreRefused as exc:
                raise TransientFailure(str(exc)) from exc  # no use waiting: a setting to fix
            except (StoreUnavailable, ObjectMissing) as exc:  # missing: a refused create's HEAD raced
                if time.monotonic() + pause > deadline:
                    raise TransientFailure(f"{exc} (waited {self.wait_s:g} s)") from exc
            if self.waiting is not None:
                self.waiting()
            time.sleep(pause)
            pause = min(pause * 2, 5.0)

