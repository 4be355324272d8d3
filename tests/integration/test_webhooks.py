"""Signed webhooks from real workers to a real HTTP receiver on loopback (issue #31, item 1).

The receiver verifies every delivery with the ``standardwebhooks`` library, as a producer's
service would, with each of the two secrets the farm signs with during a rotation. The workers
here are the only ones whose dispatcher runs (the session turns every other worker's off,
tests/conftest.py), and they serve a queue of their own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psutil
import pytest

from mediafarm.tasks.producer.client import submit
from mediafarm.tasks.wire.errors import InvalidRequest
from mediafarm.workers.embedded import free_port
from tests.support.webhooks import NEW_SECRET, OLD_SECRET, Receiver, loopback_allowed  # noqa: F401 - a fixture

pytestmark = pytest.mark.integration

OWN_QUEUE = "chaos-webhooks"
WORKER_ENV = {
    "FARM_WEBHOOK_DISPATCH": "1",
    "FARM_WEBHOOK_SECRET": f"{OLD_SECRET} {NEW_SECRET}",  # mid-rotation: both sign
    "FARM_WEBHOOK_ALLOW": "127.0.0.1",
    "FARM_WEBHOOK_RETRY_SCHEDULE": "0.5,0.5,0.5,0.5,0.5",
    "FARM_WEBHOOK_PROGRESS_S": "0.5",
}


@pytest.fixture(autouse=True)
def _loopback(loopback_allowed: None) -> None:
    """Every test here submits to a loopback receiver."""


@pytest.fixture(scope="module")
def hook_worker(start_worker):
    return start_worker("chaos", concurrency=2, queues=[OWN_QUEUE], env=WORKER_ENV)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def send(receiver: Receiver, events: list[str], **plan: Any):
    return submit("chaos", queue=OWN_QUEUE, plan=plan, webhook=receiver.url, webhook_events=events)


def test_a_receiver_down_while_the_worker_restarts_still_gets_the_event(start_worker, receiver) -> None:
    # First in the module: no other webhook worker is up yet, so the one below is the farm's only dispatcher.
    assert _dispatchers() == []
    worker = start_worker("chaos", concurrency=1, queues=[OWN_QUEUE + "-restart"], env=WORKER_ENV)
    (dispatcher,) = _dispatchers()
    down = Receiver(port=receiver.port)  # the same URL, nobody listening yet
    receiver.stop()
    job = submit("chaos", queue=OWN_QUEUE + "-restart", plan={}, webhook=down.url)
    job.wait(timeout=60)
    deadline = time.monotonic() + 30
    while not _log(job.id) and time.monotonic() < deadline:  # the dispatcher tried and failed
        time.sleep(0.1)
    assert _log(job.id) and _log(job.id)[0]["result"] == "retry"
    _kill(worker.process.pid)  # the worker dies with the event pending; its dispatcher goes with it
    dispatcher.wait(10)  # its pipe from the worker closed: it stopped (psutil raises if not)
    down.start()
    time.sleep(2.0)
    assert down.got == []  # nobody is left to deliver it
    start_worker("chaos", concurrency=1, queues=[OWN_QUEUE + "-other"], env=WORKER_ENV)
    (delivered,) = down.wait_for(1, timeout=60)
    down.stop()
    assert delivered["body"]["data"]["id"] == job.id and delivered["body"]["type"] == "job.completed"
    assert delivered["headers"]["webhook-id"] == f"msg_{job.id}_completed"


def test_start_and_completed_arrive_in_order_signed_with_both_secrets(hook_worker, receiver) -> None:
    job = send(receiver, ["start", "completed"], sleep=0.5)
    envelope = job.wait(timeout=60)
    start, done = receiver.wait_for(2)
    assert [start["body"]["type"], done["body"]["type"]] == ["job.start", "job.completed"]
    assert start["headers"]["webhook-id"] != done["headers"]["webhook-id"]
    for delivery in (start, done):
        assert delivery["verified"] == {"old": True, "new": True}, delivery  # a rotation: both sign
        assert len(delivery["headers"]["webhook-signature"].split(" ")) == 2
        assert delivery["body"]["data"]["id"] == job.id and delivery["body"]["data"]["family"] == "chaos"
    data = done["body"]["data"]
    assert (data["state"], data["rung"]) == ("SUCCESS", envelope["rung"])
    assert data["links"]["job"].endswith(f"/v1/jobs/{job.id}")
    assert "output" not in data and "result" not in data  # thin: links, never the output
    time.sleep(1.0)
    assert len(receiver.got) == 2  # each event once


def test_a_receiver_answering_500_twice_gets_the_same_id_three_times(hook_worker, receiver) -> None:
    receiver.answers = [500, 500]
    job = send(receiver, ["completed"])
    job.wait(timeout=60)
    tries = receiver.wait_for(3)
    assert [t["status"] for t in tries] == [500, 500, 200]
    assert len({t["headers"]["webhook-id"] for t in tries}) == 1
    assert all(t["verified"]["new"] for t in tries)
    time.sleep(1.5)
    assert len(receiver.got) == 3  # delivered: no more tries
    log = _log(job.id)
    assert [(e["status"], e["result"]) for e in log] == [(500, "retry"), (500, "retry"), (200, "delivered")]


def test_every_event_of_a_downgraded_job_in_order(hook_worker, receiver) -> None:
    job = send(receiver, ["start", "attempt", "completed"])
    job_ok = submit("chaos", queue=OWN_QUEUE, ladder="kill_once", webhook=receiver.url,
                    webhook_events=["start", "attempt", "completed"])  # fmt: skip
    job.wait(timeout=60)
    envelope = job_ok.wait(timeout=90)
    got = receiver.wait_for(3 + 4)
    of_killed = [g["body"] for g in got if g["body"]["data"]["id"] == job_ok.id]
    kinds = [(b["type"], b["data"].get("outcome")) for b in of_killed]
    assert kinds == [("job.start", None), ("job.attempt", "killed"), ("job.attempt", "ok"), ("job.completed", None)]
    assert of_killed[-1]["data"]["rung"] == envelope["rung"]
    # Each attempt event names its rung and its place in the ladder.
    assert [(b["data"]["rung"], b["data"]["rung_index"]) for b in of_killed[1:3]] == [("hungry", 0), ("frugal", 1)]


def test_a_receiver_that_never_answers_does_not_slow_the_job(hook_worker) -> None:
    silent = ThreadingHTTPServer(("127.0.0.1", free_port()), BaseHTTPRequestHandler)  # accepts, never answers
    silent.socket.listen(16)
    try:
        url = f"http://127.0.0.1:{silent.server_address[1]}/hook"
        started = time.monotonic()
        jobs = [submit("chaos", queue=OWN_QUEUE, plan={}, webhook=url, webhook_events=["start", "completed"])
                for _ in range(4)]  # fmt: skip
        for job in jobs:
            job.wait(timeout=30)
        assert time.monotonic() - started < 8  # the receiver's 10 s timeout held up none of them
    finally:
        silent.server_close()


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://example.com/hook", "http or https"),
        ("http:///hook", "names no host"),
        ("not a url", "http or https"),
        ("http://10.1.2.3/hook", "private address"),
        ("http://169.254.169.254/latest", "link-local address"),
        ("http://127.0.0.2:8080/hook", "loopback address"),  # the allow-list names 127.0.0.1 alone
        ("http://[::1]/hook", "loopback address"),
    ],
)
def test_a_bad_webhook_url_is_refused_at_submit(url: str, words: str) -> None:
    with pytest.raises(InvalidRequest, match=words):
        submit("chaos", queue=OWN_QUEUE, plan={}, webhook=url)


def test_an_unknown_event_is_refused_at_submit(receiver) -> None:
    with pytest.raises(InvalidRequest, match="unknown finished"):
        submit("chaos", queue=OWN_QUEUE, plan={}, webhook=receiver.url, webhook_events=["finished"])


def _log(job_id: str) -> list[dict[str, Any]]:
    from mediafarm.tasks.app import app
    from mediafarm.tasks.producer.webhooks import Outbox

    return Outbox(app.backend.client).tries(job_id)


def _dispatchers() -> list[psutil.Process]:
    """The webhook dispatchers of the workers this test session started."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if "mediafarm.workers.webhook_dispatch" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue
    return found


