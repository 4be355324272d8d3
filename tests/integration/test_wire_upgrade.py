"""A rolling upgrade across the wire's rung names (version 1: ``rung`` the index, ``variant`` the
name; version 2: ``rung`` the name, ``rung_index`` the place): records an older worker wrote are
read right by this release's worker and producer, on a real worker and Redis."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from celery import states

from mediafarm.tasks.app import app
from mediafarm.tasks.producer.client import handle
from mediafarm.tasks.wire import keys

pytestmark = pytest.mark.integration
QUEUE = "chaos-wire-upgrade"


@pytest.fixture(scope="module")
def chaos_worker(start_worker):
    return start_worker("chaos", concurrency=1, queues=[QUEUE])


def release_before(index: int, name: str, outcome: str, **more: Any) -> dict[str, Any]:
    """An attempt as a worker of the release before wrote it."""
    return {"rung": index, "variant": name, "outcome": outcome, "reason": f"{outcome} on {name}", "retries": index,
            "started": time.time() - 60 + index, "duration": 1.0, "host": "old-host", "worker": "cpu@old-host",
            "pid": 4000 + index, **more}  # fmt: skip


def test_a_job_an_older_worker_moved_down_twice_goes_on_from_the_third_rung(chaos_worker) -> None:
    job_id = f"wire-upgrade-{uuid.uuid4().hex[:8]}"
    # The older worker lost rungs 0 and 1 of the job to resource failures and sent it again, as
    # its retry does (a plain Celery message, retries=2): this release's worker takes it.
    for record in (release_before(0, "a", "killed"), release_before(1, "b", "oom")):
        app.backend.client.rpush(keys.history(job_id), json.dumps(record))
    app.send_task("farm.test.chaos", kwargs={"ladder": "steady"}, task_id=job_id, queue=QUEUE, retries=2)
    envelope = handle(job_id, "chaos").wait(timeout=60)
    # Read as the index it was, the older records say two rungs are gone: the job runs c, not b.
    assert (envelope["rung"], envelope["rung_index"], envelope["variant"]) == ("c", 2, "c"), envelope
    assert [(a["rung"], a["rung_index"], a["outcome"]) for a in envelope["attempts"]] == [
        ("a", 0, "killed"), ("b", 1, "oom"), ("c", 2, "ok")]  # fmt: skip
    assert all(a["variant"] == a["rung"] for a in envelope["attempts"])


def test_a_result_an_older_worker_stored_reads_in_this_releases_names(chaos_worker) -> None:
    job_id = f"wire-upgrade-{uuid.uuid4().hex[:8]}"
    old = {"job_id": job_id, "family": "chaos", "variant": "frugal", "rung": 1, "output": {"pid": 1},
           "attempts": [release_before(0, "hungry", "killed"), release_before(1, "frugal", "ok")],
           "artifacts": []}  # fmt: skip
    app.backend.store_result(job_id, old, states.SUCCESS)
    job = handle(job_id, "chaos")
    for envelope in (job.wait(timeout=10), job.envelope(), job.snapshot().envelope):
        assert (envelope["rung"], envelope["rung_index"]) == ("frugal", 1), envelope
        assert [(a["rung"], a["rung_index"]) for a in envelope["attempts"]] == [("hungry", 0), ("frugal", 1)]
    assert [(a["rung"], a["rung_index"]) for a in job.attempts()] == [("hungry", 0), ("frugal", 1)]
