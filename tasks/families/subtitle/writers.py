"""Cues to WebVTT and SRT text, whole or as HLS segments, through webvtt-py and srt.

The libraries write the files; this module only maps a ``Cue`` onto their objects. Both formats
get the same milliseconds (webvtt-py's rounding, half up), so the two files of one job agree.

``ChunkedWebVTT`` cuts a job's cues into fixed windows while recognition runs, so a player can
fetch the subtitles of the first minutes of a long media before the job ends (HLS: a subtitle
media playlist of WebVTT segments). It holds only the cues that can still reach a window not yet
written, so its memory does not grow with the media's length.
"""

from __future__ import annotations

import datetime
import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

import srt
import webvtt
from webvtt.models import Timestamp

from mediafarm.tasks.families.subtitle.records import Cue

# HLS puts a WebVTT segment's cue times on the video's MPEG-TS clock with this header. Cue times
# stay media times (LOCAL 0), and 900000 (10 s at 90 kHz) is the offset MPEG-TS streams
# conventionally start at, and what webvtt-py's own segmenter writes.
X_TIMESTAMP_MAP = "X-TIMESTAMP-MAP=MPEGTS:900000,LOCAL:00:00:00.000"


def to_webvtt(cues: Sequence[Cue]) -> str:
    """A WebVTT file of ``cues``; cues with no text are left out.

    Raises:
        ValueError: A cue time is negative or not finite.
    """
    return _webvtt_text(cues, metadata=[])


def to_srt(cues: Sequence[Cue]) -> str:
    """A SubRip file of ``cues``, numbered from 1; cues with no text are left out.

    Raises:
        ValueError: A cue time is negative or not finite.
    """
    subtitles = [
        srt.Subtitle(
            index=0,  # compose numbers them
            start=datetime.timedelta(milliseconds=_milliseconds(cue.start)),
            end=datetime.timedelta(milliseconds=_milliseconds(cue.end)),
            content="\n".join(lines),
        )
        for cue in cues
        if (lines := _shown_lines(cue))
    ]
    return srt.compose(subtitles, reindex=True, start_index=1)


