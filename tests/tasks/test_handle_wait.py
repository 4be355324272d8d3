"""``JobHandle.wait`` against the tests' real Redis: a result whose publish the waiting producer
never received is still seen, by the stored state read again every ``REREAD_S``."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from mediafarm.tasks.app import app as celery_app
from mediafarm.tasks.producer import handles
from mediafarm.tasks.producer.handles import JobHandle


def test_a_result_stored_without_its_publish_still_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handles, "REREAD_S", 0.5)
    job_id = f"wait-{uuid.uuid4()}"
    backend = celery_app.backend
    envelope = {"job_id": job_id, "family": "chaos", "rung": "steady", "attempts": []}
    meta = {"status": "SUCCESS", "result": envelope, "traceback": None, "children": [], "date_done": None,
            "task_id": job_id}  # fmt: skip

    def stored_unannounced() -> None:
        # As the worker's SUCCESS script stores it, but its PUBLISH lost to the waiting producer
        # (its subscription's connection dropped as the result went out).
        time.sleep(1.0)
        backend.client.set(backend.get_key_for_task(job_id), json.dumps(meta), ex=60)

    writer = threading.Thread(target=stored_unannounced)
    writer.start()
    try:
        started = time.monotonic()
        got = JobHandle(job_id, "chaos").wait(timeout=30)
        assert (got["job_id"], got["family"]) == (job_id, "chaos")
        # Seen within a slice of the write, not at the 30 s timeout.
        assert time.monotonic() - started < 1.0 + 0.5 + 3.0
    finally:
        writer.join()
        backend.client.delete(backend.get_key_for_task(job_id))


def test_a_wait_past_its_timeout_still_raises_timeout_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handles, "REREAD_S", 0.3)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="not finished after 1.0 s"):
        JobHandle(f"wait-{uuid.uuid4()}", "chaos").wait(timeout=1.0)
    assert 1.0 <= time.monotonic() - started < 4.0
