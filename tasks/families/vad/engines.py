"""Voice activity detection engines: ``engine(ctx, request, params) -> VadResult``.

Each engine streams the media through :func:`mediafarm.tasks.media.decode.audio_blocks`, so memory
does not grow with the media's length, and reports progress and checks for cancellation once a
block (10 s of audio). silero runs once per block over all of the block's 512-sample windows
(silero-vad's sequence model: the LSTM's state carried inside onnxruntime), not once per window.
Callable without a broker: ``silero(EngineContext.local(), VadRequest(media=...), SileroParams())``.

Resuming (``FamilySpec.resume``, issue #19): silero writes a checkpoint after a block at which no
span is open (the spans so far, the LSTM's state, how many samples it has seen), at most every
``FARM_CHECKPOINT_INTERVAL``. The next attempt decodes the media again from its start (a decode is
cheap next to the model, and only a decode from the start gives the same samples, resampled,
bit for bit) but runs no model on the blocks before the checkpoint. On silero with the same
parameters it goes on with the saved state, so its spans equal a run never stopped; any other
rung (silero with other parameters, webrtc, skip) makes the rest with its own fresh state from the
checkpoint on, and the result's ``made`` says which rung made which part. webrtc writes no
checkpoint: its detector adapts to the audio it has seen and that state cannot be saved (it is
also the cheap rung, ~1 s an hour); skip needs none.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from mediafarm.tasks.families.vad.spec import SileroParams, VadRequest, VadResult, WebrtcParams
from mediafarm.tasks.kit import Checkpoint, EngineContext, NoParams, Span, made_until
from mediafarm.tasks.kit.media import SAMPLE_RATE, audio_blocks, has_audio_stream, probe_duration

SILERO_WINDOW = 512  # samples at 16 kHz: the only window size silero-vad 5+ accepts
SILERO_CONTEXT = 64  # samples of the window before that the model sees with each window
SILERO_SEQUENCE_MODEL = "silero_vad_16k_sequence.onnx"  # shipped in silero-vad >= 6.2
WEBRTC_FRAME = 480  # 30 ms at 16 kHz, one of the three frame sizes webrtcvad accepts
# The checkpoint state's own format (its "vad" key): an attempt that finds another starts over.
STATE_VERSION = 1

log = logging.getLogger(__name__)

# What decodes a file's audio into blocks: audio_blocks, or a KeptAudio's first pass (subtitles).
Decode = Callable[[Path], Iterable[np.ndarray]]


class _Windows:
    """Fixed-size windows across block boundaries, the last one zero-padded.

    ``samples`` counts the real (unpadded) samples seen so far: the media's decoded duration.
    After each decoded block it reports the decode position and checks for cancellation.
    """

    def __init__(
        self, path: Path, size: int, ctx: EngineContext, stage: str, decode: Decode = audio_blocks
    ) -> None:
        self.path, self.size, self.samples, self.decode = path, size, 0, decode
        self.ctx, self.stage = ctx, stage
        self.expected = probe_duration(path)  # from the header; None when the container does not say

    def blocks(self) -> Iterator[np.ndarray]:
        """The windows a decoded block completes, as one ``(n, size)`` array (n >= 1)."""
        size = self.size
        carry = np.zeros(0, dtype=np.float32)
        for block in self.decode(self.path):
            self.samples += block.size
            done = self.samples / SAMPLE_RATE
            self.ctx.progress(done / self.expected if self.expected else None, stage=self.stage, media_seconds=done)
            self.ctx.check_cancelled()
            if carry.size:
                block = np.concatenate([carry, block])
            usable = block.size - block.size % size
            carry = block[usable:]
            if usable:
                yield block[:usable].reshape(-1, size)
        if carry.size:
            yield np.pad(carry, (0, size - carry.size)).reshape(1, size)

    def __iter__(self) -> Iterator[np.ndarray]:
        for windows in self.blocks():
            yield from windows


@functools.lru_cache(maxsize=1)
def silero_model() -> Any:
    """silero-vad's sequence ONNX model, loaded once per child process on first use.

    The same weights as the streaming ``silero_vad.onnx``, exported so that one session call takes
    a whole run of windows, ``(windows, 64 + 512)``, and carries the LSTM's state from window to
    window inside onnxruntime: per-window probabilities equal the streaming model's bit for bit
    (tests/tasks/families/test_vad_batched.py), at a fraction of its per-window Python and session
    overhead. The file is found without importing the ``silero_vad`` package, which imports torch.
    """
    import onnxruntime as ort

    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("silero_vad", name="silero_vad")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / SILERO_SEQUENCE_MODEL
    options = ort.SessionOptions()
    # One thread: a pool runs one child per core, and oversubscription costs more than it gives.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


@functools.cache
def silero_version() -> str:
    # Once per child: a package metadata lookup is ~0.3 ms, a share of a short clip's job (issue #34).
    return f"silero-vad {version('silero-vad')} (onnx)"


@functools.cache
def webrtcvad_version() -> str:
    return f"webrtcvad {version('webrtcvad-wheels')}"


def with_context(windows: np.ndarray, context: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """silero's model input for ``(n, 512)`` windows: each row prefixed with the last 64 samples of
    the window before (``context`` before the first), as silero's ``OnnxWrapper`` builds it window
    by window. Returns the ``(n, 576)`` rows and the context for the next block."""
    rows = np.empty((windows.shape[0], SILERO_CONTEXT + SILERO_WINDOW), dtype=np.float32)
    rows[:, SILERO_CONTEXT:] = windows
    rows[0, :SILERO_CONTEXT] = context
    rows[1:, :SILERO_CONTEXT] = windows[:-1, -SILERO_CONTEXT:]
    return rows, windows[-1, -SILERO_CONTEXT:].copy()


class SpanTracker:
    """silero's ``VADIterator`` decisions over a stream of window probabilities, in samples.

    The same rules, window for window (start: the first window at or above ``threshold``, padded;
    end: after ``min_silence_ms`` below ``threshold - 0.15``, at the first such window, padded), so
    that the farm's spans are the ones its streaming iterator gave before windows were batched.
    """

    def __init__(self, params: SileroParams) -> None:
        self.threshold = params.threshold
        self.negative = params.threshold - 0.15  # VADIterator's, not clamped as get_speech_timestamps does
        self.min_silence = SAMPLE_RATE * params.min_silence_ms / 1000
        self.pad = SAMPLE_RATE * params.speech_pad_ms / 1000
        self.triggered, self.temp_end, self.current = False, 0, 0
        self.start: int | None = None
        self.spans: list[tuple[int, int]] = []

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps to go on exactly: only taken with no span open (``triggered``
        False), when ``start`` and ``temp_end`` hold nothing."""
        assert not self.triggered
        return {"current": self.current, "spans": [list(span) for span in self.spans]}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.current = int(state["current"])
        self.spans = [(int(start), int(end)) for start, end in state["spans"]]

    def cut(self, at: int) -> tuple[int, int] | None:
        """Close the open span at sample ``at`` and open a new one there (a live stream's span too
        long to wait for); the span closed, or None when none is open before ``at``."""
        if not self.triggered or self.start is None or at <= self.start:
            return None
        span = (self.start, at)
        self.spans.append(span)
        self.start = at
        return span

    def close(self, end: int) -> tuple[int, int] | None:
        """The stream ended at sample ``end``: the span open there, closed at it (not added to
        ``spans``), or None; nothing is open afterwards."""
        start = self.start if self.triggered else None
        self.start, self.temp_end, self.triggered = None, 0, False
        return (start, end) if start is not None and end > start else None

    def feed(self, probabilities: Iterable[float]) -> None:
        threshold, negative, window = self.threshold, self.negative, SILERO_WINDOW
        for p in probabilities:
            self.current += window
            if p >= threshold:
                self.temp_end = 0
                if not self.triggered:
                    self.triggered = True
                    self.start = int(max(0, self.current - self.pad - window))
            elif p < negative and self.triggered:
                if not self.temp_end:
                    self.temp_end = self.current
                if self.current - self.temp_end >= self.min_silence:
                    end = int(self.temp_end + self.pad - window)
                    if self.start is not None:
                        self.spans.append((self.start, end))
                    self.start, self.temp_end, self.triggered = None, 0, False


