"""Who holds a dialogue room, and what becomes of its lines when a connection leaves.

A connection takes its room as it opens: a random id under ``keys.room_lease`` in the farm's Redis
(so a client that connects again may reach another gateway process). Leaving:

- by the client's ``end`` frame: the unfinished lines are cancelled at once;
- by a dropped connection (a phone changing networks): a grace period first (``room_linger``).
  A client that connects again within it and sends its lines again finds the same jobs (their ids
  come from the room and the seq), running or done, and nothing is spoken twice; once the period
  is over, the lines are cancelled only if no newer connection has taken the room.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import anyio
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from mediafarm.tasks.app import app as celery_app
from mediafarm.tasks.producer.handles import JobHandle
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.plan import READY

# A room's lease outlives any grace period; refreshed by every connection.
LEASE_TTL_S = 24 * 3600
# The grace periods of dropped connections still running (a reference, or asyncio may collect them).
_LINGERING: set[asyncio.Task[None]] = set()


class Lease:
    """One connection's hold on one room. Attributes: key (``keys.room_lease``), connection (its id)."""

    def __init__(self, owner: str, room: str, connection: str) -> None:
        self.key, self.connection = keys.room_lease(owner, room), connection

    def take(self) -> None:
        """This connection holds the room now (blocking; RedisError if Redis cannot be reached)."""
        celery_app.backend.client.set(self.key, self.connection, ex=LEASE_TTL_S)

    def leave(self, lines: Sequence[tuple[int, JobHandle]]) -> list[int]:
        """Cancel the unfinished of ``lines`` (seq, job) if this connection still holds the room (or
        no one does); the seqs cancelled. Blocking."""
        client = celery_app.backend.client
        try:
            holder = client.get(self.key)
            if holder is not None and holder.decode() != self.connection:
                return []  # a newer connection took the room and its lines
            client.delete(self.key)
        except (RedisError, OperationalError):  # unknown: the lines run to their end, nothing is lost
            return []
        return _cancel_unfinished(lines)

    def linger(self, seconds: float, lines: Sequence[tuple[int, JobHandle]]) -> None:
        """:meth:`leave` after ``seconds``, on the running event loop. A gateway stopping meanwhile
        leaves the lines to finish."""
        if not lines:
            return

        async def wait_then_leave() -> None:
            await anyio.sleep(seconds)
            await anyio.to_thread.run_sync(self.leave, lines)

        task = asyncio.get_running_loop().create_task(wait_then_leave())
        _LINGERING.add(task)
        task.add_done_callback(_LINGERING.discard)


def _cancel_unfinished(lines: Sequence[tuple[int, JobHandle]]) -> list[int]:
    cancelled = []
    for seq, job in lines:
        try:
            if job.state() not in READY:
                job.cancel()
                cancelled.append(seq)
        except (RedisError, OperationalError):  # the job runs to its end; nothing else is lost
            pass
    return cancelled
