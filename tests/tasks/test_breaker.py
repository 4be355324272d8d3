"""The rung circuit breaker's state machine (``tasks.runtime.breaker``) on the session's real Redis, with a
fake clock; and what ``run_ladder`` does with it: a skipped rung in the history, the last rung run
anyway, the memory-pressure step-down."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from mediafarm.config.ladder_policy import BreakerPolicy, LadderPolicy
from mediafarm.config.ladders import Ladder, rung
from mediafarm.tasks.runtime.breaker import PROBE, RUN, SKIP, Breakers, read_breakers
from mediafarm.tasks.runtime.downgrade import LadderRun, RetryRequest, run_ladder
from mediafarm.tasks.runtime.rung_guard import RungGuard
from mediafarm.tasks.runtime.rung_policies import Availability, Breaker
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.errors import ResourceFailure
from mediafarm.tasks.wire.family import EngineSpec
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.tasks.wire.records import Attempt, Envelope, Outcome

POLICY = BreakerPolicy(failures=3, window_s=60, cooldown_s=30, refresh_s=0)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def pool(redis_url: str) -> Iterator[str]:
    """A pool name of its own; its breakers are gone afterwards."""
    name = f"bt{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    client.delete(keys.breakers(name), *client.keys(f"{keys.PREFIX}:breaker-failures:{name}:*"))


def worker(redis_url: str, pool: str, clock: Clock) -> Breakers:
    return Breakers(redis.Redis.from_url(redis_url), pool, clock)


def fail(b: Breakers, job: str, clock: Clock, rung_: str = "big") -> str:
    return b.failed("lad", rung_, POLICY, Attempt(0, rung_, Outcome.OOM, started=clock.now), job)


def opened(redis_url: str, pool: str, *rungs: str) -> tuple[Clock, Breakers]:
    """A fake clock and a worker's breakers on which each of ``rungs`` failed for three jobs: open."""
    clock = Clock()
    b = worker(redis_url, pool, clock)
    for job in ("j1", "j2", "j3"):
        for name in rungs:
            fail(b, job, clock, name)
    return clock, b


def test_k_failures_within_the_window_open_it_and_fewer_do_not(redis_url: str, pool: str) -> None:
    clock = Clock()
    a = worker(redis_url, pool, clock)
    assert [fail(a, "j1", clock), fail(a, "j2", clock)] == ["counted", "counted"]
    clock.now += 61  # the first two fall out of the window
    assert fail(a, "j3", clock) == "counted"
    assert a.decide("lad", "big", "j4", 100, 0) == (RUN, None)
    clock.now += 1
    fail(a, "j4", clock)
    assert fail(a, "j5", clock) == "opened"
    verdict, state = a.decide("lad", "big", "j6", 100, 0)
    assert verdict == SKIP and state is not None
    assert (state.state, state.failures, state.until - state.since) == ("open", 3, 30)
    assert "breaker open since 2027-01-15T08:01:02Z, 3 failures in 60 s" in state.reason()
    # Another rung of the ladder is unaffected; a straggler's failure does not extend the cool-down.
    assert a.decide("lad", "small", "j6", 100, 0) == (RUN, None)
    assert fail(a, "j0", clock) == "unchanged"
    assert [s.rung for s in read_breakers(a.client, pool)] == ["big"]


def test_after_the_cool_down_one_probe_of_two_workers_and_its_success_closes(redis_url: str, pool: str) -> None:
    clock = Clock()
    a, b = worker(redis_url, pool, clock), worker(redis_url, pool, clock)
    for job in ("j1", "j2", "j3"):
        fail(a, job, clock)
    assert b.decide("lad", "big", "j4", 100, 0)[0] == SKIP  # the other worker sees it open
    clock.now += 30
    verdicts = [a.decide("lad", "big", "p1", 100, 0)[0], b.decide("lad", "big", "p2", 100, 0)[0]]
    assert verdicts == [PROBE, SKIP]
    assert a.decide("lad", "big", "p1", 100, 0)[0] == PROBE  # the probe's own retry keeps its claim
    assert not b.probe_ended("lad", "big", "p2", succeeded=True)  # not the probe: changes nothing
    assert b.probe_ended("lad", "big", "p1", succeeded=True)
    assert b.decide("lad", "big", "j5", 100, 0) == (RUN, None)
    assert a.decide("lad", "big", "j5", 100, 0) == (RUN, None)
    assert read_breakers(a.client, pool) == []
    # The count starts again: two failures do not open it.
    assert [fail(a, "j6", clock), fail(a, "j7", clock)] == ["counted", "counted"]


