"""A worker cut off from its broker mid-job (issue #10 item 3).

The worker runs in a network namespace of its own, joined to this host by a veth pair; its Redis
(the test's own, listening on loopback and the host end of the pair) is reached only through that
link. The test takes the link down while a job runs and brings it back: the job must end exactly
once, and the worker must go on taking jobs by itself. The namespace and the pair are created and
removed here (root needed: skipped, saying so, without it).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from mediafarm.config.pools import get_pool
from mediafarm.tasks.wire import keys
from mediafarm.workers.embedded import EmbeddedRedis
from mediafarm.workers.launch import pool_environment, stop_worker, wait_ready, worker_argv
from tests.support.farm_app import farm_app, release
from tests.support.netns import Link, NamespaceUnavailable, veth_link

pytestmark = pytest.mark.integration


@pytest.fixture()
def link() -> Iterator[Link]:
    try:
        with veth_link() as made:
            yield made
    except NamespaceUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture()
def linked_redis(link: Link, tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(data_dir=tmp_path / "redis", bind=(link.host_address,)).start()
    yield server
    server.stop()


def test_a_worker_cut_off_mid_job_ends_it_once_and_reconnects(
    link: Link, linked_redis: EmbeddedRedis, session_dir: Path
) -> None:
    inside_url = f"redis://{link.host_address}:{linked_redis.port}/0"
    producer = farm_app(linked_redis.url, name="cut")
    node = f"cut-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
    inside = {"FARM_BROKER_URL": inside_url, "FARM_RESULT_BACKEND": inside_url}
    env = pool_environment(get_pool("chaos"), {**os.environ, **inside})
    argv = link.command(worker_argv(get_pool("chaos"), queues=["chaos"], concurrency=1, node=node, loglevel="INFO"))
    log = session_dir / f"{node.split('@')[0]}.log"
    client = redis.Redis.from_url(linked_redis.url)
    with log.open("wb") as fh:
        worker = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
    try:
        wait_ready(producer, node, worker, timeout=90)
        job = producer.send_task("farm.test.chaos", kwargs={"ladder": "slow"}, queue="chaos")  # sleeps 4 s
        deadline = time.monotonic() + 30
        while not client.llen(keys.history(job.id)):
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.05)
        # Cut while it runs; it finishes while cut off. Redis drops the worker's connections
        # meanwhile (as a restart or a firewall losing its state would), so when the link is
        # back the worker finds them dead and must reconnect: its result write retries with
        # backoff, and its ack lands on a new connection.
        link.down()
        time.sleep(1)
        dropped = client.client_kill_filter(_type="normal", skipme=True) + client.client_kill_filter(
            _type="pubsub", skipme=True
        )
        assert dropped >= 2, dropped
        time.sleep(7)
        link.up()
        envelope = job.get(timeout=120)
        assert [(a["rung_index"], a["outcome"]) for a in envelope["attempts"]] == [(0, "ok")], envelope["attempts"]
        # The worker goes on by itself: the next job is taken and done.
        after = producer.send_task("farm.test.chaos", kwargs={"ladder": "memerr"}, queue="chaos")
        assert [a["outcome"] for a in after.get(timeout=60)["attempts"]] == ["oom", "ok"]
        # Every connection the worker had was dropped during the cut: those it has now are new.
        reconnected = [c for c in client.client_list() if c["addr"].startswith(f"{link.worker_address}:")]
        assert reconnected, client.client_list()
        # Where the worker noticed the loss only after the job's ack was due, kombu put the
        # message back on reconnecting; the redelivery found the stored SUCCESS and returned it
        # without running the job. Either way: one attempt record, the same envelope.
        assert client.llen(keys.history(job.id)) == 1
        assert producer.AsyncResult(job.id).get(timeout=10) == envelope
        assert worker.poll() is None
    finally:
        stop_worker(worker, timeout=30)
        client.close()
        release(producer)
