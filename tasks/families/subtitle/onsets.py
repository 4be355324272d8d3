"""Word times refined against the sound itself: where speech starts and stops in a window's audio.

A recogniser's word times are coarse at the edges of speech, and the edges are what a viewer sees:
Whisper's cross-attention times (faster-whisper ``word_timestamps``) put an utterance's first word
up to a few hundred milliseconds early, stretched over the silence before it (across the cut-out
silence between two pieces of a window, even), or late, squeezed to its last syllable; its last
word often runs on into the silence after. pocketsphinx's frames are finer but its words start
and end in silence it took for speech. Both are measured in docs/benchmarks/subtitle.md (cue timing).

The window's audio already holds the truth: the speech's energy. This module, run on the window
the recogniser just heard (its samples are in memory anyway: nothing more is read or kept), does
what stable-ts calls silence suppression, plus snapping to onsets:

1. Each piece of the window (a VAD span with its padding) gets a loudness floor from its own
   quietest frames and its peak; 10 ms frames above ``max(floor x FLOOR_FACTOR, peak x PEAK_SHARE)``
   are sound. The joins between pieces are silent by construction.
2. Runs of sound closer than ``BRIDGE_SECONDS`` are bridged into stretches of speech (the gaps
   between words, stop closures).
3. A word's start moves forward to its first sound frame and its end back to its last: a word
   never starts or ends in silence. A word with no sound at all goes to the edge of the nearest
   stretch, with no length.
4. The first word of each stretch starts where the stretch starts (at most ``MAX_PULL_SECONDS``
   earlier than it was: a longer unheard sound before it, music say, is not its onset) and the
   last word ends where the stretch ends (at most as far later).

So a cue, which starts at its first word and ends at its last, starts at the speech's onset and
ends at its offset to within a frame or so wherever its words begin or end a stretch of speech.
:data:`METHOD` says this in each job's timing report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from mediafarm.tasks.families.subtitle.recognisers import Recognition
from mediafarm.tasks.families.subtitle.records import Segment, Word
from mediafarm.tasks.kit.media import SAMPLE_RATE

FRAME_SECONDS = 0.01
# Sound is this many times the piece's floor (3.5 dB) and at least this share of its peak (-36 dB).
FLOOR_FACTOR = 1.5
PEAK_SHARE = 0.016
# The floor: this quantile of a piece's frame loudness (its padding and the gaps between words).
FLOOR_QUANTILE = 0.05
# Gaps of silence shorter than this lie inside one stretch of speech.
BRIDGE_SECONDS = 0.2
# The farthest a word edge is pulled out to the edge of its stretch of speech.
MAX_PULL_SECONDS = 0.6

METHOD = (
    "word edges refined against the audio's energy within the VAD's speech pieces "
    "(silence suppressed, utterance onsets and offsets snapped to 10 ms frames)"
)


@dataclass(frozen=True)
class Stretch:
    """A stretch of speech in the window's audio: [start, end) seconds, window time."""

    start: float
    end: float


def sound_frames(audio: np.ndarray, pieces: Sequence[tuple[float, float]]) -> np.ndarray:
    """One flag a ``FRAME_SECONDS`` frame of ``audio``: sound. ``pieces`` are the (start, end)
    seconds of the window's speech pieces; frames outside them are silence."""
    size = round(FRAME_SECONDS * SAMPLE_RATE)
    count = audio.size // size
    rms = np.sqrt(np.mean(np.square(audio[: count * size].reshape(count, size), dtype=np.float64), axis=1))
    sound = np.zeros(count, dtype=bool)
    for start, end in pieces:
        first, last = int(start / FRAME_SECONDS), min(count, int(np.ceil(end / FRAME_SECONDS)))
        if last <= first:
            continue
        loudness = rms[first:last]
        floor = float(np.quantile(loudness, FLOOR_QUANTILE))
        threshold = max(floor * FLOOR_FACTOR, float(loudness.max()) * PEAK_SHARE, 1e-5)
        sound[first:last] = loudness > threshold
    return sound


