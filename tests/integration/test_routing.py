"""Jobs go to the pool that runs their best rung, and a downgrade moves a job to another pool
(issue #36, items 3-4), on real prefork workers, real subtitle jobs and a real producer process.

Two pools stand in for a GPU pool and a CPU pool, told apart by their models folder: ``route-better``
has tiny.en (its best subtitle rung is whisper-tiny), ``route-plain`` has none (its best is
pocketsphinx). The session's other workers take subtitle jobs too, so these two run on a Redis
database of their own, with a producer process of their own (tests/support/route_producer.py):
they are the whole cluster there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from celery import Celery

from mediafarm.config.pools import get_pool
from mediafarm.tasks.producer import scaling
from mediafarm.tasks.wire import capability, keys
from mediafarm.tasks.wire.history import read_attempts
from mediafarm.workers.launch import spawn_worker, stop_worker, wait_ready
from tests.support.speech import PHRASES, make_track

pytestmark = pytest.mark.integration

BETTER, PLAIN, GHOST = "route-better", "route-plain", "route-ghost"
# How long a pool queue may hold jobs with its pool absent before live workers send them on.
GRACE_S = 5


def other_database(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


class Cluster:
    """Two workers, one per pool, on their own Redis database."""

    def __init__(self, url: str, session_dir: Path, models: dict[str, Path]) -> None:
        self.url, self.session_dir, self.models = url, session_dir, models
        self.app = Celery("route-test", broker=url, backend=url)
        self.client = redis.Redis.from_url(url)
        self.nodes: dict[str, str] = {}
        self.processes: list[subprocess.Popen[bytes]] = []
        self.process_of: dict[str, subprocess.Popen[bytes]] = {}

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "FARM_BROKER_URL": self.url, "FARM_RESULT_BACKEND": self.url, **extra}

    def start(self, pool: str) -> None:
        import socket

        node = f"{pool}-t{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
        log = self.session_dir / f"{node.split('@')[0]}.log"
        env = self.env(FARM_POOL=pool, FARM_MODELS_DIR=str(self.models[pool]), FARM_HANDBACK_GRACE=str(GRACE_S))
        with log.open("wb") as fh:
            process = spawn_worker(get_pool(pool), env=env, logfile=fh, concurrency=1, node=node, loglevel="INFO")
        self.processes.append(process)
        self.process_of[pool] = process
        try:
            wait_ready(self.app, node, process, timeout=90)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{log.read_text(errors='replace')[-3000:]}") from None
        self.nodes[pool] = node
        deadline = time.monotonic() + 3 * capability.INTERVAL_S
        while node not in {r.node for r in capability.live(self.client)}:
            assert time.monotonic() < deadline, f"{node} wrote no capability record"
            time.sleep(0.2)

    def produce(self, ids: list[str], media: Path, *, spill: int) -> subprocess.Popen[str]:
        order = json.dumps({"family": "subtitle", "fields": {"media": str(media)}, "ids": ids})
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.route_producer", order],
            env=self.env(FARM_ROUTE_SPILL_DEPTH=str(spill), FARM_WAKE_POOLS=BETTER), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        return process

    def stop_pool(self, pool: str) -> None:
        """Stop the pool's worker as an orchestrator scaling it to zero does (its stop step removes its record)."""
        process = self.process_of.pop(pool)
        stop_worker(process, timeout=20)
        self.processes.remove(process)

    def stop(self) -> None:
        for process in self.processes:
            stop_worker(process, timeout=20)
        # What these pools ran is kept a week for waking them (tasks.producer.wake): not past this module.
        known = [node for node, raw in self.client.hgetall(keys.pool_capabilities()).items()
                 if json.loads(raw)["pool"] in (BETTER, PLAIN, GHOST)]  # fmt: skip
        if known:
            self.client.hdel(keys.pool_capabilities(), *known)


def envelopes(process: subprocess.Popen[str], timeout: float = 150) -> dict[str, dict]:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"the producer did not end in {timeout} s:\n{out[-3000:]}\n{err[-3000:]}") from None
    assert process.returncode == 0, err[-3000:]
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    failed = [line for line in lines if "error" in line]
    assert not failed, failed
    return {line["id"]: line["envelope"] for line in lines}


@pytest.fixture(scope="module")
def cluster(redis_url: str, session_dir: Path, tiny_en: Path) -> Iterator[Cluster]:
    models = {pool: session_dir / f"models-{pool}-{uuid.uuid4().hex[:6]}" for pool in (BETTER, PLAIN)}
    for folder in models.values():
        folder.mkdir()
    (models[BETTER] / tiny_en.name).symlink_to(tiny_en.resolve(), target_is_directory=True)
    farm = Cluster(other_database(redis_url, 7), session_dir, models)
    try:
        farm.start(BETTER)
        farm.start(PLAIN)
        yield farm
    finally:
        farm.stop()


