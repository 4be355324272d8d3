"""The attribution table (``tasks.runtime.attribution``): which failed attempts count against their rung's
breaker, as judged where each outcome is decided, and what the record and the tally keep of it."""

from __future__ import annotations

from typing import Any

import pytest

from mediafarm.tasks.runtime import attribution, failure_tally
from mediafarm.tasks.runtime.breaker import read_breakers
from mediafarm.tasks.runtime.downgrade import LadderRun, RetryRequest, run_ladder, settle_open_attempts
from mediafarm.tasks.runtime.oom_killer import CHILD_LOST, snapshot
from mediafarm.tasks.runtime.rung_policies import Availability, Breaker
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.tasks.wire.records import Attempt, KillRecord, Outcome
from tests.tasks.test_breaker import ENGINES, LADDER, Clock, guard, pool, worker  # noqa: F401 - pool: a fixture


def open_attempt(pid: int = 42, **extra: Any) -> Attempt:
    return Attempt(0, "big", retries=0, pid=pid, worker="cpu@a", started=1000.0, **extra)


def settled(attempt: Attempt, kill: KillRecord | None = None, retries: int = 1, before: list[Attempt] | None = None):
    attempts = [*(before or []), attempt]
    settle_open_attempts(attempts, kill, retries=retries, transient_budget=2)
    return attempt.outcome, attempt.counted, attempt.cause


def test_the_watchdogs_own_kills_count() -> None:
    cap = KillRecord(pid=42, worker="cpu@a", at=1001.0, reason="watchdog: child RSS 900 MiB passed the cap")
    assert settled(open_attempt(), cap) == (Outcome.KILLED, True, "watchdog_cap")
    limit = KillRecord(pid=42, worker="cpu@a", at=1001.0, outcome=Outcome.TIMEOUT, reason="past the hard limit")
    assert settled(open_attempt(), limit) == (Outcome.TIMEOUT, True, "hard_time_limit")


def test_a_kernel_oom_kill_the_counters_attribute_counts_an_outside_or_unknown_kill_does_not() -> None:
    counts = snapshot()
    if counts is None:
        pytest.skip("this machine exposes no OOM-kill count (/proc/vmstat, memory cgroup)")
    field = "cgroup_kills" if "cgroup_kills" in counts else "host_kills"
    # The count as it stood one OOM kill ago: the kernel counted one while the attempt ran.
    assert settled(open_attempt(oom_counts={**counts, field: counts[field] - 1})) == (Outcome.OOM, True, "kernel_oom")
    assert settled(open_attempt(oom_counts=counts)) == (Outcome.KILLED, False, "outside_kill")
    assert settled(open_attempt(oom_counts=None)) == (Outcome.KILLED, False, "unknown_kill")
    assert settled(open_attempt(oom_counts={**counts, "boot": "another"})) == (Outcome.KILLED, False, "unknown_kill")


def test_a_dead_or_paused_worker_never_counts() -> None:
    assert settled(open_attempt(), retries=0) == (Outcome.WORKER_LOST, False, "worker_lost")
    lost = [Attempt(0, "big", Outcome.WORKER_LOST), Attempt(0, "big", Outcome.WORKER_LOST)]
    assert settled(open_attempt(), retries=0, before=lost) == (Outcome.KILLED, False, "worker_died")


def test_a_drained_attempt_is_lost_by_choice_not_a_dying_worker() -> None:
    # The drain's record (workers.drain), written before it ended the child: the same rung again.
    record = KillRecord(pid=42, worker="cpu@a", at=1300.0, outcome=Outcome.WORKER_LOST, reason="handed back by the drain")
    attempt = open_attempt()
    assert settled(attempt, record, retries=0) == (Outcome.WORKER_LOST, False, "drained")
    assert attempt.reason == "handed back by the drain" and attempt.duration == 300.0
    # Drained twice, then its worker dies: still the first real loss, not past the budget of two.
    drained = [Attempt(0, "big", Outcome.WORKER_LOST, cause="drained") for _ in range(2)]
    assert settled(open_attempt(), retries=0, before=drained) == (Outcome.WORKER_LOST, False, "worker_lost")


