"""``POST /v1/audio/transcriptions``: OpenAI's transcription route, answered by a subtitle job.

The multipart body's file is streamed into the upload store as it arrives (``FARM_UPLOAD_MAX_MB``
bounds it, as ``POST /v1/uploads``), a ``subtitle`` job is submitted naming it, and the route waits
for the job without holding a thread (a look at its state every poll interval). The answer is made
from the job's canonical ``subtitles.json`` (segments with their words and times) and its SRT and
WebVTT files, in OpenAI's shapes. The upload is removed once the job has ended (it counts against
``FARM_UPLOAD_MAX_COUNT`` only while it runs); the job itself stays, named by ``X-Farm-Job``.
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any, Literal

import anyio
from fastapi import Depends, HTTPException, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mediafarm.gateway.common.intake import UPLOAD_PREFIX, prepare
from mediafarm.gateway.common.submit import job_url, submitted, webhook_options
from mediafarm.gateway.common.upload_receiver import receive_form, refuse_declared_size, upload_refusals
from mediafarm.gateway.openai.models import TRANSCRIPTION, UnknownModel, in_openai_words, openai_router, resolve
from mediafarm.gateway.security import Caller, caller
from mediafarm.gateway.settings import GatewayConfig
from mediafarm.tasks import registry
from mediafarm.tasks.producer.bells import bell
from mediafarm.tasks.producer.client import submit
from mediafarm.tasks.producer.handles import JobHandle, describe_failure
from mediafarm.tasks.wire.family import describe_validation_error
from mediafarm.tasks.wire.plan import READY
from mediafarm.tasks.wire.records import ArtifactInfo
from mediafarm.tasks.wire.upload_store import Upload, UploadStore

router = openai_router("/v1/audio")

TranscriptFormat = Literal["json", "text", "srt", "vtt", "verbose_json"]
# OpenAI's field names for the subtitle request's, in the family's messages.
FIELD_NAMES = {"media": "file", "ladder": "model"}
_in_openai_words = functools.partial(in_openai_words, family=TRANSCRIPTION, route="transcription",
                                     field_names=FIELD_NAMES)  # fmt: skip


class TranscriptionForm(BaseModel):
    """OpenAI's form fields. Attributes: model (a ladder or rung of the subtitle family, or
    ``whisper-1``), language (ISO 639-1; detected when absent), response_format,
    timestamp_granularities (``segment`` and/or ``word``, for verbose_json), prompt and
    temperature (accepted, not honoured: no rung takes a prompt, and every rung decodes greedily
    or by beam search, not by sampling), stream (false only: the answer comes whole)."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    language: str | None = Field(None, pattern=r"^[a-z]{2,3}$")
    response_format: TranscriptFormat = "json"
    timestamp_granularities: list[Literal["segment", "word"]] = Field(default_factory=lambda: ["segment"])
    prompt: str | None = None
    temperature: float = Field(0.0, ge=0.0, le=1.0)
    stream: Literal["false", "False", "0"] = "false"


def _form(fields: dict[str, list[str]]) -> TranscriptionForm:
    values: dict[str, Any] = {k: v[-1] for k, v in fields.items() if k != "timestamp_granularities[]"}
    if "timestamp_granularities[]" in fields:
        values["timestamp_granularities"] = fields["timestamp_granularities[]"]
    if values.get("language") == "":
        values.pop("language")
    try:
        return TranscriptionForm.model_validate(values)
    except ValidationError as exc:
        raise HTTPException(422, f"transcription request: {describe_validation_error(exc)}") from None


async def _receive(request: Request, store: UploadStore, owner: str) -> tuple[Upload, dict[str, list[str]]]:
    """The form's file, streamed into the upload store, and its text fields."""
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise HTTPException(422, "transcription request: the body must be multipart/form-data with the audio in 'file'")
    refuse_declared_size(request, store, multipart=True)
    with upload_refusals("transcription request: "):
        return await receive_form(store, owner, content_type, request.stream())


