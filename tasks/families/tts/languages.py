"""The languages TTS rungs speak and the language of a TTS job (``tasks.wire.languages`` is the seam).

- A job's language: the request's ``language``, else the one its text's script tells
  (:func:`mediafarm.tasks.kit.script_language`: Chinese characters are ``zh``, mixed text goes by
  its non-Latin letters, Latin-only text tells nothing and is not filtered).
- ChatTTS speaks Chinese and English.
- A Piper voice speaks the language of its ``.onnx.json`` (``language.family``, else
  ``language.code``, else ``espeak.voice``), else of its file name (``en_US-joe-medium.onnx``);
  plus the languages a job's speaker names a Piper voice for.
- espeak-ng speaks every language of its voice list (the wheel's libespeak-ng's, or ``--voices`` of
  the program a rung names where it is on PATH), Mandarin (``cmn``) included, which
  reads the Latin words of a mixed text as English.

Light: json, a subprocess or ctypes, no TTS package (every farm process imports the spec that names these).
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from mediafarm.tasks.families.tts.speakers import DEFAULT, Speaker, get_speaker
from mediafarm.tasks.kit import PermanentFailure, RungUnavailable, normalize_language, script_language

CHATTTS = ("zh", "en")
# `  5  cmn   --/M   Chinese_(Mandarin,_latin_as_English) sit/cmn   (zh-cmn 5)(zh 5)`
_VOICE_LINE = re.compile(r"^\s*(\d+)\s+(\S+)\s+\S+\s+\S+\s+\S+\s*(.*)$")
_ALIAS = re.compile(r"\(([^()\s]+)\s+(\d+)\)")


def request_language(request: Any) -> str | None:
    """The TTS job's language (``FamilySpec.language``): given, else its text's script's, else None."""
    given = getattr(request, "language", None)
    language = given or script_language(request.text)
    return normalize_language(language) if language else None


def chattts_languages(params: Any, models_dir: Path | None, request: Any) -> tuple[str, ...]:
    return CHATTTS


def piper_voice_language(voice: str, models_dir: Path | None) -> str | None:
    """The language of a Piper voice file (relative to the models dir), or None if nothing tells it."""
    if models_dir is not None:
        try:
            config = json.loads((models_dir / f"{voice}.json").read_text())
        except (OSError, ValueError):
            config = None
        if isinstance(config, dict):
            language, espeak = config.get("language") or {}, config.get("espeak") or {}
            code = language.get("family") or language.get("code") or espeak.get("voice")
            if isinstance(code, str) and code:
                return normalize_language(code)
    # Piper's voices are named language_REGION-name-quality.onnx.
    named = re.match(r"^([a-z]{2,3})_[A-Z]{2}-", Path(voice).name)
    return named.group(1) if named else None


def _speaker_of(request: Any) -> Speaker | None:
    if request is None:
        return None
    if request.speaker == DEFAULT:
        return get_speaker(DEFAULT)
    try:
        return get_speaker(request.speaker)
    except PermanentFailure:
        return None  # the engine rejects the job for it, as it always has


def piper_languages(params: Any, models_dir: Path | None, request: Any) -> list[str] | None:
    """The rung's voice's language (or the speaker's own voice's), and every language the job's
    speaker names a Piper voice for. None (any) when the voice file tells no language."""
    speaker = _speaker_of(request)
    own = piper_voice_language((speaker and speaker.piper_voice) or params.voice, models_dir)
    if own is None:
        return None
    more = [lang for lang, voice in (speaker.voices.items() if speaker else ()) if voice.piper_voice]
    return [own, *more]


@functools.lru_cache(maxsize=8)
def espeak_voices(binary: str | None) -> tuple[tuple[str, tuple[tuple[str, int], ...]], ...]:
    """espeak-ng's voices: (voice name, its (language code, priority) pairs), in its own order, of the
    one that will speak: the program ``binary`` names where it is on PATH, else the wheel's library;
    empty when neither is there (the engine says so when it runs)."""
    path = shutil.which(binary) if binary else None
    if path is None:
        from mediafarm.tasks.families.tts.libespeak import library

        try:
            return library().voices()
        except (RungUnavailable, ImportError):  # no wheel here either (a gateway without the tts extra)
            return ()
    try:
        listed = subprocess.run([path, "--voices"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    voices = []
    for line in listed.splitlines()[1:]:
        found = _VOICE_LINE.match(line)
        if found:
            pty, name, aliases = int(found.group(1)), found.group(2), found.group(3)
            codes = [(name, pty)] + [(code, int(p)) for code, p in _ALIAS.findall(aliases)]
            voices.append((name, tuple(codes)))
    return tuple(voices)


def espeak_languages(params: Any, models_dir: Path | None, request: Any) -> list[str] | None:
    """Every language of espeak-ng's voice list; None (any) when neither the program nor the library is there."""
    voices = espeak_voices(params.binary)
    if not voices:
        return None
    return [code for _, codes in voices for code, _ in codes]


def espeak_voice_for(binary: str | None, language: str) -> str | None:
    """The espeak-ng voice for ``language`` (``zh`` → ``cmn``, ``fr`` → ``fr-fr``): the one that
    claims the code itself at the best priority, as espeak-ng ranks its voices; None if none speaks it."""
    best: tuple[bool, int, int] | None = None
    chosen = None
    for order, (name, codes) in enumerate(espeak_voices(binary)):
        for code, priority in codes:
            if normalize_language(code) != language:
                continue
            rank = (code.lower() != language, priority, order)
            if best is None or rank < best:
                best, chosen = rank, name
    return chosen
