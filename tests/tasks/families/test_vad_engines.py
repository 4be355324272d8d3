"""The VAD engines as plain functions, on espeak-ng speech with known silences. No broker."""

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mediafarm.tasks.families.vad.engines import silero, skip, webrtc
from mediafarm.tasks.families.vad.spec import SileroParams, VadRequest, WebrtcParams
from mediafarm.tasks.runtime.context import EngineContext


def silero_spans(path: Path):
    return silero(EngineContext.local(), VadRequest(media=str(path)), SileroParams())


def webrtc_spans(path: Path):
    return webrtc(EngineContext.local(), VadRequest(media=str(path)), WebrtcParams())


def skipped(path: Path):
    return skip(EngineContext.local(), VadRequest(media=str(path)), None)

TOLERANCE = 0.3  # seconds, per span boundary (issue #2)


def assert_matches(spans, truth) -> None:
    got = [(s.start, s.end) for s in spans]
    assert len(got) == len(truth), f"{got} vs truth {truth}"
    for (gs, ge), (ts, te) in zip(got, truth, strict=True):
        assert abs(gs - ts) <= TOLERANCE and abs(ge - te) <= TOLERANCE, f"{got} vs truth {truth}"


def test_silero_finds_each_sentence(speech_track) -> None:
    result = silero_spans(speech_track.path)
    assert_matches(result.spans, speech_track.truth)
    assert result.duration == pytest.approx(speech_track.duration, abs=0.01)
    assert result.model.startswith("silero-vad 6.") and not result.vad_skipped


def test_webrtc_finds_each_sentence(speech_track) -> None:
    result = webrtc_spans(speech_track.path)
    assert_matches(result.spans, speech_track.truth)
    assert result.model.startswith("webrtcvad")


def test_silence_gives_no_spans(tmp_path: Path) -> None:
    path = tmp_path / "quiet.wav"
    rng = np.random.default_rng(0)
    sf.write(path, (rng.standard_normal(16000 * 5) * 0.001).astype(np.float32), 16000)
    assert silero_spans(path).spans == []
    assert webrtc_spans(path).spans == []


def test_skip_is_flagged_and_keeps_duration(speech_track) -> None:
    result = skipped(speech_track.path)
    assert result.vad_skipped and result.spans == []
    assert result.duration == pytest.approx(speech_track.duration, abs=0.01)


def test_model_state_does_not_leak_between_jobs(speech_track) -> None:
    # The model is cached per process; a second run must give the same spans as the first.
    first = silero_spans(speech_track.path).model_dump(mode="json")
    assert silero_spans(speech_track.path).model_dump(mode="json") == first


def silent_video(path: Path, seconds: int = 3) -> Path:
    """A video with no audio track at all (a camera without a microphone)."""
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(10 * seconds):
            frame = av.VideoFrame.from_ndarray(np.zeros((48, 64, 3), np.uint8), format="rgb24")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path


@pytest.mark.parametrize("engine, params", [(silero, SileroParams()), (webrtc, WebrtcParams()), (skip, None)])
def test_no_audio_track_is_answered_empty_when_asked_and_rejected_otherwise(tmp_path: Path, engine, params) -> None:
    from mediafarm.tasks.wire.errors import UnreadableMedia

    video = silent_video(tmp_path / "mute.mp4")
    result = engine(EngineContext.local(), VadRequest(media=str(video), if_no_audio="empty"), params)
    assert result.no_audio and result.spans == [] and result.duration == pytest.approx(3.0, abs=0.2)
    if engine is not skip:  # the skip rung never reads the audio, so it has nothing to reject
        with pytest.raises(UnreadableMedia, match="no audio stream"):
            engine(EngineContext.local(), VadRequest(media=str(video)), params)
