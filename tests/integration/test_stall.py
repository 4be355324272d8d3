"""A stuck attempt costs a stall timeout, not the hard limit (issue #29 item 5), on real workers.

The worker here runs the chaos family with a 4 s stall timeout (its hard limit stays 90 s). A
child gives signs of life as it starts a job and while its engine works (``tasks.runtime.liveness``); the
watchdog kills one silent past the stall timeout, the job runs again on the same rung once, and a
second stall there moves it down.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from mediafarm.tasks.producer.client import submit

pytestmark = pytest.mark.integration

QUEUE = "chaos-stall"
STALL = 4


@pytest.fixture(scope="module")
def stall_worker(start_worker, session_dir):
    from tests.conftest import REPO

    config = session_dir / "stall.toml"
    text = (REPO / "tests" / "support" / "farm-test.toml").read_text()
    short = text.replace("[limits.chaos]\nsoft = 60\nhard = 90", f"[limits.chaos]\nsoft = 60\nhard = 90\nstall = {STALL}")
    assert short != text
    config.write_text(short)
    return start_worker("chaos", concurrency=2, queues=[QUEUE], env={"FARM_CONFIG_FILE": str(config)})


def outcomes(attempts):
    return [(a["variant"], a["outcome"]) for a in attempts]


def test_a_child_stopped_in_the_middle_of_a_job_is_killed_after_its_stall_timeout_and_the_job_finishes(
    stall_worker,
) -> None:
    job = submit("chaos", ladder="busy", queue=QUEUE)  # 6 s of work, a sign of life every 0.1 s
    deadline = time.monotonic() + 30
    while not (attempts := job.attempts()) or attempts[-1].get("outcome") is not None:
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    time.sleep(1.0)
    pid = attempts[-1]["pid"]
    os.kill(pid, signal.SIGSTOP)
    stopped = time.time()
    try:
        envelope = job.wait(timeout=60)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    stalled, ok = envelope["attempts"]
    assert outcomes(envelope["attempts"]) == [("busy", "stalled"), ("busy", "ok")]  # the same rung, once
    assert stalled["pid"] == pid and ok["pid"] != pid
    assert f"stall timeout of {STALL} s" in stalled["reason"] and "last sign of life" in stalled["reason"]
    # Killed a stall timeout after it went silent (its last sign of life came up to 0.1 s before
    # the stop; plus the watchdog's poll), not at the hard limit.
    killed_after = stalled["started"] + stalled["duration"] - stopped
    assert STALL - 0.2 <= killed_after < STALL + 3, killed_after


def test_an_engine_that_hangs_runs_again_once_then_the_job_moves_down(stall_worker) -> None:
    started = time.monotonic()
    envelope = submit("chaos", ladder="hang", queue=QUEUE).wait(timeout=60)
    elapsed = time.monotonic() - started
    assert outcomes(envelope["attempts"]) == [("stuck", "stalled"), ("stuck", "stalled"), ("frugal", "ok")]
    for attempt in envelope["attempts"][:2]:
        assert STALL <= attempt["duration"] < STALL + 3, attempt
    assert elapsed < 3 * STALL + 10  # two stall timeouts, far from two hard limits (180 s)


def test_a_child_that_never_takes_the_job_written_to_it_is_killed_and_the_job_runs_elsewhere(stall_worker) -> None:
    import psutil

    # Both children stopped while idle: the pool writes the next job to one of them, which never
    # reads it (what a child hung at its fork does).
    main = psutil.Process(stall_worker.main_pid())
    deadline = time.monotonic() + 30
    # Children up for a while: one stopped before it told the pool it is up would be the pool's
    # own to kill (Celery's worker_proc_alive_timeout), not the watchdog's.
    while len(children := main.children()) != 2 or min(time.time() - c.create_time() for c in children) < 3:
        assert time.monotonic() < deadline, children
        time.sleep(0.2)
    for child in children:
        os.kill(child.pid, signal.SIGSTOP)
    started = time.monotonic()
    try:
        envelope = submit("chaos", ladder="steady", queue=QUEUE).wait(timeout=60)
    finally:
        for child in children:
            try:
                os.kill(child.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    elapsed = time.monotonic() - started
    assert outcomes(envelope["attempts"]) == [("a", "ok")]  # it never began on a stuck child
    assert envelope["attempts"][0]["pid"] not in {c.pid for c in children}
    # The pool hands the job back to another child when the one it was written to dies: that may
    # be the other stopped child, killed a stall timeout later too.
    killed = [c.pid for c in children if not c.is_running()]
    assert 1 <= len(killed) and elapsed < len(killed) * STALL + 10, (killed, elapsed)
    log = stall_worker.log_tail(20000)
    for pid in killed:
        [line] = [x for x in log.splitlines() if x.endswith(f"killed pid {pid}")]
        waited = float(line.split("written to it ")[1].split(" s ago")[0])
        assert waited >= STALL and f"(job {envelope['job_id']})" in line, line
