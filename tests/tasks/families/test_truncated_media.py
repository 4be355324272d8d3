"""Issue #7: a video cut short that still opens is rejected, naming how far it got; a healthy one never is.

Real files, made here with PyAV, then cut at half their bytes as an interrupted download or copy
leaves them. What FFmpeg does with each kind (PyAV 18 / FFmpeg 8): a faststart MP4 (index first)
and a Matroska/WebM file (Duration in the header) open and decode quietly up to the cut, while
their containers still declare the whole length; an MPEG-TS declares no length at all (FFmpeg's
is the last timestamp in the file), so a cut one is a valid shorter video and passes as such.
No model and no broker: the YOLO family's ``motion`` engine and the VAD's ``webrtc`` engine are
called as plain functions; both stream through the shared decode loop that does the check.
"""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np
import pytest

from mediafarm.tasks.families.vad.engines import webrtc
from mediafarm.tasks.families.vad.spec import VadRequest, WebrtcParams
from mediafarm.tasks.families.yolo.engines import motion
from mediafarm.tasks.families.yolo.frames import VideoSamples
from mediafarm.tasks.families.yolo.spec import MotionParams, YoloRequest, YoloResult
from mediafarm.tasks.media.decode import declared_length, open_media
from mediafarm.tasks.runtime.context import EngineContext
from mediafarm.tasks.wire.errors import PermanentFailure, UnreadableMedia
from tests.support.yolo import DURATION, FPS, make_video, truncated

FASTSTART = {"movflags": "+faststart"}
# name → (file name, make_video's keywords). A keyframe a second (a camera's GOP) throughout, so a
# stride of 1 s takes the keyframes-only decode and 0.5 s the every-frame one.
KINDS: dict[str, tuple[str, dict]] = {
    "mp4 faststart": ("faststart.mp4", {"options": FASTSTART}),
    "mkv": ("video.mkv", {}),
    "webm": ("video.webm", {"codec": "libvpx"}),
    "mpeg-ts": ("video.ts", {}),
}
HEALTHY: dict[str, tuple[str, dict]] = {
    **KINDS,
    "mp4 moov at the end": ("plain.mp4", {}),
    "mp4 vbr": ("vbr.mp4", {"noisy": ((1.0, 2.0), (6.0, 6.5))}),
    "mkv vbr": ("vbr.mkv", {"noisy": ((1.0, 2.0), (6.0, 6.5))}),
    "mpeg-ts vbr": ("vbr.ts", {"noisy": ((1.0, 2.0), (6.0, 6.5))}),
    "mp4 audio longer than video": ("long-audio.mp4", {"options": FASTSTART, "audio_seconds": DURATION + 4}),
    "mkv audio longer than video": ("long-audio.mkv", {"audio_seconds": DURATION + 4}),
    "webm audio longer than video": ("long-audio.webm", {"codec": "libvpx", "audio_codec": "libopus",
                                                         "audio_seconds": DURATION + 4}),  # fmt: skip
    "mpeg-ts audio longer than video": ("long-audio.ts", {"audio_seconds": DURATION + 4}),
    "fragmented mp4": ("fragmented.mp4", {"options": {"movflags": "frag_keyframe+empty_moov"}}),
}
TRUNCATED_VIDEO = r"truncated: the video stream ends at \d+\.\d s of the 12\.0 s its container declares"


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("truncated")


def made(folder: Path, kind: str, table: dict[str, tuple[str, dict]] = HEALTHY) -> Path:
    name, options = table[kind]
    path = folder / name
    return path if path.is_file() else make_video(path, gop=FPS, **options)


def cut(folder: Path, kind: str) -> Path:
    source = made(folder, kind)
    return truncated(source, folder / f"cut-{source.name}")


def motion_job(path: Path, stride: float) -> YoloResult:
    return motion(EngineContext.local(), YoloRequest(media=str(path), stride=stride), MotionParams())


@pytest.mark.parametrize("stride", [0.5, 1.0], ids=["every frame", "keyframes only"])
@pytest.mark.parametrize("kind", ["mp4 faststart", "mkv", "webm"])
def test_a_cut_video_that_still_opens_is_rejected_naming_where_it_ends(media: Path, kind: str, stride: float) -> None:
    path = cut(media, kind)
    with pytest.raises(UnreadableMedia, match=TRUNCATED_VIDEO) as rejected:
        motion_job(path, stride)
    assert isinstance(rejected.value, PermanentFailure) and str(rejected.value).startswith(f"{path.name}: ")


