"""A vhost of our own on the machine's RabbitMQ (127.0.0.1:5672, guest/guest), for tests and benches.

Made with ``rabbitmqctl`` and deleted afterwards: RabbitMQ keeps nothing of ours, and nothing else
on it is touched.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

AMQP_HOST, AMQP_PORT = "127.0.0.1", 5672


class VhostUnavailable(RuntimeError):
    """No RabbitMQ here, no ``rabbitmqctl``, or it may not make a vhost."""


def _rabbitmqctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, timeout=60)


@contextmanager
def own_vhost(prefix: str = "mediafarm-test") -> Iterator[str]:
    """The AMQP URL of a fresh vhost ``<prefix>-<random>``, deleted when the block ends."""
    if shutil.which("rabbitmqctl") is None:
        raise VhostUnavailable("rabbitmqctl is not installed: cannot make a vhost of our own on the local RabbitMQ")
    try:
        socket.create_connection((AMQP_HOST, AMQP_PORT), timeout=2).close()
    except OSError as exc:
        raise VhostUnavailable(f"no RabbitMQ at {AMQP_HOST}:{AMQP_PORT} ({exc})") from None
    vhost = f"{prefix}-{uuid.uuid4().hex[:8]}"
    made = _rabbitmqctl("add_vhost", vhost)
    if made.returncode != 0:
        raise VhostUnavailable(f"rabbitmqctl add_vhost failed (not allowed here?): {made.stderr.strip()[-300:]}")
    try:
        granted = _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        if granted.returncode != 0:
            raise VhostUnavailable(f"rabbitmqctl set_permissions failed: {granted.stderr.strip()[-300:]}")
        yield f"amqp://guest:guest@{AMQP_HOST}:{AMQP_PORT}/{vhost}"
    finally:
        _rabbitmqctl("delete_vhost", vhost)
