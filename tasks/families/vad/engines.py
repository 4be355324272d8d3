"""Voice activity detection engines: ``engine(ctx, request, params) -> VadResult``.

Each engine streams the media through :func:`mediafarm.tasks.media.decode.audio_blocks`, so memory
does not grow with the media's length, and reports progress and checks for cancellation once a
block (10 s of audio). Callable without a broker: ``silero(EngineContext.local(), VadRequest(media=...),
SileroParams())``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from mediafarm.tasks.families.vad.spec import SileroParams, VadRequest, VadResult, WebrtcParams
from mediafarm.tasks.kit import EngineContext, NoParams, Span
from mediafarm.tasks.kit.media import SAMPLE_RATE, audio_blocks, has_audio_stream, probe_duration

SILERO_WINDOW = 512  # samples at 16 kHz: the only window size silero-vad 5+ accepts
WEBRTC_FRAME = 480  # 30 ms at 16 kHz, one of the three frame sizes webrtcvad accepts


class _Windows:
    """Fixed-size windows across block boundaries, the last one zero-padded.

    ``samples`` counts the real (unpadded) samples seen so far: the media's decoded duration.
    After each decoded block it reports the decode position and checks for cancellation.
    """

    def __init__(self, path: Path, size: int, ctx: EngineContext, stage: str) -> None:
        self.path, self.size, self.samples = path, size, 0
        self.ctx, self.stage = ctx, stage
        self.expected = probe_duration(path)  # from the header; None when the container does not say

    def __iter__(self) -> Iterator[np.ndarray]:
        size = self.size
        carry = np.zeros(0, dtype=np.float32)
        for block in audio_blocks(self.path):
            self.samples += block.size
            done = self.samples / SAMPLE_RATE
            self.ctx.progress(done / self.expected if self.expected else None, stage=self.stage, media_seconds=done)
            self.ctx.check_cancelled()
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
    import torch
    from silero_vad import load_silero_vad

    # One intra-op thread: a pool runs one child per core, and oversubscription costs more than it gives.
    torch.set_num_threads(1)
    return load_silero_vad(onnx=True)


def silero_version() -> str:
    return f"silero-vad {version('silero-vad')} (onnx)"


def answers_no_audio(engine: Callable[..., VadResult]) -> Callable[..., VadResult]:
    """An engine that, for a request with ``if_no_audio="empty"``, answers a media file without an
    audio track with no spans and ``no_audio`` set instead of failing on it."""

    @functools.wraps(engine)
    def run(ctx: EngineContext, request: VadRequest, params: Any) -> VadResult:
        path = Path(request.media)
        if request.if_no_audio == "empty" and not has_audio_stream(path):
            return VadResult(spans=[], duration=probe_duration(path) or 0.0, model="none", no_audio=True)
        return engine(ctx, request, params)

    return run


@answers_no_audio
def silero(ctx: EngineContext, request: VadRequest, params: SileroParams) -> VadResult:
    """Speech spans by silero-vad's streaming iterator over 512-sample windows."""
    # torch only here, in the pool child: the worker's main process must never import it.
    import torch
    from silero_vad import VADIterator

    iterator = VADIterator(
        _silero_model(),
        threshold=params.threshold,
        sampling_rate=SAMPLE_RATE,
        min_silence_duration_ms=params.min_silence_ms,
        speech_pad_ms=params.speech_pad_ms,
    )
    spans: list[Span] = []
    start: int | None = None
    windows = _Windows(Path(request.media), SILERO_WINDOW, ctx, "silero-vad")
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


@answers_no_audio
def webrtc(ctx: EngineContext, request: VadRequest, params: WebrtcParams) -> VadResult:
    """Speech spans by webrtcvad on 30 ms frames, with a silence hangover and a minimum length."""
    import webrtcvad

    vad = webrtcvad.Vad(params.aggressiveness)
    frame_s = WEBRTC_FRAME / SAMPLE_RATE
    hangover = max(1, round(params.min_silence_ms / 1000 / frame_s))
    spans: list[Span] = []
    start: int | None = None
    silent_run = 0
    frames = 0
    windows = _Windows(Path(request.media), WEBRTC_FRAME, ctx, "webrtcvad")
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
    spans = [s for s in spans if s.end - s.start >= params.min_speech_ms / 1000]
    return VadResult(spans=spans, duration=duration, model=f"webrtcvad {version('webrtcvad-wheels')}")


@answers_no_audio
def skip(ctx: EngineContext, request: VadRequest, params: NoParams) -> VadResult:
    """No detection at all: the cheapest rung, so that a pipeline still gets its other stages."""
    return VadResult(spans=[], duration=probe_duration(Path(request.media)) or 0.0, model="none", vad_skipped=True)
