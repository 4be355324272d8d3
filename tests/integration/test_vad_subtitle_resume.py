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
from mediafarm.tasks.artifacts import CHECKPOINT_FOLDER, job_folder
from mediafarm.tasks.checkpoint import MANIFEST
from mediafarm.tasks.client import submit
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
    """Twenty minutes of speech and pauses: a few seconds of silero on this machine."""
    path = media_root / "resume-long.wav"
    return path, write_long_track(path, 1200.0, speech_track)


def vad_job(media: Path, **fields: Any) -> Any:
    return submit("vad", queue=QUEUE, media=str(media), ladder="vad_resume", **fields)


def test_a_vad_job_killed_early_and_mid_way_equals_an_unkilled_run(resume_worker, long_speech) -> None:
    media, duration = long_speech
    whole = vad_job(media).wait(timeout=180)
    assert whole["variant"] == "silero-a" and whole["output"]["made"] == []

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


def test_a_corrupt_checkpoint_is_ignored_recorded_and_the_job_runs_whole(resume_worker, long_speech) -> None:
    media, _ = long_speech
    whole = vad_job(media).wait(timeout=180)
    job_id = f"resume-corrupt-{uuid.uuid4().hex[:8]}"
    folder = job_folder(get_settings().storage_dir, job_id) / CHECKPOINT_FOLDER
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text('{"format": 1, "position": 600.0, "sta')  # torn, as a disk fault leaves it
    envelope = vad_job(media, job_id=job_id).wait(timeout=180)
    [attempt] = envelope["attempts"]
    assert "corrupt" in attempt["checkpoint_ignored"] and attempt.get("resumed_from") is None
    assert envelope["output"]["spans"] == whole["output"]["spans"] and envelope["output"]["made"] == []