@pytest.fixture(scope="module")
def short_clip(media_root: Path) -> Path:
    return make_track(media_root / "route-short.wav", gaps=(0.3, 0.3), phrases=PHRASES[:1]).path


def ran(envelope: dict) -> tuple[str, str]:
    """(the rung that answered, the worker it ran on)."""
    ok = [a for a in envelope["attempts"] if a["outcome"] == "ok"]
    assert len(ok) == 1, envelope["attempts"]
    return envelope["variant"], ok[0]["worker"]


def test_with_both_pools_idle_every_job_runs_on_the_better_pools_rung(cluster: Cluster, short_clip: Path) -> None:
    ids = [f"route-idle-{i}-{uuid.uuid4().hex[:6]}" for i in range(20)]
    done = envelopes(cluster.produce(ids, short_clip, spill=100))
    assert len(done) == 20
    for job_id, envelope in done.items():
        assert ran(envelope) == ("whisper-tiny", cluster.nodes[BETTER]), (job_id, envelope["attempts"])
        first = envelope["attempts"][0]
        assert first["route"].startswith(f"pool {BETTER} runs whisper-tiny, the best rung of the subtitle ladder"), first
        assert envelope["output"]["cues"], envelope["output"]


def test_each_workers_record_says_which_languages_its_rungs_handle_with_its_models(cluster: Cluster) -> None:
    records = {r.pool: r for r in capability.live(cluster.client)}
    # tiny.en is English only; pocketsphinx's bundled model is en-us: a job in another language is
    # routed to neither (tasks.producer.routing.able_pools), as the worker's own check would skip both.
    for pool in (BETTER, PLAIN):
        spoken = records[pool].languages["subtitle"]["subtitle"]
        assert spoken["whisper-tiny"] == ("en",) and spoken["pocketsphinx"] == ("en",), (pool, spoken)
        assert not records[pool].handles("subtitle", "subtitle", "pocketsphinx", "fr")


def test_past_the_spill_depth_the_excess_starts_on_the_other_pool_saying_why(cluster: Cluster, short_clip: Path) -> None:
    ids = [f"route-busy-{i}-{uuid.uuid4().hex[:6]}" for i in range(12)]
    done = envelopes(cluster.produce(ids, short_clip, spill=2))
    where = {job_id: ran(envelope) for job_id, envelope in done.items()}
    on_plain = [j for j, (rung, node) in where.items() if node == cluster.nodes[PLAIN]]
    on_better = [j for j, (rung, node) in where.items() if node == cluster.nodes[BETTER]]
    assert on_plain and on_better and len(on_plain) + len(on_better) == 12, where
    for job_id in on_plain:
        assert where[job_id][0] == "pocketsphinx"
        route = done[job_id]["attempts"][0]["route"]
        assert f"pool {BETTER}'s queue holds" in route and "the spill depth 2 (FARM_ROUTE_SPILL_DEPTH)" in route, route
        assert f"started lower, on pool {PLAIN}, whose best rung is pocketsphinx" in route, route
    for job_id in on_better:
        assert where[job_id][0] == "whisper-tiny"
        assert done[job_id]["attempts"][0]["route"].startswith(f"pool {BETTER} runs whisper-tiny"), done[job_id]


def test_a_job_killed_on_the_better_pool_moves_to_the_other_pool_and_frees_its_slot(
    cluster: Cluster, media_root: Path
) -> None:
    long_clip = make_track(media_root / "route-long.wav").path
    job_id = f"route-kill-{uuid.uuid4().hex[:6]}"
    producer = cluster.produce([job_id], long_clip, spill=100)
    deadline = time.monotonic() + 60
    while not (open_ := [a for a in read_attempts(cluster.client, job_id) if a["outcome"] is None]):
        assert time.monotonic() < deadline, read_attempts(cluster.client, job_id)
        time.sleep(0.05)
    assert (open_[0]["variant"], open_[0]["worker"]) == ("whisper-tiny", cluster.nodes[BETTER])
    os.kill(open_[0]["pid"], signal.SIGKILL)  # as the kernel's OOM killer would
    # Its next rung, pocketsphinx, is the plain pool's best: the job goes there, and while it runs
    # there the better pool's one slot holds nothing.
    while not (there := [a for a in read_attempts(cluster.client, job_id) if a["worker"] == cluster.nodes[PLAIN]]):
        assert time.monotonic() < deadline, read_attempts(cluster.client, job_id)
        time.sleep(0.05)
    # The moving delivery ends as soon as its retry is sent (the move record is written just before).
    better = cluster.nodes[BETTER]
    while (held := (cluster.app.control.inspect(destination=[better], timeout=2).active() or {}).get(better)) != []:
        assert time.monotonic() < deadline, held
        time.sleep(0.05)
    running_there = [a for a in read_attempts(cluster.client, job_id) if a["worker"] == cluster.nodes[PLAIN]]
    assert running_there[-1]["outcome"] is None, ("the better slot was still held when the job ended elsewhere",
                                                  running_there)  # fmt: skip
    envelope = envelopes(producer)[job_id]
    steps = [(a["variant"], a["outcome"], a["worker"]) for a in envelope["attempts"] if a["outcome"] != "unavailable"]
    assert steps == [
        ("whisper-tiny", "killed", cluster.nodes[BETTER]),
        ("pocketsphinx", "moved", cluster.nodes[BETTER]),
        ("pocketsphinx", "ok", cluster.nodes[PLAIN]),
    ], envelope["attempts"]
    moved = next(a for a in envelope["attempts"] if a["outcome"] == "moved")
    assert f"moved to queue subtitle@{PLAIN}" in moved["reason"] and "this slot is freed" in moved["reason"], moved
    assert (moved["counted"], moved["cause"]) == (False, "moved")
    assert envelope["variant"] == "pocketsphinx" and envelope["output"]["cues"]


