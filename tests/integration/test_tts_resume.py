"""TTS jobs that lose attempts on real workers (issue #19): a long text goes on from its last
checkpoint on the same rung, starts over on another rung, and a dialogue line starts over.

The ladder: ``piper`` (the real joe voice), then ``espeak-slow``: espeak-ng behind a wrapper
that waits a little before every call, so a text lasts long enough to be cut at chosen chunks.
Checkpoints every 0.1 s (FARM_CHECKPOINT_INTERVAL): one after nearly every chunk.

A killed child moves the job one rung down (``tasks.runtime.downgrade``), so the same rung runs again
only when the worker itself is lost: here a cold shutdown (SIGQUIT, as ``docker compose stop``
does), which hands the job back at once, and a new worker takes it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from mediafarm import submit
from mediafarm.config.settings import get_settings
from mediafarm.tasks.families.dialogue.script import line_job_id
from mediafarm.tasks.families.tts.resume import SHORT_TEXT_CHARS
from mediafarm.tasks.producer.client import JobHandle, handle
from mediafarm.tasks.wire.artifacts import ArtifactStore
from tests.conftest import REPO
from tests.support.espeak import hold_script
from tests.support.kills import kill_running
from tests.support.piper_voice import link_joe_voice

pytestmark = pytest.mark.integration
QUEUE = "tts-resume-test"
LADDER = """
[ladders.tts]
rungs = [
  {{ name = "piper", engine = "piper", params = {{ max_chars = 100 }} }},
  {{ name = "espeak-slow", engine = "espeak", params = {{ binary = "{slow}", max_chars = 100 }} }},
]
"""
SENTENCES = ("The quick brown fox jumps over the lazy dog.", "Please leave the package at the front door.",
             "Someone is walking across the garden now.", "Turn off the lights before you go to sleep.")  # fmt: skip
LONG = " ".join(SENTENCES[i % 4] for i in range(SHORT_TEXT_CHARS // 40 + 6))
ENV = {"FARM_CHECKPOINT_INTERVAL": "0.1", "FARM_SOFT_SHUTDOWN_TIMEOUT": "1"}


def slow_espeak(path: Path, wait_s: float) -> Path:
    return hold_script(path, wait_s, when=None)


class Workers:
    """This module's workers on its own queue; one running a job can be shut down and replaced."""

    def __init__(self, start: Callable[[], Any]) -> None:
        self.start, self.live = start, [start()]

    def replace_the_one_running(self, job: JobHandle) -> None:
        """Cold-shut-down the worker running ``job``'s open attempt (its message goes back to the
        queue at once, its child is ended: the attempt is lost) and start another in its place."""
        deadline = time.monotonic() + 30
        while not (running := [a for a in job.attempts() if a["outcome"] is None]):
            assert time.monotonic() < deadline, f"job {job.id} is not running: {job.attempts()}"
            time.sleep(0.02)
        [worker] = [w for w in self.live if w.node == running[0]["worker"]]
        os.kill(worker.main_pid(), signal.SIGQUIT)
        assert worker.process.wait(30) is not None
        self.live.remove(worker)
        self.live.append(self.start())


@pytest.fixture(scope="module")
def workers(start_worker, session_dir: Path) -> Workers:
    link_joe_voice(get_settings().models_dir)
    slow = slow_espeak(session_dir / "espeak-slow.sh", 0.15)
    config = session_dir / "farm-tts-resume-test.toml"
    config.write_text((REPO / "tests" / "support" / "farm-test.toml").read_text() + LADDER.format(slow=slow))
    env = {"FARM_CONFIG_FILE": str(config), **ENV}
    return Workers(lambda: start_worker("cpu", concurrency=1, queues=[QUEUE], env=env))


@pytest.fixture(scope="module")
def unkilled(workers) -> dict[str, Any]:
    """The long text on espeak-slow, never killed: what every resumed job must equal."""
    job = submit("tts", queue=QUEUE, text=LONG, ladder="espeak-slow")
    envelope = job.wait(timeout=180)
    assert [a["outcome"] for a in envelope["attempts"]] == ["ok"]
    return {"envelope": envelope, "partials": job.partials(), "audio": audio(job.id, envelope)}


