"""Fixtures of the integration tests that need more than the session's Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.rabbitmq import VhostUnavailable, own_vhost


@pytest.fixture(scope="module")
def amqp_url() -> Iterator[str]:
    """A vhost of our own on the machine's RabbitMQ (``tests.support.rabbitmq``). Skipped, saying
    why, where there is no RabbitMQ or no ``rabbitmqctl`` we may use."""
    try:
        with own_vhost() as url:
            yield url
    except VhostUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def random_yolo(session_dir: Path) -> tuple[Path, Path]:
    """A random-weight YOLO11n (``.pt`` and ONNX) in the session's models dir, built once."""
    from mediafarm.config.settings import get_settings
    from tests.support.yolo import build_random_yolo

    return build_random_yolo(get_settings().models_dir, session_dir / "ultralytics-build")
