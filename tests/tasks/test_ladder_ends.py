"""What ``run_ladder`` tells the worker about a job's end, against the session's real Redis.

An attempt whose delivery retried the job itself on a Redis error, its outcome never written, is a
transient failure on the same rung, not a lost child (found in a RabbitMQ chaos run).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import redis

from mediafarm.config.ladders import Ladder, rung
from mediafarm.tasks import keys
from mediafarm.tasks.downgrade import LadderRun, run_ladder
from mediafarm.tasks.family import EngineSpec
from mediafarm.tasks.history import AttemptLog
from mediafarm.tasks.records import Attempt, Envelope, Outcome

LADDER = Ladder("ends", "ends", (rung("first", "e"), rung("second", "e")))
ENGINES = {"e": EngineSpec("x:y")}


@pytest.fixture()
def log(redis_url: str) -> Iterator[AttemptLog]:
    client = redis.Redis.from_url(redis_url)
    job_id = f"ends-test-{uuid.uuid4()}"
    yield AttemptLog(client, job_id, ttl=60)
    client.delete(keys.history(job_id), keys.cancel(job_id))


def run(log: AttemptLog, engine: Callable[[], Any], *, retries: int = 0, fresh: bool = True,
        unwritten: Mapping[int, str] | None = None) -> Any:  # fmt: skip
    def run_rung(rung_: Any, index: int, attempt: int) -> Any:
        return engine(), ()

    job = LadderRun(log.job_id, LADDER, ENGINES, log, retries=retries, worker="cpu@a", fresh=fresh,
                    unwritten=unwritten or {})  # fmt: skip
    return run_ladder(job, run_rung)


def test_an_attempt_left_open_by_a_redis_error_runs_its_rung_again(log: AttemptLog) -> None:
    # Delivery 0's attempt: started, its outcome never written (Redis refused it), retried by its
    # own delivery, which says so in the retry's header (FarmTask's UNWRITTEN_HEADER).
    log.append(Attempt(0, "first", retries=0, worker="cpu@a", pid=4242))
    error = "Redis error: Error 111 connecting to 127.0.0.1:6390. Connection refused."
    envelope = run(log, lambda: {}, retries=1, fresh=False, unwritten={0: error})
    assert isinstance(envelope, Envelope) and envelope.variant == "first"
    first, second = log.read()[0]
    assert (first.outcome, second.outcome, second.variant) == (Outcome.TRANSIENT, Outcome.OK, "first")
    assert first.reason.startswith(error)


def test_without_the_word_of_its_delivery_the_open_attempt_is_a_lost_child(log: AttemptLog) -> None:
    log.append(Attempt(0, "first", retries=0, worker="cpu@a", pid=4242))
    envelope = run(log, lambda: {}, retries=1, fresh=False)
    assert isinstance(envelope, Envelope) and envelope.variant == "second"
    assert [a.outcome for a in log.read()[0]] == [Outcome.KILLED, Outcome.OK]
