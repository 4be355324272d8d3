"""Faults on the cluster's containers themselves: Redis restarted under queued and running jobs
(its append-only file keeps them); a worker stopped the way Compose stops it (SIGQUIT, the grace
period): its running job goes back to the queue at once and resumes from its checkpoint when the
worker is back; a worker killed outright (SIGKILL) and brought back by its restart policy: its job
goes back within the handback grace and resumes from its checkpoint; a job past the worker
container's memory limit: the kernel kills the child, the job finishes on its next rung, and the
container stays up; the object store stopped under a running job: the job waits for it."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
import soundfile as sf
import yaml

from mediafarm.workers.cli import _sample
from tests.cluster.conftest import Cluster, artifacts_match, wait_job
from tests.conftest import REPO

pytestmark = pytest.mark.cluster

RATE = 16000


def long_speech(path: Path, minutes: float) -> Path:
    """The bundled three-sentence clip, again and again with a second of silence between, as WAV."""
    clip, rate = sf.read(_sample(), dtype="float32")
    if clip.ndim > 1:
        clip = clip.mean(axis=1)
    clip = np.interp(np.arange(0, len(clip), rate / RATE), np.arange(len(clip)), clip).astype(np.float32)
    unit = np.concatenate([clip, np.zeros(RATE, dtype=np.float32)])
    total = int(minutes * 60 * RATE)
    with sf.SoundFile(path, "w", samplerate=RATE, channels=1, subtype="PCM_16") as out:
        written = 0
        while written < total:
            out.write(unit[: total - written])
            written += min(unit.size, total - written)
    path.chmod(0o644)
    return path


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> httpx.Client:
    with cluster.client() as c:
        yield c


def running_attempt(view: dict) -> dict | None:
    return next((a for a in view["attempts"] if a.get("outcome") is None), None)


def wait_running(client: httpx.Client, job_id: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = client.get(f"/v1/jobs/{job_id}").json()
        if view.get("state") not in {"SUCCESS", "FAILURE"} and running_attempt(view):
            return view
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} never ran: {view}")


def test_a_redis_restart_loses_no_queued_or_running_job(cluster: Cluster, client: httpx.Client) -> None:
    media = long_speech(cluster.media / "ten-minutes.wav", 10)
    name = f"{cluster.media_in_containers}/{media.name}"
    ids = [client.post("/v1/jobs/vad", json={"media": name}).json()["id"] for _ in range(6)]
    wait_running(client, ids[0])
    # Two run (the pool's two children), the others wait in the queue, when Redis goes down.
    restarted = cluster.podman("restart", "-t", "10", cluster.container("redis"), check=False)
    assert restarted.returncode == 0, restarted.stderr
    with client_retrying(cluster) as patient:
        views = [wait_job(patient, job_id, timeout=600) for job_id in ids]
    assert [v["state"] for v in views] == ["SUCCESS"] * len(ids), json.dumps(views, indent=1)[-4000:]
    spans = {json.dumps(v["result"]["output"]["spans"]) for v in views}
    assert len(spans) == 1  # every job heard the whole file, as an unbroken run would


def client_retrying(cluster: Cluster) -> httpx.Client:
    """The gateway answers 503 while Redis is coming back: a client that waits that out."""

    class Retrying(httpx.Client):
        def get(self, *args, **kwargs):  # type: ignore[override]
            for _ in range(60):
                answer = super().get(*args, **kwargs)
                if answer.status_code != 503:
                    return answer
                time.sleep(1)
            return answer

    return Retrying(base_url=cluster.urls["gateway"], headers={"Authorization": f"Bearer {cluster.token}"},
                    timeout=60)  # fmt: skip


def compose_service(name: str) -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"][name]


def grace_seconds(value: str) -> int:
    """Compose's duration ("2m", "90s", "1m30s") in seconds."""
    parts = re.findall(r"(\d+)([hms])", value)
    assert parts, value
    return sum(int(n) * {"h": 3600, "m": 60, "s": 1}[unit] for n, unit in parts)


def queued(cluster: Cluster, queue: str) -> int:
    """Messages waiting in ``queue`` (kombu's Redis transport keeps one list per priority step)."""
    broker = redis.Redis.from_url(cluster.broker)
    names = [queue.encode(), *broker.scan_iter(match=f"{queue}\x06\x16*".encode())]
    return sum(broker.llen(n) for n in names if broker.type(n) == b"list")


