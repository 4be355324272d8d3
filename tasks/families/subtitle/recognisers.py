"""Speech recognisers for the subtitle family: faster-whisper (CTranslate2) and pocketsphinx.

Plain functions, imported only in pool children. Each recogniser takes one speech span, cut out
of the media by the caller (after VAD), as float32 mono samples at 16 kHz, plus the span's start
``offset`` on the media clock, and returns a :class:`Recognition` whose times are all on the media
clock. Models load lazily, once per child process (``functools.lru_cache``), never in the worker's
main process, and never from a hub: a model the pool does not have is :class:`RungUnavailable`.

Usage::

    model = load_whisper(Path("/models/whisper-tiny.en"))
    recognition = transcribe_whisper(model, samples, offset=span.start)
"""

from __future__ import annotations

import contextlib
import functools
import re
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mediafarm.tasks.families.subtitle.records import Segment, Word
from mediafarm.tasks.kit import RungUnavailable, raise_if_out_of_memory
from mediafarm.tasks.kit.media import SAMPLE_RATE

if TYPE_CHECKING:
    from faster_whisper import WhisperModel
    from pocketsphinx import Decoder

WHISPER_DEVICES = ("cpu", "cuda")
# Words further apart than this start a new pocketsphinx segment (it has no segments of its own).
POCKETSPHINX_PAUSE_SECONDS = 0.5
# pocketsphinx fillers and sentence markers: <s>, </s>, <sil>, [NOISE], ++BREATH++ (older models).
_FILLER = re.compile(r"^(<.*>|\[.*\]|\+\+.*\+\+)$")
# An alternate pronunciation in CMUdict: "the(2)" is the word "the".
_ALTERNATE = re.compile(r"\(\d+\)$")


@dataclass(frozen=True)
class Recognition:
    """What a recogniser heard in one speech span.

    Attributes:
        segments: The span's segments, in order, each with at least one word; seconds on the media clock.
        language: The language spoken (an ISO 639-1 code, e.g. "en").
        language_probability: The recogniser's confidence in ``language``; None when it does not say.
        model: The recogniser and its model, with versions, for the job's result.
        unsure: The recogniser doubts its own decode of the span: Whisper gave a segment an average
            log-probability under ``UNSURE_LOG_PROB`` (the threshold its own temperature fallback
            uses). False where the recogniser does not say.
    """

    segments: list[Segment]
    language: str
    language_probability: float | None
    model: str
    unsure: bool = False


# Whisper's own log_prob_threshold: a decode whose average log-probability is under it is one its
# temperature fallback would do again (the farm decodes at temperature 0 only: second_look.py).
UNSURE_LOG_PROB = -1.0


# ---------------------------------------------------------------------------------------------
# faster-whisper

# Labels for loaded models, kept beside them: a WhisperModel does not remember its folder.
_WHISPER_LABELS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def load_whisper(
    model_dir: Path, device: str = "cpu", compute_type: str = "int8", cpu_threads: int = 1
) -> WhisperModel:
    """A faster-whisper model from a CTranslate2 folder, loaded once per process per arguments.

    Raises:
        RungUnavailable: the folder is missing or lacks
            ``model.bin`` or ``tokenizer.json``; CTranslate2 cannot load it (corrupt file,
            compute type the device cannot do); ``device="cuda"`` with no usable CUDA device.
        ResourceFailure: out of memory while loading.
        ValueError: a device other than "cpu" or "cuda" (a configuration bug, not a pool's lack).
    """
    if device not in WHISPER_DEVICES:
        raise ValueError(f"device must be one of {WHISPER_DEVICES}, not {device!r}")
    return _load_whisper(Path(model_dir).expanduser().resolve(), device, compute_type, cpu_threads)


