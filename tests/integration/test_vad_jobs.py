"""VAD jobs through the client, a real Redis and a real prefork worker."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from mediafarm.tasks.producer.client import submit
from mediafarm.tasks.wire.errors import InvalidRequest, JobRejected
from tests.tasks.families.test_vad_engines import assert_matches

pytestmark = pytest.mark.integration


def test_vad_job_returns_true_spans(cpu_worker, speech_track) -> None:
    envelope = submit("vad", media=str(speech_track.path)).wait(timeout=120)
    assert envelope["variant"] == "silero-onnx" and envelope["family"] == "vad"
    output = envelope["output"]
    from mediafarm.tasks.media.intervals import Span

    assert_matches([Span(s["start"], s["end"]) for s in output["spans"]], speech_track.truth)
    assert output["duration"] == pytest.approx(speech_track.duration, abs=0.01)
    assert output["model"].startswith("silero-vad")
    [attempt] = envelope["attempts"]
    assert attempt["outcome"] == "ok" and attempt["worker"] == cpu_worker.node and attempt["peak_rss_mb"] > 50


def test_vad_job_on_a_video_file(cpu_worker, speech_track, media_root: Path) -> None:
    from tests.support.yolo import make_video

    video = make_video(media_root / "cam.mp4", duration=speech_track.duration, width=160, height=120, codec="mpeg4",
                       audio_track=speech_track.path)  # fmt: skip
    output = submit("vad", media=str(video)).wait(timeout=120)["output"]
    assert len(output["spans"]) == len(speech_track.truth)


def _bad_inputs(media_root: Path) -> dict[str, tuple[str, str]]:
    outside = media_root.parent / "outside.wav"
    shutil.copyfile(media_root / "speech.wav", outside)
    link = media_root / "link-out.wav"
    if not link.exists():
        os.symlink(outside, link)
    (media_root / "notes.wav").write_text("not audio at all\n" * 100)
    (media_root / "zero.wav").write_bytes(b"")
    return {
        "missing": (str(media_root / "missing.wav"), "MediaNotFound"),
        "dotdot": (str(media_root / ".." / "outside.wav"), "MediaOutsideRoots"),
        "symlink": (str(link), "MediaOutsideRoots"),
        "text": (str(media_root / "notes.wav"), "UnreadableMedia"),
        "empty": (str(media_root / "zero.wav"), "PermanentFailure"),
    }


def test_bad_inputs_fail_once_with_a_clear_reason(cpu_worker, speech_track, media_root: Path) -> None:
    cases = _bad_inputs(media_root)
    handles = {name: submit("vad", media=path) for name, (path, _) in cases.items()}
    for name, job in handles.items():
        with pytest.raises(JobRejected) as info:
            job.wait(timeout=60)
        expected = cases[name][1]
        assert info.value.reason.startswith(expected), (name, info.value.reason)
        # One attempt, rejected: no retry, no downgrade.
        assert [a["outcome"] for a in info.value.attempts] == ["rejected"], (name, info.value.attempts)
        assert job.state() == "FAILURE"
    # The worker is still alive and serving.
    envelope = submit("vad", media=str(speech_track.path)).wait(timeout=60)
    assert envelope["output"]["spans"]
    assert cpu_worker.process.poll() is None


def test_audio_with_no_speech_gives_empty_spans(cpu_worker, media_root: Path) -> None:
    import numpy as np
    import soundfile as sf

    path = media_root / "hum.wav"
    t = np.arange(16000 * 4) / 16000
    sf.write(path, (0.05 * np.sin(2 * np.pi * 50 * t)).astype(np.float32), 16000)
    output = submit("vad", media=str(path)).wait(timeout=60)["output"]
    assert output["spans"] == [] and output["vad_skipped"] is False and output["duration"] == pytest.approx(4.0)


def test_unknown_family_and_unknown_option_are_named(cpu_worker, speech_track) -> None:
    with pytest.raises(ValueError, match="unknown job family 'vid'"):
        submit("vid", media="x")
    # The producer's own check names the field before anything is sent ...
    with pytest.raises(InvalidRequest, match="vad request: thresold: Extra inputs are not permitted"):
        submit("vad", media=str(speech_track.path), thresold=0.2)
    with pytest.raises(InvalidRequest, match="media: Field required"):
        submit("vad")
    # ... and the worker checks again, for producers that send by task name with a plain client.
    from mediafarm.tasks.app import app
    from mediafarm.tasks.producer.client import handle

    sent = app.send_task("farm.vad.detect", kwargs={"media": str(speech_track.path), "thresold": 0.2})
    with pytest.raises(JobRejected, match="InvalidRequest: vad request: thresold"):
        handle(sent.id).wait(timeout=60)
    positional = app.send_task("farm.vad.detect", args=[str(speech_track.path)])
    with pytest.raises(JobRejected, match="keyword arguments only"):
        handle(positional.id).wait(timeout=60)
