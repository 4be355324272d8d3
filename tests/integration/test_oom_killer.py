"""The kernel's OOM killer inside a worker's memory cgroup (issue #18 item 3), on a real worker.

The worker runs in a memory cgroup of the test's own whose limit is far below the pool's RSS cap,
so the kernel, not the watchdog, kills the child that hogs memory; the job's next attempt names
the kill. Skipped, saying why, where the machine allows no such cgroup.
"""

from __future__ import annotations

import time

import psutil
import pytest

from mediafarm.tasks.producer.client import submit
from mediafarm.workers.launch import stop_worker
from tests.support.memory_cgroup import CgroupUnavailable, create

pytestmark = pytest.mark.integration

QUEUE = "oom-test"
MIB = 1024 * 1024
# Above the worker's idle growth and a replacement child's copy-on-write pages, below the 900 MiB
# the 'hungry' rung touches and far below the cpu pool's 2 GiB RSS cap.
LIMIT = 256 * MIB


@pytest.fixture(scope="module")
def worker_in_a_cgroup(start_worker):
    try:
        cgroup = create(LIMIT)
    except CgroupUnavailable as exc:
        pytest.skip(f"no memory cgroup with a limit can be made on this machine: {exc}")
    worker = None
    try:
        worker = start_worker("cpu", concurrency=1, queues=[QUEUE])
        main = psutil.Process(worker.main_pid())
        # The whole worker, main process first so that a replacement child is forked inside.
        for process in [main, *main.children(recursive=True)]:
            cgroup.add(process.pid)
        yield worker, cgroup
    finally:
        if worker is not None:
            stop_worker(worker.process, timeout=20)  # before the cgroup goes (it must be empty)
        cgroup.remove()


def test_kernel_oom_kill_in_the_workers_cgroup_is_named_with_its_limit(worker_in_a_cgroup) -> None:
    worker, cgroup = worker_in_a_cgroup
    kills_before = cgroup.oom_kills()
    job = submit("chaos", queue=QUEUE, ladder="kill_once")
    envelope = job.wait(timeout=90)
    hungry, frugal = envelope["attempts"]
    assert (hungry["variant"], hungry["outcome"], frugal["outcome"]) == ("hungry", "oom", "ok"), envelope["attempts"]
    assert hungry["reason"].startswith("killed by the kernel OOM killer"), hungry["reason"]
    assert str(cgroup.path) in hungry["reason"] and "memory limit 256 MiB" in hungry["reason"]
    assert "watchdog" not in hungry["reason"]
    assert cgroup.oom_kills() > kills_before
    # The kernel took the child, never the worker.
    time.sleep(0.5)
    assert worker.process.poll() is None and worker.main_pid() in cgroup.pids()
