"""Tonal spans: music-like notes and chords the VAD took for speech, set aside before recognition.

silero now and then calls a held note or a chord speech. Whisper, given one, hears a word in it
("not" in a note run on the held-out corpus, issue #35). A note is a stationary harmonic spectrum:
its partials stay at the same frequencies while its level decays, so its spectrum 32 ms on is
the same shape, only quieter. Speech never holds still that long: its pitch glides and its
formants move from sound to sound, even in a sustained synthetic vowel.

The measure: the cosine similarity of magnitude spectra (80-4000 Hz, 64 ms frames) ``LAG`` hops
apart, taken on every frame of the VAD's own pass (:class:`SpectralStability` is fed its blocks,
so the audio is not decoded again). A span is tonal when, of its frame pairs loud enough to judge,
at least ``TONAL_SHARE`` are near-identical (``STABLE_SIMILARITY``). A run of notes stays tonal:
only the pairs across a note change differ. Speech mixed into the span lowers the share, so a span
of speech and tone together is kept: a tone missed costs a word at worst, speech dropped costs
the whole span. The thresholds were chosen on the held-out corpus's tuning half only
(docs/benchmarks/subtitle.md, "Tonal spans").

Memory: two float16 figures per 16 ms hop (900 KB an hour of media).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from mediafarm.tasks.families.subtitle.records import RejectedSpan
from mediafarm.tasks.kit import Span
from mediafarm.tasks.kit.media import SAMPLE_RATE

FRAME = 1024  # 64 ms: partials of notes a semitone apart fall in separate bins
HOP = 256
LAG = 2  # frames compared 32 ms apart: long enough for speech's pitch and formants to move
LOW_HZ, HIGH_HZ = 80.0, 4000.0  # where voiced speech and a note's first partials both lie
# A pair this similar is one unchanged spectrum. At 0.95 slow espeak-ng singing ("la la la" at
# 80 words a minute) had half its pairs stable; at this level a quarter at most, a note nearly all.
STABLE_SIMILARITY = 0.98
# Frames more than this far below the span's loudest are not judged: at the noise floor the
# spectrum is the noise's, not the sound's.
LOUD_WITHIN_DB = 20.0
# A span with fewer loud pairs than this (under about 0.14 s) is too short to judge and is kept.
# On the tuning half 4 left a 0.16 s note where Whisper heard "we"; no speech span had 3 to 8 pairs
# stable enough to come near the share.
MIN_PAIRS = 3
# Share of stable pairs from which a span is tonal: chosen on the held-out corpus's tuning half,
# where no speech span came near it and every tonal span judged was well above it (the figures:
# docs/benchmarks/subtitle.md, "Tonal spans").
TONAL_SHARE = 0.5
REASON = "tonal"


class SpectralStability:
    """Per hop of the audio it is fed: the frame's level (dB) and its spectrum's similarity to the
    frame ``LAG`` hops before (NaN for the first frames). Fed in order, blocks of any size."""

    def __init__(self) -> None:
        self._window = np.hanning(FRAME).astype(np.float32)
        freqs = np.fft.rfftfreq(FRAME, 1 / SAMPLE_RATE)
        self._band = (freqs >= LOW_HZ) & (freqs <= HIGH_HZ)
        self._pending = np.zeros(0, dtype=np.float32)  # samples not yet in a whole frame
        self._last = np.zeros((0, int(self._band.sum())), dtype=np.float32)  # the last LAG spectra
        self._level: list[np.ndarray] = []  # dB
        self._similarity: list[np.ndarray] = []

    def feed(self, block: np.ndarray) -> None:
        samples = np.concatenate([self._pending, np.asarray(block, dtype=np.float32)])
        if samples.size < FRAME:
            self._pending = samples
            return
        frames = sliding_window_view(samples, FRAME)[::HOP]
        spectra = np.abs(np.fft.rfft(frames * self._window, axis=1))[:, self._band].astype(np.float32)
        self._pending = samples[frames.shape[0] * HOP :]
        both = np.concatenate([self._last, spectra])
        before = both[: -LAG] if both.shape[0] > LAG else both[:0]
        similarity = np.full(spectra.shape[0], np.nan, dtype=np.float32)
        paired = before.shape[0]
        if paired:
            now = both[LAG:]
            dot = np.einsum("ij,ij->i", before, now)
            norms = np.linalg.norm(before, axis=1) * np.linalg.norm(now, axis=1)
            similarity[spectra.shape[0] - paired :] = dot / np.maximum(norms, 1e-12)
        self._last = both[-LAG:]
        energy = np.einsum("ij,ij->i", spectra, spectra)
        self._level.append((10 * np.log10(np.maximum(energy, 1e-12))).astype(np.float16))
        self._similarity.append(similarity.astype(np.float16))

    def frames(self) -> tuple[np.ndarray, np.ndarray]:
        """(level, similarity), one of each per frame so far (frame i starts at sample i * HOP)."""
        if len(self._level) != 1:
            self._level = [np.concatenate(self._level or [np.zeros(0, dtype=np.float16)])]
            self._similarity = [np.concatenate(self._similarity or [np.zeros(0, dtype=np.float16)])]
        return self._level[0], self._similarity[0]

    def stable_share(self, span: Span) -> tuple[float, int]:
        """Of the span's loud frame pairs (both frames inside it), the share that are stable, and
        how many pairs there were."""
        level, similarity = self.frames()
        first = math.ceil(span.start * SAMPLE_RATE / HOP)
        last = min(level.size - 1, math.floor((span.end * SAMPLE_RATE - FRAME) / HOP))
        if last - first < LAG:
            return 0.0, 0
        inside = level[first : last + 1].astype(np.float32)
        loud = inside >= inside.max() - LOUD_WITHIN_DB
        pairs = loud[LAG:] & loud[:-LAG]
        values = similarity[first + LAG : last + 1].astype(np.float32)[pairs]
        values = values[np.isfinite(values)]
        if not values.size:
            return 0.0, 0
        return float(np.mean(values >= STABLE_SIMILARITY)), int(values.size)


def is_tonal(share: float, pairs: int) -> bool:
    return pairs >= MIN_PAIRS and share >= TONAL_SHARE


def set_aside(spans: Sequence[Span], stability: SpectralStability) -> tuple[list[Span], list[RejectedSpan]]:
    """The spans kept for recognition, and the tonal ones set aside (with their share)."""
    kept: list[Span] = []
    rejected: list[RejectedSpan] = []
    for span in spans:
        share, pairs = stability.stable_share(span)
        if is_tonal(share, pairs):
            rejected.append(RejectedSpan(start=round(span.start, 3), end=round(span.end, 3), reason=REASON,
                                         stable_share=round(share, 3)))  # fmt: skip
        else:
            kept.append(span)
    return kept, rejected