def test_a_worker_stopped_with_the_compose_grace_requeues_its_job_at_once(cluster: Cluster,
                                                                          client: httpx.Client) -> None:  # fmt: skip
    """SIGQUIT (stop_signal): Celery's soft shutdown gives the job FARM_SOFT_SHUTDOWN_TIMEOUT (60 s
    shipped, 15 s in the test overlay), then its message goes straight back to the queue, not after
    the 2 h visibility timeout. Back up, the worker takes it again and resumes from the job's last
    checkpoint."""
    media = long_speech(cluster.media / "eight-minutes.wav", 8)
    job_id = f"cluster-stop-{uuid.uuid4().hex[:8]}"
    sent = client.post("/v1/jobs/subtitle", json={"media": f"{cluster.media_in_containers}/{media.name}"},
                       headers={"Idempotency-Key": job_id})  # fmt: skip
    assert sent.status_code == 202, sent.text
    wait_running(client, job_id)
    worker = cluster.container("worker-cpu")
    # As `compose stop` does: the container's stop signal (SIGQUIT), then the service's grace
    # period before SIGKILL. (podman-compose 1.6 does not give the container that grace itself:
    # a bare `podman stop` kills it after 10 s, and the job then waits out the visibility timeout.)
    grace = grace_seconds(compose_service("worker-cpu")["stop_grace_period"])
    stopped = cluster.podman("stop", "-t", str(grace), worker, timeout=grace + 60)
    try:
        assert stopped.returncode == 0
        # Back in its queue as soon as the worker has gone (Celery's cold shutdown restores it): the
        # cpu pool's own, where the gateway's submit routed it (tasks.producer.routing).
        view = client.get(f"/v1/jobs/{job_id}").json()
        assert view["state"] != "SUCCESS", "the job ended within the soft shutdown: make its media longer"
        waiting = {q: queued(cluster, q) for q in ("subtitle", "subtitle@cpu")}
        assert waiting == {"subtitle": 0, "subtitle@cpu": 1}, (waiting, view["attempts"])
        assert view["attempts"][0]["route"].startswith("pool cpu runs "), view["attempts"]
    finally:
        cluster.podman("start", worker)  # the later tests need it, whatever this one found
    done = wait_job(client, job_id, timeout=900)
    assert done["state"] == "SUCCESS", json.dumps(done, indent=1)[-3000:]
    first, *later = done["attempts"]
    assert later and later[-1]["outcome"] == "ok", done["attempts"]
    resumed = later[-1].get("resumed_from")
    assert resumed and resumed["position"] > 0, done["attempts"]


def test_a_job_past_the_container_s_memory_limit_goes_down_its_ladder(cluster: Cluster, client: httpx.Client) -> None:
    """The chaos family's hungry rung writes 1.5 GiB (tests/cluster/chaos.toml), under the pool's
    2 GiB child cap, in a worker container limited to 1 GiB: the kernel's cgroup OOM killer, not the
    farm's watchdog, kills the child. The farm tells it from an outside kill by the cgroup's OOM-kill
    count, the job finishes on the next rung, and the worker container is the same one, not restarted.
    (The limit is lowered on the running container, ``podman update``, for this test alone: the
    other tests' jobs keep docker-compose.yml's mem_limit.)"""
    worker = cluster.container("worker-cpu")
    before = cluster.podman("inspect", "-f", "{{.Id}} {{.RestartCount}}", worker).stdout.split()
    cluster.podman("update", "--memory", "1g", worker)
    try:
        view = wait_job(client, client.post("/v1/jobs/chaos", json={"ladder": "cluster_oom"}).json()["id"])
    finally:
        cluster.podman("update", "--memory", compose_service("worker-cpu")["mem_limit"], worker)
        # The next test's submit is refused under memory pressure while the last reading the worker
        # published (every second) is still of the 1 GiB limit, its file pages from the hungry rung's
        # writes counted: go on once a reading of the restored limit is in.
        wait_pressure_reading(cluster, "cpu", above_mb=1024)
    assert view["state"] == "SUCCESS" and view["result"]["variant"] == "frugal", json.dumps(view, indent=1)[-3000:]
    hungry, frugal = view["attempts"]
    assert (hungry["variant"], hungry["outcome"], hungry["cause"], hungry["counted"]) == (
        "hungry", "oom", "kernel_oom", True), view["attempts"]  # fmt: skip
    assert "OOM" in hungry["reason"] and (hungry["peak_rss_mb"] or 0) < 2048, view["attempts"]
    assert (frugal["variant"], frugal["outcome"]) == ("frugal", "ok"), view["attempts"]
    after = cluster.podman("inspect", "-f", "{{.Id}} {{.RestartCount}}", worker).stdout.split()
    assert after == before, (before, after)  # the worker's main process was never the one killed
    assert cluster.podman("inspect", "-f", "{{.State.Status}}", worker).stdout.strip() == "running"


