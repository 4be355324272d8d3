"""``POST /v1/audio/speech``: OpenAI's speech route, answered by a TTS job whose chunks stream out
as they are made (chunked transfer: the first chunk's audio leaves while later ones are spoken).

The job is an ordinary ``tts`` job, submitted with the producer API under a fresh id (or the
request's ``Idempotency-Key``), so it can be followed, fetched and cancelled like any other
(``X-Farm-Job`` names it; ``Location`` is its URL). The response's headers are sent with its first
chunk: ``X-Farm-Rung`` names the rung that speaks it. A job that fails before its first chunk is
an HTTP error; one whose audio was already being sent and cannot go on (``speech_stream``) ends
with a body cut short, which clients report as an error. A client that hangs up before the end
cancels the job, unless it sent an ``Idempotency-Key``: the same key sent again streams the same
job's audio again from its start, without speaking it twice.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import anyio
from fastapi import Depends, Header, HTTPException, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mediafarm.config.priorities import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from mediafarm.gateway.common.submit import check_idempotency_key, job_url, json_body, submitted, webhook_options
from mediafarm.gateway.openai.models import SPEECH, UnknownModel, in_openai_words, openai_router, resolve
from mediafarm.gateway.openai.speech_stream import NoAudio, SpeechFollower, StreamBroken, StreamEncoder
from mediafarm.gateway.security import Caller, caller
from mediafarm.gateway.settings import GatewayConfig
from mediafarm.tasks.families.tts import get_speaker
from mediafarm.tasks.producer.bells import bell
from mediafarm.tasks.producer.client import submit
from mediafarm.tasks.producer.handles import JobHandle
from mediafarm.tasks.producer.job_feed import JobWatch
from mediafarm.tasks.wire.errors import InvalidRequest, PermanentFailure
from mediafarm.tasks.wire.family import describe_validation_error

logger = logging.getLogger(__name__)
router = openai_router("/v1/audio")

ResponseFormat = Literal["mp3", "opus", "wav", "pcm"]
MEDIA_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg; codecs=opus", "wav": "audio/wav", "pcm": "audio/pcm"}
# The TTS job's own file (its artifact): the streamed format where the family makes it.
JOB_FORMAT = {"mp3": "mp3", "opus": "opus", "wav": "wav", "pcm": "wav"}
# OpenAI's field names for the TTS request's, in the family's messages.
FIELD_NAMES = {"text": "input", "speaker": "voice", "format": "response_format", "ladder": "model"}
_in_openai_words = functools.partial(in_openai_words, family=SPEECH, route="speech", field_names=FIELD_NAMES)


class SpeechRequest(BaseModel):
    """OpenAI's speech body. Attributes: model (a ladder or rung of the tts family, or ``tts-1`` /
    ``tts-1-hd``), input, voice (a registered speaker), response_format, speed (0.5-2 here:
    what the TTS family takes), instructions (accepted, not honoured: no rung takes a style
    prompt), stream_format (``audio`` only: the body is the audio itself)."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    input: str
    voice: str = Field(min_length=1)
    response_format: ResponseFormat = "mp3"
    speed: float = 1.0
    instructions: str | None = None
    stream_format: Literal["audio"] = "audio"


def _parse(body: Any) -> SpeechRequest:
    if not isinstance(body, dict):
        raise HTTPException(422, "speech request: the body must be a JSON object")
    try:
        return SpeechRequest.model_validate(body)
    except ValidationError as exc:
        raise HTTPException(422, f"speech request: {describe_validation_error(exc)}") from None


