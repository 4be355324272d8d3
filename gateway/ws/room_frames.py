"""The frames of a dialogue room (``WebSocket /v1/rooms/{room}``): what a client may send, checked
field by field, and the frames the room sends back. docs/gateway.md ("Dialogue rooms") is the
protocol's manual; this module is its one definition.

A client sends JSON text frames:

- a line: ``{"seq": 0, "speaker": "narrator", "text": "...", "language": "en", "speed": 1.0}``
  (``"type": "line"`` may be given; ``language``, ``speed`` and ``ladder`` are optional): one TTS job;
- ``{"type": "end"}``: leave the room now (unfinished lines are cancelled), or
  ``{"type": "end", "finish": true}``: no more lines; send every accepted line, then close.

A frame that does not fit is answered with an ``error`` frame (``common.ws_close.error``) naming
the field; the room lives on. Its codes: ``invalid`` (a frame that does not fit), ``out_of_order``
(a seq other than the next one), ``busy`` (past the room's bound), ``conflict`` (a seq sent before
with another line), ``failed`` (the line's job failed for good), ``overloaded`` (the farm's
admission control refused the job: ``retry_after``), ``unavailable`` (the farm's broker cannot be
reached).
"""

from __future__ import annotations

import io
import json
import wave
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from mediafarm.tasks.families.tts import TtsRequest

# A room name is a part of its lines' job ids (``room_job_id``): a storage folder and a URL hold it.
ROOM_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
# The largest line number: job ids stay short, and JSON numbers exact in every client language.
MAX_SEQ = 2**31 - 1
# A chunk's audio goes in binary frames of at most this many seconds, each a WAV file of its own:
# an engine's chunk can hold 25 s (over 1 MB), past the message size clients accept by default
# (1 MiB in the Python websockets client), and a second is a jitter buffer's natural step.
AUDIO_FRAME_SECONDS = 1.0


class FrameError(ValueError):
    """A client frame that does not fit. Attributes: field (the field at fault, None for the frame
    as a whole), seq (the line's number, when it was readable)."""

    def __init__(self, message: str, field: str | None = None, seq: int | None = None) -> None:
        super().__init__(message)
        self.field, self.seq = field, seq


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["line"] = "line"
    seq: StrictInt = Field(ge=0, le=MAX_SEQ)
    speaker: str
    text: str
    language: str | None = None
    speed: float | None = None
    ladder: str | None = None


class _End(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["end"]
    finish: StrictBool = False


@dataclass(frozen=True)
class Line:
    """A line to speak. Attributes: seq (its place in the room), speaker, fields (the TTS job's
    request fields, checked against the TTS family's request model)."""

    seq: int
    speaker: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class End:
    """The client leaves. Attributes: finish (send every accepted line first)."""

    finish: bool


def _problem(exc: ValidationError) -> tuple[str | None, str]:
    error = exc.errors()[0]
    field = ".".join(str(p) for p in error["loc"]) or None
    return field, f"{field}: {error['msg']}" if field else error["msg"]


def parse_frame(text: str) -> Line | End:
    """The client frame ``text`` holds; FrameError naming the field that does not fit."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise FrameError(f"a frame must be a JSON object: {exc}") from None
    if not isinstance(data, dict):
        raise FrameError("a frame must be a JSON object ({\"seq\": ..., \"speaker\": ..., \"text\": ...})")
    kind = data.get("type", "line")
    seq = data.get("seq") if isinstance(data.get("seq"), int) else None
    if kind == "end":
        try:
            return End(_End.model_validate(data).finish)
        except ValidationError as exc:
            field, message = _problem(exc)
            raise FrameError(message, field) from None
    if kind != "line":
        raise FrameError(f"type: {kind!r} is not a frame a room takes ('line' or 'end')", "type", seq)
    try:
        line = _Line.model_validate(data)
        fields: dict[str, Any] = {"text": line.text, "speaker": line.speaker, "format": "wav"}
        optional = (("language", line.language), ("speed", line.speed), ("ladder", line.ladder))
        fields.update({k: v for k, v in optional if v is not None})
        # The TTS family's own request model: the same rules as a job sent any other way.
        TtsRequest.model_validate(fields)
    except ValidationError as exc:
        field, message = _problem(exc)
        raise FrameError(message, field, seq) from None
    return Line(line.seq, line.speaker, fields)


def room_job_id(owner: str, room: str, seq: int) -> str:
    """The id of a room's line job: the same owner, room and seq are the same job, so a line sent
    again (a reconnect) is never spoken twice. The owner keeps two tokens' rooms apart."""
    return f"room:{owner}:{room}:{seq}"


@dataclass(frozen=True)
class AudioFrame:
    """One binary frame of a chunk's audio. Attributes: wav (a whole WAV file), offset and
    samples (where it is in the chunk, in samples), rate (None: the chunk was not a PCM WAV and
    goes whole)."""

    wav: bytes
    offset: int
    samples: int
    rate: int | None


def audio_frames(data: bytes, seconds: float = AUDIO_FRAME_SECONDS) -> list[AudioFrame]:
    """A chunk's WAV file cut into WAV files of at most ``seconds`` each, in order."""
    try:
        with wave.open(io.BytesIO(data)) as source:
            params = source.getparams()
            pcm = source.readframes(params.nframes)
    except (wave.Error, EOFError):
        return [AudioFrame(data, 0, 0, None)]
    width = params.sampwidth * params.nchannels
    total = len(pcm) // width
    step = max(int(params.framerate * seconds), 1)
    frames = []
    for offset in range(0, max(total, 1), step):
        count = min(step, total - offset)
        out = io.BytesIO()
        with wave.open(out, "wb") as piece:
            piece.setparams(params)
            piece.writeframes(pcm[offset * width : (offset + count) * width])
        frames.append(AudioFrame(out.getvalue(), offset, count, params.framerate))
    return frames
