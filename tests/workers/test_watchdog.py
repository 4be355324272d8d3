"""The watchdog kills a child once and says so once (issue #18 item 7).

A killed child stays listed among the worker's children (a zombie, RSS 0) and its job stays
active until the pool reaps it, which a busy main process (one just resumed after a pause) does
late; every poll meanwhile found the job past its hard limit and killed, recorded and logged it
again. Here the watchdog's own loop runs in this process against a real child process of ours
that it kills and nobody reaps, with a stand-in for Celery's request of the job it runs (the
loop reads only its pid, task name, start time and id) and the session's Redis for the record.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from typing import Any

import psutil
import pytest
import redis
from celery.worker import state as worker_state

from mediafarm.tasks.wire import keys
from mediafarm.workers.guards import MemoryWatchdog
from mediafarm.workers.metrics import CHILD_KILLS


class RunningJob:
    """What the watchdog reads of a Celery request: which child runs it, which task, since when."""

    def __init__(self, pid: int, started: float) -> None:
        self.worker_pid, self.time_start = pid, started
        self.name, self.id = "farm.test.chaos", f"watchdog-{uuid.uuid4()}"


class Worker:
    def __init__(self) -> None:
        self.hostname = "watchdog-test@here"
        self.app: Any = type("App", (), {"conf": type("Conf", (), {"result_expires": 60})()})()


def test_a_killed_child_not_yet_reaped_is_killed_recorded_and_logged_once(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    pid = os.fork()
    if pid == 0:  # a pool child, busy with a job past its hard limit
        time.sleep(60)
        os._exit(0)
    job = RunningJob(pid, started=time.time() - 100)
    worker = Worker()
    watchdog = MemoryWatchdog(worker)
    watchdog._redis = redis.Redis.from_url(redis_url)
    watchdog._limits = {job.name: 90.0}
    watchdog.cap = None  # only the time limit: this process's other children are none of its business
    watchdog.interval = 0.02
    kills = CHILD_KILLS.labels(pool=watchdog.pool.name, reason="timeout")
    kills_before = kills._value.get()
    worker_state.active_requests.add(job)
    thread = threading.Thread(target=watchdog._run, args=(worker,), daemon=True)
    caplog.set_level(logging.WARNING, logger="mediafarm.watchdog")
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the watchdog never killed the child"
            time.sleep(0.01)
        time.sleep(0.5)  # 25 polls with the killed child still listed and its job still active
    finally:
        watchdog._stop.set()
        thread.join(timeout=5)
        worker_state.active_requests.discard(job)
        os.waitpid(pid, 0)
    lines = [r.getMessage() for r in caplog.records if f"killed pid {pid} " in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("watchdog: hard time limit of 90 s passed (10") and lines[0].endswith(f"(job {job.id})")
    assert kills._value.get() == kills_before + 1
    record = json.loads(watchdog._redis.get(keys.kill(job.id)))
    assert record["pid"] == pid and record["outcome"] == "timeout"


def _skip_unless_the_kernel_lists_children(found: set[int] | None) -> None:
    """Skip only where the kernel itself has no children file (asked directly, not through
    child_pids, whose None is also what a broken reader returns); there child_pids must say None."""
    if not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"):
        assert found is None
        pytest.skip("this kernel keeps no /proc/<pid>/task/*/children (CONFIG_PROC_CHILDREN); psutil is used")


def test_child_pids_finds_a_child_forked_by_another_thread() -> None:
    # The kernel lists a child under the thread that forked it, not under the process's main thread.
    import subprocess
    import threading

    from mediafarm.workers.guards import child_pids

    started: list[subprocess.Popen[bytes]] = []
    thread = threading.Thread(target=lambda: started.append(subprocess.Popen(["sleep", "30"])))
    thread.start()
    thread.join()
    try:
        found = child_pids(os.getpid())
        _skip_unless_the_kernel_lists_children(found)
        # join() returns once the Python thread is done, while the kernel may still be ending it: the
        # child is listed under another thread once the exit is through (the watchdog's next poll).
        deadline = time.monotonic() + 2
        while found is not None and started[0].pid not in found and time.monotonic() < deadline:
            time.sleep(0.01)
            found = child_pids(os.getpid())
        assert found is not None and started[0].pid in found
    finally:
        started[0].kill()
        started[0].wait()


def test_child_pids_of_no_such_process_is_none() -> None:
    from mediafarm.workers.guards import child_pids

    assert child_pids(2**22 + 1) is None  # above the kernel's largest pid


def test_child_pids_from_proc_are_the_children_psutil_finds() -> None:
    import subprocess

    from mediafarm.workers.guards import child_pids

    sleepers = [subprocess.Popen(["sleep", "30"]) for _ in range(3)]
    try:
        found = child_pids(os.getpid())
        _skip_unless_the_kernel_lists_children(found)
        assert found is not None and {p.pid for p in sleepers} <= found
        assert found == {c.pid for c in psutil.Process().children()}
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


def test_a_silent_child_is_stalled_unless_the_watchdog_itself_was_paused_or_redis_is_away(redis_url: str) -> None:
    # The stall rule of the watchdog's poll (its kill of a real stopped child is
    # tests/integration/test_stall.py): silence counts from the later of the child's last beat,
    # its job's start and the watchdog's own return from a pause, and only while Redis answers.
    watchdog = MemoryWatchdog(Worker())
    watchdog._redis = redis.Redis.from_url(redis_url)
    watchdog._stalls = {"farm.test.chaos": 4.0}
    now = time.time()
    job = RunningJob(12345, started=now - 100)
    assert "last sign of life 50 s ago, 50 s into the job" in watchdog._stalled(job, now - 50, now)
    assert "never started it" in watchdog._stalled(job, 0.0, now)
    assert watchdog._stalled(job, now - 3, now) == ""
    watchdog._resumed_at = now - 1  # the whole worker was stopped and just came back
    assert watchdog._stalled(job, now - 50, now) == ""
    assert watchdog._stalled(job, now - 50, now + 3.5) != ""
    watchdog._resumed_at = 0.0
    watchdog._redis = redis.Redis(port=1, socket_connect_timeout=0.2)  # nothing listens there
    watchdog._redis_seen = (0.0, False)
    assert watchdog._stalled(job, now - 50, now + 10) == ""  # Redis away: the child may be waiting on it
