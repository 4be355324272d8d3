"""A job's media named by URL, fetched by the worker into the job's folder before the engine runs.

Every engine reads a file (some seek, some decode twice, some resume from a position), so the
worker fetches the whole media first, into ``.inputs/`` of the job's folder (hidden: never an
artifact; cleared with the folder, and removed when the attempt ends). The host must be in
``FARM_MEDIA_URLS`` and each address it resolves to is checked and connected to as checked
(``tasks.wire.outbound``); a redirect is followed only to a URL that passes the same checks, at
most ``MAX_REDIRECTS`` times. What the answer means for the job:

- 2xx: fetched, at most ``FARM_MEDIA_URL_MAX_MB`` (a larger one rejects the job: bad input);
- 4xx but 408, 425 and 429, or an empty body: the URL names nothing the farm may read: the job is
  rejected (bad input), naming the URL and the status;
- 5xx, 408, 425, 429, a refused or cut connection, a timeout: nobody's fault, the same rung is
  tried again (``TransientFailure``); the job is not lost.

The fetch reports its progress and stops at a cancel as an engine does (``on_chunk``), and beats
the child's liveness, so a long download is neither a stall nor deaf to a cancel. It counts
against the attempt's time limits: set them for the download as well as the work.

An ``s3://`` URL whose bucket is listed is read from the object store instead
(``tasks.wire.object_store``): a missing object, or one the store refuses, rejects the job; a store
away is tried again.
"""

from __future__ import annotations

import hashlib
import http.client
import os
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from urllib.parse import SplitResult, unquote, urljoin, urlsplit

from mediafarm.tasks.runtime import liveness
from mediafarm.tasks.wire import object_store
from mediafarm.tasks.wire.artifacts import INPUTS_FOLDER, PARTIAL_MARK, ArtifactStore
from mediafarm.tasks.wire.errors import PermanentFailure, TransientFailure
from mediafarm.tasks.wire.media_urls import S3, SETTING, UrlNotAllowed, check_listed, expanded
from mediafarm.tasks.wire.outbound import Refused, pinned_connection, request_target

FOLDER = INPUTS_FOLDER
MAX_REDIRECTS = 5
CHUNK = 1 << 20
USER_AGENT = "mediafarm-fetch/1"
# Answers that say the host is busy or slow, not that the URL is wrong: tried again.
_TRY_AGAIN = {408, 425, 429}