# One model per child: a child's memory cap is sized for one, and loading the next (a smaller
# rung after an OOM) evicts this one.
@functools.lru_cache(maxsize=1)
def _load_whisper(model_dir: Path, device: str, compute_type: str, cpu_threads: int) -> WhisperModel:
    import ctranslate2

    if not model_dir.is_dir():
        raise RungUnavailable(f"no Whisper model folder at {model_dir}")
    # Without tokenizer.json faster-whisper fetches one from the hub: refuse before it tries.
    missing = [name for name in ("model.bin", "tokenizer.json") if not (model_dir / name).is_file()]
    if missing:
        raise RungUnavailable(f"Whisper model folder {model_dir} lacks {', '.join(missing)}")
    if device == "cuda" and _cuda_device_count(ctranslate2) == 0:
        raise RungUnavailable("device 'cuda' asked for, but CTranslate2 sees no CUDA device on this pool")
    try:
        model = _fitting_model_class()(
            str(model_dir),
            device=device,
            compute_type=compute_type,
            cpu_threads=cpu_threads,
            local_files_only=True,
        )
    except (RuntimeError, ValueError, OSError) as exc:
        raise_if_out_of_memory(exc, device, "CTranslate2")
        raise RungUnavailable(f"CTranslate2 cannot load the Whisper model at {model_dir}: {exc}") from exc
    _WHISPER_LABELS[model] = (
        f"faster-whisper {version('faster-whisper')} {model_dir.name} "
        f"({compute_type}, {device}, ctranslate2 {version('ctranslate2')})"
    )
    return model


# The encoder sees a call's audio and this much silence after it (rounded up to whole seconds),
# not the 30 s faster-whisper pads every call to. The encoder's cost grows faster than its input
# (attention is quadratic), so a short call costs far less than a padded one. The silence is there
# because Whisper learnt to find the end of speech in padding; with much less of it, tiny.en ran on
# in loops now and then (measured: docs/benchmarks/subtitle.md, "Fitted encoder").
ENCODER_TAIL_SECONDS = 4.0
FULL_CONTEXT_FRAMES = 3000  # 30 s of 10 ms mel frames: Whisper's whole context
# faster-whisper's own compression_ratio_threshold: text that gzip compresses better than this is
# repeating itself. A fitted decode that does is done again with the whole context.
REPEATS_ABOVE = 2.4