def wait_pressure_reading(cluster: Cluster, pool: str, above_mb: float, timeout: float = 30) -> None:
    """Until every fresh memory reading of ``pool``'s workers (``tasks.producer.admission.readings``) is of a
    limit above ``above_mb``."""
    from mediafarm.tasks.producer.admission import readings

    backend = redis.Redis.from_url(re.sub(r"/\d+$", "/1", cluster.broker))  # FARM_RESULT_BACKEND's database
    deadline = time.monotonic() + timeout
    while not ((fresh := readings(backend, pool)) and all(r.total_mb > above_mb for r in fresh)):
        assert time.monotonic() < deadline, [(r.worker, r.total_mb, r.available_mb) for r in fresh]
        time.sleep(0.2)


def wait_recognising(client: httpx.Client, job_id: str, seconds: float, timeout: float = 300) -> dict:
    """The job's view once its recogniser has run ``seconds`` past its first window (a checkpoint
    is written every FARM_CHECKPOINT_INTERVAL, 5 s)."""
    deadline, since = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        view = client.get(f"/v1/jobs/{job_id}").json()
        assert view.get("state") not in {"SUCCESS", "FAILURE"}, "the job ended before the kill: make its media longer"
        if (view.get("progress") or {}).get("stage") == "recognise":
            since = since or time.monotonic()
            if time.monotonic() - since >= seconds:
                return view
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} never recognised for {seconds} s: {view}")


def test_a_worker_killed_outright_is_restarted_and_its_job_resumes(cluster: Cluster, client: httpx.Client) -> None:
    """SIGKILL of the worker container's main process, from the host, as the kernel or a crash
    would end it. (``podman kill``, with any ``--signal``, is an operator's stop to podman: libpod's
    Kill marks the container StoppedByUser, and no restart policy brings such a container back;
    hence the signal to the process.) The
    restart policy brings the same container back, under the same hostname and so the same node
    name: no peer sees that node silent, and the new worker hands back what its predecessor left
    open (``tasks.runtime.handback``) at once, not after the 2 h visibility timeout."""
    media = long_speech(cluster.media / "ten-minutes-kill.wav", 10)
    job_id = f"cluster-kill-{uuid.uuid4().hex[:8]}"
    sent = client.post("/v1/jobs/subtitle", json={"media": f"{cluster.media_in_containers}/{media.name}"},
                       headers={"Idempotency-Key": job_id})  # fmt: skip
    assert sent.status_code == 202, sent.text
    wait_recognising(client, job_id, seconds=12)
    worker = cluster.container("worker-cpu")
    before = cluster.podman("inspect", "-f", "{{.Id}} {{.RestartCount}} {{.State.Pid}}", worker).stdout.split()
    os.kill(int(before[2]), signal.SIGKILL)
    killed = time.time()
    done = wait_job(client, job_id, timeout=900)
    assert done["state"] == "SUCCESS", json.dumps(done, indent=1)[-3000:]
    after = cluster.podman("inspect", "-f", "{{.Id}} {{.RestartCount}}", worker).stdout.split()
    assert after == [before[0], str(int(before[1]) + 1)], (before, after)  # the same container, restarted once
    ran = [a for a in done["attempts"] if a["outcome"] != "unavailable"]
    lost, resumed = ran[-2], ran[-1]
    assert (lost["outcome"], lost["cause"], lost["counted"]) == ("worker_lost", "worker_lost", False), ran
    assert "handed back" in lost["reason"] and lost["rung"] == resumed["rung"], ran  # the same rung again
    assert resumed["outcome"] == "ok" and resumed["resumed_from"]["position"] > 0, ran
    # Within the handback grace (30 s) of the worker's return, not after the visibility timeout.
    assert resumed["started"] - killed < 120, (resumed["started"] - killed, ran)
    assert artifacts_match(client, done)


