"""Streaming video decode at a stride: PyAV frames → small grey frames (for the motion gate) and
BGR frames at the model's width, made only at the stride.

Inter-coded video cannot skip decoding a frame (the next ones are built from it), so every frame
is decoded, but only one per stride is converted and scaled, straight from the decoder's YUV to
the small sizes, and nothing else is kept: memory is the same for a minute of 4K or a day of it.
The exception is a video whose keyframes come at most a stride apart (cameras use a GOP of one or
two seconds): a keyframe needs no other frame, so only the keyframes are decoded and they are the
samples. The GOP is read from the first packets (no decode); a stream whose keyframes later come
farther apart is then sampled at its keyframes, sparser than the stride.
An image is a one-frame video to FFmpeg (its image2 demuxer), so the same path reads both.
A file cut short that still opens is rejected at the end of the same pass (``tolerant_frames``'
length check): its detections would otherwise read as the whole recording's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import av
import numpy as np

from mediafarm.tasks.families.yolo.motion import Region
from mediafarm.tasks.kit import UnreadableMedia
from mediafarm.tasks.kit.media import checked_video_stream, declared_length, open_media, tolerant_frames

# A frame is "at the stride" if it is this close before its slot (timestamps are rounded).
SLOT_TOLERANCE = 1e-3
# Seconds of packets read (not decoded) to learn the keyframe interval, and keyframes needed.
GOP_PROBE_SECONDS, GOP_PROBE_KEYFRAMES = 20.0, 3


@dataclass(frozen=True)
class Sample:
    """One frame at the stride, already downscaled.

    Attributes:
        t: Seconds from the first frame.
        grey: ``(h, w)`` uint8 at the motion width.
        image: ``(h, w, 3)`` uint8 BGR at the model frame width (ultralytics reads arrays as BGR);
            None when no model will look at it (the ``motion`` rung).
        frame: Frames decoded up to this one, itself included (``decoded`` as it was then).
        run_in: Decoded before a resume point only to rebuild the motion gate's background
            (:meth:`VideoSamples.resume`); counted nowhere, examined never.
    """

    t: float
    grey: np.ndarray
    image: np.ndarray | None
    frame: int = 0
    run_in: bool = False


def scaled_size(width: int, height: int, target_width: int) -> tuple[int, int]:
    """``target_width`` (never upscaled) and the height that keeps the aspect, both even."""
    w = min(target_width, width)
    h = max(2, round(height * w / width / 2) * 2)
    return max(2, w - w % 2), h


class VideoSamples:
    """Open a video (or image) and iterate its frames at a stride.

    Usage::

        with VideoSamples(path, stride=0.5, grey_width=160, image_width=640) as video:
            for sample in video:
                ...  # video.position / video.duration for progress

    Attributes (after opening):
        width, height: Source frame size.
        duration: Seconds the container declares for the video stream (or for the whole file),
            or None (an image, some streams).
        decoded: Frames decoded so far; sampled: frames yielded so far.
        position: Seconds of the last decoded frame.
        origin: Time of the first frame in the file (``t`` counts from it).
        next_slot: Seconds from which the next sample is taken (the first frame at or after it).

    Raises:
        UnreadableMedia: not a file FFmpeg reads, no video stream, too many undecodable packets
            in a row, no frame decodes at all, or (after the last frame) the stream ends well short
            of the length its container declares: a file cut short (``truncated: ...``).
    """

    def __init__(self, path: Path, *, stride: float, grey_width: int, image_width: int | None) -> None:
        if stride <= 0:
            raise ValueError("stride must be positive")
        self.path, self.stride = path, stride
        self.grey_width, self.image_width = grey_width, image_width
        self.decoded = self.sampled = 0
        self.position = 0.0
        self.keyframes_only = False
        self.origin: float | None = None
        self.next_slot = 0.0
        self._resume_at = self._counted_after = -1.0

    def __enter__(self) -> VideoSamples:
        self._container = open_media(self.path)
        try:
            stream = checked_video_stream(self._container, self.path)
        except UnreadableMedia:
            self._container.close()
            raise
        # Frame-threaded decode: FFmpeg spreads frames over cores; the GIL is released meanwhile.
        stream.thread_type = "AUTO"
        self._stream = stream
        self.width, self.height = stream.codec_context.width, stream.codec_context.height
        self.duration = self._declared_duration()
        gop = keyframe_interval(self.path)
        if gop is not None and gop <= self.stride + SLOT_TOLERANCE:
            stream.codec_context.skip_frame = "NONKEY"
            self.keyframes_only = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._container.close()

    def _declared_duration(self) -> float | None:
        stream = self._stream
        # The video stream's own length first: a Matroska file's container length is its longest
        # track's, an audio track that runs on after the picture included.
        declared = declared_length(self._container, stream)
        if declared is not None:
            return declared
        if stream.duration is not None and stream.time_base is not None:
            return float(stream.duration * stream.time_base)
        if self._container.duration is not None:
            return self._container.duration / av.time_base
        return None

    def resume(
        self, at: float, *, origin: float, decoded: int, counted_after: float, sampled: int, run_in_from: float | None
    ) -> None:
        """Go on with a pass that stopped (a checkpoint): the first sample is the first frame at or
        after ``at`` seconds, as in an uninterrupted pass, which then goes on at the stride as
        before. ``origin``: the first frame's time in the file, as that pass had it (:attr:`origin`).
        ``decoded``, ``sampled``: its counts up to there; frames after ``counted_after`` seconds
        are counted on. With ``run_in_from``, frames from there to ``at`` are sampled too, flagged
        ``run_in``, for the motion gate's background. Decoding starts at the keyframe before the
        first frame wanted (a seek); a file that cannot seek is decoded from its start."""
        self.origin, self.decoded, self.sampled = origin, decoded, sampled
        self.position = max(0.0, counted_after)  # where the counted frames stopped, should none follow
        self._resume_at, self._counted_after = at, counted_after
        first = max(0.0, at if run_in_from is None else min(run_in_from, at))
        self.next_slot = first
        stream = self._stream
        # From the first frame still to count, if that comes earlier (a sample held at the checkpoint).
        target = min(first, max(0.0, counted_after))
        if stream.time_base is None or target <= 0:
            return
        try:  # backward: the keyframe at or before it, which every later frame can be decoded from
            self._container.seek(int((origin + target) / stream.time_base), stream=stream, backward=True)
        except av.FFmpegError:
            self._container.seek(0)

    def __iter__(self) -> Iterator[Sample]:
        grey_size = scaled_size(self.width, self.height, self.grey_width)
        image_size = scaled_size(self.width, self.height, self.image_width) if self.image_width else None
        rate = float(self._stream.average_rate or 25)
        resume_at = self._resume_at
        for frame in self._frames():
            t = frame.time if frame.time is not None else self.decoded / rate
            self.origin = t if self.origin is None else self.origin
            t -= self.origin
            if t > self._counted_after + 1e-6:
                self.decoded += 1
                self.position = t
            if t + SLOT_TOLERANCE < self.next_slot:
                continue  # decoded (it had to be) but never converted: the cheap skip
            self.next_slot = (int((t + SLOT_TOLERANCE) / self.stride) + 1) * self.stride
            run_in = t + SLOT_TOLERANCE < resume_at
            if run_in:  # the run-in before a resume point: its grid stops at the point itself
                self.next_slot = min(self.next_slot, resume_at)
            else:
                self.sampled += 1
            image = _convert(frame, image_size, "bgr24") if image_size and not run_in else None
            yield Sample(t, _convert(frame, grey_size, "gray"), image, self.decoded, run_in)
        if self.decoded == 0:
            raise UnreadableMedia(f"{self.path.name}: no video frame could be decoded")

    def _frames(self) -> Iterator[av.VideoFrame]:
        # Camera footage has the odd corrupt packet; a run of them is a file we cannot read. A file
        # cut short must not pass for a shorter video (its detections would read as the whole
        # recording's): its packets are checked against the length its container declares, in this
        # same pass. From the packets, not the frames: with keyframes only decoded the last frame
        # seen may be a GOP before the end of a healthy file, but every packet is still demuxed.
        return tolerant_frames(self._container, self._stream, f"{self.path.name}: video stream", check_length=True)


def keyframe_interval(path: Path) -> float | None:
    """The longest gap between keyframes in the first ``GOP_PROBE_SECONDS`` of the first video
    stream, from its packets alone; None if fewer than ``GOP_PROBE_KEYFRAMES`` keyframes are there
    (an image, a long GOP) or the packets carry no times."""
    times: list[float] = []
    with open_media(path) as container:
        stream = container.streams.video[0]
        for packet in container.demux(stream):
            if packet.pts is None or packet.time_base is None:
                continue
            t = float(packet.pts * packet.time_base)
            if packet.is_keyframe:
                times.append(t)
            if times and t - times[0] > GOP_PROBE_SECONDS:
                break
    if len(times) < GOP_PROBE_KEYFRAMES:
        return None
    times.sort()
    return max(b - a for a, b in zip(times, times[1:]))


def _convert(frame: av.VideoFrame, size: tuple[int, int], pixel_format: str) -> np.ndarray:
    # swscale scales and converts in one pass from the decoder's YUV; AREA averages the pixels a
    # downscale drops, which also takes out the sensor noise the motion gate would see.
    width, height = size
    return frame.reformat(width=width, height=height, format=pixel_format, interpolation="AREA").to_ndarray()


def crop_around(image: np.ndarray, region: Region, *, min_side: int, pad: float = 0.25) -> tuple[np.ndarray, int, int]:
    """The part of ``image`` around a motion ``region``, and its offset ``(x, y)`` in ``image``.

    The region is padded by ``pad`` of its size on each side (a person's moving arm is not the
    whole person) and grown to at least ``min_side`` pixels a side (the model's input: a smaller
    crop would only be upscaled), then clipped to the image.
    """
    h, w = image.shape[:2]
    cx, cy = (region.x1 + region.x2) / 2 * w, (region.y1 + region.y2) / 2 * h
    half_w = max((region.x2 - region.x1) * w * (1 + 2 * pad), min_side) / 2
    half_h = max((region.y2 - region.y1) * h * (1 + 2 * pad), min_side) / 2
    x1, x2 = _clip_span(cx - half_w, cx + half_w, w)
    y1, y2 = _clip_span(cy - half_h, cy + half_h, h)
    return image[y1:y2, x1:x2], x1, y1


def _clip_span(low: float, high: float, limit: int) -> tuple[int, int]:
    # Shift a window that runs off one edge back inside before cutting it, so it keeps its size.
    size = min(high - low, limit)
    low = min(max(0.0, low), limit - size)
    return int(low), int(round(low + size))
