"""The asking side of a drain (``farm drain WORKER``): find the worker, ask it, wait for it to go.

The drain itself runs in the worker (``workers.drain``); this side only talks to it over Celery's
remote control, so any process with the broker's address can drain any worker.
"""

from __future__ import annotations

import time
from typing import Any

from mediafarm.workers.drain import COMMAND


class NoSuchWorker(LookupError):
    """No worker, or more than one, answers to the name given."""


def answering(app: Any, timeout: float = 1.0) -> list[str]:
    """Node names of the workers that answer a ping now."""
    return sorted(node for reply in app.control.ping(timeout=timeout) or () for node in reply)


def find_worker(app: Any, name: str, timeout: float = 1.0) -> str:
    """The node ``name`` means: a full node name (``cpu@host``), or the part before ``@`` when one
    worker alone has it."""
    nodes = answering(app, timeout)
    matches = [n for n in nodes if n == name]
    if not matches and "@" not in name:
        matches = [n for n in nodes if n.split("@", 1)[0] == name]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(nodes) or "none"
    if matches:
        raise NoSuchWorker(f"{name!r} names {len(matches)} workers ({', '.join(matches)}): give the full node name")
    raise NoSuchWorker(f"no worker named {name!r} answers; workers that answer: {known}")


def request_drain(app: Any, node: str, timeout: float = 5.0) -> dict[str, Any]:
    """Ask ``node`` to drain; its answer (what it stopped, what runs, how long it has)."""
    replies = app.control.broadcast(COMMAND, destination=[node], reply=True, timeout=timeout)
    for reply in replies or ():
        if node in reply:
            answer = reply[node]
            if isinstance(answer, dict) and "error" in answer:
                raise NoSuchWorker(f"worker {node} cannot drain: {answer['error']}")
            return answer
    raise NoSuchWorker(f"worker {node} did not answer the drain request within {timeout:g} s")


def wait_gone(app: Any, node: str, timeout: float) -> bool:
    """Wait until ``node`` stops answering pings (it has stopped); False if it still answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not app.control.ping(destination=[node], timeout=1.0):
            return True
    return False
