"""Named speakers: one fixed voice per engine, kept in Redis where every worker and restart finds it.

A speaker is one hash field (:data:`SPEAKERS_KEY`, no expiry) holding a JSON :class:`Speaker`. It
names its voice on each rung: a ChatTTS embedding (given as a string, or sampled from a seed on
the model that speaks), a Piper voice file (+ speaker id), an espeak-ng voice. What it does not
name is derived from its ``slot``, a small number given once at registration (the lowest one no
other speaker holds), so two speakers differ on every rung: another seed, another espeak-ng
variant, another Piper pitch. ``default`` is built in and needs no registration. A registered
speaker never changes; to change a voice, remove the speaker and register it again.

Plain Redis and pydantic: producers and the CLI use this module without any TTS package.

    register_speaker("narrator", seed=42)
    register_speaker("guard", espeak_voice="en-gb+m3", piper_voice="piper/en_GB-alan-medium.onnx")
    register_speaker("mei", voices={"zh": {"espeak_voice": "cmn+f3"}})   # its voice for Chinese text
    list_speakers()        # [Speaker(name="default", ...), Speaker(name="guard", ...), ...]
    remove_speaker("guard")
"""

from __future__ import annotations

import zlib
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mediafarm.tasks.kit import InvalidRequest, PermanentFailure, family_key, farm_redis, normalize_language

# The hash of every registered speaker: mediafarm:speakers, the name it had before families named
# their own keys (a new name would lose every speaker already registered).
SPEAKERS_KEY = family_key("speakers")
DEFAULT = "default"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# espeak-ng voices a speaker without its own gets, by slot: distinct variants of US English.
ESPEAK_VOICES = ("en-us", "en-us+m3", "en-us+f3", "en-us+m7", "en-us+f4", "en-us+m1", "en-us+f2", "en-us+m5")
# Pitch factors a speaker without its own Piper voice gets on a one-speaker voice, by slot
# (pitch moved, pace kept: see piper.py).
PIPER_PITCHES = (1.0, 0.88, 1.13, 0.94, 1.07, 0.82, 1.2, 0.97)
# ChatTTS speaker embeddings are base16384 text (CJK ideographs U+4E00-U+8DFF, one U+3Dxx tail).
_B16384 = r"^[\u4e00-\u8dff]+[\u3d01-\u3d06]?$"
_ESPEAK_VOICE = r"^[a-z]{2,3}(-[A-Za-z0-9]+)*(\+[A-Za-z0-9_-]+)?$"
_PIPER_VOICE = r"^[^\x00]+\.onnx$"


def _inside_models(value: str | None) -> str | None:
    if value is not None and (value.startswith("/") or ".." in value.split("/")):
        raise ValueError("must be a path inside FARM_MODELS_DIR (relative, no '..')")
    return value


class LanguageVoice(BaseModel):
    """A speaker's voices for one language, used for a job in that language instead of its own.

    Attributes:
        piper_voice: Piper: a voice file under FARM_MODELS_DIR that speaks the language.
        piper_speaker: Piper: the speaker id in that voice.
        espeak_voice: espeak-ng: a voice of the language, with an optional variant (``cmn+f3``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    piper_voice: str | None = Field(None, pattern=_PIPER_VOICE)
    piper_speaker: int | None = Field(None, ge=0, lt=10_000)
    espeak_voice: str | None = Field(None, pattern=_ESPEAK_VOICE)

    @field_validator("piper_voice")
    @classmethod
    def _inside_models(cls, value: str | None) -> str | None:
        return _inside_models(value)


class Speaker(BaseModel):
    """One named speaker.

    Attributes:
        name: What jobs call it (``speaker="narrator"``).
        slot: Given at registration; picks the voices the speaker does not name.
        seed: ChatTTS: sample the speaker embedding with this seed (on the model that speaks).
        embedding: ChatTTS: the speaker embedding itself (``chat.sample_random_speaker()``'s string).
        piper_voice: Piper: a voice file under FARM_MODELS_DIR (``.onnx`` with its ``.onnx.json``).
        piper_speaker: Piper: the speaker id in a multi-speaker voice.
        espeak_voice: espeak-ng: a voice, with an optional variant (``en-us+m3``).
        voices: Language (ISO 639-1) → the speaker's voices for a job in that language; a rung
            speaks the speaker's own voice (or its slot's) in a language it has none for here.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    slot: int = Field(0, ge=0)
    seed: int | None = Field(None, ge=0, lt=2**31)
    embedding: str | None = Field(None, min_length=8, max_length=8192, pattern=_B16384)
    piper_voice: str | None = Field(None, pattern=_PIPER_VOICE)
    piper_speaker: int | None = Field(None, ge=0, lt=10_000)
    espeak_voice: str | None = Field(None, pattern=_ESPEAK_VOICE)
    voices: dict[Annotated[str, Field(pattern=r"^[a-z]{2,3}$")], LanguageVoice] = Field(default_factory=dict)

    @field_validator("piper_voice")
    @classmethod
    def _inside_models(cls, value: str | None) -> str | None:
        return _inside_models(value)

    def for_language(self, language: str | None) -> Speaker:
        """This speaker as it speaks a job in ``language``: its voices for that language in place
        of its own. Its own espeak-ng voice is kept only if it is of that language (an English
        voice must never read Chinese): without it the engine takes its slot's variant of a voice
        of the language."""
        if language is None:
            return self
        chosen = self.voices.get(language)
        update = {k: v for k, v in (chosen.model_dump() if chosen else {}).items() if v is not None}
        if "espeak_voice" not in update and self.espeak_voice is not None:
            if _primary(self.espeak_voice) != language:
                update["espeak_voice"] = None
        return self.model_copy(update=update) if update else self

    @model_validator(mode="after")
    def _one_chattts_voice(self) -> Speaker:
        if self.seed is not None and self.embedding is not None:
            raise ValueError("give a seed or an embedding for ChatTTS, not both")
        return self

    @property
    def chattts_seed(self) -> int:
        """The seed the ChatTTS embedding is sampled with when none is given."""
        if self.seed is not None:
            return self.seed
        return zlib.crc32(self.name.encode()) % 100_000 * 8 + self.slot % 8

    @property
    def espeak(self) -> str:
        return self.espeak_voice or ESPEAK_VOICES[self.slot % len(ESPEAK_VOICES)]

    @property
    def piper_pitch(self) -> float:
        """Pitch factor on a one-speaker voice (1.0 when the speaker names a voice or speaker id)."""
        if self.piper_voice is not None or self.piper_speaker is not None:
            return 1.0
        return PIPER_PITCHES[self.slot % len(PIPER_PITCHES)]


