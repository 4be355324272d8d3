"""Has a followed job changed? One Redis round trip, so a job can be looked at often and read in
full only when something moved (the dialogue rooms' head line, the speech route's stream).

A job's full read is several round trips and grows with its partial outputs; the signature is
one: the lengths of the partial outputs and of the attempt history (a chunk; a new attempt) and
of Celery's result (the state). It is read before the full read that follows, so nothing changed
after that read goes unseen. Some things are written in place (an attempt's outcome, progress):
a full read is therefore due at least every ``full_read_s`` anyway.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from mediafarm.tasks.app import app as celery_app
from mediafarm.tasks.wire import keys

# A followed job is read in full at least this often, changed or not.
FULL_READ_S = 1.0


class JobWatch:
    """One follower's look at one job: :meth:`changed` says whether a full read is due (blocking:
    call it from a worker thread)."""

    def __init__(self, job_id: str, full_read_s: float = FULL_READ_S,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.job_id, self.full_read_s, self.clock = job_id, full_read_s, clock
        self._signature: tuple[Any, ...] | None = None
        self._read_at = 0.0

    def changed(self) -> bool:
        """True if the job changed since the last True (or a full read is due); the caller then
        reads the job in full."""
        pipe = celery_app.backend.client.pipeline(transaction=False)
        pipe.llen(keys.partials(self.job_id))
        pipe.llen(keys.history(self.job_id))
        pipe.strlen(celery_app.backend.get_key_for_task(self.job_id))
        signature = tuple(pipe.execute())
        now = self.clock()
        if signature == self._signature and now - self._read_at < self.full_read_s:
            return False
        self._signature, self._read_at = signature, now
        return True
