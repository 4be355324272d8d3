"""Arm and disarm Celery's soft time limit inside a pool child.

billiard enforces the soft limit from the worker's main process: when a job passes it, the main
process sends the child SIGUSR1, whose handler (installed by billiard in every child) raises
SoftTimeLimitExceeded wherever the child is. A farm job disarms it once its work is over, so the
exception can only land in the job's own code, never in Celery's storing of its result; the next
job arms it again. Outside a billiard child (eager or solo runs, other threads) both do nothing.
The hard limit, the watchdog's SIGKILL, is untouched.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

_SIGNAL = getattr(signal, "SIGUSR1", None)
_handler: Any = None  # billiard's handler, kept while disarmed


def arm() -> None:
    if _handler is not None and _can_set():
        signal.signal(_SIGNAL, _handler)


def disarm() -> None:
    global _handler
    if not _can_set():
        return
    current = signal.getsignal(_SIGNAL)
    if current in (signal.SIG_IGN, signal.SIG_DFL, None):
        return  # not a billiard child, or already disarmed
    _handler = current
    signal.signal(_SIGNAL, signal.SIG_IGN)


def _can_set() -> bool:
    return _SIGNAL is not None and threading.current_thread() is threading.main_thread()
