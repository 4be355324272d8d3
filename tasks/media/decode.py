"""Streaming decode with PyAV: any file FFmpeg reads → fixed-size 16 kHz mono blocks, and the
frame loop the video families share.

Memory stays flat whatever the media length: at most one block plus one decoded frame is held.
The camera-filter story's 97-minute OOM came from reading the whole track before "streaming" it.

A truncated file (a download or copy cut short) that still opens decodes quietly up to where its
data stops, and FFmpeg raises nothing at the end (measured with PyAV 18 / FFmpeg 8: a faststart MP4
cut at half gives one InvalidDataError on its torn last packet, a Matroska/WebM cut anywhere not
even that). So :func:`tolerant_frames` compares how far the stream's packets reached with the
length the container declares for it (:func:`declared_length`) and rejects a stream that stops
short. Only lengths a muxer computed from the stream's own timestamps when it finalised the file
count (a finalised MP4's track, a Matroska track's DURATION tag): FFmpeg fills in a length for
files that declare none (MPEG-TS and fragmented MP4: the last timestamps found in the file, so a
cut file looks whole; a Matroska file written live: the bitrate, wrong for VBR), and a check
against an estimate would reject healthy files. Such files are not checked.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np

from mediafarm.tasks.media.streams import check_audio_stream, check_decodable
from mediafarm.tasks.media.wav import check_wav_length
from mediafarm.tasks.wire.errors import UnreadableMedia

SAMPLE_RATE = 16000
# 10 s blocks, as in the camera-filter fix: ~640 KB of float32, whatever the file's length.
BLOCK_SECONDS = 10.0
# Corrupt packets are skipped (camera footage has them); this many in a row means the stream is
# not one we can read.
MAX_CONSECUTIVE_DECODE_ERRORS = 50
# How far short of its declared length a stream may end and still count as whole. A healthy MP4 or
# Matroska file ends within a frame of what it declares (the muxer wrote the length from the same
# timestamps; measured: within 0.07 s, audio and VBR video included); a truncated one is short by
# whatever was cut. A second, plus one frame interval (a timelapse's last packet may carry no
# duration), is far more than a healthy file is ever short by and less than any cut worth reporting.
TRUNCATION_TOLERANCE_S = 1.0
# Demuxers whose lengths can be trusted, by FFmpeg's format name (see declared_length).
_MP4_FORMATS = {"mov", "mp4"}
_MATROSKA_FORMATS = {"matroska", "webm"}
# Matroska track statistics tags: FFmpeg writes DURATION, mkvmerge DURATION-eng (or another language).
_DURATION_TAG = re.compile(r"^DURATION(-\w+)?$", re.IGNORECASE)
_CLOCK = re.compile(r"^(\d+):(\d{2}):(\d{2}(?:\.\d*)?)$")


def open_media(path: Path) -> av.container.InputContainer:
    """``path`` opened for reading, or UnreadableMedia naming it."""
    try:
        return av.open(str(path), mode="r")
    except av.error.EOFError as exc:
        # A container header with no packet after it (a recording stopped before its first frame,
        # or a copy cut inside the header), not a file of another kind.
        raise UnreadableMedia(
            f"{path.name} ends before its first audio or video packet: an empty recording, or one cut short "
            f"({exc.strerror or exc})"
        ) from exc
    except av.error.FFmpegError as exc:
        raise UnreadableMedia(f"not a media file FFmpeg can read: {path.name} ({exc.strerror or exc})") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise UnreadableMedia(f"not a media file FFmpeg can read: {path.name} ({exc})") from exc


def declared_length(container: av.container.InputContainer, stream: av.stream.Stream) -> float | None:
    """Seconds of ``stream`` its container really declares, or None when it declares none that a
    muxer computed from the stream's own timestamps (then a cut file cannot be told from a short one)."""
    formats = set(container.format.name.split(","))
    if formats & _MP4_FORMATS:
        return _mp4_length(stream)
    if formats & _MATROSKA_FORMATS:
        return _matroska_duration_tag(stream)
    # MPEG-TS has no length in the format: FFmpeg's is the last timestamp it finds near the end, so
    # a cut file declares its own cut length (measured: a TS cut at half reports 5.7 s, and a healthy
    # VBR one its true 12.0 s). AVI: FFmpeg estimates from the bitrate once the index at the end is
    # cut off (measured: 6.0 s declared, 3.8 s of packets). FLV, Ogg, MP3, WAV, images: not trusted.
    return None


