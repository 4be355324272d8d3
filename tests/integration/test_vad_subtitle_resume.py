"""VAD and subtitle jobs killed mid-way resume from their checkpoints (issue #19), on a real worker
that keeps a checkpoint every 0.2 s: the result equals an unkilled run's, the history says where
each attempt resumed from, and a corrupt checkpoint is ignored with a record.

Each kill waits for a checkpoint at or past a share of the media (early, middle), then SIGKILLs
the attempt's child as the kernel's OOM killer would; the job moves down its ladder, and the
test ladders (tests/support/farm-test.toml) repeat the same engine so that the next rung goes on
exactly. Kills land while checkpoints are written five times a second, so some fall inside a
write; the torn write itself (the previous checkpoint stays whole) is tests/tasks/test_checkpoint.py's.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from mediafarm.config.settings import get_settings
from mediafarm.tasks.producer.client import submit
from mediafarm.tasks.wire.artifacts import CHECKPOINT_FOLDER, job_folder
from mediafarm.tasks.wire.checkpoint import MANIFEST
from tests.support.speech import write_long_track

pytestmark = pytest.mark.integration
QUEUE = "resume-test"


@pytest.fixture(scope="module")
def resume_worker(start_worker):
    return start_worker("cpu", concurrency=2, queues=[QUEUE], env={"FARM_CHECKPOINT_INTERVAL": "0.2"})


def manifest(job_id: str) -> dict[str, Any] | None:
    path = job_folder(get_settings().storage_dir, job_id) / CHECKPOINT_FOLDER / MANIFEST
    try:
        return json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None


def kill_at_checkpoint(job: Any, variant: str, at_least: float, *, timeout: float = 90.0) -> float:
    """SIGKILL ``job``'s open attempt on ``variant`` once that rung has kept a checkpoint at or past
    ``at_least`` (seconds into the media); the position it saw."""
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"no checkpoint of {variant} past {at_least} s: {job.attempts()}"
        running = [a for a in job.attempts() if a["outcome"] is None and a["variant"] == variant]
        kept = manifest(job.id)
        if running and kept and kept["rung"] == variant and kept["position"] >= at_least:
            os.kill(running[0]["pid"], signal.SIGKILL)
            return float(kept["position"])
        time.sleep(0.02)


# ---------------------------------------------------------------------------------------------
# VAD


@pytest.fixture(scope="module")
def long_speech(media_root: Path, speech_track) -> tuple[Path, float]:
    """Fifteen minutes of speech and pauses: a few seconds of silero."""
    path = media_root / "resume-long.wav"
    return path, write_long_track(path, 900.0, speech_track)


def vad_job(media: Path, **fields: Any) -> Any:
    return submit("vad", queue=QUEUE, media=str(media), ladder="vad_resume", **fields)


@pytest.fixture(scope="module")
def vad_whole(resume_worker, long_speech) -> dict[str, Any]:
    """The unkilled run's envelope."""
    whole = vad_job(long_speech[0]).wait(timeout=180)
    assert whole["variant"] == "silero-a" and whole["output"]["made"] == []
    return whole


def test_a_vad_job_killed_early_and_mid_way_equals_an_unkilled_run(resume_worker, long_speech, vad_whole) -> None:
    media, duration = long_speech
    whole = vad_whole

    job = vad_job(media)
    early = kill_at_checkpoint(job, "silero-a", 0.15 * duration)
    middle = kill_at_checkpoint(job, "silero-b", 0.55 * duration)
    envelope = job.wait(timeout=180)
    assert envelope["variant"] == "silero-c"
    assert envelope["output"]["spans"] == whole["output"]["spans"]
    assert envelope["output"]["duration"] == whole["output"]["duration"]

    first, second, third = envelope["attempts"]
    assert (first["outcome"], second["outcome"], third["outcome"]) == ("killed", "killed", "ok")
    assert first.get("resumed_from") is None
    # Each attempt resumed from the last checkpoint its predecessor kept: at or past where the
    # test saw it, and before the media's end.
    assert early <= second["resumed_from"]["position"] < middle <= third["resumed_from"]["position"] < duration
    assert second["resumed_from"]["rung"] == "silero-a" and third["resumed_from"]["rung"] == "silero-b"
    made = envelope["output"]["made"]
    assert [m["rung"] for m in made] == ["silero-a", "silero-b", "silero-c"]
    assert made[0]["start"] == 0 and made[-1]["end"] == pytest.approx(duration, abs=0.05)
    assert all(a["end"] == b["start"] for a, b in zip(made, made[1:], strict=False))  # no gap, no overlap
    assert made[1]["start"] == second["resumed_from"]["position"]
    # The checkpoint goes when the job ends for good.
    assert not (job_folder(get_settings().storage_dir, job.id) / CHECKPOINT_FOLDER).exists()


