"""Workers say what they can run, and never take a job they cannot (issue #36, items 1-2), on real
prefork workers and the session's real Redis.

Two pools stand in for a cluster's unlike workers, told apart by their models folder: one has the
test-only ``weighted`` family's weights file (tests/support/weighted.py) and tiny.en, the other
neither. That family is registered only in these workers (``FARM_FAMILY_MODULES``), so its queue,
``weighted``, is theirs alone; other tests' workers stay up in the session, so every check below
names these workers' nodes. The one with the weights also takes ``gpu7.subtitle``, a subtitle queue
no producer sends to: it takes subtitle jobs there, as far as its record goes, without taking the
jobs of other tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from mediafarm.tasks.app import app
from mediafarm.tasks.wire import capability
from mediafarm.tasks.wire.capability import WorkerCapability
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.workers.launch import stop_worker
from tests.gateway.conftest import TOKEN, gateway_config, running_gateway
from tests.support import weighted

pytestmark = pytest.mark.integration

BY_HAND = f"weighted-by-hand-{uuid.uuid4().hex[:6]}"  # a queue of no family: only the incapable worker takes it
FAMILY_MODULES = os.pathsep.join([os.environ["FARM_FAMILY_MODULES"], "tests.support.weighted"])


def worker_env(models: Path) -> dict[str, str]:
    return {"FARM_FAMILY_MODULES": FAMILY_MODULES, "FARM_MODELS_DIR": str(models)}


@pytest.fixture(scope="module")
def models_with(session_dir: Path, tiny_en: Path) -> Path:
    folder = session_dir / f"models-with-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    (folder / weighted.WEIGHTS).write_bytes(b"w" * 64)
    (folder / tiny_en.name).symlink_to(tiny_en.resolve(), target_is_directory=True)
    return folder


@pytest.fixture(scope="module")
def models_without(session_dir: Path) -> Path:
    folder = session_dir / f"models-without-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    return folder


@pytest.fixture(scope="module")
def unable(start_worker: Callable[..., object], models_without: Path) -> Iterator[object]:
    worker = start_worker("weights-absent", concurrency=1, queues=["weighted", BY_HAND], env=worker_env(models_without))
    yield worker
    stop_worker(worker.process)  # its record goes with it; no later test meets this worker


@pytest.fixture()
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def record_of(client: redis.Redis, node: str, timeout: float = 2 * capability.INTERVAL_S) -> WorkerCapability:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [r for r in capability.live(client) if r.node == node]
        if found:
            return found[0]
        time.sleep(0.2)
    raise AssertionError(f"{node} has no live capability record")


def consumed(node: str) -> set[str]:
    replies = app.control.inspect(destination=[node], timeout=5).active_queues() or {}
    return {q["name"] for q in replies[node]}


def test_a_worker_that_can_run_no_rung_of_a_family_does_not_consume_its_queue(unable, client) -> None:
    queues = consumed(unable.node)
    assert "weighted" not in queues and BY_HAND in queues, queues
    log = unable.log.read_text()
    said = "not consuming queue weighted: weighted: no rung runnable: model 'weighted.bin' is not in the models dir"
    assert said in log
    mine = record_of(client, unable.node)
    assert mine.pool == "weights-absent" and mine.served == () and "weighted" not in mine.queues
    assert mine.left_out["weighted"].startswith("weighted: no rung runnable: model 'weighted.bin'")
    assert "is not in the models dir" in mine.rungs["weighted"]["weighted"]["from-file"]


def test_a_worker_left_with_no_queue_of_its_own_still_runs_and_says_so(start_worker, models_without, client) -> None:
    worker = start_worker("weights-absent", concurrency=1, queues=["weighted"], env=worker_env(models_without))
    try:
        assert "weighted" not in consumed(worker.node)
        assert "this worker consumes no queue" in worker.log.read_text()
        assert record_of(client, worker.node).queues == ()
    finally:
        stop_worker(worker.process)


def history(client: redis.Redis, job_id: str) -> list:
    return AttemptLog(client, job_id, ttl=60).read()[0]


def test_a_job_put_by_hand_before_an_incapable_worker_goes_back_once_and_runs_where_it_can(
    unable, start_worker, models_with, client
) -> None:
    job_id = f"weighted-{uuid.uuid4()}"
    app.send_task(weighted.FAMILY.task_name, kwargs={"text": "routed"}, queue=BY_HAND, task_id=job_id)
    deadline = time.monotonic() + 30
    while not history(client, job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    (sent_back,) = history(client, job_id)
    assert (sent_back.outcome, sent_back.cause, sent_back.counted, sent_back.worker) == (
        "rerouted", "rerouted", False, unable.node)  # fmt: skip
    assert "sent back to queue weighted to wait for a worker that can run it (live workers that can: none)" in (
        sent_back.reason)  # fmt: skip
    time.sleep(2)  # it waits in its family's queue, which no live worker can run
    assert len(history(client, job_id)) == 1 and app.AsyncResult(job_id).state != "SUCCESS"
    able = start_worker("weights-here", concurrency=1, queues=["weighted", "gpu7.subtitle"],
                        env=worker_env(models_with))  # fmt: skip
    envelope = app.AsyncResult(job_id).get(timeout=60)
    assert envelope["variant"] == "from-file" and envelope["output"] == {"text": "routed", "weights_bytes": 64}
    assert [(a["outcome"], a["worker"]) for a in envelope["attempts"]] == [("rerouted", unable.node), ("ok", able.node)]
    assert "weighted" in consumed(able.node)
    # The workers say it in `farm pools`, each with what it can run and why not.
    shown = farm_pools()
    workers = {w["node"]: w for w in shown["workers"]}
    assert workers[able.node]["rungs"]["weighted"]["weighted"] == {"from-file": ""}
    assert workers[able.node]["served"] == ["subtitle", "weighted"]
    assert "weighted" in workers[unable.node]["left_out"] and workers[unable.node]["served"] == []
    assert able.node in shown["pools"]["weights-here"]["workers"]
    assert unable.node in shown["pools"]["weights-absent"]["workers"]
    table = farm_pools(as_json=False)
    assert "weights-absent" in table and "no rung runnable" in table
    # And the gateway's /v1/models, over real HTTP: tiny.en and pocketsphinx run on the pool with
    # tiny.en; nothing of subtitle on the pool without (it takes no subtitle queue).
    with running_gateway(gateway_config()) as url:
        listed = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30).json()
    models = {m["id"]: m["farm"] for m in listed["data"]}
    assert "weights-here" in models["whisper-tiny"]["pools"]["whisper-tiny"]
    assert "weights-here" in models["whisper-1"]["pools"]["pocketsphinx"]
    assert not any("weights-absent" in pools for m in models.values() for pools in m["pools"].values())
    assert listed["farm"]["live_workers"] >= 2 and "note" not in listed["farm"]
    # A worker that stops takes its record with it.
    stop_worker(able.process)
    assert able.node not in {r.node for r in capability.live(client)}


def farm_pools(as_json: bool = True):
    env = {**os.environ, "FARM_FAMILY_MODULES": FAMILY_MODULES, "COLUMNS": "250"}
    argv = [sys.executable, "-m", "mediafarm.workers.cli", "pools", *(["--json"] if as_json else [])]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if as_json else done.stdout


def test_a_killed_workers_record_lapses(unable, client) -> None:
    record_of(client, unable.node)
    os.killpg(unable.process.pid, signal.SIGKILL)  # no stop step: nothing removes its record
    unable.process.wait(10)
    deadline = time.monotonic() + capability.STALE_S + capability.INTERVAL_S
    while unable.node in {r.node for r in capability.live(client)} and time.monotonic() < deadline:
        time.sleep(0.5)
    assert unable.node not in {r.node for r in capability.live(client)}
    assert client.hexists("mediafarm:capability", unable.node)  # still there, but read as a dead worker's
