"""A pool child's signs of life while it works, which the watchdog reads to find a stuck attempt.

The worker's main process makes a small block of shared memory before it forks any child
(:func:`create`, ``workers.guards``): a slot per pool process index, each holding a child's pid and
the Unix time of its last sign of life. A child takes its index's slot as it starts (:func:`claim`;
a replacement child gets the index of the one it replaces) and :func:`beat` writes the time: two
stores in memory, no system call and no Redis round trip, cheap enough for an engine's inner loop.
The farm beats as a job starts and between its steps, and ``EngineContext`` beats on every
progress report, partial output, checkpoint, cancel check and ``ctx.alive()``. The watchdog kills a
child silent past its family's stall timeout (``TimeLimits.stall``).

Outside a worker (a local context, a test calling an engine) there are no slots and a beat does
nothing.
"""

from __future__ import annotations

import mmap
import os
import time

# Slot layout, in 8-byte words: [pid, last beat (Unix time, a double)].
_WORDS = 2
_map: mmap.mmap | None = None
_pids: memoryview | None = None
_times: memoryview | None = None
_mine: int | None = None  # this child's slot


def create(slots: int) -> None:
    """Make the slots, in the worker's main process before its pool forks (anonymous mmaps are
    MAP_SHARED by default: every child forked later writes into the same pages)."""
    global _map, _pids, _times
    _map = mmap.mmap(-1, max(1, slots) * _WORDS * 8)
    _pids = memoryview(_map).cast("q")
    _times = memoryview(_map).cast("d")


def slots() -> int:
    return 0 if _pids is None else len(_pids) // _WORDS


def claim(index: int) -> None:
    """Take slot ``index`` for this child (at its start, before any job)."""
    global _mine
    _mine = None
    if _pids is None or _times is None or not 0 <= index < slots():
        return
    _times[index * _WORDS + 1] = time.time()
    _pids[index * _WORDS] = os.getpid()
    _mine = index


def beat() -> None:
    """Say this child is alive and working."""
    if _mine is not None:
        _times[_mine * _WORDS + 1] = time.time()  # type: ignore[index]


def last_beats() -> dict[int, float]:
    """pid → Unix time of its last beat, of every child that took a slot (the main process)."""
    if _pids is None or _times is None:
        return {}
    out = {}
    for i in range(slots()):
        pid = _pids[i * _WORDS]
        if pid:
            out[pid] = _times[i * _WORDS + 1]
    return out
