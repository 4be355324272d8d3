"""Media named by URL: which URLs a request may name, and which hosts a worker fetches them from.

A request's media field (``MediaPath``) takes an ``http://``, ``https://`` or ``s3://`` URL
besides a path.
The producer checks its shape only (it may not know the workers' settings); the worker checks the
host against the operator's list, ``FARM_MEDIA_URLS``, and fetches it (``tasks.runtime.media_fetch``).

``FARM_MEDIA_URLS`` entries, comma-separated: a host name or an IP address (that host), a network
(CIDR: hosts written as addresses in it), ``loopback`` (127.0.0.0/8, ::1 and ``localhost``) or
``*`` (any host). Every address a host resolves to is checked too (``wire.outbound``): an address
that is not globally routable (loopback, link-local, private ...) only where a network holding it is
listed, whatever names the host, so neither ``*`` nor a listed name that resolves (or is rebound)
to an internal address reaches the farm's own services.

An ``s3://bucket/key`` URL is read from the farm's object store with the workers' own credentials
(``tasks.wire.object_store``, the standard AWS settings), so only an entry that names its bucket
lists it: ``s3://bucket`` (any key) or ``s3://bucket/prefix`` (keys under that folder). ``*`` and
host entries never do: a submitter must not read, through the farm, a bucket the workers happen
to reach.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from urllib.parse import SplitResult, urlsplit

from mediafarm.tasks.wire.outbound import in_networks

SETTING = "FARM_MEDIA_URLS"
SCHEMES = ("http", "https", "s3")
S3 = "s3"
ANY_HOST = "*"
LOOPBACK = ("127.0.0.0/8", "::1/128", "localhost")
MAX_URL = 2048
# ``scheme://``: a value that means to be a URL (a path never starts so), checked as one.
_LOOKS_LIKE_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# What an HTTP request line carries as it is: printable ASCII but the space.
_SENDABLE = re.compile(r"^[!-~]+$")


class UrlNotAllowed(ValueError):
    """A media URL the farm does not fetch: its shape, or a host the operator did not list."""


def is_media_url(value: str) -> bool:
    """Does ``value`` name media by URL (``scheme://...``) rather than by path?"""
    return bool(_LOOKS_LIKE_URL.match(value))


def url_parts(url: str) -> SplitResult:
    """The parts of a media URL, or UrlNotAllowed saying what is wrong with its shape."""
    if len(url) > MAX_URL:
        raise UrlNotAllowed(f"a media URL is at most {MAX_URL} characters, got {len(url):,}")
    if not _SENDABLE.match(url):
        raise UrlNotAllowed(f"{url!r}: a URL holds no space, control or non-ASCII character; "
                            "percent-encode them (%20 ...)")  # fmt: skip
    try:
        parts = urlsplit(url)
        port = parts.port  # a port that is no number raises here
    except ValueError as exc:
        raise UrlNotAllowed(f"{url!r} is not a URL: {exc}") from None
    if port == 0:
        raise UrlNotAllowed(f"{url!r}: port 0 is no port")
    if parts.scheme.lower() not in SCHEMES:
        raise UrlNotAllowed(f"{url!r}: media is fetched over {', '.join(SCHEMES)} only, not {parts.scheme}")
    if not parts.hostname:
        raise UrlNotAllowed(f"{url!r} names no host")
    if parts.scheme.lower() == S3 and (parts.port is not None or not parts.path.strip("/") or parts.query):
        raise UrlNotAllowed(f"{url!r}: an s3 URL is s3://bucket/key, with no port or query")
    if parts.username is not None or parts.password is not None:
        raise UrlNotAllowed(f"{url!r} carries credentials: a job's fields are stored and shown, so they may not")
    return parts


def expanded(entries: Sequence[str]) -> list[str]:
    """The operator's entries with ``loopback`` spelled out."""
    out: list[str] = []
    for entry in entries:
        entry = entry.strip()
        out += list(LOOPBACK) if entry.lower() == "loopback" else [entry] if entry else []
    return out


def host_listed(host: str, entries: Sequence[str]) -> bool:
    """Does the list name ``host``: ``*``, the host itself, or a network holding its address?"""
    name = host.strip("[]").lower()
    if ANY_HOST in entries or name in {e.lower() for e in entries}:
        return True
    try:
        return in_networks(ipaddress.ip_address(name), entries)
    except ValueError:
        return False  # a name: only the name itself or * lists it


def bucket_listed(parts: SplitResult, entries: Sequence[str]) -> bool:
    """Does an ``s3://bucket[/prefix]`` entry name the URL's bucket, and its key's folder?"""
    key = parts.path.lstrip("/")
    for entry in entries:
        entry = entry.strip()
        if not entry.lower().startswith(f"{S3}://"):
            continue
        bucket, _, prefix = entry[len(S3) + 3 :].partition("/")
        prefix = prefix.strip("/")
        if bucket == parts.hostname and (not prefix or key.startswith(prefix + "/")):
            return True
    return False


def check_listed(url: str, entries: Sequence[str]) -> SplitResult:
    """The URL's parts if its shape is right and the list names its host, else UrlNotAllowed naming
    the rule: the setting, and what it holds now."""
    parts = url_parts(url)
    if not entries:
        raise UrlNotAllowed(f"{url!r}: this farm fetches no media by URL ({SETTING} lists no host); "
                            "name a file in the media roots or an upload instead")  # fmt: skip
    if parts.scheme.lower() == S3:
        if not bucket_listed(parts, entries):
            raise UrlNotAllowed(f"{url!r}: bucket {parts.hostname} (with that key) is not in {SETTING}, "
                                "whose s3://bucket[/prefix] entries name what this farm reads")  # fmt: skip
        return parts
    if not host_listed(parts.hostname or "", expanded(entries)):
        # The list itself is not shown: the message reaches whoever submitted the job.
        raise UrlNotAllowed(f"{url!r}: host {parts.hostname} is not in {SETTING}, the hosts this farm fetches media "
                            "from")  # fmt: skip
    return parts
