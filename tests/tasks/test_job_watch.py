"""``JobWatch``: one Redis round trip says whether a followed job changed (the rooms' and the speech
route's look), against the tests' real Redis."""

from __future__ import annotations

import json
import uuid

from mediafarm.tasks.app import app as celery_app
from mediafarm.tasks.producer.handles import JobHandle
from mediafarm.tasks.producer.job_feed import JobWatch
from mediafarm.tasks.wire import keys


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_look_is_due_when_a_length_changes_or_a_full_read_is_owed() -> None:
    job_id = f"watch-{uuid.uuid4()}"
    client = celery_app.backend.client
    clock = Clock()
    watch = JobWatch(JobHandle(job_id, "tts"), full_read_s=1.0, clock=clock)
    try:
        assert watch.changed()  # the first look always reads the job
        assert not watch.changed()
        client.rpush(keys.history(job_id), json.dumps({"variant": "espeak"}))  # a new attempt
        assert watch.changed()
        assert not watch.changed()
        client.rpush(keys.partials(job_id), json.dumps({"chunk": 0}))  # a chunk
        assert watch.changed()
        client.set(celery_app.backend.get_key_for_task(job_id), json.dumps({"status": "SUCCESS"}))  # the state
        assert watch.changed()
        clock.now += 0.9
        assert not watch.changed()
        clock.now += 0.2  # nothing changed, but an outcome written in place would not show: read anyway
        assert watch.changed()
        assert not watch.changed()
    finally:
        client.delete(keys.history(job_id), keys.partials(job_id), celery_app.backend.get_key_for_task(job_id))
