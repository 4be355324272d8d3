"""Which languages a job is in and which rungs can handle them: the ladder's language filter.

An engine may declare the languages a rung of it speaks or recognises (``EngineSpec.languages``:
a Piper voice its ``.onnx.json`` language, espeak-ng its voice list, tiny.en English only); a
family may say what language a request is in (``FamilySpec.language``: the request's ``language``
field, or one detected from its text). Before a job runs, :class:`LanguageCheck` looks at every
rung of its ladder: a rung that cannot handle the job's language is skipped as unavailable for it,
recorded in the history and charged no attempt; when no rung can, the job is rejected at once,
naming the language and what each rung handles. A job whose language is not known (none given,
none detected) and a rung that declares nothing (None: any language) are never filtered.

Codes are compared by their primary language, as ISO 639-1 where there is one: ``en-US``,
``en_GB`` and ``eng`` are ``en``; espeak-ng's ``cmn`` (Mandarin) and ``yue`` (Cantonese) are ``zh``.

Standard library only: every farm process imports this module (the specs' hooks use it).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mediafarm.config.ladders import Ladder, Rung
from mediafarm.tasks.wire.errors import InvalidRequest

if TYPE_CHECKING:
    from mediafarm.tasks.wire.family import FamilySpec

log = logging.getLogger(__name__)

# The languages of a rung: codes, or None for any language (the rung declares none).
Languages = frozenset[str] | None

# ISO 639-2/3 codes engines use for languages that have an ISO 639-1 code. Chinese: Mandarin and
# Cantonese are both written in Han characters, which is what a request's language tells apart.
_TWO_LETTER = {
    "cmn": "zh", "yue": "zh", "zho": "zh", "chi": "zh", "eng": "en", "fra": "fr", "fre": "fr", "deu": "de",
    "ger": "de", "spa": "es", "ita": "it", "por": "pt", "rus": "ru", "jpn": "ja", "kor": "ko", "ara": "ar",
    "hin": "hi", "nld": "nl", "dut": "nl", "pol": "pl", "tur": "tr", "ukr": "uk", "ell": "el", "gre": "el",
    "heb": "he", "tha": "th", "vie": "vi", "swe": "sv", "ces": "cs", "cze": "cs",
}  # fmt: skip

# The letters of each script other than Latin (Unicode blocks), and the language they are taken
# to be in when the request gives none: the script's main language. Latin is absent on purpose: it
# is written in too many languages to tell one. Counted by the regex engine, several times faster
# than naming each character (unicodedata.name), and once per text (script_language is cached).
SCRIPTS = {
    "han": ("zh", "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f"),
    "kana": ("ja", "\u3041-\u309f\u30a1-\u30fa\u30fc-\u30ff\u31f0-\u31ff\uff66-\uff9d"),
    "hangul": ("ko", "\u1100-\u11ff\u3131-\u318e\uac00-\ud7af"),
    "cyrillic": ("ru", "\u0400-\u0481\u048a-\u052f"),
    "greek": ("el", "\u0386-\u03ff\u1f00-\u1ffc"),
    "arabic": ("ar", "\u0620-\u064a\u066e-\u06d3\u0750-\u077f\u08a0-\u08c9"),
    "hebrew": ("he", "\u05d0-\u05ea"),
    "devanagari": ("hi", "\u0904-\u0939\u0958-\u0961"),
    "bengali": ("bn", "\u0985-\u09b9"),
    "tamil": ("ta", "\u0b85-\u0bb9"),
    "thai": ("th", "\u0e01-\u0e30"),
    "lao": ("lo", "\u0e81-\u0eb0"),
    "georgian": ("ka", "\u10a0-\u10ff"),
    "armenian": ("hy", "\u0531-\u0587"),
    "ethiopic": ("am", "\u1200-\u135a"),
    "khmer": ("km", "\u1780-\u17b3"),
    "myanmar": ("my", "\u1000-\u102a"),
}
_SCRIPT_LETTERS = {name: re.compile(f"[{letters}]") for name, (_, letters) in SCRIPTS.items()}


def normalize_language(code: str) -> str:
    """A language code as the filter compares it: the primary subtag, lower case, two letters
    where ISO 639-1 has them (``en_US`` → ``en``, ``cmn`` → ``zh``)."""
    primary = re.split(r"[-_]", code.strip().lower(), maxsplit=1)[0]
    return _TWO_LETTER.get(primary, primary)


def language_set(codes: Iterable[str] | None) -> Languages:
    """``codes`` normalised into a set; None stays None (any language)."""
    return None if codes is None else frozenset(normalize_language(c) for c in codes if c.strip())


def describe(languages: Languages) -> str:
    """``en, zh``, or ``any language``."""
    return "any language" if languages is None else ", ".join(sorted(languages)) or "no language"


# A TTS job's text is read for its script by the worker's check and again by the engine: once.
@functools.lru_cache(maxsize=8)
def script_language(text: str) -> str | None:
    """The language a text is in as its script tells it, or None when it does not.

    The rule, for mixed-script text too: letters in a script other than Latin decide (kana, even
    among Han characters, is Japanese; otherwise the script of most such letters); Latin letters,
    digits and punctuation decide nothing. A voice of the other script's language reads the Latin
    words in it (espeak-ng's Mandarin reads them as English, ChatTTS mixes Chinese and English),
    while a voice of a Latin-script language cannot read another script at all (an English voice
    says "Chinese letter" for every Han character). Latin-only text gives None: its language is
    not told by its script, and the request's ``language`` names it.
    """
    counts = {name: len(letters.findall(text)) for name, letters in _SCRIPT_LETTERS.items()}
    if counts["kana"]:
        return "ja"
    name, count = max(counts.items(), key=lambda item: item[1])
    return SCRIPTS[name][0] if count else None


def rung_languages(spec: FamilySpec, rung: Rung, models_dir: Path | None, request: Any = None) -> Languages:
    """What ``rung`` speaks or recognises (its ``languages`` in farm.toml, else its engine's
    ``languages`` hook), None for any language.

    ``request`` (the parsed request, when there is one) lets a hook count what the job's own
    choices add, as a TTS speaker's voices for further languages."""
    if rung.languages is not None:  # the operator's word (farm.toml) over the engine's
        return language_set(rung.languages)
    engine = spec.engines[rung.engine]
    if engine.languages is None:
        return None
    return language_set(engine.languages(engine.parse_params(rung), models_dir, request))


def languages_or_any(spec: FamilySpec, rung: Rung, models_dir: Path | None, request: Any) -> Languages:
    """:func:`rung_languages`, or None (any: not filtered) when the rung's hook fails (an unreadable
    voice file, a bug): one rung's hook must not fail every job of its family before anything runs,
    nor skip a rung that may well handle the job; the engine itself says what is wrong when it runs."""
    try:
        return rung_languages(spec, rung, models_dir, request)
    except Exception:  # noqa: BLE001 - see above
        log.warning("rung %s: its languages hook failed; not filtering it by language", rung.name, exc_info=True)
        return None


def rung_languages_note(spec: FamilySpec, rung: Rung, models_dir: Path | None) -> str:
    """`` (en, zh)`` after a rung's name where it declares languages (``farm families``); a long
    list is counted (espeak-ng's voices: `` (115 languages)``); "" for any language."""
    try:
        languages = rung_languages(spec, rung, models_dir)
    except Exception:  # noqa: BLE001 - a listing never fails on one hook (the worker's check will say)
        return " (languages not known)"
    if languages is None:
        return ""
    return f" ({describe(languages)})" if len(languages) <= 4 else f" ({len(languages)} languages)"


@dataclass(frozen=True)
class LanguageCheck:
    """One job's language against its ladder's rungs.

    Attributes:
        language: The job's language (normalised).
        rungs: Rung name → the languages it handles (None: any).
    """

    language: str
    rungs: Mapping[str, Languages]

    @classmethod
    def of(
        cls, spec: FamilySpec, ladder: Ladder, fields: Mapping[str, Any], models_dir: Path | None
    ) -> LanguageCheck | None:
        """The check for a job's fields, or None when its language is not known (nothing to filter).

        Raises InvalidRequest naming the language and every rung's languages when no rung of the
        ladder handles it: the job is rejected before anything runs. A request that does not parse
        gives None here: the engine's own parse rejects it as it always has.
        """
        if spec.language is None:
            return None
        try:
            request = spec.parse_request(fields)
        except InvalidRequest:
            return None
        language = spec.language(request)
        if language is None:
            return None
        rungs = {r.name: languages_or_any(spec, r, models_dir, request) for r in ladder.rungs}
        check = cls(normalize_language(language), rungs)
        if all(check.why_not(r) for r in ladder.rungs):
            handled = "; ".join(f"{name}: {describe(langs)}" for name, langs in check.rungs.items())
            raise InvalidRequest(
                f"{spec.name} request: language {check.language!r}: no rung of the {ladder.name} ladder handles it "
                f"({handled}); send it to a ladder with a rung for {check.language!r}"
            )
        return check

    def why_not(self, rung: Rung) -> str | None:
        """Why ``rung`` cannot handle the job's language (its skip reason), or None if it can."""
        languages = self.rungs.get(rung.name)
        if languages is None or self.language in languages:
            return None
        return f"rung {rung.name} handles {describe(languages)}, not the job's language {self.language!r}"


# An engine's languages hook: (the rung's params, the models dir or None, the request or None) →
# language codes, or None for any language.
LanguagesHook = Callable[[Any, "Path | None", Any], "Iterable[str] | None"]