def _mp4_length(stream: av.stream.Stream) -> float | None:
    # A finalised MP4 indexes every sample in its moov (``frames``) and the track's length (mdhd, the
    # sum of its samples' durations; FFmpeg shortens it to an edit list that ends sooner). A
    # fragmented MP4 (an empty moov, frames == 0) declares nothing: FFmpeg adds up the fragments it
    # finds, which a cut file has fewer of.
    if not stream.frames or stream.duration is None or stream.time_base is None:
        return None
    return float(stream.duration * stream.time_base)


def _matroska_duration_tag(stream: av.stream.Stream) -> float | None:
    """The track statistics tag FFmpeg and mkvmerge write when they finalise a Matroska/WebM file
    (``HH:MM:SS.nnnnnnnnn``, from the track's own last timestamp), in seconds; None without one.

    Only the tag: the segment's Duration covers every track (an audio track longer than the video,
    a subtitle cue after the last frame), may be a recording app's clock (MediaRecorder WebM patched
    afterwards), and when it is absent (a file written live) FFmpeg estimates one from the bitrate
    (measured: MP3 in Matroska, 4 % long).
    """
    for key, value in stream.metadata.items():
        match = _CLOCK.match(value.strip()) if _DURATION_TAG.match(key) else None
        if match:
            hours, minutes, seconds = match.groups()
            return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    return None


class _Reach:
    """How far in time a stream's packets got: the end (pts + duration) of the latest one and the
    earliest start. Fed every packet demuxed, decoded or not, so a keyframes-only decode (the
    non-key packets are read and dropped by the decoder) reaches exactly as far as a full one,
    where its last decoded frame could be a GOP before the end of a healthy file. Kept in the
    stream's own time base, as integers: Fractions would cost ~10 µs a packet."""

    def __init__(self, stream: av.stream.Stream) -> None:
        self.time_base = stream.time_base
        self.start: int | None = None
        self.end: int | None = None

    def add(self, packet: av.packet.Packet) -> None:
        pts = packet.pts if packet.pts is not None else packet.dts
        if pts is None:
            return  # a demuxer's flush packet
        end = pts + (packet.duration or 0)
        if self.start is None or self.end is None:
            self.start, self.end = pts, end
            return
        self.start = min(self.start, pts)
        self.end = max(self.end, end)

    def seconds(self) -> float:
        """The time reached, counted from zero: a stream that starts late (an edit list's delay, an
        offset kept from a copy) is credited with its start, and one with negative timestamps (AAC
        priming) is not charged for them. Both err towards "whole": never reject a healthy file."""
        if self.start is None or self.end is None or self.time_base is None:
            return 0.0
        return float((self.end - min(self.start, 0)) * self.time_base)


def tolerant_frames(
    container: av.container.InputContainer, stream: av.stream.Stream, label: str, *, check_length: bool = False
) -> Iterator[Any]:
    """Every decoded frame of ``stream``, skipping corrupt packets; UnreadableMedia after
    MAX_CONSECUTIVE_DECODE_ERRORS of them in a row. ``label`` names the stream in the error.

    With ``check_length``, also UnreadableMedia (``truncated: ...``) after the last frame when the
    packets stopped short of the length the container declares for the stream: found in this same
    pass, from the packets' times, with nothing kept but two numbers."""
    declared = declared_length(container, stream) if check_length else None
    # Packet times are followed only where there is a declared length to hold them against.
    reach = _Reach(stream) if declared is not None else None
    errors_in_row = 0
    for packet in container.demux(stream):
        if reach is not None:
            reach.add(packet)
        try:
            decoded = packet.decode()
        except av.error.InvalidDataError as exc:
            errors_in_row += 1
            if errors_in_row > MAX_CONSECUTIVE_DECODE_ERRORS:
                raise UnreadableMedia(f"{label} undecodable ({exc.strerror})") from exc
            continue
        errors_in_row = 0
        yield from decoded
    if declared is not None and reach is not None:
        _reject_if_short(stream, declared, reach.seconds(), Path(container.name).name)


