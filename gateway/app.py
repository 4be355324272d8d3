"""The gateway's FastAPI app: the routes, the security around them, and the OpenAPI document built
from the families' own request and result models (one source of truth for the wire format)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import anyio
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from mediafarm import __version__
from mediafarm.config.settings import get_settings
from mediafarm.gateway import metrics as gateway_metrics
from mediafarm.gateway.common.submit_errors import BROKER_ERRORS, STORE_ERRORS, broker_away, store_failed
from mediafarm.gateway.http import jobs, uploads
from mediafarm.gateway.openai import models as openai_models
from mediafarm.gateway.openai import speech, transcriptions
from mediafarm.gateway.security import LoopbackOnly
from mediafarm.gateway.settings import GatewayConfig
from mediafarm.gateway.ws import live_subtitles, rooms
from mediafarm.tasks import registry
from mediafarm.tasks.producer.client import farm_redis
from mediafarm.tasks.wire import object_store
from mediafarm.tasks.wire.family import FamilySpec
from mediafarm.tasks.wire.upload_objects import UploadObjects, uploads_place
from mediafarm.tasks.wire.upload_store import UploadStore

log = logging.getLogger(__name__)

DESCRIPTION = (
    "Submit the farm's jobs, follow them as they run (Server-Sent Events), fetch what they made. "
    "Every family has `POST /v1/jobs/<family>` with its own request model as the body. docs/gateway.md is the manual."
)


def create_app(config: GatewayConfig | None = None) -> FastAPI:
    """The gateway for this farm's families; ``config`` defaults to the ``FARM_*`` settings."""
    config = config or GatewayConfig.from_settings(get_settings())
    specs = list(registry.load().values())
    app = FastAPI(title="mediafarm gateway", version=__version__, description=DESCRIPTION)
    app.state.config = config
    objects = UploadObjects(object_store.store_at(), uploads_place(config.storage_url)) if config.storage_url else None
    app.state.uploads = UploadStore(config.uploads_dir, config.upload_max_bytes, config.upload_max_count, objects)
    jobs.add_family_routes(app, specs)  # before the routers: /v1/jobs/<family> ahead of /v1/jobs/{family}
    app.include_router(jobs.router)
    app.include_router(uploads.router)
    app.include_router(speech.router)  # OpenAI's routes: /v1/audio/speech and /transcriptions, /v1/models
    app.include_router(transcriptions.router)
    app.include_router(openai_models.router)
    app.include_router(rooms.router)  # WebSocket /v1/rooms/{room}: dialogue rooms
    app.include_router(live_subtitles.router)  # WebSocket /v1/live/subtitles: pushed audio in, WebVTT out
    for error in BROKER_ERRORS:  # any route that reads Redis while it restarts: 503, not a bare 500
        app.add_exception_handler(error, broker_unavailable)
    for error in STORE_ERRORS:  # any route that reads an artifact from the object store: 503 or 404
        app.add_exception_handler(error, store_unavailable)
    app.add_api_route("/healthz", healthz, methods=["GET"], tags=["farm"], summary="Is the farm's Redis reachable?")
    gateway_metrics.install(app, get_settings().gateway_metrics_open)  # GET /metrics, and requests counted
    if config.cors_origins:  # no CORS header at all unless the operator names the origins
        app.add_middleware(
            CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID", "Range",
                           "If-None-Match", "If-Range"],
            expose_headers=["Location", "ETag", "Content-Range", "Accept-Ranges"],
        )  # fmt: skip
    if not config.tokens:
        app.add_middleware(LoopbackOnly)
    app.openapi = family_openapi(app, specs)  # type: ignore[method-assign]
    return app


async def broker_unavailable(request: Request, exc: Exception) -> Response:
    log.warning("%s %s: the farm's Redis or broker failed: %r", request.method, request.url.path, exc)
    return await http_exception_handler(request, broker_away(exc))


async def store_unavailable(request: Request, exc: Exception) -> Response:
    log.warning("%s %s: the object store failed: %s", request.method, request.url.path, exc)
    return await http_exception_handler(request, store_failed(exc))


async def healthz() -> dict[str, str]:
    try:
        await anyio.to_thread.run_sync(lambda: farm_redis().ping())
    except Exception as exc:  # noqa: BLE001 - any failure to reach Redis is the answer
        raise HTTPException(503, f"the farm's Redis cannot be reached: {exc}") from None
    return {"status": "ok"}


def family_openapi(app: FastAPI, specs: Sequence[FamilySpec]) -> Callable[[], dict[str, Any]]:
    """``app.openapi``: FastAPI's document, with each family's request model as its submit
    route's body and its request and result models among the schemas."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        models = [(s.request, "validation") for s in specs] + [(s.result, "serialization") for s in specs]
        refs, definitions = models_json_schema(models, ref_template="#/components/schemas/{model}")
        schema.setdefault("components", {}).setdefault("schemas", {}).update(definitions.get("$defs", {}))
        for spec in specs:
            operation = schema["paths"][f"/v1/jobs/{spec.name}"]["post"]
            operation["requestBody"] = {
                "required": True, "content": {"application/json": {"schema": refs[(spec.request, "validation")]}},
            }  # fmt: skip
            operation["x-result-schema"] = refs[(spec.result, "serialization")]
        app.openapi_schema = schema
        return schema

    return openapi
