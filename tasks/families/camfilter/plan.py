"""Which spans of a camera recording to keep: speech spans and person spans, padded and merged.

A clip is kept for a reason: someone was heard (``speech``), seen (``person``), or both. Spans
are padded (a person walks in before the detector is sure), merged when the gap between them is
short (one visit, not five clips), and a clip shorter than the minimum is widened around its
middle rather than dropped: the filter exists to keep what was seen or heard, and a 0.3 s
detection is still someone at the door.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from mediafarm.tasks.kit import Span


class ClipRules(BaseModel):
    """Attributes: pad_before, pad_after (seconds added around every span), min_gap (spans closer
    than this become one clip), min_clip (a shorter clip is widened to this, inside the video)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pad_before: float = Field(2.0, ge=0, le=600)
    pad_after: float = Field(2.0, ge=0, le=600)
    min_gap: float = Field(5.0, ge=0, le=3600)
    min_clip: float = Field(3.0, ge=0, le=3600)


@dataclass(frozen=True)
class Clip:
    """A span to keep and why. ``reasons``: a sorted tuple of ``speech`` / ``person`` (or any other
    name the spans came under)."""

    start: float
    end: float
    reasons: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"start": round(self.start, 3), "end": round(self.end, 3), "reasons": list(self.reasons)}


def plan_clips(spans: Mapping[str, Iterable[Span]], duration: float, rules: ClipRules) -> list[Clip]:
    """The clips to cut from a video of ``duration`` seconds, given spans by reason
    (``{"speech": [...], "person": [...]}``), sorted, non-overlapping, inside ``[0, duration]``."""
    if duration <= 0:
        return []
    padded = sorted(
        (max(0.0, s.start - rules.pad_before), min(duration, s.end + rules.pad_after), reason)
        for reason, reason_spans in spans.items()
        for s in reason_spans
        if s.end > s.start and s.start < duration
    )
    clips: list[tuple[float, float, set[str]]] = []
    for start, end, reason in padded:
        if clips and start - clips[-1][1] < rules.min_gap:
            last = clips[-1]
            clips[-1] = (last[0], max(last[1], end), last[2] | {reason})
        else:
            clips.append((start, end, {reason}))
    widened = [_widen(start, end, duration, rules.min_clip) + (reasons,) for start, end, reasons in clips]
    # Widening can make neighbours touch: merge once more, so clips never overlap.
    result: list[Clip] = []
    for start, end, reasons in widened:
        if result and start <= result[-1].end:
            last = result.pop()
            result.append(Clip(last.start, max(last.end, end), tuple(sorted(set(last.reasons) | reasons))))
        else:
            result.append(Clip(start, end, tuple(sorted(reasons))))
    return result


def _widen(start: float, end: float, duration: float, minimum: float) -> tuple[float, float]:
    if end - start >= minimum:
        return start, end
    if duration <= minimum:
        return 0.0, duration
    middle = (start + end) / 2
    start = min(max(0.0, middle - minimum / 2), duration - minimum)
    return start, start + minimum
