"""Camera-like test recordings whose every frame says its own number, for frame-exact cut tests.

:func:`make_numbered` writes a video (any codec PyAV encodes, the container the suffix names) with
long GOPs and B-frames, as cameras and encoders' defaults make them, and a 440 Hz AAC tone.
Frame ``i`` shows ``i`` in binary as ten vertical bars (white = 1), which survive any lossy codec
at this size; :func:`frame_number` reads it back from a decoded frame.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

BARS = 10  # up to 1023 frames
RATE = 48000


def make_numbered(path: Path, *, seconds: float, fps: int = 10, gop_seconds: float = 5.0,
                  codec: str = "libx264", width: int = 320, height: int = 240, audio: bool = True,
                  grain: int = 0) -> Path:  # fmt: skip
    """Write ``path``: ``seconds`` of numbered frames, a keyframe every ``gop_seconds``. ``grain``:
    random noise of that amplitude on every frame (seeded), which no codec compresses much: a file
    of tens of MiB where clean frames make one or two (the bars still read right)."""
    rng = np.random.default_rng(0)
    gop = int(gop_seconds * fps)
    with av.open(str(path), "w") as out:
        video = out.add_stream(codec, rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        if codec == "libx264":
            video.options = {"g": str(gop), "keyint_min": str(gop), "sc_threshold": "0", "bf": "2",
                             "preset": "veryfast"}  # fmt: skip
        elif codec == "libx265":
            video.options = {"x265-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes=2:log-level=error",
                             "preset": "ultrafast"}  # fmt: skip
        else:
            video.codec_context.gop_size = gop
            video.codec_context.bit_rate = 1_000_000
        tone = out.add_stream("aac", rate=RATE) if audio else None
        samples = 0
        for i in range(int(seconds * fps)):
            image = numbered(i, width, height)
            if grain:
                noise = rng.integers(-grain, grain + 1, image.shape[:2], dtype=np.int16)[:, :, None]
                image = np.clip(image.astype(np.int16) + noise, 0, 255).astype(np.uint8)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            out.mux(video.encode(frame))
            while tone is not None and samples < (i + 1) * RATE / fps:
                t = (samples + np.arange(1024)) / RATE
                chunk = (0.2 * np.sin(2 * np.pi * 440 * t)).astype(np.float32).reshape(1, -1)
                block = av.AudioFrame.from_ndarray(chunk, format="flt", layout="mono")
                block.sample_rate, block.pts = RATE, samples
                out.mux(tone.encode(block))
                samples += 1024
        out.mux(video.encode(None))
        if tone is not None:
            out.mux(tone.encode(None))
    return path


def numbered(i: int, width: int, height: int) -> np.ndarray:
    image = np.full((height, width, 3), 40, np.uint8)
    bar = width // BARS
    for bit in range(BARS):
        if (i >> bit) & 1:
            image[:, bit * bar + 2 : (bit + 1) * bar - 2] = 230
    return image


def frame_number(frame: av.VideoFrame) -> int:
    grey = frame.to_ndarray(format="gray")
    bar = grey.shape[1] // BARS
    return sum(1 << bit for bit in range(BARS) if grey[:, bit * bar + bar // 4 : (bit + 1) * bar - bar // 4].mean() > 135)


def frame_numbers(path: Path) -> list[int]:
    """The number each decoded video frame of ``path`` shows, in the order shown."""
    with av.open(str(path)) as container:
        return [frame_number(frame) for frame in container.decode(video=0)]