def test_a_corrupt_checkpoint_is_ignored_recorded_and_the_job_runs_whole(resume_worker, long_speech, vad_whole) -> None:
    media, _ = long_speech
    whole = vad_whole
    job_id = f"resume-corrupt-{uuid.uuid4().hex[:8]}"
    folder = job_folder(get_settings().storage_dir, job_id) / CHECKPOINT_FOLDER
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text('{"format": 1, "position": 600.0, "sta')  # torn, as a disk fault leaves it
    envelope = vad_job(media, job_id=job_id).wait(timeout=180)
    [attempt] = envelope["attempts"]
    assert "corrupt" in attempt["checkpoint_ignored"] and attempt.get("resumed_from") is None
    assert envelope["output"]["spans"] == whole["output"]["spans"] and envelope["output"]["made"] == []


# ---------------------------------------------------------------------------------------------
# Subtitles


@pytest.fixture(scope="module")
def talk(media_root: Path, speech_track) -> tuple[Path, float]:
    """Two and a half minutes of the espeak-ng sentences: six or so recognition windows."""
    path = media_root / "resume-talk.wav"
    return path, write_long_track(path, 150.0, speech_track)


def subtitle_job(media: Path, **fields: Any) -> Any:
    return submit("subtitle", queue=QUEUE, media=str(media), chunk_seconds=10, formats=["vtt", "srt"], **fields)


def artifacts(job_id: str) -> dict[str, str]:
    folder = job_folder(get_settings().storage_dir, job_id)
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)}  # fmt: skip


def without_rungs(doc: dict[str, Any]) -> dict[str, Any]:
    cues = [{k: v for k, v in cue.items() if k != "rung"} for cue in doc["cues"]]
    return {**{k: v for k, v in doc.items() if k not in ("made", "rung", "variant")}, "cues": cues}


def test_a_subtitle_job_killed_early_and_mid_way_equals_an_unkilled_run(resume_worker, tiny_en, talk) -> None:
    media, duration = talk
    whole = subtitle_job(media, ladder="subtitle_resume")
    whole_envelope = whole.wait(timeout=240)
    assert whole_envelope["variant"] == "tiny-a"

    job = subtitle_job(media, ladder="subtitle_resume")
    early = kill_at_checkpoint(job, "tiny-a", 0.1 * duration)
    middle = kill_at_checkpoint(job, "tiny-b", 0.5 * duration)
    envelope = job.wait(timeout=240)
    assert envelope["variant"] == "tiny-c"
    first, second, third = envelope["attempts"]
    assert [a["outcome"] for a in envelope["attempts"]] == ["killed", "killed", "ok"]
    assert early <= second["resumed_from"]["position"] < middle <= third["resumed_from"]["position"] < duration
    assert [m["rung"] for m in third["resumed_from"]["made"]] == ["tiny-a", "tiny-b"]

    # Identical words, cues and files (temperature 0, the same model throughout), but for who made which.
    files, whole_files = artifacts(job.id), artifacts(whole.id)
    assert files.keys() == whole_files.keys()
    doc, whole_doc = json.loads(files.pop("subtitles.json")), json.loads(whole_files.pop("subtitles.json"))
    assert without_rungs(doc) == without_rungs(whole_doc) and files == whole_files
    assert {k: v for k, v in envelope["output"].items() if k != "made"} == {
        k: v for k, v in whole_envelope["output"].items() if k != "made"}
    made = envelope["output"]["made"]
    assert [m["rung"] for m in made] == ["tiny-a", "tiny-b", "tiny-c"] and made == doc["made"]
    assert all(a["end"] == b["start"] for a, b in zip(made, made[1:], strict=False))
    assert {c["rung"] for c in doc["cues"]} <= {"tiny-a", "tiny-b", "tiny-c"} and doc["cues"][0]["rung"] == "tiny-a"
    assert not (job_folder(get_settings().storage_dir, job.id) / CHECKPOINT_FOLDER).exists()


def test_a_subtitle_job_killed_on_tiny_en_is_finished_by_pocketsphinx_from_there(resume_worker, tiny_en, talk) -> None:
    media, duration = talk
    job = subtitle_job(media)  # the default ladder: tiny.en is the first rung this pool has
    at = kill_at_checkpoint(job, "whisper-tiny", 0.5 * duration)
    envelope = job.wait(timeout=240)
    assert envelope["variant"] == "pocketsphinx"
    resumed = envelope["attempts"][-1]["resumed_from"]
    assert resumed["rung"] == "whisper-tiny" and at <= resumed["position"] < duration
    doc = json.loads(artifacts(job.id)["subtitles.json"])
    position = resumed["position"]
    assert doc["made"] == [{"start": 0.0, "end": position, "rung": "whisper-tiny"},
                           {"start": position, "end": doc["made"][1]["end"], "rung": "pocketsphinx"}]  # fmt: skip
    cues = doc["cues"]
    assert {c["rung"] for c in cues if c["start"] < position} == {"whisper-tiny"}
    assert {c["rung"] for c in cues if c["start"] >= position} == {"pocketsphinx"}
    # The cue rules and timing checks ran over the whole result: in order, no overlap at the join.
    timing = envelope["output"]["timing"]
    assert timing["monotonic"] and timing["overlaps"] == 0 and timing["words_in_silence"] == 0
    assert timing["cues"] == len(cues) == envelope["output"]["cues"]
