"""The languages of the TTS rungs and of a TTS job (tts.languages), and a speaker's voices per language."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mediafarm.tasks.families.tts.languages import (
    espeak_languages,
    espeak_voice_for,
    piper_languages,
    piper_voice_language,
    request_language,
)
from mediafarm.tasks.families.tts.speakers import Speaker
from mediafarm.tasks.families.tts.spec import FAMILY, EspeakParams, PiperParams, TtsRequest
from mediafarm.tasks.families.tts.text import plan_chunks, split_sentences
from mediafarm.tasks.wire.languages import LanguageCheck, rung_languages


def test_the_request_language_is_given_or_told_by_the_script() -> None:
    assert request_language(TtsRequest(text="今天天气很好。")) == "zh"
    assert request_language(TtsRequest(text="Hello there.")) is None
    assert request_language(TtsRequest(text="Hello there.", language="fr")) == "fr"
    # Given wins over the script.
    assert request_language(TtsRequest(text="你好", language="ja")) == "ja"


def test_a_piper_voice_speaks_its_onnx_json_language(tmp_path: Path) -> None:
    (tmp_path / "piper").mkdir()
    (tmp_path / "piper" / "voice.onnx.json").write_text(json.dumps({"language": {"code": "de_DE", "family": "de"}}))
    (tmp_path / "piper" / "old.onnx.json").write_text(json.dumps({"espeak": {"voice": "fr-fr"}}))
    assert piper_voice_language("piper/voice.onnx", tmp_path) == "de"
    assert piper_voice_language("piper/old.onnx", tmp_path) == "fr"
    # No config to read: Piper's file naming tells it; nothing at all: None (any language).
    assert piper_voice_language("piper/en_US-joe-medium.onnx", None) == "en"
    assert piper_voice_language("piper/custom.onnx", tmp_path) is None
    assert piper_languages(PiperParams(voice="piper/voice.onnx"), tmp_path, None) == ["de"]
    assert piper_languages(PiperParams(voice="piper/custom.onnx"), tmp_path, None) is None


def test_espeak_speaks_its_voice_list_mandarin_included() -> None:
    languages = set(espeak_languages(EspeakParams(), None, None) or ())
    assert {"cmn", "zh", "en-us", "fr"} <= languages
    assert espeak_voice_for("espeak-ng", "zh") == "cmn"
    assert espeak_voice_for("espeak-ng", "fr") == "fr-fr"
    assert espeak_voice_for("espeak-ng", "xx") is None


def test_chinese_text_on_the_default_ladder_never_goes_to_the_english_piper_voice() -> None:
    ladder = FAMILY.default_ladder
    check = LanguageCheck.of(FAMILY, ladder, {"text": "今天天气很好。我们去公园吧。"}, None)
    assert check is not None and check.language == "zh"
    skipped = {r.name: check.why_not(r) for r in ladder.rungs}
    assert skipped["piper"] == "rung piper handles en, not the job's language 'zh'"
    assert skipped["espeak"] is None and skipped["chattts"] is None and skipped["chattts-cpu"] is None
    assert rung_languages(FAMILY, ladder.rungs[0], None) == frozenset({"zh", "en"})


def test_a_speaker_names_a_voice_per_language() -> None:
    speaker = Speaker(name="mei", espeak_voice="en-gb+m3", voices={"zh": {"espeak_voice": "cmn+f3"},
                                                                  "de": {"piper_voice": "piper/de.onnx"}})  # fmt: skip
    assert speaker.for_language("zh").espeak == "cmn+f3"
    assert speaker.for_language("en").espeak == "en-gb+m3" and speaker.for_language(None) is speaker
    # Its English voice never reads another language: the slot's variant of that language's voice instead.
    assert speaker.for_language("fr").espeak_voice is None
    assert speaker.for_language("de").piper_voice == "piper/de.onnx"
    with pytest.raises(ValueError, match="inside FARM_MODELS_DIR"):
        Speaker(name="x", voices={"zh": {"piper_voice": "../zh.onnx"}})
    with pytest.raises(ValueError):
        Speaker(name="x", voices={"Chinese": {"espeak_voice": "cmn"}})


def test_chinese_sentences_end_at_their_marks_without_a_space() -> None:
    assert split_sentences("今天天气很好。我们去公园吧！“好的。”他说。 Hello there.") == [
        "今天天气很好。", "我们去公园吧！", "“好的。”", "他说。", "Hello there."
    ]  # fmt: skip
    # A first sentence longer than a chunk: its chunks are numbered in order (chunk_00000, 00001 ...).
    plan = plan_chunks("今天天气很好，我们一起去公园散步吧，然后回家吃饭。", 10)
    assert [c.index for c in plan.chunks] == list(range(len(plan.chunks))) and len(plan.chunks) == 3
    assert "".join(p.text for c in plan.chunks for p in c.pieces).replace(" ", "") == plan.sentences[0]


def test_farm_speakers_add_takes_voices_per_language() -> None:
    import os
    import subprocess
    import sys
    import uuid

    from mediafarm import remove_speaker
    from mediafarm.tasks.families.tts.speakers import get_speaker
    from tests.conftest import REPO

    name = f"sp-{uuid.uuid4().hex[:8]}"

    def farm(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "mediafarm.workers.cli", "speakers", *args]
        env = {**os.environ, "COLUMNS": "250"}
        return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)

    added = farm("add", name, "--voice", "zh:espeak=cmn+f3", "--voice", "de:piper=piper/de.onnx",
                 "--voice", "de:piper-speaker=2")  # fmt: skip
    assert added.returncode == 0, added.stdout + added.stderr
    try:
        speaker = get_speaker(name)
        assert speaker.voices["zh"].espeak_voice == "cmn+f3"
        assert (speaker.voices["de"].piper_voice, speaker.voices["de"].piper_speaker) == ("piper/de.onnx", 2)
        row = next(line for line in farm("list").stdout.splitlines() if name in line)
        assert "zh: espeak_voice cmn+f3" in row
    finally:
        remove_speaker(name)
    bad = farm("add", name, "--voice", "zh=cmn")
    assert bad.returncode == 2 and "LANG:ENGINE=VOICE" in bad.stderr
