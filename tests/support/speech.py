"""Speech with known silences, synthesised by espeak-ng (the wheel's library, :mod:`tests.support.espeak`):
the ground truth for VAD tests and benches."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from tests.support.espeak import hold_script, speak_wave

RATE = 16000
PHRASES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please leave the package at the front door.",
    "Someone is walking across the garden now.",
    "Turn off the lights before you go to sleep.",
)


def speak(text: str, *, rate: int = RATE) -> np.ndarray:
    """One phrase from espeak-ng as float32 mono at ``rate``, leading/trailing silence trimmed."""
    audio, sr = speak_wave(text)
    if sr != rate:
        # espeak-ng speaks at 22050 Hz; linear interpolation is plenty for a VAD ground truth.
        t_out = np.arange(int(len(audio) * rate / sr)) / rate
        audio = np.interp(t_out, np.arange(len(audio)) / sr, audio).astype(np.float32)
    loud = np.flatnonzero(np.abs(audio) > 0.02)
    return audio[loud[0] : loud[-1] + 1]


@dataclass(frozen=True)
class SpeechTrack:
    """Attributes: path (WAV file), truth (speech spans in seconds), duration (seconds)."""

    path: Path
    truth: list[tuple[float, float]]
    duration: float


def make_track(
    path: Path, gaps: Sequence[float] = (1.0, 2.5, 2.0, 3.0, 1.5), phrases: Sequence[str] = PHRASES[:4]
) -> SpeechTrack:
    """``gaps[0]`` s of silence, then phrase, gap, phrase ... ending with ``gaps[-1]`` s of silence."""
    if len(gaps) != len(phrases) + 1:
        raise ValueError("need one more gap than phrases")
    parts: list[np.ndarray] = []
    truth: list[tuple[float, float]] = []
    t = 0.0
    for gap, phrase in zip(gaps, phrases, strict=False):
        parts.append(np.zeros(int(gap * RATE), dtype=np.float32))
        t += int(gap * RATE) / RATE
        voice = speak(phrase)
        parts.append(voice)
        truth.append((t, t + voice.size / RATE))
        t += voice.size / RATE
    parts.append(np.zeros(int(gaps[-1] * RATE), dtype=np.float32))
    audio = np.concatenate(parts)
    sf.write(path, audio, RATE, subtype="PCM_16")
    return SpeechTrack(path=path, truth=truth, duration=audio.size / RATE)


def write_long_track(path: Path, seconds: float, pattern: SpeechTrack | None = None) -> float:
    """A long WAV made by repeating a short speech track, written block by block (flat memory).

    Returns the duration written. Used by the memory benchmark for 97-minute and 6-hour inputs.
    """
    if pattern is None:
        with tempfile.TemporaryDirectory() as tmp:
            pattern = make_track(Path(tmp) / "pattern.wav")
            unit, _ = sf.read(pattern.path, dtype="int16")
    else:
        unit, _ = sf.read(pattern.path, dtype="int16")
    total = int(seconds * RATE)
    written = 0
    with sf.SoundFile(path, "w", samplerate=RATE, channels=1, subtype="PCM_16") as out:
        while written < total:
            chunk = unit[: total - written]
            out.write(chunk)
            written += chunk.size
    return written / RATE


def held_espeak(path: Path, hold_s: float) -> Path:
    """An executable at ``path`` that speaks as espeak-ng does, holding ``hold_s`` seconds first when
    the text says "Patience": a slow line in a TTS test, and a window to kill its child."""
    return hold_script(path, hold_s, when="Patience")
