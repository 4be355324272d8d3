"""Upload routes: media into the uploads folder, streamed, counted against the size limit as it
arrives; a job then names ``upload:<id>`` instead of a path on the farm."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse

from mediafarm.gateway.common.upload_receiver import receive_body, receive_form, refuse_declared_size, upload_refusals
from mediafarm.gateway.security import Caller, caller
from mediafarm.tasks.wire.upload_store import UnknownUpload, UploadStore

router = APIRouter(prefix="/v1/uploads", tags=["uploads"], dependencies=[Depends(caller)])


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
    refuse_declared_size(request, store, multipart)
    with upload_refusals():
        if multipart:
            stored, _ = await receive_form(store, who.owner, content_type, request.stream())
        else:
            media_type = "" if content_type.startswith("application/x-www-form-urlencoded") else content_type
            writer = await anyio.to_thread.run_sync(store.begin, who.owner, filename, media_type)
            stored = await receive_body(writer, request.stream())
    return JSONResponse(stored.to_json(), status_code=201, headers={"Location": f"/v1/uploads/{stored.id}"})


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
