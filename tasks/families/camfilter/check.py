"""A clip counts only once it decodes and shows the source's frames, in place.

:func:`check_clip` decodes every video frame of a clip written; :func:`verify_clip` compares the
frame times it decoded with the times of the source's frames in the span (read from the source's
packets, no decode): the first frame is the requested start (within one frame), every frame is
where the source has it (so no timestamp jumps at a smart cut's join or anywhere else), and none
is missing but, for a copied end, the few B-frames a stream copy cannot end on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mediafarm.tasks.families.camfilter.source import keyframe_before, source_frame_times
from mediafarm.tasks.kit import UnreadableMedia
from mediafarm.tasks.kit.media import open_media, tolerant_frames

if TYPE_CHECKING:
    from mediafarm.tasks.families.camfilter.source import Source


class ClipMismatch(Exception):
    """A clip decodes but does not hold the source's frames where they belong."""


@dataclass(frozen=True)
class ClipCheck:
    """A clip decoded again: ``frames``, and the seconds of its first and last frame."""

    frames: int
    first: float
    last: float


def frame_times(path: Path) -> list[float]:
    """Seconds of every video frame of ``path``, decoded, in the order shown. UnreadableMedia if
    it does not open or holds no decodable video frame."""
    with open_media(path) as container:
        if not container.streams.video:
            raise UnreadableMedia(f"{path.name}: no video stream")
        stream = container.streams.video[0]
        stream.codec_context.thread_type = "AUTO"
        times = [
            float(frame.pts * stream.time_base)
            for frame in tolerant_frames(container, stream, f"{path.name}: video stream")
            if frame.pts is not None
        ]
    if not times:
        raise UnreadableMedia(f"{path.name}: no video frame decodes")
    return times


def check_clip(path: Path) -> tuple[int, float]:
    """Decode every video frame of ``path``: (frames, seconds of the last)."""
    times = frame_times(path)
    return len(times), times[-1]


def verify_clip(path: Path, source: Source, start: float, end: float, method: str) -> ClipCheck:
    """Decode the clip at ``path``, cut from ``source``'s ``[start, end)`` by ``method``, and
    compare its frames with the source's; ClipMismatch naming the first difference. A copy starts
    on its keyframe (within half a frame of ``start``); every other method at ``start`` itself."""
    times = frame_times(path)
    zero = (keyframe_before(start, source.keyframes) or 0.0) if method == "copy" else start
    expected = [t - zero for t in source_frame_times(source, zero, end)]
    half = source.frame / 2
    name = path.name
    if not expected:
        raise ClipMismatch(f"{name}: the source has no frame in {start:.3f}-{end:.3f} s")
    if abs(times[0] - expected[0]) > half:
        raise ClipMismatch(f"{name}: its first frame is at {times[0]:.3f} s, the requested start's at "
                           f"{expected[0]:.3f} s")  # fmt: skip
    for shown, wanted in zip(times, expected, strict=False):
        if abs(shown - wanted) > half:
            raise ClipMismatch(f"{name}: a frame at {shown:.3f} s where the source has one at {wanted:.3f} s "
                               f"(a timestamp jump)")  # fmt: skip
    # A copied end stops before the first packet past it; B-frames decoded after that one go too.
    spare = 1 if method == "reencode" else source.reorder + 1
    if not len(expected) - spare <= len(times) <= len(expected):
        raise ClipMismatch(f"{name}: {len(times)} frames, the source has {len(expected)} in "
                           f"{start:.3f}-{end:.3f} s")  # fmt: skip
    return ClipCheck(len(times), times[0], times[-1])
