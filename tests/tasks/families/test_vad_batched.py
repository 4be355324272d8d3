"""The batched silero engine against the unbatched path it replaced, on tracks that stress a VAD.

The engine runs silero's sequence ONNX model once per decoded block; the unbatched path is
silero-vad's own streaming model called window by window, through its ``VADIterator`` (what the
engine did before) and through ``get_speech_timestamps(onnx=True)``. Same decoded audio, same
parameters: the spans must agree to within one 32 ms window at every boundary (they are expected
to be equal, the probabilities being equal). No broker.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mediafarm.tasks.families.vad import engines
from mediafarm.tasks.families.vad.spec import SileroParams, VadRequest
from mediafarm.tasks.kit.media import SAMPLE_RATE, audio_blocks
from mediafarm.tasks.runtime.context import EngineContext

WINDOW_S = engines.SILERO_WINDOW / SAMPLE_RATE  # 32 ms
PARAMS = SileroParams()


@pytest.fixture(scope="module")
def tracks(tmp_path_factory: pytest.TempPathFactory):
    from tests.support.vad_tracks import make_all

    return make_all(tmp_path_factory.mktemp("vad-tracks"), seconds=50, seed=16)


@pytest.fixture(scope="module")
def stock_model():
    from silero_vad import load_silero_vad

    return load_silero_vad(onnx=True)


def decoded(path: Path) -> np.ndarray:
    return np.concatenate(list(audio_blocks(path)))


def iterator_spans(audio: np.ndarray, model, params: SileroParams = PARAMS) -> list[tuple[float, float]]:
    """The unbatched path: silero's VADIterator window by window, as the engine ran before."""
    import torch
    from silero_vad import VADIterator

    iterator = VADIterator(
        model,
        threshold=params.threshold,
        sampling_rate=SAMPLE_RATE,
        min_silence_duration_ms=params.min_silence_ms,
        speech_pad_ms=params.speech_pad_ms,
    )
    spans, start, n = [], None, engines.SILERO_WINDOW
    padded = np.pad(audio, (0, -audio.size % n))
    for i in range(0, padded.size, n):
        event = iterator(torch.from_numpy(padded[i : i + n]))
        if event and "start" in event:
            start = event["start"]
        if event and "end" in event:
            spans.append((start, event["end"]))
            start = None
    iterator.reset_states()
    duration = audio.size / SAMPLE_RATE
    if start is not None:
        spans.append((start, audio.size))
    return [(s / SAMPLE_RATE, min(e / SAMPLE_RATE, duration)) for s, e in spans if s / SAMPLE_RATE < duration]


def timestamps_spans(audio: np.ndarray, model) -> list[tuple[float, float]]:
    """silero's get_speech_timestamps with the engine's parameters (no minimum speech length: the
    engine has none)."""
    from silero_vad import get_speech_timestamps

    found = get_speech_timestamps(audio, model, threshold=PARAMS.threshold, sampling_rate=SAMPLE_RATE,
                                  min_silence_duration_ms=PARAMS.min_silence_ms, speech_pad_ms=PARAMS.speech_pad_ms,
                                  min_speech_duration_ms=0)  # fmt: skip
    return [(s["start"] / SAMPLE_RATE, s["end"] / SAMPLE_RATE) for s in found]


def assert_within_a_window(got: list[tuple[float, float]], expected: list[tuple[float, float]]) -> None:
    assert len(got) == len(expected), f"{len(got)} spans vs {len(expected)}: {got} vs {expected}"
    for g, e in zip(got, expected, strict=True):
        assert abs(g[0] - e[0]) <= WINDOW_S + 1e-9 and abs(g[1] - e[1]) <= WINDOW_S + 1e-9, f"{g} vs {e}"


def test_the_tracks_hold_what_they_should(tracks) -> None:
    for track in tracks:
        assert track.duration > 10 and round(track.duration * SAMPLE_RATE) % engines.SILERO_WINDOW, track.name
        assert len(track.truth) >= 2, track.name


def test_batched_probabilities_equal_the_streaming_models(tracks, stock_model) -> None:
    import torch

    for track in tracks:
        audio = decoded(track.path)
        stock = stock_model.audio_forward(torch.from_numpy(audio), SAMPLE_RATE).numpy().reshape(-1)
        session, batched = engines.silero_model(), []
        h = c = np.zeros((1, 1, 128), np.float32)
        windows = engines._Windows(track.path, engines.SILERO_WINDOW, EngineContext.local(), "test")
        for rows in engines.silero_rows(windows):
            probabilities, h, c = session.run(["speech_probs", "hn", "cn"], {"input": rows, "h": h, "c": c})
            batched.append(probabilities.reshape(-1))
        got = np.concatenate(batched)
        assert got.shape == stock.shape, track.name
        assert np.abs(got - stock).max() <= 1e-5, (track.name, float(np.abs(got - stock).max()))


def test_batched_spans_match_the_unbatched_paths(tracks, stock_model) -> None:
    for track in tracks:
        result = engines.silero(EngineContext.local(), VadRequest(media=str(track.path)), PARAMS)
        got = [(s.start, s.end) for s in result.spans]
        assert got, f"{track.name}: no speech found"
        audio = decoded(track.path)
        assert result.duration == pytest.approx(audio.size / SAMPLE_RATE)
        assert_within_a_window(got, iterator_spans(audio, stock_model))
        assert_within_a_window(got, timestamps_spans(audio, stock_model))


@pytest.mark.parametrize("params", [SileroParams(threshold=0.3, min_silence_ms=100, speech_pad_ms=0),
                                    SileroParams(threshold=0.8, min_silence_ms=1000, speech_pad_ms=200)])  # fmt: skip
def test_other_parameters_give_the_iterators_spans_too(tracks, stock_model, params: SileroParams) -> None:
    track = next(t for t in tracks if t.name == "short-utterances")
    got = engines.silero(EngineContext.local(), VadRequest(media=str(track.path)), params).spans
    assert_within_a_window([(s.start, s.end) for s in got], iterator_spans(decoded(track.path), stock_model, params))


def test_speech_running_to_the_end_and_files_shorter_than_a_window(tracks, stock_model, tmp_path: Path) -> None:
    import soundfile as sf

    track = next(t for t in tracks if t.name == "noise")
    audio, rate = sf.read(track.path, dtype="int16")
    start, end = track.truth[-1]
    cut = tmp_path / "cut.wav"  # a recording stopped mid-sentence: the last span runs to the end
    sf.write(cut, audio[: int((start + end) / 2 * rate) + 77], rate, subtype="PCM_16")
    got = [(s.start, s.end) for s in engines.silero(EngineContext.local(), VadRequest(media=str(cut)), PARAMS).spans]
    expected = iterator_spans(decoded(cut), stock_model)
    assert expected[-1][1] == pytest.approx(sf.info(cut).duration)
    assert_within_a_window(got, expected)
    for samples in (300, 0):  # part of one window; an empty recording
        tiny = tmp_path / f"tiny-{samples}.wav"
        sf.write(tiny, audio[int(start * rate) : int(start * rate) + samples], rate, subtype="PCM_16")
        result = engines.silero(EngineContext.local(), VadRequest(media=str(tiny)), PARAMS)
        assert result.duration == pytest.approx(samples / rate)
        if samples:
            assert_within_a_window([(s.start, s.end) for s in result.spans], iterator_spans(decoded(tiny), stock_model))
        else:
            assert result.spans == []
