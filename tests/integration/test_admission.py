"""Admission control and priorities on a real Redis with a real prefork worker (issue 15 items 1 and 3).

One chaos worker with one child serves this module's queues; a blocker job keeps its child busy
while jobs queue up behind it, the way a farm under load looks.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from mediafarm import Overloaded, submit
from mediafarm.config.admission import parse
from mediafarm.config.priorities import redis_lists
from mediafarm.tasks.producer import admission
from mediafarm.tasks.producer.admission import Reading, publish_reading
from mediafarm.tasks.wire import keys
from tests.conftest import REPO

DEPTH_QUEUE = f"admission-depth-{uuid.uuid4().hex[:6]}"
PRIORITY_QUEUE = f"admission-priority-{uuid.uuid4().hex[:6]}"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def worker(start_worker) -> Any:
    return start_worker("chaos", concurrency=1, queues=[DEPTH_QUEUE, PRIORITY_QUEUE])


@pytest.fixture()
def backend(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client


@pytest.fixture()
def limits(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Admission settings of the test: every depth read fresh, the chaos family's limits small."""

    def use(**family: Any) -> None:
        settings = parse({"depth_cache": 0, "families": {"chaos": family}})
        monkeypatch.setattr(admission, "get_admission", lambda: settings)

    return use


def started(job_id: str, client: redis.Redis) -> bool:
    return client.exists(keys.history(job_id)) > 0


