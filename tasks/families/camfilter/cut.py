"""Cutting clips out of a recording with PyAV, frame-exact, re-encoding as little as possible.

A stream copy is cheap (no decode, no quality loss) but can only start where a decoder can: at a
keyframe. A camera's keyframes may be 5-10 s apart, so a clip starting between two is cut one of
four ways (:func:`choose_cut`), each starting at the exact requested time:

- ``copy``: the clip starts on a keyframe: every packet is copied.
- ``smart`` (H.264 in MP4, MOV or Matroska): the frames from the start to the next IDR keyframe
  are decoded and re-encoded with libx264 at the source's size, pixel format and profile, with
  parameter-set ids the source does not use (``avc``), and every packet from that keyframe on is
  copied byte for byte. The join needs nothing from a player beyond H.264 itself.
- ``editlist`` (any other codec in MP4/MOV): the packets are copied from the keyframe before the
  start, and the MP4 edit list (``edts``) starts playback at the exact time; the few frames before
  it are in the file but never shown. Players that honour edit lists (FFmpeg, browsers, VLC,
  QuickTime) start at the exact frame.
- ``reencode``: the whole clip is decoded and encoded again (H.264 + AAC in MP4), when neither of
  the above fits (another codec in Matroska, a pixel format libx264 cannot write, a smart join
  that failed its check) or when the ladder asks for it. The reason is recorded with the clip.

Audio is copied (AAC, Opus ... packets are all keyframes): into MP4 from the packet that holds the
start, its first samples trimmed by the edit list; into Matroska from the first packet at or after
the start (at most one audio frame, ~21 ms, late). A re-encode re-encodes it.

Memory is bounded whatever the clip's length: packets stream through one at a time, the decoder
and encoder use :data:`THREADS` threads, x264's look-ahead is short, and the muxer's index is a few
bytes a frame. Every clip written is decoded again and its frame times compared with the
source's before it counts (``check``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import av

from mediafarm.tasks.families.camfilter import avc
from mediafarm.tasks.families.camfilter.source import (
    Source,
    first_frame_at,
    keyframe_after,
    keyframe_before,
    seek,
    video_stream,
)
from mediafarm.tasks.kit.media import open_media

Method = Literal["copy", "smart", "editlist", "reencode"]
Mode = Literal["auto", "reencode"]
# Containers a copied clip keeps; anything else is written as Matroska.
COPY_CONTAINERS = {".mp4": "mp4", ".mov": "mov", ".mkv": "matroska", ".webm": "webm"}
EDIT_LIST_CONTAINERS = {"mp4", "mov"}
SMART_CONTAINERS = {"mp4", "mov", "matroska"}
# Threads of each decoder and encoder: enough for two cores' worth of work, and at 4K each thread
# of frame-threaded decoding holds a frame (~12 MiB) or two, so the count bounds the memory.
THREADS = max(1, min(4, os.cpu_count() or 1))
# x264 for a whole re-encode: close to the source's quality, a short look-ahead (each frame of
# look-ahead holds a 4K frame or more).
X264 = {"preset": "veryfast", "crf": "18", "rc-lookahead": "10"}
# x264 for a smart cut's head (at most a GOP): no look-ahead at all, so the encoder holds only the
# frames its threads work on (a lower peak than with the above, and faster: measured in
# docs/benchmarks/camfilter.md), and no B-frames (the head's timestamps stay simple).
HEAD_X264 = {"preset": "veryfast", "crf": "18", "rc-lookahead": "0", "sync-lookahead": "0"}
_MS = Fraction(1, 1000)


@dataclass(frozen=True)
class CutClip:
    """A clip written: where, the span of the source it holds, how it was made, why not a cheaper
    way (``reason``; empty when nothing stood in the way), and how many seconds of it were
    re-encoded (``reencoded``: the head of a smart cut, all of a re-encode, 0 for a copy)."""

    path: Path
    start: float
    end: float
    method: Method
    reason: str = ""
    reencoded: float = 0.0


def choose_cut(start: float, source: Source, mode: Mode = "auto") -> tuple[Method, str]:
    """How a clip starting at ``start`` is cut, and why not a cheaper way (empty: nothing stood
    in the way)."""
    if mode == "reencode":
        return "reencode", "the ladder's reencode rung"
    keyframe = keyframe_before(start, source.keyframes)
    if keyframe is not None and start - keyframe < source.frame / 2:
        return "copy", ""
    smart_no = _why_not_smart(source)
    if not smart_no:
        return "smart", ""
    if output_format(source) in EDIT_LIST_CONTAINERS:
        return "editlist", smart_no
    return "reencode", f"{smart_no}, and {output_format(source)} has no edit list"


def _why_not_smart(source: Source) -> str:
    if source.codec != "h264":
        return f"a smart cut re-encodes H.264 only, the source is {source.codec}"
    if source.avc is None:
        return "the source's H.264 parameter sets are not in an avcC record"
    if output_format(source) not in SMART_CONTAINERS:
        return f"a smart cut writes MP4, MOV or Matroska, the source is {source.container}"
    if "libx264" not in av.codecs_available:
        return "this FFmpeg has no libx264"
    if source.pix_fmt not in {f.name for f in av.Codec("libx264", "w").video_formats or ()}:
        return f"libx264 cannot write the source's pixel format {source.pix_fmt}"
    return ""


def output_format(source: Source) -> str:
    return COPY_CONTAINERS.get(source.path.suffix.lower(), "matroska")


def clip_suffix(method: Method, source: Path) -> str:
    """The file suffix of a clip: the source's container for a copied one (or .mkv), .mp4 for a re-encode."""
    if method == "reencode":
        return ".mp4"
    return source.suffix.lower() if source.suffix.lower() in COPY_CONTAINERS else ".mkv"


