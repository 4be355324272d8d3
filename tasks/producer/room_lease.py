"""Who holds a dialogue room: one connection's lease, in the farm's Redis so every gateway process sees it.

A connection takes its room as it opens (a random id under ``keys.room_lease``), so a client that
connects again may reach another gateway process and take the room over. What becomes of a room's
lines when its connection leaves is the gateway's (``gateway/ws/room_lease.py``).
"""

from __future__ import annotations

from mediafarm.tasks.app import app
from mediafarm.tasks.wire import keys

# A room's lease outlives any grace period; refreshed by every connection.
LEASE_TTL_S = 24 * 3600

# Deletes the lease if ARGV[1] holds it or no one does (1), in one step, so a newer connection's
# lease taken between a read and a delete is never dropped; 0 if another connection holds it.
_GIVE_UP = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""


class RoomLease:
    """One connection's hold on one room. Attributes: key (``keys.room_lease``), connection (its id)."""

    def __init__(self, owner: str, room: str, connection: str) -> None:
        self.key, self.connection = keys.room_lease(owner, room), connection

    def take(self) -> None:
        """This connection holds the room now (blocking; RedisError if Redis cannot be reached)."""
        app.backend.client.set(self.key, self.connection, ex=LEASE_TTL_S)

    def give_up(self) -> bool:
        """Drop the lease if this connection still holds it (or no one does): True. False if a newer
        connection took the room. Blocking; RedisError if Redis cannot be reached."""
        return bool(app.backend.client.eval(_GIVE_UP, 1, self.key, self.connection))
