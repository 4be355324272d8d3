"""Conditional history writes against the session's real Redis: a stale process cannot rewrite history."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis

from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.tasks.wire.records import Attempt, Outcome


@pytest.fixture()
def log(redis_url: str) -> Iterator[AttemptLog]:
    client = redis.Redis.from_url(redis_url)
    job_id = f"history-test-{uuid.uuid4()}"
    yield AttemptLog(client, job_id, ttl=60)
    client.delete(keys.history(job_id), f"result-{job_id}")


def stored(log: AttemptLog) -> list[Attempt]:
    return log.read()[0]


def mine(rung: int = 0, pid: int = 4242) -> Attempt:
    return Attempt(rung, f"v{rung}", pid=pid, worker="cpu@a", started=1000.5)


def finished(attempt: Attempt, outcome: Outcome) -> Attempt:
    return Attempt(**{**attempt.__dict__, "outcome": outcome, "reason": "test"})


def test_a_process_finishes_its_own_open_newest_attempt(log: AttemptLog) -> None:
    index = log.append(mine())
    assert log.finish(index, finished(mine(), Outcome.TIMEOUT), result_key=f"result-{log.job_id}")
    assert stored(log)[0].outcome is Outcome.TIMEOUT


def test_an_attempt_settled_elsewhere_is_not_rewritten(log: AttemptLog) -> None:
    index = log.append(mine())
    assert log.settle(index, finished(mine(), Outcome.WORKER_LOST))  # another worker judged it lost
    assert not log.finish(index, finished(mine(), Outcome.TIMEOUT), result_key="")  # the owner wakes up
    assert not log.settle(index, finished(mine(), Outcome.KILLED))
    assert stored(log)[0].outcome is Outcome.WORKER_LOST


def test_a_newer_attempt_or_a_stored_success_stops_the_write(log: AttemptLog) -> None:
    index = log.append(mine())
    log.append(mine(rung=0, pid=5151))  # the job went on in another child
    assert not log.finish(index, finished(mine(), Outcome.OOM), result_key="")
    other = f"history-test-{uuid.uuid4()}"
    fresh_log = AttemptLog(log.client, other, ttl=60)
    try:
        index = fresh_log.append(mine())
        log.client.set(f"result-{other}", json.dumps({"status": "SUCCESS", "result": {}}))
        assert not fresh_log.finish(index, finished(mine(), Outcome.OOM), result_key=f"result-{other}")
        assert stored(fresh_log)[0].outcome is None
    finally:
        log.client.delete(keys.history(other), f"result-{other}")


def test_only_the_process_that_started_an_attempt_finishes_it(log: AttemptLog) -> None:
    index = log.append(mine(pid=4242))
    impostor = finished(mine(pid=7777), Outcome.OOM)  # pids repeat across hosts and restarts
    assert not log.finish(index, impostor, result_key="")
    other_worker = Attempt(**{**mine().__dict__, "worker": "cpu@b", "outcome": Outcome.OOM})
    assert not log.finish(index, other_worker, result_key="")
    assert stored(log)[0].outcome is None


def test_after_a_stored_success_nothing_is_appended_or_settled(log: AttemptLog) -> None:
    result_key = f"result-{log.job_id}"
    index = log.append(mine(), result_key)
    assert index == 0
    log.client.set(result_key, json.dumps({"status": "SUCCESS", "result": {}}))
    # A stale copy of the message reaching an unavailable rung, or settling an attempt it found open.
    assert log.append(mine(rung=1, pid=5151), result_key) == -1
    assert not log.settle(index, finished(mine(), Outcome.WORKER_LOST), result_key)
    assert [a.outcome for a in stored(log)] == [None]
    # Without a result key (a caller that knows no SUCCESS can exist) the same calls write.
    assert log.append(mine(rung=1, pid=5151)) == 1
    assert log.settle(index, finished(mine(), Outcome.WORKER_LOST))


def test_a_new_attempt_takes_the_partials_and_progress_of_the_one_before_in_the_same_step(log: AttemptLog) -> None:
    # The gateway reads the history and the partial outputs together and takes the partials as the
    # newest attempt's: a new attempt's record must never stand beside the partials of the one before.
    client, job_id = log.client, log.job_id
    result_key = f"result-{job_id}"
    log.append(mine())
    client.rpush(keys.partials(job_id), json.dumps({"word": "ONE"}), json.dumps({"word": "TWO"}))
    client.set(keys.progress(job_id), json.dumps({"fraction": 0.5}))
    log.append(mine(rung=1, pid=5151), result_key)
    assert client.lrange(keys.partials(job_id), 0, -1) == [] and client.get(keys.progress(job_id)) is None
    # Not when the append is refused (a SUCCESS stored): the partials are the job's result's then.
    client.rpush(keys.partials(job_id), json.dumps({"word": "THREE"}))
    client.set(result_key, json.dumps({"status": "SUCCESS", "result": {}}))
    assert log.append(mine(rung=1, pid=6161), result_key) == -1
    assert len(client.lrange(keys.partials(job_id), 0, -1)) == 1
    client.delete(keys.partials(job_id))


def test_an_appended_records_answer_is_read_once_and_a_failed_read_never_reads_again(log: AttemptLog) -> None:
    log.client.set(keys.cancel(log.job_id), 1)
    try:
        pending = log.append_behind(mine())
        assert pending.cancelled() is True and pending.index() == 0  # the cancel flag as the record found it
    finally:
        log.client.delete(keys.cancel(log.job_id))
    broken = log.append_behind(mine(pid=4343))
    connection = broken._connection
    reads: list[int] = []

    def read_response(*args: object, **kwargs: object) -> object:
        reads.append(1)
        raise redis.ConnectionError("the socket went before the reply was read")

    connection.read_response = read_response
    try:
        with pytest.raises(redis.ConnectionError):
            broken.index()
        # Back in the pool and maybe another caller's now: asked again, it raises and reads nothing.
        with pytest.raises(redis.ConnectionError):
            broken.index()
        assert broken.cancelled() is False and broken.succeeded_before() is False and reads == [1]
    finally:
        del connection.read_response  # the pool's connection reads as any other again
