"""`farm gateway` as an operator runs it: a real process on a free port, stopped by Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import REPO

FARM = [sys.executable, "-m", "mediafarm.workers.cli"]


@pytest.mark.integration
def test_farm_gateway_serves_until_ctrl_c_and_refuses_an_open_address_without_tokens() -> None:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("FARM_API_TOKENS", None)
    refused = subprocess.run(FARM + ["gateway", "--host", "0.0.0.0"], env=env, cwd=REPO, capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert refused.returncode == 2 and "refusing to listen on 0.0.0.0" in refused.stderr, refused.stderr
    proc = subprocess.Popen(FARM + ["gateway", "--port", "0"], env={**env, "FARM_API_TOKENS": "cli-token"}, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline()
        url = re.search(r"gateway on (http://127\.0\.0\.1:\d+)", line)
        assert url and "bearer tokens (1)" in line, line
        deadline = time.monotonic() + 30
        while True:
            try:
                health = httpx.get(url.group(1) + "/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        assert health.json() == {"status": "ok"}
        assert httpx.get(url.group(1) + "/v1/jobs/x").status_code == 401
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