def _reject_if_short(stream: av.stream.Stream, declared: float, reached: float, name: str) -> None:
    if reached + _tolerance(stream) < declared:
        raise UnreadableMedia(
            f"{name}: truncated: the {stream.type} stream ends at {reached:.1f} s of the {declared:.1f} s "
            "its container declares"
        )


def _tolerance(stream: av.stream.Stream) -> float:
    rate = stream.average_rate if stream.type == "video" else None
    return TRUNCATION_TOLERANCE_S + (1 / float(rate) if rate else 0.0)


def checked_audio_stream(container: av.container.InputContainer, path: Path) -> av.stream.Stream:
    """The first audio stream of ``path`` (open as ``container``), checked from the header alone:
    UnreadableMedia when there is none, when it cannot be decoded or declares channels or a rate no
    audio has (``media.streams``), or when a WAV header declares more audio than the file holds
    (``media.wav``). The decode and the input probe (``media.probe``) both start here."""
    streams = container.streams.audio
    if not streams:
        raise UnreadableMedia(f"{path.name} has no audio stream")
    check_audio_stream(streams[0], path.name)
    if "wav" in container.format.name.split(","):
        check_wav_length(path, TRUNCATION_TOLERANCE_S)
    return streams[0]


def checked_video_stream(container: av.container.InputContainer, path: Path) -> av.stream.Stream:
    """The first video stream of ``path`` (open as ``container``), checked from the header alone:
    UnreadableMedia when there is none, when FFmpeg has no decoder for it or when it declares no
    frame size. The frame loop and the input probe (``media.probe``) both start here."""
    streams = container.streams.video
    if not streams:
        raise UnreadableMedia(f"{path.name} has no video stream")
    check_decodable(streams[0], path.name)
    context = streams[0].codec_context
    if not context.width or not context.height:
        raise UnreadableMedia(f"{path.name}: the video stream declares no frame size")
    return streams[0]


def has_audio_stream(path: Path) -> bool:
    """Does ``path`` carry an audio stream? (From the header; UnreadableMedia if it does not open.)"""
    with open_media(path) as container:
        return bool(container.streams.audio)


def probe_duration(path: Path) -> float | None:
    """Duration in seconds from the container header, without decoding; None if unknown."""
    with open_media(path) as container:
        audio = [s for s in container.streams if s.type == "audio"]
        if audio and audio[0].duration is not None and audio[0].time_base is not None:
            return float(audio[0].duration * audio[0].time_base)
        if container.duration is not None:
            return container.duration / av.time_base
        return None


def audio_blocks(
    path: Path, *, rate: int = SAMPLE_RATE, block_seconds: float = BLOCK_SECONDS
) -> Iterator[np.ndarray]:
    """Yield the first audio stream of ``path`` as float32 mono blocks in [-1, 1].

    Every block holds ``rate * block_seconds`` samples except possibly the last. Raises
    :class:`UnreadableMedia` for a file FFmpeg cannot open or that has no audio stream, and for
    two odd kinds of audio that FFmpeg decodes without complaint (both refused, never accepted
    with a warning, because either way the result would describe audio that is not there):

    - a WAV whose header declares more audio than the file holds (``truncated: ...``, both lengths
      named; ``media.wav``: a streaming writer's placeholder size is not a claim, and is accepted);
    - float PCM with a NaN or infinite sample (the first one's time named). The resampler turns
      each into garbage (measured: -1.0, a full-scale click, from float32; 0.0 from float64), and a
      recogniser or detector fed it answers garbage; zeroing them would hide a broken recording.
      Only ``pcm_f*`` streams are checked: they carry the file's samples verbatim, while a
      compressed codec computes its own (checking those would copy every frame).
    """
    block = int(rate * block_seconds)
    if block <= 0:
        raise ValueError("block_seconds too small")
    with open_media(path) as container:
        stream = checked_audio_stream(container, path)
        verbatim_floats = stream.codec_context.name.startswith("pcm_f")
        resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
        pending: list[np.ndarray] = []
        pending_len = 0
        decoded = 0  # samples of the stream before the current frame, for the time of a bad one

        def frames() -> Iterator[av.AudioFrame | None]:
            yield from tolerant_frames(container, stream, f"{path.name}: audio stream", check_length=True)
            yield None  # flush the resampler

        # Frames already in the output's form (16-bit mono at ``rate``: a WAV as the farm writes
        # them) are taken as they are until the first that is not: PyAV's resampler costs a good
        # share of a VAD job's time even with nothing to convert (measured: docs/benchmarks/vad.md).
        # Once it is fed, every later frame goes through it, so no buffered sample is overtaken.
        resampling = False

        for frame in frames():
            if verbatim_floats and frame is not None:
                _refuse_non_finite(frame, decoded, path.name)
                decoded += frame.samples
            resampling = resampling or frame is None or not _in_output_form(frame, rate)
            for out in resampler.resample(frame) if resampling else (frame,):
                samples = out.to_ndarray().reshape(-1)
                pending.append(samples)
                pending_len += samples.size
                while pending_len >= block:
                    joined = np.concatenate(pending)
                    yield (joined[:block].astype(np.float32) / 32768.0)
                    rest = joined[block:]
                    pending = [rest] if rest.size else []
                    pending_len = rest.size
        if pending_len:
            yield np.concatenate(pending).astype(np.float32) / 32768.0


