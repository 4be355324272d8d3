"""A Redis restart leaves no error in a worker's log (issue #18 item 7).

Celery's gossip step (worker-to-worker events) failed on the reconnection of a worker holding jobs
with ``Error on restarting Gossip: AttributeError("'NoneType' object has no attribute
'connection_errors'")`` and a traceback (every time in two runs with gossip on; never with a worker
idle). The farm uses neither gossip nor mingle, and ``worker_argv`` turns both off. A Redis of the
test's own, restarted under two running jobs and one waiting.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery.result import AsyncResult

from mediafarm.config.pools import get_pool
from mediafarm.workers.embedded import EmbeddedRedis
from mediafarm.workers.launch import spawn_worker, stop_worker, wait_ready, worker_argv
from tests.support.farm_app import farm_app

pytestmark = pytest.mark.integration


@pytest.fixture()
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    redis = EmbeddedRedis(data_dir=tmp_path / "redis").start()
    yield redis
    redis.stop()


def test_workers_start_without_gossip_and_mingle() -> None:
    argv = worker_argv(get_pool("cpu"))
    assert "--without-gossip" in argv and "--without-mingle" in argv


def test_a_redis_restart_under_running_jobs_logs_no_gossip_error(own_redis: EmbeddedRedis, session_dir: Path) -> None:
    env = {**os.environ, "FARM_BROKER_URL": own_redis.url, "FARM_RESULT_BACKEND": own_redis.url}
    node = f"quiet-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
    producer = farm_app(own_redis.url)
    log = session_dir / f"{node.split('@')[0]}.log"
    with log.open("wb") as fh:
        worker = spawn_worker(get_pool("chaos"), env=env, logfile=fh, queues=["chaos"], concurrency=2, node=node)
    try:
        wait_ready(producer, node, worker, timeout=90)
        # Jobs in the worker's hands as Redis goes (what made the gossip step fail on the restart).
        jobs = [producer.send_task("farm.test.chaos", kwargs={"ladder": "slow"}, queue="chaos") for _ in range(3)]
        deadline = time.monotonic() + 30
        while not all(producer.backend.client.llen(f"mediafarm:attempts:{job.id}") for job in jobs[:2]):
            assert time.monotonic() < deadline, "the jobs never started"
            time.sleep(0.05)
        own_redis.restart(down_for=2.0)
        for job in jobs:
            assert AsyncResult(job.id, app=farm_app(own_redis.url)).get(timeout=120)["variant"] == "only"
        text = log.read_text(errors="replace")
        assert "Connection to broker lost" in text  # the restart did reach the worker
        assert "Gossip" not in text and "AttributeError" not in text and "Traceback" not in text, text[-4000:]
        assert "mingle:" not in text  # no second lost at start searching for neighbours
    finally:
        stop_worker(worker, timeout=30)
