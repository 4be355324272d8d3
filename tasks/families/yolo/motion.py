"""The motion gate: which sampled frames reach the model.

:class:`MotionDetector` compares each small grey frame with a slowly learnt background (a running
average) and reports the changed region. :class:`MotionGate` turns that into a decision per frame:
frames with motion go to the model, and so do frames within a margin before and after motion. The
"before" frames are held in a deque of a few frames (the margin over the stride), never a list of
the whole video, so memory stays flat.

Both are plain numpy, a few hundred microseconds a frame at 160 px wide.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")


@dataclass(frozen=True)
class Region:
    """Where a frame changed, as fractions of the frame (so any resolution can use it).

    Attributes:
        x1, y1, x2, y2: Bounding box of the changed pixels, 0..1.
        area: Fraction of the frame's pixels that changed.
    """

    x1: float
    y1: float
    x2: float
    y2: float
    area: float


class MotionDetector:
    """Pixels that differ from a running-average background and from the previous frame.

    Args:
        alpha: Weight of each new frame in the background (0..1].
        threshold: Grey-level difference that counts as a change.
        min_area: Fraction of the pixels that must change for the frame to count as motion.

    The background alone would leave a ghost where something stopped or left, reported as motion
    until the average forgets it (seconds to minutes); the previous frame alone counts every
    flicker. A pixel that differs from both is moving now and is not flickering around the usual
    picture. Every frame is blended into the background, moving or not, so a change that stays
    (a parked car, the lights going on) becomes the background. The first frame starts it.
    """

    def __init__(self, *, alpha: float, threshold: int, min_area: float) -> None:
        self.alpha, self.threshold, self.min_area = alpha, threshold, min_area
        self._background: np.ndarray | None = None
        self._previous: np.ndarray | None = None

    def update(self, grey: np.ndarray) -> Region | None:
        """The changed region of ``grey`` (a 2-D uint8 frame), or None if too little changed."""
        frame = grey.astype(np.float32)
        background, previous = self._background, self._previous
        self._previous = frame
        if background is None or previous is None or background.shape != frame.shape:
            self._background = frame.copy()
            return None
        changed = (np.abs(frame - background) > self.threshold) & (np.abs(frame - previous) > self.threshold)
        background += self.alpha * (frame - background)
        area = float(changed.mean())
        if area < self.min_area:
            return None
        rows = np.flatnonzero(changed.any(axis=1))
        cols = np.flatnonzero(changed.any(axis=0))
        h, w = changed.shape
        return Region(cols[0] / w, rows[0] / h, (cols[-1] + 1) / w, (rows[-1] + 1) / h, area)

    def arrays(self) -> dict[str, np.ndarray] | None:
        """What it has learnt (background and previous frame), for a checkpoint; None before the
        first frame."""
        if self._background is None or self._previous is None:
            return None
        return {"background": self._background, "previous": self._previous}

    def load(self, background: np.ndarray, previous: np.ndarray) -> None:
        """Go on from :meth:`arrays` of another run: exactly where it was, bit for bit."""
        self._background = background.astype(np.float32, copy=True)
        self._previous = previous.astype(np.float32, copy=True)


@dataclass(frozen=True)
class Gated(Generic[T]):
    """A frame the gate lets through. ``region``: its own motion, or None (a margin frame)."""

    t: float
    item: T
    region: Region | None


class MotionGate(Generic[T]):
    """Decide which frames go to the model, in time order.

    Args:
        stride: Seconds between the frames offered.
        margin_before, margin_after: Seconds around motion whose frames go through too.
        first_frame: Let the first frame through (a scene that starts with someone standing
            still, and an image, which is one frame).

    ``offer(t, item, region)`` returns the frames to examine now: the held "before" frames, then
    this one if it passes. ``skipped`` counts frames that never passed.
    """

    def __init__(self, *, stride: float, margin_before: float, margin_after: float, first_frame: bool = True) -> None:
        self.margin_after = margin_after
        self._held: deque[Gated[T]] = deque(maxlen=math.ceil(margin_before / stride - 1e-9))
        self._until = -math.inf
        self._first = first_frame
        self.skipped = 0

    def offer(self, t: float, item: T, region: Region | None) -> Iterator[Gated[T]]:
        frame = Gated(t, item, region)
        if region is not None or self._first or t <= self._until + 1e-9:
            self._first = False
            if region is not None:
                self._until = t + self.margin_after
            while self._held:
                yield self._held.popleft()
            yield frame
            return
        if self._held.maxlen and len(self._held) == self._held.maxlen:
            self.skipped += 1  # the oldest held frame falls out of the margin for good
        if self._held.maxlen:
            self._held.append(frame)
        else:
            self.skipped += 1

    def held(self) -> list[Gated[T]]:
        """The frames held, undecided yet (motion in the next ones would send them through)."""
        return list(self._held)

    def state(self) -> dict[str, float | bool | int | None]:
        """Its decisions so far, for a checkpoint, but for the held frames: a resumed run offers
        them again from the oldest (:meth:`restore`, then :meth:`offer`), which holds them again
        without counting a skip (none is full before the last one comes in)."""
        until = self._until if math.isfinite(self._until) else None  # JSON has no infinity
        return {"until": until, "first": self._first, "skipped": self.skipped}

    def restore(self, state: dict[str, float | bool | int | None]) -> None:
        until = state["until"]
        self._until = -math.inf if until is None else float(until)
        self._first, self.skipped = bool(state["first"]), int(state["skipped"] or 0)
        self._held.clear()

    def finish(self) -> None:
        """At the end of the video: what is still held was never needed."""
        self.skipped += len(self._held)
        self._held.clear()
