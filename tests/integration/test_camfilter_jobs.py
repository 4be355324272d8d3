"""The cam-filter pipeline end to end on a real worker: VAD ∥ YOLO, then the cut.

The test recording (made here): a static scene in which a dark rectangle moves during known spans,
and espeak-ng speech on its audio track during other known spans; a keyframe every second. The
YOLO stage runs the ``yolo_motion`` ladder (the motion gate alone, which finds the rectangle) or
the default ladder with a random-weight YOLO11n (which sees nothing: the clips then come from the
speech alone). Every job of a pipeline goes to this module's own worker (two children, so the
stages run in parallel).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from mediafarm import JobRejected, submit
from mediafarm.tasks.families.camfilter.check import check_clip
from mediafarm.tasks.families.camfilter.spec import CamfilterResult, stage_job_id
from tests.support.kills import killing
from tests.support.speech import make_track
from tests.support.yolo import make_video, truncated

pytestmark = pytest.mark.integration
QUEUE = "camfilter-test"
MOVING = ((8.0, 11.0), (17.5, 19.0))  # the second overlaps the second sentence
RULES = {"pad_before": 0.5, "pad_after": 0.5, "min_gap": 2.0, "min_clip": 1.0}
TOLERANCE = 1.2  # seconds: the motion gate's stride and margins


@pytest.fixture(scope="module")
def camfilter_worker(start_worker):
    return start_worker("cpu", concurrency=2, queues=[QUEUE])


@pytest.fixture(scope="module")
def recording(media_root: Path) -> tuple[Path, list[tuple[float, float]]]:
    """(video with speech, the speech's true spans)."""
    track = make_track(media_root / "camfilter-speech.wav", gaps=(1.0, 14.0, 8.0),
                       phrases=("Someone is at the door.", "The parcel is on the step."))  # fmt: skip
    target = make_video(media_root / "camfilter.mp4", duration=track.duration, moving=MOVING, gop=10,
                        audio_track=track.path)  # fmt: skip
    return target, track.truth


def run(media: Path, **fields) -> tuple[CamfilterResult, dict]:
    job = submit("camfilter", queue=QUEUE, media=str(media), rules=RULES, **fields)
    envelope = job.wait(timeout=180)
    return CamfilterResult.model_validate(envelope["output"]), envelope


def clip_files(job_id: str, result: CamfilterResult) -> list[Path]:
    from mediafarm.config.settings import get_settings
    from mediafarm.tasks.wire.artifacts import ArtifactStore

    store = ArtifactStore(get_settings().storage_dir, job_id)
    return [store.path(clip.file) for clip in result.clips]


def near(clip, start: float, end: float) -> bool:
    return abs(clip.start - start) <= TOLERANCE and abs(clip.end - end) <= TOLERANCE


def test_clips_where_someone_is_heard_or_moves_with_their_reasons(camfilter_worker, recording) -> None:
    media, speech = recording
    result, envelope = run(media, yolo_ladder="yolo_motion")
    (s1, e1), (s2, e2) = speech
    pad = RULES["pad_before"]
    assert [c.reasons for c in result.clips] == [["speech"], ["motion"], ["motion", "speech"]], result.clips
    first, moving, both = result.clips
    assert near(first, s1 - pad, e1 + pad) and near(moving, MOVING[0][0] - pad, MOVING[0][1] + pad)
    assert near(both, min(s2, MOVING[1][0]) - pad, max(e2, MOVING[1][1]) + pad)
    for clip, path in zip(result.clips, clip_files(envelope["job_id"], result), strict=True):
        frames, _ = check_clip(path)  # opens and decodes
        # A keyframe every second: each clip is copied or smart-cut, re-encoding under a second.
        assert clip.method in ("copy", "smart") and clip.reencoded < 1.0 and clip.reason == "", clip
        assert clip.frames == frames and abs(frames - (clip.end - clip.start) * 10) <= 3
    assert result.stages["vad"].rung == "silero-onnx" and result.stages["vad"].flags == []
    assert result.stages["yolo"].rung == "motion" and result.stages["yolo"].flags == ["motion_only"]
    assert result.stages["vad"].job_id == stage_job_id(envelope["job_id"], "vad")


def test_the_real_model_stage_runs_and_finds_nothing_so_speech_alone_is_kept(
    camfilter_worker, recording, random_yolo
) -> None:
    media, speech = recording
    result, _ = run(media)
    assert result.stages["yolo"].rung == "yolo-nano" and result.detection_spans == 0
    assert [c.reasons for c in result.clips] == [["speech"], ["speech"]]
    assert [a["outcome"] for a in result.stages["yolo"].attempts] == ["unavailable", "unavailable", "ok"]


def test_a_recording_without_audio_gives_clips_from_the_video_alone(camfilter_worker, media_root: Path) -> None:
    silent = make_video(media_root / "camfilter-mute.mp4", duration=20.0, moving=MOVING, gop=10)
    result, _ = run(silent, yolo_ladder="yolo_motion")
    assert result.stages["vad"].flags == ["no_audio"] and result.speech_spans == 0
    assert [c.reasons for c in result.clips] == [["motion"], ["motion"]]


def test_a_vad_killed_on_every_rung_ends_on_skip_and_the_clips_come_from_yolo(camfilter_worker, recording) -> None:
    media, _ = recording
    job_id = f"camfilter-vad-killed-{time.monotonic_ns()}"
    with killing(stage_job_id(job_id, "vad"), {"silero-onnx", "webrtc"}) as killed:
        job = submit("camfilter", queue=QUEUE, job_id=job_id, media=str(media), rules=RULES, yolo_ladder="yolo_motion")
        result = CamfilterResult.model_validate(job.wait(timeout=180)["output"])
    vad = result.stages["vad"]
    assert vad.rung == "skip" and vad.flags == ["vad_skipped"]
    assert [(a["variant"], a["outcome"]) for a in vad.attempts] == [
        ("silero-onnx", "killed"), ("webrtc", "killed"), ("skip", "ok")
    ]
    assert len(killed) == 2
    assert result.clips and all(c.reasons == ["motion"] for c in result.clips)


def test_a_yolo_stage_killed_once_comes_back_on_its_next_rung(camfilter_worker, recording, random_yolo) -> None:
    media, _ = recording
    job_id = f"camfilter-yolo-killed-{time.monotonic_ns()}"
    with killing(stage_job_id(job_id, "yolo"), {"yolo-nano"}) as killed:
        job = submit("camfilter", queue=QUEUE, job_id=job_id, media=str(media), rules=RULES)
        result = CamfilterResult.model_validate(job.wait(timeout=180)["output"])
    yolo = result.stages["yolo"]
    assert yolo.job_id == stage_job_id(job_id, "yolo") and len(killed) == 1
    assert [(a["variant"], a["outcome"]) for a in yolo.attempts][-2:] == [("yolo-nano", "killed"), ("motion", "ok")]
    assert "motion" in {r for c in result.clips for r in c.reasons}


def test_a_corrupt_recording_fails_the_pipeline_naming_the_stage(camfilter_worker, media_root: Path) -> None:
    broken = media_root / "camfilter-broken.mp4"
    broken.write_bytes(b"\x00\x00\x00\x18ftypmp42" + os.urandom(4096))
    job = submit("camfilter", queue=QUEUE, media=str(broken))
    with pytest.raises(JobRejected) as failure:
        job.wait(timeout=120)
    assert "failed, so cut never ran" in str(failure.value) and "FFmpeg" in str(failure.value)


def test_a_recording_cut_short_fails_the_pipeline_at_its_yolo_stage(camfilter_worker, media_root: Path) -> None:
    # Issue #7: the file still opens (its MP4 index is first) and decodes up to the cut. No audio
    # track, so the VAD stage answers no_audio as ever, and the YOLO stage names the cut.
    whole = make_video(media_root / "camfilter-whole.mp4", duration=20.0, moving=MOVING, gop=10,
                       options={"movflags": "+faststart"})  # fmt: skip
    cut = truncated(whole, media_root / "camfilter-cut.mp4")
    job = submit("camfilter", queue=QUEUE, media=str(cut), yolo_ladder="yolo_motion")
    with pytest.raises(JobRejected) as failure:
        job.wait(timeout=120)
    reason = str(failure.value)
    assert f"YOLO ({stage_job_id(job.id, 'yolo')}) failed, so cut never ran" in reason, reason
    assert re.search(r"camfilter-cut\.mp4: truncated: the video stream ends at \d+\.\d s of the 20\.0 s", reason)


def test_clips_json_lists_the_clips_and_the_stage_histories(camfilter_worker, recording) -> None:
    media, _ = recording
    job = submit("camfilter", queue=QUEUE, media=str(media), rules=RULES, yolo_ladder="yolo_motion")
    job.wait(timeout=180)
    target = Path(job.download("clips.json", Path(os.environ["FARM_STORAGE_DIR"]).parent / f"{job.id}.json"))
    listed = json.loads(target.read_text())
    assert [c["file"] for c in listed["clips"]] == [c.file for c in job.output().clips]
    assert set(listed["stages"]) == {"vad", "yolo"} and listed["stages"]["vad"]["attempts"]


def test_the_cli_runs_the_pipeline_and_downloads_the_clips(camfilter_worker, recording, tmp_path: Path) -> None:
    import sys

    media, _ = recording
    out = tmp_path / "clips-out"
    proc = subprocess.run(
        [sys.executable, "-m", "mediafarm.workers.cli", "submit", "camfilter", str(media), "--queue", QUEUE,
         "--wait", "--out", str(out), "-p", "yolo_ladder=yolo_motion", "-p", f"rules={json.dumps(RULES)}"],
        env={**os.environ, "COLUMNS": "200"}, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 clips" in proc.stdout and "motion_only" in proc.stdout
    clips = sorted((out / "clips").iterdir())
    assert len(clips) == 3 and all(check_clip(path)[0] > 0 for path in clips)
    assert (out / "clips.json").is_file()