def test_two_workers_a_job_on_the_one_stopped_finishes_on_the_other(cluster: Cluster, client: httpx.Client) -> None:
    """``--scale worker-cpu=2``: the worker running a job is stopped (SIGQUIT, its grace); the job
    goes back to the queue at once and the other worker finishes it, from the checkpoint."""
    scaled = cluster.script("compose", "up", "-d", "--no-build", "--scale", "worker-cpu=2", "worker-cpu")
    assert scaled.returncode == 0, scaled.stdout + scaled.stderr
    second = cluster.container("worker-cpu", 2)
    try:
        deadline = time.monotonic() + 180
        while cluster.podman("healthcheck", "run", second, check=False).returncode != 0:
            assert time.monotonic() < deadline, cluster.logs("worker-cpu", 2)[-3000:]
            time.sleep(3)
        media = long_speech(cluster.media / "eight-minutes-b.wav", 8)
        job_id = f"cluster-scale-{uuid.uuid4().hex[:8]}"
        sent = client.post("/v1/jobs/subtitle", json={"media": f"{cluster.media_in_containers}/{media.name}"},
                           headers={"Idempotency-Key": job_id})  # fmt: skip
        assert sent.status_code == 202, sent.text
        first_node = running_attempt(wait_running(client, job_id))["worker"]  # cpu@<its hostname>
        hosts = {cluster.podman("inspect", "-f", "{{.Config.Hostname}}", c).stdout.strip(): c
                 for c in (cluster.container("worker-cpu"), second)}  # fmt: skip
        victim = hosts[first_node.split("@", 1)[1]]
        grace = grace_seconds(compose_service("worker-cpu")["stop_grace_period"])
        stopped_at = time.time()
        cluster.podman("stop", "-t", str(grace), victim, timeout=grace + 60)
        done = wait_job(client, job_id, timeout=900)
        assert done["state"] == "SUCCESS", json.dumps(done, indent=1)[-3000:]
        last = done["attempts"][-1]
        assert last["outcome"] == "ok" and last["worker"] != first_node, done["attempts"]
        assert last["resumed_from"] and last["resumed_from"]["position"] > 0, done["attempts"]
        # At once: the other worker took it within seconds of the stop, not after the visibility timeout.
        assert last["started"] - stopped_at < grace + 60, (last["started"] - stopped_at, done["attempts"])
    finally:
        cluster.podman("rm", "-f", "-t", "0", second, check=False)
        cluster.podman("start", cluster.container("worker-cpu"), check=False)


def test_the_object_store_stopped_mid_job_costs_no_job(cluster: Cluster, client: httpx.Client) -> None:
    """The objects service stopped while a subtitle job runs: the gateway answers 503 for a file
    it cannot reach (not a bare 500), the running attempt waits for the store (its checkpoint
    copies are skipped meanwhile) and ends ``ok`` once the store is back, with every file whole."""
    sent = client.post("/v1/jobs/tts", json={"text": "Before the store goes away."})
    assert sent.status_code == 202, sent.text
    before = wait_job(client, sent.json()["id"])
    assert before["state"] == "SUCCESS", before
    link = next(iter(before["links"]["artifacts"].values()))
    media = long_speech(cluster.media / "six-minutes-store.wav", 6)
    sent = client.post("/v1/jobs/subtitle", json={"media": f"{cluster.media_in_containers}/{media.name}"})
    assert sent.status_code == 202, sent.text
    job_id = sent.json()["id"]
    wait_running(client, job_id)
    objects = cluster.container("objects")
    stopped = time.time()
    cluster.podman("stop", "-t", "5", objects)
    try:
        away = client.get(link)
        assert away.status_code == 503 and away.headers.get("retry-after"), (away.status_code, away.text)
        assert "object store" in away.text, away.text
        time.sleep(15)  # the job goes on, or waits at its end, meanwhile
    finally:
        cluster.podman("start", objects)
    done = wait_job(client, job_id, timeout=600)
    assert done["state"] == "SUCCESS", json.dumps(done, indent=1)[-3000:]
    ran = [a for a in done["attempts"] if a["outcome"] != "unavailable"]  # not: rungs this pool cannot run
    assert [a["outcome"] for a in ran] == ["ok"], done["attempts"]  # waited, not failed and run again
    assert ran[0]["started"] + ran[0]["duration"] > stopped + 15, ran  # the store was away while it ran
    assert artifacts_match(client, done)
    assert client.get(link).status_code == 200