class MediaFetcher:
    """Fetches the media URLs of one attempt into ``store``'s ``.inputs/`` and removes them after."""

    def __init__(self, store: ArtifactStore, entries: list[str], max_bytes: int, timeout: float,
                 on_chunk: Callable[[int, int | None], None] | None = None) -> None:  # fmt: skip
        """``on_chunk(bytes so far, bytes in all or None)``: called as the media comes (the engine's
        context reports progress and raises Cancelled there)."""
        self.store, self.entries, self.max_bytes, self.timeout = store, entries, max_bytes, timeout
        self.on_chunk = on_chunk
        self.fetched: list[Path] = []

    def __call__(self, url: str) -> Path:
        """The local copy of ``url``'s media (one per URL and attempt)."""
        self.store.ensure_folder()  # the job's folder, marked as one (retention knows it)
        target = self.store.folder / FOLDER / _local_name(url)  # hidden: never listed as an artifact
        if target in self.fetched and target.is_file():
            return target
        self._fetch(url, target)
        self.fetched.append(target)
        return target

    def remove(self) -> None:
        """Remove what this attempt fetched (the engine has finished with it)."""
        for path in self.fetched:
            path.unlink(missing_ok=True)
        self.fetched.clear()

    def _fetch(self, url: str, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        # Named as every partial file is, so `farm gc` removes one a killed child left.
        temp = target.with_name(f".{target.stem}{PARTIAL_MARK}{os.getpid()}{target.suffix}")
        current = url
        try:
            if urlsplit(url).scheme.lower() == S3:
                self._from_store(url, _listed(url, self.entries), temp)
                os.replace(temp, target)
                return
            for _ in range(MAX_REDIRECTS + 1):
                parts = _listed(current, self.entries)
                location = self._get(current, parts, temp)
                if location is None:
                    os.replace(temp, target)
                    return
                current = urljoin(current, location)
            raise PermanentFailure(f"media URL {url!r}: more than {MAX_REDIRECTS} redirects")
        finally:
            temp.unlink(missing_ok=True)

    def _get(self, url: str, parts: SplitResult, temp: Path) -> str | None:
        """GET ``url`` into ``temp``; the Location of a redirect, or None once fetched."""
        try:
            connection = pinned_connection(parts, expanded(self.entries), self.timeout, SETTING, names_open=False)
        except Refused as exc:
            raise PermanentFailure(f"media URL {url!r}: {exc}") from None
        except OSError as exc:  # the name does not resolve: maybe for now
            raise TransientFailure(f"media URL {url!r}: {parts.hostname} does not resolve: {exc}") from None
        try:
            connection.request("GET", request_target(parts), headers={"User-Agent": USER_AGENT})
            response = connection.getresponse()
            if response.status in (301, 302, 303, 307, 308):
                location = response.getheader("Location")
                if not location:
                    raise PermanentFailure(f"media URL {url!r}: redirect {response.status} without a Location")
                return location
            if response.status in _TRY_AGAIN or response.status >= 500:
                raise TransientFailure(f"media URL {url!r}: {parts.hostname} answered {response.status} "
                                       f"{response.reason}")  # fmt: skip
            if not 200 <= response.status < 300:
                raise PermanentFailure(f"media URL {url!r}: {parts.hostname} answered {response.status} "
                                       f"{response.reason}")  # fmt: skip
            length = response.getheader("Content-Length")
            if length is not None and length.isdigit() and int(length) > self.max_bytes:
                raise PermanentFailure(self._too_large(url, int(length)))
            self._copy(url, response, temp, int(length) if length is not None and length.isdigit() else None)
            return None
        except http.client.InvalidURL as exc:  # what the shape check let through: bad input all the same
            raise PermanentFailure(f"media URL {url!r}: {exc}") from None
        except (OSError, http.client.HTTPException) as exc:  # refused, cut, timed out: try again
            raise TransientFailure(f"media URL {url!r}: {type(exc).__name__}: {exc}") from None
        finally:
            connection.close()

    def _from_store(self, url: str, parts: SplitResult, temp: Path) -> None:
        """An ``s3://`` URL's object, read with the workers' credentials: a missing object or one
        the store refuses is bad input; a store away, nobody's fault (the same rung again)."""
        try:
            body = object_store.store_at().get(parts.hostname or "", unquote(parts.path.lstrip("/")))
            if body.length > self.max_bytes:
                raise PermanentFailure(self._too_large(url, body.length))
            self._copy(url, _Chunks(body.chunks(CHUNK)), temp, body.length)
        except (object_store.ObjectMissing, object_store.StoreRefused) as exc:
            raise PermanentFailure(f"media URL {url!r}: {exc}") from None
        except object_store.StoreUnavailable as exc:
            raise TransientFailure(f"media URL {url!r}: {exc}") from None

    def _copy(self, url: str, response: http.client.HTTPResponse, temp: Path, total: int | None) -> None:
        written = 0
        with temp.open("wb") as out:
            while chunk := response.read(CHUNK):
                written += len(chunk)
                if written > self.max_bytes:
                    raise PermanentFailure(self._too_large(url, written))
                out.write(chunk)
                liveness.beat()  # a long download is no stalled child
                if self.on_chunk is not None:
                    self.on_chunk(written, total)
        if response.length:  # a body cut short of its Content-Length
            raise TransientFailure(f"media URL {url!r}: the answer ended {response.length:,} bytes short")
        if written == 0:
            raise PermanentFailure(f"media URL {url!r}: the answer is empty")

    def _too_large(self, url: str, size: int) -> str:
        return (f"media URL {url!r}: more than FARM_MEDIA_URL_MAX_MB ({self.max_bytes // (1 << 20):,} MB) "
                f"({size:,} bytes so far)")  # fmt: skip


class _Chunks:
    """An object store's blocks read as ``_copy`` reads an HTTP answer (``read``, ``length``)."""

    length = 0

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks

    def read(self, size: int) -> bytes:
        return next(self._chunks, b"")


def _listed(url: str, entries: list[str]) -> SplitResult:
    try:
        return check_listed(url, entries)
    except UrlNotAllowed as exc:
        raise PermanentFailure(str(exc)) from None


def _local_name(url: str) -> str:
    """A file name for ``url``'s copy: a digest of the URL, with its path's suffix (a decoder may
    use it) when it has a plain one."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:24]
    suffix = PurePosixPath(unquote(url.split("?", 1)[0].split("#", 1)[0])).suffix.lower()
    keep = suffix if 1 < len(suffix) <= 8 and suffix[1:].isalnum() else ""
    return digest + keep


__all__ = ["FOLDER", "MediaFetcher"]
