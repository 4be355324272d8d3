"""A job message lost in kombu's fetch comes back (tasks.runtime.lost_messages), on a real prefork worker.

The loss is made as it happens: a producer sends the job, and its message leaves the list the way a
``BRPOP`` whose reply never reached a worker takes it (an ``RPOP`` no worker reads). The worker's
lost-message sweep (``workers.lost_sweep``, every second here) finds the job in no queue, not
unacked and not ended at two looks, sends its message again, and the worker runs it under the same
id. The worker and its producer run on a Redis database of their own: the ledger is one per database.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from mediafarm.config.pools import get_pool
from mediafarm.config.priorities import redis_lists
from mediafarm.tasks.sent_ledger import RESENT_HEADER, messages
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.history import read_attempts
from mediafarm.workers.launch import spawn_worker, stop_worker, wait_ready
from tests.support.farm_app import farm_app, release

pytestmark = pytest.mark.integration

OWN_DB = 12  # this module's alone


@pytest.fixture()
def own_url(redis_url: str) -> Iterator[str]:
    parts = urlsplit(redis_url)
    url = urlunsplit((parts.scheme, parts.netloc, f"/{OWN_DB}", parts.query, parts.fragment))
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()


def start_worker(url: str, queue: str, log: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """A chaos worker on ``url``'s database, on ``queue`` only, its sweep every second."""
    node = f"lost-t{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
    env = {**os.environ, "FARM_BROKER_URL": url, "FARM_RESULT_BACKEND": url, "FARM_POOL": "chaos",
           "FARM_LOST_SWEEP": "1"}  # fmt: skip
    with log.open("wb") as fh:
        process = spawn_worker(get_pool("chaos"), env=env, logfile=fh, concurrency=1, queues=[queue], node=node,
                               loglevel="INFO")  # fmt: skip
    return node, process


def test_a_message_lost_in_the_fetch_is_sent_again_and_the_job_runs_once(own_url: str, session_dir: Path) -> None:
    client = redis.Redis.from_url(own_url)
    producer = farm_app(own_url, own_url, name="lost-fetch")
    queue = f"lost-{uuid.uuid4().hex[:6]}"
    waiting = f"waiting-{uuid.uuid4().hex[:6]}"
    process: subprocess.Popen[bytes] | None = None
    try:
        lost = producer.send_task("farm.test.chaos", kwargs={"plan": {"sleep": 0.2}}, queue=queue)
        # Another job waits in a queue no worker takes: found at every look, never sent twice.
        kept = producer.send_task("farm.test.chaos", kwargs={"plan": {"sleep": 0.2}}, queue=waiting)
        (name,) = [n for n in redis_lists(queue) if client.llen(n)]
        taken = json.loads(client.rpop(name))  # the fetch whose reply was lost: the message is nowhere
        assert taken["headers"]["id"] == lost.id and client.llen(name) == 0
        assert set(messages(client, [lost.id, kept.id])) == {lost.id, kept.id}  # both kept as published
        log = session_dir / f"lost-{queue}.log"
        node, process = start_worker(own_url, queue, log)
        wait_ready(producer, node, process, timeout=90)
        deadline = time.monotonic() + 60
        while lost.state not in ("SUCCESS", "FAILURE"):
            assert time.monotonic() < deadline, f"job still {lost.state}\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        assert lost.state == "SUCCESS", log.read_text()[-3000:]
        attempts = read_attempts(client, lost.id)
        assert [a["outcome"] for a in attempts] == ["ok"], attempts  # one run, no attempt lost
        assert "sent again by the lost-message sweep" in attempts[0]["route"], attempts[0]
        assert f"job {lost.id}: its message to queue {queue}" in log.read_text()
        assert messages(client, [lost.id]) == {}  # its end took it out of the ledger
        # The waiting job: still once in its queue, still kept, never marked as sent again.
        held = [json.loads(raw) for n in redis_lists(waiting) for raw in client.lrange(n, 0, -1)]
        assert [m["headers"]["id"] for m in held] == [kept.id] and RESENT_HEADER not in held[0]["headers"]
        assert client.zscore(keys.sent_suspects(), kept.id) is None
    finally:
        if process is not None:
            stop_worker(process, timeout=20)
        release(producer)