def test_jobs_left_in_the_queue_of_a_pool_with_no_live_worker_are_sent_on_and_routed(
    cluster: Cluster, short_clip: Path
) -> None:
    # As if the ghost pool had died whole with a backlog: jobs in its own queue, nobody to take them.
    ids = [f"route-orphan-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    sent = time.monotonic()
    for job_id in ids:
        cluster.app.send_task("farm.subtitle.transcribe", kwargs={"media": str(short_clip)}, task_id=job_id,
                              queue=f"subtitle@{GHOST}")  # fmt: skip
    for job_id in ids:
        envelope = cluster.app.AsyncResult(job_id).get(timeout=60)
        assert ran(envelope) == ("whisper-tiny", cluster.nodes[BETTER]), envelope["attempts"]
        assert all(a["outcome"] in ("unavailable", "moved", "ok") for a in envelope["attempts"]), envelope["attempts"]
    # Not before the grace: a pool's own restart keeps its backlog.
    assert time.monotonic() - sent >= GRACE_S
    logs = "".join(p.read_text(errors="replace") for p in cluster.session_dir.glob("route-*.log"))
    assert f"job(s) from queue subtitle@{GHOST}, whose pool has had no live worker for {GRACE_S} s, to subtitle" in logs


def test_a_pool_at_zero_replicas_is_woken_by_the_jobs_that_want_it(cluster: Cluster, short_clip: Path) -> None:
    # Scaled to zero, as an orchestrator does: its worker stops and takes its record with it.
    cluster.stop_pool(BETTER)
    assert BETTER not in {r.pool for r in capability.live(cluster.client)}
    ids = [f"route-wake-{i}-{uuid.uuid4().hex[:6]}" for i in range(2)]
    done = envelopes(cluster.produce(ids, short_clip, spill=100))
    for job_id, envelope in done.items():
        # The job does not wait for it: it runs on the live pool's best rung now ...
        assert ran(envelope) == ("pocketsphinx", cluster.nodes[PLAIN]), (job_id, envelope["attempts"])
        # ... and its route says which pool would have run it better, known by its last worker's record.
        route = envelope["attempts"][0]["route"]
        assert f"pool {BETTER} would run whisper-tiny; counted as wanting it" in route, route
    # The pool's signal: no replica, two jobs that wanted it, load 1 (one replica to start).
    signal = scaling.read_signals(cluster.client, lambda queues: scaling.redis_depths(cluster.client, queues))[BETTER]
    assert (signal.replicas, signal.wanted, signal.load) == (0, 2, 1.0), signal
    # Woken (its replica starts): the next job is routed to it, its signal driven by its own jobs.
    cluster.start(BETTER)
    job_id = f"route-woken-{uuid.uuid4().hex[:6]}"
    envelope = envelopes(cluster.produce([job_id], short_clip, spill=100))[job_id]
    assert ran(envelope) == ("whisper-tiny", cluster.nodes[BETTER]), envelope["attempts"]
    assert f"pool {BETTER} would run" not in envelope["attempts"][0]["route"], envelope["attempts"][0]
    # Its load record follows within a beat: one replica, the job it ran done, so the jobs that
    # wanted it (still counted) hold nothing up.
    deadline = time.monotonic() + 10
    while (signal := scaling.read_signals(cluster.client, lambda qs: scaling.redis_depths(cluster.client, qs))[BETTER]
           ) and (signal.replicas, signal.jobs) != (1, 0):  # fmt: skip
        assert time.monotonic() < deadline, signal
        time.sleep(0.2)
    assert signal.load == 0.0 and signal.wanted == 2, signal
