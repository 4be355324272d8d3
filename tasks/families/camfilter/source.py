"""A recording as the cut sees it, read from its packets alone (no decode): its keyframes, frame
duration, decoder delay and codec parameters (:func:`probe_source`), and the times of its frames
in a span (:func:`source_frame_times`), which a clip is cut to and checked against.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from mediafarm.tasks.families.camfilter import avc
from mediafarm.tasks.kit import UnreadableMedia
from mediafarm.tasks.kit.media import open_media


@dataclass(frozen=True)
class Source:
    """What the cut needs to know of a recording, read once from its packets (no decode).
    ``keyframes``: seconds of the keyframes a decoder can start at (for H.264 in avcC, IDR
    pictures only: an open-GOP I picture's leading frames need the GOP before)."""

    path: Path
    codec: str
    container: str
    keyframes: list[float]
    frame: float  # seconds between frames (the stream's average rate)
    reorder: int = 0  # frames a decoder holds back at most (B-frames): how far pts runs ahead of dts
    delay: int = 0  # the keyframes' pts - dts, in the stream's time base
    avc: avc.AvcConfig | None = field(default=None, repr=False)
    pix_fmt: str = ""


def probe_source(source: Path) -> Source:
    """Read the first video stream's packets (no decode): its keyframes, frame duration, codec."""
    with open_media(source) as container:
        stream = video_stream(container, source)
        ctx = stream.codec_context
        config = None
        if ctx.name == "h264" and ctx.extradata:
            try:
                config = avc.AvcConfig.parse(ctx.extradata)
            except ValueError:
                config = None
        keyframes, reorder, delay = [], 0, None
        for packet in container.demux(stream):
            if packet.pts is None:
                continue
            if packet.dts is not None:
                reorder = max(reorder, packet.pts - packet.dts)
            if packet.is_keyframe and (config is None or avc.is_idr(bytes(packet), config.length_size)):
                keyframes.append(float(packet.pts * stream.time_base))
                if packet.dts is not None:  # Matroska gives none for a block without B-frame order
                    delay = max(delay or 0, packet.pts - packet.dts)
        rate = stream.average_rate or stream.guessed_rate or Fraction(25)
        frame = float(1 / rate)
        return Source(
            path=source, codec=ctx.name, container=container.format.name.split(",")[0],
            keyframes=sorted(keyframes), frame=frame, reorder=round(float(reorder * stream.time_base) / frame),
            delay=delay or 0, avc=config, pix_fmt=ctx.pix_fmt or "",
        )  # fmt: skip


def source_frame_times(source: Source, start: float, end: float) -> list[float]:
    """Seconds of the source's video frames in ``[start, end)``, from its packets alone."""
    with open_media(source.path) as container:
        stream = container.streams.video[0]
        seek(container, stream, keyframe_before(start, source.keyframes) or 0.0)
        times = []
        for packet in container.demux(stream):
            if packet.pts is None:
                continue
            if packet.dts is not None and packet.dts * stream.time_base >= end:
                break  # every later packet shows at or after the end
            seconds = float(packet.pts * stream.time_base)
            if start - 1e-6 <= seconds < end:
                times.append(seconds)
    return sorted(times)


def first_frame_at(source: Source, start: float) -> float:
    """Seconds of the source's first frame at or after ``start`` (from its packets; ``start``
    itself past the last frame)."""
    times = source_frame_times(source, start, start + source.frame * (source.reorder + 2))
    return times[0] if times else start


def keyframe_before(start: float, keyframes: list[float]) -> float | None:
    """The last keyframe at or before ``start`` (a hair of rounding allowed), or None."""
    index = bisect.bisect_right(keyframes, start + 1e-6) - 1
    return keyframes[index] if index >= 0 else None


def keyframe_after(start: float, keyframes: list[float]) -> float | None:
    index = bisect.bisect_right(keyframes, start + 1e-6)
    return keyframes[index] if index < len(keyframes) else None


def video_stream(container: Any, path: Path) -> Any:
    if not container.streams.video:
        raise UnreadableMedia(f"{path.name}: no video stream")
    return container.streams.video[0]


def seek(container: Any, stream: Any, seconds: float) -> None:
    container.seek(max(0, int(seconds / stream.time_base)), stream=stream, backward=True, any_frame=False)
