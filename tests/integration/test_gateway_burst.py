"""A burst of submissions through the gateway against a small queue limit: what was taken ends, what
was refused left nothing. A real gateway, Redis and chaos worker; the admission limit is the test's."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis

from mediafarm.config.admission import parse
from mediafarm.config.priorities import redis_lists
from mediafarm.tasks.producer import admission
from mediafarm.tasks.producer.client import handle

pytestmark = pytest.mark.integration
BURST = 40
MAX_QUEUED = 2
TERMINAL = {"SUCCESS", "FAILURE", "REVOKED"}


@pytest.fixture(scope="module")
def chaos_worker(start_worker) -> Any:
    return start_worker("chaos", concurrency=1)


def leftovers(client: redis.Redis, job_id: str) -> list[str]:
    """Every trace of ``job_id`` in the farm's Redis: a key naming it, a message on a chaos queue.

    The id must stand whole: ``burst-…-1`` is a prefix of ``burst-…-14``, and a glob alone counted the
    keys of a job taken as the leftovers of one refused (seen failing in CI)."""
    whole = re.compile(re.escape(job_id) + r"(?![\w-])")
    found = [k.decode() for k in client.scan_iter(match=f"*{job_id}*", count=1000) if whole.search(k.decode())]
    for name in redis_lists("chaos"):
        messages = (raw.decode(errors="replace") for raw in client.lrange(name, 0, -1))
        found += [f"{name}: message" for message in messages if whole.search(message)]
    return found


def test_a_burst_over_the_queue_limit_every_202_ends_and_every_429_left_nothing(
    chaos_worker, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.gateway.conftest import TOKEN, gateway_config, running_gateway

    settings = parse({"depth_cache": 0, "families": {"chaos": {"max_queued": MAX_QUEUED}}})
    monkeypatch.setattr(admission, "get_admission", lambda: settings)
    client = redis.Redis.from_url(redis_url)
    run = f"burst-{time.monotonic_ns()}"
    keys = [f"{run}-{i}" for i in range(BURST)]
    with running_gateway(gateway_config()) as url, httpx.Client(base_url=url, timeout=60) as http:

        def post(key: str) -> httpx.Response:
            return http.post("/v1/jobs/chaos", json={"plan": {"sleep": 0.3}},
                             headers={"Authorization": f"Bearer {TOKEN}", "Idempotency-Key": key})  # fmt: skip

        with ThreadPoolExecutor(16) as pool:
            answers = dict(zip(keys, pool.map(post, keys), strict=True))
    codes = {key: answer.status_code for key, answer in answers.items()}
    assert set(codes.values()) == {202, 429}, codes  # the burst did go over the limit, and was not all refused
    taken = [key for key, code in codes.items() if code == 202]
    refused = [key for key, code in codes.items() if code == 429]
    assert all(answers[key].json()["id"] == key for key in taken)
    assert all(answers[key].headers.get("retry-after") and "chaos" in answers[key].json()["detail"] for key in refused)
    # Every job taken ends, done; every refusal left no key, record or queued message behind.
    deadline = time.monotonic() + 180
    for key in taken:
        job = handle(key, "chaos")
        while (state := job.state()) not in TERMINAL:
            assert time.monotonic() < deadline, f"job {key} still {state}"
            time.sleep(0.1)
        assert state == "SUCCESS" and [a["outcome"] for a in job.attempts()] == ["ok"], (key, job.attempts())
    assert {key: leftovers(client, key) for key in refused} == {key: [] for key in refused}
    # And the taken ones are the only ones the farm knows of.
    assert all(leftovers(client, key) for key in taken)
