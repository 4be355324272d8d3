"""bench/peers.py's yolo and tts rows: their inputs are what the docstrings say and their output
comparisons tell a matching answer from a different one (no timing here: the bench measures)."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import soundfile as sf

from bench import peers, peers_tts, peers_yolo
from mediafarm.tasks.families.tts.audio import Joiner
from mediafarm.tasks.families.yolo.frames import keyframe_interval
from mediafarm.tasks.families.yolo.spec import Detection, FrameCounters, YoloResult


def test_the_families_are_registered() -> None:
    assert {"vad", "yolo", "tts-piper", "tts-espeak"} <= set(peers.FAMILIES)


def test_yolo_inputs_are_the_videos_the_docstring_names(tmp_path: Path) -> None:
    videos = peers_yolo.make_inputs(tmp_path, seconds=3)
    assert [v.kind for v in videos] == list(peers_yolo.VIDEOS)
    for video in videos:
        with av.open(str(video.path)) as container:
            stream = container.streams.video[0]
            frames = sum(1 for _ in container.decode(stream))
            assert (stream.width, stream.height) == (video.width, video.height)
        assert frames == video.frames == 3 * peers_yolo.FPS
    camera = next(v for v in videos if v.kind == "camera-720p-gop1s")
    assert keyframe_interval(camera.path) == 1.0  # the farm's keyframes-only path
    # Made once: a second call reuses the files.
    stamps = [v.path.stat().st_mtime_ns for v in videos]
    assert [v.path.stat().st_mtime_ns for v in peers_yolo.make_inputs(tmp_path, seconds=3)] == stamps


def test_yolo_peer_hits_are_joined_as_the_job_joins_them() -> None:
    hits = [(0.0, 0.9), (0.1, 0.8), (0.2, 0.7), (5.0, 0.6)]
    seen = peers_yolo.seen_of_hits(50, hits, step=0.1, join_s=1.0, duration=10.0)
    assert seen == peers_yolo.Seen(50, 4, [(0.0, 0.3), (5.0, 5.1)])


def test_yolo_comparison_tells_same_from_different() -> None:
    found = [Detection(start=0.0, end=1.0, peak_confidence=0.9, box=(0, 0, 1, 1), frames=1),
             Detection(start=5.0, end=7.0, peak_confidence=0.8, box=(0, 0, 1, 1), frames=2)]  # fmt: skip
    result = YoloResult(detections={"person": found}, frames=FrameCounters(examined=7))
    job = peers_yolo.seen_of_result(result.model_dump(mode="json"))
    assert job == peers_yolo.Seen(7, 3, [(0.0, 1.0), (5.0, 7.0)])
    same = peers_yolo.compare(job, peers_yolo.Seen(30, 3, [(0.0, 1.0), (5.0, 7.0)]))
    assert same["same_count"] and same["max_boundary_ms"] == 0.0
    assert (same["model_frames"], same["peer_model_frames"]) == (7, 30)
    moved = peers_yolo.compare(job, peers_yolo.Seen(30, 3, [(0.0, 1.0), (5.5, 7.0)]))
    assert moved["same_count"] and moved["max_boundary_ms"] == 500.0
    fewer = peers_yolo.compare(job, peers_yolo.Seen(30, 1, [(0.0, 1.0)]))
    assert not fewer["same_count"] and fewer["max_boundary_ms"] is None


def test_tts_texts_grow_to_the_long_one() -> None:
    texts = peers_tts.make_texts(60)
    assert [t.name for t in texts][:2] == ["one-sentence", "three-sentences"]
    lengths = [len(t.text) for t in texts]
    assert lengths == sorted(lengths) and lengths[-1] >= 60 * peers_tts.CHARS_PER_SECOND
    assert texts[-1].text.count(".") >= 8
    assert len(peers_tts.make_texts(1)[-1].text) > 400  # always more than one chunk of the rung


def _sentence(rng: np.random.Generator, seconds: float, rate: int) -> np.ndarray:
    # Speech-like: a tone under noise, loud in the middle, quieter at the edges.
    n = int(seconds * rate)
    envelope = np.sin(np.linspace(0, np.pi, n)) ** 0.5
    tone = np.sin(2 * np.pi * rng.uniform(100, 300) * np.arange(n) / rate)
    return (0.5 * envelope * (0.6 * tone + 0.4 * rng.uniform(-1, 1, n))).astype(np.float32)


def test_tts_comparison_finds_the_jobs_sentences_in_a_bare_wav(tmp_path: Path) -> None:
    rate, rng = 22050, np.random.default_rng(1)
    pieces = [_sentence(rng, s, rate) for s in (1.2, 0.7, 2.0)]
    # The bare call: the sentences back to back. The job: the same, joined as the farm joins them.
    sf.write(tmp_path / "bare.wav", np.concatenate(pieces), rate, subtype="PCM_16")
    joined, placed = Joiner(rate).join([0, 1, 2], pieces)
    sf.write(tmp_path / "job.wav", joined, rate, subtype="PCM_16")
    job = peers_tts.Speech(tmp_path / "job.wav", tuple((p.start / rate, p.end / rate) for p in placed))

    same = peers_tts.compare(job, peers_tts.Speech(tmp_path / "bare.wav"))
    assert same["sentences"] == same["same_samples"] == 3 and same["same_count"]
    assert same["max_diff_steps"] <= peers_tts.SAME_STEPS
    assert same["duration_s"] > same["peer_duration_s"]  # the job's 0.3 s gaps

    pieces[1] = pieces[1] * 0.5  # a bare call that said one sentence differently
    sf.write(tmp_path / "other.wav", np.concatenate(pieces), rate, subtype="PCM_16")
    other = peers_tts.compare(job, peers_tts.Speech(tmp_path / "other.wav"))
    assert other["same_samples"] == 2 and not other["same_count"]
    assert other["max_diff_steps"] > 1000
