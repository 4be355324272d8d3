"""The webhook request's checks, the Redis outbox's steps and the dispatcher's tries, on a Redis
database of their own (no worker's dispatcher reads it) and a real HTTP receiver."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
import redis
from standardwebhooks import Webhook

from mediafarm.config.settings import FarmSettings
from mediafarm.tasks.producer.webhooks import JobEvents, Outbox, checked
from mediafarm.tasks.producer.webhooks import Webhook as JobWebhook
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.errors import InvalidRequest
from mediafarm.workers.webhook_dispatch import Dispatcher, signature
from tests.support.webhooks import NEW_SECRET, OLD_SECRET, Receiver


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    own = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/7")
    own.flushdb()  # database 7 is this module's alone
    yield own
    own.flushdb()


def test_checked_takes_http_urls_with_a_public_or_allowed_host() -> None:
    assert checked(None, None) is None
    assert checked("https://hooks.example.com/x", None) == JobWebhook("https://hooks.example.com/x", ("completed",))
    assert checked("http://8.8.8.8/x", "completed, start").events == ("start", "completed")  # the farm's order
    assert checked("http://10.1.2.3/x", None, allow=["10.0.0.0/8"]) is not None
    assert checked("http://hooks.internal/x", None, allow=["hooks.internal"]) is not None
    for url, words in [("ftp://x.example/", "http or https"), ("http://", "names no host"),
                       ("http://x.example:port/", "not a URL"), ("http://[fe80::1]/", "link-local"),
                       ("http://127.0.0.1:9/", "loopback"), ("http://localhost/", "loopback"),
                       ("http://172.16.0.1/", "private"), ("http://0.0.0.0/", "unspecified"),
                       ("https://x.example/" + "a" * 2000, "at most 2000")]:  # fmt: skip
        with pytest.raises(InvalidRequest, match=words):
            checked(url, None)
    with pytest.raises(InvalidRequest, match="unknown done"):
        checked("https://x.example/", ["done"])
    with pytest.raises(InvalidRequest, match="at least one"):
        checked("https://x.example/", [])
    with pytest.raises(InvalidRequest, match="without a webhook URL"):
        checked(None, ["start"])


def test_the_signature_verifies_with_either_secret_of_a_rotation() -> None:
    now = int(time.time())
    header = signature([OLD_SECRET, NEW_SECRET], "msg_1", now, '{"a":1}')
    assert [part.split(",")[0] for part in header.split(" ")] == ["v1", "v1"]
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(now), "webhook-signature": header}
    for secret in (OLD_SECRET, NEW_SECRET):
        assert Webhook(secret).verify('{"a":1}', headers) == {"a": 1}
    assert Webhook(OLD_SECRET).sign("msg_1", datetime.fromtimestamp(now, tz=timezone.utc), '{"a":1}') in header
    with pytest.raises(Exception, match="No matching signature"):
        Webhook(NEW_SECRET).verify('{"a":2}', headers)  # another body


def test_the_outbox_keeps_each_event_once_in_order_and_leases_a_job_to_one_dispatcher(client) -> None:
    outbox = Outbox(client)
    events = JobEvents(client, "job-a", "toy", JobWebhook("https://x.example/", ("start", "progress", "completed")),
                       progress_s=0.0)  # fmt: skip
    events.attempt_began("stream")
    events.attempt_began("stream")  # a later attempt: the same start, not put again
    events.progress({"fraction": 0.1})
    events.progress({"fraction": 0.2})  # behind the in-flight start: replaces the waiting progress
    events.completed("SUCCESS", {"variant": "stream", "artifacts": [{"name": "w.txt"}], "attempts": [{}]})
    pending = outbox.pending("job-a")
    assert [e["type"] for e in pending] == ["job.start", "job.progress", "job.completed"]
    assert json.loads(pending[1]["body"])["data"]["progress"] == {"fraction": 0.2}
    done = json.loads(pending[2]["body"])["data"]
    assert done["links"]["artifacts"] == {"w.txt": "/v1/jobs/job-a/artifacts/w.txt"} and done["rung"] == "stream"
    job, head = outbox.claim(60)
    assert (job, head["type"]) == ("job-a", "job.start")
    assert outbox.claim(60) is None  # leased: no second dispatcher takes it meanwhile
    assert outbox.settle(job, {**head, "tries": 1}, "retry", {"try": 1}, retry_in=0.0)
    assert not outbox.settle(job, {**head, "id": "msg_other"}, "delivered", {})  # not its oldest: nothing written
    job, again = outbox.claim(60)
    assert again["id"] == head["id"] and again["tries"] == 1
    assert outbox.settle(job, again, "gone", {"try": 2})
    assert outbox.pending("job-a") == [] and client.zscore(keys.webhook_due(), "job-a") is None
    assert [t["try"] for t in outbox.tries("job-a")] == [1, 2]


def test_the_dispatcher_tries_until_the_schedule_ends_and_refuses_a_name_that_resolves_to_loopback(client) -> None:
    settings = FarmSettings(webhook_secret=[NEW_SECRET], webhook_retry_schedule=[0.0, 0.0, 0.0])
    dispatcher = Dispatcher(client, settings)
    assert [dispatcher.delay_after(n, final=True) for n in (1, 2, 3, 4)] == [0.0, 0.0, 0.0, -1.0]
    assert [dispatcher.delay_after(n, final=False) for n in (1, 2, 3)] == [0.0, 0.0, -1.0]
    receiver = Receiver().start()
    receiver.answers = [500] * 10
    try:
        allowed = Dispatcher(client, FarmSettings(webhook_secret=[NEW_SECRET], webhook_allow=["127.0.0.1"],
                                                  webhook_retry_schedule=[0.0, 0.0, 0.0]))  # fmt: skip
        JobEvents(client, "job-b", "toy", JobWebhook(receiver.url, ("completed",))).completed("FAILURE", failure="x")
        while allowed.once():
            pass
        assert [t["status"] for t in receiver.got] == [500] * 4  # one try and three more
        assert [t["result"] for t in Outbox(client).tries("job-b")] == ["retry"] * 3 + ["gave-up"]
        name = receiver.url.replace("127.0.0.1", "localhost")
        JobEvents(client, "job-c", "toy", JobWebhook(name, ("completed",))).completed("SUCCESS", {"variant": "v"})
        assert dispatcher.once()  # FARM_WEBHOOK_ALLOW empty here: localhost resolves to loopback
        (tried,) = Outbox(client).tries("job-c")
        assert tried["result"] == "gave-up" and "loopback" in tried["error"] and len(receiver.got) == 4
    finally:
        receiver.stop()


def test_a_410_drops_the_jobs_pending_events(client) -> None:
    receiver = Receiver().start()
    receiver.answers = [410]
    try:
        dispatcher = Dispatcher(client, FarmSettings(webhook_secret=[NEW_SECRET], webhook_allow=["127.0.0.1"]))
        events = JobEvents(client, "job-d", "toy", JobWebhook(receiver.url, ("start", "completed")))
        events.attempt_began("stream")
        events.completed("SUCCESS", {"variant": "stream"})
        assert dispatcher.once() and not dispatcher.once()  # the 410 took the completed event with it
        assert [g["status"] for g in receiver.got] == [410]
        assert [t["result"] for t in Outbox(client).tries("job-d")] == ["gone"] and Outbox(client).pending("job-d") == []
    finally:
        receiver.stop()
