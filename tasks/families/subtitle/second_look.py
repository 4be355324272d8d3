"""A second look at a window's speech where Whisper's greedy decode went wrong.

The farm decodes each window (``windows.plan_windows``) greedily at temperature 0
(``recognisers.transcribe_whisper``): faster-whisper's temperature fallback re-decodes a doubtful
window at random temperatures, which is slower and gives a different result each run. Greedy
decoding of a long window has two known ways to go wrong, and where they strike depends even on the
CPU, because the int8 kernels differ. On one AVX-512 machine, for example, tiny.en skipped the first
19 s of a 27 s window that an AVX2 machine heard in full, and ran three sentences into one. Here,
deterministically:

1. **A doubtful window is split.** A window whose decode Whisper itself doubts (``unsure``: a
   segment's average log-probability under the threshold of its own fallback) is recognised again
   as two halves of its pieces, each looked at as below. A shorter window is what Whisper decodes
   best. Fewer word errors for a little more CPU, measured on the peer benchmark's four tracks
   (docs/benchmarks/subtitle.md, the re-run with the second look).
2. **A piece with no word is recognised alone.** Whisper's first timestamp can land seconds into
   the window, and everything before it is lost. The VAD knows where the speech is, so each piece
   of the window that no word lies in or near is recognised again on its own.

Each look is one more recogniser call, and each call costs a fixed part besides its audio (the
encoder's padding after it: 30 s in all as faster-whisper pads it, 4-5 s on a rung with
``fit_context``; the decoder's prompt). To keep that rare:

- only pieces of at least ``MIN_PIECE_SECONDS`` are looked at again: a cough or a click the VAD took
  for speech is shorter than a sentence;
- a word within half a join of a piece counts as the piece's, because Whisper puts a word's edge in
  the silence between two pieces now and then;
- a window of one piece is never decoded again, since the same audio would give the same result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from mediafarm.tasks.families.subtitle.recognisers import Recognition
from mediafarm.tasks.families.subtitle.records import Segment
from mediafarm.tasks.kit.media import SAMPLE_RATE

# A padded piece shorter than this (the padding is 0.3 s of it) is not looked at again.
MIN_PIECE_SECONDS = 1.0
# A word this close to a piece is the piece's (half the silence that joins two pieces in a window).
NEAR_SECONDS = 0.15

Spans = Sequence[tuple[float, float]]
Recognise = Callable[[np.ndarray], Recognition]


def missed(heard: Recognition, spans: Spans) -> list[int]:
    """Indices of the pieces (``spans``: where each lies in the window's audio, seconds) that no
    heard word lies in or near."""
    words = [(w.start, w.end) for segment in heard.segments for w in segment.words]
    return [i for i, (a, b) in enumerate(spans)
            if b - a >= MIN_PIECE_SECONDS
            and not any(start < b + NEAR_SECONDS and end > a - NEAR_SECONDS for start, end in words)]  # fmt: skip


def second_look(
    heard: Recognition, audio: np.ndarray, spans: Spans, recognise: Recognise, *, split: bool = True
) -> Recognition:
    """``heard``, or what a second look heard instead (the module's two rules; ``split``: the
    first one too); times in the window's audio, as ``heard``'s."""
    if len(spans) < 2:
        return heard
    if heard.unsure and split:
        middle = len(spans) // 2
        halves = [_look(audio, spans[:middle], recognise), _look(audio, spans[middle:], recognise)]
        return dataclasses.replace(heard, segments=[s for half in halves for s in half], unsure=False)
    extra = [s for i in missed(heard, spans) for s in _heard_in(audio, spans[i], recognise(_cut(audio, spans[i])))]
    if not extra:
        return heard
    return dataclasses.replace(heard, segments=sorted([*heard.segments, *extra], key=lambda s: s.start))


def _look(audio: np.ndarray, spans: Spans, recognise: Recognise) -> list[Segment]:
    """The segments of a run of pieces recognised as one shorter window, its missed pieces alone."""
    first, last = spans[0][0], spans[-1][1]
    part = _cut(audio, (first, last))
    heard = recognise(part)
    local = [(a - first, b - first) for a, b in spans]
    # A half still in doubt is not split again (one split a window: the cost stays bounded).
    return _heard_in(audio, (first, last), second_look(heard, part, local, recognise, split=False))


def _cut(audio: np.ndarray, span: tuple[float, float]) -> np.ndarray:
    return audio[round(span[0] * SAMPLE_RATE) : round(span[1] * SAMPLE_RATE)]


def _heard_in(audio: np.ndarray, span: tuple[float, float], heard: Recognition) -> list[Segment]:
    """``heard``'s segments (times in ``span``'s own audio) on the window's clock, inside ``span``."""
    a, b = span
    out = []
    for segment in heard.segments:
        words = [w.model_copy(update={"start": round(min(b, a + w.start), 3), "end": round(min(b, a + w.end), 3)})
                 for w in segment.words]  # fmt: skip
        out.append(Segment(start=words[0].start, end=words[-1].end, text=segment.text, words=words))
    return out