def test_a_failed_probe_opens_it_again_and_a_lost_one_lets_another_probe(redis_url: str, pool: str) -> None:
    clock = Clock()
    a, b = worker(redis_url, pool, clock), worker(redis_url, pool, clock)
    for job in ("j1", "j2", "j3"):
        fail(a, job, clock)
    clock.now += 31
    assert a.decide("lad", "big", "p1", 100, 0)[0] == PROBE
    assert fail(b, "p1", clock) == "reopened"
    verdict, state = b.decide("lad", "big", "j4", 100, 0)
    assert verdict == SKIP and state is not None and (state.opened, state.since) == (2, clock.now)
    assert "reopened after 1 failed probe(s)" in state.reason()
    clock.now += 30
    assert a.decide("lad", "big", "p2", 100, 0)[0] == PROBE
    clock.now += 99  # its claim is still good ...
    verdict, state = b.decide("lad", "big", "p3", 100, 0)
    assert verdict == SKIP and state is not None and state.reason().endswith("; job p2 probes it")
    clock.now += 1  # ... and lapses: its worker was lost
    assert b.decide("lad", "big", "p3", 100, 0)[0] == PROBE
    # A probe that ended neither well nor by resource (bad input) hands the probe on at once.
    assert b.probe_ended("lad", "big", "p3", succeeded=False)
    assert a.decide("lad", "big", "p4", 100, 0)[0] == PROBE


LADDER = Ladder("lad", "lad", (rung("big", "e"), rung("small", "e")))
ENGINES = {"e": EngineSpec("x:y")}


def run(
    log: AttemptLog, guard: RungGuard, engine: Any, fresh: bool = True, retries: int = 0, engines: Any = None
) -> Any:
    """One delivery of the job through ``run_ladder``; ``engine(rung)`` answers or raises."""
    engines = ENGINES if engines is None else engines
    job = LadderRun(log.job_id, guard.ladder, engines, log, retries=retries, worker="bt@a", fresh=fresh,
                    policies=(Availability(), Breaker(guard)))  # fmt: skip
    return run_ladder(job, lambda rung_, index, attempt: (engine(rung_), ()))


def guard(b: Breakers, job_id: str, ladder: Ladder = LADDER, pressure: Any = None, max_wait_s: float = 60) -> RungGuard:
    """A guard whose waits pass on the breakers' fake clock (``waited`` lists them)."""

    def sleep(seconds: float) -> None:
        b.clock.now += seconds  # type: ignore[attr-defined]
        waited.append(seconds)

    made = RungGuard(ladder, LadderPolicy(POLICY, pressure is not None), job_id, b, 100, pressure, max_wait_s, sleep)
    waited: list[float] = []
    made.waited = waited  # type: ignore[attr-defined]
    return made


def oom_on_big(rung_: Any) -> dict[str, Any]:
    if rung_.name == "big":
        raise ResourceFailure("out of memory", Outcome.OOM)
    return {}


def test_the_ladder_skips_an_open_rung_records_why_and_the_probe_closes_it(
    redis_url: str, pool: str, log: AttemptLog
) -> None:
    clock = Clock()
    b = worker(redis_url, pool, clock)
    for job in ("j1", "j2"):
        fail(b, job, clock)
    # The third failure is the ladder's own: the job moves down, and the breaker opens.
    assert isinstance(run(log, guard(b, log.job_id), oom_on_big), RetryRequest)
    assert [s.state for s in read_breakers(b.client, pool)] == ["open"]

    other = AttemptLog(log.client, f"{log.job_id}-2", ttl=60)
    envelope = run(other, guard(b, other.job_id), oom_on_big)
    assert isinstance(envelope, Envelope) and envelope.rung == "small"
    skipped, ran = envelope.attempts
    assert (skipped.rung, skipped.outcome, skipped.duration) == ("big", Outcome.SKIPPED, None)
    assert "breaker open since" in skipped.reason and "3 failures in 60 s" in skipped.reason
    assert [a.outcome for a in other.read()[0]] == [Outcome.SKIPPED, Outcome.OK]

    clock.now += 30
    probe = AttemptLog(log.client, f"{log.job_id}-3", ttl=60)
    envelope = run(probe, guard(b, probe.job_id), lambda r: {})
    assert [(a.rung, a.outcome) for a in envelope.attempts] == [("big", Outcome.OK)]
    assert envelope.attempts[0].reason.startswith("the breaker's probe (breaker open since")
    assert read_breakers(b.client, pool) == []
    log.client.delete(*(keys.history(x.job_id) for x in (other, probe)))


def test_an_open_last_rung_waits_for_its_cool_down_then_probes_and_says_so(
    redis_url: str, pool: str, log: AttemptLog
) -> None:
    clock, b = opened(redis_url, pool, "small")
    clock.now += 10
    made = guard(b, log.job_id, Ladder("lad", "lad", (rung("small", "e"),)))
    envelope = run(log, made, lambda r: {})
    assert [(a.rung, a.outcome) for a in envelope.attempts] == [("small", Outcome.OK)]
    assert made.waited == [20.0]  # what was left of the 30 s cool-down
    reason = envelope.attempts[0].reason
    assert reason.startswith("the breaker's probe (") and "waited 20.0 s for its cool-down" in reason
    assert "no rung below it gives an answer" in reason
    assert read_breakers(b.client, pool) == []  # the probe succeeded: closed


