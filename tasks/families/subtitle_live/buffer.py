"""The live engine's audio: what is held until it is recognised, and when each part of it was sent."""

from __future__ import annotations

import collections

import numpy as np


class AudioBuffer:
    """The samples of this attempt not yet recognised, addressed by absolute sample position."""

    def __init__(self) -> None:
        self.start = 0
        self.data = np.zeros(0, dtype=np.float32)

    @property
    def end(self) -> int:
        return self.start + self.data.size

    def append(self, samples: np.ndarray) -> None:
        self.data = np.concatenate([self.data, samples]) if self.data.size else samples

    def cut(self, first: int, last: int) -> np.ndarray:
        """The samples from ``first`` to ``last`` that are still held (clipped to the buffer)."""
        first, last = max(first, self.start), min(last, self.end)
        return self.data[first - self.start : max(first, last) - self.start]

    def drop_before(self, position: int) -> None:
        if position > self.start:
            cut = min(position, self.end) - self.start
            self.data = self.data[cut:]
            self.start += cut


class Arrivals:
    """When (wall clock) the audio of each cue-clock time was sent: the start of every latency.

    The moment a frame is decoded is not it: while the child recognises, frames wait in the socket
    (and FFmpeg's FIFO), and a latency counted from their decoding would leave that wait out. A
    live source sends in real time, so the frame that arrived soonest after its stream time tells
    how stream time maps to the wall clock: ``wall = t + min(wall_i - t_i)`` over the frames of the
    last ``WINDOW`` seconds (a window, so a sender that paused and went on is followed).
    """

    WINDOW = 30.0

    def __init__(self) -> None:
        self._seen: collections.deque[tuple[float, float]] = collections.deque()  # (t, wall - t), ascending t

    def add(self, at: float, wall: float) -> None:
        self._seen.append((at, wall - at))
        while self._seen and self._seen[0][0] < at - self.WINDOW:
            self._seen.popleft()

    def wall_of(self, at: float) -> float | None:
        """Wall time the stream's cue time ``at`` was sent (None before any frame)."""
        if not self._seen:
            return None
        return at + min(lag for _, lag in self._seen)
