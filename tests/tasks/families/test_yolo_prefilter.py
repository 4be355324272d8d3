"""The YOLO family's model-free parts on generated video: stride decode, motion gate, intervals.

No model and no broker: the ``motion`` engine is called as a plain function.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mediafarm.tasks.families.yolo.engines import motion
from mediafarm.tasks.families.yolo.frames import VideoSamples, crop_around
from mediafarm.tasks.families.yolo.motion import MotionDetector, MotionGate, Region
from mediafarm.tasks.families.yolo.spec import MotionParams, YoloRequest
from mediafarm.tasks.families.yolo.tracks import IntervalBuilder
from mediafarm.tasks.runtime.context import EngineContext
from mediafarm.tasks.wire.errors import UnreadableMedia
from tests.support.yolo import DURATION, FPS, HEIGHT, MOVING, WIDTH, make_audio_only, make_image, make_video


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_video(tmp_path_factory.mktemp("yolo") / "moving.mp4")


@pytest.fixture(scope="module")
def long_static(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A minute of a still scene with one 3-second movement, at a small size, long GOP."""
    path = tmp_path_factory.mktemp("yolo") / "long.mp4"
    return make_video(path, duration=60, moving=((30.0, 33.0),), width=160, height=90, gop=250)


def motion_spans(path: Path, stride: float) -> list[tuple[float, float]]:
    result = motion(EngineContext.local(), YoloRequest(media=str(path), stride=stride), MotionParams())
    assert result.motion_only and result.model == "motion prefilter"
    return [(d.start, d.end) for d in result.detections["motion"]]


@pytest.mark.parametrize("stride", [0.2, 0.5, 1.0])
def test_motion_rung_finds_the_moving_spans_within_one_stride(video: Path, stride: float) -> None:
    spans = motion_spans(video, stride)
    assert len(spans) == len(MOVING), spans
    for (start, end), (true_start, true_end) in zip(spans, MOVING, strict=True):
        assert abs(start - true_start) <= stride + 1e-6 and abs(end - true_end) <= stride + 1e-6, (spans, stride)


def test_stride_decodes_every_frame_but_samples_one_per_stride(video: Path) -> None:
    with VideoSamples(video, stride=0.5, grey_width=160, image_width=64) as samples:
        times = [s.t for s in samples]
        assert samples.decoded == int(DURATION * FPS)
        assert (samples.width, samples.height) == (WIDTH, HEIGHT)
        assert samples.duration == pytest.approx(DURATION)
    assert times == pytest.approx([i * 0.5 for i in range(int(DURATION / 0.5))])


def test_frames_are_downscaled_as_they_are_decoded(video: Path) -> None:
    with VideoSamples(video, stride=1.0, grey_width=80, image_width=128) as samples:
        first = next(iter(samples))
    assert first.grey.shape == (44, 80) and first.grey.dtype == np.uint8
    assert first.image.shape == (72, 128, 3)
    with VideoSamples(video, stride=1.0, grey_width=80, image_width=None) as samples:
        assert next(iter(samples)).image is None


def test_static_stretches_are_skipped(long_static: Path) -> None:
    from mediafarm.tasks.families.yolo.engines import _gate, _motion, _scan

    params = MotionParams(stride_s=0.5)
    examined: list[float] = []
    with VideoSamples(long_static, stride=0.5, grey_width=160, image_width=None) as video:
        gate = _gate(params, 0.5)
        for sample, region in _scan(EngineContext.local(), video, _motion(params), stage="test"):
            examined += [frame.t for frame in gate.offer(sample.t, sample, region)]
        gate.finish()
        decoded, sampled = video.decoded, video.sampled
    assert decoded == 600 and sampled == 120
    assert len(examined) + gate.skipped == sampled
    # The first frame, the movement (30-33 s) with its margins (1 s before, 2 s after), nothing else.
    assert examined[0] == 0.0
    moving = examined[1:]
    assert 29.0 <= moving[0] <= 30.5 and 33.0 <= moving[-1] <= 35.5, examined
    assert moving == sorted(moving) and len(examined) / decoded < 0.04, (len(examined), decoded)


def test_gate_holds_a_bounded_margin_before_motion() -> None:
    gate: MotionGate[int] = MotionGate(stride=1.0, margin_before=2.0, margin_after=1.0, first_frame=False)
    still, moving = None, Region(0.1, 0.1, 0.2, 0.2, 0.05)
    passed = []
    for t in range(10):
        passed += [g.t for g in gate.offer(float(t), t, moving if t == 6 else still)]
        assert len(gate._held) <= 2
    gate.finish()
    assert passed == [4.0, 5.0, 6.0, 7.0]  # two before, the motion, one after
    assert gate.skipped == 6


