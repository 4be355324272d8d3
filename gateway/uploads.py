"""Upload routes: media into the uploads folder, streamed, counted against the size limit as it
arrives; a job then names ``upload:<id>`` instead of a path on the farm."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse

from mediafarm.gateway.multipart import BadMultipart, read_multipart
from mediafarm.gateway.security import Caller, caller
from mediafarm.gateway.upload_store import TooManyUploads, UnknownUpload, UploadStore, UploadTooLarge, UploadWriter

router = APIRouter(prefix="/v1/uploads", tags=["uploads"], dependencies=[Depends(caller)])
# Bytes gathered before one write to disk (in a worker thread): few thread hops, bounded memory.
WRITE_BLOCK = 1 << 20
# A multipart body holds its boundaries and part headers beside the file.
MULTIPART_OVERHEAD = 64 * 1024


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


@router.post(
    "", status_code=201, summary="Upload a media file (the raw body, or multipart with a 'file' part)",
    responses={413: {"description": "larger than FARM_UPLOAD_MAX_MB"},
               429: {"description": "FARM_UPLOAD_MAX_COUNT uploads held already"}},
)  # fmt: skip
async def upload(
    request: Request,
    who: Annotated[Caller, Depends(caller)],
    filename: Annotated[str | None, Query(description="The file's name, for a raw body")] = None,
) -> JSONResponse:
    store: UploadStore = request.app.state.uploads
    content_type = request.headers.get("content-type", "")
    multipart = content_type.lower().startswith("multipart/form-data")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > store.max_bytes + (MULTIPART_OVERHEAD if multipart else 0):
        raise HTTPException(413, f"the upload is larger than this gateway takes: {store.max_bytes:,} bytes "
                                 "(FARM_UPLOAD_MAX_MB)")  # fmt: skip
    try:
        if multipart:
            writer = await _receive_multipart(store, who.owner, content_type, request.stream())
        else:
            media_type = "" if content_type.startswith("application/x-www-form-urlencoded") else content_type
            writer = await anyio.to_thread.run_sync(store.begin, who.owner, filename, media_type)
            await _receive(writer, request.stream())
        stored = await anyio.to_thread.run_sync(writer.finish)
    except UploadTooLarge as exc:
        raise HTTPException(413, str(exc)) from None
    except TooManyUploads as exc:
        raise HTTPException(429, str(exc)) from None
    except (BadMultipart, ValueError) as exc:
        raise HTTPException(422, str(exc)) from None
    return JSONResponse(stored.to_json(), status_code=201, headers={"Location": f"/v1/uploads/{stored.id}"})


async def _receive(writer: UploadWriter, body: AsyncIterator[bytes]) -> None:
    sink = _Sink(writer)
    try:
        async for chunk in body:
            await sink.add(chunk)
        await sink.flush()
    except BaseException:
        await anyio.to_thread.run_sync(writer.abort)  # a dropped client leaves nothing behind
        raise


async def _receive_multipart(store: UploadStore, owner: str, content_type: str,
                             body: AsyncIterator[bytes]) -> UploadWriter:  # fmt: skip
    writer: UploadWriter | None = None
    sink: _Sink | None = None
    try:
        async for kind, value in read_multipart(content_type, body):
            if kind == "file":
                if writer is not None or value.name != "file":
                    raise BadMultipart(f"one file, in the form field 'file', is taken; got a file in {value.name!r}")
                writer = await anyio.to_thread.run_sync(store.begin, owner, value.filename, value.content_type)
                sink = _Sink(writer)
            elif kind == "data" and sink is not None:
                await sink.add(value)
            elif kind == "end" and sink is not None:
                await sink.flush()
    except BaseException:
        if writer is not None:
            await anyio.to_thread.run_sync(writer.abort)
        raise
    if writer is None:
        raise BadMultipart("the form holds no file: send it in the field 'file'")
    return writer


@router.get("/{upload_id}", summary="An upload's size, digest and the reference a job names it by")
async def get_upload(upload_id: str, request: Request, who: Annotated[Caller, Depends(caller)]) -> dict[str, Any]:
    store: UploadStore = request.app.state.uploads
    try:
        found = await anyio.to_thread.run_sync(store.get, who.owner, upload_id)
    except UnknownUpload as exc:
        raise HTTPException(404, str(exc)) from None
    return found.to_json()


@router.delete("/{upload_id}", status_code=204, summary="Remove an upload before it expires")
async def delete_upload(upload_id: str, request: Request, who: Annotated[Caller, Depends(caller)]) -> Response:
    store: UploadStore = request.app.state.uploads
    try:
        await anyio.to_thread.run_sync(store.delete, who.owner, upload_id)
    except UnknownUpload as exc:
        raise HTTPException(404, str(exc)) from None
    return Response(status_code=204)