def encoder_frames(samples: int, *, fit: bool = True) -> int:
    """The mel frames the encoder is given for a call of ``samples`` (16 kHz): the audio and
    ``ENCODER_TAIL_SECONDS`` rounded up to whole seconds, at most the whole 30 s context."""
    if not fit:
        return FULL_CONTEXT_FRAMES
    seconds = -(-(samples + round(ENCODER_TAIL_SECONDS * SAMPLE_RATE)) // SAMPLE_RATE)
    return min(FULL_CONTEXT_FRAMES, 100 * seconds)


@functools.cache
def _fitting_model_class() -> type[WhisperModel]:
    """faster-whisper's ``WhisperModel`` whose encoder can be given less than 30 s (faster-whisper
    pads every window's features to 30 s; CTranslate2's encoder takes any length)."""
    from faster_whisper import WhisperModel

    class FittingWhisperModel(WhisperModel):
        # Set by _fitted for the length of one call; None is faster-whisper's own 30 s.
        frames: int | None = None

        def encode(self, features: np.ndarray) -> Any:
            if self.frames is not None and features.shape[-1] > self.frames:
                features = features[..., : self.frames]  # only padding is cut: frames >= the call's audio
            return super().encode(features)

    return FittingWhisperModel


@contextlib.contextmanager
def _fitted(model: WhisperModel, frames: int) -> Iterator[None]:
    """Within: ``model`` (from :func:`load_whisper`) encodes ``frames`` mel frames, not 30 s."""
    try:
        model.frames = frames if frames < FULL_CONTEXT_FRAMES else None  # type: ignore[attr-defined]
        yield
    finally:
        model.frames = None  # type: ignore[attr-defined]


def _cuda_device_count(ctranslate2: Any) -> int:
    # Raises on a machine whose driver is older than CTranslate2's CUDA runtime: no usable device.
    try:
        return int(ctranslate2.get_cuda_device_count())
    except RuntimeError:
        return 0


def transcribe_whisper(
    model: WhisperModel,
    audio: np.ndarray,
    *,
    offset: float,
    language: str | None = None,
    beam_size: int = 1,
    fit_context: bool = False,
) -> Recognition:
    """Recognise one speech span with Whisper.

    Args:
        model: From :func:`load_whisper`.
        audio: The span's samples, float32 mono at 16 kHz.
        offset: The span's start, seconds on the media clock; added to every time.
        language: An ISO 639-1 code, or None to let a multilingual model detect it.
        beam_size: 1 is greedy decoding, the fastest.
        fit_context: The encoder sees the span and a few seconds of silence
            (:func:`encoder_frames`), not 30 s; a decode that then repeats itself is done again
            with the whole 30 s. False (the default): always the whole 30 s, as faster-whisper does.
    """
    samples = _mono_float32(audio)
    duration = samples.size / SAMPLE_RATE
    label = _WHISPER_LABELS.get(model, f"faster-whisper {version('faster-whisper')}")
    frames = encoder_frames(samples.size, fit=fit_context)
    raw_segments, info = _decode_whisper(model, samples, frames, language, beam_size)
    if frames < FULL_CONTEXT_FRAMES and _repeats(raw_segments):
        raw_segments, info = _decode_whisper(model, samples, FULL_CONTEXT_FRAMES, language, beam_size)
    segments = [segment for raw in raw_segments if (segment := _whisper_segment(raw, offset, duration))]
    return Recognition(
        segments=segments,
        language=info.language,
        language_probability=float(info.language_probability),
        model=label,
        unsure=any(raw.avg_logprob < UNSURE_LOG_PROB for raw in raw_segments),
    )


def _repeats(raw_segments: Sequence[Any]) -> bool:
    return any(raw.compression_ratio > REPEATS_ABOVE for raw in raw_segments)


def _repeats_text(text: str) -> bool:
    from faster_whisper.transcribe import get_compression_ratio

    return bool(text) and get_compression_ratio(text) > REPEATS_ABOVE


def _decode_whisper(
    model: WhisperModel, samples: np.ndarray, frames: int, language: str | None, beam_size: int
) -> tuple[list[Any], Any]:
    """faster-whisper's own segments and info for one window, its encoder given ``frames``."""
    try:
        with _fitted(model, frames):
            raw_segments, info = model.transcribe(
                samples,
                language=language,
                beam_size=beam_size,
                word_timestamps=True,
                vad_filter=False,  # the caller already cut the media at VAD's speech spans
                # Each window decoded on its own: a wrong window cannot seed a hallucination loop.
                condition_on_previous_text=False,
                # Greedy/beam at temperature 0 only. The default fallback re-decodes a window at five
                # higher temperatures when its text compresses well (repetitive speech): several times
                # slower, random, and measured to drop whole windows (docs/benchmarks/subtitle.md).
                temperature=0.0,
            )
            return list(raw_segments), info  # decoding is lazy: it runs here, inside the fitted context
    except RuntimeError as exc:  # decoding is lazy: CUDA OOM surfaces while iterating
        raise_if_out_of_memory(exc, str(getattr(model.model, "device", "cpu")), "CTranslate2")
        raise


def transcribe_whisper_batch(
    model: WhisperModel,
    audios: Sequence[np.ndarray],
    *,
    language: str | None = None,
    beam_size: int = 1,
    batch_size: int = 8,
    fit_context: bool = False,
) -> list[Recognition]:
    """Recognise several windows (each at most 30 s) in batches of ``batch_size``: one encoder
    call and one batched decode per batch (faster-whisper's ``BatchedInferencePipeline`` with
    the windows as its clips). A GPU runs a batch in about the time of one window.

    Each window is decoded in one pass with timestamps and word timestamps, at temperature 0,
    without the previous window's text, like :func:`transcribe_whisper`; unlike it, a window is
    not decoded again from its last timestamp when the decode stops early. Times are seconds from
    each window's own start. Returns one :class:`Recognition` per window, in order.

    ``fit_context``: the encoder sees the longest window of the call and a few seconds of silence,
    not 30 s (as :func:`transcribe_whisper`); a window whose text then repeats itself is recognised
    again alone, with the whole 30 s.
    """
    samples = [_mono_float32(a) for a in audios]
    label = _WHISPER_LABELS.get(model, f"faster-whisper {version('faster-whisper')}")
    if not samples:
        return []
    if any(s.size == 0 for s in samples):
        raise ValueError("every window must hold audio; got an empty one")
    # The windows side by side on one clock, each one clip: clip i starts at starts[i] seconds.
    sizes = np.array([s.size for s in samples])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]) / SAMPLE_RATE
    clips = [{"start": float(a), "end": float(a + n / SAMPLE_RATE)} for a, n in zip(starts, sizes, strict=True)]
    frames = encoder_frames(int(sizes.max()), fit=fit_context)
    per_window: list[list[Segment]] = [[] for _ in samples]
    unsure = [False for _ in samples]
    texts: list[list[str]] = [[] for _ in samples]
    try:
        with _fitted(model, frames):  # the pipeline decodes lazily: every batch runs inside
            raw_segments, info = _pipeline(model).transcribe(
                np.concatenate(samples),
                language=language,
                beam_size=beam_size,
                word_timestamps=True,
                vad_filter=False,  # the clips are the windows the caller cut at VAD's speech spans
                clip_timestamps=clips,
                # With timestamps: decoded without them Whisper drops whole stretches of a long window.
                without_timestamps=False,
                temperature=0.0,
                condition_on_previous_text=False,
                batch_size=batch_size,
            )
            for raw in raw_segments:
                # A segment's seek is its clip's start in frames (its times are on the joined clock).
                i = int(np.argmin(np.abs(starts * model.frames_per_second - raw.seek)))
                unsure[i] = unsure[i] or raw.avg_logprob < UNSURE_LOG_PROB
                texts[i].append(raw.text)
                shifted = _whisper_segment(raw, -starts[i], sizes[i] / SAMPLE_RATE, shift_first=True)
                if shifted:
                    per_window[i].append(shifted)
    except RuntimeError as exc:
        raise_if_out_of_memory(exc, str(getattr(model.model, "device", "cpu")), "CTranslate2")
        raise
    heard = [
        Recognition(segments=segments, language=info.language,
                    language_probability=float(info.language_probability), model=label, unsure=doubt)
        for segments, doubt in zip(per_window, unsure, strict=True)
    ]  # fmt: skip
    if frames < FULL_CONTEXT_FRAMES:
        # The pipeline scores each timestamped piece alone; a loop of short pieces only shows whole.
        for i in (i for i, t in enumerate(texts) if _repeats_text("".join(t))):
            heard[i] = transcribe_whisper(model, samples[i], offset=0.0, language=language, beam_size=beam_size,
                                          fit_context=False)  # fmt: skip
    return heard


