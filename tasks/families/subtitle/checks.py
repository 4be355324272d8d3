"""Timestamp checks on every subtitle output: order, overlap, bounds, silence, onset offsets.

Viewers notice subtitles more than ~112 ms early or late (the subtitle story); every cue whose
start lies further than that from the nearest speech onset the VAD found is listed with its
offset, and the distribution is reported, so a bad rung or a drifting model shows in the data.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from mediafarm.tasks.families.subtitle.cues import cue_rules_violations
from mediafarm.tasks.families.subtitle.records import Cue, CueRules
from mediafarm.tasks.families.subtitle.spec import PERCEPTIBLE_MS, LateCue, TimingReport
from mediafarm.tasks.media.intervals import Span

# Rounding to milliseconds on write must not count as running past the media.
EPSILON = 0.001


def timing_report(cues: Sequence[Cue], speech: Sequence[Span], duration: float, rules: CueRules) -> TimingReport:
    """Check ``cues`` against the speech spans the VAD found in a medium of ``duration`` seconds."""
    if not cues:
        return TimingReport()
    onsets = [s.start for s in speech]
    offsets = [_nearest_offset_ms(onsets, cue.start) for cue in cues]
    known = [o for o in offsets if o is not None]
    late = [
        LateCue(index=i, start=round(cue.start, 3), offset_ms=round(offset, 1))
        for i, (cue, offset) in enumerate(zip(cues, offsets, strict=True))
        if offset is not None and offset > PERCEPTIBLE_MS
    ]
    return TimingReport(
        cues=len(cues),
        monotonic=all(b.start >= a.start for a, b in zip(cues, cues[1:], strict=False)),
        overlaps=sum(1 for a, b in zip(cues, cues[1:], strict=False) if a.end > b.start + EPSILON),
        outside_media=sum(1 for c in cues if c.start < -EPSILON or c.end > duration + EPSILON),
        in_silence=sum(1 for c in cues if not _touches_speech(c, speech, onsets)),
        rule_violations=cue_rules_violations(list(cues), rules),
        offset_ms_median=_round(np.median(known)) if known else None,
        offset_ms_p95=_round(np.percentile(known, 95)) if known else None,
        offset_ms_max=_round(max(known)) if known else None,
        late=late,
    )


def _nearest_offset_ms(onsets: Sequence[float], start: float) -> float | None:
    if not onsets:
        return None
    i = bisect.bisect_left(onsets, start)
    near = [abs(start - onsets[j]) for j in (i - 1, i) if 0 <= j < len(onsets)]
    return min(near) * 1000.0


def _touches_speech(cue: Cue, speech: Sequence[Span], onsets: Sequence[float]) -> bool:
    # Spans are sorted and disjoint: if the last span starting before the cue ends does not
    # reach into the cue, no earlier span does.
    i = bisect.bisect_left(onsets, cue.end)
    return i > 0 and speech[i - 1].end > cue.start


def _round(value: float) -> float:
    return round(float(value), 1)
