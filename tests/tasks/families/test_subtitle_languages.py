"""The languages the subtitle rungs recognise (subtitle.languages): tiny.en English only, a
multilingual Whisper its language tokens, pocketsphinx its shipped model's."""

from __future__ import annotations

from pathlib import Path

import pytest

from mediafarm.tasks.families.subtitle.languages import MULTILINGUAL_VOCABULARY, whisper_languages
from mediafarm.tasks.families.subtitle.spec import FAMILY, WhisperParams
from mediafarm.tasks.wire.languages import LanguageCheck, rung_languages

LANGUAGE_TOKENS = ["<|en|>", "<|zh|>", "<|fr|>", "<|haw|>"]


def _model(folder: Path, size: int) -> None:
    folder.mkdir(parents=True)
    filler = [f"tok{i}" for i in range(size - len(LANGUAGE_TOKENS))]
    (folder / "vocabulary.txt").write_text("\n".join(filler + LANGUAGE_TOKENS) + "\n")


def test_an_english_only_whisper_is_told_by_its_name_or_its_vocabulary(tmp_path: Path) -> None:
    assert whisper_languages(WhisperParams(model="faster-whisper-tiny.en"), None, None) == ("en",)
    # tiny.en's vocabulary lists every language token, yet is one short of a multilingual model's.
    _model(tmp_path / "renamed", MULTILINGUAL_VOCABULARY - 1)
    assert whisper_languages(WhisperParams(model="renamed"), tmp_path, None) == ("en",)


def test_a_multilingual_whisper_recognises_its_language_tokens(tmp_path: Path) -> None:
    _model(tmp_path / "faster-whisper-small", MULTILINGUAL_VOCABULARY)
    assert whisper_languages(WhisperParams(model="faster-whisper-small"), tmp_path, None) == ("en", "zh", "fr", "haw")
    # Not there: not known (its weights check makes the rung unavailable anyway).
    assert whisper_languages(WhisperParams(model="absent"), tmp_path, None) is None


def test_an_english_only_recogniser_is_skipped_for_french(tmp_path: Path) -> None:
    pytest.importorskip("pocketsphinx")
    _model(tmp_path / "faster-whisper-small", MULTILINGUAL_VOCABULARY)
    ladder = FAMILY.default_ladder
    assert rung_languages(FAMILY, ladder.rungs[-1], tmp_path) == frozenset({"en"})  # pocketsphinx: model/en-us
    check = LanguageCheck.of(FAMILY, ladder, {"media": "talk.wav", "language": "fr"}, tmp_path)
    assert check is not None
    assert {r.name: check.why_not(r) for r in ladder.rungs} == {
        "whisper-large": None,  # its model is not there: not known here (its weights check skips it)
        "whisper-small": None,
        "whisper-tiny": "rung whisper-tiny handles en, not the job's language 'fr'",
        "pocketsphinx": "rung pocketsphinx handles en, not the job's language 'fr'",
    }
