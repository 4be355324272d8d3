"""A job's trace on a real worker (``tasks.wire.trace``): both sides' steps in order, the send as
the worker's start, and after a move down the ladder the trace of the delivery that succeeded."""

from __future__ import annotations

import time
import uuid

import pytest
from celery import Celery

from mediafarm import submit
from mediafarm.tasks.wire.trace import Trace

pytestmark = pytest.mark.integration

QUEUE = "chaos-trace"
WORKER_STEPS = ["child", "ready", "attempt", "engine", "engine_end", "recorded"]


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker("chaos", concurrency=1, queues=[QUEUE])


def test_a_job_carries_both_sides_of_its_trace_in_order(worker) -> None:
    called = time.time()
    job = submit("chaos", queue=QUEUE, plan={"sleep": 0.3})
    envelope = job.wait(timeout=60)
    seen = time.time()

    assert job.trace is not None and [s for s, _, _ in job.trace.steps] == ["validated", "routed", "admitted", "sent"]
    assert called <= job.trace.t0 <= seen
    ours = Trace.from_json(envelope["trace"])
    assert [s for s, _, _ in ours.steps] == WORKER_STEPS
    at = [t for _, t, _ in ours.steps]
    assert at == sorted(at) and all(t >= 0 for t in at)
    # t0 is the producer's send: after its call began, and the engine's span holds its 0.3 s sleep.
    assert job.trace.t0 <= ours.t0 <= job.trace.t0 + job.trace.steps[-1][1]
    spans = {s: d for s, d, _ in ours.spans()}
    assert 0.3 <= spans["engine_end"] < 5
    assert ours.t0 + at[-1] <= seen
    # The attempt's record goes out before the engine runs: a round trip of that step.
    assert dict((s, n) for s, _, n in ours.spans())["attempt"] >= 1


def test_a_job_sent_by_a_plain_celery_client_is_traced_from_its_child(worker, redis_url: str) -> None:
    plain = Celery(f"plain-{uuid.uuid4().hex[:6]}", broker=redis_url, backend=redis_url)
    sent = time.time()
    try:
        envelope = plain.send_task("farm.test.chaos", kwargs={"plan": {"sleep": 0.2}}, queue=QUEUE).get(timeout=60)
    finally:
        plain.close()
    ours = Trace.from_json(envelope["trace"])
    child, at, _ = ours.steps[0]
    # Its message has no send time: the trace starts as the child takes the job.
    assert child == "child" and at < 0.05 and ours.t0 >= sent


def test_after_a_move_down_the_trace_starts_at_the_retrys_send(worker) -> None:
    job = submit("chaos", queue=QUEUE, ladder="memerr")
    envelope = job.wait(timeout=60)
    assert [a["outcome"] for a in envelope["attempts"]] == ["oom", "ok"]
    ours = Trace.from_json(envelope["trace"])
    assert [s for s, _, _ in ours.steps] == WORKER_STEPS
    # From the retry's own send (every publish is stamped), sent as the first attempt ended.
    first = envelope["attempts"][0]
    assert ours.t0 >= first["started"] + first["duration"] - 0.01
