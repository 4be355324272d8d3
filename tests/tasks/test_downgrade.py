"""The downgrade policy as plain functions: how an unfinished attempt is judged, which rung is next."""

from mediafarm.tasks.runtime.downgrade import current_rung, settle_open_attempts
from mediafarm.tasks.runtime.oom_killer import CHILD_LOST
from mediafarm.tasks.wire.records import Attempt, KillRecord, Outcome


def open_attempt(rung: int = 0, retries: int = 0, pid: int = 100) -> Attempt:
    return Attempt(rung_index=rung, rung=f"v{rung}", retries=retries, pid=pid, worker="cpu@a", started=1000.0)


def kill_record(pid: int, worker: str = "cpu@a", at: float = 1001.0, **extra) -> KillRecord:
    return KillRecord(pid=pid, worker=worker, at=at, reason="watchdog: child RSS 900 MiB passed the cap", **extra)


def test_watchdog_record_names_the_kill() -> None:
    attempts = [open_attempt(pid=42)]
    kill = kill_record(42, rss_mb=900.0)
    assert settle_open_attempts(attempts, kill, retries=1, transient_budget=2) == [0]
    assert (attempts[0].outcome, attempts[0].peak_rss_mb, attempts[0].duration) == ("killed", 900.0, 1.0)
    assert "watchdog" in attempts[0].reason
    assert current_rung(attempts) == 1


def test_kill_record_of_another_child_is_not_taken() -> None:
    # Another pid; the same pid on another worker (containers reuse small pids); an older kill.
    for kill in (kill_record(7), kill_record(42, worker="gpu0@b"), kill_record(42, at=999.0)):
        attempts = [open_attempt(pid=42)]
        settle_open_attempts(attempts, kill, retries=1, transient_budget=2)
        assert (attempts[0].outcome, attempts[0].reason) == ("killed", CHILD_LOST)
    attempts = [open_attempt(pid=42)]
    settle_open_attempts(attempts, kill_record(42, worker="gpu0@b"), retries=0, transient_budget=2)
    assert attempts[0].outcome == "worker_lost"


def test_hard_time_limit_kill_is_a_timeout() -> None:
    attempts = [open_attempt(pid=42)]
    settle_open_attempts(attempts, kill_record(42, outcome="timeout"), retries=1, transient_budget=2)
    assert attempts[0].outcome == "timeout" and current_rung(attempts) == 1


def test_redelivery_without_retry_is_a_worker_loss_on_the_same_rung() -> None:
    attempts = [open_attempt(retries=0)]
    settle_open_attempts(attempts, None, retries=0, transient_budget=2)
    assert attempts[0].outcome == "worker_lost"
    assert current_rung(attempts) == 0


def test_repeated_worker_loss_becomes_a_resource_failure() -> None:
    attempts = [Attempt(0, "v0", Outcome.WORKER_LOST), Attempt(0, "v0", Outcome.WORKER_LOST), open_attempt()]
    settle_open_attempts(attempts, None, retries=0, transient_budget=2)
    assert attempts[2].outcome == "killed" and "died 3 times" in attempts[2].reason
    assert current_rung(attempts) == 1


def test_finished_attempts_are_left_alone_and_counted() -> None:
    attempts = [Attempt(0, "v0", Outcome.OOM), Attempt(1, "v1", Outcome.UNAVAILABLE), Attempt(2, "v2", Outcome.TRANSIENT)]
    assert settle_open_attempts(attempts, kill_record(attempts[0].pid), retries=3, transient_budget=2) == []
    assert current_rung(attempts) == 2


def test_an_attempt_whose_delivery_retried_on_a_redis_error_is_transient_not_a_lost_child() -> None:
    # Found in a RabbitMQ chaos run: the attempt of delivery 0 could not write its outcome (Redis
    # was restarting), its delivery sent the retry itself; retries moved on all the same.
    attempts = [open_attempt(retries=0)]
    unwritten = {0: "Redis error: Error 111 connecting to 127.0.0.1:6390. Connection refused."}
    assert settle_open_attempts(attempts, None, retries=1, transient_budget=2, unwritten=unwritten) == [0]
    assert attempts[0].outcome == "transient" and current_rung(attempts) == 0
    assert attempts[0].reason.startswith("Redis error: Error 111") and "not written" in attempts[0].reason
    # Without that word from the delivery, the same evidence is a lost child: one rung down.
    attempts = [open_attempt(retries=0)]
    settle_open_attempts(attempts, None, retries=1, transient_budget=2)
    assert (attempts[0].outcome, attempts[0].reason) == ("killed", CHILD_LOST) and current_rung(attempts) == 1


def test_the_redis_error_word_is_about_its_own_delivery_only() -> None:
    # Delivery 0 retried on a Redis error (its attempt was settled since); delivery 1's child was
    # then lost: the header, carried on by every later retry, must not excuse delivery 1's attempt.
    attempts = [Attempt(0, "v0", Outcome.TRANSIENT, retries=0), open_attempt(retries=1, pid=43)]
    settle_open_attempts(attempts, None, retries=2, transient_budget=2, unwritten={0: "Redis error: x"})
    assert attempts[1].outcome == "killed" and current_rung(attempts) == 1
    # A watchdog record for that child still names the kill.
    attempts = [open_attempt(retries=1, pid=43)]
    settle_open_attempts(attempts, kill_record(43), retries=2, transient_budget=2, unwritten={0: "Redis error: x"})
    assert attempts[0].outcome == "killed" and "watchdog" in attempts[0].reason
