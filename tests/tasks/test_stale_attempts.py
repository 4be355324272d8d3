"""A process that wakes up after its job went on elsewhere writes nothing and asks for no retry.

``run_ladder`` against the session's real Redis, with a rung that plays the other worker's part
while it runs: it settles its own attempt as lost, or stores the job's SUCCESS, then fails or
returns as the stale process would.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from mediafarm.config.ladders import Ladder, rung
from mediafarm.tasks.runtime.downgrade import LadderRun, RetryRequest, run_ladder
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.errors import StaleAttempt
from mediafarm.tasks.wire.family import EngineSpec
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.tasks.wire.records import Outcome

LADDER = Ladder("stale", "stale", (rung("first", "e"), rung("second", "e")))
ENGINES = {"e": EngineSpec("x:y")}


@pytest.fixture()
def job(redis_url: str) -> Iterator[tuple[AttemptLog, str]]:
    client = redis.Redis.from_url(redis_url)
    job_id = f"stale-test-{uuid.uuid4()}"
    result_key = f"celery-task-meta-{job_id}"
    yield AttemptLog(client, job_id, ttl=60), result_key
    client.delete(keys.history(job_id), result_key)


def run(log: AttemptLog, result_key: str, rung: Any, stale_after: float = 3600.0) -> Any:
    job = LadderRun(log.job_id, LADDER, ENGINES, log, worker="cpu@a", fresh=True, result_key=result_key,
                    stale_after=stale_after)  # fmt: skip
    return run_ladder(job, rung)


def settled_elsewhere(log: AttemptLog, index: int) -> None:
    attempts, _ = log.read()
    attempts[index].outcome, attempts[index].reason = Outcome.WORKER_LOST, "judged lost by another worker"
    assert log.settle(index, attempts[index])


def test_a_failure_after_the_job_went_on_elsewhere_is_not_written_or_retried(job) -> None:
    log, result_key = job

    def rung(rung_: Any, index: int, attempt: int) -> Any:
        settled_elsewhere(log, attempt)  # while this process was paused
        raise MemoryError("woke up past its limits")

    with pytest.raises(StaleAttempt, match="settled elsewhere"):
        run(log, result_key, rung)  # not a RetryRequest: the job does not move down a rung
    [attempt] = log.read()[0]
    assert attempt.outcome is Outcome.WORKER_LOST


def test_without_interference_the_same_failure_moves_the_job_down(job) -> None:
    log, result_key = job

    def rung(rung_: Any, index: int, attempt: int) -> Any:
        raise MemoryError("really out of memory")

    assert isinstance(run(log, result_key, rung), RetryRequest)
    assert log.read()[0][0].outcome is Outcome.OOM


def test_a_long_success_after_a_stored_success_is_not_stored_again(job) -> None:
    log, result_key = job

    def rung(rung_: Any, index: int, attempt: int) -> Any:
        log.client.set(result_key, json.dumps({"status": "SUCCESS", "result": {"by": "another worker"}}))
        return {"by": "this stale process"}, ()

    with pytest.raises(StaleAttempt):
        run(log, result_key, rung, stale_after=0.0)  # ran "longer than half the visibility timeout"


def test_a_job_that_had_already_succeeded_when_its_attempt_began_is_not_stored_again(job) -> None:
    log, result_key = job
    log.client.set(result_key, json.dumps({"status": "SUCCESS", "result": {"by": "another worker"}}))

    def rung(rung_: Any, index: int, attempt: int) -> Any:
        return {"by": "a worker paused before it started"}, ()

    with pytest.raises(StaleAttempt, match="already succeeded elsewhere"):
        run(log, result_key, rung)
    assert json.loads(log.client.get(result_key))["result"] == {"by": "another worker"}
    # It left no attempt record either: the history is still the one the stored envelope tells.
    assert log.read()[0] == []


@pytest.mark.parametrize("failure", [MemoryError("woke up short of memory"), ValueError("engine bug")])
def test_a_stale_attempt_that_fails_after_a_stored_success_writes_nothing(job, failure: Exception) -> None:
    log, result_key = job
    log.client.set(result_key, json.dumps({"status": "SUCCESS", "result": {"by": "another worker"}}))

    def rung(rung_: Any, index: int, attempt: int) -> Any:
        raise failure

    with pytest.raises(StaleAttempt, match="already succeeded elsewhere"):
        run(log, result_key, rung)
    assert log.read()[0] == []


def test_a_quick_success_pays_no_extra_round_trip_and_succeeds(job) -> None:
    log, result_key = job
    envelope = run(log, result_key, lambda v, r, a: ({"ok": True}, ()))
    assert envelope.rung == "first" and envelope.attempts[0].outcome is Outcome.OK