def test_detector_ignores_noise_and_a_change_that_stays() -> None:
    rng = np.random.default_rng(1)
    base = rng.integers(80, 120, size=(90, 160), dtype=np.uint8)
    detector = MotionDetector(alpha=0.1, threshold=25, min_area=0.002)
    assert detector.update(base) is None
    noisy = np.clip(base.astype(int) + rng.integers(-8, 9, size=base.shape), 0, 255).astype(np.uint8)
    assert detector.update(noisy) is None
    moved = noisy.copy()
    moved[30:60, 40:70] = 250
    region = detector.update(moved)
    assert region is not None and region.area == pytest.approx(900 / (90 * 160), rel=0.01)
    assert (region.x1, region.y1, region.x2, region.y2) == pytest.approx((40 / 160, 30 / 90, 70 / 160, 60 / 90))
    assert detector.update(moved) is None  # it stopped: no ghost of it lingers


def test_crop_keeps_its_size_inside_the_frame() -> None:
    image = np.zeros((360, 640, 3), np.uint8)
    crop, x, y = crop_around(image, Region(0.95, 0.9, 1.0, 1.0, 0.01), min_side=320)
    assert crop.shape[:2] == (320, 320) and (x, y) == (320, 40)
    crop, x, y = crop_around(image, Region(0.0, 0.0, 1.0, 1.0, 1.0), min_side=320)
    assert crop.shape[:2] == (360, 640) and (x, y) == (0, 0)


def test_intervals_join_close_hits_and_keep_the_peak_box() -> None:
    builder = IntervalBuilder(["person", "car"], stride=0.5, join_s=1.0)
    builder.add("person", 1.0, 0.4, (0, 0, 1, 1))
    builder.add("person", 1.5, 0.9, (2, 2, 3, 3))
    builder.add("person", 3.0, 0.5, (4, 4, 5, 5))  # 1.0 s after the last one ended: same interval
    builder.add("person", 6.0, 0.6, (6, 6, 7, 7))
    found = builder.finish(duration=6.2)
    assert found["car"] == []
    first, second = found["person"]
    assert (first.start, first.end, first.peak_confidence, first.box, first.frames) == (1.0, 3.5, 0.9, (2, 2, 3, 3), 3)
    assert (second.start, second.end) == (6.0, 6.2)


def test_an_image_is_one_frame(tmp_path: Path) -> None:
    with VideoSamples(make_image(tmp_path / "still.png"), stride=0.5, grey_width=160, image_width=320) as video:
        [sample] = list(video)
        assert video.decoded == 1 and sample.t == 0.0 and sample.image.shape == (HEIGHT, WIDTH, 3)


def test_unreadable_inputs_are_rejected_with_the_reason(tmp_path: Path, video: Path) -> None:
    truncated = tmp_path / "truncated.mp4"
    truncated.write_bytes(video.read_bytes()[: video.stat().st_size // 2])
    with pytest.raises(UnreadableMedia, match="not a media file FFmpeg can read"):
        motion_spans(truncated, 0.5)
    with pytest.raises(UnreadableMedia, match="has no video stream"):
        motion_spans(make_audio_only(tmp_path / "tone.wav"), 0.5)
    garbage = tmp_path / "garbage.mkv"
    garbage.write_bytes(np.random.default_rng(0).integers(0, 256, 50_000, dtype=np.uint8).tobytes())
    with pytest.raises(UnreadableMedia):
        motion_spans(garbage, 0.5)


@pytest.fixture(scope="module")
def camera_gop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The moving-rectangle video with a keyframe every second, as IP cameras encode."""
    return make_video(tmp_path_factory.mktemp("yolo") / "camera.mp4", gop=FPS)


def test_keyframes_a_stride_apart_are_all_that_is_decoded(camera_gop: Path) -> None:
    with VideoSamples(camera_gop, stride=1.0, grey_width=160, image_width=None) as samples:
        times = [s.t for s in samples]
        assert samples.keyframes_only and samples.decoded == int(DURATION)  # one frame a second, not ten
    assert times == pytest.approx([float(i) for i in range(int(DURATION))])
    result = motion(EngineContext.local(), YoloRequest(media=str(camera_gop), stride=1.0), MotionParams())
    assert result.frames.keyframes_only and result.frames.decoded == int(DURATION)
    spans = [(d.start, d.end) for d in result.detections["motion"]]
    assert len(spans) == len(MOVING)
    for (start, end), (true_start, true_end) in zip(spans, MOVING, strict=True):
        assert abs(start - true_start) <= 1.0 + 1e-6 and abs(end - true_end) <= 1.0 + 1e-6, spans


def test_a_stride_shorter_than_the_gop_decodes_every_frame(camera_gop: Path, video: Path) -> None:
    with VideoSamples(camera_gop, stride=0.5, grey_width=160, image_width=None) as samples:
        assert sum(1 for _ in samples) == int(DURATION / 0.5)
        assert not samples.keyframes_only and samples.decoded == int(DURATION * FPS)
    with VideoSamples(video, stride=5.0, grey_width=160, image_width=None) as samples:  # GOP 250: 25 s
        list(samples)
        assert not samples.keyframes_only
