"""OpenAI model names on this farm: which ladder or rung a ``model`` field asks for, and
``GET /v1/models``.

A model is a ladder of the family (its own, named after the family, or one declared for it in
``FARM_CONFIG_FILE``) or a rung of the family's own ladder, which the job then runs from that rung
down (``tasks.families.ladder_for``). OpenAI's own names are aliases of the family's own ladder:
``tts-1`` and ``tts-1-hd`` of ``tts``, ``whisper-1`` of ``subtitle``, so clients written for
OpenAI work unchanged and get the farm's best rung with its fallbacks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from mediafarm.gateway.security import caller
from mediafarm.tasks import families
from mediafarm.tasks.app import app as celery_app
from mediafarm.tasks.family import FamilySpec

SPEECH, TRANSCRIPTION = "tts", "subtitle"
ALIASES: dict[str, str] = {"tts-1": SPEECH, "tts-1-hd": SPEECH, "whisper-1": TRANSCRIPTION}
OWNER = "mediafarm"
# Asking every worker which queues it takes is a broadcast with a timeout: its answer is kept this long.
QUEUES_TTL_S = 10.0
QUEUES_TIMEOUT_S = 1.0
# OpenAI's ``created``: when these names came to be, here when this gateway started.
CREATED = int(time.time())



class OpenAIRoute(APIRoute):
    """A route of OpenAI's API: an error is answered in OpenAI's shape too (``{"error": {"message",
    "type", ...}}``, which OpenAI's clients show), beside the gateway's own ``detail``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except HTTPException as exc:
                kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
                error = {"message": exc.detail, "type": kind, "param": None, "code": str(exc.status_code)}
                return JSONResponse({"error": error, "detail": exc.detail}, exc.status_code, headers=exc.headers)

        return answer


def openai_router(prefix: str) -> APIRouter:
    return APIRouter(prefix=prefix, tags=["openai"], dependencies=[Depends(caller)], route_class=OpenAIRoute)


router = openai_router("/v1")


class UnknownModel(LookupError):
    """A ``model`` that is no ladder, rung or alias of the family."""


@dataclass(frozen=True)
class Model:
    """One name a client may send. Attributes: id, family, ladder (the request's ``ladder``
    field: None for the family's own), rungs (what it runs, in order), alias_of."""

    id: str
    family: str
    ladder: str | None
    rungs: tuple[str, ...]
    alias_of: str | None = None

    def to_json(self, created: int) -> dict[str, Any]:
        farm: dict[str, Any] = {"family": self.family, "rungs": list(self.rungs)}
        if self.alias_of:
            farm["alias_of"] = self.alias_of
        return {"id": self.id, "object": "model", "created": created, "owned_by": OWNER, "farm": farm}


def models_of(spec: FamilySpec) -> list[Model]:
    """Every model name of the family: its ladders, the rungs of its own ladder, its aliases."""
    own, *named = families.ladders_of(spec)
    whole = tuple(r.name for r in own.rungs)
    found = [Model(spec.name, spec.name, None, whole)]
    found += [Model(ladder.name, spec.name, ladder.name, tuple(r.name for r in ladder.rungs)) for ladder in named]
    taken = {m.id for m in found}
    found += [
        Model(rung.name, spec.name, rung.name, whole[i:])
        for i, rung in enumerate(own.rungs) if rung.name not in taken
    ]  # fmt: skip
    aliases = [alias for alias, family in ALIASES.items() if family == spec.name]
    found += [Model(alias, spec.name, None, whole, alias_of=spec.name) for alias in aliases]
    return found


def resolve(family: str, model: str) -> Model:
    """The model ``model`` names in ``family``; UnknownModel listing the names there are."""
    spec = families.get(family)
    known = models_of(spec)
    found = next((m for m in known if m.id == model), None)
    if found is None:
        raise UnknownModel(f"model {model!r} is not one this farm runs for {family}: "
                           f"{', '.join(m.id for m in known)}")  # fmt: skip
    return found


_queues: dict[str, Any] = {"at": -1e9, "queues": None}


def consumed_queues() -> set[str] | None:
    """The queues some live worker takes (asked by broadcast, kept QUEUES_TTL_S); None if no
    worker answered. Blocking: call it in a worker thread."""
    now = time.monotonic()
    if now - _queues["at"] > QUEUES_TTL_S:
        replies = celery_app.control.inspect(timeout=QUEUES_TIMEOUT_S).active_queues() or {}
        queues = {q["name"] for per_worker in replies.values() for q in per_worker}
        _queues.update(at=now, queues=queues or None)
    return _queues["queues"]


@router.get("/models", summary="The ladders and rungs this farm can run now, and OpenAI's aliases (OpenAI's list)")
async def list_models(who: Annotated[Any, Depends(caller)]) -> dict[str, Any]:
    queues = await anyio.to_thread.run_sync(consumed_queues)
    data = []
    for name in (SPEECH, TRANSCRIPTION):
        spec = families.load().get(name)
        if spec is None or not queues or spec.queue not in queues:
            continue  # no worker takes the family's jobs: nothing of it runs now
        data += [m.to_json(CREATED) for m in models_of(spec)]
    return {"object": "list", "data": data}
