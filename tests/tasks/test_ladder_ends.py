"""What ``run_ladder`` tells the worker about a job's end, against the session's real Redis.

A terminal failure carries the rung it ended on, for the worker's one log line (issue #18 item 2);
an attempt whose delivery retried the job itself on a Redis error, its outcome never written, is a
transient failure on the same rung, not a lost child (found in a RabbitMQ chaos run).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from mediafarm.config.ladders import Ladder, rung
from mediafarm.tasks.runtime.downgrade import LadderRun, recorded_end, run_ladder
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.errors import Cancelled, PermanentFailure
from mediafarm.tasks.wire.family import EngineSpec
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.tasks.wire.records import Attempt, Envelope, Outcome

LADDER = Ladder("ends", "ends", (rung("first", "e"), rung("second", "e")))
ENGINES = {"e": EngineSpec("x:y")}


def run(log: AttemptLog, engine: Callable[[], Any], *, retries: int = 0, fresh: bool = True,
        unwritten: Mapping[int, str] | None = None) -> Any:  # fmt: skip
    def run_rung(rung_: Any, index: int, attempt: int) -> Any:
        return engine(), ()

    job = LadderRun(log.job_id, LADDER, ENGINES, log, retries=retries, worker="cpu@a", fresh=fresh,
                    unwritten=unwritten or {})  # fmt: skip
    return run_ladder(job, run_rung)


def refuse() -> Any:
    raise PermanentFailure("clip.wav: not an audio file")


def test_a_rejection_names_the_rung_it_ended_on(log: AttemptLog) -> None:
    with pytest.raises(PermanentFailure) as caught:
        run(log, refuse)
    assert caught.value.rung == "first"
    assert [(a.rung, a.outcome) for a in log.read()[0]] == [("first", Outcome.REJECTED)]


def test_a_cancel_names_the_rung_it_ended_on(log: AttemptLog) -> None:
    def cancelled() -> Any:
        raise Cancelled("cancelled by its producer")

    with pytest.raises(Cancelled) as caught:
        run(log, cancelled)
    assert caught.value.rung == "first"
    # Cancelled before it ran, by a worker that missed the revoke: the engine ran, the cancel flag ends it.
    log.client.set(keys.cancel(log.job_id), "1", ex=60)
    with pytest.raises(Cancelled, match="before it ran") as caught:
        run(log, lambda: {}, retries=1)
    assert caught.value.rung == "first"


def test_a_recorded_end_names_the_rung_of_the_attempt_that_recorded_it() -> None:
    end = recorded_end(Attempt(1, "second", Outcome.REJECTED, "UnreadableMedia: clip.wav: not an audio file"))
    assert isinstance(end, PermanentFailure) and end.rung == "second"


def test_a_failure_before_any_rung_names_none() -> None:
    assert PermanentFailure("ladder 5 is not a name").rung is None


def test_an_attempt_left_open_by_a_redis_error_runs_its_rung_again(log: AttemptLog) -> None:
    # Delivery 0's attempt: started, its outcome never written (Redis refused it), retried by its
    # own delivery, which says so in the retry's header (FarmTask's UNWRITTEN_HEADER).
    log.append(Attempt(0, "first", retries=0, worker="cpu@a", pid=4242))
    error = "Redis error: Error 111 connecting to 127.0.0.1:6390. Connection refused."
    envelope = run(log, lambda: {}, retries=1, fresh=False, unwritten={0: error})
    assert isinstance(envelope, Envelope) and envelope.rung == "first"
    first, second = log.read()[0]
    assert (first.outcome, second.outcome, second.rung) == (Outcome.TRANSIENT, Outcome.OK, "first")
    assert first.reason.startswith(error)


def test_without_the_word_of_its_delivery_the_open_attempt_is_a_lost_child(log: AttemptLog) -> None:
    log.append(Attempt(0, "first", retries=0, worker="cpu@a", pid=4242))
    envelope = run(log, lambda: {}, retries=1, fresh=False)
    assert isinstance(envelope, Envelope) and envelope.rung == "second"
    assert [a.outcome for a in log.read()[0]] == [Outcome.KILLED, Outcome.OK]
