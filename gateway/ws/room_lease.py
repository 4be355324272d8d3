"""What becomes of a dialogue room's lines when its connection leaves.

A connection takes its room as it opens (``tasks.producer.room_lease``: a lease in the farm's
Redis, so a client that connects again may reach another gateway process). Leaving:

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

from mediafarm.tasks.producer.handles import JobHandle
from mediafarm.tasks.producer.room_lease import RoomLease
from mediafarm.tasks.wire.plan import READY

# The grace periods of dropped connections still running (a reference, or asyncio may collect them).
_LINGERING: set[asyncio.Task[None]] = set()


class Lease(RoomLease):
    """One connection's hold on one room (:class:`RoomLease`), and its lines' fate when it leaves."""

    def leave(self, lines: Sequence[tuple[int, JobHandle]]) -> list[int]:
        """Cancel the unfinished of ``lines`` (seq, job) if this connection still holds the room (or
        no one does); the seqs cancelled. Blocking."""
        try:
            if not self.give_up():
                return []  # a newer connection took the room and its lines
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
