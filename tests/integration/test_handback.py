"""A dead Redis worker's jobs run again within seconds, not after the visibility timeout (issue #29).

Two real chaos workers on a queue of their own, the handback grace set to 5 s (``FARM_HANDBACK_GRACE``);
the visibility timeout stays the farm's 2 h, so a job that runs again within the test's time was
handed back (``workers.handback``), not restored by kombu's sweep.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from typing import Any

import pytest

from mediafarm.config.priorities import redis_lists
from mediafarm.tasks.app import app
from mediafarm.tasks.producer.client import JobHandle, submit
from mediafarm.tasks.wire.history import read_attempts

pytestmark = pytest.mark.integration

GRACE = 5.0


@pytest.fixture(scope="module")
def pair(start_worker) -> dict[str, Any]:
    queue = f"chaos-handback-{uuid.uuid4().hex[:6]}"
    env = {"FARM_HANDBACK_GRACE": str(GRACE)}
    workers = [start_worker("chaos", concurrency=3, queues=[queue], env=env) for _ in range(2)]
    return {"queue": queue, "workers": {w.node: w for w in workers}}


def send(queue: str, sleep: float) -> JobHandle:
    return submit("chaos", queue=queue, ladder="ok", plan={"sleep": sleep})


def open_attempts(jobs: list[JobHandle], timeout: float = 60) -> dict[str, dict[str, Any]]:
    """Wait until each job has an open attempt; job id → that attempt."""
    deadline = time.monotonic() + timeout
    while True:
        running = {j.id: a[-1] for j in jobs if (a := j.attempts()) and a[-1]["outcome"] is None}
        if len(running) == len(jobs):
            return running
        assert time.monotonic() < deadline, f"not every job started: {[j.attempts() for j in jobs]}"
        time.sleep(0.05)


def busiest(pair: dict[str, Any], running: dict[str, dict[str, Any]]) -> Any:
    counts = {node: sum(1 for a in running.values() if a["worker"] == node) for node in pair["workers"]}
    return pair["workers"][max(counts, key=counts.__getitem__)]


def struck_apart(pair: dict[str, Any], sleep: float) -> tuple[list[JobHandle], list[JobHandle], Any, set[str]]:
    """Two jobs running: (both, those on the busier worker, that worker, the other workers' nodes)."""
    jobs = [send(pair["queue"], sleep=sleep) for _ in range(2)]
    running = open_attempts(jobs)
    victim = busiest(pair, running)
    mine = [j for j in jobs if running[j.id]["worker"] == victim.node]
    return jobs, mine, victim, set(pair["workers"]) - {victim.node}


def rerun_starts(job: JobHandle, victim: str, timeout: float) -> dict[str, Any]:
    """The attempt that began after ``victim``'s, on another worker (AssertionError past ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        attempts = job.attempts()
        later = [a for a in attempts if a["worker"] != victim]
        if later:
            return later[0]
        assert time.monotonic() < deadline, f"job {job.id} did not run again within {timeout:.0f} s: {attempts}"
        time.sleep(0.05)


def assert_ran_once_more(envelope: dict[str, Any], victim: str, survivor_nodes: set[str]) -> None:
    lost, ok = envelope["attempts"]  # exactly two: none ran twice elsewhere
    assert (lost["outcome"], ok["outcome"]) == ("worker_lost", "ok"), envelope["attempts"]
    assert lost["worker"] == victim and f"handed back: its worker {victim} was silent" in lost["reason"]
    assert ok["worker"] in survivor_nodes


def assert_no_copy_left(queue: str, jobs: list[JobHandle]) -> None:
    broker = app.backend.client  # the tests' broker and backend are one Redis
    assert sum(broker.llen(name) for name in redis_lists(queue)) == 0, "a handed-back job is queued again"
    # The worker that ran it acks its message a moment after the SUCCESS is stored.
    deadline = time.monotonic() + 5
    while any(j.id.encode() in raw for raw in broker.hvals("unacked") for j in jobs):
        assert time.monotonic() < deadline, "a handed-back job is still unacked 5 s after it ended"
        time.sleep(0.1)


def test_a_worker_restarted_under_its_own_name_runs_its_predecessor_s_job_again(start_worker) -> None:
    """As a container's restart policy does after a SIGKILL: the same node name comes back, beating
    before any peer sees it silent for the 30 s grace. Its predecessor's job runs again at once.
    (First in this module: the pair's 5 s grace would hand the job back too, had it started.)"""
    queue = f"chaos-restart-{uuid.uuid4().hex[:6]}"
    victim = start_worker("chaos", concurrency=1, queues=[queue])
    job = send(queue, sleep=30)
    open_attempts([job])
    os.killpg(victim.process.pid, signal.SIGKILL)
    killed = time.time()
    victim.process.wait(10)
    again = start_worker("chaos", concurrency=1, queues=[queue], node=victim.node)
    rerun = rerun_started(job, timeout=25 - (time.time() - killed))
    assert rerun["started"] - killed < 25, rerun  # well inside the 30 s grace: no peer handed it back
    lost, ok = job.wait(timeout=60)["attempts"]
    assert (lost["outcome"], ok["outcome"]) == ("worker_lost", "ok") and ok["worker"] == victim.node
    assert "handed back" in lost["reason"] and "1 job(s) handed back" in again.log_tail(20000)


def rerun_started(job: JobHandle, timeout: float) -> dict[str, Any]:
    """The job's second attempt once it has begun (AssertionError past ``timeout``)."""
    deadline = time.monotonic() + timeout
    while len(attempts := job.attempts()) < 2:
        assert time.monotonic() < deadline, f"job {job.id} did not run again within {timeout:.0f} s: {attempts}"
        time.sleep(0.05)
    return attempts[1]


def test_a_worker_merely_busy_past_the_grace_keeps_its_job(pair) -> None:
    # A job twice the grace long: its worker's main process beats all along, so nobody takes it.
    job = send(pair["queue"], sleep=2 * GRACE)
    envelope = job.wait(timeout=60)
    assert [a["outcome"] for a in envelope["attempts"]] == ["ok"], envelope["attempts"]


def test_a_paused_worker_s_jobs_run_elsewhere_once_and_its_late_writes_are_dropped(pair) -> None:
    jobs, mine, victim, others = struck_apart(pair, sleep=8)
    os.killpg(victim.process.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        for job in mine:
            rerun_starts(job, victim.node, timeout=GRACE + 5 - (time.monotonic() - stopped))
        envelopes = {j.id: j.wait(timeout=60) for j in mine}
    finally:
        os.killpg(victim.process.pid, signal.SIGCONT)
    # Awake, its children end their attempts: each finds its attempt settled and writes nothing.
    deadline = time.monotonic() + 30
    while victim.log_tail(20000).count("writing nothing") < len(mine):
        assert time.monotonic() < deadline, f"the paused worker's children did not stop quietly:\n{victim.log_tail()}"
        time.sleep(0.2)
    time.sleep(2)  # its acks and anything else it sends now
    for job in mine:
        assert_ran_once_more(envelopes[job.id], victim.node, others)
        assert job.wait(timeout=5) == envelopes[job.id]  # the SUCCESS stored stays
        assert read_attempts(app.backend.client, job.id) == envelopes[job.id]["attempts"]
    assert_no_copy_left(pair["queue"], mine)
    for job in set(jobs) - set(mine):
        assert [a["outcome"] for a in job.wait(timeout=60)["attempts"]] == ["ok"]


def test_a_worker_killed_whole_has_its_jobs_run_again_within_the_grace(pair) -> None:
    jobs, mine, victim, others = struck_apart(pair, sleep=20)
    os.killpg(victim.process.pid, signal.SIGKILL)
    killed = time.time()
    victim.process.wait(10)
    for job in mine:
        again = rerun_starts(job, victim.node, timeout=GRACE + 5 - (time.time() - killed))
        assert again["started"] - killed < GRACE + 5, again
    for job in mine:
        assert_ran_once_more(job.wait(timeout=60), victim.node, others)
    assert_no_copy_left(pair["queue"], mine)
    for job in set(jobs) - set(mine):
        assert [a["outcome"] for a in job.wait(timeout=60)["attempts"]] == ["ok"]