def cut_clip(source: Source, start: float, end: float, target: Path, mode: Mode = "auto") -> CutClip:
    """Write ``source``'s ``[start, end)`` to ``target``, whose suffix should be
    :func:`clip_suffix`'s for :func:`choose_cut`'s method (a re-encode writes MP4 whatever it is)."""
    if end <= start:
        raise ValueError(f"empty clip {start}-{end}")
    method, reason = choose_cut(start, source, mode)
    if method != "copy":
        start = first_frame_at(source, start)  # the clip's zero: its first frame shows at 0
    if method == "reencode":
        _reencode(source, start, end, target)
        return CutClip(target, start, end, method, reason, reencoded=round(end - start, 3))
    join = keyframe_after(start, source.keyframes) if method == "smart" else None
    if join is not None and join >= end:
        join = None  # the clip ends before the next keyframe: all of it is the head
    head = (join if join is not None else end) - start if method == "smart" else 0.0
    _copy(source, start, end, target, method, join)
    return CutClip(target, start, end, method, reason, reencoded=round(head, 3))


class JoinFailed(Exception):
    """A smart cut's head and copied part do not join (timestamps would run backwards)."""


def _copy(source: Source, start: float, end: float, target: Path, method: Method, join: float | None) -> None:
    """Copy the packets of the video and first audio stream from the keyframe at or before
    ``start`` to ``end``, every time moved so that the clip's zero is 0: the keyframe for a copy,
    ``start`` (a frame's time) otherwise. ``smart``: the frames before ``join`` are re-encoded
    instead (all of them when no keyframe follows the start before the end)."""
    with open_media(source.path) as inp:
        video = video_stream(inp, source.path)
        audio = inp.streams.audio[0] if inp.streams.audio else None
        keyframe = keyframe_before(start, source.keyframes)
        if keyframe is None:
            keyframe = source.keyframes[0] if source.keyframes else 0.0
        with av.open(str(target), mode="w", format=output_format(source)) as out:
            cut = _PacketCut(source, video, audio, out, keyframe if method == "copy" else start, end)
            if method == "smart":
                cut.head_until(start, join)
            seek(inp, video, keyframe)
            for packet in inp.demux([video] + ([audio] if audio is not None else [])):
                if packet.pts is None:
                    continue  # a demuxer's flush packet
                if packet.stream.index == video.index:
                    cut.video_packet(packet, keyframe)
                else:
                    cut.audio_packet(packet)
                if cut.done:
                    break
            cut.finish()


