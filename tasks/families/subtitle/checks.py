"""Timestamp checks on every subtitle output: order, overlap, bounds, silence, onset offsets.

Viewers notice subtitles more than ~112 ms early or late (the subtitle story); every cue whose
start lies further than that from the nearest speech onset the VAD found is listed with its
offset, and the distribution is reported, so a bad rung or a drifting model shows in the data.
A cue that starts inside a span of speech the cue before it already reaches into (a long sentence
cut into two cues) has no onset of its own: it is counted as ``continuing``, not measured.

Silence is checked twice: per cue (a cue lying wholly in silence) and per word (a word touching
no speech span, widened by the padding the speech is cut out with). A cue holding speech and one
stray word in silence passes the first and fails the second. Words are counted as they arrive
(:class:`SilentWords`), so the check costs no memory on hours of media.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

import numpy as np

from mediafarm.tasks.families.subtitle.cues import cue_rules_violations
from mediafarm.tasks.families.subtitle.records import Cue, CueRules, Word
from mediafarm.tasks.families.subtitle.spec import PERCEPTIBLE_MS, LateCue, TimingReport
from mediafarm.tasks.kit import Span

# Rounding to milliseconds on write must not count as running past the media.
EPSILON = 0.001


def timing_report(
    cues: Sequence[Cue],
    speech: Sequence[Span],
    duration: float,
    rules: CueRules,
    *,
    words_in_silence: int | None = None,
    refined_by: str | None = None,
) -> TimingReport:
    """Check ``cues`` against the speech spans the VAD found in a medium of ``duration`` seconds.

    ``words_in_silence`` is the count a :class:`SilentWords` made of every word the cues were made
    from; it goes into the report as it is (None: the words were not counted). ``refined_by`` says
    how the words' times were refined before the cues were made (None: as the recogniser gave them).
    """
    if not cues:
        return TimingReport(words_in_silence=words_in_silence, refined_by=refined_by)
    onsets = [s.start for s in speech]
    continuing = [_continues_speech(cues, k, speech, onsets) for k in range(len(cues))]
    offsets = [
        None if going_on else _nearest_offset_ms(onsets, cue.start)
        for cue, going_on in zip(cues, continuing, strict=True)
    ]
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
        words_in_silence=words_in_silence,
        rule_violations=cue_rules_violations(list(cues), rules),
        offset_ms_median=_round(np.median(known)) if known else None,
        offset_ms_p95=_round(np.percentile(known, 95)) if known else None,
        offset_ms_max=_round(max(known)) if known else None,
        late=late,
        continuing=sum(continuing),
        refined_by=refined_by,
    )


def _continues_speech(cues: Sequence[Cue], k: int, speech: Sequence[Span], onsets: Sequence[float]) -> bool:
    """Whether cue ``k`` starts inside a span of speech whose onset the cue before it already holds:
    a sentence cut into two cues, or two sentences with no pause the VAD ends a span at. Such a
    cue starts where the words before it end, not at an onset, and is not measured against one."""
    if k == 0:
        return False
    i = bisect.bisect_right(onsets, cues[k].start) - 1
    return i >= 0 and cues[k].start < speech[i].end and cues[k - 1].end > speech[i].start


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


class SilentWords:
    """Counts the words that touch no speech span widened by ``pad`` seconds on each side.

    The subtitle engine cuts each speech span out with ``PAD_SECONDS`` of context and recognises
    nothing else, so every word it maps back must lie in a widened span: the count is 0 by
    construction, and a word counted here was placed in silence by a wrong time mapping. (A word
    that only reaches into silence from a span, such as an end stretched across a cut-out gap,
    touches speech and is not counted.)

    Attributes:
        count: Words counted in silence so far.
    """

    def __init__(self, speech: Sequence[Span], pad: float) -> None:
        self.speech, self.pad = speech, pad
        self._onsets = [s.start for s in speech]
        self.count = 0

    def add(self, words: Iterable[Word]) -> None:
        self.count += sum(1 for word in words if not self._touches_speech(word))

    def _touches_speech(self, word: Word) -> bool:
        # Closed intervals (a zero-length word on a widened span's edge touches it), with EPSILON
        # for word times rounded to milliseconds. Spans are sorted and disjoint: if the last one
        # starting before the word ends does not reach the word, no earlier one does.
        reach = self.pad + EPSILON
        i = bisect.bisect_right(self._onsets, word.end + reach)
        return i > 0 and self.speech[i - 1].end + reach >= word.start


def _round(value: float) -> float:
    return round(float(value), 1)
