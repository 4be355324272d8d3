"""The YOLO ``detect`` engine as a plain function, with a random-weight YOLO11n built from
ultralytics' own yaml (tests/support/yolo.py) and loaded through the production code path.

Random weights detect nothing at normal thresholds, so these tests check the flow (which frames
reach the model, at what size), the counters and the timing fields, never detections.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mediafarm.config.settings import get_settings
from mediafarm.tasks.families.yolo import engines
from mediafarm.tasks.families.yolo.engines import detect, motion
from mediafarm.tasks.families.yolo.model import load_detector, ultralytics_offline
from mediafarm.tasks.families.yolo.spec import DetectParams, MotionParams, YoloRequest
from mediafarm.tasks.runtime.context import EngineContext
from mediafarm.tasks.wire.errors import InvalidRequest, ResourceFailure, RungUnavailable
from mediafarm.tasks.wire.records import Outcome
from tests.support.yolo import DURATION, EXPORT_SIZE, FPS, HEIGHT, WIDTH, build_random_yolo, make_image, make_video


@pytest.fixture(scope="session")
def random_yolo(session_dir: Path) -> tuple[Path, Path]:
    return build_random_yolo(get_settings().models_dir, session_dir / "ultralytics-build")


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_video(tmp_path_factory.mktemp("yolo") / "moving.mp4")


@pytest.fixture()
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, tuple[int, ...], bool]]:
    """Every model call the engine makes: frame time, image shape, whether the frame had motion."""
    seen: list[tuple[float, tuple[int, ...], bool]] = []
    original = engines.Detector.detect

    def spy(self, image, **options):
        seen.append((current["t"], image.shape, current["moving"]))
        return original(self, image, **options)

    current: dict = {}
    original_examine = engines._examine

    def examine(detector, frame, *args, **kwargs):
        current.update(t=frame.t, moving=frame.region is not None)
        return original_examine(detector, frame, *args, **kwargs)

    monkeypatch.setattr(engines.Detector, "detect", spy)
    monkeypatch.setattr(engines, "_examine", examine)
    return seen


def run(path: Path, **params) -> engines.YoloResult:
    ctx = EngineContext.local(models_dir=get_settings().models_dir)
    request = YoloRequest(media=str(path), **params.pop("request", {}))
    return detect(ctx, request, DetectParams(**{"weights": "yolo11n.onnx", **params}))


def test_onnx_model_runs_on_the_frames_the_gate_passes(random_yolo, video: Path, calls) -> None:
    result = run(video)
    frames = result.frames
    assert (frames.decoded, frames.sampled) == (DURATION * FPS, DURATION / 0.5)
    assert frames.examined == len(calls) and frames.examined + frames.skipped == frames.sampled
    assert 0 < frames.examined < frames.sampled
    assert frames.model_ms_per_frame is not None and 0 < frames.model_ms_per_frame < 5000
    # The same frames the motion rung calls moving reach the model (plus the margins and frame 0).
    moving = motion(EngineContext.local(), YoloRequest(media=str(video)), MotionParams()).detections["motion"]
    examined_times = [t for t, _, _ in calls]
    for span in moving:
        inside = [t for t in examined_times if span.start <= t <= span.end]
        assert len(inside) >= (span.end - span.start) / 0.5, (span, examined_times)
    assert all(shape == (HEIGHT, WIDTH, 3) for _, shape, _ in calls)  # whole frames, never upscaled
    assert result.detections == {"person": []} and not result.motion_only and not result.crop
    assert (result.width, result.height, result.duration, result.stride) == (WIDTH, HEIGHT, DURATION, 0.5)
    assert "yolo11n.onnx" in result.model and "onnxruntime" in result.model


def test_crops_around_motion_and_whole_margin_frames(random_yolo, video: Path, calls) -> None:
    result = run(video, crop=True, crop_min=96)
    assert result.crop and result.frames.examined == len(calls)
    crops = [shape for _, shape, moving in calls if moving]
    whole = [shape for _, shape, moving in calls if not moving]
    assert crops and whole
    assert all(96 <= h < HEIGHT and 96 <= w < WIDTH for h, w, _ in crops), crops
    assert all(shape == (HEIGHT, WIDTH, 3) for shape in whole)


def test_every_frame_at_the_stride_without_the_prefilter(random_yolo, video: Path, calls) -> None:
    result = run(video, prefilter=False, request={"stride": 1.0})
    assert result.frames.examined == result.frames.sampled == DURATION and result.frames.skipped == 0
    assert [t for t, _, _ in calls] == [float(i) for i in range(int(DURATION))]


def test_torch_weights_through_the_same_path(random_yolo, video: Path) -> None:
    result = run(video, weights="yolo11n.pt", imgsz=EXPORT_SIZE, frame_width=160)
    assert "torch" in result.model and result.frames.examined > 0
    assert result.frames.model_ms_per_frame > 0


def test_a_cpu_torch_rung_keeps_the_threads_it_asked_for(random_yolo) -> None:
    """ultralytics' first predict sets torch's threads to min(8, cores - 1); the loader puts the
    rung's own number back. In a fresh process: torch's thread count is process-wide."""
    ultralytics_default = min(8, max(1, (os.cpu_count() or 1) - 1))
    wanted = 2 if ultralytics_default != 2 else 3
    code = textwrap.dedent(f"""
        import torch
        from mediafarm.tasks.families.yolo.model import load_detector
        load_detector({str(random_yolo[0])!r}, "cpu", threads={wanted})
        print(torch.get_num_threads())
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == str(wanted), proc.stdout


