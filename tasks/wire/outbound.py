"""HTTP to a host a producer names, made only where the operator allows it.

A producer that names a URL (a webhook to post to, media to fetch) steers a request made from
inside the farm's network: without a rule it could make the farm call the farm's own services
(Redis, the gateway, a cloud's metadata address). So a URL's host is resolved and every address
it has is checked (:func:`refused_address`): every address that is not globally routable is refused
unless the operator's list names a network holding it (or, for webhooks, the host itself).
The connection is then made to the address that was checked (:func:`pinned_connection`), so no
second lookup, which a DNS rebinding could answer otherwise, decides where it goes.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from collections.abc import Sequence
from urllib.parse import SplitResult


class Refused(Exception):
    """The URL's host is, or resolves to, an address the farm does not reach."""


def refused_host(host: str, allow: Sequence[str], setting: str = "FARM_WEBHOOK_ALLOW") -> str:
    """Why a URL naming ``host`` may not be reached ('' if it may, as far as its name tells):
    ``localhost`` and loopback, link-local, private or otherwise non-public address literals, unless
    ``allow`` (the operator's ``setting``) lists the host or a network holding the address."""
    name = host.strip("[]").lower()
    if name in {a.lower() for a in allow}:
        return ""
    if name == "localhost" or name.endswith(".localhost"):
        return refused_address(name, "127.0.0.1", allow, setting)
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return ""  # a name: what it resolves to is checked as it is reached
    return refused_address(name, name, allow, setting)


def refused_address(host: str, address: str, allow: Sequence[str], setting: str = "FARM_WEBHOOK_ALLOW",
                    names_open: bool = True) -> str:  # fmt: skip
    """Why ``address`` (which ``host`` resolved to) may not be reached ('' if it may): any address
    that is not globally routable (loopback, link-local, private, shared 100.64/10, reserved ...,
    an IPv4 address inside an IPv6 one judged as itself), unless a network of ``allow`` holds it,
    or ``names_open`` and ``allow`` names ``host`` itself."""
    ip = _unwrapped(ipaddress.ip_address(address.split("%", 1)[0]))
    if names_open and host.lower() in {a.lower() for a in allow}:
        return ""
    if in_networks(ip, allow) or ip.is_global:
        return ""
    kind = next((k for k in ("loopback", "link_local", "unspecified", "multicast", "reserved", "private")
                 if getattr(ip, f"is_{k}")), "non-public")  # fmt: skip
    what = kind.replace("_", "-")
    return (f"{host} is a {what} address ({ip}); the farm reaches only public addresses "
            f"unless {setting} lists {'the host or ' if names_open else ''}its network")  # fmt: skip


def _unwrapped(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The IPv4 address an IPv6 one carries (IPv4-mapped, 6to4), which is where it goes."""
    if isinstance(ip, ipaddress.IPv6Address):
        return ip.ipv4_mapped or ip.sixtofour or ip
    return ip


def in_networks(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, entries: Sequence[str]) -> bool:
    """Is ``ip`` inside a network (CIDR) of ``entries``? Entries that are no network are skipped."""
    for entry in entries:
        try:
            if ip in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue  # a host name of the list
    return False


def checked_addresses(host: str, port: int, allow: Sequence[str], setting: str, names_open: bool = True) -> list[str]:
    """Every address ``host`` resolves to, each checked (:func:`refused_address`); Refused naming
    the first that is not allowed. OSError if it does not resolve."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    for address in addresses:
        why = refused_address(host, address, allow, setting, names_open)
        if why:
            raise Refused(why)
    return addresses


class _PinnedConnection(http.client.HTTPConnection):
    """A connection to addresses already checked, tried in turn, with the URL's host as ``Host``."""

    def __init__(self, host: str, port: int, addresses: Sequence[str], timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.addresses = list(addresses)

    def connect(self) -> None:
        failure: OSError | None = None
        for address in self.addresses:  # an IPv6 address first on a host that has no IPv6 route ...
            try:
                self.sock = socket.create_connection((address, self.port), self.timeout)
                return
            except OSError as exc:
                failure = exc
        raise failure or OSError(f"{self.host} has no address")


class _PinnedTLSConnection(_PinnedConnection):
    def connect(self) -> None:
        super().connect()
        self.sock = ssl.create_default_context().wrap_socket(self.sock, server_hostname=self.host)


def pinned_connection(parts: SplitResult, allow: Sequence[str], timeout: float, setting: str = "FARM_WEBHOOK_ALLOW",
                      names_open: bool = True) -> http.client.HTTPConnection:  # fmt: skip
    """A connection (not yet open) to the checked addresses of an http(s) URL's host, tried in turn.
    Raises Refused, or OSError if the host does not resolve."""
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = checked_addresses(host, port, allow, setting, names_open)
    kind = _PinnedTLSConnection if parts.scheme == "https" else _PinnedConnection
    return kind(host, port, addresses, timeout)


def request_target(parts: SplitResult) -> str:
    """The path and query an http(s) request line names."""
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
