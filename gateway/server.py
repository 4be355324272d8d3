"""Running the gateway: in the foreground (``farm gateway``) or on a thread (``farm up``, tests)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from mediafarm.gateway.app import create_app
from mediafarm.gateway.settings import GatewayConfig

# Open event streams would hold a stopping gateway forever; they get this long, then are cut.
GRACEFUL_SHUTDOWN_S = 3


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one). OSError if it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def _server(config: GatewayConfig | None, *, access_log: bool, log_level: str) -> uvicorn.Server:
    app = create_app(config)
    return uvicorn.Server(uvicorn.Config(
        app, log_level=log_level, access_log=access_log, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        lifespan="off",
    ))  # fmt: skip


def serve(sock: socket.socket, config: GatewayConfig | None = None) -> None:
    """Serve on ``sock`` until SIGINT or SIGTERM (uvicorn's own handling)."""
    _server(config, access_log=True, log_level="info").run(sockets=[sock])


class GatewayThread:
    """A gateway served on a thread of this process. Attributes: url."""

    def __init__(self, sock: socket.socket, config: GatewayConfig | None = None, log_level: str = "warning") -> None:
        self.url = url_of(sock)
        self._sock = sock
        self._server = _server(config, access_log=False, log_level=log_level)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name="farm-gateway",
                                        daemon=True)  # fmt: skip

    def start(self, timeout: float = 30) -> GatewayThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway on {self.url} did not start")
            time.sleep(0.02)
        return self

    def stop(self, *_: Any) -> None:
        self._server.should_exit = True
        self._thread.join(GRACEFUL_SHUTDOWN_S + 5)
        self._sock.close()
