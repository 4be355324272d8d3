"""The farm's result backend against the session's real Redis: a late RETRY, FAILURE or STARTED
(a process that moved the job down a rung just before the next rung finished) never replaces a
stored SUCCESS, a state that is not an end never replaces a stored FAILURE or REVOKED, and
everything else is stored and published as Celery stores it."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest
from celery import Celery, states

from mediafarm.config.celery import backend_address, celery_config, result_backend_setting
from mediafarm.config.settings import FarmSettings
from mediafarm.tasks.result_backend import FarmRedisBackend
from mediafarm.tasks.wire import keys


@pytest.fixture()
def backend(redis_url: str) -> Iterator[FarmRedisBackend]:
    app = Celery("result-backend-test")
    app.config_from_object(celery_config(FarmSettings(broker_url=redis_url)))
    backend = app.backend
    assert isinstance(backend, FarmRedisBackend)
    yield backend
    app.close()


def job_id() -> str:
    return f"backend-test-{uuid.uuid4()}"


def stale_write(backend: FarmRedisBackend, task_id: str, state: str, result: object) -> None:
    """What Celery's ``_store_result`` writes after its own read of the state found no SUCCESS:
    the write that loses the race (the read happened before the other rung stored SUCCESS)."""
    if isinstance(result, BaseException):
        result = backend.prepare_exception(result)
    meta = backend._get_result_meta(result=result, state=state, traceback=None, request=None)
    meta["task_id"] = task_id
    backend._set_with_state(backend.get_key_for_task(task_id), backend.encode(meta), state)


def next_message(pubsub) -> bytes:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        # The subscription's own confirmation comes first and reads as None here.
        message = pubsub.get_message(timeout=0.5)
        if message is not None:
            return message["data"]
    raise AssertionError("nothing was published")


def published_within(pubsub, seconds: float) -> list[bytes]:
    """Everything published in the next ``seconds`` (the subscription's confirmation reads as None)."""
    deadline, got = time.monotonic() + seconds, []
    while (left := deadline - time.monotonic()) > 0:
        message = pubsub.get_message(timeout=left)
        if message is not None:
            got.append(message["data"])
    return got


@pytest.mark.parametrize("state", [states.RETRY, states.FAILURE, states.STARTED])
def test_a_late_write_never_replaces_a_stored_success(backend: FarmRedisBackend, state: str) -> None:
    task_id = job_id()
    backend.store_result(task_id, {"rung": 1}, states.SUCCESS)
    stale_write(backend, task_id, state, ValueError("moved down") if state != states.STARTED else {})
    meta = backend.get_task_meta(task_id, cache=False)
    assert meta["status"] == states.SUCCESS and meta["result"] == {"rung": 1}
    backend.forget(task_id)


@pytest.mark.parametrize("end", [states.FAILURE, states.REVOKED])
@pytest.mark.parametrize("state", [states.RETRY, states.STARTED, "PROGRESS"])
def test_a_state_that_is_no_end_never_replaces_a_stored_end(backend: FarmRedisBackend, end: str, state: str) -> None:
    # A stale worker's main process retrying a job its lost child ran, after another worker ended
    # the job: the RETRY must not reopen it (nor publish, as if it had).
    task_id = job_id()
    key = backend.get_key_for_task(task_id)
    stale_write(backend, task_id, end, ValueError("rejected by the worker that got the message again"))
    pubsub = backend.client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(key)
    try:
        stale_write(backend, task_id, state, ValueError("WorkerLostError") if state == states.RETRY else {})
        meta = backend.get_task_meta(task_id, cache=False)
        assert meta["status"] == end and "rejected by the worker" in str(meta["result"])
        assert published_within(pubsub, 0.3) == []
        # An end may follow an end that is not a SUCCESS (as Celery stores it), but a cancelled
        # job stays cancelled: a stale FAILURE does not replace its REVOKED.
        stale_write(backend, task_id, states.FAILURE, ValueError("a later end"))
        if end == states.REVOKED:
            assert backend.get_task_meta(task_id, cache=False)["status"] == states.REVOKED
            assert published_within(pubsub, 0.3) == []
            stale_write(backend, task_id, states.REVOKED, ValueError("cancelled again"))
            assert b'"REVOKED"' in next_message(pubsub)
        else:
            assert backend.get_task_meta(task_id, cache=False)["status"] == states.FAILURE
            assert b'"FAILURE"' in next_message(pubsub)
    finally:
        pubsub.close()
        backend.forget(task_id)


def test_states_before_success_are_stored_with_their_expiry_and_published(backend: FarmRedisBackend) -> None:
    task_id = job_id()
    key = backend.get_key_for_task(task_id)
    pubsub = backend.client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(key)
    try:
        stale_write(backend, task_id, states.RETRY, ValueError("moved down"))
        assert backend.get_task_meta(task_id, cache=False)["status"] == states.RETRY
        assert 0 < backend.client.ttl(key) <= backend.expires
        assert b'"RETRY"' in next_message(pubsub)
        backend.store_result(task_id, {"rung": 1}, states.SUCCESS)
        assert backend.get_task_meta(task_id, cache=False)["status"] == states.SUCCESS
        # A redelivered job that returns its stored result stores SUCCESS again: allowed.
        backend.store_result(task_id, {"rung": 1}, states.SUCCESS)
        assert backend.get_task_meta(task_id, cache=False)["result"] == {"rung": 1}
    finally:
        pubsub.close()
        backend.forget(task_id)


def test_a_failure_gets_celerys_failure_expiry(backend: FarmRedisBackend) -> None:
    task_id = job_id()
    backend.failure_expires = 30
    stale_write(backend, task_id, states.FAILURE, ValueError("bad input"))
    assert 0 < backend.client.ttl(backend.get_key_for_task(task_id)) <= 30
    backend.forget(task_id)


def test_only_redis_urls_get_the_farm_backend_class() -> None:
    setting = result_backend_setting("redis://h:1/0")
    assert setting.endswith("+redis://h:1/0") and backend_address(setting) == "redis://h:1/0"
    assert result_backend_setting("rpc://") == "rpc://" and backend_address("rpc://") == "rpc://"
    assert backend_address("redis://h:1/0") == "redis://h:1/0"


def envelope(task_id: str, *variants: str) -> dict:
    attempts = [{"rung": i, "variant": v, "outcome": "killed" if i < len(variants) - 1 else "ok", "pid": 100 + i}
                for i, v in enumerate(variants)]  # fmt: skip
    return {"job_id": task_id, "family": "vad", "variant": variants[-1], "rung": len(variants) - 1,
            "output": {}, "attempts": attempts, "artifacts": []}  # fmt: skip


def test_a_jobs_success_makes_its_attempt_log_the_envelopes(backend: FarmRedisBackend) -> None:
    """A stale copy of the message appended an open attempt the successful worker never read:
    storing the SUCCESS leaves the log exactly the envelope's attempts (issue #10: history and
    envelope always agree)."""
    task_id, client = job_id(), backend.client
    history = keys.history(task_id)
    client.rpush(history, json.dumps({"rung": 0, "variant": "a", "outcome": None, "pid": 100}))
    client.rpush(history, json.dumps({"rung": 1, "variant": "b", "outcome": None, "pid": 999}))  # the stale copy
    client.rpush(history, json.dumps({"rung": 1, "variant": "b", "outcome": None, "pid": 101}))
    stored = envelope(task_id, "a", "b")
    backend.store_result(task_id, stored, states.SUCCESS)
    assert [json.loads(r) for r in client.lrange(history, 0, -1)] == stored["attempts"]
    assert 0 < client.ttl(history) <= backend.expires
    assert backend.get_task_meta(task_id, cache=False)["result"] == stored
    client.delete(history)
    backend.forget(task_id)


def test_a_second_success_keeps_the_first_and_publishes_nothing(backend: FarmRedisBackend) -> None:
    task_id, client = job_id(), backend.client
    first, second = envelope(task_id, "a"), envelope(task_id, "a", "b")
    backend.store_result(task_id, first, states.SUCCESS)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(backend.get_key_for_task(task_id))
    try:
        backend.store_result(task_id, second, states.SUCCESS)
        assert backend.get_task_meta(task_id, cache=False)["result"] == first
        assert [json.loads(r) for r in client.lrange(keys.history(task_id), 0, -1)] == first["attempts"]
        pubsub.get_message(timeout=0.5)  # the subscription's confirmation
        assert pubsub.get_message(timeout=0.5) is None
    finally:
        pubsub.close()
        client.delete(keys.history(task_id))
        backend.forget(task_id)


def test_a_result_that_is_not_a_farm_envelope_leaves_the_attempt_log_alone(backend: FarmRedisBackend) -> None:
    task_id, client = job_id(), backend.client
    client.rpush(keys.history(task_id), "{}")
    backend.store_result(task_id, {"job_id": "another job", "attempts": []}, states.SUCCESS)
    assert client.lrange(keys.history(task_id), 0, -1) == [b"{}"]
    client.delete(keys.history(task_id))
    backend.forget(task_id)
