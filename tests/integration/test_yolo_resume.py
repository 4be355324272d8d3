"""YOLO jobs killed on a real worker go on from their checkpoint (issue #19), end to end.

A worker of the cpu pool writes checkpoints every 0.2 s (FARM_CHECKPOINT_INTERVAL). A job's child
is SIGKILLed once its checkpoint has passed a point in the video (early, or mid-way); the job moves
down its ladder, and the next rung goes on from the checkpoint. ``yolo_twice`` has the same model
on both rungs, so the result must be the one of a job never killed; ``yolo_then_motion`` ends on
the motion gate, whose spans after the join must be the ones the motion gate alone finds.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from mediafarm import submit
from mediafarm.config.settings import get_settings
from mediafarm.tasks.wire.artifacts import job_folder
from mediafarm.tasks.wire.checkpoint import FOLDER, MANIFEST
from tests.support.yolo import make_video

pytestmark = pytest.mark.integration
QUEUE = "yolo-resume-test"
DURATION = 30.0
# Something moves most of the time: most samples go to the model, so the job lasts long enough to kill.
MOVING = ((3.0, 12.0), (17.0, 26.0))
# One sample a second on the model rungs: half the model's work of the ladder's 0.5 s.
STRIDE = 1.0


@pytest.fixture(scope="module")
def worker(start_worker, random_yolo):
    return start_worker("cpu", concurrency=1, queues=[QUEUE], env={"FARM_CHECKPOINT_INTERVAL": "0.2"})


@pytest.fixture(scope="module")
def video(media_root: Path) -> Path:
    return make_video(media_root / "yolo-resume.mp4", duration=DURATION, moving=MOVING)


def kill_past(job: Any, variant: str, seconds: float, timeout: float = 120.0) -> float | None:
    """SIGKILL ``job``'s attempt on ``variant`` once its checkpoint is past ``seconds`` of the
    video; the checkpoint's position read just before the kill. None if the attempt ended first
    (a random-weight model runs the whole video in well under a second on a quiet machine, and a
    busy one may not let this look see it between two checkpoints)."""
    manifest = job_folder(get_settings().storage_dir, job.id) / FOLDER / MANIFEST
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"job {job.id} never checkpointed past {seconds} s: {job.attempts()}"
        attempts = job.attempts()
        if any(a["variant"] == variant and a["outcome"] is not None for a in attempts):
            return None  # it ended before it could be killed past there
        running = [a for a in attempts if a["outcome"] is None and a["variant"] == variant]
        try:
            position = json.loads(manifest.read_bytes())["position"]
        except (OSError, ValueError):
            position = -1.0
        if running and position >= seconds:
            os.kill(running[0]["pid"], signal.SIGKILL)
            return position
        time.sleep(0.01)


@pytest.fixture(scope="module")
def never_killed(worker, video: Path) -> dict[str, Any]:
    return submit("yolo", queue=QUEUE, media=str(video), stride=STRIDE, ladder="yolo_twice").wait(timeout=300)


def without_timing(output: dict[str, Any]) -> dict[str, Any]:
    frames = {k: v for k, v in output["frames"].items() if k != "model_ms_per_frame"}
    return {**{k: v for k, v in output.items() if k not in ("frames", "made")}, "frames": frames}


@pytest.mark.parametrize("kill_at", [2.0, 15.0], ids=["early", "mid-way"])
def test_killed_on_one_rung_the_next_goes_on_and_the_result_is_a_run_never_killed(
    worker, video: Path, never_killed: dict[str, Any], kill_at: float
) -> None:
    assert [p["rung"] for p in never_killed["output"]["made"]] == ["nano-a"]
    for _ in range(5):  # a job that ended before the kill proves nothing here: another one
        job = submit("yolo", queue=QUEUE, media=str(video), stride=STRIDE, ladder="yolo_twice")
        seen = kill_past(job, "nano-a", kill_at)
        envelope = job.wait(timeout=300)
        if seen is not None:
            break
    assert seen is not None, "five jobs in a row ended before the kill"
    first, second = envelope["attempts"]
    assert (first["variant"], first["outcome"], second["variant"], second["outcome"]) == (
        "nano-a", "killed", "nano-b", "ok")  # fmt: skip
    resumed = second["resumed_from"]
    join = resumed["position"]
    assert kill_at <= seen <= join < DURATION
    assert resumed == {"position": join, "unit": "seconds", "rung": "nano-a",
                       "made": [{"start": 0.0, "end": join, "rung": "nano-a"}]}  # fmt: skip
    output = envelope["output"]
    assert [(p["start"], p["end"], p["rung"]) for p in output["made"]] == [
        (0.0, join, "nano-a"), (join, DURATION, "nano-b")]  # fmt: skip
    # Every frame decoded, sampled, examined or skipped once, as in the job never killed.
    assert without_timing(output) == without_timing(never_killed["output"])
    assert output["frames"]["examined"] > 15
    assert envelope["artifacts"] == []  # the gate's kept state is the checkpoint's, not the job's
    assert not (job_folder(get_settings().storage_dir, job.id) / FOLDER).exists()  # gone with the job's success


def test_killed_on_the_model_the_motion_rung_makes_the_rest(worker, video: Path) -> None:
    alone = submit("yolo", queue=QUEUE, media=str(video), ladder="yolo_motion").wait(timeout=300)["output"]
    for _ in range(5):  # as above: only a job killed mid-way tells anything
        job = submit("yolo", queue=QUEUE, media=str(video), ladder="yolo_then_motion")
        seen = kill_past(job, "yolo-nano", 6.0)
        envelope = job.wait(timeout=300)
        if seen is not None:
            break
    assert seen is not None, "five jobs in a row ended before the kill"
    assert [(a["variant"], a["outcome"]) for a in envelope["attempts"]] == [("yolo-nano", "killed"), ("motion", "ok")]
    join = envelope["attempts"][1]["resumed_from"]["position"]
    output = envelope["output"]
    assert [(p["rung"], p["model"].split()[0]) for p in output["made"]] == [("yolo-nano", "yolo11n.onnx"),
                                                                          ("motion", "motion")]  # fmt: skip
    assert not output["motion_only"] and output["detections"]["person"] == []
    # After the join, the motion gate's spans, as the motion rung alone finds them.
    after = [(d["start"], d["end"]) for d in output["detections"]["motion"]]
    expected = [(max(d["start"], join - 0.5), d["end"]) for d in alone["detections"]["motion"] if d["end"] > join]
    assert after == expected and len(after) == 2
