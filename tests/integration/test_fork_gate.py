"""No pool child inherits a lock held at fork (issue #29 item 4), on a real worker.

A child is forked from the worker's main process after every job here (``max_tasks_per_child =
1``, the ``forkgate`` pool) and after every outside kill, while the farm's own threads in that
process (the watchdog, the pressure reporter, the metrics reader and the metrics server) import a
module afresh and log in every unit of their work (``tests.support.fork_hazard``). Every job
imports the same module in its child and logs. A child forked while one of those threads held
the module's import lock, or the log's, would hang there until the hard time limit; the fork gate
(``workers.fork_gate``) keeps every fork out of those moments.
"""

from __future__ import annotations

import os
import random
import threading
import time
import urllib.request

import psutil
import pytest

from mediafarm.tasks.app import app
from mediafarm.tasks.producer.client import submit
from mediafarm.tasks.wire.errors import LadderExhausted
from tests.support.kills import kill_children_at_random

pytestmark = pytest.mark.integration

JOBS = int(os.environ.get("MEDIAFARM_FORK_JOBS", "300"))


@pytest.fixture(scope="module")
def hazard_worker(start_worker):
    from mediafarm.workers.embedded import free_port

    port = free_port()
    env = {"FARM_METRICS_PORT": str(port), "FARM_WATCHDOG_INTERVAL": "0.02"}
    worker = start_worker("forkgate", concurrency=2, env=env, include=("tests.support.fork_hazard",))
    worker.metrics_url = f"http://127.0.0.1:{port}/metrics"
    return worker


def test_children_forked_while_the_main_process_threads_import_and_log_never_hang(hazard_worker) -> None:
    main = psutil.Process(hazard_worker.main_pid())
    stop = threading.Event()
    kills: list[int] = []
    scrapes = [0]
    rng = random.Random(29)

    def killer() -> None:
        # A child killed mid-job now and then: its replacement is forked at once.
        kill_children_at_random(main, rng, kills, stop, pause=(0.3, 0.9), older_than=0.1)

    def scraper() -> None:
        while not stop.is_set():
            try:
                urllib.request.urlopen(hazard_worker.metrics_url, timeout=5).read()
                scrapes[0] += 1
            except OSError:
                time.sleep(0.05)

    threads = [threading.Thread(target=killer, daemon=True), threading.Thread(target=scraper, daemon=True)]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    try:
        jobs = [submit("chaos", ladder="fork_probe", queue="forkgate") for _ in range(JOBS)]
        pids: set[int] = set()
        ended_by_kills = 0
        for job in jobs:
            # A hung child would hold its job until the hard time limit (90 s): far past this.
            remaining = max(1.0, 60 + JOBS * 1.0 - (time.monotonic() - started))
            try:
                envelope = job.wait(timeout=remaining)
            except LadderExhausted as exc:  # killed on every rung by the killer: no hang
                assert {a["outcome"] for a in exc.attempts} == {"killed"}, exc.attempts
                ended_by_kills += 1
                continue
            pids.add(envelope["output"]["pid"])
            assert {a["outcome"] for a in envelope["attempts"]} <= {"ok", "killed"}, envelope["attempts"]
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    elapsed = time.monotonic() - started
    log = hazard_worker.log.read_text(errors="replace")
    # The threads really were importing and logging all along, and the pool really forked.
    for where in ("watchdog", "pressure", "metrics", "scrape"):
        assert log.count(f" in {where}") > 10, (where, log[-3000:])
    assert len(pids) >= JOBS - ended_by_kills - len(kills), (len(pids), len(kills))  # one child a job
    assert kills and scrapes[0] > 10
    assert "Timed out waiting for UP message" not in log  # no child hung before its first job either
    [reply] = app.control.broadcast("farm_main_process", destination=[hazard_worker.node], reply=True, timeout=5)
    assert reply[hazard_worker.node]["ungated_threads"] == []
    print(f"\n{JOBS} jobs, {len(pids)} children, {len(kills)} kills, {scrapes[0]} scrapes in {elapsed:.0f} s")
