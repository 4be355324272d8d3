"""Voice activity detection engines: plain functions, callable and testable without a broker.

Each engine streams the media through :func:`tasks.media.decode.audio_blocks`, so memory does
not grow with the media's length, and returns a :class:`VadResult`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tasks.media.decode import SAMPLE_RATE, audio_blocks, probe_duration
from tasks.media.intervals import Span

SILERO_WINDOW = 512  # samples at 16 kHz: the only window size silero-vad 5+ accepts
WEBRTC_FRAME = 480  # 30 ms at 16 kHz, one of the three frame sizes webrtcvad accepts


@dataclass
class VadResult:
    """Speech found in one media file.

    Attributes:
        spans: Speech spans, sorted, non-overlapping.
        duration: Seconds of audio decoded (for ``skip``, the container's declared duration).
        model: Which model produced the spans, with its version.
        vad_skipped: True when no detection ran (the ``skip`` rung): spans are empty by
            design, not because the media is silent.
    """

    spans: list[Span] = field(default_factory=list)
    duration: float = 0.0
    model: str = ""
    vad_skipped: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "spans": [s.to_json() for s in self.spans],
            "duration": round(self.duration, 3),
            "model": self.model,
            "vad_skipped": self.vad_skipped,
        }


class _Windows:
    """Fixed-size windows across block boundaries, the last one zero-padded.

    ``samples`` counts the real (unpadded) samples seen so far: the media's decoded duration.
    """

    def __init__(self, path: Path, size: int) -> None:
        self.path, self.size, self.samples = path, size, 0

    def __iter__(self) -> Iterator[np.ndarray]:
        size = self.size
        carry = np.zeros(0, dtype=np.float32)
        for block in audio_blocks(self.path):
            self.samples += block.size
            if carry.size:
                block = np.concatenate([carry, block])
            usable = block.size - block.size % size
            for i in range(0, usable, size):
                yield block[i : i + size]
            carry = block[usable:]
        if carry.size:
            yield np.pad(carry, (0, size - carry.size))


@functools.lru_cache(maxsize=1)
def _silero_model() -> Any:
    """The silero ONNX model, loaded once per child process on first use."""
    try:
        import torch
        from silero_vad import load_silero_vad
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        from tasks.errors import RungUnavailable

        raise RungUnavailable(f"silero-vad is not installed ({exc.name}); pip install 'mediafarm[vad]'") from exc
    # One intra-op thread: a pool runs one child per core, and oversubscription costs more than it gives.
    torch.set_num_threads(1)
    return load_silero_vad(onnx=True)


def silero_version() -> str:
    from importlib.metadata import version

    return f"silero-vad {version('silero-vad')} (onnx)"


def silero_spans(
    path: Path, *, threshold: float = 0.5, min_silence_ms: int = 300, speech_pad_ms: int = 30
) -> VadResult:
    """Speech spans by silero-vad's streaming iterator over 512-sample windows."""
    import torch
    from silero_vad import VADIterator

    iterator = VADIterator(
        _silero_model(),
        threshold=threshold,
        sampling_rate=SAMPLE_RATE,
        min_silence_duration_ms=min_silence_ms,
        speech_pad_ms=speech_pad_ms,
    )
    spans: list[Span] = []
    start: int | None = None
    windows = _Windows(path, SILERO_WINDOW)
    try:
        with torch.inference_mode():
            for window in windows:
                event = iterator(torch.from_numpy(window))
                if not event:
                    continue
                if "start" in event:
                    start = int(event["start"])
                if "end" in event and start is not None:
                    spans.append(Span(start / SAMPLE_RATE, int(event["end"]) / SAMPLE_RATE))
                    start = None
    finally:
        iterator.reset_states()  # the cached model is reused by this child's next job
    duration = windows.samples / SAMPLE_RATE
    if start is not None:  # speech runs to the end of the media
        spans.append(Span(start / SAMPLE_RATE, duration))
    spans = [Span(s.start, min(s.end, duration)) for s in spans if s.start < duration]
    return VadResult(spans=spans, duration=duration, model=silero_version())


def webrtc_spans(
    path: Path, *, aggressiveness: int = 2, min_silence_ms: int = 300, min_speech_ms: int = 150
) -> VadResult:
    """Speech spans by webrtcvad on 30 ms frames, with a silence hangover and a minimum length."""
    try:
        import webrtcvad
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        from tasks.errors import RungUnavailable

        raise RungUnavailable("webrtcvad is not installed; pip install 'mediafarm[vad]'") from exc
    vad = webrtcvad.Vad(int(aggressiveness))
    frame_s = WEBRTC_FRAME / SAMPLE_RATE
    hangover = max(1, round(min_silence_ms / 1000 / frame_s))
    spans: list[Span] = []
    start: int | None = None
    silent_run = 0
    frames = 0
    windows = _Windows(path, WEBRTC_FRAME)
    for window in windows:
        pcm = (np.clip(window, -1.0, 1.0) * 32767).astype("<i2").tobytes()
        speech = vad.is_speech(pcm, SAMPLE_RATE)
        if speech:
            if start is None:
                start = frames
            silent_run = 0
        elif start is not None:
            silent_run += 1
            if silent_run >= hangover:
                spans.append(Span(start * frame_s, (frames - silent_run + 1) * frame_s))
                start, silent_run = None, 0
        frames += 1
    duration = windows.samples / SAMPLE_RATE
    if start is not None:
        spans.append(Span(start * frame_s, min(duration, (frames - silent_run) * frame_s)))
    spans = [s for s in spans if s.end - s.start >= min_speech_ms / 1000]
    from importlib.metadata import version

    return VadResult(spans=spans, duration=duration, model=f"webrtcvad {version('webrtcvad-wheels')}")


def skipped(path: Path) -> VadResult:
    """No detection at all: the cheapest rung, so that a pipeline still gets its other stages."""
    return VadResult(spans=[], duration=probe_duration(path) or 0.0, model="none", vad_skipped=True)