@router.post(
    "/speech", summary="Speech from text, streamed as it is made (OpenAI's audio.speech)",
    response_class=StreamingResponse,
    responses={200: {"content": {t: {} for t in MEDIA_TYPES.values()},
                     "description": "the audio, chunked; X-Farm-Rung and X-Farm-Job say who spoke it"},
               404: {"description": "unknown model or voice"}, 422: {"description": "a field does not fit"}},
)  # fmt: skip
async def speech(
    request: Request,
    who: Annotated[Caller, Depends(caller)],
    hook: Annotated[dict[str, Any], Depends(webhook_options)],
    idempotency_key: Annotated[
        str | None,
        Header(description="The job's id: sent again, the same key streams the same job's audio again from its start"),
    ] = None,
    x_priority: Annotated[
        int, Header(ge=MIN_PRIORITY, le=MAX_PRIORITY, description="The job's priority: higher runs first")
    ] = DEFAULT_PRIORITY,
) -> StreamingResponse:
    check_idempotency_key(idempotency_key)
    asked = _parse(await json_body(request))
    try:
        model = resolve(SPEECH, asked.model)
    except UnknownModel as exc:
        raise HTTPException(404, str(exc)) from None
    try:
        await anyio.to_thread.run_sync(get_speaker, asked.voice)
    except PermanentFailure as exc:
        raise HTTPException(404, f"voice {asked.voice!r}: {exc}") from None
    except InvalidRequest as exc:
        raise HTTPException(422, f"speech request: voice: {exc}") from None
    fields: dict[str, Any] = {"text": asked.input, "speaker": asked.voice, "speed": asked.speed,
                              "format": JOB_FORMAT[asked.response_format]}  # fmt: skip
    if model.ladder is not None:
        fields["ladder"] = model.ladder
    job_id = idempotency_key or str(uuid.uuid4())

    def send() -> JobHandle:
        return submit(SPEECH, job_id=job_id, priority=x_priority, tenant=who.owner, **hook, **fields)

    job = await submitted(send, idempotency_key, _in_openai_words)
    config: GatewayConfig = request.app.state.config
    return await _stream(request, job, asked.response_format, config, cancel_on_hang_up=idempotency_key is None)


async def _stream(request: Request, job: JobHandle, fmt: str, config: GatewayConfig, *,
                  cancel_on_hang_up: bool) -> StreamingResponse:  # fmt: skip
    """Wait for the first chunk (the headers name its rung), then stream the rest as it comes."""
    follower = SpeechFollower(job, config.storage_dir)
    encoder = StreamEncoder(fmt)
    watch = JobWatch(job)
    # Rung by chunks and by the end: a chunk's read brings the attempts with it (a new one's first
    # chunk says it restarted), and its end is the stored state.
    ring = bell(job.id, kinds=("partial",))

    def step(rung: bool) -> bytes:
        """The audio the job made since the last step. Rung: it changed, read it; else a look of one
        Redis round trip first (``JobWatch``), the job read in full only when that shows a change."""
        if not rung and not watch.changed():
            return b""
        return b"".join(encoder.feed(pcm) for pcm in follower.poll())

    try:
        # The first look once the subscription is live (it rings then): nothing made before it is missed.
        rung = await ring.changed(config.speech_poll)
        while True:
            first = await anyio.to_thread.run_sync(step, rung)
            if first:
                break
            if await request.is_disconnected():
                if cancel_on_hang_up:
                    await anyio.to_thread.run_sync(job.cancel)
                raise HTTPException(499, "the client went away before the first chunk")
            rung = await ring.changed(config.speech_poll)
    except NoAudio as exc:
        ring.close()
        kind = (exc.failure or {}).get("kind")
        status = 422 if kind == "rejected" else 409 if kind == "cancelled" else 500
        raise HTTPException(status, f"speech job {job.id} ended {exc.state} before any audio: {exc}") from None
    except StreamBroken as exc:
        ring.close()
        raise HTTPException(500, str(exc)) from None
    except BaseException:
        ring.close()
        await anyio.to_thread.run_sync(encoder.close)
        raise

    async def body() -> AsyncIterator[bytes]:
        ended = broken = False
        try:
            yield first
            while not follower.done:
                rung = await ring.changed(config.speech_poll)
                data = await anyio.to_thread.run_sync(step, rung)
                if data:
                    yield data
            yield await anyio.to_thread.run_sync(encoder.finish)
            ended = True
        except StreamBroken as exc:
            broken = True
            logger.warning("speech stream of job %s cut short: %s", job.id, exc)
            raise
        finally:
            ring.close()
            if not ended:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(encoder.close)
                    if cancel_on_hang_up and not broken:  # the client hung up: nobody is listening any more
                        await anyio.to_thread.run_sync(job.cancel)

    headers = {"X-Farm-Job": job.id, "X-Farm-Rung": follower.rung or "", "Location": job_url(job.id),
               "X-Farm-Sample-Rate": str(follower.rate), "Cache-Control": "no-store"}  # fmt: skip
    return StreamingResponse(body(), media_type=MEDIA_TYPES[fmt], headers=headers)
