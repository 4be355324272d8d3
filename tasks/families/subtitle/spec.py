"""What a subtitle job takes and returns, its engines, its default ladder and how the CLI shows it.

Imported by every farm process, producers included: nothing heavy here (the recognisers import
faster-whisper / pocketsphinx in the pool child).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from rich.table import Table

from mediafarm.tasks.families.subtitle.languages import pocketsphinx_languages, request_language, whisper_languages
from mediafarm.tasks.families.subtitle.records import CueRules, RejectedSpan
from mediafarm.tasks.kit import (
    CommaList,
    EngineSpec,
    FamilySpec,
    Made,
    MediaPath,
    NoParams,
    Params,
    Request,
    ResultMetric,
    Resume,
    TimeLimits,
    rung,
)

ENGINES = "mediafarm.tasks.families.subtitle.engines"
# What every recogniser's engine imports besides its model: decoding, the cue writers. Its VAD is
# silero when the pool has it (the VAD family's needs say so), else webrtcvad, which the VAD
# family's extra installs: neither is a need of its own.
WRITING = ("av", "numpy", "webvtt", "srt")
# Where viewers notice subtitles that are early or late (the subtitle story).
PERCEPTIBLE_MS = 112.0

SubtitleFormat = Literal["vtt", "srt", "json"]


class SubtitleRequest(Request):
    """Attributes: media (audio or video inside FARM_MEDIA_ROOTS), formats (files besides the
    canonical JSON, which is always written), language (ISO 639-1 code; detected when absent),
    rules (how words become cues), chunk_seconds (window of the chunked WebVTT segments),
    ladder (a declared ladder of the subtitle family, or a rung of its own ladder to start from:
    ``whisper-tiny`` recognises with tiny.en and falls back to pocketsphinx; default: the whole
    ladder)."""

    media: MediaPath
    # `format` too: `farm submit subtitle talk.mp4 --format vtt,srt`.
    formats: Annotated[list[SubtitleFormat], CommaList] = Field(
        default_factory=lambda: ["vtt", "srt", "json"], min_length=1, validation_alias=AliasChoices("formats", "format")
    )
    language: str | None = Field(None, pattern=r"^[a-z]{2,3}$")
    rules: CueRules = Field(default_factory=CueRules)
    chunk_seconds: float = Field(10.0, ge=2.0, le=600.0)
    ladder: str | None = None


class LateCue(BaseModel):
    """A cue whose start is more than PERCEPTIBLE_MS from the nearest speech onset the VAD found."""

    index: int
    start: float
    offset_ms: float


class TimingReport(BaseModel):
    """The timestamp checks of one output, as data.

    Attributes:
        cues: Cues checked.
        monotonic: Every cue starts no earlier than the one before.
        overlaps: Cues that overlap the next one (0 when sound).
        outside_media: Cues that end after the media does or start before 0.
        in_silence: Cues lying wholly inside what the VAD found silent (0 when sound).
        words_in_silence: Words touching no speech span the VAD found, widened by the padding the
            speech is cut out with (0 when sound: only that audio is recognised, so a word there is a
            time mapped wrongly). None where words were not counted (a report made before this check).
        rule_violations: Cue-rule violations (line width, lines, duration, gap).
        offset_ms_median, offset_ms_p95, offset_ms_max: Distribution of |cue start - nearest
            speech onset|, in milliseconds (None without cues).
        threshold_ms: The bound the late cues pass.
        late: Every cue over the bound, with its offset.
        continuing: Cues that start inside a span of speech the cue before them already reaches
            into (a sentence cut into two cues): no onset of their own, left out of the offsets.
        refined_by: How the word times the cues were made from were refined after recognition
            (the subtitle engine: against the audio's energy, onsets.py); None where they are the
            recogniser's own.
    """

    cues: int = 0
    monotonic: bool = True
    overlaps: int = 0
    outside_media: int = 0
    in_silence: int = 0
    words_in_silence: int | None = None
    rule_violations: list[str] = Field(default_factory=list)
    offset_ms_median: float | None = None
    offset_ms_p95: float | None = None
    offset_ms_max: float | None = None
    threshold_ms: float = PERCEPTIBLE_MS
    late: list[LateCue] = Field(default_factory=list)
    continuing: int = 0
    refined_by: str | None = None


# A word the recogniser gives less than this probability is one it is unsure of; a rising share of
# them is the subtitles story's early sign of a failing recogniser (wrong language, noise, a model
# degraded by its rung).
UNSURE_BELOW = 0.4


class Confidence(BaseModel):
    """How sure the recogniser was of its words. Attributes: scored (words that came with a
    probability; pocketsphinx gives none), mean (their mean probability), unsure_share (the share
    of them under 0.4). mean and unsure_share are None when no word was scored."""

    scored: int = 0
    mean: float | None = None
    unsure_share: float | None = None


class SubtitleResult(BaseModel):
    """What a subtitle job made.

    Attributes:
        language: The language recognised in (ISO code; ``und`` when nothing was said).
        language_probability: The recogniser's confidence in it; None when given or not detected.
        model: The recogniser and its version.
        duration: Seconds of audio decoded.
        speech_seconds: Seconds the VAD found speech in, tonal spans set aside (only these were recognised).
        spans: Speech spans recognised.
        words: Words recognised.
        cues: Cues written.
        rules: The cue rules applied (a re-render with other rules starts from subtitles.json).
        timing: The timestamp checks.
        files: Format → artifact name (``json`` always).
        playlist: The chunked WebVTT playlist's artifact name.
        confidence: The recogniser's word probabilities, summed up (the workers count them:
            ``mediafarm_recognition_word_probability``, ``mediafarm_recognition_unsure_share``).
        made: Which rung recognised which stretch of the media, when the job resumed from a
            checkpoint (issue #19); empty when one attempt made it all. Each cue in
            subtitles.json names its rung too.
        rejected: Spans the VAD found that were not recognised, each with its reason (``tonal``:
            a held note or chord, tonal.py); subtitles.json lists them too.
    """

    model_config = ConfigDict(frozen=True)

    language: str
    language_probability: float | None = None
    model: str
    duration: float
    speech_seconds: float
    spans: int
    words: int
    cues: int
    rules: CueRules
    timing: TimingReport
    files: dict[str, str]
    playlist: str | None = None
    confidence: Confidence = Field(default_factory=Confidence)
    made: list[Made] = Field(default_factory=list)
    rejected: list[RejectedSpan] = Field(default_factory=list)


class WhisperParams(Params):
    """Attributes: model (folder under FARM_MODELS_DIR, CTranslate2 format with tokenizer.json),
    compute_type (CTranslate2's: float16, int8_float16, int8 ...), beam_size, cpu_threads,
    batch_size (recognition windows encoded and decoded together; 1, the default, decodes one
    window at a time, publishes its cues as it is done and re-decodes a window that stopped early;
    on one CPU thread batches saved 7-16 % of the CPU, and a batch of 4 held 1.6x a child's memory
    (docs/benchmarks/subtitle.md); GPU rungs batch), fit_context (the encoder sees a
    window's audio and a few seconds of silence instead of Whisper's whole 30 s, several times
    cheaper for a short window; a decode that then repeats itself is done again with the whole
    30 s: recognisers.encoder_frames; off by default, on for the rung whose model it was measured
    with, tiny.en: a shorter encoder input is outside how Whisper was trained, and its effect on
    other models and languages is unmeasured here). The device is the rung's own
    (``device = "cuda"`` in the ladder)."""

    model: str = Field(min_length=1)
    compute_type: str = "int8"
    beam_size: int = Field(1, ge=1, le=10)
    cpu_threads: int = Field(1, ge=1, le=64)
    batch_size: int = Field(1, ge=1, le=64)
    fit_context: bool = False


def summary(result: SubtitleResult) -> str:
    prob = f" ({result.language_probability:.2f})" if result.language_probability is not None else ""
    t = result.timing
    offsets = f"onset offset median {t.offset_ms_median:.0f} ms, p95 {t.offset_ms_p95:.0f} ms" if t.cues else ""
    aside = f", {len(result.rejected)} non-speech spans not recognised" if result.rejected else ""
    return (f"{result.cues} cues, {result.words} words{aside}, language {result.language}{prob}, "
            f"model {result.model}  {offsets}")  # fmt: skip


def render(result: SubtitleResult) -> Table:
    table = Table("check", "result", title="timestamp checks")
    t = result.timing
    table.add_row("monotonic, no overlap", "yes" if t.monotonic and not t.overlaps else f"NO ({t.overlaps} overlaps)")
    table.add_row("inside the media", "yes" if not t.outside_media else f"NO ({t.outside_media})")
    table.add_row("cues in silence", str(t.in_silence))
    table.add_row("words in silence", "not counted" if t.words_in_silence is None else str(t.words_in_silence))
    table.add_row(f"cues > {t.threshold_ms:.0f} ms from a speech onset", str(len(t.late)))
    table.add_row("cue rule violations", str(len(t.rule_violations)))
    table.add_row("files", ", ".join(sorted(result.files.values())))
    return table


def _probe(request: SubtitleRequest) -> None:
    # Imported here: PyAV is a pool child's package, and this module is every producer's.
    from mediafarm.tasks.kit.media import probe_audio

    probe_audio(request.media)


# One observation per finished job that scored its words (docs/operating.md, "Metrics").
SHARES = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
CONFIDENCE_METRICS = (
    ResultMetric.histogram("recognition_word_probability", "confidence.mean",
                           "Mean word probability of a finished recognition job", buckets=SHARES),
    ResultMetric.histogram("recognition_unsure_share", "confidence.unsure_share",
                           f"Share of a finished recognition job's words under probability {UNSURE_BELOW}",
                           buckets=SHARES),
)  # fmt: skip


FAMILY = FamilySpec(
    name="subtitle",
    task_name="farm.subtitle.transcribe",
    description="Subtitles (WebVTT, SRT, JSON) of an audio or video file: VAD first, then recognition",
    probe=_probe,
    request=SubtitleRequest,
    result=SubtitleResult,
    engines={
        "whisper": EngineSpec(
            f"{ENGINES}:whisper", WhisperParams, needs=("faster_whisper", "ctranslate2", *WRITING), extra="subtitle",
            weights="model", languages=whisper_languages,
        ),
        "pocketsphinx": EngineSpec(
            f"{ENGINES}:pocketsphinx", NoParams, needs=("pocketsphinx", *WRITING), extra="subtitle",
            languages=pocketsphinx_languages,
        ),
    },
    ladder=(
        rung(
            "whisper-large",
            "whisper",
            device="cuda",
            model="faster-whisper-large-v3",
            compute_type="float16",
            beam_size=5,
            # A GPU encodes and decodes a batch of windows in about the time of one (on one CPU
            # thread a batch costs what its windows do one by one: docs/benchmarks/subtitle.md).
            batch_size=8,
        ),  # fmt: skip
        rung("whisper-small", "whisper", model="faster-whisper-small", compute_type="int8", cpu_threads=2),
        # The encoder fitted to each window: measured on tiny.en, no fewer words right for less CPU;
        # beam 3 got fewer words wrong than greedy for a little more CPU, beam 5 more CPU and more
        # words wrong than beam 3 (docs/benchmarks/subtitle.md, "Fitted encoder").
        rung("whisper-tiny", "whisper", model="faster-whisper-tiny.en", compute_type="int8", fit_context=True,
             beam_size=3),  # fmt: skip
        # Its model ships inside the wheel: always there. Poor on synthetic speech, but real.
        rung("pocketsphinx", "pocketsphinx"),
    ),
    # One attempt: tiny.en on one CPU thread subtitles 2 h well within it (measured:
    # docs/benchmarks/subtitle.md, rungs).
    limits=TimeLimits(soft=3600, hard=3700, stall=300),
    cli_argument="media",
    ladder_field="ladder",
    # A request's language skips the rungs that do not recognise it (tiny.en for French).
    language=request_language,
    metrics=CONFIDENCE_METRICS,
    summary=summary,
    render=render,
    resume=Resume(
        unit="seconds",
        rule=(
            "from the last recognition window done (after the VAD pass, kept), on any rung: the same recogniser "
            "goes on exactly; a lower one recognises the rest, and each cue names the rung that made it"
        ),
    ),
)
