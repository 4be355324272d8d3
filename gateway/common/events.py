"""A job's events for Server-Sent Events: what changed since a cursor, with ids that resume exactly.

What a client gets, in order: the job's state as it changes, each attempt as it starts and as it
ends (a downgrade is an attempt ending ``oom``/``killed``/... and the next one starting on the rung
below), each partial output of the running attempt (``JobHandle.partials()``, in list order, each
exactly once), progress as it changes (and a pipeline's stages), and one ``end`` event with the
envelope or the failure.

The id of an event is the cursor after it (:class:`Cursor`): how many attempts have been told
as ended, whether the next one was told as running, and how many partial outputs of which attempt
were sent. A client that reconnects with ``Last-Event-ID`` gets exactly what comes after it: no
event twice, none left out. State and progress carry no id: they are coalesced, and a resumed
stream starts with the latest of each. A new attempt starts with no partial outputs (the farm
clears them as its record is written, ``tasks.wire.history``); those of an attempt that was cut short
are gone with it, which the ``attempt`` event announcing its end tells.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from mediafarm.tasks.producer.handles import JobHandle, PipelineHandle
from mediafarm.tasks.wire.errors import JobCancelled, JobFailed, JobRejected, LadderExhausted
from mediafarm.tasks.wire.plan import READY

END_ID = "end"
_CURSOR = re.compile(r"^(\d{1,6})\.([01])\.(\d{1,6})\.(\d{1,9})$")
# Tried in this order: a subclass before JobFailed itself.
_FAILURE_KINDS: tuple[tuple[type[JobFailed], str], ...] = (
    (JobRejected, "rejected"),
    (JobCancelled, "cancelled"),
    (LadderExhausted, "ladder_exhausted"),
    (JobFailed, "failed"),
)


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


@dataclass(frozen=True)
class Snapshot:
    """A job as read at one moment.

    Attributes:
        state: ``JobHandle.state()``, read first: once terminal, what is read after it is final.
        attempts: The history, read before the partial outputs (so an attempt that has ended had
            published all of them).
        partials: The newest attempt's partial outputs.
        progress: The running attempt's progress (JSON), or None.
        stages: A pipeline's stages (``PipelineHandle.stages()``), None for a single job.
        envelope: The result envelope once SUCCESS.
        failure: ``{"kind", "reason"}`` once the job failed or was cancelled.
    """

    state: str
    attempts: tuple[dict[str, Any], ...]
    partials: tuple[Any, ...]
    progress: dict[str, Any] | None = None
    stages: dict[str, Any] | None = None
    envelope: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None

    @property
    def owner(self) -> int:
        """The attempt the partial outputs belong to: the newest one."""
        return max(len(self.attempts) - 1, 0)

    @property
    def settled(self) -> bool:
        """Has the job ended with its history complete? (A cancelled job can read REVOKED a
        moment before its running attempt is recorded as cancelled.)"""
        return self.state in READY and not (self.attempts and self.attempts[-1].get("outcome") is None)


def describe_failure(failure: JobFailed | None) -> dict[str, Any] | None:
    if failure is None:
        return None
    kind = next(name for cls, name in _FAILURE_KINDS if isinstance(failure, cls))
    return {"kind": kind, "reason": failure.reason}


def read_snapshot(job: JobHandle) -> Snapshot:
    """The job now, through the producer API (blocking: call it in a worker thread)."""
    state = job.state()
    # The partial outputs are the newest attempt's only if no attempt was added while they were
    # read: an attempt's record clears them in the same Redis step (tasks.wire.history).
    for _ in range(20):
        attempts = job.attempts()
        partials = job.partials()
        if len(job.attempts()) == len(attempts):
            break
    progress = job.progress()
    stages = None
    if isinstance(job, PipelineHandle):
        try:
            stages = job.stages()
        except RuntimeError:  # the plan expired with the job's result
            stages = None
    envelope = failure = None
    if state in READY:
        envelope = job.envelope()
        failure = describe_failure(job.failure())
    return Snapshot(state, tuple(attempts), tuple(partials), progress.to_json() if progress else None, stages,
                    envelope, failure)  # fmt: skip


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
