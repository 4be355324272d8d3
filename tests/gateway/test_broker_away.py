"""The farm's Redis away (restarting, refusing, loading its data): every route that reads it answers
503 with Retry-After, in its own shape, never a bare 500; and it answers again once Redis is back.

A gateway of its own (``farm gateway``, a process) in front of a Redis of its own, which the test
stops and starts again on the same port and data, as ``docker compose restart redis`` does."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from mediafarm.workers.embedded import EmbeddedRedis, free_port

pytestmark = pytest.mark.integration
FARM = Path(sys.executable).parent / "farm"


def serving(url: str, process: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[0]
        try:
            httpx.get(f"{url}/healthz", timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"the gateway did not answer on {url} within {timeout} s")


def test_job_reads_while_redis_restarts_are_503_and_read_again_once_it_is_back(tmp_path: Path) -> None:
    redis = EmbeddedRedis(data_dir=tmp_path / "redis").start()
    port = free_port()
    env = {**os.environ, "FARM_BROKER_URL": redis.url, "FARM_RESULT_BACKEND": redis.url, "FARM_API_TOKENS": ""}
    gateway = subprocess.Popen([str(FARM), "gateway", "--host", "127.0.0.1", "--port", str(port)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        serving(url, gateway)
        with httpx.Client(base_url=url, timeout=30) as client:
            sent = client.post("/v1/jobs/toy", json={"text": "one"})  # no worker: it waits in its queue
            assert sent.status_code == 202, sent.text
            location = sent.headers["location"]
            assert client.get(location).status_code == 200
            redis.stop()
            for path in (location, f"{location}/webhooks"):
                away = client.get(path)
                assert away.status_code == 503, (path, away.status_code, away.text)
                assert away.headers["retry-after"] == "1"
                assert away.json()["detail"].startswith("the farm's broker cannot be reached: "), away.text
            # OpenAI's routes answer in OpenAI's shape, which its clients show.
            models = client.get("/v1/models")
            assert models.status_code == 503, models.text
            error = models.json()["error"]
            assert error["type"] == "server_error" and error["message"].startswith("the farm's broker cannot")
            assert client.get("/healthz").status_code == 503
            redis = EmbeddedRedis(data_dir=tmp_path / "redis", port=redis.port).start()  # its AOF kept the job
            back = client.get(location)
            assert back.status_code == 200, back.text
            assert (back.json()["id"], back.json()["state"]) == (sent.json()["id"], "PENDING")
    finally:
        gateway.terminate()
        output = gateway.communicate(timeout=30)[0]
        redis.stop()
    assert "Traceback" not in output, output[-3000:]  # a Redis outage is a warning, not a crash