BUILT_IN = Speaker(name=DEFAULT, slot=0, seed=2)


def _primary(voice: str) -> str:
    """The language of an espeak-ng voice name as a request names it (``cmn+f3`` → ``zh``)."""
    return normalize_language(voice.split("+", 1)[0])


def _parse(raw: bytes | str) -> Speaker:
    return Speaker.model_validate_json(raw)


def get_speaker(name: str, client: Any = None) -> Speaker:
    """The speaker called ``name``; PermanentFailure (the job is rejected) if none is registered."""
    if name == DEFAULT:
        return BUILT_IN
    raw = (client or farm_redis()).hget(SPEAKERS_KEY, name)
    if raw is None:
        raise PermanentFailure(f"no speaker named {name!r} is registered (farm speakers add {name} ...)")
    return _parse(raw)


def list_speakers(client: Any = None) -> list[Speaker]:
    """Every speaker, ``default`` first, then by name."""
    stored = (client or farm_redis()).hgetall(SPEAKERS_KEY)
    return [BUILT_IN] + sorted((_parse(v) for v in stored.values()), key=lambda s: s.name)


def register_speaker(name: str, client: Any = None, **voices: Any) -> Speaker:
    """Register speaker ``name`` with the voices given (``seed`` or ``embedding``, ``piper_voice``,
    ``piper_speaker``, ``espeak_voice``); it gets the lowest free slot.

    Raises:
        InvalidRequest: a malformed name or voice, or ``name`` is taken (remove it first: a
            registered voice never changes under a job).
    """
    client = client or farm_redis()
    if name == DEFAULT:
        raise InvalidRequest(f"speaker {DEFAULT!r} is built in and cannot be registered again")
    if "slot" in voices:
        raise InvalidRequest("a speaker's slot is given by the store, not by the caller")
    try:
        Speaker(name=name, **voices)  # every field checked before Redis is touched
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'speaker'}: {e['msg']}" for e in exc.errors())
        raise InvalidRequest(f"speaker {name!r}: {problems}") from None
    key = SPEAKERS_KEY
    registered: list[Speaker] = []

    def claim(pipe: Any) -> None:
        # WATCHed: two registrations racing for the same free slot cannot both win it.
        stored = pipe.hgetall(key)
        if name.encode() in stored or name in stored:
            raise InvalidRequest(f"a speaker named {name!r} is already registered; remove it first")
        taken = {BUILT_IN.slot} | {_parse(v).slot for v in stored.values()}
        speaker = Speaker(name=name, slot=min(set(range(len(taken) + 1)) - taken), **voices)
        pipe.multi()
        pipe.hset(key, name, speaker.model_dump_json(exclude_none=True))
        registered.append(speaker)

    client.transaction(claim, key)
    return registered[-1]


def remove_speaker(name: str, client: Any = None) -> bool:
    """Remove a registered speaker; False if there was none. ``default`` cannot be removed."""
    if name == DEFAULT:
        raise InvalidRequest(f"speaker {DEFAULT!r} is built in and cannot be removed")
    return bool((client or farm_redis()).hdel(SPEAKERS_KEY, name))
