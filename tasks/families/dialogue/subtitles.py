"""The dialogue's cues as WebVTT (``<v Speaker>`` voice spans, webvtt-py) and SRT (srt, the
speaker as a ``Speaker: `` prefix, since SubRip has no voices).

A cue is one sentence of one line, timed by the synthesis itself: the sentence's start and end in
its line's audio, plus where the line was placed in the track. Both files get the same
milliseconds. Cue text is escaped for WebVTT (``&``, ``<``, ``>``); speaker names cannot hold
those (``tts.speakers.NAME_PATTERN``).
"""

from __future__ import annotations

import datetime
import html
from collections.abc import Sequence
from dataclasses import dataclass

import srt
import webvtt


@dataclass(frozen=True)
class Cue:
    """Attributes: start, end (seconds in the track), speaker, text, line (its number, from 1)."""

    start: float
    end: float
    speaker: str
    text: str
    line: int


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def _vtt_time(seconds: float) -> str:
    ms = _ms(seconds)
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"


def to_webvtt(cues: Sequence[Cue]) -> str:
    """A WebVTT file: one cue per sentence, ``<v Speaker>text``."""
    captions = [
        webvtt.Caption(_vtt_time(c.start), _vtt_time(c.end), f"<v {c.speaker}>{html.escape(c.text, quote=False)}")
        for c in cues
    ]
    return webvtt.WebVTT(captions=captions).content


def to_srt(cues: Sequence[Cue]) -> str:
    """A SubRip file, numbered from 1: ``Speaker: text``."""
    subtitles = [
        srt.Subtitle(index=0, start=datetime.timedelta(milliseconds=_ms(c.start)),
                     end=datetime.timedelta(milliseconds=_ms(c.end)), content=f"{c.speaker}: {c.text}")
        for c in cues
    ]  # fmt: skip
    return srt.compose(subtitles, reindex=True, start_index=1)