def answers_no_audio(engine: Callable[..., VadResult]) -> Callable[..., VadResult]:
    """An engine that, for a request with ``if_no_audio="empty"``, answers a media file without an
    audio track with no spans and ``no_audio`` set instead of failing on it."""

    @functools.wraps(engine)
    def run(ctx: EngineContext, request: VadRequest, params: Any, **options: Any) -> VadResult:
        path = Path(request.media)
        if request.if_no_audio == "empty" and not has_audio_stream(path):
            return VadResult(spans=[], duration=probe_duration(path) or 0.0, model="none", no_audio=True)
        return engine(ctx, request, params, **options)

    return run


class _Misaligned(Exception):
    """A checkpoint's sample count falls inside a decoded block: the media changed since."""


def silero_rows(windows: _Windows, skip: int = 0) -> Iterator[np.ndarray]:
    """The model's input rows, one ``(n, 576)`` array per decoded block; the blocks of the first
    ``skip`` samples are decoded but not yielded (a resumed attempt's run-in).

    Raises:
        _Misaligned: ``skip`` falls inside a block.
    """
    context = np.zeros(SILERO_CONTEXT, dtype=np.float32)  # zeros before the first window, as silero's
    fed = 0
    for block in windows.blocks():
        rows, context = with_context(block, context)
        fed += block.size
        if fed <= skip:
            continue
        if fed - block.size < skip:
            raise _Misaligned(f"a checkpoint at sample {skip} falls inside a block ({fed - block.size} to {fed})")
        yield rows


