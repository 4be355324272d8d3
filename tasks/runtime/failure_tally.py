"""A pool's failed attempts by rung and cause, and whether each counted against the rung's breaker.

What ``farm families`` shows beside the breakers: an outside kill that did not open a breaker is
as much worth an operator's eye as a watchdog kill that did. Written as each judged attempt ends
(``tasks.runtime.rung_guard.RungGuard.ended``), one ``HINCRBY`` (``keys.rung_failures``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mediafarm.tasks.wire import keys, pool_hashes
from mediafarm.tasks.wire.records import Attempt

# A tally is forgotten a day after its newest failure.
TTL_S = 86_400


@dataclass(frozen=True)
class FailureTally:
    """Failures of one rung on one pool with one cause (``tasks.runtime.attribution.CAUSES``)."""

    pool: str
    ladder: str
    rung: str
    cause: str
    counted: bool
    count: int


def add(client: Any, pool: str, ladder: str, attempt: Attempt) -> None:
    """Count one judged failure (``attempt.counted`` set) of ``ladder``'s rung on ``pool``."""
    key = keys.rung_failures(pool)
    pipe = client.pipeline(transaction=False)
    pipe.hincrby(key, f"{ladder}/{attempt.rung}/{attempt.cause}/{int(bool(attempt.counted))}", 1)
    pipe.expire(key, TTL_S)
    pipe.execute()


def read(client: Any, pool: str | None = None) -> list[FailureTally]:
    """The tallies of one pool or of all, sorted by pool, ladder, rung, counted first."""
    out = []
    for owner, field, count in pool_hashes.fields(client, keys.rung_failures, pool):
        ladder, _, rest = field.partition("/")
        rung, cause, counted = rest.rsplit("/", 2)
        out.append(FailureTally(owner, ladder, rung, cause, counted == "1", int(count)))
    return sorted(out, key=lambda t: (t.pool, t.ladder, t.rung, not t.counted, t.cause))