@pytest.mark.parametrize(
    ("raised", "outcome", "cause"),
    [
        (MemoryError("64 GiB"), Outcome.OOM, "out_of_memory"),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), Outcome.CUDA_OOM, "cuda_oom"),
    ],
)
def test_what_the_engine_raises_counts(log: AttemptLog, raised: Exception, outcome: Outcome, cause: str) -> None:
    def engine(rung_: Any, index: int, attempt: int) -> Any:
        raise raised

    assert isinstance(run_ladder(LadderRun(log.job_id, LADDER, ENGINES, log, fresh=True), engine), RetryRequest)
    record = log.read()[0][0]
    assert (record.outcome, record.counted, record.cause) == (outcome, True, cause)


def test_records_say_whether_they_counted_and_old_ones_still_read() -> None:
    judged = Attempt(0, "big", Outcome.KILLED, "SIGKILLed from outside: ...")
    attribution.judge(judged, "outside_kill")
    data = judged.to_json()
    assert (data["counted"], data["cause"]) == (False, "outside_kill")
    assert Attempt.from_json(data) == judged
    words = "not counted against the rung: SIGKILLed from outside the farm: not the rung's doing"
    assert attribution.words(judged) == words
    assert "counted" not in Attempt(0, "big", Outcome.OK).to_json()  # nothing to judge: the record as before
    # Written before the table: judged from outcome and reason.
    old = {"rung": 0, "variant": "big", "outcome": "killed", "reason": "watchdog: child RSS 900 MiB passed the cap"}
    assert attribution.counts(Attempt.from_json(old))
    assert not attribution.counts(Attempt.from_json({**old, "reason": "SIGKILLed from outside: not by the watchdog"}))
    assert not attribution.counts(Attempt.from_json({**old, "reason": CHILD_LOST}))
    assert not attribution.counts(Attempt.from_json({**old, "outcome": "worker_lost"}))


def test_outside_kills_never_open_the_breaker_the_watchdogs_do_and_both_are_tallied(
    redis_url: str, pool: str, log: AttemptLog
) -> None:
    b = worker(redis_url, pool, Clock())
    made = guard(b, log.job_id)
    for i in range(5):
        outside = Attempt(0, "big", Outcome.KILLED, "SIGKILLed from outside", started=float(i))
        attribution.judge(outside, "outside_kill")
        made.ended(outside)
    assert read_breakers(b.client, pool) == []
    for i in range(3):
        cap = Attempt(0, "big", Outcome.KILLED, "watchdog: over the cap", started=float(10 + i))
        attribution.judge(cap, "watchdog_cap")
        made.ended(cap)
    assert [(s.rung, s.state, s.failures) for s in read_breakers(b.client, pool)] == [("big", "open", 3)]
    tallies = [(t.rung, t.cause, t.counted, t.count) for t in failure_tally.read(b.client, pool)]
    assert tallies == [("big", "watchdog_cap", True, 3), ("big", "outside_kill", False, 5)]
    b.client.delete(keys.rung_failures(pool))


def test_a_failure_of_an_attempt_settled_elsewhere_never_counts(redis_url: str, pool: str, log: AttemptLog) -> None:
    # A worker paused past the visibility timeout wakes, its soft time limit fires at once (it
    # measured the pause), and the job already went on elsewhere: StaleAttempt, and no count.
    import json

    from mediafarm.tasks.wire.errors import StaleAttempt

    b = worker(redis_url, pool, Clock())
    result_key = f"celery-task-meta-{log.job_id}"
    log.client.set(result_key, json.dumps({"status": "SUCCESS"}), ex=60)

    def engine(rung_: Any, index: int, attempt: int) -> Any:
        raise MemoryError("woke after the pause")

    job = LadderRun(log.job_id, LADDER, ENGINES, log, fresh=True, result_key=result_key,
                    policies=(Availability(), Breaker(guard(b, log.job_id))))  # fmt: skip
    with pytest.raises(StaleAttempt):
        run_ladder(job, engine)
    assert log.client.zcard(keys.breaker_failures(pool, "lad", "big")) == 0
    tallies = [(t.rung, t.cause, t.counted) for t in failure_tally.read(b.client, pool)]
    assert tallies == [("big", "settled_elsewhere", False)]
    log.client.delete(result_key, keys.rung_failures(pool))
