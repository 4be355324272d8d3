"""A WAV file's header against the bytes it holds: a file that claims more audio than it has is refused.

FFmpeg's WAV demuxer reads a file whose data chunk claims more than the file holds up to where the
bytes stop, and reports the shorter length, with no error (measured, PyAV 18 / FFmpeg 8: 1 s of
16 kHz audio under a header claiming 4,000,000,000 bytes decodes as 1 s, and the stream's duration
says 1 s). Such a file is a copy or download cut short, or a writer that lied; a result computed
from it would describe audio that is not there. So it is refused, naming both lengths, like the
truncation check of ``decode.py`` does for MP4 and Matroska files.

Not every large claim is a lie: a writer that cannot seek back to fill in the header (one writing to
a pipe) leaves a placeholder there, and its file is whole. The placeholders in use are 0 and values
just under 2 GiB or 4 GiB (FFmpeg writes 0xFFFFFFFF, SoX 0x7FFFF000, arecord 0x7FFFFF00); such a
file is read to its end, as FFmpeg does, and accepted. RF64/BW64 (64-bit sizes in a ``ds64`` chunk)
and big-endian RIFX files are not checked.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from mediafarm.tasks.wire.errors import UnreadableMedia

# A placeholder sits this close below 2 GiB or 4 GiB (arecord's is 256 bytes under; 64 KiB leaves room
# for a writer that subtracts its header) — a real file of that size is never short by gigabytes.
_PLACEHOLDER_BAND = 1 << 16
_LIMITS = (1 << 31, 1 << 32)
# Chunks (LIST, fact, bext, ...) walked before ``data``; a header with more is not one to reason about.
_MAX_CHUNKS = 64


@dataclass(frozen=True)
class WavLength:
    """What a WAV header declares about its audio, and what the file holds.

    Attributes:
        declared: Bytes of audio the ``data`` chunk's size claims.
        held: Bytes the file holds from the start of that chunk's data to its end.
        byte_rate: Bytes per second of audio (the ``fmt `` chunk's average byte rate).
    """

    declared: int
    held: int
    byte_rate: int


def is_placeholder(size: int) -> bool:
    """Is a data chunk size one that a streaming writer leaves for "unknown"?"""
    return size == 0 or any(limit - _PLACEHOLDER_BAND <= size < limit for limit in _LIMITS)


def wav_length(path: Path) -> WavLength | None:
    """The declared and real audio lengths of a little-endian RIFF WAVE file; None when ``path`` is
    not one, its data size is a placeholder, or its chunks cannot be walked to ``data``."""
    with open(path, "rb") as fh:
        head = fh.read(12)
        if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            return None
        size = os.fstat(fh.fileno()).st_size
        byte_rate = 0
        for _ in range(_MAX_CHUNKS):
            chunk = fh.read(8)
            if len(chunk) < 8:
                return None
            kind, length = chunk[:4], struct.unpack("<I", chunk[4:])[0]
            if kind == b"data":
                if not byte_rate or is_placeholder(length):
                    return None
                return WavLength(declared=length, held=size - fh.tell(), byte_rate=byte_rate)
            skip = length + (length & 1)  # chunks are padded to an even length
            if kind == b"fmt " and length >= 16:
                body = fh.read(16)
                if len(body) < 16:
                    return None
                byte_rate = struct.unpack("<I", body[8:12])[0]
                skip -= 16
            fh.seek(skip, os.SEEK_CUR)
    return None


def check_wav_length(path: Path, tolerance_s: float) -> None:
    """UnreadableMedia (``truncated: ...``) when the WAV at ``path`` holds more than ``tolerance_s``
    seconds less audio than its header declares; quiet for any other file."""
    length = wav_length(path)
    if length is None or length.declared - length.held <= tolerance_s * length.byte_rate:
        return
    rate, held = length.byte_rate, max(length.held, 0)
    raise UnreadableMedia(
        f"{path.name}: truncated: its WAV header declares {length.declared} bytes of audio "
        f"({length.declared / rate:.1f} s) but the file holds {held} ({held / rate:.1f} s)"
    )
