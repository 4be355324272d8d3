"""A media family looks at its input before its engine's module is imported and its model loaded.

``run_engine`` with each media family's real spec and a malformed file: the family's probe refuses
it, naming the file's problem, and the engine function is never even looked up (which would
import the engine's module: torch, silero, faster-whisper, ultralytics ...).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mediafarm.tasks import registry
from mediafarm.tasks.runtime.base import run_engine
from mediafarm.tasks.runtime.context import EngineContext
from mediafarm.tasks.wire.errors import UnreadableMedia
from mediafarm.tasks.wire.family import EngineSpec


@pytest.fixture()
def engine_never_loaded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    looked_up: list[str] = []

    def function(self: EngineSpec):  # noqa: ANN202 - the patched method's own shape
        looked_up.append(self.target)
        raise AssertionError(f"engine {self.target} looked up before the input was checked")

    monkeypatch.setattr(EngineSpec, "function", function)
    return looked_up


def _text_file(root: Path) -> Path:
    path = root / "notes.wav"
    path.write_text("not audio at all\n" * 100)
    return path


def _silent_video(root: Path) -> Path:
    # An audio-only file handed to a family that needs a video stream.
    path = root / "voice.wav"
    sf.write(path, np.zeros(16000, dtype=np.float32), 16000)
    return path


def _lying_wav(root: Path) -> Path:
    # A 1 s WAV whose header claims 4,000,000,000 bytes of audio: FFmpeg would decode the 1 s quietly.
    path = root / "lying.wav"
    sf.write(path, np.zeros(16000, dtype=np.int16), 16000, subtype="PCM_16")
    data = bytearray(path.read_bytes())
    offset = data.index(b"data") + 4
    data[offset : offset + 4] = (4_000_000_000).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(
    ("family", "make", "reason"),
    [
        ("vad", _text_file, "not a media file FFmpeg can read"),
        ("vad", _lying_wav, "truncated: its WAV header declares 4000000000 bytes"),
        ("subtitle", _text_file, "not a media file FFmpeg can read"),
        ("subtitle", _lying_wav, "truncated"),
        ("yolo", _text_file, "not a media file FFmpeg can read"),
        ("yolo", _silent_video, "has no video stream"),
    ],
)
def test_a_malformed_file_is_refused_before_the_engine_loads(
    tmp_path: Path, engine_never_loaded: list[str], family: str, make, reason: str
) -> None:
    spec = registry.get(family)
    media = make(tmp_path)
    ladder = registry.ladder_for(spec)
    ctx = EngineContext.local(storage_dir=tmp_path / "storage")
    with pytest.raises(UnreadableMedia, match=reason):
        run_engine(spec, ladder.rungs[-1], ctx, {"media": str(media)}, [tmp_path])
    assert engine_never_loaded == []


def test_a_file_without_audio_passes_the_vad_probe_when_the_request_allows_it(
    tmp_path: Path, engine_never_loaded: list[str]
) -> None:
    import av

    video = tmp_path / "mute.mp4"
    with av.open(str(video), "w") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height = 64, 48
        for _ in range(5):
            frame = av.VideoFrame.from_ndarray(np.zeros((48, 64, 3), dtype=np.uint8), format="rgb24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    spec = registry.get("vad")
    ctx = EngineContext.local(storage_dir=tmp_path / "storage")
    # Past the probe, the engine is looked up: the patched lookup says so.
    with pytest.raises(AssertionError, match="looked up"):
        run_engine(spec, spec.default_ladder.rungs[0], ctx, {"media": str(video), "if_no_audio": "empty"}, [tmp_path])
    with pytest.raises(UnreadableMedia, match="has no audio stream"):
        run_engine(spec, spec.default_ladder.rungs[0], ctx, {"media": str(video)}, [tmp_path])