@answers_no_audio
def silero(
    ctx: EngineContext, request: VadRequest, params: SileroParams, *, resumable: bool = True,
    decode: Decode = audio_blocks,
) -> VadResult:  # fmt: skip
    """Speech spans by silero-vad, one ONNX call per decoded block (10 s, ~312 windows).

    ``resumable=False``: no checkpoint is read or written, for another family's engine that runs
    the VAD inside its own job (subtitle): that job's checkpoints are its engine's. ``decode``: what
    reads the media's audio (a subtitle job keeps what it decodes here for its second pass).
    """
    resume = _Resumed.of(ctx.resume) if resumable else None
    try:
        return _silero(ctx, request, params, resume, resumable, decode)
    except _Misaligned as exc:
        log.warning("job %s: %s; the VAD starts over", ctx.job_id, exc)
        return _silero(ctx, request, params, None, resumable, decode)


def _silero(
    ctx: EngineContext, request: VadRequest, params: SileroParams, resume: _Resumed | None, resumable: bool,
    decode: Decode,
) -> VadResult:  # fmt: skip
    session = silero_model()
    identity = {"engine": "silero", "params": params.model_dump(mode="json")}
    tracker = SpanTracker(params)
    windows = _Windows(Path(request.media), SILERO_WINDOW, ctx, "silero-vad", decode)
    h = np.zeros((1, 1, 128), dtype=np.float32)  # the LSTM's state, carried from block to block
    c = np.zeros((1, 1, 128), dtype=np.float32)
    own = _Own.fresh()
    if resume is not None:
        own = resume.own_part(identity)
        tracker.current = resume.samples
        if own.exact:  # the same detector goes on: its own state, as if it had never stopped
            tracker.restore(resume.state["tracker"])
            h, c = _array(resume.state["h"]), _array(resume.state["c"])
    for rows in silero_rows(windows, resume.samples if resume is not None else 0):
        probabilities, h, c = session.run(["speech_probs", "hn", "cn"], {"input": rows, "h": h, "c": c})
        tracker.feed(probabilities.reshape(-1).tolist())
        if resumable and not tracker.triggered and ctx.checkpoint_due():
            # Between spans only: every span before here is final, and any rung can take over here.
            ctx.checkpoint(tracker.current / SAMPLE_RATE, {
                "vad": STATE_VERSION, **identity, "samples": tracker.current, "from": own.start,
                "before": own.before, "model": _models(own.model, silero_version()), "tracker": tracker.state(),
                "h": h.reshape(-1).tolist(), "c": c.reshape(-1).tolist(),
            })  # fmt: skip
    duration = windows.samples / SAMPLE_RATE
    spans = [Span(start / SAMPLE_RATE, end / SAMPLE_RATE) for start, end in tracker.spans]
    if tracker.start is not None:  # speech runs to the end of the media
        spans.append(Span(tracker.start / SAMPLE_RATE, duration))
    spans = [Span(s.start, min(s.end, duration)) for s in spans if s.start < duration]
    return own.result(ctx, spans, duration, silero_version())


def _array(values: list[float]) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).reshape(1, 1, 128)


def _models(before: str, mine: str) -> str:
    """The result's model: each detector that made a part, once, in order."""
    names = [m for m in before.split(" + ") if m] if before else []
    return " + ".join(names if mine in names else [*names, mine])