# One pipeline per loaded model (it only holds the model and a timestamp).
_PIPELINES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _pipeline(model: WhisperModel) -> Any:
    from faster_whisper import BatchedInferencePipeline

    if model not in _PIPELINES:
        _PIPELINES[model] = BatchedInferencePipeline(model)
    return _PIPELINES[model]


def _whisper_segment(raw: Any, offset: float, duration: float, *, shift_first: bool = False) -> Segment | None:
    """One faster-whisper segment on the media clock, or None when it has no word (``shift_first``:
    the offset moves the raw times onto the span's clock before they are clamped to it)."""
    words: list[Word] = []
    for raw_word in raw.words or ():
        text = raw_word.word.strip()
        if not text:
            continue
        # A hallucinated timestamp can point past the span's end: keep every time inside the span.
        if shift_first:
            start, end = _clamp(raw_word.start + offset, duration), _clamp(raw_word.end + offset, duration)
        else:
            start = offset + _clamp(raw_word.start, duration)
            end = offset + _clamp(raw_word.end, duration)
        words.append(Word(text=text, start=start, end=max(start, end), probability=float(raw_word.probability)))
    if not words:
        return None
    # The text from the words themselves, so that text and words can never disagree.
    return Segment(start=words[0].start, end=words[-1].end, text=" ".join(w.text for w in words), words=words)


