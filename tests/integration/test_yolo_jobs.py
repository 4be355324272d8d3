"""YOLO jobs on a real Redis and a real prefork worker of the cpu pool, end to end.

The models dir holds a random-weight YOLO11n (built from ultralytics' own yaml, exported to ONNX)
under the name the default ladder's ``yolo-nano`` rung asks for. The GPU rungs are unavailable on
the cpu pool (it sees no GPU) and are recorded as such. Jobs go to a queue of this module's own
worker, so its Prometheus counters see every one of them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mediafarm import JobRejected, submit
from mediafarm.tasks.app import app
from mediafarm.tasks.families.yolo.spec import YoloResult
from tests.support.kills import kill_running
from tests.support.yolo import DURATION, FPS, HEIGHT, WIDTH, make_audio_only, make_video, truncated

pytestmark = pytest.mark.integration
QUEUE = "yolo-test"
GPU_RUNGS = ["yolo-large", "yolo-small"]


@pytest.fixture(scope="module")
def yolo_worker(start_worker, random_yolo):
    from mediafarm.workers.embedded import free_port

    port = free_port()
    worker = start_worker("cpu", concurrency=1, queues=[QUEUE], env={"FARM_METRICS_PORT": str(port)})
    worker.metrics_url = f"http://127.0.0.1:{port}/metrics"
    return worker


@pytest.fixture(scope="module")
def video(media_root: Path) -> Path:
    return make_video(media_root / "yolo-moving.mp4")


def scrape(url: str, name: str, **labels: str) -> float:
    """The sum of the samples of metric ``name`` that carry ``labels`` (in any order)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())  # fmt: skip


def outcomes(attempts: list[dict]) -> list[tuple[str, str]]:
    return [(a["variant"], a["outcome"]) for a in attempts]


def test_detect_job_runs_on_the_cpu_rung_and_counts_its_frames(yolo_worker, video: Path) -> None:
    examined = {"family": "yolo", "variant": "yolo-nano", "fate": "examined"}
    before = scrape(yolo_worker.metrics_url, "mediafarm_frames_total", **examined)
    job = submit("yolo", queue=QUEUE, media=str(video), classes="person,car", stride=0.5)
    envelope = job.wait(timeout=120)
    assert envelope["family"] == "yolo" and envelope["rung"] == "yolo-nano" and envelope["rung_index"] == 2
    assert outcomes(envelope["attempts"]) == [("yolo-large", "unavailable"), ("yolo-small", "unavailable"),
                                              ("yolo-nano", "ok")]  # fmt: skip
    assert all("GPU" in a["reason"] for a in envelope["attempts"][:2])
    result = job.output()
    assert isinstance(result, YoloResult) and result.detections == {"person": [], "car": []}
    frames = result.frames
    assert (frames.decoded, frames.sampled) == (DURATION * FPS, DURATION / 0.5)
    assert 0 < frames.examined < frames.sampled and frames.examined + frames.skipped == frames.sampled
    assert frames.model_ms_per_frame > 0 and "onnxruntime" in result.model
    assert (result.width, result.height, result.duration, result.motion_only) == (WIDTH, HEIGHT, DURATION, False)
    # The worker's main process counted them (its pool child's registry is never scraped), as the
    # child's result reached it: a moment after the client saw the stored result.
    deadline = time.monotonic() + 10
    while scrape(yolo_worker.metrics_url, "mediafarm_frames_total", **examined) != before + frames.examined:
        assert time.monotonic() < deadline, scrape(yolo_worker.metrics_url, "mediafarm_frames_total", **examined)
        time.sleep(0.1)
    assert scrape(yolo_worker.metrics_url, "mediafarm_model_ms_per_frame_count", family="yolo") >= 1
    # ... and never loaded torch or a model runtime itself.
    [reply] = app.control.broadcast("farm_main_process", destination=[yolo_worker.node], reply=True, timeout=5)
    report = reply[yolo_worker.node]
    assert report["torch_imported"] is False and report["model_runtimes"] == []