@dataclass(frozen=True)
class _Resumed:
    """A VAD checkpoint, checked: where it is, its state, the parts made so far."""

    checkpoint: Checkpoint
    samples: int

    @property
    def state(self) -> Mapping[str, Any]:
        return self.checkpoint.state

    @classmethod
    def of(cls, checkpoint: Checkpoint | None) -> _Resumed | None:
        if checkpoint is None:
            return None
        state = checkpoint.state
        if state.get("vad") != STATE_VERSION or not isinstance(state.get("samples"), int):
            log.warning("VAD checkpoint state of another format (%r); starting over", state.get("vad"))
            return None
        return cls(checkpoint, state["samples"])

    def own_part(self, identity: Mapping[str, Any]) -> _Own:
        """This attempt's part: the same detector as the checkpoint's (engine and parameters) goes
        on with its state; any other starts afresh here, after the spans made so far."""
        state = self.state
        if {"engine": state.get("engine"), "params": state.get("params")} == dict(identity):
            return _Own(True, int(state["from"]), [list(s) for s in state["before"]], str(state["model"]), self)
        tracker = state["tracker"]
        earlier = [list(s) for s in state["before"]]
        earlier += [[start / SAMPLE_RATE, end / SAMPLE_RATE] for start, end in tracker["spans"]]
        return _Own(False, self.samples, earlier, str(state["model"]), self)


@dataclass(frozen=True)
class _Own:
    """What this attempt's detector adds to: the spans that others made before it took over
    (``before``, seconds), from which sample it detects (``start``), and whether it goes on with
    the checkpoint's own detector state (``exact``)."""

    exact: bool
    start: int
    before: list[list[float]]
    model: str
    resumed: _Resumed | None

    @classmethod
    def fresh(cls) -> _Own:
        return cls(False, 0, [], "", None)

    def result(self, ctx: EngineContext, spans: list[Span], duration: float, model: str) -> VadResult:
        """The whole media's result: the spans made before, then this detector's from where it
        took over (none starting before the last earlier one ends: no overlap at the join)."""
        if self.resumed is None:
            return VadResult(spans=spans, duration=duration, model=model)
        mine = spans
        if self.before or self.start:  # a detector that took over mid-way: nothing of its before the join
            floor = max([self.start / SAMPLE_RATE] + [end for _, end in self.before])
            mine = [Span(max(s.start, floor), s.end) for s in spans if s.end > floor]
        earlier = [Span(start, end) for start, end in self.before]
        return VadResult(spans=earlier + mine, duration=duration, model=_models(self.model, model),
                         made=list(made_until(self.resumed.checkpoint, ctx.rung, duration)))  # fmt: skip


@answers_no_audio
def webrtc(
    ctx: EngineContext, request: VadRequest, params: WebrtcParams, *, resumable: bool = True,
    decode: Decode = audio_blocks,
) -> VadResult:  # fmt: skip
    """Speech spans by webrtcvad on 30 ms frames, with a silence hangover and a minimum length.

    Writes no checkpoint (module docstring); resumed from another rung's, it detects from the
    first whole frame after it, the frames before decoded only. ``resumable``, ``decode``: as silero's."""
    import webrtcvad

    resume = _Resumed.of(ctx.resume) if resumable else None
    own = resume.own_part({"engine": "webrtc"}) if resume is not None else _Own.fresh()
    first = -(-own.start // WEBRTC_FRAME)  # the first frame that starts at or after the take-over
    vad = webrtcvad.Vad(params.aggressiveness)
    frame_s = WEBRTC_FRAME / SAMPLE_RATE
    hangover = max(1, round(params.min_silence_ms / 1000 / frame_s))
    spans: list[Span] = []
    start: int | None = None
    silent_run = 0
    frames = 0
    windows = _Windows(Path(request.media), WEBRTC_FRAME, ctx, "webrtcvad", decode)
    for window in windows:
        if frames < first:
            frames += 1
            continue
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
    return own.result(ctx, spans, duration, webrtcvad_version())


@answers_no_audio
def skip(ctx: EngineContext, request: VadRequest, params: NoParams) -> VadResult:
    """No detection at all: the cheapest rung, so that a pipeline still gets its other stages.
    Resumed, it keeps the spans made before and detects nothing after (``made`` says so)."""
    duration = probe_duration(Path(request.media)) or 0.0
    resume = _Resumed.of(ctx.resume)
    if resume is None:
        return VadResult(spans=[], duration=duration, model="none", vad_skipped=True)
    own = resume.own_part({"engine": "skip"})
    return own.result(ctx, [], duration, "none").model_copy(update={"vad_skipped": True})
