"""Stream parameters FFmpeg opens but no decode can use (``tasks.media.streams``): refused naming the
problem before the first packet, where PyAV's own exceptions had failed the job as an engine error.
And a container that ends after its header, named as such rather than as "not a media file"."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from mediafarm.tasks.families.yolo.frames import VideoSamples
from mediafarm.tasks.media.decode import audio_blocks
from mediafarm.tasks.wire.errors import UnreadableMedia
from tests.support import malformed as mk


def decoded_seconds(path: Path) -> float:
    return sum(block.size for block in audio_blocks(path)) / 16000


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"format_tag": 0x1234}, r"the audio stream's codec has no decoder in this FFmpeg"),
        ({"bits": 0}, r"the audio stream's codec has no decoder in this FFmpeg"),
        ({"channels": 0}, r"the audio stream declares no channels"),
        ({"rate": 1}, r"the audio stream declares a sample rate of 1 Hz; audio is read at 1,000 to 1,000,000 Hz"),
        ({"rate": 2_000_000_000}, r"the audio stream declares a sample rate of 2,000,000,000 Hz"),
    ],
    ids=["unknown format tag", "0 bits a sample", "no channels", "1 Hz", "2 GHz"],
)
def test_an_audio_stream_no_decode_can_use_is_refused_naming_why(tmp_path: Path, fields: dict, reason: str) -> None:
    path = mk.write_wav(tmp_path / "odd.wav", **fields)
    with pytest.raises(UnreadableMedia, match=r"^odd\.wav: " + reason):
        decoded_seconds(path)


@pytest.mark.parametrize("rate", [1_000, 8_000, 16_000, 44_100, 96_000, 384_000])
def test_real_sample_rates_are_read(tmp_path: Path, rate: int) -> None:
    path = mk.write_wav(tmp_path / f"r{rate}.wav", rate=rate, frames=rate // 2)
    assert decoded_seconds(path) == pytest.approx(0.5, abs=0.01)


def test_a_video_codec_ffmpeg_cannot_decode_is_refused_naming_why(tmp_path: Path) -> None:
    path = mk.unknown_fourcc_avi(tmp_path / "zzzz.avi")
    with pytest.raises(UnreadableMedia, match=r"^zzzz\.avi: the video stream's codec has no decoder"):
        with VideoSamples(path, stride=0.5, grey_width=32, image_width=None):
            pass
    healthy = mk.video(tmp_path / "fmp4.avi", codec="mpeg4")
    with VideoSamples(healthy, stride=0.1, grey_width=32, image_width=None) as video:
        assert len(list(video)) == 10


@pytest.mark.parametrize("maker", [partial(mk.write_wav, frames=0), partial(mk.with_chunk_before_data, size=1 << 20)],
                         ids=["no samples", "1 MB unknown chunk"])  # fmt: skip
def test_odd_but_valid_wavs_are_read(tmp_path: Path, maker) -> None:
    seconds = decoded_seconds(maker(tmp_path / "odd.wav"))
    assert seconds in (0.0, pytest.approx(1.0, abs=0.01))


@pytest.mark.parametrize("kind", ["video", "audio"])
def test_a_container_with_a_header_and_no_packet_is_named_as_such(tmp_path: Path, kind: str) -> None:
    path = mk.header_only(tmp_path / f"hollow-{kind}.mkv", kind)
    with pytest.raises(UnreadableMedia, match=rf"^hollow-{kind}\.mkv ends before its first audio or video packet"):
        decoded_seconds(path)
