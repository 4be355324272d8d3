"""Speech cut into recognition windows, and each window's times mapped back to the media's clock.

Shared by the file subtitle job (``engines``) and the live one (``subtitle_live.live``): the VAD's
speech spans are padded, merged where they touch, and packed into windows of at most a window's
length of speech, joined by ``JOIN_SECONDS`` of silence; the silence between spans is never
recognised (it is where Whisper hallucinates). A recognised time in a window goes back to the
media's clock piece by piece (:meth:`Window.media_time`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from mediafarm.tasks.families.subtitle.records import Segment, Word
from mediafarm.tasks.kit import Span
from mediafarm.tasks.kit.media import SAMPLE_RATE, KeptAudio

# Speech is cut with this much context on each side (word edges are soft)...
PAD_SECONDS = 0.15
# ... and recognised in windows of at most this much speech, pieces joined by a short silence:
# nearly Whisper's whole 30 s, which it encodes whatever a window holds...
WINDOW_SECONDS = 28.0
# ... or this much where the encoder sees only the window (a rung's fit_context): fitted 20 s
# windows heard more words right than fitted 28 s ones for less CPU, and 16 s windows made more
# second looks (measured: docs/benchmarks/subtitle.md, "Fitted encoder").
FITTED_WINDOW_SECONDS = 20.0
JOIN_SECONDS = 0.3


@dataclass(frozen=True)
class Piece:
    """One padded speech span inside a window: [start, end) on the media clock, placed at
    ``at`` seconds into the window's audio."""

    start: float
    end: float
    at: float


@dataclass
class Window:
    """Speech pieces recognised in one call, joined by JOIN_SECONDS of silence."""

    pieces: list[Piece] = field(default_factory=list)

    @property
    def length(self) -> float:
        last = self.pieces[-1]
        return last.at + (last.end - last.start)

    @property
    def end(self) -> float:
        return self.pieces[-1].end

    @property
    def speech_seconds(self) -> float:
        return sum(p.end - p.start for p in self.pieces)

    def spans(self) -> list[tuple[float, float]]:
        """Where each piece lies in the window's audio: (start, end) seconds."""
        return [(p.at, p.at + p.end - p.start) for p in self.pieces]

    def media_time(self, t: float) -> float:
        """A time in the window's audio → the media's clock (a time in a join goes to the piece
        before it ends or after it starts, whichever is nearer)."""
        best = self.pieces[0]
        for piece in self.pieces:
            if t >= piece.at:
                best = piece
        local = t - best.at
        length = best.end - best.start
        if local > length:  # inside the join after `best`
            index = self.pieces.index(best)
            following = self.pieces[index + 1] if index + 1 < len(self.pieces) else None
            if following is None or local - length < following.at - t:
                return best.end
            return following.start
        return best.start + max(0.0, local)

    def to_media(self, segment: Segment) -> Segment:
        """The segment on the media clock. A word keeps its length inside the piece its start maps
        to: its end never jumps across the silence cut out between two pieces."""
        words = []
        for w in segment.words:
            start = self.media_time(w.start)
            piece = next(p for p in self.pieces if p.start <= start <= p.end)
            end = min(piece.end, start + max(0.0, w.end - w.start))
            words.append(Word(text=w.text, start=round(start, 3), end=round(end, 3), probability=w.probability))
        if not words:
            return Segment(start=0.0, end=0.0, text="", words=[])
        return Segment(start=words[0].start, end=words[-1].end, text=" ".join(w.text for w in words), words=words)


def plan_windows(spans: Sequence[Span], duration: float, window_seconds: float = WINDOW_SECONDS) -> list[Window]:
    """Pad the speech spans, merge those that touch, and pack them into windows of at most
    ``window_seconds`` of audio. A span longer than a window is split at window length."""
    padded: list[Span] = []
    for span in spans:
        start, end = max(0.0, span.start - PAD_SECONDS), min(duration, span.end + PAD_SECONDS)
        if padded and start <= padded[-1].end:
            padded[-1] = Span(padded[-1].start, max(padded[-1].end, end))
        elif end > start:
            padded.append(Span(start, end))
    pieces: list[Span] = []
    for span in padded:
        start = span.start
        while span.end - start > window_seconds:
            pieces.append(Span(start, start + window_seconds))
            start += window_seconds
        pieces.append(Span(start, span.end))
    windows: list[Window] = []
    for piece in pieces:
        current = windows[-1] if windows else None
        at = 0.0 if current is None else current.length + JOIN_SECONDS
        if current is None or at + (piece.end - piece.start) > window_seconds:
            windows.append(Window([Piece(piece.start, piece.end, 0.0)]))
        else:
            current.pieces.append(Piece(piece.start, piece.end, at))
    return windows


def cut_windows(audio: KeptAudio, windows: Sequence[Window]) -> Iterator[tuple[Window, np.ndarray]]:
    """The second pass over the audio (kept, or one more streaming decode): each window's audio
    (its pieces' samples joined by silence), in order."""
    pieces = [(w, p) for w in windows for p in w.pieces]
    if not pieces:
        return
    join = np.zeros(int(round(JOIN_SECONDS * SAMPLE_RATE)), dtype=np.float32)
    index = 0
    parts: list[np.ndarray] = []
    collected: list[np.ndarray] = []
    position = 0  # samples decoded before the current block
    for block in audio.again():
        block_end = position + block.size
        while index < len(pieces):
            window, piece = pieces[index]
            first, last = round(piece.start * SAMPLE_RATE), round(piece.end * SAMPLE_RATE)
            if first >= block_end:
                break
            collected.append(block[max(0, first - position) : max(0, min(last, block_end) - position)])
            if last > block_end:
                break  # the piece goes on in the next block
            parts.append(np.concatenate(collected) if collected else np.zeros(0, dtype=np.float32))
            collected = []
            index += 1
            if index == len(pieces) or pieces[index][0] is not window:
                yield window, _join(parts, join)
                parts = []
        position = block_end
    if index < len(pieces):
        # The last piece ran to the very end of the media (its end rounded up past the last sample).
        parts.append(np.concatenate(collected) if collected else np.zeros(0, dtype=np.float32))
        yield pieces[index][0], _join(parts, join)


def _join(parts: list[np.ndarray], join: np.ndarray) -> np.ndarray:
    out: list[np.ndarray] = []
    for i, part in enumerate(parts):
        if i:
            out.append(join)
        out.append(part)
    return np.concatenate(out).astype(np.float32, copy=False)
