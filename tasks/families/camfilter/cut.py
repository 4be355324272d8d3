"""Cutting clips out of a recording with PyAV: stream copy where a keyframe allows, re-encode otherwise.

A stream copy is exact and cheap (no decode, no quality loss) but can only start at a keyframe:
the frames after a cut that is not on one cannot be decoded. So a clip is copied from the last
keyframe at or before its start when that keyframe is at most ``max_lead`` seconds earlier (the
clip then starts a little early, inside its padding); otherwise (a camera with a 10 s GOP) the
clip is decoded from that keyframe and re-encoded from its exact start. A copied clip keeps the
source's decoder delay (B-frames): its first frame may be shown a few frames after zero, as with
FFmpeg's own stream copy; players honour it. Either way every packet is
read once, in order, with nothing held but the current packet or frame, and every clip written is
opened and decoded again before it counts (:func:`check_clip`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import av

from mediafarm.tasks.kit import UnreadableMedia
from mediafarm.tasks.kit.media import open_media, tolerant_frames

Method = Literal["copy", "reencode"]
_MS = Fraction(1, 1000)
# Containers a stream copy can write whatever the camera used; anything else goes to Matroska.
COPY_CONTAINERS = {".mp4": "mp4", ".mov": "mov", ".mkv": "matroska", ".webm": "webm"}


@dataclass(frozen=True)
class CutClip:
    """A clip written: where, the span of the source it holds (``start`` may be earlier than asked,
    at a keyframe), and how it was made."""

    path: Path
    start: float
    end: float
    method: Method


def keyframe_times(source: Path) -> list[float]:
    """Seconds of every keyframe of the first video stream, from the packets alone (no decode)."""
    with open_media(source) as container:
        stream = _video_stream(container, source)
        times = [
            float(packet.pts * stream.time_base)
            for packet in container.demux(stream)
            if packet.pts is not None and packet.is_keyframe
        ]
    return sorted(times)


def choose_cut(start: float, keyframes: list[float], max_lead: float) -> tuple[Method, float]:
    """How a clip starting at ``start`` is cut, and from where: a copy from the last keyframe at
    or before it when that is at most ``max_lead`` seconds earlier, else a re-encode from ``start``."""
    keyframe = _keyframe_before(start, keyframes)
    if keyframe is not None and start - keyframe <= max_lead:
        return "copy", keyframe
    return "reencode", start


def _keyframe_before(start: float, keyframes: list[float]) -> float | None:
    """The last keyframe at or before ``start`` (a hair of rounding allowed), or None."""
    index = bisect.bisect_right(keyframes, start + 1e-6) - 1
    return keyframes[index] if index >= 0 else None


def clip_suffix(method: Method, source: Path) -> str:
    """The file suffix of a clip: the source's container for a copy (or .mkv), .mp4 for a re-encode."""
    if method == "copy":
        return source.suffix.lower() if source.suffix.lower() in COPY_CONTAINERS else ".mkv"
    return ".mp4"


def cut_clip(source: Path, start: float, end: float, target: Path, keyframes: list[float],
             max_lead: float = 1.5) -> CutClip:  # fmt: skip
    """Write ``source``'s ``[start, end)`` to ``target``, whose suffix should be
    :func:`clip_suffix`'s for :func:`choose_cut`'s method (a copy writes the container the suffix
    names, or Matroska; a re-encode writes MP4, H.264 + AAC, whatever the suffix)."""
    if end <= start:
        raise ValueError(f"empty clip {start}-{end}")
    method, begin = choose_cut(start, keyframes, max_lead)
    if method == "copy":
        _copy(source, begin, end, target)
    else:
        _reencode(source, start, end, target, seek_to=_keyframe_before(start, keyframes) or 0.0)
    return CutClip(target, begin, end, method)


def check_clip(path: Path) -> tuple[int, float]:
    """Open ``path`` and decode every video frame: (frames, seconds of video). UnreadableMedia
    if it does not open or holds no decodable video frame."""
    with open_media(path) as container:
        stream = _video_stream(container, path)
        frames, last = 0, 0.0
        for frame in tolerant_frames(container, stream, f"{path.name}: video stream"):
            frames += 1
            if frame.pts is not None:
                last = float(frame.pts * stream.time_base)
    if not frames:
        raise UnreadableMedia(f"{path.name}: no video frame decodes")
    return frames, last


