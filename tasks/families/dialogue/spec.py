"""The dialogue family: lines spoken by TTS jobs in parallel, assembled in order with subtitles.

``submit("dialogue", script=...)`` (or ``farm submit dialogue script.json``) checks the whole
script, then sends a pipeline (``tasks.wire.plan``): one ``farm.tts.synthesize`` job per line
(``<id>.line-0001`` ...; each its own ladder and history) and, once all have ended, the assembly
``farm.dialogue.assemble`` under the dialogue's own id. The assembly takes no script: it reads the
stored plan and every line's result by id, in script order.

Imported by every farm process, producers included: nothing heavy here.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, model_validator
from rich.table import Table

from mediafarm.tasks.families.dialogue.script import DialogueLine, line_job_id, load_script
from mediafarm.tasks.families.tts.spec import AudioFormat, SentenceTiming
from mediafarm.tasks.kit import (
    EngineSpec,
    FamilySpec,
    InvalidRequest,
    Params,
    Part,
    PermanentFailure,
    Plan,
    Request,
    TimeLimits,
    rung,
    rung_named,
)

ENGINES = "mediafarm.tasks.families.dialogue.engines"


def _script(value: Any, info: ValidationInfo) -> Any:
    if value is None:
        return None
    if info.context is not None:  # in the worker (validated with the media roots): never read a file there
        raise ValueError(
            "farm.dialogue.assemble takes no script: it reads the plan the producer stored. Submit "
            "dialogues with mediafarm.submit('dialogue', script=...) or `farm submit dialogue script.json`"
        )
    return load_script(value)


class DialogueRequest(Request):
    """Attributes:
    script: The lines (``script.load_script``: a file path, ``{"lines": [...]}`` or a list);
        given by the producer only: the assembly reads the stored plan instead.
    pause: Seconds of silence between two lines (0-5).
    format: Of the assembled track: wav, opus (Ogg, 48 kHz) or mp3.
    speed: Every line's TTS speed (0.5-2).
    language: Every line's TTS language hint.
    """

    script: Annotated[tuple[DialogueLine, ...] | None, BeforeValidator(_script)] = None
    pause: float = Field(0.5, ge=0.0, le=5.0)
    format: AudioFormat = "wav"
    speed: float = Field(1.0, ge=0.5, le=2.0)
    language: str | None = Field(None, pattern=r"^[a-z]{2,3}$")

    def as_pipeline(self, job_id: str) -> Plan:
        """The dialogue as a pipeline: a TTS job per line, then the assembly under ``job_id``.

        Every speaker must be registered (checked here, once per name, before anything is sent).
        """
        from mediafarm.tasks.families.tts.speakers import get_speaker

        if self.script is None:
            raise InvalidRequest("dialogue request: script: a dialogue needs a script (its lines)")
        first_line: dict[str, int] = {}
        for number, line in enumerate(self.script, 1):
            first_line.setdefault(line.speaker, number)
        for speaker, number in first_line.items():
            try:
                get_speaker(speaker)
            except PermanentFailure as exc:
                raise InvalidRequest(f"dialogue request: script: line {number}: speaker: {exc}") from None
        voice: dict[str, Any] = {"speed": self.speed, **({"language": self.language} if self.language else {})}
        parts = tuple(
            Part("tts", line_job_id(job_id, n), {"text": line.text, "speaker": line.speaker, "format": "wav", **voice},
                 label=f"line {n} ({line.speaker})")
            for n, line in enumerate(self.script, 1)
        )  # fmt: skip
        then = Part("dialogue", job_id, {"pause": self.pause, "format": self.format}, label="assembly")
        return Plan(parts, then, parts_stage="lines", then_stage="assemble")


class LineAttempt(BaseModel):
    """One attempt of a line's TTS job. Attributes: rung (its name), outcome, reason; variant: the
    rung's name again, as the release before called it (written for one release)."""

    rung: str
    outcome: str | None
    reason: str = ""
    variant: str = ""

    _from_release_before = model_validator(mode="before")(rung_named)