def test_killed_on_the_yolo_rung_the_job_comes_back_on_motion(yolo_worker, media_root: Path) -> None:
    long = make_video(media_root / "yolo-long.mp4", duration=60, moving=((10.0, 14.0), (40.0, 44.0)))
    job = submit("yolo", queue=QUEUE, media=str(long), stride=0.2)
    kill_running(job, "yolo-nano")
    envelope = job.wait(timeout=120)
    assert envelope["job_id"] == job.id and envelope["variant"] == "motion"
    assert outcomes(envelope["attempts"])[-2:] == [("yolo-nano", "killed"), ("motion", "ok")]
    output = envelope["output"]
    assert output["motion_only"] and output["model"] == "motion prefilter"
    assert [(round(d["start"]), round(d["end"])) for d in output["detections"]["motion"]] == [(10, 14), (40, 44)]
    assert yolo_worker.process.poll() is None


def test_absent_weights_make_their_rung_unavailable_and_the_next_one_runs(yolo_worker, video: Path) -> None:
    envelope = submit("yolo", queue=QUEUE, media=str(video), ladder="yolo_missing_weights").wait(timeout=120)
    absent, ran = envelope["attempts"]
    assert (absent["variant"], absent["outcome"]) == ("yolo-absent", "unavailable")
    assert "'yolo11x.onnx' is not in the models dir" in absent["reason"]
    assert (ran["variant"], ran["outcome"], envelope["variant"]) == ("yolo-nano", "ok", "yolo-nano")


def cut_short(name: str) -> str:
    """The reason a file cut short that still opens is rejected with (issue #7), as a pattern."""
    return (re.escape(f"UnreadableMedia: {name}: truncated: the video stream ends at ") + r"\d+\.\d"
            + re.escape(f" s of the {DURATION:.1f} s its container declares"))  # fmt: skip


def test_bad_inputs_are_rejected_once_with_the_reason(yolo_worker, video: Path, media_root: Path) -> None:
    moov_at_end = truncated(video, media_root / "yolo-truncated.mp4")
    # Cut short but still opening: the index (faststart) or the header (Matroska) is whole.
    faststart = make_video(media_root / "yolo-faststart.mp4", options={"movflags": "+faststart"})
    faststart_cut = truncated(faststart, media_root / "yolo-cut-faststart.mp4")
    mkv_cut = truncated(make_video(media_root / "yolo.mkv"), media_root / "yolo-cut.mkv")
    tone = make_audio_only(media_root / "yolo-tone.wav")
    cases = {
        "truncated": ({"media": str(moov_at_end)}, re.escape("UnreadableMedia: not a media file FFmpeg can read")),
        "truncated faststart mp4": ({"media": str(faststart_cut)}, cut_short(faststart_cut.name)),
        "truncated mkv": ({"media": str(mkv_cut)}, cut_short(mkv_cut.name)),
        "no video": ({"media": str(tone)}, "UnreadableMedia: "),
        "unknown class": ({"media": str(video), "classes": "person,unicorn"}, "InvalidRequest: yolo request:"),
    }
    jobs = {name: submit("yolo", queue=QUEUE, **fields) for name, (fields, _) in cases.items()}
    for name, job in jobs.items():
        with pytest.raises(JobRejected) as info:
            job.wait(timeout=60)
        assert re.search(cases[name][1], info.value.reason), (name, info.value.reason)
        tried = [a for a in info.value.attempts if a["outcome"] != "unavailable"]
        assert outcomes(tried) == [("yolo-nano", "rejected")], (name, info.value.attempts)
    with pytest.raises(JobRejected, match="has no video stream"):
        jobs["no video"].wait(timeout=5)


def test_cli_submits_waits_and_shows_the_intervals(yolo_worker, video: Path) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    cli = [sys.executable, "-m", "mediafarm.workers.cli"]
    families = subprocess.run([*cli, "families"], env=env, capture_output=True, text=True, timeout=60)
    assert families.returncode == 0 and "farm.yolo.detect" in families.stdout, families.stdout + families.stderr
    proc = subprocess.run([*cli, "submit", "yolo", str(video), "--queue", QUEUE, "--wait", "-p", "classes=person"],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rung yolo-nano" in proc.stdout and "frames decoded 120" in proc.stdout
    assert "nothing found (person)" in proc.stdout
