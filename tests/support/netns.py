"""A network namespace joined to this host by a veth pair, for workers that must lose their link.

Made and removed by the tests (root and iproute2 needed). The host end gets ``<subnet>.1``, the
namespace end ``<subnet>.2``; a server that should be reachable from inside listens on the host
end's address too.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass


class NamespaceUnavailable(RuntimeError):
    """This process cannot make a network namespace here (not root, no iproute2, refused)."""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@dataclass(frozen=True)
class Link:
    namespace: str
    host_end: str
    host_address: str
    worker_address: str

    def down(self) -> None:
        ip("link", "set", self.host_end, "down")

    def up(self) -> None:
        ip("link", "set", self.host_end, "up")

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]


@contextmanager
def veth_link() -> Iterator[Link]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise NamespaceUnavailable("needs root and iproute2 to make a network namespace and a veth pair")
    tag = uuid.uuid4().hex[:6]
    namespace, host_end, worker_end = f"mf-{tag}", f"mfh{tag}", f"mfw{tag}"
    subnet = f"10.{random.randint(200, 250)}.{random.randint(0, 255)}"
    try:
        ip("netns", "add", namespace)
    except subprocess.CalledProcessError as exc:
        raise NamespaceUnavailable(f"cannot create a network namespace here: {exc.stderr.strip()}") from None
    try:
        ip("link", "add", host_end, "type", "veth", "peer", "name", worker_end)
        ip("link", "set", worker_end, "netns", namespace)
        ip("addr", "add", f"{subnet}.1/30", "dev", host_end)
        ip("link", "set", host_end, "up")
        ip("-n", namespace, "addr", "add", f"{subnet}.2/30", "dev", worker_end)
        ip("-n", namespace, "link", "set", worker_end, "up")
        ip("-n", namespace, "link", "set", "lo", "up")
        yield Link(namespace, host_end, f"{subnet}.1", f"{subnet}.2")
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)  # takes the pair with it
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)


class TcpForward:
    """Forwards TCP connections from ``listen`` (a host end's address, free port) to ``target``:
    how a namespaced worker reaches a server that listens on loopback only (the machine's RabbitMQ).

    Each connection is a pair of sockets pumped by two threads; when either side closes or fails,
    both are closed, so a server that drops the connection (RabbitMQ after missed heartbeats while
    the link is down) drops it for the worker too.
    """

    def __init__(self, listen_host: str, target: tuple[str, int]) -> None:
        self.target = target
        self._server = socket.create_server((listen_host, 0))
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="tcp-forward", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                inside, _ = self._server.accept()
                outside = socket.create_connection(self.target, timeout=10)
                outside.settimeout(None)
            except OSError:
                return  # closed
            with self._lock:
                self._open.update((inside, outside))
            for source, sink in ((inside, outside), (outside, inside)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            with self._lock:
                self._open.discard(sock)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._server.close()
        with self._lock:
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
