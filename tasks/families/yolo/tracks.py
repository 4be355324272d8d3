"""Per-frame hits → per-class intervals with a peak confidence and the box at the peak.

A frame at time ``t`` stands for ``[t, t + stride)``. Hits of one class whose frames lie within
``join_s`` of each other are one interval; only the open interval of each class and the closed
ones (a few per minute of activity) are held.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from mediafarm.tasks.families.yolo.spec import Detection

Box = tuple[float, float, float, float]


@dataclass
class _Open:
    start: float
    end: float
    peak: float
    box: Box
    frames: int


class IntervalBuilder:
    """Collect hits, in time order, into :class:`Detection` intervals per class.

    Args:
        classes: Names that get a key in the result even when never seen.
        stride: Seconds a frame stands for.
        join_s: Largest gap between two hits of one interval.
    """

    def __init__(self, classes: Iterable[str], *, stride: float, join_s: float) -> None:
        self.stride, self.join_s = stride, join_s
        self._closed: dict[str, list[Detection]] = {name: [] for name in classes}
        self._open: dict[str, _Open] = {}

    def add(self, name: str, t: float, confidence: float, box: Box) -> None:
        """One hit of ``name`` in the frame at ``t`` (the frame's best box of that class)."""
        current = self._open.get(name)
        if current is not None and t - current.end <= self.join_s + 1e-9:
            current.end = max(current.end, t + self.stride)
            current.frames += 1
            if confidence > current.peak:
                current.peak, current.box = confidence, box
            return
        if current is not None:
            self._close(name, current)
        self._open[name] = _Open(t, t + self.stride, confidence, box, 1)

    def finish(self, duration: float) -> dict[str, list[Detection]]:
        """Close every interval (none ends after ``duration`` when it is known) and return them all."""
        for name, current in self._open.items():
            if duration > 0:
                current.end = max(current.start, min(current.end, duration))
            self._close(name, current)
        self._open.clear()
        return {name: sorted(found, key=lambda d: d.start) for name, found in self._closed.items()}

    def state(self) -> dict[str, Any]:
        """Every interval so far, closed and open, as JSON, for a checkpoint."""
        return {
            "closed": {name: [d.model_dump(mode="json") for d in found] for name, found in self._closed.items()},
            "open": {name: asdict(current) for name, current in self._open.items()},
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Go on from :meth:`state`: later hits join the open intervals as they would have. The
        classes this builder was made with keep their keys; the checkpoint's come first (a part
        made by the ``motion`` rung brings its class along)."""
        closed = {name: [Detection.model_validate(d) for d in found] for name, found in state["closed"].items()}
        self._closed = {**closed, **{name: found for name, found in self._closed.items() if name not in closed}}
        self._open = {name: _Open(**{**current, "box": tuple(current["box"])}) for name, current in state["open"].items()}

    def _close(self, name: str, current: _Open) -> None:
        box = tuple(round(v, 1) for v in current.box)
        self._closed.setdefault(name, []).append(
            Detection(start=round(current.start, 3), end=round(current.end, 3), peak_confidence=round(current.peak, 4),
                      box=box, frames=current.frames)  # fmt: skip
        )