# ---------------------------------------------------------------------------------------------
# pocketsphinx


@functools.lru_cache(maxsize=1)
def load_pocketsphinx() -> Decoder:
    """pocketsphinx's decoder with the US English model inside its wheel, once per process.

    Raises:
        RungUnavailable: its bundled model cannot be loaded.
    """
    from pocketsphinx import Decoder

    try:
        # "ERROR": its INFO log writes hundreds of lines to stderr per load.
        decoder = Decoder(samprate=SAMPLE_RATE, loglevel="ERROR")
    except (RuntimeError, ValueError, OSError) as exc:
        raise RungUnavailable(f"pocketsphinx cannot load its bundled en-US model: {exc}") from exc
    return decoder


def transcribe_pocketsphinx(decoder: Decoder, audio: np.ndarray, *, offset: float) -> Recognition:
    """Recognise one speech span with pocketsphinx: one utterance, split into segments at pauses.

    Args:
        decoder: From :func:`load_pocketsphinx`.
        audio: The span's samples, float32 mono at 16 kHz.
        offset: The span's start, seconds on the media clock; added to every time.
    """
    samples = _mono_float32(audio)
    duration = samples.size / SAMPLE_RATE
    model = f"pocketsphinx {version('pocketsphinx')} en-us"
    if samples.size == 0:  # process_raw fails on an empty buffer
        return Recognition(segments=[], language="en", language_probability=None, model=model)
    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()
    frame_rate = float(decoder.config["frate"])  # frames a second, 100 by default
    decoder.start_utt()
    try:
        decoder.process_raw(pcm, full_utt=True)
    finally:
        decoder.end_utt()  # the cached decoder must be ready for the child's next span

    words: list[Word] = []
    for seg in decoder.seg() or ():  # None when a too-short span gave no hypothesis at all
        if _FILLER.match(seg.word):
            continue
        text = _ALTERNATE.sub("", seg.word)
        start = offset + _clamp(seg.start_frame / frame_rate, duration)
        end = offset + _clamp((seg.end_frame + 1) / frame_rate, duration)  # end_frame is inclusive
        # No probability: seg.prob is only a posterior when lattice posteriors are computed.
        words.append(Word(text=text, start=start, end=max(start, end)))

    segments: list[Segment] = []
    group: list[Word] = []
    for word in words:
        if group and word.start - group[-1].end > POCKETSPHINX_PAUSE_SECONDS:
            segments.append(_segment_of(group))
            group = []
        group.append(word)
    if group:
        segments.append(_segment_of(group))
    return Recognition(
        segments=segments,
        language="en",
        language_probability=None,
        model=model,
    )


def _segment_of(words: list[Word]) -> Segment:
    return Segment(start=words[0].start, end=words[-1].end, text=" ".join(w.text for w in words), words=words)


# ---------------------------------------------------------------------------------------------


def _mono_float32(audio: np.ndarray) -> np.ndarray:
    samples = np.asarray(audio, dtype=np.float32)
    if samples.ndim != 1:
        raise ValueError(f"audio must be mono (one dimension), got shape {samples.shape}")
    return np.ascontiguousarray(samples)


def _clamp(seconds: float, duration: float) -> float:
    return min(max(float(seconds), 0.0), duration)
