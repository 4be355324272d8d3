"""The `farm` command as a user runs it: real processes, real Redis."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

FARM = [sys.executable, "-m", "workers.cli"]


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
    assert "variant silero-onnx" in proc.stdout and "demo done" in proc.stdout
    # The bundled clip holds three sentences; each becomes a row of the table.
    rows = [line for line in proc.stdout.splitlines() if line.startswith("│ ")]
    assert len(rows) == 3, proc.stdout


@pytest.mark.integration
def test_submit_wait_prints_spans_and_rejects_bad_input(cpu_worker, speech_track, media_root: Path) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    ok = run(["submit", "vad", str(speech_track.path), "--wait", "--json"], env)
    assert ok.returncode == 0, ok.stderr
    assert '"variant": "silero-onnx"' in ok.stdout and ok.stdout.count('"start"') == len(speech_track.truth)
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
        [sys.executable, "-m", "celery", "-A", "tasks.app", "worker", "-c", "1"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "FARM_VISIBILITY_TIMEOUT (60 s) must exceed" in proc.stdout + proc.stderr


def test_unknown_pool_is_named(redis_url: str) -> None:
    proc = run(["worker", "--pool", "nope"], clean_env(FARM_BROKER_URL=redis_url), timeout=60)
    assert proc.returncode == 2 and "no pool named 'nope'" in proc.stderr
