"""Streaming audio decode with PyAV: any file FFmpeg reads → fixed-size 16 kHz mono blocks.

Memory stays flat whatever the media length: at most one block plus one decoded frame is held.
The camera-filter story's 97-minute OOM came from reading the whole track before "streaming" it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np

from mediafarm.tasks.errors import UnreadableMedia

SAMPLE_RATE = 16000
# 10 s blocks, as in the camera-filter fix: ~640 KB of float32, whatever the file's length.
BLOCK_SECONDS = 10.0
# Corrupt packets are skipped (camera footage has them); this many in a row means the stream is
# not one we can read.
MAX_CONSECUTIVE_DECODE_ERRORS = 50


def open_media(path: Path) -> av.container.InputContainer:
    """``path`` opened for reading, or UnreadableMedia naming it."""
    try:
        return av.open(str(path), mode="r")
    except av.error.FFmpegError as exc:
        raise UnreadableMedia(f"not a media file FFmpeg can read: {path.name} ({exc.strerror or exc})") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise UnreadableMedia(f"not a media file FFmpeg can read: {path.name} ({exc})") from exc


def tolerant_frames(container: av.container.InputContainer, stream: av.stream.Stream, label: str) -> Iterator[Any]:
    """Every decoded frame of ``stream``, skipping corrupt packets; UnreadableMedia after
    MAX_CONSECUTIVE_DECODE_ERRORS of them in a row. ``label`` names the stream in the error."""
    errors_in_row = 0
    for packet in container.demux(stream):
        try:
            decoded = packet.decode()
        except av.error.InvalidDataError as exc:
            errors_in_row += 1
            if errors_in_row > MAX_CONSECUTIVE_DECODE_ERRORS:
                raise UnreadableMedia(f"{label} undecodable ({exc.strerror})") from exc
            continue
        errors_in_row = 0
        yield from decoded


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
    :class:`UnreadableMedia` for a file FFmpeg cannot open or that has no audio stream.
    """
    block = int(rate * block_seconds)
    if block <= 0:
        raise ValueError("block_seconds too small")
    with open_media(path) as container:
        streams = [s for s in container.streams if s.type == "audio"]
        if not streams:
            raise UnreadableMedia(f"{path.name} has no audio stream")
        stream = streams[0]
        resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
        pending: list[np.ndarray] = []
        pending_len = 0

        def frames() -> Iterator[av.AudioFrame | None]:
            yield from tolerant_frames(container, stream, f"{path.name}: audio stream")
            yield None  # flush the resampler

        for frame in frames():
            for out in resampler.resample(frame):
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