def test_the_keyframes_only_decode_sees_the_cut_too(media: Path) -> None:
    # Its last decoded frame is a keyframe, up to a GOP before the end: the check reads the packets.
    with VideoSamples(cut(media, "mkv"), stride=1.0, grey_width=64, image_width=None) as video:
        assert video.keyframes_only
        with pytest.raises(UnreadableMedia, match=TRUNCATED_VIDEO):
            list(video)


def test_a_cut_mpeg_ts_declares_its_own_cut_length_so_it_passes_for_a_shorter_video(media: Path) -> None:
    # Known limit, not a choice: TS has no length field; FFmpeg reads the last timestamps in the
    # file, so the cut file "declares" where it stops and nothing contradicts it.
    path = cut(media, "mpeg-ts")
    with open_media(path) as container:
        assert declared_length(container, container.streams.video[0]) is None
        assert container.duration / av.time_base < DURATION * 0.75
    result = motion_job(path, 0.5)
    assert result.duration < DURATION * 0.75


@pytest.mark.parametrize("kind", list(HEALTHY))
def test_a_healthy_video_is_never_taken_for_a_cut_one(media: Path, kind: str) -> None:
    path = made(media, kind)
    for stride in (0.5, 1.0):
        result = motion_job(path, stride)
        assert result.frames.decoded > 0 and result.duration == pytest.approx(DURATION, abs=0.3), (stride, result)


@pytest.mark.parametrize(
    "kind, declared",
    [("mp4 faststart", DURATION), ("mp4 moov at the end", DURATION), ("mkv", DURATION), ("webm", DURATION),
     ("mp4 audio longer than video", DURATION), ("mkv audio longer than video", DURATION),
     ("mpeg-ts", None), ("fragmented mp4", None)],
)  # fmt: skip
def test_only_lengths_a_muxer_wrote_for_the_stream_are_trusted(media: Path, kind: str, declared: float | None) -> None:
    with open_media(made(media, kind)) as container:
        found = declared_length(container, container.streams.video[0])
    assert found == (pytest.approx(declared, abs=0.01) if declared else None)


class _Unseekable(io.RawIOBase):
    """A pipe: the muxer cannot go back to write a length, as for a recording written live."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("wb")

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        return self._file.write(data)

    def close(self) -> None:
        self._file.close()
        super().close()


def test_a_length_ffmpeg_estimated_from_the_bitrate_is_not_trusted(media: Path) -> None:
    # Matroska written live has no Duration; with MP3 audio FFmpeg makes one up from the bitrate
    # (measured: 4 % long on 15 s of a tone), which a cut check would hold against a healthy file.
    path = media / "live.mka"
    with av.open(_Unseekable(path), "w", format="matroska") as container:
        stream = container.add_stream("libmp3lame", rate=48000)
        stream.layout = "mono"
        for i in range(10 * 48000 // 1152):
            frame = av.AudioFrame.from_ndarray(_noise(1152, seed=i), format="s16", layout="mono")
            frame.rate, frame.pts = 48000, i * 1152
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    with open_media(path) as container:
        audio = container.streams.audio[0]
        assert container.duration is not None  # estimated...
        assert declared_length(container, audio) is None  # ...and not taken for a declaration


def _noise(count: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(count) * 3000).astype(np.int16)[None, :]


def test_the_audio_stream_of_a_cut_video_is_rejected_too(media: Path) -> None:
    source = make_video(media / "talking.mp4", gop=FPS, options=FASTSTART, audio_seconds=DURATION)
    path = truncated(source, media / "cut-talking.mp4")
    with pytest.raises(UnreadableMedia, match=r"truncated: the audio stream ends at \d+\.\d s of the 12\.0 s"):
        webrtc(EngineContext.local(), VadRequest(media=str(path)), WebrtcParams())
    whole = webrtc(EngineContext.local(), VadRequest(media=str(source)), WebrtcParams())
    assert whole.duration == pytest.approx(DURATION, abs=0.1)


@pytest.mark.parametrize("kind", ["mp4 audio longer than video", "mkv audio longer than video"])
def test_audio_longer_than_the_video_is_read_whole(media: Path, kind: str) -> None:
    result = webrtc(EngineContext.local(), VadRequest(media=str(made(media, kind))), WebrtcParams())
    assert result.duration == pytest.approx(DURATION + 4, abs=0.1)


def test_a_cut_video_without_audio_is_still_answered_no_audio_by_vad(media: Path) -> None:
    # The cam-filter's VAD stage asks if_no_audio=empty: it never decodes such a file, so the
    # rejection comes from its YOLO stage, which does.
    path = cut(media, "mp4 faststart")
    request = VadRequest(media=str(path), if_no_audio="empty")
    assert webrtc(EngineContext.local(), request, WebrtcParams()).no_audio
    with pytest.raises(UnreadableMedia, match=TRUNCATED_VIDEO):
        motion_job(path, 0.5)
