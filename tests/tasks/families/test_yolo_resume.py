"""YOLO jobs going on from a checkpoint (``yolo.resume``), engines called as plain functions.

An attempt is "killed" between two samples (its cancel check raises), after writing a checkpoint
at every sample (interval 0); the next attempt gets that checkpoint as a worker hands it over:
the folder cleared, the kept files put back, ``ctx.resume`` set. The model is the random-weight
YOLO11n of tests/support/yolo.py: it finds nothing, so what is compared on detect rungs is which
frames it was given, and the counters; the motion rung's spans are compared in full.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mediafarm.config.settings import get_settings
from mediafarm.tasks.families.yolo import engines
from mediafarm.tasks.families.yolo.engines import detect, motion
from mediafarm.tasks.families.yolo.motion import MotionDetector
from mediafarm.tasks.families.yolo.resume import GATE_FILE, RUN_IN_S
from mediafarm.tasks.families.yolo.spec import FAMILY, DetectParams, MotionParams, YoloRequest, YoloResult
from mediafarm.tasks.runtime.context import EngineContext
from mediafarm.tasks.wire.artifacts import ArtifactStore
from mediafarm.tasks.wire.checkpoint import Checkpoint, CheckpointWriter, Made, store_for
from tests.support.yolo import build_random_yolo, make_video

DURATION = 30.0
MOVING = ((5.0, 8.0), (15.0, 16.0), (24.0, 26.0))


class Killed(BaseException):
    """The attempt's end, as a SIGKILL would have it: no engine code catches it."""


@pytest.fixture(scope="module")
def random_yolo(session_dir: Path) -> tuple[Path, Path]:
    return build_random_yolo(get_settings().models_dir, session_dir / "ultralytics-build")


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_video(tmp_path_factory.mktemp("yolo-resume") / "long.mp4", duration=DURATION, moving=MOVING)


class Examined(list[tuple[str, float]]):
    """Every frame the model is given: (the rung that ran, its time)."""

    rung = ""


@pytest.fixture()
def examined(monkeypatch: pytest.MonkeyPatch) -> Examined:
    seen = Examined()
    original = engines._examine

    def spy(detector, frame, *args, **kwargs):
        seen.append((seen.rung, frame.t))
        return original(detector, frame, *args, **kwargs)

    monkeypatch.setattr(engines, "_examine", spy)
    return seen


class Job:
    """One job's attempts on a list of rungs, each but the last killed after some samples."""

    def __init__(self, storage: Path, request: YoloRequest) -> None:
        self.store = ArtifactStore(storage, "job-1")
        self.checkpoints = store_for(self.store, FAMILY.name, request.model_dump(mode="json"))
        self.request = request
        self.resumed: list[Checkpoint | None] = []

    def run(self, attempts: list[tuple[str, Any, Any, int | None]], spy: Examined | None = None) -> YoloResult:
        """``attempts``: (rung name, engine, params, samples before the kill or None); the result
        of the last (AssertionError if it was killed too)."""
        for number, (rung, engine, params, kill_after) in enumerate(attempts):
            self.store.clear()
            resume = self.checkpoints.load()
            if resume is not None:
                self.checkpoints.restore(resume)
            self.resumed.append(resume)
            ctx = EngineContext("job-1", number, number, rung, "cpu", self.store, get_settings().models_dir)
            ctx.resume = resume
            ctx.checkpoints = CheckpointWriter(self.checkpoints, "seconds", rung, interval=0.0, resumed=resume)
            if kill_after is not None:
                ctx.check_cancelled = _killer(kill_after)  # type: ignore[method-assign]
            if spy is not None:
                spy.rung = rung
            try:
                return engine(ctx, self.request, params)
            except Killed:
                continue
        raise AssertionError("the last attempt was killed too")


def _killer(samples: int) -> Any:
    count = {"n": 0}

    def check() -> None:
        count["n"] += 1
        if count["n"] > samples:
            raise Killed

    return check


def nano(**params: Any) -> DetectParams:
    return DetectParams(weights="yolo11n.onnx", **params)


def without_timing(result: YoloResult) -> dict[str, Any]:
    return result.model_dump(exclude={"frames": {"model_ms_per_frame"}})


@pytest.fixture()
def gates(monkeypatch: pytest.MonkeyPatch) -> list[MotionDetector]:
    """Every motion gate the engines make, to read what it learnt by the end."""
    made: list[MotionDetector] = []
    original = engines._motion

    def keep(params):
        made.append(original(params))
        return made[-1]

    monkeypatch.setattr(engines, "_motion", keep)
    return made


def learnt(gate: MotionDetector) -> np.ndarray:
    arrays = gate.arrays()
    assert arrays is not None
    return arrays["background"]


def test_motion_rung_killed_anywhere_gives_what_a_run_never_killed_gives(tmp_path: Path, video: Path, gates) -> None:
    request = YoloRequest(media=str(video), stride=0.5)
    whole = Job(tmp_path / "whole", request).run([("motion", motion, MotionParams(), None)])
    assert len(whole.detections["motion"]) == len(MOVING)
    background = learnt(gates[-1])
    for kill_after in (1, 11, 30, 50):  # before, in, between and after the moving spans
        job = Job(tmp_path / f"killed-{kill_after}", request)
        resumed = job.run([("motion", motion, MotionParams(), kill_after), ("motion", motion, MotionParams(), None)])
        assert job.resumed[1] is not None and job.resumed[1].position > 0
        assert resumed == whole, kill_after
        # The gate went on from its kept state bit for bit: it ends where the unkilled one ended.
        assert np.array_equal(learnt(gates[-1]), background), kill_after
        assert not job.store.path(GATE_FILE).exists()  # the checkpoint's file is not the job's


