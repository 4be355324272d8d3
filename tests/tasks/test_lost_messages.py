"""The ledger of messages sent (tasks.sent_ledger) and the lost-message sweep (tasks.runtime.lost_messages),
on the session's real Redis: what a publish keeps, what an end removes, and which jobs a look sends
again. The sweep's decisions run on a database of their own (the ledger is one per database)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis

from mediafarm.config.priorities import redis_lists
from mediafarm.tasks.app import app
from mediafarm.tasks.producer import routing
from mediafarm.tasks.producer.client import submit
from mediafarm.tasks.runtime.lost_messages import MOST_RESENDS, LostMessageSweep, ids_in_lists, resend
from mediafarm.tasks.sent_ledger import RESENT_HEADER, SentMessage, messages, remember
from mediafarm.tasks.wire import keys

OWN_DB = 11  # this module's alone


@pytest.fixture()
def own(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + f"/{OWN_DB}")
    client.flushdb()
    yield client
    client.flushdb()


def kombu_message(job_id: str) -> str:
    """A message as kombu keeps it in a list: the task id in its headers."""
    return json.dumps({"body": "", "headers": {"id": job_id, "task": "farm.test.chaos"},
                       "properties": {"correlation_id": job_id, "delivery_tag": str(uuid.uuid4())}})  # fmt: skip


def sent(job_id: str, queue: str, at: float) -> SentMessage:
    return SentMessage("farm.test.chaos", queue, {"id": job_id, "task": "farm.test.chaos"}, {"priority": 0},
                       [[], {"plan": {}}, {}], at)  # fmt: skip


def sweep(interval: float = 10.0) -> LostMessageSweep:
    return LostMessageSweep(interval=interval, horizon=3600, unacked_key="unacked",
                            queues_of=lambda m: (m.queue,), result_key=lambda i: f"celery-task-meta-{i}")  # fmt: skip


def test_a_job_found_nowhere_at_two_looks_an_interval_apart_is_sent_again(own: redis.Redis) -> None:
    remember(own, "lost", sent("lost", "q-a", at=100.0))
    looks = sweep(interval=10)
    out: list[str] = []

    def send(job_id: str, message: SentMessage) -> None:
        out.append(job_id)

    assert looks.run(own, own, send, now=105.0) == []  # younger than the interval: not looked for
    assert looks.run(own, own, send, now=111.0) == []  # nowhere, once: a suspect
    assert own.zscore(keys.sent_suspects(), "lost") == 111.0
    assert looks.run(own, own, send, now=115.0) == []  # nowhere again, but not an interval later
    assert looks.run(own, own, send, now=121.0) == ["lost"] and out == ["lost"]
    assert own.zscore(keys.sent_suspects(), "lost") is None  # taken by the sender


def test_waiting_held_and_ended_jobs_are_never_sent_again(own: redis.Redis) -> None:
    for job_id in ("waiting", "held", "ended"):
        remember(own, job_id, sent(job_id, "q-b", at=100.0))
    own.lpush(redis_lists("q-b")[3], kombu_message("waiting"))  # in a priority list of its queue
    own.hset("unacked", "tag-1", json.dumps([json.loads(kombu_message("held")), "", "q-b"]))  # delivered, unacked
    own.set("celery-task-meta-ended", json.dumps({"status": "SUCCESS", "result": None}))
    looks = sweep(interval=10)
    out: list[str] = []
    for now in (111.0, 121.0, 131.0, 141.0):
        assert looks.run(own, own, lambda job_id, message: out.append(job_id), now=now) == []
    assert out == [] and own.zcard(keys.sent_suspects()) == 0
    assert set(messages(own, ["waiting", "held", "ended"])) == {"waiting", "held"}  # the ended one left the ledger


def test_a_job_seen_again_between_two_looks_is_not_sent(own: redis.Redis) -> None:
    remember(own, "moving", sent("moving", "q-c", at=100.0))
    looks = sweep(interval=10)
    out: list[str] = []
    assert looks.run(own, own, lambda job_id, message: out.append(job_id), now=111.0) == []  # in flight: a suspect
    own.lpush("q-c", kombu_message("moving"))  # restored to its queue meanwhile
    assert looks.run(own, own, lambda job_id, message: out.append(job_id), now=121.0) == []
    assert out == [] and own.zscore(keys.sent_suspects(), "moving") is None


def test_two_sweepers_at_once_send_a_lost_job_once(own: redis.Redis) -> None:
    remember(own, "lost", sent("lost", "q-d", at=100.0))
    first, second = sweep(), sweep()
    out: list[str] = []
    for now in (111.0, 121.0):
        for looks in (first, second):
            looks.run(own, own, lambda job_id, message: out.append(job_id), now=now)
    assert out == ["lost"]


def test_a_job_lost_again_after_its_last_send_again_is_given_up(own: redis.Redis) -> None:
    message = sent("dropped", "q-f", at=100.0)
    message.headers[RESENT_HEADER] = MOST_RESENDS  # a worker took it and dropped it, each time
    remember(own, "dropped", message)
    looks = sweep()
    out: list[str] = []
    for now in (111.0, 121.0):
        looks.run(own, own, lambda job_id, message: out.append(job_id), now=now)
    assert out == [] and messages(own, ["dropped"]) == {}


def test_a_long_list_is_read_whole(own: redis.Redis) -> None:
    own.lpush("q-e", *(kombu_message(f"job-{n}") for n in range(1203)))
    assert ids_in_lists(own, ["q-e"]) == {f"job-{n}" for n in range(1203)}


def test_a_submit_keeps_its_message_and_its_end_removes_it(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"ledger-{uuid.uuid4().hex[:6]}"  # no worker consumes it
    job = submit("chaos", queue=queue, plan={"sleep": 0.1}, priority=7)
    try:
        kept = messages(client, [job.id])[job.id]
        assert (kept.task, kept.queue, kept.headers["id"], kept.body[1]) == (
            "farm.test.chaos", queue, job.id, {"plan": {"sleep": 0.1}},
        )  # fmt: skip
        assert kept.properties["priority"] == json.loads(client.lrange(_list_of(client, queue), 0, -1)[0])[
            "properties"]["priority"]  # fmt: skip
        app.backend.store_result(job.id, ValueError("again"), "RETRY")
        assert messages(client, [job.id])  # a retry is no end
        app.backend.store_result(job.id, ValueError("bad input"), "FAILURE")
        assert messages(client, [job.id]) == {} and client.zscore(keys.sent_times(), job.id) is None
    finally:
        client.delete(*redis_lists(queue))


def test_a_job_sent_again_is_its_message_as_published_marked_and_noted(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"ledger-{uuid.uuid4().hex[:6]}"
    job = submit("chaos", queue=queue, plan={"sleep": 0.1}, priority=7)
    try:
        name = _list_of(client, queue)
        original = json.loads(client.rpop(name))  # what a BRPOP whose reply was lost leaves: nothing
        resend(app, job.id, messages(client, [job.id])[job.id])
        again = json.loads(client.rpop(name))  # the same priority list
        assert again["headers"]["id"] == job.id and again["headers"][RESENT_HEADER] == 1
        assert "sent again by the lost-message sweep" in again["headers"][routing.ROUTE_HEADER]
        assert again["body"] == original["body"] and again["headers"]["task"] == original["headers"]["task"]
        # The send again is kept as the job's last message, counted.
        assert messages(client, [job.id])[job.id].resent == 1
    finally:
        client.delete(*redis_lists(queue))
        client.hdel(keys.sent_messages(), job.id)
        client.zrem(keys.sent_times(), job.id)


def _list_of(client: redis.Redis, queue: str) -> str:
    (name,) = [n for n in redis_lists(queue) if client.llen(n)]
    return name
