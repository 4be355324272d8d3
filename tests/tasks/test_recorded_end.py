"""A job whose end is already recorded is not run again when its message comes back.

The case found from outside: a bad input's attempt was recorded ``rejected``, then its child was
SIGKILLed before Celery stored the failure; Celery retried the message (``task_retry_on_worker_lost``)
and the same bad input ran again on the same rung. ``run_ladder`` against the session's real Redis.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from mediafarm.config.ladders import Ladder, variant
from mediafarm.tasks import keys
from mediafarm.tasks.downgrade import run_ladder
from mediafarm.tasks.errors import Cancelled, EngineError, PermanentFailure
from mediafarm.tasks.family import EngineSpec
from mediafarm.tasks.history import AttemptLog
from mediafarm.tasks.records import Attempt, Outcome

LADDER = Ladder("ended", "ended", (variant("first", "e"), variant("second", "e")))
ENGINES = {"e": EngineSpec("x:y")}


@pytest.fixture()
def log(redis_url: str) -> Iterator[AttemptLog]:
    client = redis.Redis.from_url(redis_url)
    job_id = f"ended-test-{uuid.uuid4()}"
    yield AttemptLog(client, job_id, ttl=60)
    client.delete(keys.history(job_id))


def rerun(log: AttemptLog, retries: int, ran: list[int]) -> Any:
    def rung(variant_: Any, rung_: int, attempt: int) -> Any:
        ran.append(attempt)
        return {}, ()

    return run_ladder(job_id=log.job_id, ladder=LADDER, engines=ENGINES, log=log, retries=retries, worker="cpu@a",
                      transient_budget=2, run_rung=rung, fresh=False)  # fmt: skip


@pytest.mark.parametrize(
    ("outcome", "raised", "retries"),
    [
        (Outcome.REJECTED, PermanentFailure, 1),  # killed after the record: Celery's retry on worker loss
        (Outcome.REJECTED, PermanentFailure, 0),  # the whole worker died: a plain redelivery
        (Outcome.CANCELLED, Cancelled, 1),
        (Outcome.ERROR, EngineError, 1),
    ],
)
def test_a_recorded_terminal_outcome_ends_the_job_again_without_running_it(log, outcome, raised, retries) -> None:
    reason = "UnreadableMedia: clip.wav: not an audio file"
    log.append(Attempt(0, "first", outcome, reason, retries=0, worker="cpu@a"))
    ran: list[int] = []
    with pytest.raises(raised) as caught:
        rerun(log, retries, ran)
    assert ran == []
    assert reason in str(caught.value) and "first" in str(caught.value)
    attempts, _ = log.read()
    assert [(a.variant, a.outcome) for a in attempts] == [("first", outcome)]  # nothing appended