def _video_stream(container: Any, path: Path) -> Any:
    if not container.streams.video:
        raise UnreadableMedia(f"{path.name}: no video stream")
    return container.streams.video[0]


def _seek(container: Any, stream: Any, seconds: float) -> None:
    container.seek(int(seconds / stream.time_base), stream=stream, backward=True, any_frame=False)


def _copy(source: Path, keyframe: float, end: float, target: Path) -> None:
    """Packets of the video stream and the first audio stream from ``keyframe`` to ``end``,
    their times moved so the clip starts at zero."""
    with open_media(source) as inp:
        video = _video_stream(inp, source)
        streams = [video] + list(inp.streams.audio[:1])
        fmt = COPY_CONTAINERS.get(target.suffix.lower(), "matroska")
        with av.open(str(target), mode="w", format=fmt) as out:
            mapped = {s.index: out.add_stream_from_template(s) for s in streams}
            _seek(inp, video, keyframe)
            # The clip's zero: the keyframe's decode time (with B-frames its dts is a little before
            # its pts), so every copied packet keeps dts >= 0 and pts >= dts.
            zero: float | None = None
            for packet in inp.demux(streams):
                if packet.pts is None or packet.dts is None:
                    continue  # a demuxer's flush packet
                seconds = float(packet.pts * packet.time_base)
                if packet.stream.index == video.index:
                    if zero is None:
                        if not (packet.is_keyframe and seconds >= keyframe - 1e-3):
                            continue  # before the keyframe the seek landed near
                        zero = float(packet.dts * packet.time_base)
                    elif seconds >= end:
                        break
                elif zero is None or seconds >= end:
                    continue
                offset = int(round(zero / packet.time_base))
                if packet.dts - offset < 0:
                    continue  # audio from before the clip's first frame
                packet.pts -= offset
                packet.dts -= offset
                packet.stream = mapped[packet.stream.index]
                out.mux(packet)


def _reencode(source: Path, start: float, end: float, target: Path, *, seek_to: float) -> None:
    """Decode from the keyframe at ``seek_to``, encode the frames in ``[start, end)`` (H.264, AAC)."""
    with open_media(source) as inp:
        video = _video_stream(inp, source)
        audio = inp.streams.audio[0] if inp.streams.audio else None
        with av.open(str(target), mode="w", format="mp4") as out:
            rate = video.average_rate or Fraction(25)
            v_out = out.add_stream("libx264", rate=rate)
            v_out.width, v_out.height, v_out.pix_fmt = video.codec_context.width, video.codec_context.height, "yuv420p"
            v_out.options = {"preset": "veryfast", "crf": "20"}
            a_out = out.add_stream("aac", rate=audio.codec_context.sample_rate) if audio is not None else None
            _seek(inp, video, seek_to)
            streams = [video] + ([audio] if audio is not None else [])
            for packet in inp.demux(streams):
                for frame in _decode(packet):
                    if frame.pts is None:
                        continue
                    seconds = float(frame.pts * frame.time_base)
                    if not start <= seconds < end:
                        continue
                    if packet.stream.index == video.index:
                        frame = frame.reformat(format="yuv420p")
                        # Milliseconds from the clip's start; the encoder rescales to its own base.
                        frame.pts, frame.time_base = int(round((seconds - start) * 1000)), _MS
                        out.mux(v_out.encode(frame))
                    elif a_out is not None:
                        frame.pts = None  # the encoder numbers audio samples itself
                        out.mux(a_out.encode(frame))
            out.mux(v_out.encode(None))
            if a_out is not None:
                out.mux(a_out.encode(None))


def _decode(packet: Any) -> list[Any]:
    try:
        return packet.decode()
    except av.error.InvalidDataError:
        return []  # a corrupt packet in camera footage: skip it, as the decoders elsewhere do
