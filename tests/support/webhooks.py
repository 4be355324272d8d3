"""A real webhook receiver for the tests: an HTTP server on a free loopback port that verifies
each delivery with the ``standardwebhooks`` library, as a producer's service would, with each of
the two secrets a farm in the middle of a rotation signs with."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Iterator
from typing import Any

import pytest
from standardwebhooks import Webhook

from mediafarm.config.settings import get_settings
from mediafarm.workers.embedded import free_port

OLD_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
NEW_SECRET = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"


class Receiver:
    """A real HTTP server on a free loopback port: answers the statuses queued in ``answers``
    (then 200) and keeps each request it got, verified or not."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.got: list[dict[str, Any]] = []
        self.answers: list[int] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                verified = {}
                for name, secret in (("old", OLD_SECRET), ("new", NEW_SECRET)):
                    try:
                        Webhook(secret).verify(body, headers)
                        verified[name] = True
                    except Exception:  # noqa: BLE001 - recorded: the test asserts on it
                        verified[name] = False
                with receiver._lock:
                    status = receiver.answers.pop(0) if receiver.answers else 200
                    receiver.got.append({"headers": headers, "body": json.loads(body), "verified": verified,
                                         "status": status})  # fmt: skip
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def wait_for(self, count: int, timeout: float = 60) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.got) >= count:
                    return list(self.got)
            time.sleep(0.05)
        raise AssertionError(f"{len(self.got)} deliveries in {timeout} s, expected {count}: {self.got}")


@pytest.fixture()
def loopback_allowed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process (a producer, the gateway's thread) allows loopback receivers, as the tests' workers do."""
    monkeypatch.setenv("FARM_WEBHOOK_ALLOW", "127.0.0.1")
    get_settings.cache_clear()
    yield
    monkeypatch.undo()
    get_settings.cache_clear()
