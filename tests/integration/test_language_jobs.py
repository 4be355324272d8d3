"""Ladders that know languages, on real workers (issue 16 item 4).

TTS: a worker with the Piper voice (en_US-joe, English) and espeak-ng on a queue of its own.
Chinese text sent to the default speaker must never be read by the English voice (it said
"Chinese letter" for every character): the Piper rung is skipped for it, recorded and charged no
attempt, and espeak-ng's Mandarin voice speaks; a ladder with no rung for Chinese rejects the job at
once, naming the language and what each rung speaks. Subtitles: the real tiny.en (English only)
and pocketsphinx (en-us) are skipped for a French request, which is rejected naming the language.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from mediafarm import JobRejected, register_speaker, submit
from mediafarm.config.settings import get_settings
from tests.conftest import REPO
from tests.support.piper_voice import link_joe_voice

pytestmark = pytest.mark.integration
QUEUE = "tts-language-test"
LADDERS = """
[ladders.tts]
rungs = [
  { name = "piper", engine = "piper" },
  { name = "espeak", engine = "espeak" },
]

[ladders.tts-english]
family = "tts"
rungs = [
  { name = "piper", engine = "piper" },
]
"""
CHINESE = "今天天气很好。我们一起去公园散步吧。"


@pytest.fixture(scope="module")
def tts_worker(start_worker, session_dir: Path):
    link_joe_voice(get_settings().models_dir)
    config = session_dir / "farm-tts-language-test.toml"
    config.write_text((REPO / "tests" / "support" / "farm-test.toml").read_text() + LADDERS)
    return start_worker("cpu", concurrency=1, queues=[QUEUE], env={"FARM_CONFIG_FILE": str(config)})


def test_chinese_text_with_the_default_speaker_goes_to_espeak_mandarin_never_the_english_voice(tts_worker) -> None:
    envelope = submit("tts", queue=QUEUE, text=CHINESE).wait(timeout=120)
    attempts = envelope["attempts"]
    assert envelope["variant"] == "espeak" and [a["outcome"] for a in attempts] == ["unavailable", "ok"]
    assert attempts[0]["variant"] == "piper"
    assert attempts[0]["reason"] == "rung piper handles en, not the job's language 'zh'"
    output = envelope["output"]
    assert output["language"] == "zh"
    assert output["voice"].split()[-1] == "cmn"  # espeak-ng's Mandarin, the default speaker's slot variant
    assert output["duration"] > 1.0 and len(output["sentences"]) == 2


def test_mixed_script_text_goes_by_its_chinese_letters(tts_worker) -> None:
    # The rule (tasks.wire.languages.script_language): non-Latin letters decide; espeak-ng's cmn voice
    # reads the Latin word as English, which an English voice could not do for the Chinese ones.
    envelope = submit("tts", queue=QUEUE, text="我喜欢用 Python 写程序。").wait(timeout=120)
    assert envelope["variant"] == "espeak" and envelope["output"]["language"] == "zh"
    assert envelope["output"]["voice"].endswith(" cmn")


def test_english_and_french_texts(tts_worker) -> None:
    english = submit("tts", queue=QUEUE, text="Hello there. How are you?").wait(timeout=120)
    # Latin-only text without a language: not filtered, the first rung speaks it as before.
    assert english["variant"] == "piper" and [a["outcome"] for a in english["attempts"]] == ["ok"]
    assert english["output"]["language"] is None
    french = submit("tts", queue=QUEUE, text="Bonjour à tous.", language="fr").wait(timeout=120)
    assert french["variant"] == "espeak" and french["output"]["language"] == "fr"
    assert french["output"]["voice"].endswith(" fr-fr") and french["attempts"][0]["outcome"] == "unavailable"


def test_a_ladder_with_no_rung_for_the_language_rejects_the_job_at_once(tts_worker) -> None:
    job = submit("tts", queue=QUEUE, text=CHINESE, ladder="tts-english")
    with pytest.raises(JobRejected) as caught:
        job.wait(timeout=60)
    message = str(caught.value)
    assert "language 'zh'" in message and "tts-english" in message and "piper: en" in message
    assert caught.value.attempts == []  # nothing ran, nothing was charged


def test_a_speaker_names_its_voice_for_chinese(tts_worker) -> None:
    name = f"mei-{uuid.uuid4().hex[:6]}"
    register_speaker(name, espeak_voice="en-gb+m3", voices={"zh": {"espeak_voice": "cmn+f3"}})
    chinese = submit("tts", queue=QUEUE, text=CHINESE, speaker=name, ladder="espeak").wait(timeout=120)
    assert chinese["output"]["voice"].endswith(" cmn+f3")
    # Its English voice stays its voice for English.
    english = submit("tts", queue=QUEUE, text="Good morning.", speaker=name, ladder="espeak").wait(timeout=120)
    assert english["output"]["voice"].endswith(" en-gb+m3")


def test_english_only_recognisers_are_skipped_for_a_french_file(cpu_worker, tiny_en, speech_track) -> None:
    job = submit("subtitle", media=str(speech_track.path), language="fr", ladder="whisper-tiny")
    with pytest.raises(JobRejected) as caught:
        job.wait(timeout=60)
    message = str(caught.value)
    assert "language 'fr'" in message and "whisper-tiny: en" in message and "pocketsphinx: en" in message
    assert caught.value.attempts == []
    # The same file without a language: the recogniser's own detection is in the result.
    envelope = submit("subtitle", media=str(speech_track.path), ladder="whisper-tiny").wait(timeout=180)
    assert envelope["variant"] == "whisper-tiny" and envelope["output"]["language"] == "en"
