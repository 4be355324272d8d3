"""A job whose end is already recorded is not run again when its message comes back.

The case found from outside: a bad input's attempt was recorded ``rejected``, then its child was
SIGKILLed before Celery stored the failure; Celery retried the message (``task_retry_on_worker_lost``)
and the same bad input ran again on the same rung. ``run_ladder`` against the session's real Redis.
"""

from __future__ import annotations

from typing import Any

import pytest

from mediafarm.config.ladders import Ladder, rung
from mediafarm.tasks.runtime.downgrade import LadderRun, run_ladder
from mediafarm.tasks.wire.errors import Cancelled, EngineError, PermanentFailure
from mediafarm.tasks.wire.family import EngineSpec
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.tasks.wire.records import Attempt, Outcome

LADDER = Ladder("ended", "ended", (rung("first", "e"), rung("second", "e")))
ENGINES = {"e": EngineSpec("x:y")}


def rerun(log: AttemptLog, retries: int, ran: list[int]) -> Any:
    def rung(rung_: Any, index: int, attempt: int) -> Any:
        ran.append(attempt)
        return {}, ()

    job = LadderRun(log.job_id, LADDER, ENGINES, log, retries=retries, worker="cpu@a", fresh=False)
    return run_ladder(job, rung)


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
    assert [(a.rung, a.outcome) for a in attempts] == [("first", outcome)]  # nothing appended

