"""The subtitle family's data: recognised words and segments, cues, and the rules that make cues.

All times are seconds on the media's own clock (a recogniser's span-relative times are mapped
back before they get here). Pydantic models, so that the canonical JSON artifact is their dump and
a re-render (new cue rules, no new recognition) starts from that JSON.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator


class Word(BaseModel):
    """One recognised word.

    Attributes:
        text: The word as the recogniser wrote it, stripped (punctuation attached, as Whisper gives it).
        start: Seconds from the start of the media.
        end: Seconds from the start of the media, >= start.
        probability: The recogniser's confidence, 0..1, when it gives one.
    """

    model_config = ConfigDict(frozen=True)

    text: str
    start: float
    end: float
    probability: float | None = None


class RejectedSpan(BaseModel):
    """A span the VAD found that was not recognised (tonal.py: a held note or chord, not speech).

    Attributes:
        start: Seconds from the start of the media.
        end: Seconds from the start of the media.
        reason: Why it was set aside (``tonal``).
        stable_share: Share of its frame pairs whose spectrum stayed the same (1: a held note).
    """

    model_config = ConfigDict(frozen=True)

    start: float
    end: float
    reason: str
    stable_share: float


class Segment(BaseModel):
    """A stretch of recognised speech (a Whisper segment, a pocketsphinx utterance).

    Attributes:
        start: Seconds from the start of the media.
        end: Seconds from the start of the media.
        text: The segment's text.
        words: Its words, in order, with their own times.
    """

    model_config = ConfigDict(frozen=True)

    start: float
    end: float
    text: str
    words: list[Word] = Field(default_factory=list)


class CueRules(BaseModel):
    """How words become cues; per job, recorded in the result so a re-render can change them.

    Attributes:
        max_line_chars: At most this many characters a line (Netflix-style 42).
        max_lines: At most this many lines a cue.
        max_cue_seconds: At most this long a cue.
        min_gap_seconds: At least this much time between one cue's end and the next one's start.
        min_cue_seconds: A cue is stretched to this length when the next cue leaves room.
        sentence_pause_seconds: A pause at least this long between words also ends a cue.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_line_chars: int = Field(42, ge=10, le=200)
    max_lines: int = Field(2, ge=1, le=4)
    max_cue_seconds: float = Field(7.0, gt=0.5, le=30)
    min_gap_seconds: float = Field(0.08, ge=0, le=2)
    min_cue_seconds: float = Field(0.7, ge=0, le=5)
    sentence_pause_seconds: float = Field(0.8, gt=0, le=10)

    @model_validator(mode="after")
    def _consistent(self) -> CueRules:
        if self.min_cue_seconds > self.max_cue_seconds:
            raise ValueError("min_cue_seconds must not exceed max_cue_seconds")
        return self


class Cue(BaseModel):
    """One subtitle cue.

    Attributes:
        start: Seconds from the start of the media.
        end: Seconds, > start.
        lines: The text, broken into lines at word boundaries.
        rung: The rung whose recogniser made it (a job that resumed on a lower rung has cues of
            two); None where no one said (a cue made outside a file job's engine). Left out of
            the JSON when None, so a result written before it existed reads the same.
    """

    model_config = ConfigDict(frozen=True)

    start: float
    end: float
    lines: tuple[str, ...]
    rung: str | None = None

    @model_serializer(mode="wrap")
    def _rung_when_known(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("rung") is None:
            data.pop("rung", None)
        return data

    @model_validator(mode="after")
    def _well_formed(self) -> Cue:
        if not self.end > self.start:
            raise ValueError(f"a cue must end after it starts ({self.start} → {self.end})")
        if not self.lines or any(not line or "\n" in line for line in self.lines):
            raise ValueError("a cue needs at least one line, none empty, none holding a line break")
        return self

    @property
    def text(self) -> str:
        return "\n".join(self.lines)
