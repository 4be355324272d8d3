"""Media named by URL: the shape a request may give, the operator's list, and the worker's fetch
(against a real HTTP server on loopback)."""

from __future__ import annotations

import http.server
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from mediafarm.tasks import registry
from mediafarm.tasks.runtime.media_fetch import FOLDER, MediaFetcher
from mediafarm.tasks.wire.artifacts import ArtifactStore
from mediafarm.tasks.wire.errors import Cancelled, InvalidRequest, PermanentFailure, TransientFailure
from mediafarm.tasks.wire.media_urls import UrlNotAllowed, check_listed
from mediafarm.tasks.wire.outbound import refused_address
from tests.support.http_server import serving

BODY = bytes(range(256)) * 4096  # 1 MiB of every byte value


class _Handler(http.server.BaseHTTPRequestHandler):
    """Routes of the test server: /media.wav (the body), /missing (404), /busy (503), /moved (a
    redirect to /media.wav), /away (a redirect to an address no list here names), /loop (a redirect
    to itself), /short (a Content-Length the body falls short of)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?", 1)[0]
        if path == "/media.wav":
            self._answer(200, BODY)
        elif path == "/empty":
            self._answer(200, b"")
        elif path == "/missing":
            self._answer(404, b"no")
        elif path == "/busy":
            self._answer(503, b"later")
        elif path in ("/moved", "/away", "/loop"):
            target = {"/moved": "/media.wav", "/away": "http://192.0.2.7/media.wav", "/loop": "/loop"}[path]
            self.send_response(302)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/short":
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY[:1000])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
        else:
            self._answer(404, b"")

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with serving(_Handler) as url:
        yield url


def fetcher(tmp_path: Path, entries: list[str], max_bytes: int = 1 << 30) -> MediaFetcher:
    return MediaFetcher(ArtifactStore(tmp_path / "storage", "job-1"), entries, max_bytes, timeout=10.0)


# --- what a request may name ---------------------------------------------------------------------


def test_a_request_keeps_a_media_url_as_given_and_a_path_as_a_path() -> None:
    vad = registry.get("vad")
    url = "https://media.example/cam/2026-11-29.mp4?token=a%2Fb"
    request = vad.parse_request({"media": url})
    assert request.media == url and request.model_dump(mode="json")["media"] == url  # no "//" folded
    assert vad.parse_request({"media": "cam/a.mp4"}).media == Path("cam/a.mp4")
    assert vad.media_fields == ("media",)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("ftp://h/x.wav", "over http, https, s3 only, not ftp"),
        ("http://user:secret@h/x.wav", "carries credentials"),
        ("http:///x.wav", "names no host"),
        ("http://h:99999/x.wav", "Port out of range"),
        ("http://h/" + "a" * 2100, "at most 2048 characters"),
        ("http://h/a b.wav", "no space, control or non-ASCII character"),
        ("http://h/caf\u00e9.wav", "no space, control or non-ASCII character"),
        ("http://h:0/a.wav", "port 0 is no port"),
    ],
)
def test_a_media_url_the_farm_never_fetches_is_an_invalid_request_naming_why(value: str, problem: str) -> None:
    with pytest.raises(InvalidRequest, match=problem):
        registry.get("vad").parse_request({"media": value})


# --- the operator's list -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "entries"),
    [
        ("http://127.0.0.1:8000/a.wav", ["loopback"]),
        ("http://localhost/a.wav", ["loopback"]),
        ("http://[::1]/a.wav", ["loopback"]),
        ("https://media.example/a.wav", ["media.example"]),
        ("https://MEDIA.example/a.wav", ["media.example"]),
        ("http://10.1.2.3/a.wav", ["10.0.0.0/8"]),
        ("https://anything.example/a.wav", ["*"]),
        ("s3://media/talks/a.wav", ["s3://media"]),
        ("s3://media/talks/2026/a.wav", ["s3://media/talks/"]),
    ],
)
def test_a_listed_host_passes(url: str, entries: list[str]) -> None:
    assert check_listed(url, entries).hostname


@pytest.mark.parametrize(
    ("url", "entries", "problem"),
    [
        ("http://127.0.0.1/a.wav", [], r"fetches no media by URL \(FARM_MEDIA_URLS lists no host\)"),
        ("https://other.example/a.wav", ["media.example"], "host other.example is not in FARM_MEDIA_URLS, the hosts"),
        ("http://10.1.2.3/a.wav", ["192.168.0.0/16", "loopback"], "is not in FARM_MEDIA_URLS"),
        ("http://media.example.evil/a.wav", ["media.example"], "is not in FARM_MEDIA_URLS"),
        # A bucket is listed by an s3:// entry only: never by a host entry of its name, nor by *.
        ("s3://media/a.wav", ["media", "*", "loopback"], r"bucket media \(with that key\) is not in FARM_MEDIA_URLS"),
        ("s3://media/other/a.wav", ["s3://media/talks"], "is not in FARM_MEDIA_URLS"),
        ("s3://media/talksx/a.wav", ["s3://media/talks"], "is not in FARM_MEDIA_URLS"),
        ("s3://media-2/a.wav", ["s3://media"], "is not in FARM_MEDIA_URLS"),
        ("s3://media", ["s3://media"], "an s3 URL is s3://bucket/key"),
        ("s3://media:9000/a.wav", ["s3://media"], "an s3 URL is s3://bucket/key"),
        ("ftp://media/a.wav", ["*"], "fetched over http, https, s3 only, not ftp"),
    ],
)
def test_an_unlisted_host_is_refused_naming_the_setting(url: str, entries: list[str], problem: str) -> None:
    with pytest.raises(UrlNotAllowed, match=problem):
        check_listed(url, entries)


# --- the fetch -----------------------------------------------------------------------------------


def test_a_fetch_copies_the_media_into_the_jobs_hidden_inputs_and_removes_it_after(base: str, tmp_path: Path) -> None:
    fetch = fetcher(tmp_path, ["loopback"])
    local = fetch(f"{base}/media.wav?x=1")
    assert local.read_bytes() == BODY and local.suffix == ".wav" and local.parent.name == FOLDER
    assert fetch(f"{base}/media.wav?x=1") == local  # once per URL and attempt
    assert fetch.store.list() == []  # hidden: never one of the job's artifacts
    assert not list(local.parent.glob(".*part*"))  # nothing half-written left beside it
    fetch.remove()
    assert not local.exists()


def test_a_redirect_is_followed_to_an_allowed_url(base: str, tmp_path: Path) -> None:
    assert fetcher(tmp_path, ["loopback"])(f"{base}/moved").read_bytes() == BODY


def test_a_redirect_to_a_host_not_listed_is_refused(base: str, tmp_path: Path) -> None:
    not_listed = r"'http://192.0.2.7/media.wav': host 192.0.2.7 is not in FARM_MEDIA_URLS"
    with pytest.raises(PermanentFailure, match=not_listed):
        fetcher(tmp_path, ["loopback"])(f"{base}/away")


def test_endless_redirects_end(base: str, tmp_path: Path) -> None:
    with pytest.raises(PermanentFailure, match="more than 5 redirects"):
        fetcher(tmp_path, ["loopback"])(f"{base}/loop")


def test_a_loopback_address_is_not_reached_by_a_wildcard(base: str, tmp_path: Path) -> None:
    # `*` lists every host, but the farm reaches a private or loopback address only where its
    # network is listed: a producer cannot point the worker at its own services.
    with pytest.raises(PermanentFailure, match="loopback address .*unless FARM_MEDIA_URLS lists its network"):
        fetcher(tmp_path, ["*"])(f"{base}/media.wav")


def test_a_missing_url_rejects_the_job_and_a_busy_host_is_tried_again(base: str, tmp_path: Path) -> None:
    fetch = fetcher(tmp_path, ["loopback"])
    with pytest.raises(PermanentFailure, match="answered 404"):
        fetch(f"{base}/missing")
    with pytest.raises(TransientFailure, match="answered 503"):
        fetch(f"{base}/busy")


def test_an_answer_cut_short_is_tried_again_and_leaves_no_file(base: str, tmp_path: Path) -> None:
    fetch = fetcher(tmp_path, ["loopback"])
    with pytest.raises(TransientFailure, match="short|IncompleteRead"):
        fetch(f"{base}/short")
    assert not [p for p in (fetch.store.folder / FOLDER).iterdir()]


def test_media_over_the_cap_rejects_the_job_naming_the_setting(base: str, tmp_path: Path) -> None:
    fetch = fetcher(tmp_path, ["loopback"], max_bytes=1000)
    with pytest.raises(PermanentFailure, match="more than FARM_MEDIA_URL_MAX_MB"):
        fetch(f"{base}/media.wav")
    assert not [p for p in (fetch.store.folder / FOLDER).iterdir()]


def test_a_host_that_refuses_connections_is_tried_again(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a free port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(TransientFailure, match="ConnectionRefused"):
        fetcher(tmp_path, ["loopback"])(f"http://127.0.0.1:{port}/media.wav")


def test_a_listed_name_does_not_open_its_internal_addresses(base: str, tmp_path: Path) -> None:
    # A name that resolves (or is rebound) to an internal address reaches it only where the
    # address's network is listed: "localhost" alone is not enough, "loopback" is.
    port = base.rsplit(":", 1)[1]
    with pytest.raises(PermanentFailure, match="loopback address .*unless FARM_MEDIA_URLS lists its network"):
        fetcher(tmp_path, ["localhost"])(f"http://localhost:{port}/media.wav")
    assert fetcher(tmp_path, ["localhost", "127.0.0.0/8", "::1/128"])(f"http://localhost:{port}/media.wav").is_file()


@pytest.mark.parametrize("address", ["100.100.100.200", "::ffff:127.0.0.1", "2002:7f00:1::1", "169.254.169.254",
                                     "10.0.0.1", "fd00::1", "0.0.0.0"])  # fmt: skip
def test_no_address_outside_the_public_internet_passes_a_wildcard(address: str) -> None:
    # Shared (carrier-grade NAT, a cloud's metadata service), IPv4 inside IPv6, link-local, private.
    assert "the farm reaches only public addresses" in refused_address("h", address, ["*"], "FARM_MEDIA_URLS",
                                                                       names_open=False)  # fmt: skip
    assert refused_address("h", "93.184.215.14", ["*"], "FARM_MEDIA_URLS", names_open=False) == ""


def test_an_empty_answer_rejects_the_job(base: str, tmp_path: Path) -> None:
    with pytest.raises(PermanentFailure, match="the answer is empty"):
        fetcher(tmp_path, ["loopback"])(f"{base}/empty")


def test_the_fetch_reports_as_it_goes_and_a_cancel_stops_it(base: str, tmp_path: Path) -> None:
    seen: list[tuple[int, int | None]] = []
    fetch = MediaFetcher(ArtifactStore(tmp_path / "storage", "job-1"), ["loopback"], 1 << 30, 10.0,
                         on_chunk=lambda done, total: seen.append((done, total)))  # fmt: skip
    fetch(f"{base}/media.wav")
    assert seen and seen[-1] == (len(BODY), len(BODY))

    def cancel(done: int, total: int | None) -> None:
        raise Cancelled("job job-2 was cancelled by its producer")

    stopped = MediaFetcher(ArtifactStore(tmp_path / "storage", "job-2"), ["loopback"], 1 << 30, 10.0, on_chunk=cancel)
    with pytest.raises(Cancelled):
        stopped(f"{base}/media.wav")
    assert not [p for p in (stopped.store.folder / FOLDER).iterdir()]
