"""A second look at the speech a window's recognition left without a single word.

Whisper decodes a window of up to ``WINDOW_SECONDS`` greedily at temperature 0
(``recognizers.transcribe_whisper``). Now and then its first timestamp lands seconds into the
window, and everything before it is skipped whole. Which window this happens to depends on the
CPU, because the int8 kernels differ: on one AVX-512 machine tiny.en skipped the first 19 s of a
27 s window, which an AVX2 machine heard in full. The VAD knows where the speech is, so each
piece of a window that got no word is recognised again on its own, which is what a short window
is good at. The cost is one more recogniser call per missed piece, and faster-whisper pads every
call to 30 s, so each costs about as much to encode as a whole window. To keep that rare:

- only pieces of at least ``MIN_PIECE_SECONDS`` are looked at again: a cough or a click the VAD
  took for speech is shorter than a sentence;
- a piece is missed only if no word lies in it or within half a join of it (Whisper puts a word's
  edge in the silence between two pieces now and then);
- only windows that hold other pieces: one piece alone would be decoded from the same audio, with
  the same result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from mediafarm.tasks.families.subtitle.recognizers import Recognition
from mediafarm.tasks.families.subtitle.records import Segment
from mediafarm.tasks.kit.media import SAMPLE_RATE

# A padded piece shorter than this (the padding is 0.3 s of it) is not looked at again.
MIN_PIECE_SECONDS = 1.0
# A word this close to a piece is the piece's (half the silence that joins two pieces in a window).
NEAR_SECONDS = 0.15


def missed(heard: Recognition, spans: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the pieces (``spans``: where each lies in the window's audio, seconds) that no
    heard word lies in or near."""
    words = [(w.start, w.end) for segment in heard.segments for w in segment.words]
    return [i for i, (a, b) in enumerate(spans)
            if b - a >= MIN_PIECE_SECONDS
            and not any(start < b + NEAR_SECONDS and end > a - NEAR_SECONDS for start, end in words)]  # fmt: skip


def second_look(
    heard: Recognition, audio: np.ndarray, spans: Sequence[tuple[float, float]],
    recognise: Callable[[np.ndarray], Recognition],
) -> Recognition:  # fmt: skip
    """``heard`` with the words of each missed piece, recognised alone, added in their place (times
    in the window's audio, as ``heard``'s)."""
    if len(spans) < 2:
        return heard
    extra: list[Segment] = []
    for i in missed(heard, spans):
        a, b = spans[i]
        again = recognise(audio[round(a * SAMPLE_RATE) : round(b * SAMPLE_RATE)])
        for segment in again.segments:
            words = [w.model_copy(update={"start": round(min(b, a + w.start), 3), "end": round(min(b, a + w.end), 3)})
                     for w in segment.words]  # fmt: skip
            extra.append(Segment(start=words[0].start, end=words[-1].end, text=segment.text, words=words))
    if not extra:
        return heard
    return dataclasses.replace(heard, segments=sorted([*heard.segments, *extra], key=lambda s: s.start))
