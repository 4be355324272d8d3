"""OpenAI model names on this farm: which ladder or rung a ``model`` field asks for, and
``GET /v1/models``.

A model is a ladder of the family (its own, named after the family, or one declared for it in
``FARM_CONFIG_FILE``) or a rung of the family's own ladder, which the job then runs from that rung
down (``tasks.registry.ladder_for``). OpenAI's own names are aliases of the family's own ladder:
``tts-1`` and ``tts-1-hd`` of ``tts``, ``whisper-1`` of ``subtitle``, so clients written for
OpenAI work unchanged and get the farm's best rung with its fallbacks. ``GET /v1/models`` lists
only what the live workers say they can run (``tasks.wire.capability``), not what is declared.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from mediafarm.gateway.common.submit_errors import BROKER_ERRORS, STORE_ERRORS, broker_away, store_failed
from mediafarm.gateway.security import caller
from mediafarm.tasks import registry
from mediafarm.tasks.producer.client import farm_redis
from mediafarm.tasks.wire import capability
from mediafarm.tasks.wire.capability import WorkerCapability
from mediafarm.tasks.wire.errors import InvalidRequest
from mediafarm.tasks.wire.family import FamilySpec

SPEECH, TRANSCRIPTION = "tts", "subtitle"
ALIASES: dict[str, str] = {"tts-1": SPEECH, "tts-1-hd": SPEECH, "whisper-1": TRANSCRIPTION}
OWNER = "mediafarm"
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
            except (HTTPException, *BROKER_ERRORS, *STORE_ERRORS) as raised:
                exc = raised if isinstance(raised, HTTPException) else \
                    store_failed(raised) if isinstance(raised, STORE_ERRORS) else broker_away(raised)  # fmt: skip
                kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
                error = {"message": exc.detail, "type": kind, "param": None, "code": str(exc.status_code)}
                return JSONResponse({"error": error, "detail": exc.detail}, exc.status_code, headers=exc.headers)

        return answer


def in_openai_words(exc: BaseException, family: str, route: str, field_names: Mapping[str, str]) -> str:
    """An invalid request of ``family`` in an OpenAI route's words (``tts request: text: ...``
    becomes ``speech request: input: ...``), from the fields it names; any other error as it is."""
    if not isinstance(exc, InvalidRequest) or exc.request != family or not exc.problems:
        return str(exc)
    return f"{route} request: " + "; ".join(f"{field_names.get(f, f)}: {p}" for f, p in exc.problems)


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
    own, *named = registry.ladders_of(spec)
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
    spec = registry.get(family)
    known = models_of(spec)
    found = next((m for m in known if m.id == model), None)
    if found is None:
        raise UnknownModel(f"model {model!r} is not one this farm runs for {family}: "
                           f"{', '.join(m.id for m in known)}")  # fmt: skip
    return found


def capable_rungs(records: Sequence[WorkerCapability], family: str) -> dict[tuple[str, str], list[str]]:
    """(ladder, rung) -> the pools of the live workers that take the family's jobs and can run it."""
    found: dict[tuple[str, str], set[str]] = {}
    for record in records:
        for ladder, rungs in record.runnable(family).items():
            for name in rungs:
                found.setdefault((ladder, name), set()).add(record.pool)
    return {key: sorted(pools) for key, pools in found.items()}


def listing(records: Sequence[WorkerCapability]) -> dict[str, Any]:
    """OpenAI's model list of what the live workers can run (``records``): a ladder or alias when
    a worker can run one of its rungs, a rung's name when a worker can run that rung. Each entry's
    ``farm`` says which of its rungs run (``rungs``, in order), on which pools, and which of them
    no live worker can run (``unavailable``). With no live worker the list is empty and says so."""
    data = []
    for name in (SPEECH, TRANSCRIPTION):
        spec = registry.load().get(name)
        if spec is None:
            continue
        able = capable_rungs(records, spec.name)
        own, named = registry.ladder_for(spec).name, {lad.name for lad in registry.ladders_of(spec)}
        for model in models_of(spec):
            ladder = model.ladder if model.ladder in named else own  # a rung's name runs the own ladder from it
            runs = [r for r in model.rungs if (ladder, r) in able]
            if not runs or (model.id == model.rungs[0] and model.id not in runs):
                continue  # nothing of it runs now, or the rung it names does not
            entry = model.to_json(CREATED)
            entry["farm"].update(rungs=runs, pools={r: able[(ladder, r)] for r in runs})
            if len(runs) < len(model.rungs):
                entry["farm"]["unavailable"] = [r for r in model.rungs if r not in runs]
            data.append(entry)
    farm: dict[str, Any] = {"live_workers": len(records)}
    if not records:
        farm["note"] = ("no live worker has said what it can run (none is running, or none reaches this "
                        "gateway's Redis): no model runs now; a job sent waits in its queue for one")  # fmt: skip
    return {"object": "list", "data": data, "farm": farm}


@router.get("/models", summary="The ladders and rungs live workers can run now, and OpenAI's aliases (OpenAI's list)")
async def list_models(who: Annotated[Any, Depends(caller)]) -> dict[str, Any]:
    records = await anyio.to_thread.run_sync(capability.live, farm_redis())
    return listing(records)
