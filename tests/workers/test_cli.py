"""The `farm` command as a user runs it: real processes, real Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from tests.conftest import REPO

FARM = [sys.executable, "-m", "mediafarm.workers.cli"]


def run(args: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(FARM + args, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(COLUMNS="200", **extra)
    return env


@pytest.mark.integration
def test_demo_runs_on_an_embedded_redis_and_prints_spans() -> None:
    # No FARM_BROKER_URL at all: the newcomer's path.
    proc = run(["demo"], clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rung silero-onnx" in proc.stdout and "demo done" in proc.stdout
    # The bundled clip holds three sentences; each becomes a row of the table.
    rows = [line for line in proc.stdout.splitlines() if line.startswith("│ ")]
    assert len(rows) == 3, proc.stdout


@pytest.mark.integration
def test_submit_wait_prints_spans_and_rejects_bad_input(cpu_worker, speech_track, media_root: Path) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    ok = run(["submit", "vad", str(speech_track.path), "--wait", "--json"], env)
    assert ok.returncode == 0, ok.stderr
    assert '"rung": "silero-onnx"' in ok.stdout and ok.stdout.count('"start"') == len(speech_track.truth)
    bad = run(["submit", "vad", str(media_root / "nope.wav"), "--wait"], env)
    assert bad.returncode == 1 and "JobRejected: MediaNotFound" in bad.stderr


def test_submit_without_broker_is_named() -> None:
    proc = run(["submit", "vad", "x.wav"], clean_env())
    assert proc.returncode == 2 and "FARM_BROKER_URL is not set" in proc.stderr


def test_worker_refuses_unsafe_configuration(redis_url: str) -> None:
    env = clean_env(FARM_BROKER_URL=redis_url, FARM_VISIBILITY_TIMEOUT="60")
    proc = run(["worker"], env, timeout=60)
    assert proc.returncode == 2
    assert "refusing to start" in proc.stderr and "FARM_VISIBILITY_TIMEOUT (60 s) must exceed" in proc.stderr


def test_plain_celery_worker_refuses_unsafe_configuration_too(redis_url: str) -> None:
    env = clean_env(FARM_BROKER_URL=redis_url, FARM_VISIBILITY_TIMEOUT="60")
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "mediafarm.workers.app", "worker", "-c", "1"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "FARM_VISIBILITY_TIMEOUT (60 s) must exceed" in proc.stdout + proc.stderr


def test_a_worker_of_the_producers_plain_app_gets_the_guards_too(redis_url: str) -> None:
    # `celery -A mediafarm.tasks.app worker` (what earlier versions documented) loads the worker
    # entry through Celery's `imports`: its configuration check stops this unsafe worker, as it
    # stops one of mediafarm.workers.app. Without the guards it would start and run jobs unguarded.
    env = clean_env(FARM_BROKER_URL=redis_url, FARM_VISIBILITY_TIMEOUT="60")
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "mediafarm.tasks.app", "worker", "-c", "1", "-Q", "plain-app-test"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "FARM_VISIBILITY_TIMEOUT (60 s) must exceed" in proc.stdout + proc.stderr
    assert "ready." not in proc.stdout + proc.stderr


def test_unknown_pool_is_named(redis_url: str) -> None:
    proc = run(["worker", "--pool", "nope"], clean_env(FARM_BROKER_URL=redis_url), timeout=60)
    assert proc.returncode == 2 and "no pool named 'nope'" in proc.stderr


def test_a_producer_install_runs_the_client_commands_and_worker_commands_name_the_extra(redis_url: str) -> None:
    # A producer's core install has neither psutil nor prometheus-client (the `worker` extra): here
    # they cannot be imported, as if absent (a None in sys.modules fails the import).
    without = [sys.executable, "-c", "import sys; sys.modules['psutil'] = sys.modules['prometheus_client'] = None; "
               "from mediafarm.cli.app import main; main()"]  # fmt: skip
    queue = f"producer-install-{uuid.uuid4().hex[:6]}"  # no worker consumes it

    def farm(*args: str) -> subprocess.CompletedProcess[str]:
        env = clean_env(FARM_BROKER_URL=redis_url)
        return subprocess.run([*without, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)

    families = farm("families")
    assert families.returncode == 0 and "farm.vad.detect" in families.stdout, families.stderr
    sent = farm("submit", "tts", "Hello there.", "--queue", queue)
    assert sent.returncode == 0 and len(sent.stdout.strip()) == 36, sent.stdout + sent.stderr  # the job's id
    redis.Redis.from_url(redis_url).delete(queue)
    for command in (["worker"], ["up"], ["demo"]):
        refused = farm(*command)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "the Python package 'psutil' is missing" in refused.stderr, refused.stderr
        assert "pip install 'mediafarm[worker]'" in refused.stderr and "'mediafarm[vad]'" in refused.stderr


@pytest.mark.integration
def test_up_serves_jobs_and_ctrl_c_stops_everything_it_started() -> None:
    import re
    import signal
    import socket
    import time

    import httpx
    import psutil

    proc = subprocess.Popen(
        FARM + ["up", "--concurrency", "1"], env=clean_env(), cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not any(line.startswith("farm commands in another shell") for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            lines.append(proc.stdout.readline())
        port = int(re.search(r"127\.0\.0\.1:(\d+)", "".join(lines)).group(1))
        # What a second shell needs is printed: the broker URL, and the HTTP gateway on loopback.
        assert f"export FARM_BROKER_URL=redis://127.0.0.1:{port}/0" in lines[-1], "".join(lines)
        gateway = re.search(r"^gateway (http://127\.0\.0\.1:(\d+)) ", "".join(lines), re.MULTILINE)
        assert gateway, "".join(lines)
        assert httpx.get(gateway.group(1) + "/healthz", timeout=10).json() == {"status": "ok"}
        started = psutil.Process(proc.pid).children(recursive=True)
        assert len(started) >= 2  # the embedded Redis and the worker (with its child)
        # No FARM_WEBHOOK_SECRET: nothing could be signed, so the worker starts no webhook dispatcher.
        assert not [p for p in started if "webhook_dispatch" in " ".join(p.cmdline())], [p.cmdline() for p in started]
        # A producer elsewhere submits to it; the media root defaults to the working directory.
        sample = REPO / "tasks" / "media" / "samples" / "speech.ogg"
        env = clean_env(FARM_BROKER_URL=f"redis://127.0.0.1:{port}/0")
        job = run(["submit", "vad", str(sample), "--wait", "--json"], env, timeout=120)
        assert job.returncode == 0 and job.stdout.count('"start"') == 3, job.stdout + job.stderr
    finally:
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, "".join(lines) + out
    assert "farm stopped" in out
    assert not [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for stopped in (port, int(gateway.group(2))):
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", stopped), timeout=1):
            pass


@pytest.mark.integration
def test_two_workers_of_one_pool_on_one_host_by_name(redis_url: str) -> None:
    import socket

    from mediafarm.tasks.app import app
    from mediafarm.workers.launch import stop_worker, wait_ready

    bad = run(["worker", "--name", "a/b"], clean_env(FARM_BROKER_URL=redis_url), timeout=60)
    assert bad.returncode == 2 and "--name 'a/b'" in bad.stderr
    env = {**os.environ, "COLUMNS": "200"}
    workers = {}
    try:
        for name in ("cpu-a", "cpu-b"):
            workers[name] = subprocess.Popen(
                FARM + ["worker", "--name", name, "--queues", "named-test", "--concurrency", "1"], env=env, cwd=REPO,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        for name, process in workers.items():
            wait_ready(app, f"{name}@{socket.gethostname()}", process, timeout=90)
    finally:
        for process in workers.values():
            stop_worker(process, timeout=20)
