"""Webhooks asked for over HTTP (``X-Webhook``, ``X-Webhook-Events``), on the job routes and the
OpenAI-style ones: a bad URL is a 422 before anything is sent, a good one is delivered signed
(here by a dispatcher run in this process, beside the real gateway and worker) and its tries are
``GET /v1/jobs/{id}/webhooks``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from mediafarm.config.settings import FarmSettings
from mediafarm.workers import webhook_dispatch
from tests.gateway.conftest import TOKEN
from tests.support.webhooks import NEW_SECRET, Receiver, loopback_allowed  # noqa: F401 - a fixture

pytestmark = pytest.mark.integration


@pytest.fixture()
def dispatcher() -> Iterator[None]:
    """A real dispatcher (``workers.webhook_dispatch``) on a thread here: the session's workers run none."""
    stop = threading.Event()
    settings = FarmSettings(webhook_secret=[NEW_SECRET], webhook_allow=["127.0.0.1"],
                            webhook_retry_schedule=[0.5, 0.5, 0.5])  # fmt: skip
    thread = threading.Thread(target=webhook_dispatch.run, args=(stop, settings), daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(15)


@pytest.mark.parametrize(
    ("url", "words"),
    [("gopher://example.com/", "http or https"), ("https://", "names no host"),
     ("http://192.168.1.10/hook", "private address")],
)  # fmt: skip
def test_a_bad_webhook_is_422_on_the_job_route(client: httpx.Client, url: str, words: str) -> None:
    answer = client.post("/v1/jobs/toy", json={"text": "a b"}, headers={"X-Webhook": url})
    assert answer.status_code == 422 and words in answer.json()["detail"], answer.text
    asked = {"X-Webhook": "https://example.com/hook", "X-Webhook-Events": "start,done"}
    events = client.post("/v1/jobs/toy", json={"text": "a b"}, headers=asked)
    assert events.status_code == 422 and "webhook_events: unknown done" in events.json()["detail"]


def test_a_bad_webhook_is_422_in_openai_shape_on_the_speech_route(cpu_worker, client: httpx.Client) -> None:
    answer = client.post("/v1/audio/speech", json={"model": "tts-1", "voice": "default", "input": "Hi."},
                         headers={"X-Webhook": "http://10.0.0.7/hook"})  # fmt: skip
    assert answer.status_code == 422, answer.text
    assert "private address" in answer.json()["error"]["message"]


def test_a_webhook_asked_for_over_http_is_delivered_and_logged(
    cpu_worker, client: httpx.Client, loopback_allowed: None, dispatcher: None
) -> None:
    receiver = Receiver().start()
    receiver.answers = [503]
    try:
        sent = client.post("/v1/jobs/toy", json={"text": "one two"},
                           headers={"X-Webhook": receiver.url, "X-Webhook-Events": "start,completed"})  # fmt: skip
        assert sent.status_code == 202, sent.text
        job_id = sent.json()["id"]
        got = receiver.wait_for(3)
    finally:
        receiver.stop()
    assert [g["body"]["type"] for g in got] == ["job.start", "job.start", "job.completed"]
    assert [g["status"] for g in got] == [503, 200, 200]
    assert all(g["verified"]["new"] and g["body"]["data"]["id"] == job_id for g in got)
    assert got[-1]["body"]["data"]["state"] == "SUCCESS"
    deadline = time.monotonic() + 10
    while True:
        answer = client.get(f"/v1/jobs/{job_id}/webhooks")
        assert answer.status_code == 200, answer.text
        deliveries = answer.json()
        if len(deliveries["tries"]) == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [(t["type"], t["status"], t["result"]) for t in deliveries["tries"]] == [
        ("job.start", 503, "retry"), ("job.start", 200, "delivered"), ("job.completed", 200, "delivered")]
    assert all(t["latency_s"] is not None for t in deliveries["tries"]) and deliveries["pending"] == []
    assert httpx.get(client.base_url.join(f"/v1/jobs/{job_id}/webhooks")).status_code == 401  # needs the token