def wait_started(job_id: str, client: redis.Redis, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not started(job_id, client):
        assert time.monotonic() < deadline, f"job {job_id} did not start"
        time.sleep(0.02)


def blocker(queue: str, client: redis.Redis, seconds: float) -> Any:
    """A job that keeps the worker's one child busy, once it runs."""
    job = submit("chaos", queue=queue, plan={"sleep": seconds})
    wait_started(job.id, client)
    return job


@contextlib.contextmanager
def pressed(client: redis.Redis, pool: str) -> Iterator[None]:
    """``pool`` short of memory, as its worker would publish it: 10 MiB available, every half second."""
    stop = threading.Event()

    def publish() -> None:
        while True:
            publish_reading(client, pool, Reading(f"{pool}@test", time.time(), 10.0, 16000.0, {}))
            if stop.wait(0.5):
                return

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    time.sleep(0.05)
    try:
        yield
    finally:
        stop.set()
        thread.join()
        client.delete(keys.pressure(pool))


def test_a_family_at_its_depth_limit_refuses_and_accepts_again_once_drained(worker, backend, limits) -> None:
    limits(max_queued=3, max_queued_per_tenant=2, retry_after=7)
    # The worker publishes its pool's memory reading (``workers.pressure``), what pressure is judged on.
    mine = [r for r in admission.readings(backend, "chaos") if r.worker == worker.node]
    assert mine and 0 < mine[0].available_mb <= mine[0].total_mb, admission.readings(backend, "chaos")
    assert set(mine[0].queues) == {DEPTH_QUEUE, PRIORITY_QUEUE}
    first = blocker(DEPTH_QUEUE, backend, seconds=2.0)
    waiting = [submit("chaos", queue=DEPTH_QUEUE, job_id=f"adm-{uuid.uuid4()}", tenant="t-a") for _ in range(2)]
    waiting.append(submit("chaos", queue=DEPTH_QUEUE))
    refused_before = backend.hget(keys.refusals("chaos"), "depth")
    refused_id = f"adm-refused-{uuid.uuid4()}"
    with pytest.raises(Overloaded) as refused:
        submit("chaos", queue=DEPTH_QUEUE, job_id=refused_id)
    assert refused.value.reason == "depth" and refused.value.retry_after == 7
    assert "3 jobs are waiting, the limit is 3" in str(refused.value)
    # Nothing of the refused job anywhere: no idempotency key, no history, no result, no message.
    assert not backend.exists(keys.submitted(refused_id), keys.history(refused_id), f"celery-task-meta-{refused_id}")
    assert sum(backend.llen(name) for name in redis_lists(DEPTH_QUEUE)) == 3
    assert int(backend.hget(keys.refusals("chaos"), "depth")) == int(refused_before or 0) + 1
    # A job already accepted is never refused: its re-submit returns its handle.
    assert submit("chaos", queue=DEPTH_QUEUE, job_id=waiting[0].id, tenant="t-a").id == waiting[0].id
    for job in [first, *waiting]:
        job.wait(timeout=30)
    again = submit("chaos", queue=DEPTH_QUEUE, job_id=f"adm-{uuid.uuid4()}", tenant="t-a")
    again.wait(timeout=30)


def test_a_tenant_at_its_limit_is_refused_while_another_is_taken(worker, backend, limits) -> None:
    limits(max_queued=100, max_queued_per_tenant=2)
    first = blocker(DEPTH_QUEUE, backend, seconds=1.5)
    mine = [submit("chaos", queue=DEPTH_QUEUE, tenant="t-busy") for _ in range(2)]
    with pytest.raises(Overloaded) as refused:
        submit("chaos", queue=DEPTH_QUEUE, tenant="t-busy")
    assert refused.value.reason == "tenant" and "this caller has 2 jobs waiting" in str(refused.value)
    other = submit("chaos", queue=DEPTH_QUEUE, tenant="t-quiet")
    for job in [first, *mine, other]:
        job.wait(timeout=30)
    # Started and ended jobs no longer count: the busy tenant is taken again.
    submit("chaos", queue=DEPTH_QUEUE, tenant="t-busy").wait(timeout=30)


def test_memory_pressure_on_a_pool_refuses_its_families_only(backend, media_root, monkeypatch) -> None:
    # Every submit reads the readings afresh here (test_a_memory_reading_is_reused_for_depth_cache:
    # how long one is reused).
    monkeypatch.setattr(admission, "get_admission", lambda: parse({"depth_cache": 0}))
    with pressed(backend, "chaos"):
        why = admission.pool_under_pressure("chaos", backend)
        assert why is not None and "pool 'chaos' is under memory pressure: 10 MiB of 16000 MiB" in why
        refused_id = f"adm-pressed-{uuid.uuid4()}"
        queued = sum(backend.llen(name) for name in redis_lists("chaos"))
        with pytest.raises(Overloaded) as refused:
            submit("chaos", job_id=refused_id)
        assert refused.value.reason == "pressure" and refused.value.retry_after == 15
        assert not backend.exists(keys.submitted(refused_id), keys.history(refused_id))
        assert sum(backend.llen(name) for name in redis_lists("chaos")) == queued
        # A job whose ladder steps down under pressure is taken: it will start a rung lower instead.
        stepping = submit("chaos", ladder="pressure_steps")
        assert take_back(backend, "chaos", stepping.id)
        # The gpu0 pool serves gpu0.vad and reads no pressure: its job is taken.
        job = submit("vad", queue="gpu0.vad", media=str(media_root / "pressure.wav"))
        assert take_back(backend, "gpu0.vad", job.id)
    # A worker says which queues it consumes (`farm worker --queues`): its pressure refuses their
    # jobs, whatever its pool declares, and no other queue's.
    own = f"admission-own-{uuid.uuid4().hex[:6]}"
    publish_reading(backend, "gpu0", Reading("gpu0-x@test", time.time(), 10.0, 16000.0, {}, (own,)))
    try:
        with pytest.raises(Overloaded, match="pool 'gpu0' is under memory pressure"):
            submit("chaos", queue=own)
        job = submit("vad", queue="gpu0.vad", media=str(media_root / "pressure.wav"))
        assert take_back(backend, "gpu0.vad", job.id)
    finally:
        backend.delete(keys.pressure("gpu0"))
    # A reading older than the TTL is ignored: a stopped worker does not refuse work for ever.
    publish_reading(backend, "chaos", Reading("chaos@test", time.time() - 60, 10.0, 16000.0, {}))
    assert admission.pool_under_pressure("chaos", backend) is None


def test_a_memory_reading_is_reused_for_depth_cache_then_read_again(backend, monkeypatch) -> None:
    """A producer process reads the pools' memory readings once per ``depth_cache`` (one round trip
    of every pool's HVALS), not once per submit, and never reuses them past
    ``READINGS_REUSE_MAX_S`` (1 s) whatever ``depth_cache`` says: a reading published meanwhile
    refuses from the next look on."""
    reuse_s = admission.READINGS_REUSE_MAX_S
    monkeypatch.setattr(admission, "get_admission", lambda: parse({"depth_cache": 10 * reuse_s}))
    monkeypatch.setattr(admission, "_readings", admission._Readings())  # nothing cached by earlier tests
    pools = len(admission.get_pools())

    def hvals_served() -> int:
        return int(backend.info("commandstats").get("cmdstat_hvals", {}).get("calls", 0))

    before = hvals_served()
    first = submit("chaos")
    read_at = time.monotonic()
    assert take_back(backend, "chaos", first.id)
    publish_reading(backend, "chaos", Reading("chaos@test", time.time(), 10.0, 16000.0, {}))
    try:
        second = submit("chaos")  # within the reuse: the reading from before the pressure stands
        assert time.monotonic() - read_at < reuse_s, "the machine was too slow to test the reuse"
        assert take_back(backend, "chaos", second.id)
        # One look of every pool for both submits (the routing's capability read adds an HVALS a second).
        assert pools <= hvals_served() - before < 2 * pools
        # Past 1 s, not the 10 s configured, the readings are read again and the pressure refuses.
        time.sleep(max(0.0, reuse_s - (time.monotonic() - read_at)) + 0.05)
        with pytest.raises(Overloaded, match="pool 'chaos' is under memory pressure"):
            submit("chaos")
        assert hvals_served() - before >= 2 * pools
    finally:
        backend.delete(keys.pressure("chaos"))


def take_back(client: redis.Redis, queue: str, job_id: str) -> bool:
    """Remove an accepted test job's message from ``queue`` (no worker here takes it); was it there?"""
    for name in redis_lists(queue):
        for raw in client.lrange(name, 0, -1):
            if json.loads(raw)["headers"]["id"] == job_id:
                return client.lrem(name, 1, raw) == 1
    return False


def test_the_gateway_answers_429_with_retry_after_and_farm_submit_exits_75(backend, redis_url) -> None:
    from tests.gateway.conftest import TOKEN, gateway_config, running_gateway

    with pressed(backend, "chaos"), running_gateway(gateway_config()) as url:
        answer = httpx.post(f"{url}/v1/jobs/chaos", json={}, headers={"Authorization": f"Bearer {TOKEN}"})
        env = {**os.environ, "COLUMNS": "200"}
        proc = subprocess.run([sys.executable, "-m", "mediafarm.workers.cli", "submit", "chaos"], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert answer.status_code == 429 and answer.headers["retry-after"] == "15", answer.text
    assert "pool 'chaos' is under memory pressure" in answer.json()["detail"]
    assert proc.returncode == 75, proc.stdout + proc.stderr
    assert "the farm refused the job" in proc.stderr and "memory pressure" in proc.stderr


def test_a_high_priority_job_submitted_last_starts_before_the_waiting_low_ones(worker, backend) -> None:
    busy = blocker(PRIORITY_QUEUE, backend, seconds=1.5)
    low = [submit("chaos", queue=PRIORITY_QUEUE, priority=0) for _ in range(4)]
    normal = submit("chaos", queue=PRIORITY_QUEUE)  # the default, 4
    high = submit("chaos", queue=PRIORITY_QUEUE, priority=9)
    for job in [busy, *low, normal, high]:
        job.wait(timeout=60)

    def start(job: Any) -> float:
        return job.attempts()[0]["started"]

    order = sorted([*low, normal, high], key=start)
    assert order[0].id == high.id and order[1].id == normal.id, [j.id for j in order]
    assert {j.id for j in order[2:]} == {j.id for j in low}
    # Refused on the way in: a priority outside the scale.
    with pytest.raises(ValueError, match="priority must be an integer from 0 to 9"):
        submit("chaos", queue=PRIORITY_QUEUE, priority=10)


AMQP_SCRIPT = """
import sys
from mediafarm import Overloaded, submit
queue = sys.argv[1]
for priority in (9, 0):
    submit("chaos", queue=queue, priority=priority)
try:
    submit("chaos", queue=queue)
except Overloaded as exc:
    print("refused", exc.reason, exc)
"""


def test_on_rabbitmq_the_depth_is_the_quorum_queues_message_count(amqp_url, redis_url, tmp_path) -> None:
    # A producer of its own: the settings (broker, limits) are read once per process.
    config = tmp_path / "farm.toml"
    config.write_text((REPO / "tests" / "support" / "farm-test.toml").read_text()
                      + "\n[admission]\ndepth_cache = 0\n[admission.families.chaos]\nmax_queued = 2\n")  # fmt: skip
    env = {**os.environ, "FARM_BROKER_URL": amqp_url, "FARM_RESULT_BACKEND": redis_url, "FARM_CONFIG_FILE": str(config)}
    queue = f"admission-amqp-{uuid.uuid4().hex[:6]}"
    proc = subprocess.run([sys.executable, "-c", AMQP_SCRIPT, queue], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused depth" in proc.stdout and "2 jobs are waiting, the limit is 2" in proc.stdout, proc.stdout


def test_a_limit_that_cannot_be_read_takes_the_job(backend, limits, monkeypatch) -> None:
    # The broker restarting under a producer: its send rides the restart out (the publish retry
    # policy), so admission must not turn the blip into a refusal or an error.
    from redis.exceptions import ConnectionError as RedisConnectionError

    limits(max_queued=1)

    def away(*_: Any) -> int:
        raise RedisConnectionError("Connection refused")

    monkeypatch.setattr(admission._depths, "_read", away)
    queue = f"admission-away-{uuid.uuid4().hex[:6]}"
    jobs = [submit("chaos", queue=queue) for _ in range(2)]  # past the limit of 1: not applied
    assert all(take_back(backend, queue, job.id) for job in jobs)


def test_a_racing_resubmit_of_an_accepted_id_gets_its_handle_not_a_refusal(backend, limits, monkeypatch) -> None:
    # Two submits of one id (a client retrying on a timeout) race: the second reads no key yet,
    # the first then takes the last place and writes its key, and the second's admission finds the
    # family at its limit. The job was accepted: the second gets its handle, nothing more is sent.
    from mediafarm.tasks.producer import client as client_module

    limits(max_queued=1)
    queue = f"admission-race-{uuid.uuid4().hex[:6]}"
    job_id = f"adm-race-{uuid.uuid4()}"
    real_admit = client_module.admission.admit
    raced: list[Any] = []

    def admit_while_the_other_wins(*args: Any, **kwargs: Any) -> Any:
        if not raced:
            raced.append(None)
            raced.append(submit("chaos", queue=queue, job_id=job_id, plan={"sleep": 0}))
        return real_admit(*args, **kwargs)

    monkeypatch.setattr(client_module.admission, "admit", admit_while_the_other_wins)
    job = submit("chaos", queue=queue, job_id=job_id, plan={"sleep": 0})
    assert job.id == raced[1].id == job_id
    assert take_back(backend, queue, job_id) and not take_back(backend, queue, job_id)


def test_a_resubmit_that_loses_the_race_leaves_the_tenants_place_to_the_job(backend, limits, monkeypatch) -> None:
    # Both submits of one id pass admission; the other writes the key first. The loser gives back
    # what it took, but the tenant's place is the job's own (one member per id), which was sent:
    # it must still count against the tenant.
    from mediafarm.tasks.producer import client as client_module

    limits(max_queued=100, max_queued_per_tenant=5)
    queue = f"admission-race-{uuid.uuid4().hex[:6]}"
    job_id, tenant = f"adm-race-{uuid.uuid4()}", f"t-race-{uuid.uuid4().hex[:6]}"
    real_admit = client_module.admission.admit
    raced: list[Any] = []

    def admitted_then_the_other_wins(*args: Any, **kwargs: Any) -> Any:
        taken = real_admit(*args, **kwargs)
        if not raced:
            raced.append(None)
            raced.append(submit("chaos", queue=queue, job_id=job_id, tenant=tenant, plan={"sleep": 0}))
        return taken

    monkeypatch.setattr(client_module.admission, "admit", admitted_then_the_other_wins)
    job = submit("chaos", queue=queue, job_id=job_id, tenant=tenant, plan={"sleep": 0})
    assert job.id == raced[1].id == job_id
    assert backend.zrange(keys.tenant_jobs("chaos", tenant), 0, -1) == [job_id.encode()]
    assert take_back(backend, queue, job_id) and not take_back(backend, queue, job_id)


def test_a_send_that_fails_leaves_no_idempotency_key_even_if_giving_back_its_place_fails(
    backend, limits, monkeypatch
) -> None:
    # The send failed and the tenant's place could not be given back (Redis blipping): the key
    # must still go, or a retry with the same id would get the handle of a job never sent.
    from kombu.exceptions import OperationalError
    from redis.exceptions import ConnectionError as RedisConnectionError

    from mediafarm.tasks.producer import client as client_module

    limits(max_queued=100, max_queued_per_tenant=5)
    job_id = f"adm-unsent-{uuid.uuid4()}"

    def broker_away(*_: Any, **__: Any) -> Any:
        raise OperationalError("broker away")

    def blip(*_: Any, **__: Any) -> None:
        raise RedisConnectionError("Connection reset by peer")

    monkeypatch.setattr(client_module.app, "send_task", broker_away)
    monkeypatch.setattr(admission.Admitted, "release", blip)
    with pytest.raises((OperationalError, RedisConnectionError)):
        submit("chaos", queue="admission-unsent", job_id=job_id, tenant="t-unsent", plan={"sleep": 0})
    assert not backend.exists(keys.submitted(job_id))
    backend.delete(keys.tenant_jobs("chaos", "t-unsent"))  # the place the blip kept
