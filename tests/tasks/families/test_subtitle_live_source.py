"""The live source opens only what its URL names: no URL that the stream's data names (a
playlist served on a tcp:// source) is opened behind the operator's allow-list."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest

from mediafarm.tasks.families.subtitle_live.source import OPTIONS, LiveSource
from mediafarm.tasks.families.subtitle_live.sources import SCHEMES
from mediafarm.tasks.kit import UnreadableMedia


def test_every_scheme_has_a_protocol_whitelist() -> None:
    assert all("protocol_whitelist" in OPTIONS.get(scheme, {}) for scheme in SCHEMES)


def test_a_playlist_served_on_a_tcp_source_does_not_make_the_worker_fetch_its_urls() -> None:
    fetched: list[str] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):  # stands for a host the allow-list does not name
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            fetched.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    elsewhere = http.server.HTTPServer(("127.0.0.1", 0), Elsewhere)
    threading.Thread(target=elsewhere.serve_forever, daemon=True).start()
    source = socket.socket()
    source.bind(("127.0.0.1", 0))
    source.listen(1)
    playlist = (f"#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXTINF:2,\nhttp://127.0.0.1:{elsewhere.server_address[1]}/seg.ts\n"
                "#EXT-X-ENDLIST\n")  # fmt: skip

    def serve() -> None:
        conn, _ = source.accept()
        conn.sendall(playlist.encode())
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        with pytest.raises(UnreadableMedia):
            with LiveSource(f"tcp://127.0.0.1:{source.getsockname()[1]}/live.m3u8", stall_timeout=3):
                pass
    finally:
        elsewhere.shutdown()
        source.close()
    assert fetched == []
