"""Following a job: has it changed (:class:`JobWatch`), and what a follower has not been told yet
(:class:`Follower`): its events since a cursor, with ids that resume exactly.

The gateway's Server-Sent Events send these events as they are; any producer may follow a job the
same way. What a follower gets, in order: the job's state as it changes, each attempt as it starts
and as it ends (a downgrade is an attempt ending ``oom``/``killed``/... and the next one starting
on the rung below), each partial output of the running attempt (in list order, each exactly once),
progress as it changes (and a pipeline's stages), and one ``end`` event with the envelope or the
failure. Every event comes from snapshots (``JobHandle.snapshot``), the one reader of a job.

The id of an event is the cursor after it (:class:`Cursor`): how many attempts have been told
as ended, whether the next one was told as running, and how many partial outputs of which attempt
were sent. A client that reconnects with ``Last-Event-ID`` gets exactly what comes after it: no
event twice, none left out. State and progress carry no id: they are coalesced, and a resumed
stream starts with the latest of each. A new attempt starts with no partial outputs (the farm
clears them as its record is written, ``tasks.wire.history``); those of an attempt that was cut
short are gone with it, which the ``attempt`` event announcing its end tells.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from mediafarm.tasks.producer.handles import JobHandle, Snapshot
from mediafarm.tasks.wire.plan import READY

END_ID = "end"
_CURSOR = re.compile(r"^(\d{1,6})\.([01])\.(\d{1,6})\.(\d{1,9})$")


@dataclass(frozen=True)
class Cursor:
    """How far a client has got. Attributes: ended (attempts told as ended), opened (attempt
    number ``ended`` told as running), owner (the attempt whose partial outputs were sent last),
    partials (how many of them)."""

    ended: int = 0
    opened: bool = False
    owner: int = 0
    partials: int = 0

    def encode(self) -> str:
        return f"{self.ended}.{int(self.opened)}.{self.owner}.{self.partials}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """The cursor an event id names; ValueError for anything this gateway did not send."""
        match = _CURSOR.match(text.strip())
        if not match:
            raise ValueError(f"Last-Event-ID {text[:80]!r} is not an event id of this gateway")
        ended, opened, owner, partials = map(int, match.groups())
        return cls(ended, bool(opened), owner, partials)


@dataclass(frozen=True)
class Event:
    """One event. Attributes: kind (the SSE event name), data (JSON-safe), id (None: keeps the last)."""

    kind: str
    data: Any
    id: str | None = None


def advance(cursor: Cursor, snapshot: Snapshot) -> tuple[list[Event], Cursor]:
    """The attempt and partial-output events ``snapshot`` holds past ``cursor``, and the cursor after them."""
    events: list[Event] = []
    owner = snapshot.owner
    if owner > cursor.owner:  # a newer attempt: its partial outputs are counted from its first
        cursor = replace(cursor, owner=owner, partials=0)

    def send_partials() -> None:
        nonlocal cursor
        if owner != cursor.owner:  # an older history than the client's (expired): nothing to add
            return
        for index in range(cursor.partials, len(snapshot.partials)):
            cursor = replace(cursor, partials=index + 1)
            data = {"attempt": owner, "index": index, "output": snapshot.partials[index]}
            events.append(Event("partial", data, cursor.encode()))

    for index in range(cursor.ended, len(snapshot.attempts)):
        attempt = {"index": index, **snapshot.attempts[index]}
        if attempt.get("outcome") is None:  # running: only ever the newest
            if not cursor.opened:
                cursor = replace(cursor, opened=True)
                events.append(Event("attempt", attempt, cursor.encode()))
            if index == owner:
                send_partials()
            break
        if index == owner:
            send_partials()
        cursor = replace(cursor, ended=index + 1, opened=False)
        events.append(Event("attempt", attempt, cursor.encode()))
    return events, cursor


def end_event(snapshot: Snapshot) -> Event:
    data: dict[str, Any] = {"state": snapshot.state}
    if snapshot.envelope is not None:
        data["result"] = snapshot.envelope
    if snapshot.failure is not None:
        data["failure"] = snapshot.failure
    return Event("end", data, END_ID)


class Follower:
    """One client's view of one job: feed it snapshots, get the events to send.

    ``settle_for`` bounds how long an ended job's last attempt may stay open before ``end`` is
    sent anyway (seconds, measured by ``clock``).
    """

    def __init__(self, cursor: Cursor, clock: Callable[[], float], settle_for: float = 5.0) -> None:
        self.cursor, self.clock, self.settle_for = cursor, clock, settle_for
        self._seen: dict[str, Any] = {}
        self._ended_at: float | None = None
        self.done = False

    def feed(self, snapshot: Snapshot) -> list[Event]:
        """The events ``snapshot`` holds for this client: the state if it changed, the attempts and
        partial outputs past the cursor, progress and stages if they changed, and at last ``end``."""
        events = self._changed("state", {"state": snapshot.state})
        told, self.cursor = advance(self.cursor, snapshot)
        events += told
        if snapshot.state not in READY:
            events += self._changed("progress", snapshot.progress)
        events += self._changed("stages", snapshot.stages)
        if snapshot.state in READY:
            now = self.clock()
            self._ended_at = now if self._ended_at is None else self._ended_at
            if snapshot.settled or now - self._ended_at >= self.settle_for:
                events.append(end_event(snapshot))
                self.done = True
        return events

    def _changed(self, kind: str, value: Any) -> list[Event]:
        if value is None or self._seen.get(kind) == value:
            return []
        self._seen[kind] = value
        return [Event(kind, value)]


# A followed job is read in full at least this often, changed or not.
FULL_READ_S = 1.0


class JobWatch:
    """One follower's look at one job: :meth:`changed` says whether a full read is due (blocking:
    call it from a worker thread).

    A job's full read is several round trips and grows with its partial outputs; its signature
    (``JobHandle.signature``) is one: the lengths of the partial outputs and of the attempt history
    (a chunk; a new attempt) and of Celery's result (the state). It is read before the full read
    that follows, so nothing changed after that read goes unseen. Some things are written in place
    (an attempt's outcome, progress): a full read is therefore due at least every ``full_read_s``.
    """

    def __init__(self, job: JobHandle, full_read_s: float = FULL_READ_S,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.job, self.full_read_s, self.clock = job, full_read_s, clock
        self._signature: tuple[Any, ...] | None = None
        self._read_at = 0.0

    def changed(self) -> bool:
        """True if the job changed since the last True (or a full read is due); the caller then
        reads the job in full."""
        signature = self.job.signature()
        now = self.clock()
        if signature == self._signature and now - self._read_at < self.full_read_s:
            return False
        self._signature, self._read_at = signature, now
        return True