def stretches(sound: np.ndarray) -> list[Stretch]:
    """Runs of sound frames, bridged across gaps shorter than ``BRIDGE_SECONDS``."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], sound.astype(np.int8), [0]))))
    runs = list(zip(edges[::2], edges[1::2], strict=True))  # [first, last) frame of each run
    bridge = round(BRIDGE_SECONDS / FRAME_SECONDS)
    merged: list[list[int]] = []
    for first, last in runs:
        if merged and first - merged[-1][1] < bridge:
            merged[-1][1] = int(last)
        else:
            merged.append([int(first), int(last)])
    return [Stretch(first * FRAME_SECONDS, last * FRAME_SECONDS) for first, last in merged]


def refine(segments: Sequence[Segment], audio: np.ndarray, pieces: Sequence[tuple[float, float]]) -> list[Segment]:
    """``segments`` (window time, as the recogniser gave them) with every word's edges refined
    against ``audio``, the window's samples; ``pieces``: (start, end) seconds of its speech pieces.
    Words keep their order and text; a segment's times follow its words."""
    words = [w for s in segments for w in s.words]
    if not words:
        return list(segments)
    sound = sound_frames(audio, pieces)
    found = stretches(sound)
    refined = _pull_to_stretches(_suppress_silence(words, sound, found), found)
    out: list[Segment] = []
    k = 0
    for segment in segments:
        mine = refined[k : k + len(segment.words)]
        k += len(segment.words)
        if mine:
            out.append(segment.model_copy(update={"start": mine[0].start, "end": mine[-1].end, "words": mine}))
    return out


def _suppress_silence(words: Sequence[Word], sound: np.ndarray, found: Sequence[Stretch]) -> list[Word]:
    """Each word kept inside the one stretch of speech it overlaps most (a word the recogniser ran
    across a silence, a join between pieces even, loses the side it overlaps less), its start moved
    forward to its first sound frame there and its end back to its last; a word touching no
    stretch goes, without length, to the nearest stretch edge."""
    out: list[Word] = []
    for word in words:
        overlaps = [min(word.end, s.end) - max(word.start, s.start) for s in found]
        best = int(np.argmax(overlaps)) if overlaps else -1
        touching = best >= 0 and (overlaps[best] > 0 or found[best].start <= word.start < found[best].end)
        if not touching:
            start = end = _nearest_edge(word, found)
        else:
            stretch = found[best]
            start, end = max(word.start, stretch.start), min(word.end, stretch.end)
            first = int(np.floor(start / FRAME_SECONDS))
            inside = np.flatnonzero(sound[first : max(first, int(np.ceil(end / FRAME_SECONDS)))])
            if inside.size:  # else the word lies in a gap the stretch bridges: it keeps its times
                start = max(start, (first + inside[0]) * FRAME_SECONDS)
                end = min(end, (first + inside[-1] + 1) * FRAME_SECONDS)
        out.append(word.model_copy(update={"start": start, "end": max(start, end)}))
    return out


def _nearest_edge(word: Word, found: Sequence[Stretch]) -> float:
    middle = (word.start + word.end) / 2
    edges = [edge for s in found for edge in (s.start, s.end)]
    if not edges:
        return word.start
    return min(edges, key=lambda edge: abs(edge - middle))


def _pull_to_stretches(words: list[Word], found: Sequence[Stretch]) -> list[Word]:
    """The first word starting in each stretch starts where it starts, the last ends where it ends."""
    for stretch in found:
        inside = [i for i, w in enumerate(words) if stretch.start <= w.start < stretch.end]
        if not inside:
            continue
        first, last = inside[0], inside[-1]
        w = words[first]
        earlier = words[first - 1].end if first else -np.inf
        if stretch.start < w.start and w.start - stretch.start <= MAX_PULL_SECONDS and earlier <= stretch.start:
            words[first] = w.model_copy(update={"start": stretch.start})
        w = words[last]
        later = words[last + 1].start if last + 1 < len(words) else np.inf
        if w.end < stretch.end and stretch.end - w.end <= MAX_PULL_SECONDS and later >= stretch.end:
            words[last] = w.model_copy(update={"end": stretch.end})
    return words


def refine_heard(heard: Recognition, audio: np.ndarray, pieces: Sequence[tuple[float, float]]) -> Recognition:
    """:func:`refine` on what a recogniser heard in one window (``audio``, times on its clock)."""
    return replace(heard, segments=refine(heard.segments, audio, pieces))
