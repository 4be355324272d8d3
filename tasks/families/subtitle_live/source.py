"""A live stream decoded to 16 kHz mono float32 with its timestamps, through PyAV (FFmpeg).

PyAV rather than an ``ffmpeg`` subprocess: the frames come with their PTS (the cue clock), the
read timeout is PyAV's own interrupt callback (a stalled source raises instead of blocking the
child for ever), and there is no pipe to size or process to reap. Measured in docs/benchmarks/subtitle-live.md
(bench/live_subtitle.py): decoding is a small share of a live job's CPU next to the recogniser.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import av
import numpy as np

from mediafarm.tasks.kit import UnreadableMedia
from mediafarm.tasks.kit.media import SAMPLE_RATE

# FFmpeg's own options per scheme: a UDP socket with room for a burst (a loaded worker reads late)
# whose overruns drop packets rather than end the stream; HLS only through HTTP(S). Every scheme
# gets the protocols it needs and no others: without a whitelist a demuxer FFmpeg probes from the
# data (an HLS playlist served on a tcp:// source) opens whatever URLs the data names (any host,
# file:), around the operator's allow-list of sources.
OPTIONS: dict[str, dict[str, str]] = {
    "udp": {"fifo_size": "1000000", "overrun_nonfatal": "1", "buffer_size": "4194304", "protocol_whitelist": "udp"},
    "tcp": {"protocol_whitelist": "tcp"},
    "http": {"protocol_whitelist": "http,https,tcp,tls,crypto"},
    "https": {"protocol_whitelist": "http,https,tcp,tls,crypto"},
    "rtmp": {"protocol_whitelist": "rtmp,tcp"},
    "rtsp": {"protocol_whitelist": "rtsp,rtp,udp,tcp"},
    "srt": {"protocol_whitelist": "srt"},
    "rtp": {"protocol_whitelist": "rtp,udp"},
}
# How much of the stream FFmpeg looks at before it starts: short, every second is latency.
PROBE = {"analyzeduration": "1000000", "probesize": "200000"}


class SourceEnded(Exception):
    """The stream ended or stalled; the message says which, for the job's ``end_reason``."""


class LiveSource:
    """``with LiveSource(url, stall_timeout=10) as source: for pts, samples in source.frames(): ...``

    ``pts`` is the decoded frame's presentation time in seconds (None when the frame has none),
    ``samples`` its audio at 16 kHz mono. Ends quietly at the stream's end (EOF); raises
    :class:`SourceEnded` when no data came for ``stall_timeout`` seconds.
    """

    def __init__(self, url: str, *, stall_timeout: float) -> None:
        self.url, self.stall_timeout = url, stall_timeout
        self.container: Any = None

    def __enter__(self) -> LiveSource:
        scheme = urlsplit(self.url).scheme.lower()
        options = {**PROBE, **OPTIONS.get(scheme, {})}
        try:
            self.container = av.open(self.url, mode="r", options=options,
                                     timeout=(self.stall_timeout, self.stall_timeout))  # fmt: skip
        except av.error.ExitError:
            raise SourceEnded(f"stalled: nothing came from the stream within {self.stall_timeout:g} s "
                              "(stall_timeout_s)") from None  # fmt: skip
        except (av.error.FFmpegError, OSError) as exc:
            raise UnreadableMedia(f"stream {self.url}: cannot be opened: {exc}") from None
        if not self.container.streams.audio:
            self.container.close()
            raise UnreadableMedia(f"stream {self.url} has no audio track")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.container is not None:
            self.container.close()

    def frames(self) -> Iterator[tuple[float | None, np.ndarray]]:
        stream = self.container.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        try:
            for packet in self.container.demux(stream):
                try:
                    decoded = packet.decode()
                except av.error.InvalidDataError:
                    continue  # a damaged packet (UDP loss): the next one decodes, the clock re-anchors
                for frame in decoded:
                    pts = float(frame.pts * frame.time_base) if frame.pts is not None and frame.time_base else None
                    out = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
                    if out:
                        yield pts, np.concatenate(out).astype(np.float32, copy=False)
        except av.error.ExitError:
            raise SourceEnded(f"stalled: no data from the stream for {self.stall_timeout:g} s (stall_timeout_s)") from None
        except av.error.EOFError:
            return
