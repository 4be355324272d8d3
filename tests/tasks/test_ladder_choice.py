"""The ladder's choices (``tasks.runtime.ladder_choice``) through ``run_ladder`` with real breakers on the
session's Redis: a fallback is never taken because a breaker is open, and a rung skipped by choice
is tried once before a fallback or the end (issue #29 items 2 and 3)."""

from __future__ import annotations

from typing import Any

import pytest

from mediafarm.config.ladders import Ladder, Rung, rung
from mediafarm.tasks.runtime.breaker import read_breakers
from mediafarm.tasks.runtime.downgrade import RetryRequest
from mediafarm.tasks.runtime.ladder_choice import answers_below, fallbacks, is_fallback, next_rung, owed
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.errors import NoRungLeft, ResourceFailure
from mediafarm.tasks.wire.family import EngineSpec
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.tasks.wire.records import Attempt, Envelope, Outcome
from tests.tasks.test_breaker import Clock, fail, guard, opened, pool, run, worker  # noqa: F401 - pool: a fixture

ENGINES = {"e": EngineSpec("x:y"), "stand_in": EngineSpec("x:z", fallback=True)}
# Two answers and a stand-in, as VAD's silero-onnx → webrtc → skip.
VAD_LIKE = Ladder("lad", "lad", (rung("big", "e"), rung("small", "e"), rung("none", "stand_in")))
TWO = Ladder("lad", "lad", (rung("big", "e"), rung("small", "e")))


def test_a_rung_is_a_fallback_by_its_engine_unless_it_says_otherwise() -> None:
    assert fallbacks(VAD_LIKE, ENGINES) == (False, False, True)
    assert not is_fallback(rung("none", "stand_in", fallback=False), ENGINES)
    assert is_fallback(rung("odd", "e", fallback=True), ENGINES)
    assert [answers_below(i, (False, False, True)) for i in range(3)] == [True, False, False]


def test_the_families_declare_the_stand_ins_and_only_them() -> None:
    from mediafarm.tasks import registry

    found = {
        spec.name: [r.name for r in spec.default_ladder.rungs if is_fallback(r, spec.engines)]
        for spec in registry.load().values()
    }
    assert found["vad"] == ["skip"] and found["yolo"] == ["motion"]
    assert all(not names for name, names in found.items() if name not in ("vad", "yolo")), found


def test_an_operators_ladder_can_declare_a_fallback() -> None:
    from mediafarm.config.file import ConfigFileError
    from mediafarm.config.ladders import _rung_from_table

    made = _rung_from_table("vad-own", {"name": "quiet", "engine": "webrtc", "fallback": True})
    assert made == Rung("quiet", "webrtc", made.params, fallback=True) and made.to_json()["fallback"] is True
    with pytest.raises(ConfigFileError, match="fallback must be true or false"):
        _rung_from_table("vad-own", {"name": "quiet", "engine": "webrtc", "fallback": "yes"})


def test_next_rung_puts_owed_rungs_before_a_fallback_and_the_end() -> None:
    flags = (False, False, True)
    skipped = Attempt(0, "big", Outcome.SKIPPED, "breaker open")
    assert next_rung(1, [skipped], flags) == 1
    assert next_rung(2, [skipped, Attempt(1, "small", Outcome.OOM)], flags) == 0
    assert owed([skipped, Attempt(1, "small", Outcome.OOM), Attempt(0, "big", Outcome.KILLED)], 2) == []
    assert next_rung(2, [skipped, Attempt(1, "small", Outcome.OOM), Attempt(0, "big", Outcome.KILLED)], flags) == 2
    # A try cut short by a lost worker is still owed; the end comes after every owed rung.
    assert owed([skipped, Attempt(0, "big", Outcome.WORKER_LOST)], 2) == [0]
    assert next_rung(2, [Attempt(0, "a", Outcome.OOM), Attempt(1, "b", Outcome.OOM)], (False, False)) is None


def deliver(log: AttemptLog, made: Any, engine: Any, retries: int = 0) -> Any:
    return run(log, made, engine, fresh=retries == 0, retries=retries, engines=ENGINES)


def until_done(log: AttemptLog, b: Any, engine: Any, ladder: Ladder) -> Any:
    """Deliver the job again after each RetryRequest, as Celery would; the end (envelope or error)."""
    for retries in range(8):
        try:
            outcome = deliver(log, guard(b, log.job_id, ladder), engine, retries)
        except NoRungLeft as exc:
            return exc
        if isinstance(outcome, Envelope):
            return outcome
        assert isinstance(outcome, RetryRequest)
    raise AssertionError("the job never ended")


