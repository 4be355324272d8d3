"""Stalls as plain functions (issue #29 item 5): a first stall reruns its rung, a second moves the
job down and counts against the rung; the liveness slots a child beats into; the stall timeout an
operator sets. The real worker under a stopped child and a hung engine is tests/integration/test_stall.py."""

from __future__ import annotations

import os
import time

import pytest

from mediafarm.config.file import ConfigFileError
from mediafarm.config.limits import TimeLimits
from mediafarm.tasks.runtime import liveness
from mediafarm.tasks.runtime.downgrade import current_rung, repeated_stall, settle_open_attempts
from mediafarm.tasks.wire.records import Attempt, KillRecord, Outcome
from tests.tasks.test_family import operator_file  # noqa: F401 - a fixture


def attempt(rung: int, outcome: Outcome | None = None, pid: int = 42) -> Attempt:
    return Attempt(rung_index=rung, rung=f"v{rung}", outcome=outcome, pid=pid, worker="cpu@a", started=1000.0)


def test_a_first_stall_keeps_the_rung_and_a_second_moves_the_job_down() -> None:
    stalled = KillRecord(pid=42, worker="cpu@a", at=1004.0, outcome=Outcome.STALLED, reason="watchdog: stalled")
    attempts = [attempt(0)]
    settle_open_attempts(attempts, stalled, retries=1, transient_budget=2)
    assert (attempts[0].outcome, attempts[0].duration) == ("stalled", 4.0)
    assert current_rung(attempts) == 0 and not repeated_stall(attempts, 0)
    attempts.append(attempt(0, Outcome.STALLED))
    assert current_rung(attempts) == 1 and repeated_stall(attempts, 1)
    # A stall of the next rung is that rung's first.
    attempts.append(attempt(1, Outcome.STALLED))
    assert current_rung(attempts) == 1 and not repeated_stall(attempts, 2)


def test_a_stall_between_other_outcomes_of_the_same_rung_still_counts_as_its_second() -> None:
    attempts = [attempt(0, Outcome.STALLED), attempt(0, Outcome.TRANSIENT), attempt(0, Outcome.STALLED)]
    assert current_rung(attempts) == 1 and repeated_stall(attempts, 2)


def test_the_stall_counts_against_the_rung_breaker_only_when_it_repeats() -> None:
    from mediafarm.tasks.runtime.rung_guard import RungGuard

    counted = []

    class Breakers:
        client, pool = None, "cpu"

        def failed(self, ladder, rung, policy, attempt, job_id):
            counted.append((rung, attempt.outcome))
            return "counted"

    guard = RungGuard.__new__(RungGuard)
    guard.breakers, guard.name, guard.job_id, guard.probing = Breakers(), "chaos", "j", set()
    guard.policy = type("P", (), {"breaker": None})()
    import mediafarm.tasks.runtime.failure_tally as tally

    added = []
    original, tally.add = tally.add, lambda *args: added.append(args[-1].cause)
    try:
        attempts = [attempt(0)]
        stalled = KillRecord(pid=42, worker="cpu@a", at=1004.0, outcome=Outcome.STALLED, reason="watchdog: stalled")
        settle_open_attempts(attempts, stalled, retries=1, transient_budget=2)
        assert (attempts[0].counted, attempts[0].cause) == (False, "stalled")
        guard.ended(attempts[0])
        assert counted == []
        attempts.append(attempt(0))
        settle_open_attempts(attempts, stalled, retries=2, transient_budget=2)
        assert (attempts[1].counted, attempts[1].cause) == (True, "stalled_again")
        guard.ended(attempts[1])
        assert counted == [("v0", "stalled")] and added == ["stalled", "stalled_again"]
    finally:
        tally.add = original


def test_a_child_beats_into_its_slot_and_the_main_process_reads_it() -> None:
    liveness.create(4)
    pid = os.fork()
    if pid == 0:  # a pool child with index 2
        liveness.claim(2)
        time.sleep(0.05)
        liveness.beat()
        os._exit(0)
    os.waitpid(pid, 0)
    beats = liveness.last_beats()
    assert set(beats) == {pid} and time.time() - 5 < beats[pid] <= time.time()
    liveness.claim(9)  # past the slots: no slot, and a beat does nothing
    liveness.beat()
    assert set(liveness.last_beats()) == {pid}


def test_the_stall_timeout_has_family_defaults_and_is_checked() -> None:
    from mediafarm.tasks import registry

    stalls = {name: registry.limits_for(spec).stall for name, spec in registry.load().items()}
    assert stalls["vad"] == 120 and stalls["subtitle"] == 300 and stalls["subtitle-live"] == 660
    with pytest.raises(ConfigFileError, match="stall timeout must be > 0"):
        TimeLimits(soft=1, hard=2, stall=0)


def test_an_operator_sets_only_the_stall_timeout(operator_file) -> None:
    from mediafarm.tasks import registry

    operator_file("[limits.vad]\nstall = 45\n")
    limits = registry.limits_for(registry.load()["vad"])
    assert (limits.soft, limits.hard, limits.stall) == (1800, 1900, 45)
    operator_file("[limits.vad]\nstal = 45\n")
    with pytest.raises(ConfigFileError, match=r"\[limits.vad\] takes integer soft, hard, stall"):
        registry.limits_for(registry.load()["vad"])
    operator_file("[limits.vad]\nstall = 0\n")
    with pytest.raises(ConfigFileError, match=r"\[limits.vad\]: the stall timeout must be > 0"):
        registry.limits_for(registry.load()["vad"])
