"""A plain Celery client (issue #18 item 6): ``Celery(broker=..., backend=...)`` and nothing else, sending a
farm task by name without a queue, puts it on Celery's default queue ``celery``. Its farm task runs
(sent on by the worker to its family's queue, once, under the same id); a task the farm does not
run fails at once, naming those it does. Real Redis, real worker, a client that knows nothing of
the farm's configuration."""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path

import pytest
from celery import Celery
from celery.exceptions import NotRegistered

from mediafarm.config.pools import get_pool
from mediafarm.workers.launch import spawn_worker, stop_worker, wait_ready
from tests.support.farm_app import farm_app

pytestmark = pytest.mark.integration


def plain_client(redis_url: str) -> Celery:
    client = Celery(f"foreign-{uuid.uuid4().hex[:6]}", broker=redis_url, backend=redis_url)
    assert client.conf.task_default_queue == "celery" and not client.conf.task_routes  # where its tasks go
    return client


def log_of(session_dir: Path, needle: str, timeout: float = 10) -> str:
    """Every worker log of the session, once one holds ``needle`` (the line of a job may land just
    after its result). Every farm worker takes the default queue, so whichever was up took it."""
    deadline = time.monotonic() + timeout
    while True:
        logs = "\n".join(path.read_text(errors="replace") for path in sorted(session_dir.glob("*.log")))
        if needle in logs or time.monotonic() > deadline:
            return logs
        time.sleep(0.1)


def test_a_farm_task_sent_by_name_without_a_queue_runs_once(cpu_worker, redis_url: str, session_dir: Path) -> None:
    result = plain_client(redis_url).send_task("farm.toy.count", kwargs={"text": "one two"})
    envelope = result.get(timeout=60)
    assert envelope["job_id"] == result.id and envelope["output"]["words"] == ["ONE", "TWO"]
    log = log_of(session_dir, f"Task farm.toy.count[{result.id}] succeeded")
    sent_on = "came on queue 'celery' (a client that named no queue): sent on to queue 'toy'"
    assert f"farm.toy.count[{result.id}] {sent_on}" in log
    assert log.count(f"farm.toy.count[{result.id}] received") == 1 and len(envelope["attempts"]) == 1


def test_the_reported_case_a_vad_job_from_a_plain_client(cpu_worker, speech_track, redis_url: str) -> None:
    result = plain_client(redis_url).send_task("farm.vad.detect", kwargs={"media": str(speech_track.path)})
    envelope = result.get(timeout=120)
    assert envelope["family"] == "vad" and len(envelope["output"]["spans"]) == len(speech_track.truth)


def test_a_task_the_farm_does_not_run_fails_at_once_naming_those_it_runs(
    cpu_worker, redis_url: str, session_dir: Path
) -> None:
    started = time.monotonic()
    result = plain_client(redis_url).send_task("farm.nope.detect", kwargs={})
    with pytest.raises(NotRegistered) as refused:
        result.get(timeout=30)
    assert time.monotonic() - started < 10
    message = str(refused.value)
    assert "'farm.nope.detect' is not a task of this farm; it runs " in message
    assert "farm.vad.detect" in message and "farm.toy.count" in message
    refused_line = f"farm.nope.detect[{result.id}] came on queue 'celery' and was refused"
    log = log_of(session_dir, refused_line)
    assert refused_line in log
    assert "Traceback" not in log.split(refused_line, 1)[1].split("\n[", 1)[0]  # one WARNING line, no traceback
    # The worker serves on.
    assert plain_client(redis_url).send_task("farm.toy.count", kwargs={"text": "still"}).get(timeout=60)
    assert cpu_worker.process.poll() is None


def test_on_rabbitmq_a_plain_clients_task_goes_on_to_the_family_quorum_queue(
    amqp_url: str, redis_url: str, session_dir: Path
) -> None:
    # The plain client declares `celery` as a classic queue, the worker the same; the family's
    # queue is the farm's quorum queue, which a classic declaration of it would be refused.
    env = {**os.environ, "FARM_BROKER_URL": amqp_url, "FARM_RESULT_BACKEND": redis_url}
    node = f"foreign-amqp-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
    with (session_dir / f"{node.split('@')[0]}.log").open("wb") as fh:
        worker = spawn_worker(get_pool("chaos"), env=env, logfile=fh, queues=["chaos"], concurrency=1, node=node)
    try:
        wait_ready(farm_app(amqp_url, redis_url), node, worker, timeout=90)
        client = Celery(f"foreign-{uuid.uuid4().hex[:6]}", broker=amqp_url, backend=redis_url)
        envelope = client.send_task("farm.test.chaos", kwargs={"ladder": "steady"}).get(timeout=60)
        assert envelope["family"] == "chaos" and [a["outcome"] for a in envelope["attempts"]] == ["ok"]
        with pytest.raises(NotRegistered, match="'farm.nope.detect' is not a task of this farm"):
            client.send_task("farm.nope.detect").get(timeout=30)
    finally:
        stop_worker(worker, timeout=20)


def test_a_foreign_queue_that_farm_jobs_go_to_stops_the_worker_from_starting(redis_url: str, session_dir: Path) -> None:
    # Consuming the toy family's queue as the foreign one would send its jobs back to it forever.
    env = {**os.environ, "FARM_FOREIGN_QUEUE": "toy"}
    node = f"foreign-bad-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
    log = session_dir / f"{node.split('@')[0]}.log"
    with log.open("wb") as fh:
        worker = spawn_worker(get_pool("cpu"), env=env, logfile=fh, concurrency=1, node=node)
    try:
        with pytest.raises(RuntimeError, match="exited with code"):
            wait_ready(farm_app(redis_url), node, worker, timeout=60)
        assert "FARM_FOREIGN_QUEUE='toy' is a queue the farm's jobs go to" in log.read_text(errors="replace")
    finally:
        stop_worker(worker, timeout=20)