def failing_on(*names: str) -> Any:
    def engine(rung_: Any) -> dict[str, Any]:
        if rung_.name in names:
            raise ResourceFailure(f"{rung_.name} out of memory", Outcome.OOM)
        return {}

    return engine


def seen(attempts: Any) -> list[tuple[str, str]]:
    return [(a.rung, str(a.outcome)) for a in attempts]


def test_an_open_breaker_skips_to_the_next_answer_never_to_the_fallback(
    redis_url: str, pool: str, log: AttemptLog
) -> None:
    _, b = opened(redis_url, pool, "big", "small")
    # Both answering rungs open: the job skips big (small answers), then waits for small's
    # cool-down (only the stand-in is below it) and runs small as its probe.
    made = guard(b, log.job_id, VAD_LIKE)
    envelope = deliver(log, made, failing_on())
    assert isinstance(envelope, Envelope) and envelope.rung == "small"
    assert seen(envelope.attempts) == [("big", "skipped"), ("small", "ok")]
    assert made.waited == [30.0] and "the breaker's probe" in envelope.attempts[1].reason
    assert {(s.rung, s.state) for s in read_breakers(b.client, pool)} == {("big", "open")}


def test_pressure_never_steps_a_new_job_down_onto_a_fallback(redis_url: str, pool: str, log: AttemptLog) -> None:
    b = worker(redis_url, pool, Clock())
    ladder = Ladder("lad", "lad", (rung("big", "e"), rung("none", "stand_in")))
    made = guard(b, log.job_id, ladder, pressure=lambda: "pool 'bt' is under memory pressure")
    envelope = deliver(log, made, failing_on())
    assert seen(envelope.attempts) == [("big", "ok")]
    # With an answer below, it steps down as before.
    other = AttemptLog(log.client, f"{log.job_id}-2", ttl=60)
    made = guard(b, other.job_id, VAD_LIKE, pressure=lambda: "pool 'bt' is under memory pressure")
    assert seen(deliver(other, made, failing_on()).attempts) == [("big", "skipped"), ("small", "ok")]
    log.client.delete(keys.history(other.job_id))


def test_a_rung_skipped_by_its_breaker_is_tried_once_before_the_fallback(
    redis_url: str, pool: str, log: AttemptLog
) -> None:
    _, b = opened(redis_url, pool, "big")
    # big skipped (open), small fails for this job: before the stand-in, big is owed its try; it
    # answers, so the job ends on big, not on the stand-in.
    envelope = until_done(log, b, failing_on("small"), VAD_LIKE)
    assert isinstance(envelope, Envelope) and envelope.rung == "big" and envelope.rung_index == 0
    assert seen(envelope.attempts) == [("big", "skipped"), ("small", "oom"), ("big", "ok")]
    assert "tried once before a fallback or the end: it was skipped (breaker open since" in envelope.attempts[2].reason
    assert [a.rung_index for a in log.read()[0]] == [0, 1, 0]


def test_the_fallback_comes_only_after_every_answer_failed_for_the_job(
    redis_url: str, pool: str, log: AttemptLog
) -> None:
    _, b = opened(redis_url, pool, "big")
    envelope = until_done(log, b, failing_on("big", "small"), VAD_LIKE)
    assert isinstance(envelope, Envelope) and envelope.rung == "none"
    assert seen(envelope.attempts) == [("big", "skipped"), ("small", "oom"), ("big", "oom"), ("none", "ok")]


def test_when_the_last_rung_fails_skipped_rungs_run_once_each_then_the_job_ends(
    redis_url: str, pool: str, log: AttemptLog
) -> None:
    clock, b = opened(redis_url, pool, "big")
    end = until_done(log, b, failing_on("big", "small"), TWO)
    assert isinstance(end, NoRungLeft), end
    assert seen(log.read()[0]) == [("big", "skipped"), ("small", "oom"), ("big", "oom")]
    assert "big=skipped, small=oom, big=oom" in str(end)
    # Had big answered, the kill of the last rung would not have ended the job.
    other = AttemptLog(log.client, f"{log.job_id}-2", ttl=60)
    for job in ("j4", "j5", "j6"):  # big's breaker: reopened by the failures above, or open again
        fail(b, job, clock, "big")
    envelope = until_done(other, b, failing_on("small"), TWO)
    assert isinstance(envelope, Envelope) and seen(envelope.attempts)[-1] == ("big", "ok")
    log.client.delete(keys.history(other.job_id))
