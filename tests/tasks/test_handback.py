"""The handback's guarded writes (``tasks.runtime.handback``) against the session's real Redis and kombu's
own Redis transport: a message taken and left unacked by a real kombu consumer, as a dead worker
leaves it. The whole handback, on real workers killed and paused: tests/integration/test_handback.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection

from mediafarm.config.settings import FarmSettings
from mediafarm.tasks.runtime import handback
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.tasks.wire.records import Attempt, Outcome

DEAD = "cpu-dead@host"


def result_key(job_id: str) -> bytes:
    return f"celery-task-meta-{job_id}".encode()


@pytest.fixture()
def held(redis_url: str) -> Iterator[dict[str, Any]]:
    """A job whose newest attempt is open on DEAD, its message delivered and unacked."""
    client = redis.Redis.from_url(redis_url)
    job_id, queue = f"handback-{uuid.uuid4()}", f"handback-q-{uuid.uuid4().hex[:6]}"
    log = AttemptLog(client, job_id, ttl=60)
    with Connection(redis_url) as connection:
        consumer = connection.SimpleQueue(queue)
        consumer.put({"fields": {}}, headers={"id": job_id, "retries": 0})
        message = consumer.get(timeout=5)  # delivered, never acked: what a dead worker leaves
        assert client.hexists("unacked", message.delivery_tag)
        yield {"client": client, "log": log, "job_id": job_id, "queue": queue, "message": message,
               "channel": connection.default_channel}  # fmt: skip
        consumer.close()
    client.delete(keys.history(job_id), result_key(job_id), queue)
    client.hdel("unacked", message.delivery_tag)
    client.zrem("unacked_index", message.delivery_tag)


def open_attempt(log: AttemptLog, worker: str = DEAD, retries: int = 0, outcome: Outcome | None = None) -> Attempt:
    attempt = Attempt(0, "ok", outcome, retries=retries, worker=worker, pid=4242)
    log.append(attempt)
    return attempt


def hand_back(held: dict[str, Any], dead: dict[str, float] | None = None, budget: int = 2) -> list[str]:
    worker = handback.Handback(held["client"], held["channel"], result_key, 60, budget)
    return worker.run({DEAD: 40.0} if dead is None else dead)


def queued(held: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in held["client"].lrange(held["queue"], 0, -1)]


def test_a_dead_worker_s_job_goes_back_once_under_a_new_tag(held) -> None:
    open_attempt(held["log"])
    assert hand_back(held) == [held["job_id"]]
    assert hand_back(held) == []  # a second worker looking too finds nothing to take
    (copy,) = queued(held)
    old_tag = held["message"].delivery_tag
    assert copy["properties"]["delivery_tag"] != old_tag
    assert copy["headers"]["redelivered"] is True and copy["properties"]["delivery_info"]["redelivered"] is True
    assert copy["headers"]["id"] == held["job_id"]
    assert not held["client"].hexists("unacked", old_tag) and held["client"].zscore("unacked_index", old_tag) is None
    # The dead worker's own restore (kombu, by its old tag) and its late ack find nothing now.
    held["channel"].qos.restore_by_tag(old_tag)
    held["message"].ack()
    assert len(queued(held)) == 1
    (attempt,), _ = held["log"].read()
    assert attempt.outcome == Outcome.WORKER_LOST
    assert attempt.reason == f"handed back: its worker {DEAD} was silent 40 s"
    assert (attempt.counted, attempt.cause) == (False, "worker_lost")


@pytest.mark.parametrize(
    "case", ["owner alive", "attempt ended", "message of another retry", "no attempt", "success stored",
             "delivered after the attempt began"],
)
def test_nothing_is_taken_from_a_job_not_held_by_a_silent_worker(held, case: str) -> None:
    if case == "owner alive":
        open_attempt(held["log"], worker="cpu-alive@host")
    elif case == "attempt ended":
        open_attempt(held["log"], outcome=Outcome.OK)
    elif case == "message of another retry":
        open_attempt(held["log"], retries=1)
    elif case == "success stored":
        open_attempt(held["log"])
        held["client"].set(result_key(held["job_id"]), json.dumps({"status": "SUCCESS"}))
    elif case == "delivered after the attempt began":
        # The visibility sweep put it back and a live worker holds it, not started yet.
        attempt = open_attempt(held["log"])
        held["client"].zadd("unacked_index", {held["message"].delivery_tag: attempt.started + 5})
    assert hand_back(held) == []
    assert queued(held) == [] and held["client"].hexists("unacked", held["message"].delivery_tag)
    attempts, _ = held["log"].read()
    assert all(a.outcome != Outcome.WORKER_LOST for a in attempts)  # nor is its attempt settled


def test_a_job_that_keeps_killing_its_worker_moves_down_after_the_budget(held) -> None:
    for _ in range(2):
        open_attempt(held["log"], outcome=Outcome.WORKER_LOST)
    open_attempt(held["log"])
    assert hand_back(held, budget=2) == [held["job_id"]]
    attempts, _ = held["log"].read()
    assert attempts[-1].outcome == Outcome.KILLED and attempts[-1].outcome.moves_down
    assert "its worker died 3 times" in attempts[-1].reason and "handed back" in attempts[-1].reason


def test_beats_use_the_server_s_clock_and_silence_is_past_the_grace(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    me, peer = f"me-{uuid.uuid4().hex[:6]}@h", f"peer-{uuid.uuid4().hex[:6]}@h"
    try:
        now, beats = handback.beat(client, peer)
        assert beats[peer] == pytest.approx(now)
        client.hset(keys.heartbeats(), peer, now - 31)  # as if its last beat was 31 s ago
        now, beats = handback.beat(client, me)
        # The session's Redis also holds the beats of workers other tests started and stopped.
        beats = {node: beat for node, beat in beats.items() if node in (me, peer)}
        assert handback.silent(now, beats, 30.0, me) == {peer: pytest.approx(31, abs=1)}
        assert peer not in handback.silent(now, beats, 40.0, me) and me not in handback.silent(now, beats, 0.0, me)
        client.hset(keys.heartbeats(), peer, now - handback.FORGET_AFTER_S - 1)
        _, beats = handback.beat(client, "")
        assert peer not in beats and not client.hexists(keys.heartbeats(), peer)  # forgotten
    finally:
        client.hdel(keys.heartbeats(), me, peer)


def test_the_grace_is_off_or_well_above_the_heartbeat() -> None:
    assert FarmSettings(handback_grace=0).handback_grace == 0
    assert FarmSettings().handback_grace == 30
    with pytest.raises(ValueError, match="FARM_HANDBACK_GRACE must be 0"):
        FarmSettings(handback_grace=2)


def test_a_worker_restarted_under_its_own_name_takes_back_only_its_predecessor_s_jobs(held) -> None:
    """A container's restart policy brings a SIGKILLed worker back under the same node name: no
    peer sees that name silent, so the new process hands back what its predecessor left open."""
    attempt = open_attempt(held["log"])
    worker = handback.Handback(held["client"], held["channel"], result_key, 60, 2)
    # An attempt the new process began itself (after it started) is its own, not handed back.
    assert worker.run({DEAD: 5.0}, started_before=attempt.started) == []
    assert queued(held) == []
    assert worker.run({DEAD: 5.0}, started_before=attempt.started + 1) == [held["job_id"]]
    (copy,) = queued(held)
    assert copy["headers"]["id"] == held["job_id"]


def test_a_predecessor_is_a_name_whose_beat_nobody_renews(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    node = f"cpu-{uuid.uuid4().hex[:6]}@h"
    try:
        assert handback.last_beat(client, node) is None  # never beat, or stopped cleanly: none
        assert handback.predecessor(client, node, None) is None
        now, _ = handback.beat(client, "")
        client.hset(keys.heartbeats(), node, now - 12)  # died 12 s ago, its field left
        before = handback.last_beat(client, node)
        assert handback.predecessor(client, node, before) == pytest.approx(12, abs=1)
        handback.beat(client, node)  # a live process of the same name beat meanwhile
        assert handback.predecessor(client, node, before) is None
    finally:
        client.hdel(keys.heartbeats(), node)
