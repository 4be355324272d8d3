"""Time spans in seconds, JSON-safe, and the small interval algebra the pipelines need."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Span:
    """A half-open time interval in seconds.

    Attributes:
        start: Seconds from the start of the media.
        end: Seconds from the start of the media, > start.
    """

    start: float
    end: float

    def to_json(self) -> dict[str, float]:
        return {"start": round(self.start, 3), "end": round(self.end, 3)}


def merge_spans(spans: Iterable[Span], *, gap: float = 0.0) -> list[Span]:
    """Sort and merge spans that overlap or lie within ``gap`` seconds of each other."""
    merged: list[Span] = []
    for span in sorted(spans):
        if merged and span.start - merged[-1].end <= gap:
            last = merged[-1]
            merged[-1] = Span(last.start, max(last.end, span.end))
        else:
            merged.append(span)
    return merged