class KeptAudio:
    """A file's :func:`audio_blocks` for two passes, decoded once where the audio is short.

    The first pass (:meth:`blocks`) decodes and keeps the blocks while they total at most
    ``keep_seconds``; the second (:meth:`again`) is those kept blocks, or a fresh decode where the
    audio was longer or the first pass never ran to its end. So memory stays flat with length: at
    most ``keep_seconds`` of samples are held (16 kHz float32: 3.8 MB a minute), whatever the file.
    """

    def __init__(self, path: Path, keep_seconds: float) -> None:
        self.path, self.limit = path, int(keep_seconds * SAMPLE_RATE)
        self._kept: list[np.ndarray] | None = None

    def blocks(self, path: Path | None = None) -> Iterator[np.ndarray]:
        """The first pass (``path``: the same file, as a reader of ``audio_blocks`` passes it)."""
        if path is not None and Path(path) != self.path:
            raise ValueError(f"KeptAudio of {self.path} asked for {path}")
        kept: list[np.ndarray] | None = []
        held = 0
        for block in audio_blocks(self.path):
            held += block.size
            if kept is not None and held <= self.limit:
                kept.append(block)
            else:
                kept = None  # too long to keep: the second pass decodes again
            yield block
        self._kept = kept

    def again(self) -> Iterator[np.ndarray]:
        """The second pass: what the first kept, or the file decoded anew."""
        kept, self._kept = self._kept, None
        return _handed_over(kept) if kept is not None else audio_blocks(self.path)


def _handed_over(blocks: list[np.ndarray]) -> Iterator[np.ndarray]:
    """``blocks`` in order, each let go of as it is handed out (memory falls as the pass goes on)."""
    blocks.reverse()
    while blocks:
        yield blocks.pop()


def _in_output_form(frame: av.AudioFrame, rate: int) -> bool:
    return frame.format.name == "s16" and frame.sample_rate == rate and len(frame.layout.channels) == 1


def _refuse_non_finite(frame: av.AudioFrame, before: int, name: str) -> None:
    """UnreadableMedia naming the time of the first NaN or infinite sample of a float frame."""
    samples = frame.to_ndarray()
    bad = ~np.isfinite(samples)
    if not bad.any():
        return
    # Planar frames are (channels, samples); packed ones (1, samples x channels), interleaved.
    if frame.format.is_planar:
        index = int(np.nonzero(bad)[1].min())
    else:
        index = int(np.flatnonzero(bad)[0]) // max(len(frame.layout.channels), 1)
    seconds = (before + index) / frame.sample_rate
    raise UnreadableMedia(
        f"{name}: the audio stream has a non-finite sample (NaN or infinity) at {seconds:.3f} s: the recording "
        "is corrupt, and a recogniser or detector fed it would answer garbage"
    )