def test_detect_killed_mid_way_gives_the_same_frames_to_the_model_once(
    tmp_path: Path, video: Path, random_yolo, examined, gates
) -> None:
    request = YoloRequest(media=str(video), stride=0.5)
    whole = Job(tmp_path / "whole", request).run([("nano", detect, nano(), None)], examined)
    background = learnt(gates[-1])
    whole_frames = [t for _, t in examined]
    assert 0 < whole.frames.examined == len(whole_frames) < whole.frames.sampled
    held_at_a_kill = False
    # Early, just after a moving span begins, in a margin after it, and late.
    for kill_after in (3, 11, 19):
        examined.clear()
        job = Job(tmp_path / f"killed-{kill_after}", request)
        resumed = job.run([("nano", detect, nano(), kill_after), ("nano", detect, nano(), None)], examined)
        checkpoint = job.resumed[1]
        assert checkpoint is not None and checkpoint.made == (Made(0.0, checkpoint.position, "nano"),)
        held_at_a_kill |= bool(checkpoint.state["held"])
        # Every frame the model saw, it saw once, and the same ones as the run never killed.
        assert sorted(t for _, t in examined) == whole_frames, kill_after
        assert without_timing(resumed) == without_timing(whole), kill_after
        assert np.array_equal(learnt(gates[-1]), background), kill_after
    # One of the kills came while the gate held frames undecided: they were decided after the resume.
    assert held_at_a_kill


def test_a_lower_rung_of_another_stride_makes_the_rest_and_says_so(
    tmp_path: Path, video: Path, random_yolo, examined
) -> None:
    job = Job(tmp_path / "job", YoloRequest(media=str(video)))
    result = job.run([("small", detect, nano(stride_s=0.5), 20), ("nano", detect, nano(stride_s=1.0), None)], examined)
    join = job.resumed[1].position
    assert 5 < join < 15
    assert [(p.start, p.end, p.rung) for p in result.made] == [(0.0, join, "small"), (join, DURATION, "nano")]
    before = [t for rung, t in examined if rung == "small"]
    after = [t for rung, t in examined if rung == "nano"]
    assert max(before) < join <= min(after)
    # Each rung's own grid: after its first sample, at the resume point, the new stride's.
    assert all(abs(t * 2 - round(t * 2)) < 1e-6 for t in before)
    assert all(abs(t - round(t)) < 1e-6 for t in after if t > join + 1e-6)
    frames = result.frames
    assert frames.examined == len(examined) and frames.examined + frames.skipped == frames.sampled
    assert frames.decoded == DURATION * 10  # every frame counted once across the join
    assert result.stride == 1.0 and not result.motion_only


def test_a_detect_rung_killed_then_motion_makes_motion_spans_after_the_join(
    tmp_path: Path, video: Path, random_yolo
) -> None:
    request = YoloRequest(media=str(video), stride=0.5)
    only_motion = Job(tmp_path / "motion", request).run([("motion", motion, MotionParams(), None)])
    job = Job(tmp_path / "job", request)
    result = job.run([("nano", detect, nano(), 24), ("motion", motion, MotionParams(), None)])
    join = job.resumed[1].position
    assert [p.rung for p in result.made] == ["nano", "motion"] and result.made[0].end == join == result.made[1].start
    assert not result.motion_only and result.model.endswith(" then motion prefilter")
    assert result.detections["person"] == []
    # After the join, motion spans as the motion rung alone finds them (its gate state carried over).
    expected = [d for d in only_motion.detections["motion"] if d.end > join]
    assert [d.start for d in result.detections["motion"]] == [max(d.start, join - 0.5) for d in expected]
    assert [d.end for d in result.detections["motion"]] == [d.end for d in expected]


def test_another_motion_width_rebuilds_the_gate_from_a_run_in(tmp_path: Path, video: Path) -> None:
    request = YoloRequest(media=str(video), stride=0.5)
    narrow = MotionParams(motion_width=80)
    whole = Job(tmp_path / "whole", request).run([("narrow", motion, narrow, None)])
    job = Job(tmp_path / "job", request)
    result = job.run([("wide", motion, MotionParams(), 40), ("narrow", motion, narrow, None)])
    join = job.resumed[1].position
    assert join - RUN_IN_S < 0 < join  # the run-in starts at the video's start here: the same gate
    assert [d for d in result.detections["motion"] if d.start >= join] == [
        d for d in whole.detections["motion"] if d.start >= join
    ]
    assert result.frames.decoded == DURATION * 10 and result.frames.sampled == DURATION / 0.5


def test_a_checkpoint_state_of_another_version_starts_over(tmp_path: Path, video: Path) -> None:
    request = YoloRequest(media=str(video), stride=0.5)
    whole = Job(tmp_path / "whole", request).run([("motion", motion, MotionParams(), None)])
    job = Job(tmp_path / "job", request)
    with pytest.raises(AssertionError, match="killed too"):
        job.run([("motion", motion, MotionParams(), 30)])
    kept = job.checkpoints.load()
    writer = CheckpointWriter(job.checkpoints, "seconds", "motion", interval=0.0)
    job.store.clear()
    job.checkpoints.restore(kept)
    writer.write(kept.position, {**kept.state, "version": 0}, files=kept.files)
    again = job.run([("motion", motion, MotionParams(), None)])
    assert again.made[0].start == 0.0 and again == whole
