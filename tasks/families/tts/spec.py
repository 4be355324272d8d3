"""What a TTS job takes and returns, its engines, its default ladder and how the CLI shows it.

Imported by every farm process, producers included: nothing heavy here (ChatTTS, Piper and
PyAV are imported by the engines, in the pool child).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from rich.table import Table

from mediafarm.tasks.families.tts.languages import (
    chattts_languages,
    espeak_languages,
    piper_languages,
    request_language,
)
from mediafarm.tasks.families.tts.resume import RESUME
from mediafarm.tasks.families.tts.speakers import DEFAULT, NAME_PATTERN
from mediafarm.tasks.families.tts.text import check_text
from mediafarm.tasks.kit import EngineSpec, FamilySpec, Params, Request, TimeLimits, rung

ENGINES = "mediafarm.tasks.families.tts.engines"
# Light on purpose (every producer imports this module): the encoders are in audio.py.
AudioFormat = Literal["wav", "opus", "mp3"]


class TtsRequest(Request):
    """Attributes: text (up to ``text.MAX_TEXT_CHARS`` characters, valid Unicode, no control
    characters but newlines and tabs, not only punctuation), speaker (a registered name; ``default`` always exists),
    speed (0.5-2, 1 is the voice's own pace), language (ISO 639-1: the text's language; when
    absent it is detected from the text's script, ``tts.languages``; a rung that does not speak it
    is skipped, and a job no rung speaks is rejected at once), format
    (wav, opus in Ogg, mp3), ladder (a declared ladder of the tts family, or a rung of its own
    ladder to start from: ``piper`` speaks with Piper and falls back to espeak-ng; default: the
    whole ladder)."""

    text: Annotated[str, AfterValidator(check_text)]
    speaker: str = Field(DEFAULT, pattern=NAME_PATTERN)
    speed: float = Field(1.0, ge=0.5, le=2.0)
    language: str | None = Field(None, pattern=r"^[a-z]{2,3}$")
    format: AudioFormat = "wav"
    ladder: str | None = None


class SentenceTiming(BaseModel):
    """Where one sentence is spoken in the audio, seconds. Attributes: text, start, end."""

    text: str
    start: float
    end: float


class TtsResult(BaseModel):
    """What a TTS job made.

    Attributes:
        audio: The audio artifact's name (``speech.wav`` / ``speech.ogg`` / ``speech.mp3``).
        format: wav, opus or mp3.
        duration: Seconds of audio.
        sample_rate: Of the audio file (Opus is always 48 kHz).
        sentences: Every sentence with its start and end in the audio, in order; a dialogue or
            subtitles take their cue times from here.
        chunks: Engine calls made; ``chunks/chunk_NNNNN.wav`` hold their audio, in order.
        speaker: The speaker asked for.
        rung: The ladder rung that spoke (also the envelope's ``rung``).
        voice: The engine, model and voice that spoke, e.g. ``eSpeak NG text-to-speech 1.51 en-us+m3``.
        language: The language the text was spoken as: the request's, else the one its script
            tells (``zh`` for Chinese characters); None when neither tells it (Latin-only text).
    """

    model_config = ConfigDict(frozen=True)

    audio: str
    format: AudioFormat
    duration: float
    sample_rate: int
    sentences: list[SentenceTiming]
    chunks: int
    speaker: str
    rung: str
    voice: str
    language: str | None = None


class ChatTTSParams(Params):
    """Attributes: model (folder under FARM_MODELS_DIR, ChatTTS's ``asset/`` layout), max_chars
    (characters an engine call speaks: ~30 s of speech on a GPU), max_new_token (audio tokens a
    call may make, ~47 a second: the hard stop of one call), temperature."""

    model: str = Field("chattts", min_length=1)
    max_chars: int = Field(300, ge=20, le=2000)
    max_new_token: int = Field(2048, ge=8, le=4096)
    temperature: float = Field(0.3, gt=0, le=2)


class PiperParams(Params):
    """Attributes: voice (``.onnx`` under FARM_MODELS_DIR, its ``.onnx.json`` beside it; a
    speaker's own voice wins), max_chars, noise_scale and noise_w_scale (0: deterministic),
    threads (onnxruntime's threads per child: one, so a pool's concurrency is its cores; by
    default onnxruntime takes every core in every child, and two children were slower than one)."""

    voice: str = Field("piper/en_US-joe-medium.onnx", pattern=r"\.onnx$")
    max_chars: int = Field(400, ge=20, le=5000)
    noise_scale: float = Field(0.0, ge=0, le=2)
    noise_w_scale: float = Field(0.0, ge=0, le=2)
    threads: int = Field(1, ge=1, le=64)


class EspeakParams(Params):
    """Attributes: binary (an espeak-ng program to speak with where it is on PATH, such as Debian's
    ``espeak-ng`` or an operator's wrapper; None, the default: the tts extra's libespeak-ng wheel, in
    process), max_chars."""

    binary: str | None = None
    max_chars: int = Field(400, ge=20, le=5000)


def summary(result: TtsResult) -> str:
    language = f", language {result.language}" if result.language else ""
    return (f"{result.duration:.2f} s of {result.format} ({result.sample_rate} Hz), {len(result.sentences)} sentences "
            f"in {result.chunks} chunks, speaker {result.speaker}, voice {result.voice}{language}")  # fmt: skip


def render(result: TtsResult) -> Table:
    table = Table("#", "start (s)", "end (s)", "sentence", title=result.audio)
    for i, sentence in enumerate(result.sentences, 1):
        text = sentence.text if len(sentence.text) <= 70 else sentence.text[:69] + "…"
        table.add_row(str(i), f"{sentence.start:.2f}", f"{sentence.end:.2f}", text)
    return table


FAMILY = FamilySpec(
    name="tts",
    task_name="farm.tts.synthesize",
    description="Speech from text: a fixed voice per named speaker, long text chunked and streamed",
    request=TtsRequest,
    result=TtsResult,
    engines={
        "chattts": EngineSpec(
            f"{ENGINES}:chattts", ChatTTSParams, needs=("ChatTTS", "torch", "av", "numpy"), extra="tts",
            weights="model", languages=chattts_languages,
        ),
        "piper": EngineSpec(
            f"{ENGINES}:piper", PiperParams, needs=("piper", "onnxruntime", "av", "numpy"), extra="tts",
            languages=piper_languages, languages_by_request=True,
        ),
        # espeak-ng is the espeakng-loader wheel's library, in process (or a program the rung names).
        # The wheel is the need (the tts extra installs it): a pool always has a voice.
        "espeak": EngineSpec(
            f"{ENGINES}:espeak", EspeakParams, needs=("espeakng_loader", "av", "soundfile", "numpy"), extra="tts",
            languages=espeak_languages,
        ),
    },
    ladder=(
        rung("chattts", "chattts", device="cuda", model="chattts", max_chars=300),
        # Slower than real time on a CPU: shorter calls, so the first audio comes sooner.
        rung("chattts-cpu", "chattts", model="chattts", max_chars=120, max_new_token=1024),
        rung("piper", "piper", voice="piper/en_US-joe-medium.onnx"),
        rung("espeak", "espeak"),
    ),
    # One attempt. espeak-ng on a CPU speaks the longest text (text.MAX_TEXT_CHARS) well within it
    # (measured: docs/benchmarks/resume.md, TTS); a CPU ChatTTS would not, and moves down at the soft limit.
    limits=TimeLimits(soft=1800, hard=1900, stall=300),
    cli_argument="text",
    ladder_field="ladder",
    # Rungs that do not speak the text's language are skipped: Chinese never goes to an English voice.
    language=request_language,
    # A long text goes on from its last finished chunk on the same rung (tts.resume says why not across).
    resume=RESUME,
    summary=summary,
    render=render,
    # `farm speakers add/list/rm`: the speaker store's commands.
    cli="mediafarm.tasks.families.tts.cli:speakers",
)
