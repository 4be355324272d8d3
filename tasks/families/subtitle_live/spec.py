"""Live subtitles: what a job on a stream takes and returns, its engines, ladder, limits and settings.

A stream is not a file: it has no end the job knows of, so this is a family of its own (its own
queue, so a live job that holds a child for an hour never sits in front of file jobs, and its own
limits, since the file family's hard limit would kill it). Imported by every farm process: light.

Limits of a job that never ends (docs/families/subtitle-live.md):

- ``FARM_LIVE_MAX_SECONDS`` (operator, default 3600): the longest a live job runs, its attempts'
  running time added up (up to each lost attempt's last checkpoint; the wait for the next attempt,
  which after a worker's death is the broker's visibility timeout, is not counted); the job then
  ends with ``end_reason`` saying so.
  The family's time limits are derived from it (soft = max + 120 s, hard = max + 180 s), so the
  watchdog's hard limit only ever catches an engine that failed to stop itself, and the worker's
  start-up check (hard limit below the visibility timeout) bounds what an operator may set.
- ``stall_timeout_s`` (request, default 10 s): no audio from the source for that long ends the job
  (``end_reason`` "stalled ..."); a stream that ends (EOF: TCP closed, HLS ENDLIST) ends it too.
- The pool's child RSS cap, as for every job: the watchdog kills a child past it, and the job comes
  back on its next rung, from the live edge (the part it missed recorded as a gap).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from mediafarm.tasks.families.subtitle.records import Cue, CueRules
from mediafarm.tasks.families.subtitle.spec import SubtitleFormat, TimingReport, WhisperParams
from mediafarm.tasks.families.subtitle_live.sources import SourceNotAllowed, check_source, parse_url
from mediafarm.tasks.kit import (
    CommaList,
    EngineSpec,
    FamilySpec,
    NoParams,
    Request,
    Resume,
    TimeLimits,
    rung,
)

ENGINES = "mediafarm.tasks.families.subtitle_live.live"
# Decoding, the cue writers and silero's ONNX model (the live VAD runs silero only).
NEEDS = ("av", "numpy", "webvtt", "srt", "onnxruntime", "silero_vad")
# Time the engine has after FARM_LIVE_MAX_SECONDS to write its last files, before the soft limit.
WIND_DOWN_SECONDS = 120


class LiveSettings(BaseSettings):
    """The operator's live-source settings (environment, prefix ``FARM_LIVE_``).

    Attributes:
        sources: ``FARM_LIVE_SOURCES``, comma-separated: ``loopback`` (default) and/or
            ``scheme://host[:port]`` / ``scheme://network`` entries (``subtitle_live.sources``).
        max_seconds: ``FARM_LIVE_MAX_SECONDS``: the longest a live job runs, its attempts' running time added up.
    """

    model_config = SettingsConfigDict(env_prefix="FARM_LIVE_", extra="ignore")

    sources: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["loopback"])
    max_seconds: int = Field(3600, ge=10)

    @field_validator("sources", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [p.strip() for p in value.split(",") if p.strip()]
        return value


def _stream_shape(value: str) -> str:
    try:
        parse_url(value)
    except SourceNotAllowed as exc:
        raise ValueError(str(exc)) from None
    return value.strip()


class LiveSubtitleRequest(Request):
    """Attributes: stream (a URL FFmpeg reads live: ``udp://``, ``tcp://`` MPEG-TS, ``http://``
    HLS ...; only from the operator's FARM_LIVE_SOURCES), formats (whole-stream files written at
    the end, besides the JSON), language (ISO 639-1; detected from the first speech when absent),
    rules (how words become cues), chunk_seconds (window of each WebVTT segment: short, since a
    cue is published when its window is final), stall_timeout_s (no audio this long ends the
    job), ladder (a declared ladder of this family, or a rung of its own to start from)."""

    stream: str
    formats: Annotated[list[SubtitleFormat], CommaList] = Field(
        default_factory=lambda: ["vtt", "srt", "json"], min_length=1, validation_alias=AliasChoices("formats", "format")
    )
    language: str | None = Field(None, pattern=r"^[a-z]{2,3}$")
    rules: CueRules = Field(default_factory=CueRules)
    chunk_seconds: float = Field(2.0, ge=1.0, le=60.0)
    stall_timeout_s: float = Field(10.0, ge=1.0, le=600.0)
    ladder: str | None = None

    @field_validator("stream")
    @classmethod
    def _stream(cls, value: str) -> str:
        return _stream_shape(value)


class Gap(BaseModel):
    """Stream time no output covers: [start, end) on the cue clock, and why (a lost attempt)."""

    start: float
    end: float
    reason: str


class LiveTimingReport(TimingReport):
    """The file checks (``TimingReport``) over the whole stream, and the live clock's record.

    Attributes:
        origin_pts: Stream PTS (seconds) of cue time 0; cue time t is stream PTS origin + t + the jumps before it.
        discontinuities: Timestamp jumps found in the source, each re-anchored (the cue clock runs on).
        drift_ms_max: Largest difference between the stream's PTS and the sample clock between two
            frames that was not a jump (followed: cues take the PTS).
        gaps: Stream time no output covers (a killed attempt until the next one joined the live edge).
        latency_ms_p50, latency_ms_p95, latency_ms_max: From the moment the audio of an utterance's
            end was sent (the stream's real-time pace places it) to its cue's segment and playlist
            being written; None without cues.
        latencies: Cues the latency was measured for.
    """

    origin_pts: float | None = None
    discontinuities: list[dict[str, float]] = Field(default_factory=list)
    drift_ms_max: float = 0.0
    gaps: list[Gap] = Field(default_factory=list)
    latency_ms_p50: float | None = None
    latency_ms_p95: float | None = None
    latency_ms_max: float | None = None
    latencies: int = 0


class LiveSubtitleResult(BaseModel):
    """What a live subtitle job made.

    Attributes:
        stream: The URL read.
        end_reason: Why the job ended: ``ended`` (the stream ended), ``stalled ...``, ``maximum duration ...``.
        language, model: As for files.
        duration: Cue-clock seconds the job covered (gaps included).
        speech_seconds, spans, words, cues: As for files.
        speech: The speech spans the VAD found, [start, end] on the cue clock.
        rules: The cue rules applied.
        timing: The file checks and the live clock's record (jumps, drift, gaps, latency).
        files: Format → artifact name (``json`` always).
        playlist: The HLS subtitle playlist.
        attempts: Attempts the job ran on (1 when nothing was lost).
    """

    model_config = ConfigDict(frozen=True)

    stream: str
    end_reason: str
    language: str
    model: str
    duration: float
    speech_seconds: float
    spans: int
    words: int
    cues: int
    speech: list[tuple[float, float]]
    rules: CueRules
    timing: LiveTimingReport
    files: dict[str, str]
    playlist: str
    attempts: int = 1


def _probe(request: LiveSubtitleRequest) -> None:
    # In the pool child before the model loads: a source the operator did not list is refused at once.
    from mediafarm.tasks.kit import InvalidRequest

    try:
        check_source(request.stream, LiveSettings().sources)
    except SourceNotAllowed as exc:
        raise InvalidRequest(f"subtitle-live request: {exc}") from None


def summary(result: LiveSubtitleResult) -> str:
    t = result.timing
    latency = f", latency p95 {t.latency_ms_p95:.0f} ms" if t.latency_ms_p95 is not None else ""
    return (f"{result.cues} cues over {result.duration:.0f} s of stream ({result.end_reason}), model {result.model}"
            f"{latency}, {len(t.discontinuities)} jumps, {len(t.gaps)} gaps")  # fmt: skip


def _limits() -> TimeLimits:
    longest = LiveSettings().max_seconds
    # A live source may stay silent up to its request's stall_timeout_s (600 s at most) before it
    # ends the job itself, waiting inside PyAV where no sign of life can be given.
    return TimeLimits(soft=longest + WIND_DOWN_SECONDS, hard=longest + WIND_DOWN_SECONDS + 60, stall=660)


FAMILY = FamilySpec(
    name="subtitle-live",
    task_name="farm.subtitle-live.transcribe",
    description="Live subtitles of a stream (MPEG-TS over UDP/TCP, HLS): WebVTT segments and an HLS playlist "
    "as cues become final",
    probe=_probe,
    request=LiveSubtitleRequest,
    result=LiveSubtitleResult,
    engines={
        "whisper": EngineSpec(f"{ENGINES}:whisper", WhisperParams, needs=("faster_whisper", "ctranslate2", *NEEDS),
                              extra="subtitle", weights="model"),
        "pocketsphinx": EngineSpec(f"{ENGINES}:pocketsphinx", NoParams, needs=("pocketsphinx", *NEEDS),
                                   extra="subtitle"),
    },  # fmt: skip
    ladder=(
        rung("whisper-large", "whisper", device="cuda", model="faster-whisper-large-v3", compute_type="float16"),
        # Live wants a cue within seconds on a CPU: tiny.en, one thread, greedy.
        # Fitted encoder as the subtitle family's tiny.en rung (a live utterance is a few seconds).
        rung("whisper-tiny", "whisper", model="faster-whisper-tiny.en", compute_type="int8", fit_context=True),
        rung("pocketsphinx", "pocketsphinx"),
    ),
    limits=_limits(),
    cli_argument="stream",
    ladder_field="ladder",
    summary=summary,
    resume=Resume(
        unit="seconds",
        rule="from the stream's live edge, on any rung; the stream time missed in between is recorded as a gap",
    ),
)

__all__ = ["FAMILY", "Cue", "Gap", "LiveSettings", "LiveSubtitleRequest", "LiveSubtitleResult", "LiveTimingReport"]