@router.post(
    "/transcriptions", summary="Text of speech in an audio or video file (OpenAI's audio.transcriptions)",
    responses={404: {"description": "unknown model"}, 413: {"description": "larger than FARM_UPLOAD_MAX_MB"},
               422: {"description": "a field does not fit, or the file holds no audio"}},
)  # fmt: skip
async def transcriptions(
    request: Request, who: Annotated[Caller, Depends(caller)],
    hook: Annotated[dict[str, Any], Depends(webhook_options)],
) -> Response:
    store: UploadStore = request.app.state.uploads
    config: GatewayConfig = request.app.state.config
    upload, raw = await _receive(request, store, who.owner)
    try:
        form = _form(raw)
        try:
            model = resolve(TRANSCRIPTION, form.model)
        except UnknownModel as exc:
            raise HTTPException(404, str(exc)) from None
        job = await submitted(lambda: _send(form, model.ladder, upload, who.owner, store, config, hook),
                              words=_in_openai_words)  # fmt: skip
        envelope = await _wait(request, job, config.poll_interval)
        answer = await anyio.to_thread.run_sync(_answer, form, envelope, job, config)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_forget, store, upload)
    headers = {"X-Farm-Job": job.id, "X-Farm-Rung": envelope.get("rung", ""), "Location": job_url(job.id)}
    if isinstance(answer, str):
        return PlainTextResponse(answer, headers=headers)
    return JSONResponse(answer, headers=headers)


def _send(form: TranscriptionForm, ladder: str | None, upload: Upload, owner: str, store: UploadStore,
          config: GatewayConfig, hook: dict[str, Any]) -> JobHandle:  # fmt: skip
    spec = registry.get(TRANSCRIPTION)
    body: dict[str, Any] = {"media": UPLOAD_PREFIX + upload.id, "formats": ["srt", "vtt"]}
    if form.language:
        body["language"] = form.language
    if ladder is not None:
        body["ladder"] = ladder
    intake = prepare(spec, body, owner, store, config.input_roots)
    job = submit(spec.name, tenant=owner, **hook, **intake.fields)
    store.attach(upload, job.id)
    return job


async def _wait(request: Request, job: JobHandle, poll: float) -> dict[str, Any]:
    """The job's envelope once it succeeded; the failure as an HTTP error otherwise. A client
    that hangs up meanwhile cancels the job (seen at the latest ``poll`` seconds on)."""
    with bell(job.id, kinds=()) as ring:  # before the first look: only the stored end rings it
        while True:
            state = await anyio.to_thread.run_sync(job.state)
            if state in READY:
                break
            if await request.is_disconnected():
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(job.cancel)
                raise HTTPException(499, "the client went away; the job was cancelled")
            await ring.changed(poll)
    if state == "SUCCESS":
        envelope = await anyio.to_thread.run_sync(job.envelope)
        if envelope is not None:
            return envelope
    failure = describe_failure(await anyio.to_thread.run_sync(job.failure)) or {}
    status = 422 if failure.get("kind") == "rejected" else 500
    raise HTTPException(status, f"transcription job {job.id} ended {state}: {failure.get('reason', 'no result')}")


def _answer(form: TranscriptionForm, envelope: dict[str, Any], job: JobHandle, config: GatewayConfig) -> Any:
    """The answer in OpenAI's shape for ``form.response_format`` (blocking: reads the job's files)."""
    output = envelope["output"]
    infos = {a["name"]: ArtifactInfo.from_json(a) for a in envelope.get("artifacts", [])}

    def text_of(name: str) -> str:  # from the object store or the storage folder, sha256 checked
        return job.read_artifact(infos.get(name) or name, config.storage_dir).decode("utf-8")

    fmt = form.response_format
    if fmt in ("srt", "vtt"):
        return text_of(output["files"][fmt])
    canonical = json.loads(text_of(output["files"]["json"]))
    segments = canonical.get("segments", [])
    text = " ".join(s["text"].strip() for s in segments if s["text"].strip())
    if fmt == "text":
        return text + "\n"
    if fmt == "json":
        return {"text": text}
    verbose: dict[str, Any] = {"task": "transcribe", "language": output["language"], "duration": output["duration"],
                               "text": text}  # fmt: skip
    if "segment" in form.timestamp_granularities:
        verbose["segments"] = [{"id": i, "start": s["start"], "end": s["end"], "text": s["text"]}
                               for i, s in enumerate(segments)]  # fmt: skip
    if "word" in form.timestamp_granularities:
        verbose["words"] = [{"word": w["text"], "start": w["start"], "end": w["end"]}
                            for s in segments for w in s.get("words", [])]  # fmt: skip
    return verbose


def _forget(store: UploadStore, upload: Upload) -> None:
    """The upload is the job's input only while it runs (a cancelled one may still be reading it:
    it fails, which it was going to)."""
    try:
        store.delete(upload.owner, upload.id)
    except LookupError:
        pass

