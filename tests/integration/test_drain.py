"""A graceful drain on real workers (issue #31): ``farm drain WORKER`` and SIGTERM (``workers.drain``).

A long TTS text on a slowed espeak-ng (checkpoints every 0.1 s) drained past its deadline is back
in its queue at once, resumes on another worker from its checkpoint, and ends as an unbroken run
would; a job that ends within the deadline ends where it ran; a message held for later (a countdown)
goes back the moment the drain begins; a drained worker exits 0. Each test has its own queue: the
session's other workers stay up on theirs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mediafarm.config.priorities import redis_lists
from mediafarm.config.settings import get_settings
from mediafarm.tasks.app import app
from mediafarm.tasks.families.tts.resume import SHORT_TEXT_CHARS
from mediafarm.tasks.producer.client import JobHandle, handle, submit
from mediafarm.tasks.wire.artifacts import ArtifactStore
from tests.conftest import REPO
from tests.support.espeak import hold_script

pytestmark = pytest.mark.integration
TTS_QUEUE = "tts-drain-test"
LADDER = """
[ladders.tts]
rungs = [
  {{ name = "espeak-slow", engine = "espeak", params = {{ binary = "{slow}", max_chars = 100 }} }},
]
"""
SENTENCES = ("The quick brown fox jumps over the lazy dog.", "Please leave the package at the front door.",
             "Someone is walking across the garden now.", "Turn off the lights before you go to sleep.")  # fmt: skip
# Past the length below which a text starts over: ~2,500 characters, 25 chunks of about 0.3 s each.
LONG = " ".join(SENTENCES[i % 4] for i in range(SHORT_TEXT_CHARS // 40 + 6))
DEADLINE_S = 2.0
COUNTDOWN_S = 25


def running_attempt(job: JobHandle, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not (running := [a for a in job.attempts() if a["outcome"] is None]):
        assert time.monotonic() < deadline, f"job {job.id} never started: {job.attempts()}"
        time.sleep(0.02)
    return running[-1]


def wait_for_partials(job: JobHandle, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(job.partials()) < count:
        assert time.monotonic() < deadline, f"job {job.id}: {len(job.partials())} chunks, not {count}"
        time.sleep(0.02)


def queued(queue: str) -> int:
    client = app.backend.client
    return sum(client.llen(name) for name in redis_lists(queue))


def farm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mediafarm.workers.cli", *args], capture_output=True, text=True,
                          timeout=60, env=os.environ.copy())  # fmt: skip


@pytest.fixture(scope="module")
def tts_worker(start_worker, session_dir: Path) -> Callable[[], Any]:
    slow = hold_script(session_dir / "espeak-drain.sh", 0.3, when=None)
    config = session_dir / "farm-drain-test.toml"
    config.write_text((REPO / "tests" / "support" / "farm-test.toml").read_text() + LADDER.format(slow=slow))
    env = {"FARM_CONFIG_FILE": str(config), "FARM_CHECKPOINT_INTERVAL": "0.1", "FARM_DRAIN_SECONDS": str(DEADLINE_S)}
    return lambda: start_worker("cpu", concurrency=1, queues=[TTS_QUEUE], env=env)


def test_a_job_running_past_the_deadline_is_handed_back_at_once_and_resumes_elsewhere(tts_worker) -> None:
    first = tts_worker()
    unbroken = submit("tts", queue=TTS_QUEUE, text=LONG)
    whole = unbroken.wait(timeout=180)
    assert [a["outcome"] for a in whole["attempts"]] == ["ok"]
    second = tts_worker()  # both consume the queue now: whichever runs the job is drained

    job = submit("tts", queue=TTS_QUEUE, text=LONG)
    drained = running_attempt(job)
    wait_for_partials(job, 3)  # chunks made, each with its checkpoint
    draining, resumer = (first, second) if drained["worker"] == first.node else (second, first)
    answer = farm("drain", draining.node)
    answered = time.monotonic()  # the drain began before its answer came (the command's start is slow)
    assert answer.returncode == 0, answer.stderr
    assert "draining" in answer.stdout and job.id in answer.stdout
    resumed = running_attempt_after(job, drained)
    # Handed back within the deadline plus 2 s: taken at once by the other worker, not after the
    # handback grace or the visibility timeout.
    print(f"drain answered to resumed: {time.monotonic() - answered:.2f} s")
    assert time.monotonic() - answered < DEADLINE_S + 2.0
    assert resumed["worker"] == resumer.node
    assert draining.process.wait(30) == 0  # the drained worker exits 0
    envelope = job.wait(timeout=180)
    lost, ok = envelope["attempts"]
    assert (lost["outcome"], lost["cause"], lost["counted"], lost["worker"]) == (
        "worker_lost", "drained", False, draining.node
    )  # fmt: skip
    assert "drain" in lost["reason"] and "FARM_DRAIN_SECONDS" in lost["reason"]
    assert (ok["outcome"], ok["worker"], ok["variant"]) == ("ok", resumer.node, lost["variant"])
    assert 0 < ok.get("resumed_from", {}).get("position", 0) < len(LONG), ok  # from its checkpoint, not from the start
    # Nothing lost, nothing made twice: the unbroken run's output and chunks.
    assert envelope["output"] == whole["output"]
    assert job.partials() == unbroken.partials()
    assert not (ArtifactStore(get_settings().storage_dir, job.id).folder / ".checkpoint").exists()


def running_attempt_after(job: JobHandle, before: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
    """The open attempt that came after ``before`` (the same job run again)."""
    deadline = time.monotonic() + timeout
    while True:
        later = [a for a in job.attempts() if a["started"] > before["started"] and a["outcome"] is None]
        if later:
            return later[0]
        assert time.monotonic() < deadline, f"job {job.id} did not run again: {job.attempts()}"
        time.sleep(0.02)


def test_sigterm_lets_a_job_that_ends_within_the_deadline_end_where_it_runs(start_worker) -> None:
    worker = start_worker("chaos", concurrency=1, queues=["chaos-drain-end"], env={"FARM_DRAIN_SECONDS": "30"})
    job = submit("chaos", queue="chaos-drain-end", ladder="chaos", plan={"sleep": 3})
    running_attempt(job)
    began = time.monotonic()
    os.kill(worker.main_pid(), signal.SIGTERM)
    assert worker.process.wait(30) == 0
    # Gone as soon as the job ended, not at the 30 s deadline.
    assert time.monotonic() - began < 15
    envelope = job.wait(timeout=10)
    [attempt] = envelope["attempts"]
    assert (attempt["outcome"], attempt["worker"]) == ("ok", worker.node)
    assert "drain (SIGTERM)" in worker.log_tail(20000)


def test_a_message_held_for_later_goes_back_the_moment_the_drain_begins(start_worker) -> None:
    queue = "chaos-drain-held"
    env = {"FARM_DRAIN_SECONDS": "30"}
    worker = start_worker("chaos", concurrency=1, queues=[queue], env=env)
    # A countdown, as FARM_RETRY_DELAY gives a retry: the worker holds the message unstarted. Sent
    # first: with the one child busy, the worker's prefetch slot is taken and the message stays in
    # the queue until the busy job ends (seen in CI), so it would never be held during the drain.
    sent = time.monotonic()
    held = app.send_task("farm.test.chaos", kwargs={"ladder": "chaos"}, queue=queue, countdown=COUNTDOWN_S)
    inspect = app.control.inspect([worker.node], timeout=2)
    deadline = time.monotonic() + 20
    while not (inspect.scheduled() or {}).get(worker.node):
        assert time.monotonic() < deadline, "the worker never took the held message"
        time.sleep(0.1)
    busy = submit("chaos", queue=queue, ladder="chaos", plan={"sleep": 6})
    running_attempt(busy)
    assert queued(queue) == 0
    # Still held when the drain begins: its countdown far from over (a message whose time has come
    # is given to the pool, and waits for the busy child as a job that runs).
    assert time.monotonic() - sent < COUNTDOWN_S - 5
    os.kill(worker.main_pid(), signal.SIGTERM)
    deadline = time.monotonic() + 2
    while queued(queue) != 1:
        assert time.monotonic() < deadline, f"the held message did not go back at once:\n{worker.log_tail(6000)}"
        time.sleep(0.05)
    assert worker.process.poll() is None  # still draining: the busy job runs on
    assert worker.process.wait(30) == 0
    assert [a["outcome"] for a in busy.wait(timeout=10)["attempts"]] == ["ok"]
    other = start_worker("chaos", concurrency=1, queues=[queue], env=env)
    envelope = handle(held.id).wait(timeout=60)
    assert [(a["outcome"], a["worker"]) for a in envelope["attempts"]] == [("ok", other.node)]


def test_farm_drain_of_an_unknown_worker_names_it_and_fails(start_worker) -> None:
    start_worker("chaos", concurrency=1, queues=["chaos-drain-unknown"])
    answer = farm("drain", "nobody@nowhere")
    assert answer.returncode != 0
    said = " ".join(answer.stderr.split())
    assert "no worker named 'nobody@nowhere' answers" in said
    assert "chaos-t" in said  # the workers that do answer are named
