"""The scaling gauge equals the truth while jobs are queued, reserved and running on a real worker,
across priorities (issue #31, item 2), read over real HTTP from a running gateway and from the
worker's own /metrics, and shown by ``farm pools --json``.

The worker is the only one of the test-only pool ``scale``, whose one queue no other test's worker
consumes, so every job and slot of that pool is this test's. The truth is read apart from what the
worker writes: the queue's priority lists by LLEN, the jobs the worker took from kombu's ``unacked``
hash, and which of those started from their attempt histories.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator

import httpx
import pytest
import redis
from kombu.utils.json import loads
from prometheus_client.parser import text_string_to_metric_families

from mediafarm.config.priorities import redis_lists, wire_priority
from mediafarm.tasks.app import app
from mediafarm.tasks.producer.handles import JobHandle
from mediafarm.tasks.wire import worker_load
from mediafarm.workers.embedded import free_port
from tests.conftest import REPO
from tests.gateway.conftest import TOKEN, gateway_config, running_gateway

pytestmark = pytest.mark.integration
POOL, QUEUE = "scale", "scale-test"  # tests/support/farm-test.toml


@pytest.fixture(scope="module")
def scale_worker(start_worker):
    port = free_port()
    worker = start_worker(POOL, concurrency=1, env={"FARM_METRICS_PORT": str(port)})
    worker.metrics_url = f"http://127.0.0.1:{port}/metrics"
    return worker


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    with running_gateway(gateway_config()) as url:
        yield url


def send(*, priority: int = 4, sleep: float = 0.0, countdown: float | None = None) -> str:
    """A chaos job on the pool's queue, as a plain Celery client sends it (a countdown: as a retry waits)."""
    sent = app.send_task("farm.test.chaos", kwargs={"ladder": "slow", "plan": {"sleep": sleep}}, queue=QUEUE,
                         priority=wire_priority(priority, rabbitmq=False), countdown=countdown,
                         soft_time_limit=None, time_limit=None)  # fmt: skip
    return sent.id


def truth(client: redis.Redis, jobs: list[str]) -> dict[str, int]:
    """The pool's jobs by state, read apart from the worker's record."""
    queued = sum(client.llen(name) for name in redis_lists(QUEUE))
    taken = set()
    for raw in client.hvals("unacked"):
        message, _exchange, routing_key = loads(raw)
        if routing_key == QUEUE and message["headers"]["id"] in jobs:
            taken.add(message["headers"]["id"])
    started = {job for job in taken if any(json.loads(a).get("outcome") is None
                                            for a in client.lrange(f"mediafarm:attempts:{job}", 0, -1))}  # fmt: skip
    return {"queued": queued, "reserved": len(taken - started), "running": len(started)}


def gauges(text: str) -> dict[str, float]:
    """The pool's series: ``queued``, ``reserved``, ``running``, ``slots``, ``load``."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("pool") != POOL:
                continue
            if sample.name == "mediafarm_pool_jobs":
                out[sample.labels["state"]] = sample.value
            elif sample.name in ("mediafarm_pool_slots", "mediafarm_pool_load"):
                out[sample.name.removeprefix("mediafarm_pool_")] = sample.value
    return out


def until(read: Callable[[], dict], want: Callable[[dict], bool], timeout: float = 6.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        got = read()
        if want(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_the_gauge_is_the_truth_while_jobs_wait_are_reserved_and_run(scale_worker, gateway: str) -> None:
    client = redis.Redis.from_url(app.conf.broker_url)
    jobs: list[str] = []
    with httpx.Client(base_url=gateway, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as http:
        try:
            check(client, http, scale_worker.node, scale_worker.metrics_url, jobs)
        finally:
            for job in jobs:
                JobHandle(job, "chaos").cancel()


def check(client: redis.Redis, http: httpx.Client, node: str, worker_metrics: str, jobs: list[str]) -> None:
    def scraped() -> dict[str, float]:
        answer = http.get("/metrics")
        assert answer.status_code == 200, answer.text
        return gauges(answer.text)

    # Idle: one slot, nothing to do.
    idle = until(scraped, lambda g: g.get("slots") == 1)
    assert idle == {"queued": 0, "reserved": 0, "running": 0, "slots": 1, "load": 0}

    # A retry waiting out its countdown is held by the worker, in no list; then a long job runs,
    # and two more wait behind it, at two priorities (two of the queue's priority lists).
    jobs.append(send(countdown=60))
    held = until(lambda: {"reserved": [r.reserved for r in worker_load.live(client) if r.node == node]},
                 lambda g: g["reserved"] == [1])  # fmt: skip
    assert held == {"reserved": [1]}
    jobs.append(send(priority=9, sleep=6.0))
    jobs += [send(priority=2), send(priority=8)]
    now = until(lambda: truth(client, jobs), lambda t: t["running"] == 1)
    assert now == {"queued": 2, "reserved": 1, "running": 1}
    assert sum(1 for name in redis_lists(QUEUE) if client.llen(name)) == 2  # two priority lists, as meant
    assert client.llen(QUEUE) == 0  # the one list the common recipe reads is empty: its scaler sees no work

    want = {**now, "slots": 1, "load": 4.0}  # 4 jobs over 1 slot a replica
    assert until(scraped, lambda g: g == want) == want
    # The worker serves the same figures on its own /metrics.
    assert until(lambda: gauges(urllib.request.urlopen(worker_metrics, timeout=5).read().decode()),
                 lambda g: g == want) == want  # fmt: skip
    # And `farm pools --json` shows them.
    shown = subprocess.run([sys.executable, "-m", "mediafarm.workers.cli", "pools", "--json"], cwd=REPO,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    signal = json.loads(shown.stdout)["pools"][POOL]["signal"]
    assert {k: signal[k] for k in ("queued", "reserved", "running", "slots", "load")} == want
    assert truth(client, jobs) == now  # still so while it was read
