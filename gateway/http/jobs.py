"""Job routes: submit one of a family (a route per family, from the registry), follow it, fetch
its files, cancel it.

Every call into the farm (Redis, Celery) blocks, so each runs in a worker thread
(``anyio.to_thread``); the event loop only waits on the network.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Annotated, Any
from urllib.parse import quote

import anyio
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Request, Response
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, StreamingResponse
from sse_starlette import EventSourceResponse, ServerSentEvent

from mediafarm.config.priorities import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from mediafarm.gateway.common.intake import prepare
from mediafarm.gateway.common.submit import check_idempotency_key, job_url, json_body, submitted, webhook_options
from mediafarm.gateway.security import Caller, caller
from mediafarm.gateway.settings import GatewayConfig
from mediafarm.tasks.producer.bells import bell
from mediafarm.tasks.producer.client import submit
from mediafarm.tasks.producer.handles import JobHandle, PipelineHandle, Snapshot, find_job
from mediafarm.tasks.producer.job_feed import END_ID, Cursor, Event, Follower
from mediafarm.tasks.wire import object_store
from mediafarm.tasks.wire.artifacts import ArtifactStore, UnsafeArtifactName
from mediafarm.tasks.wire.family import FamilySpec
from mediafarm.tasks.wire.records import ArtifactInfo

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(caller)])


async def _job(job_id: str) -> JobHandle:
    job = await anyio.to_thread.run_sync(find_job, job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id!r} (unknown, or its result expired)")
    return job


def _view(job: JobHandle, snapshot: Snapshot) -> dict[str, Any]:
    family = job.family or (snapshot.envelope or {}).get("family", "")
    view: dict[str, Any] = {
        "id": job.id, "family": family, "state": snapshot.state, "progress": snapshot.progress,
        "attempts": list(snapshot.attempts), "partials": list(snapshot.partials),
        "result": snapshot.envelope, "failure": snapshot.failure,
        "links": {"self": job_url(job.id), "events": job_url(job.id, "/events")},
    }  # fmt: skip
    if snapshot.stages is not None:
        view["stages"] = snapshot.stages
    if snapshot.envelope:
        view["links"]["artifacts"] = {a["name"]: job_url(job.id, "/artifacts/" + quote(a["name"]))
                                      for a in snapshot.envelope.get("artifacts", [])}  # fmt: skip
    return view


def _submit_route(spec: FamilySpec) -> Callable[..., Any]:
    async def submit_job(
        request: Request,
        who: Annotated[Caller, Depends(caller)],
        hook: Annotated[dict[str, Any], Depends(webhook_options)],
        idempotency_key: Annotated[
            str | None,
            Header(
                description="The job's id: the same key twice is the same job (letters, digits, . _ : -; up to 200)"
            ),
        ] = None,
        x_priority: Annotated[
            int,
            Header(ge=MIN_PRIORITY, le=MAX_PRIORITY,
                   description=f"The job's priority, {MIN_PRIORITY}-{MAX_PRIORITY}: higher runs first"),
        ] = DEFAULT_PRIORITY,
    ) -> JSONResponse:
        check_idempotency_key(idempotency_key)
        body = await json_body(request)
        config: GatewayConfig = request.app.state.config
        job_id = idempotency_key or str(uuid.uuid4())

        def send() -> JobHandle:
            intake = prepare(spec, body, who.owner, request.app.state.uploads, config.input_roots)
            for upload in intake.uploads:  # before the job exists, so gc never sees it without them
                request.app.state.uploads.attach(upload, job_id)
            return submit(spec.name, job_id=job_id, priority=x_priority, tenant=who.owner, **hook, **intake.fields)

        job = await submitted(send, idempotency_key)
        body = {"id": job.id, "family": spec.name, "pipeline": isinstance(job, PipelineHandle),
                "links": {"self": job_url(job.id), "events": job_url(job.id, "/events")}}  # fmt: skip
        return JSONResponse(body, status_code=202, headers={"Location": job_url(job.id)})

    submit_job.__name__ = f"submit_{spec.name.replace('-', '_')}"
    return submit_job


def add_family_routes(app: FastAPI, specs: Iterable[FamilySpec]) -> None:
    """``POST /v1/jobs/<family>`` for every family; the body's schema is the family's request model
    (put into the OpenAPI document by ``app.family_openapi``)."""
    for spec in specs:
        result = spec.result.__name__
        app.add_api_route(
            f"/v1/jobs/{spec.name}", _submit_route(spec), methods=["POST"], status_code=202, tags=["jobs"],
            summary=f"Submit a {spec.name} job", name=f"submit_{spec.name}",
            description=(f"{spec.description or spec.name}. The body is the family's request "
                         f"({spec.request.__name__}); the finished job's `result.output` is a {result}."),
        )  # fmt: skip


@router.post("/{family}", include_in_schema=False)
async def unknown_family(family: str) -> None:
    raise HTTPException(404, f"unknown job family {family!r}; GET /openapi.json lists the families' routes")


@router.get("/{job_id}", summary="A job: state, progress, attempts, partial outputs, result or failure")
async def get_job(job_id: str) -> dict[str, Any]:
    job = await _job(job_id)
    return _view(job, await anyio.to_thread.run_sync(job.snapshot))


@router.delete("/{job_id}", status_code=202, summary="Cancel a job (it ends cancelled)")
async def cancel_job(job_id: str) -> dict[str, Any]:
    job = await _job(job_id)
    await anyio.to_thread.run_sync(job.cancel)
    return {"id": job.id, "cancel": "requested", "links": {"self": job_url(job.id)}}


@router.get("/{job_id}/webhooks", summary="A job's webhook deliveries: each try, its status and latency")
async def job_webhooks(job_id: str) -> dict[str, Any]:
    job = await _job(job_id)
    tries, pending = await anyio.to_thread.run_sync(job.webhook_deliveries)
    return {"id": job.id, "tries": tries,
            "pending": [{"id": e["id"], "type": e["type"], "tries": e.get("tries", 0)} for e in pending]}  # fmt: skip


@router.get(
    "/{job_id}/events", summary="Server-Sent Events of a job; Last-Event-ID resumes",
    response_class=EventSourceResponse, responses={204: {"description": "the stream had already ended"}},
)  # fmt: skip
async def job_events(job_id: str, request: Request, last_event_id: Annotated[str | None, Header()] = None) -> Response:
    job = await _job(job_id)
    if last_event_id is not None and last_event_id.strip() == END_ID:
        return Response(status_code=204)  # the client had the end: EventSource stops reconnecting
    try:
        cursor = Cursor() if last_event_id is None else Cursor.parse(last_event_id)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    config: GatewayConfig = request.app.state.config
    return EventSourceResponse(_stream(job, Follower(cursor, time.monotonic), config.poll_interval),
                               ping=config.heartbeat, headers={"Cache-Control": "no-store"})  # fmt: skip


async def _stream(job: JobHandle, follower: Follower, poll: float) -> AsyncIterator[ServerSentEvent]:
    """The job's events as it changes: read when its bell rings (``tasks.producer.bells``), and
    every ``poll`` seconds whatever it rang."""
    with bell(job.id) as ring:  # before the first read: a change after it rings
        while not follower.done:
            snapshot = await anyio.to_thread.run_sync(job.snapshot)
            for event in follower.feed(snapshot):
                yield _sse(event)
            if not follower.done:
                await ring.changed(poll)


def _sse(event: Event) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps(event.data, separators=(",", ":")), event=event.kind, id=event.id)


@router.get("/{job_id}/artifacts/{name:path}", summary="A file the job made; Range and If-None-Match work")
async def get_artifact(job_id: str, name: str, request: Request) -> Response:
    job = await _job(job_id)
    infos = await anyio.to_thread.run_sync(job.artifacts)
    info = next((a for a in infos if a.name == name), None)
    if info is None:
        raise HTTPException(404, f"job {job_id} has no artifact {name!r} (artifacts are listed once it succeeded)")
    config: GatewayConfig = request.app.state.config
    etag = f'"{info.sha256}"'
    if _matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers={"ETag": etag})
    if info.url:
        byte_range = _single_range(request.headers.get("range"), info.size)
        if_range = request.headers.get("if-range")
        if if_range is not None and if_range.strip() != etag:
            byte_range = None  # the client's copy is another version (or a date): the whole file
        return await _from_store(info, byte_range, config)

    def locate() -> Path | None:  # resolves symlinks: file system calls, off the event loop
        path = ArtifactStore(config.storage_dir, job.id).path(name)
        return path if path.is_file() else None

    try:
        path = await anyio.to_thread.run_sync(locate)
    except UnsafeArtifactName as exc:
        raise HTTPException(404, str(exc)) from None
    if path is None:
        raise HTTPException(404, f"artifact {name!r} of job {job_id} is not in this gateway's storage folder "
                                 "(FARM_STORAGE_DIR must be the workers' shared one)")  # fmt: skip
    return FileResponse(path, media_type=info.media_type, headers={"ETag": etag, "Cache-Control": "private"})


_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def _single_range(header: str | None, size: int) -> str | None:
    """The one byte range the store is asked for (``bytes=a-b``, ``bytes=a-``, ``bytes=-n``), from
    a Range header; None for none, or for several (the whole file is a valid answer to those). A
    range that starts past the end is 416, a malformed header 400, as for a file."""
    if header is None or "," in header:
        return None
    match = _RANGE.fullmatch(header.strip())
    if match is None or match.groups() == ("", ""):
        raise HTTPException(400, f"malformed Range header {header!r}: one bytes=a-b range is served")
    start, end = match.groups()
    if start and (int(start) >= size or (end and int(end) < int(start))):
        raise HTTPException(416, f"range {header!r} is outside the artifact ({size} bytes)",
                            headers={"Content-Range": f"bytes */{size}"})  # fmt: skip
    return f"bytes={start}-{end}"


def _relayed(chunks: Iterator[bytes], url: str) -> Iterator[bytes]:
    """The store's bytes as they come; a store lost midway ends the response short (its
    Content-Length tells the client) with a warning naming the object, not a traceback."""
    try:
        yield from chunks
    except object_store.StoreUnavailable as exc:
        log.warning("artifact %s: the object store stopped midway: %s", url, exc)


async def _from_store(info: ArtifactInfo, byte_range: str | None, config: GatewayConfig) -> Response:
    """An artifact kept in the object store: a redirect to a presigned URL, or its bytes streamed
    through (one checked range passed on to the store, which answers it). A store away or an
    object gone is answered by the app's handler of ``STORE_ERRORS`` (503, 404), as on every route."""
    bucket, key = object_store.split_url(str(info.url))
    store = object_store.store_at()
    filename = PurePosixPath(info.name).name
    if config.artifact_delivery == "redirect":
        url = await anyio.to_thread.run_sync(store.presigned, bucket, key, config.presign_seconds, filename,
                                             info.media_type)  # fmt: skip
        return RedirectResponse(url, status_code=307, headers={"Cache-Control": "no-store"})
    try:
        body = await anyio.to_thread.run_sync(store.get, bucket, key, byte_range)
    except object_store.RangeNotSatisfiable:
        raise HTTPException(416, f"range {byte_range!r} is outside artifact {info.name!r} ({info.size} bytes)",
                            headers={"Content-Range": f"bytes */{info.size}"}) from None  # fmt: skip
    headers = {"ETag": f'"{info.sha256}"', "Cache-Control": "private", "Accept-Ranges": "bytes",
               "Content-Length": str(body.length)}  # fmt: skip
    if body.content_range:
        headers["Content-Range"] = body.content_range
    status = 206 if body.content_range else 200
    return StreamingResponse(_relayed(body.chunks(), str(info.url)), status_code=status, media_type=info.media_type,
                             headers=headers)  # fmt: skip


def _matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or etag in tags
