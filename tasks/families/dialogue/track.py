"""One line's audio into the dialogue's track: read it back checked, bring it to the track's rate.

Lines may come from different rungs, and rungs speak at different rates (ChatTTS 24 kHz, Piper
and espeak-ng 22.05 kHz). Samples of two rates written as one stream play at the wrong speed and
pitch, so every line not at the track's rate is resampled (FFmpeg's swresample through PyAV); the
track takes the highest rate among its lines, so no line loses bandwidth.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import soundfile as sf

from mediafarm.tasks.kit import PermanentFailure, sha256_of


def read_line_audio(path: Path, sha256: str | None, label: str) -> tuple[np.ndarray, int]:
    """A line job's WAV as float32 mono and its rate; PermanentFailure if it is gone or changed
    (removed by ``farm gc``, or rewritten since the line job listed it)."""
    if not path.is_file():
        raise PermanentFailure(f"{label}: its audio {path} is gone (expired and collected?)")
    if sha256 is not None and sha256_of(path) != sha256:
        raise PermanentFailure(f"{label}: its audio {path} does not match the sha256 its job recorded")
    samples, rate = sf.read(path, dtype="float32", always_2d=True)
    return np.ascontiguousarray(samples.mean(axis=1), dtype=np.float32), int(rate)


def resample(samples: np.ndarray, rate: int, to: int) -> np.ndarray:
    """``samples`` (float32 mono at ``rate``) at ``to`` Hz, as long in seconds (to a sample)."""
    if rate == to or not samples.size:
        return samples
    resampler = av.AudioResampler(format="flt", layout="mono", rate=to)
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples, dtype=np.float32).reshape(1, -1),
                                       format="flt", layout="mono")  # fmt: skip
    frame.sample_rate = rate
    frame.pts, frame.time_base = 0, Fraction(1, rate)
    frames = [*resampler.resample(frame), *resampler.resample(None)]  # None flushes what it holds
    out = np.concatenate([f.to_ndarray().reshape(-1) for f in frames]) if frames else np.zeros(0, np.float32)
    # The flush may round the length by a sample or two either way: keep the duration exact.
    want = int(round(samples.size * to / rate))
    return out[:want] if out.size >= want else np.pad(out, (0, want - out.size))
