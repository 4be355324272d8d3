"""Cutting clips with PyAV on videos made here: a stream copy from a nearby keyframe, a re-encode
from the exact start when the last keyframe is too far back, and every clip decodes."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from mediafarm.tasks.errors import UnreadableMedia
from mediafarm.tasks.families.camfilter.cut import check_clip, choose_cut, clip_suffix, cut_clip, keyframe_times

FPS, SECONDS, RATE = 10, 20, 16000


def make_video(path: Path, gop: int) -> Path:
    """H.264 (B-frames on, a keyframe every ``gop`` frames) with an AAC tone, 20 s."""
    with av.open(str(path), "w") as out:
        video = out.add_stream("libx264", rate=FPS)
        video.width, video.height, video.pix_fmt = 160, 96, "yuv420p"
        video.options = {"g": str(gop), "keyint_min": str(gop), "sc_threshold": "0", "bf": "2"}
        audio = out.add_stream("aac", rate=RATE)
        for i in range(FPS * SECONDS):
            image = np.full((96, 160, 3), (i * 7) % 255, np.uint8)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = i
            frame.time_base = Fraction(1, FPS)
            out.mux(video.encode(frame))
        out.mux(video.encode(None))
        tone = (0.2 * np.sin(2 * np.pi * 440 * np.arange(RATE * SECONDS) / RATE)).astype(np.float32)
        for start in range(0, tone.size, 1024):
            chunk = tone[start : start + 1024].reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(chunk, format="flt", layout="mono")
            frame.sample_rate = RATE
            out.mux(audio.encode(frame))
        out.mux(audio.encode(None))
    return path


@pytest.fixture(scope="module")
def short_gop(tmp_path_factory) -> Path:
    return make_video(tmp_path_factory.mktemp("cut") / "short_gop.mp4", gop=FPS)  # a keyframe a second


@pytest.fixture(scope="module")
def long_gop(tmp_path_factory) -> Path:
    return make_video(tmp_path_factory.mktemp("cut") / "long_gop.mp4", gop=10 * FPS)  # one every 10 s


def streams(path: Path) -> list[str]:
    with av.open(str(path)) as container:
        return sorted(s.type for s in container.streams)


def test_keyframes_are_found_from_the_packets(short_gop: Path, long_gop: Path) -> None:
    assert keyframe_times(short_gop) == pytest.approx([float(s) for s in range(SECONDS)])
    assert keyframe_times(long_gop) == pytest.approx([0.0, 10.0])


def test_a_clip_near_a_keyframe_is_copied_from_it_and_decodes(short_gop: Path, tmp_path: Path) -> None:
    clip = cut_clip(short_gop, 4.3, 8.0, tmp_path / "a.mp4", keyframe_times(short_gop), max_lead=1.5)
    assert (clip.method, clip.start, clip.end) == ("copy", pytest.approx(4.0), 8.0)
    frames, last = check_clip(clip.path)
    # A copy keeps the source's B-frame delay: its first frame may be shown a few frames after 0.
    assert abs(frames - 4 * FPS) <= 2 and 3.5 <= last <= 4.0 + 3 / FPS
    assert streams(clip.path) == ["audio", "video"]


def test_a_clip_far_from_any_keyframe_is_reencoded_from_its_exact_start(long_gop: Path, tmp_path: Path) -> None:
    keyframes = keyframe_times(long_gop)
    assert choose_cut(4.3, keyframes, 1.5) == ("reencode", 4.3) and clip_suffix("reencode", long_gop) == ".mp4"
    clip = cut_clip(long_gop, 4.3, 8.0, tmp_path / "b.mp4", keyframes, max_lead=1.5)
    assert (clip.method, clip.start, clip.end) == ("reencode", 4.3, 8.0)
    frames, last = check_clip(clip.path)
    assert abs(frames - 37) <= 2 and 3.3 <= last <= 3.8
    assert streams(clip.path) == ["audio", "video"]


def test_clips_at_the_edges_of_the_video(short_gop: Path, tmp_path: Path) -> None:
    keyframes = keyframe_times(short_gop)
    first = cut_clip(short_gop, 0.0, 2.0, tmp_path / "first.mp4", keyframes)
    last = cut_clip(short_gop, 18.5, 20.0, tmp_path / "last.mp4", keyframes)
    assert first.method == last.method == "copy"
    assert abs(check_clip(first.path)[0] - 2 * FPS) <= 2 and abs(check_clip(last.path)[0] - 2 * FPS) <= 2


def test_a_file_that_is_not_a_video_fails_the_check(tmp_path: Path) -> None:
    bogus = tmp_path / "clip.mp4"
    bogus.write_bytes(b"\x00" * 4096)
    with pytest.raises(UnreadableMedia):
        check_clip(bogus)
    with pytest.raises(ValueError, match="empty clip"):
        cut_clip(bogus, 5.0, 5.0, tmp_path / "x.mp4", [0.0])
