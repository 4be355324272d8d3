"""Malformed and odd media files, made here byte by byte or with PyAV, for the malformed-input battery
(``tests/integration/test_malformed_battery.py``). Nothing is downloaded; every file is small.

The WAV writer sets each header field by hand, so a file can claim what no encoder would write: a
codec FFmpeg has no decoder for, no channels, a rate of 1 Hz or 2 GHz, more data than it holds.
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import av
import numpy as np
import soundfile as sf

RATE = 16000
PCM, FLOAT = 1, 3  # WAVE format tags


def tone(seconds: float = 1.0, rate: int = RATE, hz: float = 440.0) -> np.ndarray:
    """A quiet sine, float32 mono."""
    return (0.2 * np.sin(2 * np.pi * hz * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def wav_bytes(
    *,
    rate: int = RATE,
    channels: int = 1,
    bits: int = 16,
    format_tag: int = PCM,
    frames: int = RATE,
    data_size: int | None = None,
) -> bytes:
    """A canonical 44-byte-header WAV of ``frames`` frames of a tone, with any header field forced:
    ``data_size`` is what the data chunk claims (default: what it holds)."""
    width = max(1, channels) * bits // 8
    if bits == 16 and format_tag == PCM:
        samples = np.repeat((tone(frames / RATE) * 32767).astype("<i2"), max(1, channels))
        data = samples.tobytes()
    else:
        data = bytes(frames * width)
    claimed = len(data) if data_size is None else data_size
    fmt = struct.pack("<HHIIHH", format_tag, channels, rate, (rate * width) & 0xFFFFFFFF, width & 0xFFFF, bits)
    riff = min(0xFFFFFFFF, 36 + claimed)
    return b"RIFF" + struct.pack("<I", riff) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + \
        b"data" + struct.pack("<I", claimed) + data  # fmt: skip


def write_wav(path: Path, **fields: int) -> Path:
    path.write_bytes(wav_bytes(**fields))
    return path


def with_chunk_before_data(path: Path, size: int) -> Path:
    """A healthy one-second WAV with an unknown ``junk`` chunk of ``size`` bytes after its header:
    legal RIFF (readers skip chunks they do not know), a huge header."""
    healthy = wav_bytes()
    junk = b"junk" + struct.pack("<I", size) + bytes(size)
    path.write_bytes(healthy[:12] + junk + healthy[12:])
    return path


def with_fmt_size(path: Path, size: int) -> Path:
    """A WAV whose ``fmt`` chunk claims ``size`` bytes (it holds 16)."""
    data = bytearray(wav_bytes())
    data[16:20] = struct.pack("<I", size)
    path.write_bytes(bytes(data))
    return path


def float_wav(path: Path, samples: np.ndarray) -> Path:
    """32-bit float WAV: the format that can carry NaN and infinity."""
    sf.write(path, samples.astype(np.float32), RATE, subtype="FLOAT")
    return path


def healthy_wav(path: Path, seconds: float = 1.0) -> Path:
    sf.write(path, tone(seconds), RATE, subtype="PCM_16")
    return path


def healthy_wav_bytes(seconds: float = 1.0) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, tone(seconds), RATE, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def png(path: Path, width: int, height: int, rows: int | None = None) -> Path:
    """A PNG whose header says ``width`` x ``height``; only ``rows`` rows of pixels follow (all of
    them by default), so a header can claim 60000 x 60000 in a few hundred bytes."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    raw = b"".join(b"\0" + b"\x80" * (width * 3) for _ in range(height if rows is None else rows))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) +
                     chunk(b"IEND", b""))  # fmt: skip
    return path


def _frames(count: int, width: int, height: int) -> list[av.VideoFrame]:
    return [av.VideoFrame.from_ndarray(np.full((height, width, 3), (i * 40) % 256, np.uint8), format="rgb24")
            for i in range(count)]  # fmt: skip


def video(path: Path, *, codec: str = "libx264", rate: object = 10, frames: int = 10, width: int = 64,
          height: int = 48) -> Path:  # fmt: skip
    """A short flat-grey video; ``rate`` may be a Fraction (one frame every 10,000 s)."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for frame in _frames(frames, width, height):
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


def header_only(path: Path, kind: str) -> Path:
    """A container with one stream declared and not a single packet: ``video`` (H.264) or ``audio`` (PCM)."""
    with av.open(str(path), "w") as container:
        if kind == "video":
            stream = container.add_stream("libx264", rate=10)
            stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        else:
            stream = container.add_stream("pcm_s16le", rate=RATE)
            stream.layout = "mono"
        container.start_encoding()  # writes the header, which PyAV otherwise defers to the first packet
    return path


def unknown_fourcc_avi(path: Path) -> Path:
    """An MPEG-4 AVI whose FourCC (``FMP4``, in its stream header and format) is replaced by ``ZZZZ``:
    a codec FFmpeg has no decoder for, in a container it reads."""
    video(path, codec="mpeg4")
    data = path.read_bytes()
    if data.count(b"FMP4") < 1:
        raise RuntimeError(f"{path.name}: PyAV's AVI muxer no longer writes the FourCC FMP4")
    path.write_bytes(data.replace(b"FMP4", b"ZZZZ"))
    return path


def matroska_audio(path: Path, seconds: float = 6.0) -> Path:
    """A Matroska audio file (PCM), finalised, so its track declares its length (DURATION tag)."""
    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("pcm_s16le", rate=RATE)
        stream.layout = "mono"
        samples = (tone(seconds) * 32767).astype(np.int16)
        for start in range(0, samples.size, 1600):
            frame = av.AudioFrame.from_ndarray(samples[None, start : start + 1600], format="s16", layout="mono")
            frame.rate, frame.pts = RATE, start
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path
