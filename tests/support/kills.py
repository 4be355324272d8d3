"""Killing a job's pool child from a test, the way the kernel's OOM killer does: SIGKILL to the pid
its attempt record names, while that attempt is still open."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any


def kill_running(job: Any, variant: str, *, timeout: float = 60.0, after: float = 0.0) -> dict[str, Any]:
    """Wait for ``job``'s open attempt on ``variant`` (a ``JobHandle``), wait ``after`` seconds more
    (into its work), SIGKILL its child; the attempt record, as it was. AssertionError if none opens."""
    deadline = time.monotonic() + timeout
    while not (running := [a for a in job.attempts() if a["outcome"] is None and a["rung"] == variant]):
        assert time.monotonic() < deadline, f"no {variant} attempt of job {job.id} began: {job.attempts()}"
        time.sleep(0.05)
    time.sleep(after)
    os.kill(running[0]["pid"], signal.SIGKILL)
    return running[0]


@contextlib.contextmanager
def killing(job_id: str, variants: set[str]) -> Iterator[list[str]]:
    """SIGKILL every attempt of ``job_id`` on one of ``variants`` as soon as its record appears,
    until the block ends; yields the attempts killed so far (``variant:pid``)."""
    from mediafarm.tasks.app import app
    from mediafarm.tasks.wire.history import read_attempts

    killed: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        client = app.backend.client
        while not stop.is_set():
            for attempt in read_attempts(client, job_id):
                key = f"{attempt['variant']}:{attempt['pid']}"
                if attempt["outcome"] is None and attempt["rung"] in variants and key not in killed:
                    try:
                        os.kill(attempt["pid"], signal.SIGKILL)
                        killed.append(key)
                    except ProcessLookupError:
                        pass
            time.sleep(0.02)

    killer = threading.Thread(target=watch, daemon=True)
    killer.start()
    try:
        yield killed
    finally:
        stop.set()
        killer.join(5)


def kill_children_at_random(
    main: Any, rng: Any, killed: list[int], stop: threading.Event, pause: tuple[float, float],
    most: int | None = None, older_than: float = 0.0,
) -> None:
    """Until ``stop`` is set (or ``most`` kills): every ``rng.uniform(*pause)`` seconds, SIGKILL one
    child of ``main`` (a psutil.Process) chosen by ``rng``, of those older than ``older_than`` s, as
    something outside the farm would; the pids go to ``killed``. Run it in a thread.

    A child killed and not yet reaped is a zombie, still listed and still "killed" without error by
    a second SIGKILL: it is passed over, or the kills counted would include kills of the dead."""
    import psutil

    def alive(child: Any) -> bool:
        try:
            return child.status() != psutil.STATUS_ZOMBIE and time.time() - child.create_time() > older_than
        except psutil.NoSuchProcess:
            return False

    while (most is None or len(killed) < most) and not stop.is_set():
        time.sleep(rng.uniform(*pause))
        children = [c for c in main.children() if alive(c)]
        if children:
            victim = rng.choice(children)
            try:
                os.kill(victim.pid, signal.SIGKILL)
                killed.append(victim.pid)
            except ProcessLookupError:
                pass