def test_the_wait_is_bounded_and_the_rung_then_runs_anyway(redis_url: str, pool: str, log: AttemptLog) -> None:
    clock = Clock()
    b = worker(redis_url, pool, clock)
    for job in ("j1", "j2", "j3"):
        fail(b, job, clock, "small")
    made = guard(b, log.job_id, Ladder("lad", "lad", (rung("small", "e"),)), max_wait_s=5)
    envelope = run(log, made, lambda r: {})
    assert [(a.rung, a.outcome) for a in envelope.attempts] == [("small", Outcome.OK)]
    assert made.waited == [5.0]
    assert "run anyway, waited 5.0 s for its cool-down: no rung below it gives an answer" in envelope.attempts[0].reason
    assert [s.state for s in read_breakers(b.client, pool)] == ["open"]  # not its probe: still open


def test_memory_pressure_starts_a_new_job_one_rung_lower(redis_url: str, pool: str, log: AttemptLog) -> None:
    b = worker(redis_url, pool, Clock())
    readings = iter(["pool 'bt' is under memory pressure: 180 MiB available", "pool 'bt' ...: 150 MiB available"])
    envelope = run(log, guard(b, log.job_id, pressure=lambda: next(readings)), lambda r: {})
    skipped, ran = envelope.attempts
    assert (skipped.rung, skipped.outcome, ran.rung) == ("big", Outcome.SKIPPED, "small")
    assert skipped.reason == (
        "pool 'bt' is under memory pressure: 180 MiB available; the ladder steps down under pressure (a new "
        "job starts one rung lower)"
    )
    # Without pressure, or for a ladder that does not declare the step-down, the job starts on top.
    calm = AttemptLog(log.client, f"{log.job_id}-2", ttl=60)
    envelope = run(calm, guard(b, calm.job_id, pressure=lambda: None), lambda r: {})
    assert [a.rung for a in envelope.attempts] == ["big"]
    log.client.delete(keys.history(calm.job_id))


def test_the_watchdog_counts_a_kill_once_with_the_settling_delivery(redis_url: str, pool: str, log: AttemptLog) -> None:
    from mediafarm.tasks.runtime.breaker import count_kill

    client = log.client
    # farm-test.toml: breaker_oom opens after 2 failures; kill_once has the test session's breaker (off).
    assert count_kill(client, pool, "farm.test.chaos", {"ladder": "kill_once"}, log.job_id, 1, Outcome.KILLED) == ""
    running = Attempt(0, "heavy", pid=4242, worker="chaos@h")
    log.append(running)
    assert count_kill(client, pool, "farm.test.chaos", {"ladder": "breaker_oom"}, log.job_id, 999, Outcome.KILLED) == ""
    assert count_kill(client, pool, "farm.test.chaos", {"ladder": "breaker_oom"}, log.job_id, 4242,
                      Outcome.KILLED) == "counted"  # fmt: skip
    # The job's next delivery settles the same attempt and counts it again: still one failure.
    settled = Attempt(0, "heavy", Outcome.KILLED, pid=4242, worker="chaos@h", started=running.started)
    b = Breakers(client, pool)
    assert b.failed("breaker_oom", "heavy", BreakerPolicy(failures=2), settled, log.job_id) == "counted"
    assert read_breakers(client, pool) == []
    assert count_kill(client, pool, "celery.backend_cleanup", {}, log.job_id, 4242, Outcome.KILLED) == ""


def test_a_probe_whose_job_had_succeeded_elsewhere_still_closes_it(redis_url: str, pool: str, log: AttemptLog) -> None:
    # A duplicate delivery of a job that had already succeeded claims the probe; the rung runs
    # well, but the attempt writes nothing (StaleAttempt). The rung did succeed: the breaker
    # closes, rather than every job of the pool skipping it until the claim lapses (hard limit + 60 s).
    import json

    from mediafarm.tasks.wire.errors import StaleAttempt

    clock = Clock()
    b = worker(redis_url, pool, clock)
    for job in ("j1", "j2", "j3"):
        fail(b, job, clock)
    clock.now += 30
    result_key = f"celery-task-meta-{log.job_id}"
    log.client.set(result_key, json.dumps({"status": "SUCCESS"}), ex=60)
    job = LadderRun(log.job_id, LADDER, ENGINES, log, worker="bt@a", fresh=True, result_key=result_key,
                    policies=(Availability(), Breaker(guard(b, log.job_id))))  # fmt: skip
    with pytest.raises(StaleAttempt):
        run_ladder(job, lambda rung_, index, attempt: ({}, ()))
    assert read_breakers(b.client, pool) == []
    log.client.delete(result_key)
