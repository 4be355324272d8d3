"""Speech with every sentence's true start and end known: the truth for subtitle cue timing.

Each sentence is synthesised on its own (espeak-ng in several voices and speeds, or the test-only
Piper voice at several paces), trimmed to its first and last sample louder than ``LOUD`` (the
same rule as ``tests.support.speech.speak``), and placed between silences of known length over a
faint noise floor. A sentence's truth is where its trimmed audio lies in the track, to the sample.
Used by the cue-timing test (tests/tasks/families/test_subtitle_onsets.py) and its benchmark
(bench/subtitle_timing.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from tests.support.speech import RATE
from tests.support.vad_tracks import speak as espeak

LOUD = 0.02  # a sentence starts and ends at its first and last sample above this
NOISE_LEVEL = 0.001

# One cue each at the default cue rules (at most 84 characters, 7 s), so a sentence's first cue
# starts at its onset and its last cue ends at its end.
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please leave the package at the front door.",
    "Someone is walking across the garden now.",
    "Turn off the lights before you go to sleep.",
    "We will meet again at half past seven.",
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It is easy to tell the depth of a well.",
    "Rice is often served in round bowls.",
    "The box was thrown beside the parked truck.",
    "Four hours of steady work faced us.",
    "A rod is used to catch pink salmon.",
)
ESPEAK_VOICES = (("en-us", 130), ("en-gb", 175), ("en-us+f3", 220), ("en+m3", 160), ("en-gb-scotland", 190))
PIPER_PACES = (0.85, 1.0, 1.2)  # Piper speeds (1 / length_scale factor)


@dataclass(frozen=True)
class TimedTrack:
    """Attributes: name, path (WAV), sentences (text, start, end in seconds), duration (seconds)."""

    name: str
    path: Path
    sentences: list[tuple[str, float, float]]
    duration: float


def trim(audio: np.ndarray) -> np.ndarray:
    loud = np.flatnonzero(np.abs(audio) > LOUD)
    if loud.size == 0:
        raise ValueError("the synthesised sentence has no sample louder than the trim level")
    return audio[loud[0] : loud[-1] + 1].astype(np.float32)


def build(
    path: Path, name: str, say: Callable[[str], np.ndarray], sentences: Sequence[str], seed: int = 0,
    noise: float = NOISE_LEVEL,
) -> TimedTrack:
    """Sentences spoken by ``say`` (float32 mono at 16 kHz), 0.9-2.5 s apart, over white noise of
    RMS ``noise`` (the truth is the clean sentence's extent)."""
    rng = np.random.default_rng(seed)
    parts: list[np.ndarray] = []
    timed: list[tuple[str, float, float]] = []
    samples = 0
    for text in sentences:
        gap = int(rng.uniform(0.9, 2.5) * RATE)
        parts.append(np.zeros(gap, dtype=np.float32))
        samples += gap
        voice = trim(say(text))
        timed.append((text, samples / RATE, (samples + voice.size) / RATE))
        parts.append(voice)
        samples += voice.size
    tail = int(1.3 * RATE)
    parts.append(np.zeros(tail, dtype=np.float32))
    audio = np.concatenate(parts)
    audio = np.clip(audio + rng.standard_normal(audio.size).astype(np.float32) * noise, -1.0, 1.0)
    sf.write(path, audio, RATE, subtype="PCM_16")
    return TimedTrack(name=name, path=path, sentences=timed, duration=audio.size / RATE)


def espeak_track(
    path: Path, voice: str, speed: int, sentences: Sequence[str] = SENTENCES, seed: int = 0, noise: float = NOISE_LEVEL
) -> TimedTrack:
    name = f"espeak {voice} {speed} wpm" + (f" noise {noise:g}" if noise != NOISE_LEVEL else "")
    return build(path, name, lambda text: espeak(text, voice, speed), sentences, seed, noise)


def piper_voice(models: Path) -> Path | None:
    """The test-only Piper voice's .onnx, or None without its wheel."""
    from tests.support.piper_voice import link_joe_voice

    if not link_joe_voice(models, required=False):
        return None
    return models / "piper" / "en_US-joe-medium.onnx"


def piper_track(
    path: Path,
    model: Path,
    pace: float,
    sentences: Sequence[str] = SENTENCES,
    seed: int = 0,
    noise: float = NOISE_LEVEL,
) -> TimedTrack:
    """Piper's voice at ``pace`` (above 1 faster), resampled to 16 kHz."""
    from piper import PiperVoice, SynthesisConfig

    voice = PiperVoice.load(str(model))
    config = SynthesisConfig(length_scale=voice.config.length_scale / pace)
    rate = voice.config.sample_rate

    def say(text: str) -> np.ndarray:
        audio = np.concatenate([chunk.audio_float_array for chunk in voice.synthesize(text, config)])
        times = np.arange(int(audio.size * RATE / rate)) / RATE
        return np.interp(times, np.arange(audio.size) / rate, audio).astype(np.float32)

    name = f"piper {model.stem} pace {pace:g}" + (f" noise {noise:g}" if noise != NOISE_LEVEL else "")
    return build(path, name, say, sentences, seed, noise)


@dataclass(frozen=True)
class CueErrors:
    """Cue times against the true sentence times, in milliseconds (cue minus truth: late > 0).

    Attributes: starts (the first cue of each sentence against its start), ends (the last cue of
    each sentence against its end), missed (sentences no cue overlaps).
    """

    starts: list[float]
    ends: list[float]
    missed: list[str]

    @staticmethod
    def stats(errors: Sequence[float]) -> dict[str, float]:
        absolute = np.abs(np.asarray(errors, dtype=float))
        return {
            "median_ms": round(float(np.median(absolute)), 1),
            "p95_ms": round(float(np.percentile(absolute, 95)), 1),
            "max_ms": round(float(absolute.max()), 1),
            "mean_signed_ms": round(float(np.mean(errors)), 1),
        }


def cue_errors(cues: Sequence[tuple[float, float]], sentences: Sequence[tuple[str, float, float]]) -> CueErrors:
    """Each (start, end) cue belongs to the sentence it overlaps most; a sentence's first cue is
    timed against its start and its last against its end."""
    owned: dict[int, list[tuple[float, float]]] = {}
    for start, end in cues:
        overlaps = [min(end, e) - max(start, s) for _, s, e in sentences]
        best = int(np.argmax(overlaps))
        if overlaps[best] > 0:
            owned.setdefault(best, []).append((start, end))
    starts, ends, missed = [], [], []
    for k, (text, start, end) in enumerate(sentences):
        mine = owned.get(k)
        if not mine:
            missed.append(text)
            continue
        starts.append((min(c[0] for c in mine) - start) * 1000.0)
        ends.append((max(c[1] for c in mine) - end) * 1000.0)
    return CueErrors(starts=starts, ends=ends, missed=missed)
