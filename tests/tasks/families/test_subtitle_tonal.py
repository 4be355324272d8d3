"""Tonal spans set aside before recognition (tonal.py, issue #35): music-like notes and chords
(``vad_tracks``' tones) are tonal, espeak-ng speech is not, short words and slow sung-like vowels
included; and the subtitle engine neither recognises a tonal span nor hides that it set one aside."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mediafarm.tasks.families.subtitle import tonal
from mediafarm.tasks.families.subtitle.engines import JSON_NAME, transcribe
from mediafarm.tasks.families.subtitle.recognisers import Recognition
from mediafarm.tasks.families.subtitle.spec import SubtitleRequest
from mediafarm.tasks.kit import Span
from mediafarm.tasks.runtime.context import EngineContext
from tests.support.speech import RATE, speak
from tests.support.vad_tracks import _tone

NOTES = 220.0 * 2 ** (np.arange(24) / 12)


def chord(rng: np.random.Generator, seconds: float = 3.0) -> np.ndarray:
    return _tone(seconds, list(rng.choice(NOTES, size=3)), rng)


def note_run(rng: np.random.Generator, notes: int = 8) -> np.ndarray:
    return np.concatenate([_tone(rng.uniform(0.25, 0.5), [float(rng.choice(NOTES))], rng) for _ in range(notes)])


def judged(sound: np.ndarray, noise: float = 0.003) -> tuple[float, int]:
    """The sound's stable share and pairs, with 0.2 s of quiet on each side and noise under it all."""
    rng = np.random.default_rng(1)
    quiet = np.zeros(int(0.2 * RATE))
    audio = np.concatenate([quiet, sound, quiet]) + rng.standard_normal(sound.size + 2 * quiet.size) * noise
    stability = tonal.SpectralStability()
    stability.feed(audio.astype(np.float32))
    return stability.stable_share(Span(0.2, 0.2 + sound.size / RATE))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("make", [chord, note_run], ids=["chord", "note-run"])
def test_notes_and_chords_are_tonal(make, seed: int) -> None:
    share, pairs = judged(make(np.random.default_rng(seed)))
    assert tonal.is_tonal(share, pairs), (share, pairs)


def test_a_short_note_is_tonal_and_one_too_short_to_judge_is_kept() -> None:
    rng = np.random.default_rng(3)
    assert tonal.is_tonal(*judged(_tone(0.3, [440.0], rng)))
    share, pairs = judged(_tone(0.08, [440.0], rng))
    assert pairs < tonal.MIN_PAIRS and not tonal.is_tonal(share, pairs)


@pytest.mark.parametrize("text", [
    "No.", "Yes.", "Oh.", "Stop.", "Nooooooo.", "Aaaaaah.",
    "The quick brown fox jumps over the lazy dog.", "Please leave the package at the front door.",
])  # fmt: skip
def test_espeak_speech_short_words_included_is_not_tonal(text: str) -> None:
    share, pairs = judged(speak(text))
    assert pairs >= tonal.MIN_PAIRS and not tonal.is_tonal(share, pairs), (share, pairs)


@pytest.mark.parametrize(("voice", "wpm", "pitch"), [("en-us", 80, 40), ("en-us+f2", 80, 0), ("en-gb", 80, -30)])
@pytest.mark.parametrize("text", ["Oh", "la la la la", "Mmmm"])
def test_slow_sung_like_espeak_vowels_are_not_tonal(voice: str, wpm: int, pitch: int, text: str) -> None:
    from tests.support.heldout_corpus import speak_espeak

    share, pairs = judged(speak_espeak(text, voice, wpm, pitch))
    # Well below the threshold, not just under it: a sustained synthetic vowel is the nearest speech comes.
    assert pairs >= tonal.MIN_PAIRS and share < tonal.TONAL_SHARE * 0.7, (share, pairs)


def test_speech_over_a_chord_is_kept() -> None:
    rng = np.random.default_rng(5)
    voice = speak("Please leave the package at the front door.")
    under = chord(rng, voice.size / RATE)
    assert not tonal.is_tonal(*judged(voice + under))


def test_the_measure_is_the_same_fed_in_any_blocks() -> None:
    rng = np.random.default_rng(2)
    audio = np.concatenate([chord(rng), speak("Someone is walking across the garden now."), note_run(rng)])
    whole, pieces = tonal.SpectralStability(), tonal.SpectralStability()
    whole.feed(audio.astype(np.float32))
    at = 0
    for size in [100, 1023, 1, 5000, 256, 77_777]:
        pieces.feed(audio[at : at + size].astype(np.float32))
        at += size
    pieces.feed(audio[at:].astype(np.float32))
    for a, b in zip(whole.frames(), pieces.frames(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_set_aside_keeps_speech_and_names_what_it_rejected() -> None:
    rng = np.random.default_rng(4)
    gap = np.zeros(RATE)
    tone, voice = chord(rng), speak("No.")
    audio = np.concatenate([gap, tone, gap, voice, gap]).astype(np.float32)
    stability = tonal.SpectralStability()
    stability.feed(audio)
    tone_span = Span(1.0, 1.0 + tone.size / RATE)
    voice_span = Span(2.0 + tone.size / RATE, 2.0 + (tone.size + voice.size) / RATE)
    kept, rejected = tonal.set_aside([tone_span, voice_span], stability)
    assert kept == [voice_span]
    [aside] = rejected
    assert (aside.start, aside.end, aside.reason) == (round(tone_span.start, 3), round(tone_span.end, 3), "tonal")
    assert aside.stable_share >= tonal.TONAL_SHARE


def test_the_engine_never_recognises_a_tonal_span_and_says_it_set_it_aside(tmp_path: Path) -> None:
    # Seed 4: silero takes one of this run's notes for speech (checked below, so a VAD that stops
    # doing so fails here rather than passing for nothing).
    rng = np.random.default_rng(4)
    gap = np.zeros(RATE)
    tones = [gap, chord(rng), gap, note_run(rng), gap]
    audio = np.concatenate([*tones, speak("No."), gap])
    audio = audio + rng.standard_normal(audio.size) * 0.003
    path = tmp_path / "tones.wav"
    sf.write(path, audio.astype(np.float32), RATE, subtype="PCM_16")
    voice_start = sum(t.size for t in tones) / RATE
    heard: list[int] = []

    def recognise(window: np.ndarray) -> Recognition:
        heard.append(window.size)
        return Recognition(segments=[], language="en", language_probability=1.0, model="stand-in")

    ctx = EngineContext.local(storage_dir=tmp_path / "storage")
    steps = transcribe(ctx, SubtitleRequest(media=str(path), formats=["json"]), recognise)
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            result = stop.value
            break
    assert result.rejected and all(r.reason == "tonal" and r.end < voice_start for r in result.rejected)
    assert result.spans >= 1  # the word is still recognised ...
    assert len(heard) == 1 and heard[0] < 1.5 * RATE  # ... alone: no tone went to the recogniser
    listed = json.loads(ctx.artifacts.path(JSON_NAME).read_text())["rejected"]
    assert listed == [r.model_dump(mode="json") for r in result.rejected]
