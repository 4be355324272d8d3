"""What a VAD job takes and returns, its engines, its default ladder and how the CLI shows it.

Imported by every farm process, producers included: nothing heavy here (the engines module
imports numpy, PyAV and silero in the pool child).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer
from rich.table import Table

from mediafarm.tasks.kit import (
    EngineSpec,
    FamilySpec,
    Made,
    MediaPath,
    NoParams,
    Params,
    Request,
    Resume,
    Span,
    TimeLimits,
    rung,
)

ENGINES = "mediafarm.tasks.families.vad.engines"


class VadRequest(Request):
    """Attributes: media (an audio or video file inside FARM_MEDIA_ROOTS; any format FFmpeg reads),
    if_no_audio (``reject``: a file without an audio track is bad input; ``empty``: it is
    answered with no spans and ``no_audio`` set, as a pipeline's VAD stage on a silent camera
    wants), ladder (a declared ladder of the vad family, ``[ladders.NAME] family = "vad"``;
    default: the family's)."""

    media: MediaPath
    if_no_audio: Literal["reject", "empty"] = "reject"
    ladder: str | None = None


class VadResult(BaseModel):
    """Speech found in one media file.

    Attributes:
        spans: Speech spans in seconds, sorted, non-overlapping.
        duration: Seconds of audio decoded (for ``skip``, the container's declared duration).
        model: Which model produced the spans, with its version.
        vad_skipped: True when no detection ran (the ``skip`` rung): spans are empty by
            design, not because the media is silent.
        no_audio: True when the media has no audio track (``if_no_audio="empty"``).
        made: Which rung made which stretch, when the job resumed from a checkpoint (issue #19);
            empty when one attempt made it all (the envelope's ``rung`` says which). A stretch
            made by ``skip`` had no detection (and ``vad_skipped`` is set).
    """

    model_config = ConfigDict(frozen=True)

    spans: list[Span] = Field(default_factory=list)
    duration: float = 0.0
    model: str = ""
    vad_skipped: bool = False
    no_audio: bool = False
    made: list[Made] = Field(default_factory=list)

    @field_serializer("spans")
    def _spans(self, spans: list[Span]) -> list[dict[str, float]]:
        return [s.to_json() for s in spans]

    @field_serializer("duration")
    def _duration(self, duration: float) -> float:
        return round(duration, 3)


class SileroParams(Params):
    """Attributes: threshold (speech probability), min_silence_ms (a gap shorter than this does
    not end a span), speech_pad_ms (padding added to each span)."""

    threshold: float = Field(0.5, gt=0, lt=1)
    min_silence_ms: int = Field(300, ge=0)
    speech_pad_ms: int = Field(30, ge=0)


class WebrtcParams(Params):
    """Attributes: aggressiveness (0-3, webrtcvad's mode), min_silence_ms (hangover before a span
    ends), min_speech_ms (shorter spans are dropped)."""

    aggressiveness: int = Field(2, ge=0, le=3)
    min_silence_ms: int = Field(300, ge=0)
    min_speech_ms: int = Field(150, ge=0)


def summary(result: VadResult) -> str:
    skipped = "  [yellow](VAD skipped)[/]" if result.vad_skipped else ""
    skipped += "  [yellow](no audio track)[/]" if result.no_audio else ""
    return f"model {result.model}  duration {result.duration:.2f} s  {len(result.spans)} speech spans{skipped}"


def render(result: VadResult) -> Table | str:
    if not result.spans:
        return "no speech spans" if result.vad_skipped or result.no_audio else "no speech found"
    table = Table("#", "start (s)", "end (s)", "length (s)")
    for i, span in enumerate(result.spans, 1):
        table.add_row(str(i), f"{span.start:.2f}", f"{span.end:.2f}", f"{span.end - span.start:.2f}")
    return table


def _probe(request: VadRequest) -> None:
    # Imported here: PyAV is a pool child's package, and this module is every producer's.
    from mediafarm.tasks.kit.media import probe_audio

    probe_audio(request.media, require_audio=request.if_no_audio == "reject")


FAMILY = FamilySpec(
    name="vad",
    task_name="farm.vad.detect",
    description="Speech spans of an audio or video file",
    probe=_probe,
    request=VadRequest,
    result=VadResult,
    engines={
        "silero": EngineSpec(
            f"{ENGINES}:silero", SileroParams, needs=("silero_vad", "onnxruntime", "av", "numpy"), extra="vad"
        ),
        "webrtc": EngineSpec(f"{ENGINES}:webrtc", WebrtcParams, needs=("webrtcvad", "av", "numpy"), extra="vad"),
        # No detection at all (no spans, the result flagged): a fallback, never a cheaper answer,
        # so an open breaker above it never sends a job here (tasks.runtime.ladder_choice).
        "skip": EngineSpec(f"{ENGINES}:skip", NoParams, needs=("av", "numpy"), extra="vad", fallback=True),
    },
    ladder=(
        # silero over PyAV blocks, one ONNX call per 10 s block; one ONNX thread per child, so concurrency = cores.
        rung("silero-onnx", "silero", threshold=0.5, min_silence_ms=300, speech_pad_ms=30),
        # webrtcvad: a few MB, no torch; coarser boundaries.
        rung("webrtc", "webrtc", aggressiveness=2, min_silence_ms=300, min_speech_ms=150),
        # The camera filter's --skip-vad: no spans, result flagged, the pipeline goes on.
        rung("skip", "skip"),
    ),
    # One attempt, not the whole ladder: VAD streams far faster than real time, so 6 h of audio fits
    # with room to spare (measured: docs/benchmarks/vad.md).
    limits=TimeLimits(soft=1800, hard=1900, stall=120),
    cli_argument="media",
    ladder_field="ladder",
    summary=summary,
    render=render,
    resume=Resume(
        unit="seconds",
        rule=(
            "from the last 10 s block that ended outside speech: on silero with the same parameters exactly as if "
            "never stopped; on another rung that rung detects the rest and the result's made says which rung made "
            "which part; webrtc writes no checkpoint (its detector's state cannot be saved)"
        ),
    ),
)
