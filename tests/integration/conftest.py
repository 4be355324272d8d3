"""Fixtures of the integration tests that need more than the session's Redis."""

from __future__ import annotations

import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

AMQP_HOST, AMQP_PORT = "127.0.0.1", 5672


def _rabbitmqctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def amqp_url() -> Iterator[str]:
    """A vhost of our own on the machine's RabbitMQ (127.0.0.1:5672, guest/guest), made with
    ``rabbitmqctl`` and deleted afterwards: RabbitMQ keeps nothing of ours and nothing else on it
    is touched. Skipped, saying why, where there is no RabbitMQ or no ``rabbitmqctl`` we may use."""
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl is not installed: cannot make a vhost of our own on the local RabbitMQ")
    try:
        socket.create_connection((AMQP_HOST, AMQP_PORT), timeout=2).close()
    except OSError as exc:
        pytest.skip(f"no RabbitMQ at {AMQP_HOST}:{AMQP_PORT} ({exc})")
    vhost = f"mediafarm-test-{uuid.uuid4().hex[:8]}"
    made = _rabbitmqctl("add_vhost", vhost)
    if made.returncode != 0:
        pytest.skip(f"rabbitmqctl add_vhost failed (not allowed here?): {made.stderr.strip()[-300:]}")
    try:
        granted = _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        assert granted.returncode == 0, granted.stderr
        yield f"amqp://guest:guest@{AMQP_HOST}:{AMQP_PORT}/{vhost}"
    finally:
        _rabbitmqctl("delete_vhost", vhost)


@pytest.fixture(scope="session")
def random_yolo(session_dir: Path) -> tuple[Path, Path]:
    """A random-weight YOLO11n (``.pt`` and ONNX) in the session's models dir, built once."""
    from mediafarm.config.settings import get_settings
    from tests.support.yolo import build_random_yolo

    return build_random_yolo(get_settings().models_dir, session_dir / "ultralytics-build")
