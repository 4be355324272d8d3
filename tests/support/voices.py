"""Audio measures for the dialogue tests and bench: where the speech is, and how alike two voices are.

Voice distance is the distance in semitones between the two clips' median pitch (F0): 40 ms frames
every 10 ms, each frame's autocorrelation peak between 60 and 400 Hz, frames counted as voiced
when that peak holds at least 30 % of the frame's energy and the frame is not quiet. A voice keeps
its pitch range whatever it says; two of the farm's speakers get distinct voices (espeak-ng
variants, Piper pitch factors), which move it. Mean MFCC vectors (``mean_mfcc``, c1-c12 over the
speech frames) were tried first and measured here: on one- or two-second lines they follow what is
said more than who says it (two espeak-ng variants: same voice up to 30.2 apart, two voices from
30.3), so they are kept for reference only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _mel(hz: np.ndarray) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + hz / 700.0)


def _mel_filters(rate: int, n_fft: int, bands: int = 26, top: float = 8000.0) -> np.ndarray:
    edges_mel = np.linspace(0.0, _mel(np.array(min(top, rate / 2))), bands + 2)
    edges = 700.0 * (10 ** (edges_mel / 2595.0) - 1.0)
    bins = np.fft.rfftfreq(n_fft, 1.0 / rate)
    filters = np.zeros((bands, bins.size))
    for b in range(bands):
        low, mid, high = edges[b : b + 3]
        filters[b] = np.clip(np.minimum((bins - low) / (mid - low), (high - bins) / (high - mid)), 0.0, None)
    return filters


def mean_mfcc(samples: np.ndarray, rate: int, coefficients: int = 12) -> np.ndarray:
    """The mean MFCC vector (c1..c12) of the speech frames of ``samples`` (float mono at ``rate``)."""
    samples = np.asarray(samples, dtype=np.float64).reshape(-1)
    frame, hop, n_fft = int(0.025 * rate), int(0.010 * rate), 1024
    count = 1 + (samples.size - frame) // hop
    index = np.arange(frame)[None, :] + hop * np.arange(count)[:, None]
    frames = samples[index] * np.hamming(frame)
    power = np.abs(np.fft.rfft(frames, n_fft)) ** 2
    energies = np.log(power @ _mel_filters(rate, n_fft).T + 1e-10)
    bands = energies.shape[1]
    dct = np.cos(np.pi / bands * (np.arange(bands)[None, :] + 0.5) * np.arange(coefficients + 1)[:, None])
    mfcc = energies @ dct.T
    loudness = 10 * np.log10(power.sum(axis=1) + 1e-12)
    speech = loudness >= loudness.max() - 30.0
    return mfcc[speech, 1:].mean(axis=0)


def median_f0(samples: np.ndarray, rate: int, low: float = 60.0, high: float = 400.0) -> float:
    """The median pitch (Hz) of the voiced frames of ``samples`` (float mono at ``rate``)."""
    samples = np.asarray(samples, dtype=np.float64).reshape(-1)
    frame, hop = int(0.040 * rate), int(0.010 * rate)
    count = 1 + (samples.size - frame) // hop
    frames = samples[np.arange(frame)[None, :] + hop * np.arange(count)[:, None]]
    frames = frames - frames.mean(axis=1, keepdims=True)
    loud = np.sqrt((frames**2).mean(axis=1)) >= 0.1 * np.sqrt((frames**2).mean(axis=1)).max()
    spectrum = np.fft.rfft(frames[loud], 2 * frame)
    autocorrelation = np.fft.irfft(np.abs(spectrum) ** 2)[:, :frame]
    lags = np.arange(int(rate / high), int(rate / low))
    best = lags[np.argmax(autocorrelation[:, lags], axis=1)]
    voiced = autocorrelation[np.arange(best.size), best] >= 0.3 * autocorrelation[:, 0]
    if not voiced.any():
        raise ValueError("no voiced frame in the clip")
    return float(np.median(rate / best[voiced]))


def voice_distance(a: np.ndarray, b: np.ndarray, rate: int) -> float:
    """Semitones between the two clips' median pitch (0: the same voice; 12: an octave apart)."""
    return abs(12.0 * float(np.log2(median_f0(a, rate) / median_f0(b, rate))))


def speech_spans(path: Path, model: object) -> list[tuple[float, float]]:
    """silero VAD's speech spans of an audio file (decoded by the farm to 16 kHz), in seconds."""
    from silero_vad import get_speech_timestamps

    from mediafarm.tasks.media.decode import SAMPLE_RATE, audio_blocks

    audio = np.concatenate(list(audio_blocks(path)))
    # Samples, not return_seconds (which rounds to 0.1 s).
    return [(s["start"] / SAMPLE_RATE, s["end"] / SAMPLE_RATE)
            for s in get_speech_timestamps(audio, model, sampling_rate=SAMPLE_RATE)]  # fmt: skip
