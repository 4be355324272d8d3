"""Speech audio out: pieces joined without clicks (:class:`Joiner`), encoded as they come (:class:`Encoder`).

Joining: every piece an engine speaks is trimmed of its own leading and trailing silence, faded in
and out over a few milliseconds (so every join starts and ends at zero: no click, whatever the
waveform was doing), and separated from the previous one by a short silence, longer between
sentences than inside one. The joiner counts samples, so the times it reports are where each piece
really is in the final audio.

Encoding: WAV (16-bit PCM), Ogg Opus or MP3 through PyAV, written block by block, so a long text
never holds its whole audio in memory. The story this farm learnt from (a TTS service that leaked
FFmpeg contexts until it could allocate none) is why every container and codec context here is
opened and closed by a ``with`` block, on every path: success, an engine's exception, or the
generator being closed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import av
import numpy as np

from mediafarm.tasks.families.tts.spec import AudioFormat

EXTENSION: dict[str, str] = {"wav": "wav", "opus": "ogg", "mp3": "mp3"}
# Container and codec per format. Opus encodes only at 8/12/16/24/48 kHz: everything goes to 48.
_CODECS: dict[str, tuple[str, str, int | None]] = {
    "wav": ("wav", "pcm_s16le", None),
    "opus": ("ogg", "libopus", 48000),
    "mp3": ("mp3", "libmp3lame", None),
}
BITRATE = {"opus": 48_000, "mp3": 96_000}
_STREAMING_OPTIONS: dict[str, dict[str, str]] = {"ogg": {"page_duration": "100000"}}


@dataclass(frozen=True)
class Placed:
    """Where one piece landed in the output, in samples. Attributes: sentence, start, end."""

    sentence: int
    start: int
    end: int


class Joiner:
    """Joins spoken pieces into one track, chunk after chunk, and says where each piece landed.

    Args:
        rate: Sample rate of the engine's audio (and the track's).
        speed: The job's speed; the silences between pieces scale with it.
        sentence_gap: Seconds of silence between sentences (at speed 1).
        piece_gap: Seconds between the pieces of one long sentence.
        fade: Seconds of fade at each end of a piece.
    """

    # A piece's edges are "silent" below this fraction of its peak.
    TRIM_RELATIVE = 0.02

    def __init__(self, rate: int, *, speed: float = 1.0, sentence_gap: float = 0.3, piece_gap: float = 0.12,
                 fade: float = 0.008) -> None:  # fmt: skip
        self.rate = rate
        self.sentence_gap = int(round(sentence_gap / speed * rate))
        self.piece_gap = int(round(piece_gap / speed * rate))
        self.fade = max(1, int(round(fade * rate)))
        self.samples = 0  # written so far
        self._last_sentence: int | None = None

    @property
    def last_sentence(self) -> int | None:
        """The sentence of the last piece joined (None before the first): the next gap's length."""
        return self._last_sentence

    def resume(self, samples: int, last_sentence: int | None) -> None:
        """Go on after ``samples`` of track whose last piece was of ``last_sentence`` (a checkpoint's)."""
        self.samples, self._last_sentence = samples, last_sentence

    def join(self, sentences: Sequence[int], audios: Sequence[np.ndarray]) -> tuple[np.ndarray, list[Placed]]:
        """One chunk's pieces (their sentence indexes and waveforms) as the track's next samples."""
        parts: list[np.ndarray] = []
        placed: list[Placed] = []
        position = self.samples
        for sentence, audio in zip(sentences, audios, strict=True):
            if self._last_sentence is not None:
                gap = self.piece_gap if sentence == self._last_sentence else self.sentence_gap
                parts.append(np.zeros(gap, dtype=np.float32))
                position += gap
            voiced = self._shape(audio)
            parts.append(voiced)
            placed.append(Placed(sentence, position, position + voiced.size))
            position += voiced.size
            self._last_sentence = sentence
        samples = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
        self.samples = position
        return samples, placed

    def _shape(self, audio: np.ndarray) -> np.ndarray:
        audio = np.nan_to_num(np.asarray(audio, dtype=np.float32).reshape(-1))
        audio = np.clip(audio, -1.0, 1.0)
        peak = float(np.abs(audio).max()) if audio.size else 0.0
        if peak > 0:
            loud = np.flatnonzero(np.abs(audio) >= peak * self.TRIM_RELATIVE)
            audio = audio[loud[0] : loud[-1] + 1]
        audio = audio.copy()
        n = min(self.fade, audio.size // 2)
        if n:
            ramp = (0.5 - 0.5 * np.cos(np.linspace(0.0, np.pi, n, dtype=np.float32))).astype(np.float32)
            audio[:n] *= ramp
            audio[-n:] *= ramp[::-1]
        return audio


class Encoder:
    """Float32 mono samples → a WAV / Ogg Opus / MP3 file (or file object), block by block, through PyAV.

    A context manager: ``__exit__`` flushes the encoder when the block ended cleanly and closes
    the container on every path (FFmpeg frees a context only when it is closed).
    """

    def __init__(self, path: Path | BinaryIO, fmt: AudioFormat, rate: int) -> None:
        container_format, self.codec, out_rate = _CODECS[fmt]
        self.fmt, self.in_rate = fmt, rate
        self.rate = out_rate or rate
        # A file object (anything with ``write``) gets the bytes as they are muxed: the gateway
        # streams them to its client, so Ogg pages are cut every 100 ms of audio instead of every
        # second (FFmpeg's default, which would hold back a short first chunk's audio).
        streaming = hasattr(path, "write")
        options = _STREAMING_OPTIONS.get(container_format, {}) if streaming else {}
        self._container = av.open(path if streaming else str(path), mode="w", format=container_format, options=options)
        try:
            self._stream = self._container.add_stream(self.codec, rate=self.rate, layout="mono")
            if fmt in BITRATE:
                self._stream.bit_rate = BITRATE[fmt]
            codec_format = self._stream.codec_context.format.name
            frame_size = self._stream.codec_context.frame_size or None
            # One resampler does the rate, the sample format and the encoder's fixed frame size.
            self._resampler = av.AudioResampler(format=codec_format, layout="mono", rate=self.rate,
                                                frame_size=frame_size)  # fmt: skip
        except BaseException:
            self._container.close()
            raise
        self._pts = 0
        self._in_pts = 0

    def __enter__(self) -> Encoder:
        return self

    def write(self, samples: np.ndarray) -> None:
        """Encode the next samples (float32 mono in [-1, 1], or int16 PCM, at the rate given)."""
        if samples.dtype == np.int16:
            samples, layout = np.ascontiguousarray(samples).reshape(1, -1), "s16"
        else:
            samples = np.ascontiguousarray(np.clip(samples, -1.0, 1.0), dtype=np.float32).reshape(1, -1)
            layout = "flt"
        if not samples.size:
            return
        frame = av.AudioFrame.from_ndarray(samples, format=layout, layout="mono")
        frame.sample_rate = self.in_rate
        frame.pts, frame.time_base = self._in_pts, Fraction(1, self.in_rate)
        self._in_pts += samples.shape[1]
        self._encode(self._resampler.resample(frame))

    def _encode(self, frames: Sequence[av.AudioFrame]) -> None:
        for out in frames:
            out.pts, out.time_base = self._pts, Fraction(1, self.rate)
            self._pts += out.samples
            self._container.mux(self._stream.encode(out))

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if kind is None:
                self._encode(self._resampler.resample(None))
                self._container.mux(self._stream.encode(None))
        finally:
            self._container.close()


def pcm16(samples: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] as 16-bit PCM, rounded as FFmpeg's float-to-s16 conversion rounds
    (to nearest, clipped): a chunk's WAV holds exactly these values, so a resumed job that feeds
    the kept chunks back into its encoder gives it what an unkilled run gave it."""
    return np.clip(np.rint(np.asarray(samples, dtype=np.float32) * 32768.0), -32768, 32767).astype(np.int16)


def encode(path: Path, fmt: AudioFormat, rate: int, samples: np.ndarray) -> None:
    """One whole buffer to a file (a chunk's WAV)."""
    with Encoder(path, fmt, rate) as encoder:
        encoder.write(samples)