def audio(job_id: str, envelope: dict[str, Any]) -> np.ndarray:
    path = ArtifactStore(get_settings().storage_dir, job_id).path(envelope["output"]["audio"])
    return sf.read(path, dtype="int16")[0]


def wait_for_partials(job: JobHandle, count: int, timeout: float = 60) -> None:
    """Until the running attempt has announced ``count`` chunks (and so kept their checkpoint)."""
    deadline = time.monotonic() + timeout
    while len(job.partials()) < count:
        assert time.monotonic() < deadline, f"job {job.id}: {len(job.partials())} chunks, not {count}"
        time.sleep(0.02)


def test_a_long_text_lost_early_and_again_midway_resumes_on_its_rung_as_if_never_lost(workers, unkilled) -> None:
    job = submit("tts", queue=QUEUE, text=LONG, ladder="espeak-slow")
    total = unkilled["envelope"]["output"]["chunks"]
    wait_for_partials(job, 3)  # early
    workers.replace_the_one_running(job)
    wait_for_partials(job, total // 2)  # midway (the kept chunks are announced again first)
    workers.replace_the_one_running(job)
    envelope = job.wait(timeout=180)
    lost_early, lost_midway, ok = envelope["attempts"]
    assert [a["outcome"] for a in envelope["attempts"]] == ["worker_lost", "worker_lost", "ok"]
    assert {a["variant"] for a in envelope["attempts"]} == {"espeak-slow"}
    assert "resumed_from" not in lost_early
    early, midway = lost_midway["resumed_from"], ok["resumed_from"]
    assert early["unit"] == "characters" and early["rung"] == "espeak-slow"
    assert 0 < early["position"] < midway["position"] < len(LONG)
    assert midway["made"] == [{"start": 0.0, "end": midway["position"], "rung": "espeak-slow"}]
    # The output is the unkilled run's, sample for sample; sentence times and chunks continuous.
    assert envelope["output"] == unkilled["envelope"]["output"]
    assert job.partials() == unkilled["partials"]
    assert np.array_equal(audio(job.id, envelope), unkilled["audio"])
    # The job ended for good: its checkpoint went with it.
    assert not (ArtifactStore(get_settings().storage_dir, job.id).folder / ".checkpoint").exists()


def test_a_long_text_killed_on_piper_starts_over_on_the_next_rung_saying_why(workers, unkilled) -> None:
    job = submit("tts", queue=QUEUE, text=LONG)
    wait_for_partials(job, 3)  # three chunks, each with its checkpoint
    kill_running(job, "piper")
    envelope = job.wait(timeout=180)
    killed, ok = envelope["attempts"]
    assert (killed["variant"], killed["outcome"], ok["variant"]) == ("piper", "killed", "espeak-slow")
    assert "resumed_from" not in ok
    assert ok["checkpoint_ignored"] == "made on rung piper, and this family resumes on the same rung only"
    assert envelope["output"] == unkilled["envelope"]["output"]
    assert np.array_equal(audio(job.id, envelope), unkilled["audio"])


def test_a_dialogue_line_killed_midway_restarts_whole(workers) -> None:
    line = " ".join(SENTENCES[i % 4] for i in range(30))  # ~1,300 characters, 14 chunks
    assert len(line) <= SHORT_TEXT_CHARS
    dialogue = submit("dialogue", queue=QUEUE, script=[{"speaker": "default", "text": line}])
    line_job = handle(line_job_id(dialogue.id, 1))
    wait_for_partials(line_job, 3)  # chunks made, checkpoints due every 0.1 s: none kept
    kill_running(line_job, "piper")
    envelope = dialogue.wait(timeout=180)
    [voiced] = envelope["output"]["lines"]
    assert [(a["variant"], a["outcome"]) for a in voiced["attempts"]] == [("piper", "killed"), ("espeak-slow", "ok")]
    for attempt in line_job.attempts():
        assert "resumed_from" not in attempt and "checkpoint_ignored" not in attempt