def _kill(pid: int) -> None:
    """SIGKILL a worker we started and its pool children (the dispatcher must see its pipe close)."""
    main = psutil.Process(pid)
    pool = []
    for child in main.children():
        try:
            if "webhook_dispatch" not in " ".join(child.cmdline()):
                pool.append(child)
        except psutil.Error:
            continue  # gone, or a zombie its worker had not reaped
    main.kill()
    main.wait(10)
    for child in pool:
        try:
            child.kill()
        except psutil.Error:
            pass


def test_the_cli_submits_with_a_webhook_and_lists_its_deliveries(hook_worker, receiver) -> None:
    import os
    import subprocess
    import sys

    farm = [sys.executable, "-m", "mediafarm.workers.cli"]
    env = {**os.environ, "FARM_WEBHOOK_ALLOW": "127.0.0.1"}
    bad = subprocess.run([*farm, "submit", "chaos", "--queue", OWN_QUEUE, "--webhook", "file:///etc/passwd"],
                         env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "must be an http or https URL" in bad.stdout + bad.stderr
    sent = subprocess.run([*farm, "submit", "chaos", "--queue", OWN_QUEUE, "--webhook", receiver.url,
                           "--webhook-events", "start,completed", "--wait"],
                          env=env, capture_output=True, text=True, timeout=90)  # fmt: skip
    assert sent.returncode == 0, sent.stdout + sent.stderr
    (done,) = [g for g in receiver.wait_for(2) if g["body"]["type"] == "job.completed"]
    job_id = done["body"]["data"]["id"]
    deadline = time.monotonic() + 10
    while len(_log(job_id)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    shown = subprocess.run([*farm, "webhooks", job_id], env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("delivered") == 2 and "job.start" in shown.stdout and "job.completed" in shown.stdout


def test_a_pipelines_webhook_is_its_fan_in_jobs(hook_worker, receiver) -> None:
    import uuid

    from mediafarm.tasks.producer.client import send_plan
    from mediafarm.tasks.wire.plan import Part, Plan

    fan_in = f"hooked-plan-{uuid.uuid4().hex[:8]}"
    plan = Plan(parts=(Part("toy", f"{fan_in}.a", {"text": "a"}, "first"),
                       Part("toy", f"{fan_in}.b", {"text": "b"}, "second")),
                then=Part("toy", fan_in, {"text": "join"}, "join"))  # fmt: skip
    job = send_plan(plan, OWN_QUEUE, webhook=receiver.url, webhook_events=["start", "completed"])
    job.wait(timeout=60)
    got = receiver.wait_for(2)
    assert [(g["body"]["type"], g["body"]["data"]["id"]) for g in got] == [("job.start", fan_in),
                                                                          ("job.completed", fan_in)]
    time.sleep(1.0)
    assert len(receiver.got) == 2  # the parts post nothing


def test_progress_comes_at_most_every_progress_s_and_before_the_end(hook_worker, receiver) -> None:
    from datetime import datetime

    job = submit("toy", queue=OWN_QUEUE, text="one two three four five six seven", word_pause=0.3,
                 webhook=receiver.url, webhook_events=["progress", "completed"])  # fmt: skip
    job.wait(timeout=60)
    receiver.wait_for(3)
    time.sleep(1.0)
    got = [g["body"] for g in receiver.got]
    assert got[-1]["type"] == "job.completed" and {b["type"] for b in got[:-1]} == {"job.progress"}
    fractions = [b["data"]["progress"]["fraction"] for b in got[:-1]]
    assert fractions == sorted(fractions) and 0 < fractions[0] < 1
    stamps = [datetime.fromisoformat(b["timestamp"].replace("Z", "+00:00")).timestamp() for b in got[:-1]]
    assert all(b - a >= 0.45 for a, b in zip(stamps, stamps[1:])), stamps  # FARM_WEBHOOK_PROGRESS_S=0.5


def test_a_job_cancelled_while_it_runs_posts_completed_revoked(hook_worker, receiver) -> None:
    job = submit("toy", queue=OWN_QUEUE, text="a b c d e f g h i j", word_pause=0.5, webhook=receiver.url,
                 webhook_events=["start", "completed"])  # fmt: skip
    (start,) = receiver.wait_for(1)
    job.cancel()
    start, done = receiver.wait_for(2)
    assert (start["body"]["type"], done["body"]["type"]) == ("job.start", "job.completed")
    assert done["body"]["data"]["state"] == "REVOKED" and job.state() == "REVOKED"