class DialogueLineResult(BaseModel):
    """Where one line is in the track and who voiced it.

    Attributes:
        index: The line's number in the script, from 1.
        speaker, text: As the script says.
        start, end: Seconds in the track (its first sentence's start, its last one's end).
        sentences: Each sentence's start and end in the track (the cues).
        job_id: The line's TTS job.
        rung: The rung that voiced it (``espeak``, ``piper`` ...); voice: that rung's voice.
        sample_rate: The line job's audio rate; resampled: whether it was resampled to the track's.
        attempts: The line job's attempts (a killed one shows as ``killed``, then the next rung).
    """

    model_config = ConfigDict(frozen=True)

    index: int
    speaker: str
    text: str
    start: float
    end: float
    sentences: list[SentenceTiming]
    job_id: str
    rung: str
    voice: str
    sample_rate: int
    resampled: bool
    attempts: list[LineAttempt]


class DialogueResult(BaseModel):
    """The assembled dialogue.

    Attributes:
        audio: The track's artifact (``dialogue.wav`` / ``.ogg`` / ``.mp3``).
        format, sample_rate, duration: Of the track. The rate is the highest of the lines'
            (lines at another rate are resampled to it: samples of two rates joined as one
            would play at the wrong pitch and speed); Opus is always 48 kHz.
        pause: Seconds between lines.
        lines: Every line, in script order.
        cues: How many subtitle cues (one per sentence) the WebVTT and SRT files hold.
        subtitles: The artifacts ``dialogue.vtt``, ``dialogue.srt`` and ``dialogue.json``.
    """

    model_config = ConfigDict(frozen=True)

    audio: str
    format: AudioFormat
    sample_rate: int
    duration: float
    pause: float
    lines: list[DialogueLineResult]
    cues: int
    subtitles: list[str]


class AssembleParams(Params):
    """Attributes: wait_s (how long the assembly waits for a line the chord says is done but
    whose result is not readable yet; normally never)."""

    wait_s: float = Field(30.0, ge=0, le=600)


def summary(result: DialogueResult) -> str:
    rungs = sorted({line.rung for line in result.lines})
    return (f"{result.duration:.2f} s of {result.format} ({result.sample_rate} Hz), {len(result.lines)} lines, "
            f"{result.cues} cues, rungs {', '.join(rungs)}")  # fmt: skip


def render(result: DialogueResult) -> Table:
    table = Table("#", "speaker", "rung", "start (s)", "end (s)", "attempts", "text", title=result.audio)
    for line in result.lines:
        text = line.text if len(line.text) <= 60 else line.text[:59] + "…"
        tried = " → ".join(f"{a.rung}:{a.outcome}" for a in line.attempts)
        table.add_row(str(line.index), line.speaker, line.rung, f"{line.start:.2f}", f"{line.end:.2f}", tried, text)
    return table


FAMILY = FamilySpec(
    name="dialogue",
    task_name="farm.dialogue.assemble",
    description="A multi-speaker dialogue: each line a TTS job in parallel, assembled in order with WebVTT/SRT",
    request=DialogueRequest,
    result=DialogueResult,
    # webvtt and srt (the subtitles) come with the subtitle extra, which has the media packages too.
    engines={
        "assemble": EngineSpec(
            f"{ENGINES}:assemble", AssembleParams, needs=("av", "numpy", "soundfile", "webvtt", "srt"), extra="subtitle"
        )
    },
    # The assembly holds one line's audio at a time: a kill is not its own doing (the OOM killer
    # chose it, or an outside kill). The second rung is the same work once more, under the same id.
    ladder=(rung("assemble", "assemble"), rung("assemble-again", "assemble")),
    # Reading, resampling and encoding 500 lines (~40 minutes of audio) takes a small part of this
    # (the assembly measured: docs/benchmarks/dialogue.md).
    limits=TimeLimits(soft=600, hard=660, stall=300),
    cli_argument="script",
    summary=summary,
    render=render,
)
