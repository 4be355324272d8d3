"""Generated tracks that stress a VAD: long silences, noise, music-like tones, very short utterances.

espeak-ng speaks several voices and speeds; numpy makes the rest. Every track is 16 kHz mono
PCM_16, its length not a whole number of 512-sample windows, and longer than one 10 s decode block,
so block and window edges fall mid-window. Used by the batched-VAD equality test
(tests/tasks/families/test_vad_batched.py) and the peer benchmark (bench/peers.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from tests.support.espeak import speak_wave
from tests.support.speech import PHRASES, RATE

VOICES = ("en-us", "en-gb", "en-us+f3", "en-gb-scotland", "en+m3")
SPEEDS = (130, 175, 220)  # espeak-ng words per minute
SENTENCES = (
    *PHRASES,
    "We will meet again at half past seven in the evening.",
    "The weather report says heavy rain is coming tomorrow.",
    "Could you tell me where the nearest train station is?",
)
SHORT_WORDS = ("yes", "no", "stop", "go", "hey", "okay", "wait", "hi")


@dataclass(frozen=True)
class Track:
    """Attributes: name, path (WAV), truth (speech spans in seconds), duration (seconds)."""

    name: str
    path: Path
    truth: list[tuple[float, float]]
    duration: float


def speak(text: str, voice: str, speed: int) -> np.ndarray:
    """espeak-ng's ``text`` in ``voice`` at ``speed`` words a minute, float32 at 16 kHz, trimmed."""
    audio, sr = speak_wave(text, voice, speed)
    t_out = np.arange(int(len(audio) * RATE / sr)) / RATE
    audio = np.interp(t_out, np.arange(len(audio)) / sr, audio).astype(np.float32)
    loud = np.flatnonzero(np.abs(audio) > 0.02)
    return audio[loud[0] : loud[-1] + 1]


class _Builder:
    """Appends parts to a track, keeping the true speech spans."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.parts: list[np.ndarray] = []
        self.truth: list[tuple[float, float]] = []
        self.samples = 0

    def add(self, audio: np.ndarray, speech: bool = False) -> None:
        if speech:
            self.truth.append((self.samples / RATE, (self.samples + audio.size) / RATE))
        self.parts.append(audio.astype(np.float32))
        self.samples += audio.size

    def quiet(self, seconds: float, level: float = 0.001) -> None:
        self.add(self.rng.standard_normal(int(seconds * RATE)) * level)

    def voice(self, text: str) -> None:
        self.add(speak(text, str(self.rng.choice(VOICES)), int(self.rng.choice(SPEEDS))), speech=True)

    def sentence(self) -> None:
        self.voice(str(self.rng.choice(SENTENCES)))

    def audio(self, under: Callable[[int], np.ndarray] | None = None) -> np.ndarray:
        audio = np.concatenate(self.parts)
        if under is not None:
            audio = audio + under(audio.size)
        return np.clip(audio, -1.0, 1.0)


def _tone(seconds: float, freqs: list[float], rng: np.random.Generator) -> np.ndarray:
    """A music-like note or chord: harmonics of each frequency, attack and decay."""
    t = np.arange(int(seconds * RATE)) / RATE
    out = np.zeros_like(t)
    for f in freqs:
        for k, amp in ((1, 1.0), (2, 0.5), (3, 0.25)):
            out += amp * np.sin(2 * np.pi * f * k * t + rng.uniform(0, 2 * np.pi))
    envelope = np.minimum(1.0, t / 0.02) * np.exp(-t * rng.uniform(0.3, 1.5))
    return 0.15 * out * envelope / len(freqs)


def long_silences(b: _Builder, seconds: float) -> None:
    """Sentences between 8-30 s of near-silence."""
    while b.samples < seconds * RATE:
        b.quiet(b.rng.uniform(8, 30))
        b.sentence()
    b.quiet(3.3)


def noise(b: _Builder, seconds: float) -> None:
    """Sentences in steady noise, with louder noise bursts and no speech in between."""
    while b.samples < seconds * RATE:
        b.quiet(b.rng.uniform(2, 8))
        if b.rng.random() < 0.5:
            b.add(b.rng.standard_normal(int(b.rng.uniform(0.5, 3) * RATE)) * b.rng.uniform(0.05, 0.2))
            b.quiet(b.rng.uniform(1, 3))
        b.sentence()
    b.quiet(2.7)


def _noise_under(b: _Builder) -> Callable[[int], np.ndarray]:
    return lambda n: b.rng.standard_normal(n) * 0.02


def tones(b: _Builder, seconds: float) -> None:
    """Chords and runs of short notes, with sentences at least 2 s away from any of them."""
    notes = 220.0 * 2 ** (np.arange(24) / 12)
    while b.samples < seconds * RATE:
        b.quiet(b.rng.uniform(2, 4))
        if b.rng.random() < 0.5:
            b.add(_tone(b.rng.uniform(3, 8), list(b.rng.choice(notes, size=int(b.rng.integers(2, 5)))), b.rng))
        else:
            for _ in range(int(b.rng.integers(6, 16))):
                b.add(_tone(b.rng.uniform(0.25, 0.5), [float(b.rng.choice(notes))], b.rng))
        b.quiet(b.rng.uniform(2, 4))
        b.sentence()
    b.quiet(2.1)


def short_utterances(b: _Builder, seconds: float) -> None:
    """Single short words, 0.2-1.5 s apart: gaps around min_silence_ms and spans near one window."""
    while b.samples < seconds * RATE:
        b.quiet(b.rng.uniform(0.2, 1.5))
        b.voice(str(b.rng.choice(SHORT_WORDS)))
    b.quiet(1.9)


KINDS: dict[str, Callable[[_Builder, float], None]] = {
    "long-silences": long_silences,
    "noise": noise,
    "tones": tones,
    "short-utterances": short_utterances,
}


def make(kind: str, path: Path, seconds: float, seed: int = 0) -> Track:
    """A ``kind`` track of at least ``seconds`` written to ``path`` (noise and tones tracks have
    steady noise under the whole track)."""
    b = _Builder(seed)
    KINDS[kind](b, seconds)
    under = _noise_under(b) if kind in ("noise", "tones") else None
    audio = b.audio(under)
    if audio.size % 512 == 0:  # never a whole number of windows: the last one is padded
        audio = audio[:-100]
    sf.write(path, audio, RATE, subtype="PCM_16")
    return Track(name=kind, path=path, truth=b.truth, duration=audio.size / RATE)


def make_all(folder: Path, seconds: float, seed: int = 0) -> list[Track]:
    """One track of every kind in ``folder``, each at least ``seconds`` long."""
    folder.mkdir(parents=True, exist_ok=True)
    return [make(kind, folder / f"{kind}.wav", seconds, seed) for kind in KINDS]
