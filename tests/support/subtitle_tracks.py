"""Generated speech tracks with their words known: the truth for subtitle WER and words-in-silence.

espeak-ng speaks sentences in several voices and speeds (``tests.support.vad_tracks.speak``);
numpy makes the silences and the noise. Every track is 16 kHz mono PCM_16 and keeps, besides the
true speech spans, the text of each span in order, so a recogniser's words can be scored against
it. Used by the subtitle peer benchmark (bench/peers_subtitle.py) and the subtitle WER regression
test (tests/integration/test_subtitle_accuracy.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from tests.support.speech import PHRASES, RATE
from tests.support.vad_tracks import SPEEDS, VOICES, speak

# Everyday sentences and Harvard sentences (IEEE 1969): varied words, none repeated within a window.
SENTENCES = (
    *PHRASES,
    "We will meet again at half past seven in the evening.",
    "The weather report says heavy rain is coming tomorrow.",
    "Could you tell me where the nearest train station is?",
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It is easy to tell the depth of a well.",
    "These days a chicken leg is a rare dish.",
    "Rice is often served in round bowls.",
    "The juice of lemons makes fine punch.",
    "The box was thrown beside the parked truck.",
    "Four hours of steady work faced us.",
    "The boy was there when the sun rose.",
    "A rod is used to catch pink salmon.",
    "She read the letter twice before she put it away.",
)
SHORT = ("yes please", "no thanks", "stop", "go ahead", "okay", "wait here", "hello", "thank you")


@dataclass(frozen=True)
class SubtitleTrack:
    """Attributes: name, path (WAV), truth (speech spans, seconds), text (what each span says, in
    order), duration (seconds)."""

    name: str
    path: Path
    truth: list[tuple[float, float]]
    text: list[str]
    duration: float

    @property
    def words(self) -> list[str]:
        return normalise(" ".join(self.text))


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.parts: list[np.ndarray] = []
        self.truth: list[tuple[float, float]] = []
        self.text: list[str] = []
        self.samples = 0

    def add(self, audio: np.ndarray) -> None:
        self.parts.append(audio.astype(np.float32))
        self.samples += audio.size

    def quiet(self, seconds: float, level: float = 0.001) -> None:
        self.add(self.rng.standard_normal(int(seconds * RATE)) * level)

    def say(self, text: str) -> None:
        audio = speak(text, str(self.rng.choice(VOICES)), int(self.rng.choice(SPEEDS)))
        self.truth.append((self.samples / RATE, (self.samples + audio.size) / RATE))
        self.text.append(text)
        self.add(audio)

    def sentence(self) -> None:
        self.say(str(self.rng.choice(SENTENCES)))


def conversation(b: _Builder, seconds: float) -> None:
    """Sentences 0.4-2.5 s apart, each in another voice and speed."""
    while b.samples < seconds * RATE:
        b.quiet(b.rng.uniform(0.4, 2.5))
        b.sentence()
    b.quiet(1.5)


def noise(b: _Builder, seconds: float) -> None:
    """Sentences in steady noise (added over the whole track) with louder noise bursts between."""
    while b.samples < seconds * RATE:
        b.quiet(b.rng.uniform(1, 4))
        if b.rng.random() < 0.5:
            b.add(b.rng.standard_normal(int(b.rng.uniform(0.5, 2) * RATE)) * b.rng.uniform(0.05, 0.2))
            b.quiet(b.rng.uniform(1, 2))
        b.sentence()
    b.quiet(2.0)


def long_gaps(b: _Builder, seconds: float) -> None:
    """Sentences between 8-25 s of near-silence."""
    while b.samples < seconds * RATE:
        b.quiet(b.rng.uniform(8, 25))
        b.sentence()
    b.quiet(3.0)


def short_utterances(b: _Builder, seconds: float) -> None:
    """One- and two-word utterances 0.5-2 s apart, a sentence now and then."""
    while b.samples < seconds * RATE:
        b.quiet(b.rng.uniform(0.5, 2.0))
        if b.rng.random() < 0.25:
            b.sentence()
        else:
            b.say(str(b.rng.choice(SHORT)))
    b.quiet(1.5)


KINDS: dict[str, Callable[[_Builder, float], None]] = {
    "conversation": conversation,
    "noise": noise,
    "long-gaps": long_gaps,
    "short-utterances": short_utterances,
}


def make(kind: str, path: Path, seconds: float, seed: int = 0) -> SubtitleTrack:
    """A ``kind`` track of at least ``seconds``, written to ``path``."""
    if kind not in KINDS:
        raise ValueError(f"unknown track kind {kind!r}; known: {', '.join(KINDS)}")
    b = _Builder(seed)
    KINDS[kind](b, seconds)
    audio = np.concatenate(b.parts)
    if kind == "noise":
        audio = audio + b.rng.standard_normal(audio.size).astype(np.float32) * 0.02
    sf.write(path, np.clip(audio, -1.0, 1.0), RATE, subtype="PCM_16")
    return SubtitleTrack(name=kind, path=path, truth=b.truth, text=b.text, duration=audio.size / RATE)


def normalise(text: str) -> list[str]:
    """Lowercased words without punctuation (hyphens split words)."""
    import re

    return re.sub(r"[^a-z0-9'\s]", " ", text.lower().replace("-", " ")).split()


def word_errors(reference: list[str], hypothesis: list[str]) -> int:
    """Word-level edit distance (substitutions, deletions, insertions)."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        current = [i] + [0] * len(hypothesis)
        for j, hyp in enumerate(hypothesis, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref != hyp))
        previous = current
    return previous[-1]


def wer(reference: list[str], hypothesis: list[str]) -> float:
    """Word error rate of ``hypothesis`` against ``reference`` (both already normalised)."""
    return word_errors(reference, hypothesis) / max(1, len(reference))


def words_in_silence(words: list[tuple[float, float]], truth: list[tuple[float, float]], tolerance: float = 0.5) -> int:
    """Words (start, end) whose midpoint is more than ``tolerance`` s outside every true span."""
    count = 0
    for start, end in words:
        mid = (start + end) / 2
        if all(mid < s - tolerance or mid > e + tolerance for s, e in truth):
            count += 1
    return count
