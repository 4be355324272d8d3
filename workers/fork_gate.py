"""The fork gate: no pool child is forked while a thread of the worker's main process is in the
middle of an import, a log line or a Redis call.

The pool forks a new child from the main process after every kill and every
``--max-tasks-per-child``. A fork copies only the thread that forks; a lock another thread held
at that instant stays held in the child forever. Python's per-module import locks are such locks
(``_ModuleLock``: a child forked while a main-process thread imported the IDNA codec, or soundfile's
``ctypes.util``, hung in its own first import of that module), and so are the buffer locks of the
log's stream. Importing the offending modules early fixed one case at a time; the gate fixes the
cause: the farm's threads do their work inside :func:`held`, and ``os.register_at_fork`` makes
every fork wait until no thread is inside it (and lets no thread in until the fork is done).

Deadlock rules, which every holder keeps:

- The fork happens on the main thread (billiard's pool maintenance runs on the worker's event
  loop), so a holder never waits on the main thread while it holds the gate: no Celery control
  call, no ``worker_state`` lock, no result wait; only file reads, its own Redis client and logging.
- A hold is short: one poll, one publish, one scrape, one batch; every Redis client used inside
  has a socket timeout of about a second, so a Redis that does not answer delays a fork by seconds,
  never forever. Sleeping and waiting for work happen outside.
- Holds nest (a holder calling a function that holds it too), and holders share the gate with
  each other: only a fork excludes them. A fork waiting for the gate stops new holds (writer
  preference), so a busy thread cannot starve the pool of children.

Threads of the worker's main process are started with :func:`start_thread`, which keeps a list of
them: ``farm_main_process`` (``workers.guards``) reports every thread it did not start, and the tests
fail on one.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any


class ForkGate:
    """Shared by the holders, exclusive to a fork (a readers-writer lock whose writer is ``os.fork``)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._holders = 0
        self._forking = False
        self._depth = threading.local()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        depth = getattr(self._depth, "n", 0)
        if depth == 0:
            with self._cond:
                while self._forking:
                    self._cond.wait()
                self._holders += 1
        self._depth.n = depth + 1
        try:
            yield
        finally:
            self._depth.n = depth
            if depth == 0:
                with self._cond:
                    self._holders -= 1
                    if self._holders == 0:
                        self._cond.notify_all()

    def before_fork(self) -> None:
        with self._cond:
            self._forking = True
            while self._holders:
                self._cond.wait()

    def after_fork_in_parent(self) -> None:
        with self._cond:
            self._forking = False
            self._cond.notify_all()

    def after_fork_in_child(self) -> None:
        # The child has no holder (it has only the forking thread) and must not keep a lock some
        # other thread may have held at the fork: a new gate.
        self._reset()

    @property
    def holders(self) -> int:
        return self._holders


GATE = ForkGate()
os.register_at_fork(
    before=GATE.before_fork, after_in_parent=GATE.after_fork_in_parent, after_in_child=GATE.after_fork_in_child
)


def held() -> contextlib.AbstractContextManager[None]:
    """Hold the fork gate for one short unit of work that may import, log or call Redis."""
    return GATE.held()


_STARTED: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def start_thread(target: Callable[..., Any], name: str, args: tuple[Any, ...] = ()) -> threading.Thread:
    """Start a daemon thread of the worker's main process; its work must run inside :func:`held`."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    _STARTED.add(thread)
    thread.start()
    return thread


def ungated_threads() -> list[str]:
    """Names of the living threads of this process that are neither the main thread nor started
    by :func:`start_thread` (nor one a gated server started for one request)."""
    main = threading.main_thread()
    return sorted(
        t.name for t in threading.enumerate()
        if t is not main and t not in _STARTED and not getattr(t, "farm_gated", False)
    )  # fmt: skip
