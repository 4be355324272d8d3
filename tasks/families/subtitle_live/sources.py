"""Which live sources a worker may read: the operator's allow-list, ``FARM_LIVE_SOURCES``.

A live subtitle job names a URL that FFmpeg reads (MPEG-TS over UDP or TCP, HLS over HTTP ...).
A worker that opens any URL a producer names is a network client anyone with queue access steers
(an internal host, a port scan), so, in the spirit of the media roots confining files, a stream
is read only from a source the operator listed. Nothing here imports PyAV: the spec uses it.

``FARM_LIVE_SOURCES`` is comma-separated; each entry is one of:

- ``loopback`` (the default): any supported scheme on a loopback address (127.0.0.0/8, ::1,
  ``localhost``);
- ``scheme://host`` or ``scheme://host:port``: that scheme on that host (any port, or that one);
  the host may be an IP network (``udp://239.0.0.0/8`` for a multicast range).

``push://<id>`` is not a network source: it is audio a producer pushes into the farm's own Redis
(``subtitle_live.push``, the gateway's WebSocket), which every worker reads already; no entry is
needed for it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from mediafarm.tasks.families.subtitle_live.push import SCHEME as PUSH_SCHEME
from mediafarm.tasks.families.subtitle_live.push import PushFormatError, parse_push_url

# Schemes a live request may name. Tested here: udp, tcp (MPEG-TS) and http (HLS); the others
# are FFmpeg protocols read the same way, accepted when the operator lists them, not tested.
TESTED_SCHEMES = ("udp", "tcp", "http")
SCHEMES = (*TESTED_SCHEMES, "https", "rtmp", "rtsp", "srt", "rtp")
LOOPBACK = "loopback"


class SourceNotAllowed(ValueError):
    """A stream URL outside the operator's live sources, or one the farm cannot read."""


@dataclass(frozen=True)
class SourceRule:
    """One allow-list entry: ``scheme`` on ``host`` (a name or an IP network), on ``port`` or any."""

    scheme: str
    host: str
    port: int | None = None

    def allows(self, scheme: str, host: str, port: int | None) -> bool:
        if scheme != self.scheme or (self.port is not None and port != self.port):
            return False
        return _host_matches(host, self.host)


def parse_url(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a stream URL, or SourceNotAllowed saying what is wrong with it."""
    if not isinstance(url, str) or not url.strip():
        raise SourceNotAllowed(f"a stream URL must be a non-empty string, got {url!r}")
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme == PUSH_SCHEME:
        try:
            push_id, _ = parse_push_url(url)
        except PushFormatError as exc:
            raise SourceNotAllowed(str(exc)) from None
        return scheme, push_id, None
    if scheme not in SCHEMES:
        raise SourceNotAllowed(f"stream {url!r}: scheme {scheme or '(none)'!r} is not one the farm reads live; "
                               f"one of {', '.join((*SCHEMES, PUSH_SCHEME))}")  # fmt: skip
    try:
        host, port = (parts.hostname or "").lower(), parts.port
    except ValueError as exc:
        raise SourceNotAllowed(f"stream {url!r}: {exc}") from None
    if not host:
        raise SourceNotAllowed(f"stream {url!r} names no host")
    return scheme, host, port


def parse_rules(entries: Sequence[str]) -> list[SourceRule]:
    """The allow-list entries as rules; SourceNotAllowed naming a malformed entry."""
    rules: list[SourceRule] = []
    for entry in entries:
        entry = entry.strip()
        if entry.lower() == LOOPBACK:
            rules += [SourceRule(s, h) for s in SCHEMES for h in ("127.0.0.0/8", "::1/128", "localhost")]
            continue
        scheme, _, rest = entry.partition("://")
        if "/" in rest.rstrip("/"):  # an IP network, no port
            if scheme.lower() not in SCHEMES or _network(rest.rstrip("/")) is None:
                raise SourceNotAllowed(f"FARM_LIVE_SOURCES entry {entry!r} is neither scheme://host[:port] "
                                       f"nor scheme://network with a supported scheme ({', '.join(SCHEMES)})")  # fmt: skip
            rules.append(SourceRule(scheme.lower(), rest.rstrip("/")))
            continue
        try:
            scheme, host, port = parse_url(entry)
        except SourceNotAllowed as exc:
            raise SourceNotAllowed(f"FARM_LIVE_SOURCES entry {entry!r}: {exc}") from None
        rules.append(SourceRule(scheme, host, port))
    return rules


def check_source(url: str, entries: Sequence[str]) -> str:
    """``url`` itself if one of the allow-list ``entries`` lets it be read, else SourceNotAllowed
    naming the source and the setting."""
    scheme, host, port = parse_url(url)
    if scheme == PUSH_SCHEME:
        return url  # the farm's own Redis, not the network
    if any(rule.allows(scheme, host, port) for rule in parse_rules(entries)):
        return url
    where = f"{scheme}://{host}" + (f":{port}" if port is not None else "")
    listed = ", ".join(entries) or "(empty)"
    raise SourceNotAllowed(f"live source {where} is not configured: add it to FARM_LIVE_SOURCES on the workers "
                           f"(now: {listed})")  # fmt: skip


def _network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None


def _host_matches(host: str, pattern: str) -> bool:
    network = _network(pattern) if "/" in pattern else None
    if network is not None:
        try:
            return ipaddress.ip_address(host.strip("[]")) in network
        except ValueError:
            return False  # a name never matches a network: the worker does not resolve it to check
    return host == pattern.lower()
