"""An HTTP server on a free loopback port, in a thread, for as long as a ``with`` block lasts."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def serving(handler: Callable[..., http.server.BaseHTTPRequestHandler] | Any) -> Iterator[str]:
    """``handler`` (a request handler class, or a partial of one) served by a threading
    http.server on a free loopback port; yields its base URL (``http://127.0.0.1:<port>``)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