def test_an_onnx_rung_runs_on_the_threads_it_asked_for(random_yolo) -> None:
    """ultralytics opens its onnxruntime session with one thread per core; the loader reopens it
    with the rung's threads, and the model still runs. In a fresh process (one model per child)."""
    code = textwrap.dedent(f"""
        import numpy as np
        from mediafarm.tasks.families.yolo.model import load_detector
        for threads in (1, 3):
            detector = load_detector({str(random_yolo[1])!r}, "cpu", threads=threads)
            session = detector.yolo.predictor.model.backend.session
            detector.detect(np.zeros((360, 640, 3), np.uint8), classes=[0], conf=0.25, imgsz=None)
            print("threads", threads, session.get_session_options().intra_op_num_threads, detector.calls)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = [line for line in proc.stdout.splitlines() if line.startswith("threads ")]
    assert seen == ["threads 1 1 1", "threads 3 3 1"], proc.stdout


def test_low_threshold_boxes_are_in_source_pixels(random_yolo, video: Path) -> None:
    # Random weights pass only a tiny threshold: at 1e-6 (and 1e-4) three fresh builds each gave one
    # 'person' over the whole clip, box (0, 0, 256, 180), none for 'car' or 'dog'. The model sees
    # 160x90 frames; a box past that is in the source's 320x180 pixels.
    result = run(video, conf=1e-6, frame_width=160, request={"classes": ["person", "car", "dog"]})
    assert set(result.detections) == {"person", "car", "dog"}
    boxes = [d for found in result.detections.values() for d in found]
    assert boxes, "no detection at all: the box checks below would check nothing"
    for d in boxes:
        x1, y1, x2, y2 = d.box
        assert 0 <= x1 <= x2 <= WIDTH + 1 and 0 <= y1 <= y2 <= HEIGHT + 1 and d.start < d.end
    assert max(max(d.box[2] - 160, d.box[3] - 90) for d in boxes) > 0, [d.box for d in boxes]


def test_an_image_goes_to_the_model_once(random_yolo, tmp_path: Path) -> None:
    result = run(make_image(tmp_path / "still.png"))
    assert (result.frames.decoded, result.frames.examined, result.duration) == (1, 1, 0.0)


def test_unknown_class_names_are_a_clear_rejection(random_yolo, video: Path) -> None:
    known = r"it knows: airplane, .* \(80 in all\)"
    with pytest.raises(InvalidRequest, match=r"\['unicorn'\] are not classes of yolo11n.onnx; " + known):
        run(video, request={"classes": "person,unicorn"})


def test_missing_or_corrupt_weights_make_the_rung_unavailable(random_yolo, video: Path) -> None:
    with pytest.raises(RungUnavailable, match="'yolo11x.onnx' is not in the models dir"):
        run(video, weights="yolo11x.onnx")
    broken = get_settings().models_dir / "broken.onnx"
    broken.write_bytes(b"not an onnx graph" * 100)
    with pytest.raises(RungUnavailable, match="cannot load broken.onnx"):
        run(video, weights="broken.onnx")


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), Outcome.CUDA_OOM),
        (MemoryError("cannot allocate 2 GiB"), Outcome.OOM),
        (Exception("[ONNXRuntimeError] : 6 : Failed to allocate memory for requested buffer"), Outcome.OOM),
    ],
)
def test_out_of_memory_while_loading_moves_down_not_unavailable(
    random_yolo, monkeypatch: pytest.MonkeyPatch, error: BaseException, outcome: Outcome
) -> None:
    def out_of_memory(*args, **kwargs):
        raise error

    monkeypatch.setattr(ultralytics_offline(), "YOLO", out_of_memory)
    # threads=5: arguments no earlier test loaded, so the one-model cache does not answer.
    with pytest.raises(ResourceFailure, match="loading yolo11n.onnx") as info:
        load_detector(get_settings().models_dir / "yolo11n.onnx", "cpu", threads=5)
    assert info.value.outcome is outcome


NO_NETWORK = """
import socket, sys
attempts = []
def refuse(*args, **kwargs):  # ultralytics swallows network errors: record them, then fail
    attempts.append(args)
    raise OSError(f"network touched: {args!r}")
socket.socket.connect = socket.socket.connect_ex = socket.create_connection = socket.getaddrinfo = refuse
from pathlib import Path
from mediafarm.tasks.runtime.context import EngineContext
from mediafarm.tasks.families.yolo.engines import detect
from mediafarm.tasks.families.yolo.spec import DetectParams, YoloRequest
ctx = EngineContext.local(models_dir=Path(sys.argv[1]), storage_dir=Path("storage"))
for weights in ("yolo11n.onnx", "yolo11n.pt"):
    result = detect(ctx, YoloRequest(media=sys.argv[2]), DetectParams(weights=weights, imgsz=320, frame_width=160))
    assert result.frames.examined > 0
import ultralytics.utils as u
assert not attempts and u.ONLINE is False and u.SETTINGS["sync"] is False, attempts
print("NETWORK-FREE", u.SETTINGS.file)
"""


def test_no_network_is_touched_from_import_to_result(random_yolo, video: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("YOLO_")}
    env["YOLO_CONFIG_DIR"] = str(tmp_path / "ultralytics")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(NO_NETWORK), str(get_settings().models_dir),
                           str(video)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)  # fmt: skip
    assert proc.returncode == 0 and "NETWORK-FREE" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
    # Nothing written but ultralytics' own settings (and the font it may need) in its config folder.
    assert {p.name for p in tmp_path.iterdir()} <= {"storage", "ultralytics"}  # no runs/, no downloads
    written = sorted(str(p.relative_to(tmp_path / "ultralytics")) for p in (tmp_path / "ultralytics").rglob("*"))
    assert set(written) <= {"Arial.ttf", "Ultralytics", "Ultralytics/settings.json"}, written