class ChunkedWebVTT:
    """WebVTT segments of ``window_seconds`` each, written as soon as their window is final.

    Window ``k`` covers ``[k * w, (k + 1) * w)`` and is written as ``segment_{k:05d}.vtt``. A cue
    that spans a window boundary is written into every window it overlaps (HLS practice: a player
    may join at any segment); ``concat_segment_cues`` removes the repeats.

    Attributes:
        window_seconds: The length of a window, the playlist's segment duration.
        timestamp_map: The ``X-TIMESTAMP-MAP`` header of the segments written next: a live stream
            maps cue times onto its own PTS, and changes it after a timestamp jump.
    """

    def __init__(self, window_seconds: float = 10.0, timestamp_map: str = X_TIMESTAMP_MAP) -> None:
        if not (math.isfinite(window_seconds) and window_seconds > 0):
            raise ValueError(f"window_seconds must be a positive number, got {window_seconds}")
        self.window_seconds = window_seconds
        self.timestamp_map = timestamp_map
        self._pending: list[Cue] = []  # only cues that overlap a window not yet written
        self._written = 0  # windows written so far; the next one to write is this index
        self._last_extinf: float | None = None  # the final window's duration, once closed
        self._last_start = 0.0

    @property
    def held_cues(self) -> int:
        """How many cues wait for a window not yet written (bounded by the cues a window holds)."""
        return len(self._pending)

    @property
    def segment_count(self) -> int:
        """How many segments have been written."""
        return self._written

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps to go on writing as if never stopped (open only: not closed)."""
        if self._last_extinf is not None:
            raise ValueError("ChunkedWebVTT is closed")
        return {"written": self._written, "last_start": self._last_start,
                "pending": [cue.model_dump(mode="json") for cue in self._pending]}  # fmt: skip

    def restore(self, state: Mapping[str, Any]) -> None:
        """Go on from a :meth:`state` (its segments are already written)."""
        self._written = int(state["written"])
        self._last_start = float(state["last_start"])
        self._pending = [Cue.model_validate(cue) for cue in state["pending"]]

    def add(self, cues: Sequence[Cue], final_until: float) -> list[tuple[str, str]]:
        """Take the next cues, all final up to ``final_until``; return the windows now complete.

        The caller promises that every cue starting before ``final_until`` has been passed (in
        this call or an earlier one), so a window that ends by then can be written.

        Raises:
            ValueError: After ``close``; a cue out of order, or starting in a window already written.
        """
        if self._last_extinf is not None:
            raise ValueError("ChunkedWebVTT is closed")
        written_until = self._written * self.window_seconds
        for cue in cues:
            if cue.start < self._last_start:
                raise ValueError(f"cue at {cue.start:.3f} s comes after one at {self._last_start:.3f} s")
            if cue.start < written_until:
                raise ValueError(f"cue at {cue.start:.3f} s starts in a window already written (to {written_until} s)")
            self._last_start = cue.start
            self._pending.append(cue)
        out: list[tuple[str, str]] = []
        while (self._written + 1) * self.window_seconds <= final_until:
            out.append(self._write_window())
        return out

    def close(self, duration: float) -> list[tuple[str, str]]:
        """Write every window left, up to the media's ``duration`` (at least one window in all).

        A cue that starts after ``duration`` (a last cue stretched to its least length past the
        end) still gets its window rather than being dropped.

        Raises:
            ValueError: Already closed, or ``duration`` negative or not finite.
        """
        if self._last_extinf is not None:
            raise ValueError("ChunkedWebVTT is closed")
        if not (math.isfinite(duration) and duration >= 0):
            raise ValueError(f"duration must be a number >= 0, got {duration}")
        w = self.window_seconds
        # A hair under a whole window is float noise, not one more window (30.0000000001 s at 10 s).
        windows = max(1, math.ceil(duration / w - 1e-9))
        if self._pending:
            windows = max(windows, math.floor(self._pending[-1].start / w) + 1)
        out: list[tuple[str, str]] = []
        while self._written < windows:
            out.append(self._write_window())
        left = duration - (self._written - 1) * w
        # The last window lasts what is left of the media; an empty media or a window opened only
        # for a stray cue gets a whole window, as an #EXTINF of zero confuses players.
        self._last_extinf = min(left, w) if left > 0 else w
        return out

    def playlist(self, ended: bool) -> str:
        """The HLS subtitle media playlist of the segments written so far.

        An ``EVENT`` playlist: players poll it while the job runs and only see segments appended.
        ``ended`` adds ``#EXT-X-ENDLIST``. The type stays ``EVENT`` then: RFC 8216 (6.2.1) lets a
        server change a playlist it has published only by appending lines or adding that tag.
        """
        w = self.window_seconds
        lines = [
            "#EXTM3U",
            f"#EXT-X-TARGETDURATION:{math.ceil(w)}",  # an integer >= every #EXTINF
            "#EXT-X-VERSION:3",  # 3: #EXTINF may have a fraction
            "#EXT-X-MEDIA-SEQUENCE:0",
            "#EXT-X-PLAYLIST-TYPE:EVENT",
        ]
        for k in range(self._written):
            last = k == self._written - 1 and self._last_extinf is not None
            lines += [f"#EXTINF:{self._last_extinf if last else w:.3f},", segment_name(k)]
        if ended:
            lines.append("#EXT-X-ENDLIST")
        return "\n".join(lines) + "\n"

    def _write_window(self) -> tuple[str, str]:
        k = self._written
        low, high = k * self.window_seconds, (k + 1) * self.window_seconds
        inside = [cue for cue in self._pending if _overlaps(cue, low, high)]
        # Cues are in order of start, so those that end by this window's end go, and the rest reach on.
        self._pending = [cue for cue in self._pending if cue.end > high or cue.start >= high]
        self._written += 1
        return segment_name(k), _webvtt_text(inside, metadata=[self.timestamp_map])


def segment_name(index: int) -> str:
    """The file name of window ``index``."""
    return f"segment_{index:05d}.vtt"


def concat_segment_cues(texts: Sequence[str]) -> list[tuple[float, float, str]]:
    """(start, end, text) of the cues of consecutive WebVTT segments, each repeated cue once.

    A cue repeated across windows is the same (start, end, text) in consecutive segments, so only
    the previous segment's cues need remembering. Text is the plain text, entities decoded.
    """
    out: list[tuple[float, float, str]] = []
    previous: set[tuple[int, int, str]] = set()
    for text in texts:
        current: set[tuple[int, int, str]] = set()
        for caption in webvtt.from_string(text).captions:
            key = (caption.start_time.in_milliseconds(), caption.end_time.in_milliseconds(), caption.text)
            current.add(key)
            if key not in previous:
                out.append((key[0] / 1000, key[1] / 1000, html.unescape(key[2])))
        previous = current
    return out


def _webvtt_text(cues: Sequence[Cue], metadata: list[str]) -> str:
    captions = [
        webvtt.Caption(
            start=str(Timestamp.from_seconds(_milliseconds(cue.start) / 1000)),
            end=str(Timestamp.from_seconds(_milliseconds(cue.end) / 1000)),
            text=[_escape(line) for line in lines],
        )
        for cue in cues
        if (lines := _shown_lines(cue))
    ]
    return webvtt.WebVTT(captions=captions, metadata=metadata).content


def _milliseconds(seconds: float) -> int:
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"a cue time must be a number >= 0, got {seconds}")
    return Timestamp.from_seconds(seconds).in_milliseconds()


def _shown_lines(cue: Cue) -> list[str]:
    # An empty line would end the cue block early in both formats; webvtt-py refuses to write it.
    return [line for line in cue.lines if line.strip()]


def _escape(line: str) -> str:
    # WebVTT cue text is markup: a recognised "<unk>" or "AT&T" must be escaped or a player drops
    # or mangles it, and "-->" would read as a timing line. webvtt-py writes text as given.
    return line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _overlaps(cue: Cue, low: float, high: float) -> bool:
    # A zero-length cue at a window's start belongs to that window rather than to none.
    return cue.start < high and (cue.end > low or cue.start >= low)
