"""The subtitle-render engine: words from the source job's subtitles.json → cues → files."""

from __future__ import annotations

import json

from mediafarm.tasks.context import EngineContext
from mediafarm.tasks.errors import PermanentFailure
from mediafarm.tasks.families.subtitle.checks import SilentWords, timing_report
from mediafarm.tasks.families.subtitle.cues import build_cues
from mediafarm.tasks.families.subtitle.engines import JSON_NAME, PAD_SECONDS, SRT_NAME, VTT_NAME
from mediafarm.tasks.families.subtitle.records import Segment
from mediafarm.tasks.families.subtitle.writers import to_srt, to_webvtt
from mediafarm.tasks.families.subtitle_render.spec import RenderRequest, RenderResult
from mediafarm.tasks.family import NoParams
from mediafarm.tasks.media.intervals import Span


class NoSubtitles(PermanentFailure):
    """The source job has no subtitles.json here (not a subtitle job, expired, or another storage)."""


def render(ctx: EngineContext, request: RenderRequest, params: NoParams) -> RenderResult:
    source = ctx.artifacts.of_job(request.source).path(JSON_NAME)
    try:
        canonical = json.loads(source.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NoSubtitles(
            f"job {request.source!r} has no {JSON_NAME} in FARM_STORAGE_DIR (expired, or not a subtitle job)"
        ) from None
    except (OSError, ValueError) as exc:
        raise NoSubtitles(f"job {request.source!r}: {JSON_NAME} cannot be read ({exc})") from exc
    words = [w for raw in canonical.get("segments", []) for w in Segment.model_validate(raw).words]
    cues = build_cues(words, request.rules)
    speech = [Span(s["start"], s["end"]) for s in canonical.get("speech", [])]
    silent_words = SilentWords(speech, PAD_SECONDS)
    silent_words.add(words)
    report = timing_report(
        cues, speech, float(canonical.get("duration", 0.0)), request.rules, words_in_silence=silent_words.count
    )
    files = {}
    if "vtt" in request.formats:
        files["vtt"] = VTT_NAME
        ctx.artifacts.write_text(VTT_NAME, to_webvtt(cues))
    if "srt" in request.formats:
        files["srt"] = SRT_NAME
        ctx.artifacts.write_text(SRT_NAME, to_srt(cues))
    return RenderResult(source=request.source, cues=len(cues), rules=request.rules, timing=report, files=files)
