"""A real gateway for the gateway tests: uvicorn on a free loopback port, on a thread of the test
process, in front of the session's Redis and a real prefork worker."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from mediafarm.config.settings import get_settings
from mediafarm.gateway.settings import GatewayConfig

# The tests' own token and another client's (whose uploads the first cannot use).
TOKEN, OTHER_TOKEN = "main-token-7f3a", "other-token-92cd"
UPLOAD_MAX_BYTES = 200_000


def gateway_config(**changes: object) -> GatewayConfig:
    settings = get_settings()
    values = dict(
        tokens=(TOKEN, OTHER_TOKEN), cors_origins=(), uploads_dir=settings.uploads_folder,
        storage_dir=settings.storage_dir, input_roots=tuple(settings.input_roots),
        upload_max_bytes=UPLOAD_MAX_BYTES, upload_max_count=100, poll_interval=0.05, heartbeat=0.3,
    )  # fmt: skip
    values.update(changes)
    return GatewayConfig(**values)  # type: ignore[arg-type]


@contextmanager
def running_gateway(config: GatewayConfig) -> Iterator[str]:
    """A gateway served on a thread, on a free loopback port; its URL."""
    from mediafarm.gateway.server import GatewayThread, bind

    gateway = GatewayThread(bind("127.0.0.1", 0), config).start()
    try:
        yield gateway.url
    finally:
        gateway.stop()


@pytest.fixture(scope="session")
def gateway_url() -> Iterator[str]:
    with running_gateway(gateway_config()) as url:
        yield url


@pytest.fixture()
def client(gateway_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http:
        yield http