class _PacketCut:
    """One clip's packets, as the source's demuxer gives them: copied (times moved to the clip's
    zero), or passed to the smart cut's :class:`_Head` before its join."""

    def __init__(self, source: Source, video: Any, audio: Any, out: Any, zero: float, end: float) -> None:
        self.source, self.video, self.out = source, video, out
        self.out_v = out.add_stream_from_template(video)
        self.out_a = out.add_stream_from_template(audio) if audio is not None else None
        vtb = video.time_base
        self.zero, self.end = zero, end
        self.zero_v, self.end_v = round(zero / vtb), round(end / vtb)
        self.trim_audio = output_format(source) in EDIT_LIST_CONTAINERS
        self.head: _Head | None = None
        self.join_v: int | None = None
        self.started = self.video_done = False
        self.audio_done = audio is None

    @property
    def done(self) -> bool:
        return self.video_done and self.audio_done

    def head_until(self, start: float, join: float | None) -> None:
        """Re-encode the frames from ``start`` (the clip's zero) up to ``join`` (or the end)."""
        vtb = self.video.time_base
        self.join_v = round(join / vtb) if join is not None else None
        self.head = _Head(self.video, self.source, self.out_v, (round(start / vtb), self.join_v or self.end_v))

    def video_packet(self, packet: Any, keyframe: float) -> None:
        if self.video_done:
            return
        if not self.started:
            if not (packet.is_keyframe and packet.pts * self.video.time_base >= keyframe - 1e-3):
                return  # before the keyframe the seek landed near
            self.started = True
        # Matroska keeps no decode times; a keyframe's is its pts less the decoder delay.
        dts = packet.dts if packet.dts is not None else packet.pts - self.source.delay
        if self.head is not None:
            if self.join_v is not None and packet.pts >= self.join_v:
                self.head.finish(self.out, before_dts=dts - self.zero_v)
                self.head = None  # this packet, the join's keyframe, and the rest are copied
            elif dts >= self.end_v:
                self.video_done = True  # every later packet shows at or after the end
                return
            else:
                self.head.decode(packet, self.out)
                return
        if packet.pts >= self.end_v:
            self.video_done = True
            return
        packet.pts -= self.zero_v
        if packet.dts is not None:
            packet.dts -= self.zero_v
        packet.stream = self.out_v
        self.out.mux(packet)

    def audio_packet(self, packet: Any) -> None:
        if self.out_a is None or self.audio_done:
            return
        atb = packet.time_base
        begins, ends = float(packet.pts * atb), float((packet.pts + (packet.duration or 0)) * atb)
        if begins >= self.end:
            self.audio_done = True
            return
        if ends <= self.zero or (not self.trim_audio and begins < self.zero - 1e-6):
            return  # before the clip (Matroska: no edit list to trim a packet's head)
        offset = round(self.zero / atb)
        packet.pts -= offset
        if packet.dts is not None:
            packet.dts -= offset
        packet.stream = self.out_a
        self.out.mux(packet)

    def finish(self) -> None:
        if self.head is not None:
            self.head.finish(self.out, before_dts=None)


class _Head:
    """The re-encoded head of a smart cut: decodes from the keyframe before the start, encodes
    the frames from the start up to the join with libx264 under parameter-set ids of its own,
    and writes them as length-prefixed samples into the clip's video stream, whose ``avcC`` it
    extends with its own SPS and PPS (``avc``)."""

    def __init__(self, video: Any, source: Source, out_v: Any, span: tuple[int, int]) -> None:
        assert source.avc is not None
        ctx = video.codec_context
        ctx.thread_type, ctx.thread_count = "AUTO", THREADS
        # Source pts of the frames to encode: [start, stop); the clip's zero is the start.
        self.video, self.out_v, (self.start, self.stop) = video, out_v, span
        self.config = source.avc
        set_id = avc.free_id(self.config)
        enc = av.CodecContext.create("libx264", "w")
        enc.width, enc.height, enc.pix_fmt = ctx.width, ctx.height, ctx.pix_fmt
        enc.time_base = video.time_base
        if video.average_rate:
            enc.framerate = video.average_rate
        if ctx.profile and ctx.profile in enc.profiles:
            enc.profile = ctx.profile
        enc.flags |= av.codec.context.Flags.global_header  # parameter sets in extradata, not in-band
        enc.thread_count = THREADS
        params = f"sps-id={set_id}:bframes=0"
        if ctx.level and ctx.level > 0:
            params += f":level={ctx.level / 10:.1f}"
        enc.options = {**HEAD_X264, "x264-params": params}
        if ctx.color_range:
            enc.color_range = ctx.color_range
        enc.open()
        units = avc.annexb_units(enc.extradata or b"")
        sps = [u for u in units if avc.nal_type(u) == avc.NAL_SPS]
        pps = [u for u in units if avc.nal_type(u) == avc.NAL_PPS]
        if not sps or not pps:
            raise JoinFailed("libx264 gave no parameter sets")
        out_v.codec_context.extradata = self.config.with_sets(sps, pps).to_bytes()
        self.enc = enc
        # The copied part keeps its decoder delay: the head's dts run that far behind its pts,
        # so the decode times stay increasing across the join.
        self.delay = source.delay
        self.last_dts: int | None = None

    def decode(self, packet: Any, mux: Any) -> None:
        for frame in _decode(packet):
            self._encode(frame, mux)

    def finish(self, mux: Any, *, before_dts: int | None) -> None:
        """Drain the decoder and the encoder; ``before_dts``: the first copied packet's decode
        time, which every head packet must precede."""
        for frame in _decode_flush(self.video):
            self._encode(frame, mux)
        self._write(self.enc.encode(None), mux)
        if before_dts is not None and self.last_dts is not None and self.last_dts >= before_dts:
            raise JoinFailed(f"the head's last decode time {self.last_dts} is not before the copy's {before_dts}")

    def _encode(self, frame: Any, mux: Any) -> None:
        if frame.pts is None or not self.start <= frame.pts < self.stop:
            return
        frame.pts -= self.start
        frame.pict_type = av.video.frame.PictureType.NONE  # let x264 choose (the first is an IDR)
        self._write(self.enc.encode(frame), mux)

    def _write(self, packets: list[Any], mux: Any) -> None:
        for encoded in packets:
            units = [u for u in avc.annexb_units(bytes(encoded)) if avc.nal_type(u) not in (7, 8, 9)]
            packet = av.Packet(avc.length_prefixed(units, self.config.length_size))
            packet.pts, packet.time_base = encoded.pts, encoded.time_base
            packet.dts = encoded.pts - self.delay
            if self.last_dts is not None and packet.dts <= self.last_dts:
                packet.dts = self.last_dts + 1
            self.last_dts = packet.dts
            packet.is_keyframe = encoded.is_keyframe
            packet.stream = self.out_v
            mux.mux(packet)


