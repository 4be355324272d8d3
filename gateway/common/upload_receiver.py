"""An upload received as it arrives, for ``POST /v1/uploads`` and OpenAI's transcriptions alike:
a raw body or a multipart form's one file (the field ``file``) streamed into the upload store,
counted against its size limit on the way, and nothing kept of one cut short or refused."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import anyio
from fastapi import HTTPException, Request

from mediafarm.gateway.common.multipart import BadMultipart, FilePart, read_multipart
from mediafarm.tasks.wire.upload_store import TooManyUploads, Upload, UploadStore, UploadTooLarge, UploadWriter

# Bytes gathered before one write to disk (in a worker thread): few thread hops, bounded memory.
WRITE_BLOCK = 1 << 20
# A multipart body holds its boundaries and part headers beside the file.
MULTIPART_OVERHEAD = 64 * 1024
FILE_FIELD = "file"


class _Sink:
    """An upload being written: pieces gathered in memory, written a block at a time off the loop."""

    def __init__(self, writer: UploadWriter) -> None:
        self.writer, self.block = writer, bytearray()

    async def add(self, data: bytes) -> None:
        self.block += data
        if len(self.block) >= WRITE_BLOCK:
            await self.flush()

    async def flush(self) -> None:
        block, self.block = bytes(self.block), bytearray()
        if block:
            await anyio.to_thread.run_sync(self.writer.write, block)


def refuse_declared_size(request: Request, store: UploadStore, multipart: bool) -> None:
    """413 before a byte is read when the body's Content-Length is already past the limit."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > store.max_bytes + (MULTIPART_OVERHEAD if multipart else 0):
        raise HTTPException(413, f"the upload is larger than this gateway takes: {store.max_bytes:,} bytes "
                                 "(FARM_UPLOAD_MAX_MB)")  # fmt: skip


@contextmanager
def upload_refusals(prefix: str = "") -> Iterator[None]:
    """An upload the store refused as its HTTP error: past the size limit 413, past the count 429,
    any other ValueError (a bad form, an empty file) 422, its message after ``prefix``."""
    try:
        yield
    except UploadTooLarge as exc:
        raise HTTPException(413, str(exc)) from None
    except TooManyUploads as exc:
        raise HTTPException(429, str(exc)) from None
    except ValueError as exc:
        raise HTTPException(422, f"{prefix}{exc}") from None


async def receive_body(writer: UploadWriter, body: AsyncIterator[bytes]) -> Upload:
    """A raw body as the upload ``writer`` began."""
    sink = _Sink(writer)
    try:
        async for chunk in body:
            await sink.add(chunk)
        await sink.flush()
    except BaseException:
        await anyio.to_thread.run_sync(writer.abort)  # a dropped client leaves nothing behind
        raise
    return await anyio.to_thread.run_sync(writer.finish)


async def receive_form(store: UploadStore, owner: str, content_type: str,
                       body: AsyncIterator[bytes]) -> tuple[Upload, dict[str, list[str]]]:  # fmt: skip
    """A multipart form's one file, stored as ``owner``'s upload, and its text fields (each name's
    values in order)."""
    fields: dict[str, list[str]] = {}
    writer: UploadWriter | None = None
    sink: _Sink | None = None
    try:
        async for kind, value in read_multipart(content_type, body):
            if kind == "field":
                name, text = value  # type: ignore[misc]
                fields.setdefault(name, []).append(text)
            elif kind == "file":
                part: FilePart = value  # type: ignore[assignment]
                if writer is not None or part.name != FILE_FIELD:
                    raise BadMultipart(f"one file, in the form field 'file', is taken; got a file in {part.name!r}")
                writer = await anyio.to_thread.run_sync(store.begin, owner, part.filename, part.content_type)
                sink = _Sink(writer)
            elif kind == "data" and sink is not None:
                await sink.add(value)  # type: ignore[arg-type]
            elif kind == "end" and sink is not None:
                await sink.flush()
        if writer is None:
            raise BadMultipart("the form holds no file: send it in the field 'file'")
        return await anyio.to_thread.run_sync(writer.finish), fields
    except BaseException:
        if writer is not None:  # cut short or refused: nothing is kept
            await anyio.to_thread.run_sync(writer.abort)
        raise
