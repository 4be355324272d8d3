"""A real worker's /metrics, scraped and parsed as Prometheus does: jobs, attempts, downgrades,
kills, queue wait and depth, breakers, counted in the main process from every child's jobs."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mediafarm.tasks.app import app
from mediafarm.tasks.producer.client import JobHandle
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.errors import JobRejected

pytestmark = pytest.mark.integration
QUEUE = "metrics-test"  # its own queue: no other worker of the session takes these jobs


@pytest.fixture(scope="module")
def metered_worker(start_worker):
    from mediafarm.workers.embedded import free_port

    port = free_port()
    worker = start_worker("chaos", concurrency=2, queues=[QUEUE], env={"FARM_METRICS_PORT": str(port)})
    worker.metrics_url = f"http://127.0.0.1:{port}/metrics"
    return worker


def submit(family: str, *, queue: str, **fields: object) -> JobHandle:
    """Sent as a plain Celery client would (what is counted is the worker's, whoever sent the job)."""
    sent = app.send_task("farm.test.chaos", kwargs=fields, queue=queue)
    return JobHandle(id=sent.id, family=family)


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the exposition, parsed by prometheus_client's own parser."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def moved_by(before: dict, after: dict, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def eventually(url: str, check: Callable[[dict], bool], timeout: float = 30.0) -> dict:
    """The first scrape that passes ``check`` (the main process counts an ended job on a thread)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(url)
        if check(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


def test_a_kill_and_its_downgrade_move_their_counters(metered_worker) -> None:
    url = metered_worker.metrics_url
    before = scrape(url)
    job = submit("chaos", ladder="kill_once", queue=QUEUE)
    envelope = job.wait(timeout=60)
    assert [a["outcome"] for a in envelope["attempts"]] == ["killed", "ok"]
    downgrade = {"family": "chaos", "from_rung": "hungry", "to_rung": "frugal", "from_variant": "hungry",
                 "to_variant": "frugal", "reason": "killed"}  # fmt: skip
    ended = {"family": "chaos", "rung": "frugal", "variant": "frugal", "outcome": "ok"}
    after = eventually(url, lambda s: moved_by(before, s, "mediafarm_jobs_total", **ended) >= 1)

    def moved(name: str, **labels: str) -> float:
        return moved_by(before, after, name, **labels)

    assert moved("mediafarm_child_kills_total", pool="chaos", reason="killed") == 1
    assert moved("mediafarm_downgrades_total", **downgrade) == 1
    assert moved("mediafarm_jobs_total", **ended) == 1
    assert moved("mediafarm_attempts_total", family="chaos", rung="hungry", variant="hungry", outcome="killed") == 1
    assert moved("mediafarm_attempts_total", family="chaos", rung="frugal", variant="frugal", outcome="ok") == 1
    # Two deliveries (the submit, the retry after the kill), each waited in the queue.
    assert moved("mediafarm_queue_wait_seconds_count", family="chaos") == 2
    killed = {"family": "chaos", "rung": "hungry", "variant": "hungry", "outcome": "killed"}
    assert moved("mediafarm_attempt_seconds_count", **killed) == 1
    assert moved("mediafarm_attempt_peak_rss_bytes_count", family="chaos", rung="hungry", variant="hungry") == 1
    assert value(after, "mediafarm_queue_depth", queue=QUEUE) == 0
    assert ("mediafarm_child_rss_max_bytes", frozenset({("pool", "chaos")})) in after


def test_jobs_in_two_children_are_both_counted_once(metered_worker) -> None:
    url = metered_worker.metrics_url
    ok = {"family": "chaos", "rung": "a", "variant": "a", "outcome": "ok"}
    rejected = {"family": "chaos", "rung": "strict", "variant": "strict", "outcome": "rejected"}
    before = scrape(url)
    # Both sleep at once (3 s: long enough that a loaded machine delivers the second before the
    # first ends): the worker's two children take one each.
    jobs = [submit("chaos", ladder="steady", plan={"sleep": 3.0}, queue=QUEUE) for _ in range(2)]
    bad = submit("chaos", ladder="bad", queue=QUEUE)
    envelopes = [job.wait(timeout=60) for job in jobs]
    with pytest.raises(JobRejected):
        bad.wait(timeout=30)
    assert len({e["output"]["pid"] for e in envelopes}) == 2, "the two jobs ran in one child"
    after = eventually(url, lambda s: moved_by(before, s, "mediafarm_jobs_total", **ok) >= 2
                       and moved_by(before, s, "mediafarm_jobs_total", **rejected) >= 1)  # fmt: skip
    assert moved_by(before, after, "mediafarm_jobs_total", **ok) == 2
    assert moved_by(before, after, "mediafarm_jobs_total", **rejected) == 1
    # Counted once in the farm: a second end of the same job (a redelivery) adds nothing.
    assert app.backend.client.exists(keys.metered(jobs[0].id))


def test_a_refusal_moves_its_counter(metered_worker, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real refusal: the family's depth limit 1 (every depth read fresh), one job already waiting
    # on a queue no worker takes, so the next submit there is refused with Overloaded.
    from mediafarm.config.admission import parse
    from mediafarm.tasks.producer import admission
    from mediafarm.tasks.producer.client import submit as farm_submit
    from mediafarm.tasks.wire.errors import Overloaded

    url = metered_worker.metrics_url
    refused = {"family": "chaos", "reason": "depth"}
    parked = f"metrics-parked-{time.monotonic_ns()}"
    settings = parse({"depth_cache": 0, "families": {"chaos": {"max_queued": 1}}})
    monkeypatch.setattr(admission, "get_admission", lambda: settings)
    before = scrape(url)
    try:
        farm_submit("chaos", queue=parked)
        with pytest.raises(Overloaded):
            farm_submit("chaos", queue=parked)
    finally:
        app.backend.client.delete(parked)
    assert moved_by(before, scrape(url), "mediafarm_admission_refusals_total", **refused) == 1


def test_a_breaker_opening_shows_in_the_scrape(metered_worker) -> None:
    # A real breaker, opened as a worker opens it (tasks.runtime.breaker: three resource failures of the
    # rung within the window), not its JSON written by hand.
    from mediafarm.config.ladder_policy import BreakerPolicy
    from mediafarm.tasks.runtime.breaker import Breakers
    from mediafarm.tasks.wire.records import Attempt, Outcome

    client = app.backend.client
    url = metered_worker.metrics_url
    labels = {"pool": "chaos", "ladder": "kill_once", "rung": "hungry"}
    assert value(scrape(url), "mediafarm_breaker_state", **labels, state="open") == 0
    breakers, policy = Breakers(client, "chaos"), BreakerPolicy(failures=3, window_s=60.0, cooldown_s=30.0)
    try:
        done = [breakers.failed("kill_once", "hungry", policy, Attempt(0, "hungry", Outcome.KILLED, started=time.time()),
                                f"metrics-breaker-{i}") for i in range(3)]  # fmt: skip
        assert done == ["counted", "counted", "opened"]
        samples = scrape(url)
        assert value(samples, "mediafarm_breaker_state", **labels, state="open") == 1
        assert value(samples, "mediafarm_breaker_openings", **labels) == 1
    finally:
        client.delete(keys.breaker_failures("chaos", "kill_once", "hungry"))
        client.hdel(keys.breakers("chaos"), "kill_once/hungry")
    assert value(scrape(url), "mediafarm_breaker_state", **labels, state="open") == 0