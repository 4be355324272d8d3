"""The subtitle-render engine: words from the source job's subtitles.json → cues → files."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from mediafarm.tasks.families.subtitle.checks import SilentWords, timing_report
from mediafarm.tasks.families.subtitle.cues import build_cues
from mediafarm.tasks.families.subtitle.engines import JSON_NAME, SRT_NAME, VTT_NAME
from mediafarm.tasks.families.subtitle.records import Segment
from mediafarm.tasks.families.subtitle.windows import PAD_SECONDS
from mediafarm.tasks.families.subtitle.writers import to_srt, to_webvtt
from mediafarm.tasks.families.subtitle_render.spec import RenderRequest, RenderResult
from mediafarm.tasks.kit import EngineContext, NoParams, PermanentFailure, Span, describe_validation_error


class NoSubtitles(PermanentFailure):
    """The source job has no subtitles.json here (not a subtitle job, expired, or another storage)."""


class BadSubtitles(PermanentFailure):
    """The source job's subtitles.json is not what a subtitle job writes (edited, or another program's)."""


class SpeechSpan(BaseModel):
    """A speech span of the source, seconds."""

    start: float
    end: float


class SourceDocument(BaseModel):
    """What a re-render reads of a subtitle job's subtitles.json (the rest of it is not needed).

    Attributes:
        segments: The recognised segments, with their words.
        speech: The speech spans the VAD found.
        duration: Seconds of the source media.
    """

    segments: list[Segment] = Field(default_factory=list)
    speech: list[SpeechSpan] = Field(default_factory=list)
    duration: float = 0.0


def _document(source: str, canonical: Any) -> SourceDocument:
    # A hand-edited or foreign file failed the job as an engine error on its first missing key
    # (found by the malformed-input battery): it is bad input, named as such.
    problem = f"job {source!r}: {JSON_NAME} is not a subtitle job's document"
    if not isinstance(canonical, dict):
        raise BadSubtitles(f"{problem}: a JSON {type(canonical).__name__} where an object is expected")
    try:
        return SourceDocument.model_validate(canonical)
    except ValidationError as exc:
        raise BadSubtitles(f"{problem}: {describe_validation_error(exc)}") from None


def render(ctx: EngineContext, request: RenderRequest, params: NoParams) -> RenderResult:
    try:
        canonical = json.loads(ctx.read_artifact_of(request.source, JSON_NAME).decode("utf-8"))
    except FileNotFoundError:
        raise NoSubtitles(
            f"job {request.source!r} has no {JSON_NAME} in FARM_STORAGE_DIR or the object store "
            "(expired, or not a subtitle job)"
        ) from None
    except (OSError, ValueError) as exc:
        raise NoSubtitles(f"job {request.source!r}: {JSON_NAME} cannot be read ({exc})") from exc
    document = _document(request.source, canonical)
    words = [w for segment in document.segments for w in segment.words]
    cues = build_cues(words, request.rules)
    speech = [Span(s.start, s.end) for s in document.speech]
    silent_words = SilentWords(speech, PAD_SECONDS)
    silent_words.add(words)
    # The words are the source job's, refined (or not) as its timing report says.
    timing = canonical.get("timing")
    refined_by = timing.get("refined_by") if isinstance(timing, dict) else None
    report = timing_report(
        cues, speech, document.duration, request.rules, words_in_silence=silent_words.count,
        refined_by=refined_by if isinstance(refined_by, str) else None,
    )  # fmt: skip
    files = {}
    if "vtt" in request.formats:
        files["vtt"] = VTT_NAME
        ctx.artifacts.write_text(VTT_NAME, to_webvtt(cues))
    if "srt" in request.formats:
        files["srt"] = SRT_NAME
        ctx.artifacts.write_text(SRT_NAME, to_srt(cues))
    return RenderResult(source=request.source, cues=len(cues), rules=request.rules, timing=report, files=files)
