"""RabbitMQ as the broker (issue #10 item 4), results and histories still in the session's Redis.

The tests run in a vhost of their own (``amqp_url`` in tests/integration/conftest.py).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.result import AsyncResult

from mediafarm.config.pools import get_pool
from mediafarm.tasks.wire import keys
from mediafarm.workers.launch import spawn_worker, stop_worker, wait_ready
from tests.support.farm_app import farm_app

pytestmark = pytest.mark.integration

@pytest.fixture(scope="module")
def producer(amqp_url: str, redis_url: str) -> Iterator[Celery]:
    app = farm_app(amqp_url, redis_url, name="amqp-producer")
    yield app
    app.close()


@pytest.fixture()
def amqp_worker(amqp_url: str, redis_url: str, producer: Celery, session_dir: Path) -> Iterator[Callable[..., Any]]:
    started: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(**env: str) -> tuple[str, subprocess.Popen[bytes], Path]:
        full_env = {**os.environ, "FARM_BROKER_URL": amqp_url, "FARM_RESULT_BACKEND": redis_url, **env}
        node = f"amqp-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
        log = session_dir / f"{node.split('@')[0]}.log"
        with log.open("wb") as fh:
            process = spawn_worker(get_pool("chaos"), env=full_env, logfile=fh, queues=["chaos"], concurrency=1,
                                   node=node)  # fmt: skip
        started.append((node, process, log))
        return node, process, log

    yield start
    for _, process, _ in started:
        stop_worker(process, timeout=20)


def send(producer: Celery, ladder: str) -> AsyncResult:
    return producer.send_task("farm.test.chaos", kwargs={"ladder": ladder}, queue="chaos")


def outcomes(envelope: dict[str, Any]) -> list[tuple[str, str]]:
    return [(a["variant"], a["outcome"]) for a in envelope["attempts"]]


def test_a_child_killed_on_rabbitmq_moves_the_job_down_under_the_same_id(producer: Celery, amqp_worker) -> None:
    node, process, log = amqp_worker()
    wait_ready(producer, node, process, timeout=90)
    killed, erred = send(producer, "kill_once"), send(producer, "memerr")
    expected = {killed.id: [("hungry", "killed"), ("frugal", "ok")], erred.id: [("greedy", "oom"), ("frugal", "ok")]}
    for job in (killed, erred):
        envelope = job.get(timeout=90)
        assert outcomes(envelope) == expected[job.id], log.read_text()[-3000:]
        assert envelope["job_id"] == job.id
    assert process.poll() is None


def test_whole_worker_death_requeues_the_job_within_seconds(producer: Celery, amqp_worker, redis_url: str) -> None:
    # On Redis the job comes back after the visibility timeout (plus a sweep); RabbitMQ hands it
    # on as soon as the dead worker's connection drops. The session's visibility timeout is
    # RabbitMQ-irrelevant here: what is asserted is "seconds", against Redis's minimum of
    # FARM_VISIBILITY_TIMEOUT (7200 s by default).
    workers = [amqp_worker(), amqp_worker()]
    for node, process, _ in workers:
        wait_ready(producer, node, process, timeout=90)
    job = send(producer, "slow")
    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 30
    while not client.llen(keys.history(job.id)):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    first = json.loads(client.lindex(keys.history(job.id), 0))
    victim = next(w for w in workers if w[0] == first["worker"])
    os.killpg(victim[1].pid, signal.SIGKILL)
    killed_at = time.monotonic()
    victim[1].wait(10)
    while client.llen(keys.history(job.id)) < 2:
        assert time.monotonic() - killed_at < 30, "the job was not handed to the other worker"
        time.sleep(0.02)
    requeued_after = time.monotonic() - killed_at
    envelope = job.get(timeout=60)
    assert outcomes(envelope) == [("only", "worker_lost"), ("only", "ok")]
    assert envelope["attempts"][1]["worker"] != victim[0]
    assert requeued_after < 15, requeued_after
    client.close()


def test_a_worker_refuses_a_consumer_timeout_below_its_longest_job(amqp_worker) -> None:
    # The chaos family's hard limit is 90 s (tests/support/farm-test.toml); stating a 60 s
    # consumer timeout must stop the worker before it takes a job.
    node, process, log = amqp_worker(FARM_CONSUMER_TIMEOUT="60")
    assert process.wait(90) != 0
    text = log.read_text()
    assert "FARM_CONSUMER_TIMEOUT (60 s" in text and "family chaos" in text, text[-3000:]
