"""Fixtures of the task-level tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.history import AttemptLog


@pytest.fixture()
def log(redis_url: str) -> Iterator[AttemptLog]:
    """The attempt log of a fresh job id on the session's Redis; its keys are gone afterwards."""
    client = redis.Redis.from_url(redis_url)
    job_id = f"ladder-test-{uuid.uuid4()}"
    yield AttemptLog(client, job_id, ttl=60)
    client.delete(keys.history(job_id), keys.cancel(job_id), keys.kill(job_id))