def _reencode(source: Source, start: float, end: float, target: Path) -> None:
    """Decode from the keyframe before ``start``, encode the frames in ``[start, end)`` (H.264, AAC)."""
    with open_media(source.path) as inp:
        video = video_stream(inp, source.path)
        video.codec_context.thread_type, video.codec_context.thread_count = "AUTO", THREADS
        audio = inp.streams.audio[0] if inp.streams.audio else None
        with av.open(str(target), mode="w", format="mp4") as out:
            rate = video.average_rate or Fraction(25)
            v_out = out.add_stream("libx264", rate=rate)
            v_out.width, v_out.height, v_out.pix_fmt = video.codec_context.width, video.codec_context.height, "yuv420p"
            v_out.thread_count = THREADS
            v_out.options = dict(X264)
            a_out = out.add_stream("aac", rate=audio.codec_context.sample_rate) if audio is not None else None
            seek(inp, video, keyframe_before(start, source.keyframes) or 0.0)

            def encode_video(frame: Any, seconds: float) -> None:
                frame = frame.reformat(format="yuv420p")
                # Milliseconds from the clip's start; the encoder rescales to its own base.
                frame.pts, frame.time_base = int(round((seconds - start) * 1000)), _MS
                out.mux(v_out.encode(frame))

            for packet in inp.demux([video] + ([audio] if audio is not None else [])):
                shown_after = packet.dts is not None and packet.dts * video.time_base >= end
                if packet.stream.index == video.index and shown_after:
                    break  # every later video frame shows after the end; the audio has reached it too
                for frame in _decode(packet):
                    seconds = float(frame.pts * frame.time_base) if frame.pts is not None else -1.0
                    if not start - 1e-6 <= seconds < end:
                        continue
                    if packet.stream.index == video.index:
                        encode_video(frame, seconds)
                    elif a_out is not None:
                        frame.pts = None  # the encoder numbers audio samples itself
                        out.mux(a_out.encode(frame))
            for frame in _decode_flush(video):  # the frames a B-frame decoder still holds
                seconds = float(frame.pts * video.time_base) if frame.pts is not None else -1.0
                if start - 1e-6 <= seconds < end:
                    encode_video(frame, seconds)
            out.mux(v_out.encode(None))
            if a_out is not None:
                out.mux(a_out.encode(None))


def _decode(packet: Any) -> list[Any]:
    try:
        return packet.decode()
    except av.error.InvalidDataError:
        return []  # a corrupt packet in camera footage: skip it, as the decoders elsewhere do


def _decode_flush(stream: Any) -> list[Any]:
    try:
        return stream.codec_context.decode(None)
    except (av.error.InvalidDataError, av.error.EOFError):
        return []
